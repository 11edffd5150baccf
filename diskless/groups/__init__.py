"""Classic consumer groups: Kafka's "generic" group protocol and committed offsets.

Three layers, each usable on its own:

- ``coordinator``: ``GroupCoordinatorCore``, the sans-IO state machine of the groups that map to
  one ``__consumer_offsets`` partition (membership, rebalances, static members, offsets). No
  sockets, no clock (``now_ms`` is passed in), no asyncio: delayed JoinGroup/SyncGroup answers are
  delivered through reply callbacks, timers through ``tick(now_ms)``/``next_deadline_ms()``.
- ``records``: the key/value format of ``__consumer_offsets`` records, ``replay`` to rebuild a
  core from a partition, and ``partition_for`` (Kafka's group -> partition mapping).
- ``handlers``: version-agnostic async Kafka API handlers (JoinGroup, SyncGroup, Heartbeat,
  LeaveGroup, OffsetCommit, OffsetFetch, ListGroups, DescribeGroups, DeleteGroups, OffsetDelete)
  that talk to the broker through the small ``GroupFacade`` protocol.

Committed offsets and classic group metadata are persisted, as in Kafka. A group record
(generation, protocol type and name, leader, the state's timestamp, and each member's ids, client
id/host, timeouts, subscription and assignment) is written when a rebalance completes (the
leader's SyncGroup: nobody gets an assignment before its record is durable; if writing fails the
members get the error and rejoin), when a static member takes over its old member id in a Stable
group, and when the group becomes Empty; DeleteGroups and the cleanup of Empty groups without
offsets write its tombstone. A new coordinator loads each group as last stored (Stable, or Empty
without members) and starts every member's session timer anew, so members keep heartbeating at
their generation across a failover. A rebalance in progress is not stored: after a failover in
PreparingRebalance/CompletingRebalance the group is back at its last stored generation and the
members that had moved on rejoin (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID), as in Kafka.

KIP-848 groups (ConsumerGroupHeartbeat, ``consumer_protocol``) are persisted as Kafka's
GroupMetadataManager keeps them: keyed records of the group epoch, the subscription metadata, the
target assignment (its epoch and each member's part), and each member's metadata and current
assignment (epochs, state, assigned and pending-revocation partitions), each written when it
changes (never for a heartbeat that changes nothing). A heartbeat is answered once the group's
records are durable; a member's leave or expiry writes a tombstone of each of its keys, and the
group's deletion (DeleteGroups, the cleanup of empty groups, a classic member taking an empty group
over) one of each of the group's, as Kafka, so that a compacted topic drops them all too. A new
coordinator loads each group as last written and starts each member's session timer (and
rebalance timer, while it revokes) at the load, as Kafka's onLoaded: members keep heartbeating at
their epochs across a failover instead of being fenced and joining again with epoch 0.
"""
