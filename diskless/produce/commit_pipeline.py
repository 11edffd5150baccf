"""Per-partition commit order of the produce representative, sans-IO.

The representative turns buffered batches into WAL objects (one PUT per flush) and then asks each
partition's leader to append a pointer per batch (CommitBatches). This class decides, for every
batch, *when* its commit may be sent and *what* its producer is told when something goes wrong.
The asyncio shell (``representative.py``) does the PUTs and RPCs and reports back; time is passed
in as milliseconds.

Vocabulary. A *chain* is the batches of one partition (topic id, partition) that have no ordering
outcome yet, in the order the representative received them. A batch's *ordering outcome* is the
leader's append (offset assigned, or a duplicate recognised) or a final failure; replication for
acks=all is not part of it. A *channel* is an ordered path to a leader: the local leader, or one
TCP connection to a remote one, on which the leader starts requests in the order it reads them.

Rules.

R1 (send). A batch is sent only when every earlier batch of its chain is in flight on the channel
   it would use now, and no batch of its chain is in flight on another channel, nor any later
   batch at all (a batch whose answer was lost waits for the answers of those sent after it). So the leader
   starts a partition's commits in chain order; pipelining on one channel keeps throughput. Sends
   are returned grouped by (channel, flush) in flush order, and a flush's batches of a partition
   are contiguous in the chain, so sending the groups in the returned order keeps chain order.
R2 (propagate). When a batch fails with a retriable error X, every later batch of its chain fails
   with X too: those not yet sent at once, those in flight when their answer comes (unless the
   leader appended them, which cannot be undone; for an idempotent producer it cannot happen,
   the leader answers OUT_OF_ORDER_SEQUENCE). The producer retries them after the earlier one,
   as it would after any retriable error. A non-retriable failure propagates nothing: later
   batches go to the leader, which decides (as a Kafka leader would for the same requests).
R3 (retry). A retriable leadership answer (not leader, fenced or unknown epoch, no leader known)
   or a lost answer (connection lost, timeout, send failed; see R6) is no outcome: the batch keeps its
   place in the chain and is sent again, after a short back-off or a metadata change, until
   ``retry_timeout_ms`` after it became ready; then it fails with the last reason (R2 applies).
R4 (out of order). OUT_OF_ORDER_SEQUENCE for a batch of producer (id, epoch) while an earlier
   batch of the same producer is still in the chain is no outcome either: the earlier batch was
   refused or is being retried, so this one waits behind it and is sent again. If instead that
   producer had a batch of this partition with a lower sequence fail retriably here (a *hint*:
   it may have sent this batch before it learned of that failure), the answer becomes that
   failure's code. A failure leaves the hint once a batch of the producer at or past its
   sequence is appended (the leader's sequence passed it: the producer resent it); a hint goes
   when the producer's epoch changes or after ``hint_ttl_ms``.
R5 (deadline). Every batch gets an outcome: uploads and RPCs are bounded by the shell, and a
   ready batch waiting for its turn or a leader fails at its deadline (R3).
R6 (no duplicates without idempotence). R3's resend after a lost answer is only for idempotent
   producers, whose duplicates the leader recognises by sequence. A batch without idempotence
   whose request may have reached the leader fails with REQUEST_TIMED_OUT instead (R2 applies):
   resent, it could be appended twice although its producer sent it once.

Why the order holds (safety rule 2). Take batches a before b in one chain. b is sent only if a is
in flight on the same channel (a was sent first, the leader starts a first) or a has an outcome
(R1). If a's outcome is an append, b follows it. If a failed retriably, b either fails with it
(R2) or was appended (only for producers without idempotence, and only when a was refused for a
reason other than leadership, e.g. NOT_ENOUGH_REPLICAS; Kafka never promised such producers order
across retries). If a is retried (R3, R4), a goes back to waiting and nothing of the chain is
sent on another channel while b is still in flight (R1): b's answer comes first; if b was refused
it waits behind a again. b cannot have been appended where a was refused for leadership: the
shell makes the leader epoch part of the channel and stamps it on every entry, the leader refuses
entries of any other epoch, and epochs only grow, so a refusal of a at its stamp means a refusal
of b at the same stamp, even if leadership came back to that broker in between. For an idempotent
producer the leader's own sequence check refuses b anyway (OUT_OF_ORDER_SEQUENCE, R4). Uploads
finishing out of order change nothing: a batch of an unfinished upload blocks its chain (R1). A
failed upload fails its batches with KAFKA_STORAGE_ERROR, which propagates (R2).

Interleavings considered: upload n fails while upload n+1 of the same partition succeeds first;
a leader moves between sending flush n and flush n+1 (both refused by the old leader; resent in
order to the new one), and moves back (refused by epoch); the connection to a leader drops with
several flushes in flight (all retried in chain order on the new connection; a leader that still
applies the old requests sees duplicates, which idempotent producers dedupe); an answer is lost
after the leader applied it while later commits are in flight (they are answered first, then it
is resent as a duplicate); the producer's batch n+2 arrives after batch n failed (R4 hint); a
batch waits for a predecessor that never gets a leader (deadline, R2).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from kio.schema.errors import ErrorCode

from diskless.protocol import records

RETRIABLE = frozenset(int(code) for code in ErrorCode if code.retriable)
LEADERSHIP = frozenset(
    int(code)
    for code in (
        ErrorCode.not_leader_or_follower,
        ErrorCode.leader_not_available,
        ErrorCode.fenced_leader_epoch,
        ErrorCode.unknown_leader_epoch,
    )
)
OUT_OF_ORDER = int(ErrorCode.out_of_order_sequence_number)
STORAGE_ERROR = int(ErrorCode.kafka_storage_error)
NOT_LEADER = int(ErrorCode.not_leader_or_follower)
TIMED_OUT = int(ErrorCode.request_timed_out)
UNKNOWN_PARTITION = int(ErrorCode.unknown_topic_or_partition)

PartitionKey = tuple[str, int]  # (topic id, partition)
MAX_FAILED_PER_HINT = 64


class State(Enum):
    UPLOADING = "uploading"  # its flush's PUT has not finished
    READY = "ready"  # uploaded, waiting for its turn or a leader
    SENT = "sent"  # in flight on ``channel``


class NoRoute(Enum):
    NO_LEADER = "no_leader"  # no leader (or no connection to it) right now: wait
    UNKNOWN = "unknown"  # the partition does not exist (for this topic id): fail


Route = Hashable  # a channel, or a NoRoute


@dataclass
class _Batch:
    id: int
    flush: int
    key: PartitionKey
    size: int
    producer: tuple[int, int] | None  # (producer id, epoch) for idempotent producers
    base_sequence: int
    last_sequence: int
    state: State = State.UPLOADING
    channel: Hashable | None = None
    doomed: int | None = None  # in flight when an earlier batch failed retriably with this code
    not_before_ms: int = 0
    deadline_ms: int | None = None
    reason: int = int(ErrorCode.request_timed_out)  # why it waits (the failure code at its deadline)


@dataclass
class _Hint:
    """One producer's batches of one partition that failed here and were not appended since."""

    epoch: int
    failed: dict[int, int]  # base sequence -> the failure's code
    expires_ms: int


