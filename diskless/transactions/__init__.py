"""Kafka transactions, coordinator side (KIP-98 with KIP-360 epoch bumps; not KIP-890 v2).

Three layers, each usable on its own, shaped like ``diskless.groups``:

- ``coordinator``: ``TransactionCoordinatorCore``, the sans-IO state machine of the transactional
  ids that map to one ``__transaction_state`` partition (producer ids and epochs, the transaction
  states, fencing, timeouts, marker progress). No sockets, no clock, no asyncio: every change is a
  ``Transit`` the shell persists and reports back.
- ``records``: the key/value format of ``__transaction_state`` records, ``replay`` to rebuild a
  core after a coordinator failover, and ``partition_for`` (Kafka's id -> partition mapping).
- ``handlers``: version-agnostic async handlers of InitProducerId (transactional ids only),
  AddPartitionsToTxn, AddOffsetsToTxn and EndTxn, plus the marker/timeout drivers, talking to
  the broker through the ``TxnFacade`` protocol.

The partition side (control markers, LSO, aborted transactions, read_committed, WriteTxnMarkers)
and TxnOffsetCommit live elsewhere.
"""
