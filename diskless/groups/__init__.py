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

Only offsets are persisted. Group membership (members, generation, assignment) lives in memory
on the coordinator: after a coordinator failover the new coordinator rebuilds offsets from the
log and starts every group Empty; members learn it through UNKNOWN_MEMBER_ID on their next
heartbeat and rejoin, which costs one rebalance per group and nothing else. Kafka persists the
group metadata too, to spare that rebalance; we trade it for a much smaller failover story.
"""