@dataclass(frozen=True)
class Send:
    """Commit these batches (ids, in this order) of one flush on one channel, now."""

    channel: Hashable
    flush: int
    ids: list[int]


@dataclass
class CommitPipeline:
    retry_timeout_ms: int = 10_000
    retry_backoff_ms: int = 100
    hint_ttl_ms: int = 300_000
    max_hints: int = 10_000
    _batches: dict[int, _Batch] = field(default_factory=dict)
    _chains: dict[PartitionKey, list[_Batch]] = field(default_factory=dict)
    _flushes: dict[int, list[int]] = field(default_factory=dict)
    _hints: OrderedDict[tuple[PartitionKey, int], _Hint] = field(default_factory=OrderedDict)
    _outcomes: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    _in_flight_bytes: int = 0

    # --- inputs ----------------------------------------------------------------------------------

    def add_flush(self, flush: int, batches: list[tuple[int, PartitionKey, bytes]]) -> None:
        """A drained flush: (batch id, partition, batch bytes or at least its header), in arrival order."""
        ids = []
        for batch_id, key, data in batches:
            producer, first, last = _producer_of(data)
            batch = _Batch(batch_id, flush, key, len(data), producer, first, last)
            self._batches[batch_id] = batch
            self._chains.setdefault(key, []).append(batch)
            self._in_flight_bytes += batch.size
            ids.append(batch_id)
        self._flushes[flush] = ids

    def uploaded(self, flush: int, now_ms: int) -> None:
        for batch_id in self._flushes.pop(flush, []):
            batch = self._batches.get(batch_id)
            if batch is not None and batch.state is State.UPLOADING:
                batch.state = State.READY
                batch.deadline_ms = now_ms + self.retry_timeout_ms

    def upload_failed(self, flush: int, now_ms: int, code: int = STORAGE_ERROR) -> None:
        """The PUT failed: no pointer can exist, the batches fail (retriably) and take their chains' later ones."""
        for batch_id in self._flushes.pop(flush, []):
            if batch_id in self._batches:
                self._fail(self._batches[batch_id], code, now_ms)

    def answered(self, batch_id: int, result: dict[str, Any], now_ms: int) -> None:
        """The leader's answer for an in-flight batch (``error_code`` and, on success, the append's fields)."""
        batch = self._batches.get(batch_id)
        if batch is None or batch.state is not State.SENT:
            return
        code = int(result.get("error_code", STORAGE_ERROR))
        if code == 0:
            self._appended(batch, result, now_ms)
        elif batch.doomed is not None:
            self._fail(batch, batch.doomed, now_ms)
        elif code in LEADERSHIP or (code == OUT_OF_ORDER and self._earlier_of_producer_waiting(batch)):
            self._wait_again(batch, code, now_ms)
        elif code == OUT_OF_ORDER and (hint := self._hint_for(batch, now_ms)) is not None:
            self._fail(batch, hint, now_ms)
        else:
            self._fail(batch, code, now_ms)

    def lost(self, batch_ids: list[int], now_ms: int, code: int = NOT_LEADER, maybe_applied: bool = True) -> None:
        """No answer will come (connection lost, timeout, send failed): the outcome is unknown.

        Sent again, except a batch without idempotence that the leader may have appended
        (``maybe_applied``: the request may have reached it): the leader could not recognise it
        as a duplicate, and a Kafka broker never appends a record twice for a producer that sent
        it once. It fails with REQUEST_TIMED_OUT, and its producer decides, as after a Kafka
        request timeout (R6)."""
        for batch_id in batch_ids:
            batch = self._batches.get(batch_id)
            if batch is None or batch.state is not State.SENT:
                continue
            if batch.doomed is not None:
                self._fail(batch, batch.doomed, now_ms)
            elif maybe_applied and batch.producer is None:
                self._fail(batch, TIMED_OUT, now_ms)
            else:
                self._wait_again(batch, code, now_ms)

    def failed(self, batch_ids: list[int], code: int, now_ms: int) -> None:
        """These batches fail with ``code`` whatever their state (an unexpected error in the shell)."""
        for batch_id in batch_ids:
            batch = self._batches.get(batch_id)
            if batch is not None:
                self._fail(batch, code, now_ms)

    def note_failure(self, key: PartitionKey, data: bytes, code: int, now_ms: int) -> None:
        """A batch this pipeline never saw failed (the shell reset after a bug): remember it as a hint (R4)."""
        producer, first, last = _producer_of(data)
        self._note_hint(_Batch(-1, -1, key, len(data), producer, first, last), code, now_ms)

    def restart(self) -> CommitPipeline:
        """A fresh pipeline for the shell's reset after a bug: nothing in flight, the hints kept.

        A failure answered before the reset leaves the producer's later batches, sent before it
        learned of that failure, to be refused OUT_OF_ORDER_SEQUENCE by the leader: without the
        hint (R4) that answer would reach the producer, a fatal error for an idempotent one. A
        hint only ever turns that answer into a retriable one, so keeping it is safe even when
        the rest of the state is not to be trusted.

        The old pipeline's commits still in flight are not carried over, and the fresh one does
        not wait for them: the leader applies them before a later commit on the same channel, and
        fences them by epoch on another (``representative.py``, "Reset after a bug"). Reports
        about them name ids the fresh pipeline never had, and are ignored."""
        fresh = CommitPipeline(
            retry_timeout_ms=self.retry_timeout_ms,
            retry_backoff_ms=self.retry_backoff_ms,
            hint_ttl_ms=self.hint_ttl_ms,
            max_hints=self.max_hints,
        )
        fresh._hints = OrderedDict(
            (key, _Hint(hint.epoch, dict(hint.failed), hint.expires_ms)) for key, hint in self._hints.items()
        )
        return fresh

    def leaders_changed(self) -> None:
        """Metadata changed: batches backing off after a leadership answer may try at once."""
        for batch in self._batches.values():
            batch.not_before_ms = 0

    def tick(self, now_ms: int) -> None:
        """Fail ready batches past their deadline (R5), except one with a later batch of its chain
        in flight: that answer comes first (bounded by the shell), and may show this one appended."""
        for chain in list(self._chains.values()):
            last_sent = _last_sent(chain)
            for index, batch in enumerate(list(chain)):
                if index < last_sent or batch.id not in self._batches:
                    continue
                if batch.state is State.READY and batch.deadline_ms is not None and now_ms >= batch.deadline_ms:
                    self._fail(batch, batch.reason, now_ms)

    # --- decisions -------------------------------------------------------------------------------

    def next_sends(self, now_ms: int, route: Callable[[PartitionKey], Route]) -> list[Send]:
        """Mark and return every commit that may be sent now (R1), grouped and ordered for sending."""
        self.tick(now_ms)
        groups: dict[tuple[int, Hashable], list[int]] = {}
        for key, chain in list(self._chains.items()):
            in_flight = {b.channel for b in chain if b.state is State.SENT}
            if len(in_flight) > 1:
                continue  # cannot happen by R1; never make it worse
            channel = next(iter(in_flight), None)
            last_sent = _last_sent(chain)
            decided: Route | None = None
            for index, batch in enumerate(list(chain)):
                if batch.state is State.SENT:
                    continue
                if index < last_sent:
                    break  # a later batch is in flight (this one was sent, then lost): its answer first
                if batch.state is not State.READY or batch.not_before_ms > now_ms:
                    break
                if decided is None:
                    decided = route(key)
                if decided is NoRoute.UNKNOWN:
                    self._fail(batch, UNKNOWN_PARTITION, now_ms)
                    break  # the chain's later batches failed with it
                if decided is NoRoute.NO_LEADER:
                    batch.reason = NOT_LEADER
                    break
                if channel is not None and decided != channel:
                    break
                channel = decided
                batch.state = State.SENT
                batch.channel = channel
                groups.setdefault((batch.flush, channel), []).append(batch.id)
        return [Send(channel, flush, sorted(ids)) for (flush, channel), ids in sorted(groups.items(), key=_flush_of)]

    def take_outcomes(self) -> list[tuple[int, dict[str, Any]]]:
        """Ordering outcomes decided since the last call: (batch id, answer for the producer)."""
        outcomes, self._outcomes = self._outcomes, []
        return outcomes

    def next_wakeup_ms(self) -> int | None:
        """When waiting batches may be sent (back-off) or must fail (deadline), if any wait."""
        times = []
        for batch in self._batches.values():
            if batch.state is State.READY:
                if batch.not_before_ms:
                    times.append(batch.not_before_ms)
                if batch.deadline_ms is not None:
                    times.append(batch.deadline_ms)
        return min(times) if times else None

    @property
    def in_flight_bytes(self) -> int:
        """Bytes of batches handed over and still without an ordering outcome."""
        return self._in_flight_bytes

    @property
    def pending(self) -> int:
        return len(self._batches)

    def state_of(self, batch_id: int) -> State | None:
        batch = self._batches.get(batch_id)
        return None if batch is None else batch.state

    # --- internals -------------------------------------------------------------------------------

    def _appended(self, batch: _Batch, result: dict[str, Any], now_ms: int) -> None:
        if batch.producer is not None:
            # The leader took this sequence, so it has every earlier one of the producer: an earlier
            # batch still waiting here (its answer was lost) is a duplicate now, to be resent and
            # answered as such, not failed at its deadline while this one succeeded.
            for other in self._chains.get(batch.key, []):
                if other is batch:
                    break
                if other.producer == batch.producer and other.deadline_ms is not None:
                    other.deadline_ms = max(other.deadline_ms, now_ms + self.retry_timeout_ms)
            hint_key = (batch.key, batch.producer[0])
            hint = self._hints.get(hint_key)
            if hint is not None and hint.epoch != batch.producer[1]:
                del self._hints[hint_key]  # a new epoch starts its sequences afresh
            elif hint is not None:
                # The leader's sequence passed this batch: every failure below it was resent.
                hint.failed = {seq: code for seq, code in hint.failed.items() if seq > batch.last_sequence}
                if not hint.failed:
                    del self._hints[hint_key]
        self._finish(batch, result)

    def _wait_again(self, batch: _Batch, code: int, now_ms: int) -> None:
        batch.state = State.READY
        batch.channel = None
        batch.reason = code if code in RETRIABLE else NOT_LEADER
        batch.not_before_ms = now_ms + self.retry_backoff_ms
        if batch.deadline_ms is None:
            batch.deadline_ms = now_ms + self.retry_timeout_ms

    def _earlier_of_producer_waiting(self, batch: _Batch) -> bool:
        for other in self._chains.get(batch.key, []):
            if other is batch:
                return False
            if other.producer == batch.producer:
                return True
        return False

    def _hint_for(self, batch: _Batch, now_ms: int) -> int | None:
        if batch.producer is None:
            return None
        hint = self._hints.get((batch.key, batch.producer[0]))
        if hint is None or hint.expires_ms <= now_ms or hint.epoch != batch.producer[1]:
            return None
        below = [seq for seq in hint.failed if seq < batch.base_sequence]
        return hint.failed[max(below)] if below else None

    def _fail(self, batch: _Batch, code: int, now_ms: int) -> None:
        """Fail ``batch``; a retriable code takes the chain's later batches with it (R2)."""
        chain = self._chains.get(batch.key, [])
        later = chain[chain.index(batch) + 1 :] if batch in chain else []
        self._note_hint(batch, code, now_ms)
        self._finish(batch, {"error_code": code})
        if code not in RETRIABLE:
            return
        for other in later:
            if other.id not in self._batches:
                continue
            if other.state is State.SENT:
                other.doomed = code
            else:
                self._note_hint(other, code, now_ms)
                self._finish(other, {"error_code": code})

    def _note_hint(self, batch: _Batch, code: int, now_ms: int) -> None:
        if batch.producer is None or code not in RETRIABLE:
            return
        hint_key = (batch.key, batch.producer[0])
        hint = self._hints.get(hint_key)
        if hint is None or hint.epoch != batch.producer[1]:
            hint = self._hints[hint_key] = _Hint(batch.producer[1], {}, 0)
        hint.failed[batch.base_sequence] = code
        while len(hint.failed) > MAX_FAILED_PER_HINT:
            del hint.failed[max(hint.failed)]  # the lowest failures are the ones that explain a gap
        hint.expires_ms = now_ms + self.hint_ttl_ms
        self._hints.move_to_end(hint_key)
        while len(self._hints) > self.max_hints:
            self._hints.popitem(last=False)

    def _finish(self, batch: _Batch, result: dict[str, Any]) -> None:
        if self._batches.pop(batch.id, None) is None:
            return
        chain = self._chains.get(batch.key)
        if chain is not None:
            chain.remove(batch)
            if not chain:
                del self._chains[batch.key]
        self._in_flight_bytes -= batch.size
        self._outcomes.append((batch.id, result))


def _last_sent(chain: list[_Batch]) -> int:
    """Index of the chain's last in-flight batch, or -1."""
    for index in range(len(chain) - 1, -1, -1):
        if chain[index].state is State.SENT:
            return index
    return -1


def _producer_of(data: bytes) -> tuple[tuple[int, int] | None, int, int]:
    """(producer id, epoch) of an idempotent batch, and its first and last sequence."""
    try:
        header = records.parse_header(data)
    except records.InvalidBatch:
        return None, -1, -1  # validated before it got here; without a header it simply has no producer
    if header.producer_id < 0 or header.base_sequence < 0:
        return None, -1, -1
    return (
        (header.producer_id, header.producer_epoch),
        header.base_sequence,
        header.base_sequence + header.last_offset_delta,
    )


def _flush_of(item: tuple[tuple[int, Hashable], list[int]]) -> int:
    return item[0][0]
