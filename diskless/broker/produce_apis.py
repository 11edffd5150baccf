"""Produce and InitProducerId.

Ordering note: the connection layer starts handlers in request order, and ``produce`` appends
before its first ``await``, so pipelined produce requests on one connection append in order.
Diskless partitions are handed to the representative instead of appended here.

Transactional batches of classic partitions that must be verified with their coordinator first
(KIP-890 part 1), and the batches of their producers that arrive meanwhile, wait in
``ClassicTxnVerification`` (``classic_txn_verification.py``); their turn is ``_take_turn`` here. A
produce request with a waiting batch is answered once every batch of it is appended or refused;
acks=all replication is then awaited for the request's timeout, counted from there, as Kafka starts
its delayed produce after the verification callback appended."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import structlog
from kio.schema.errors import ErrorCode

from diskless.log.batch_codec import in_topic_codec
from diskless.log.key_check import KeylessRecords, check_keys
from diskless.log.partition_log import PartitionLog, timestamp_allowed
from diskless.log.txn_verification import TxnGuard
from diskless.produce.representative import TxnCheck
from diskless.protocol import messages as m
from diskless.protocol import records
from diskless.replication.partition import Partition, wait_for_commits

from .api_base import ApiFamily, CloseConnection, _ms
from .classic_txn_verification import Appended, ClassicTxnVerification, WaitingBatch

if TYPE_CHECKING:
    from .broker import Broker
    from .txn_verification_rpcs import TxnVerificationRpcs

log = structlog.get_logger(__name__)


ZSTD_SINCE_PRODUCE_VERSION = 7  # KIP-110


def _first_headers(request: Any) -> list[records.BatchHeader]:
    """Each partition's (first) batch header, where there is one (produce v3+ carries one batch)."""
    return [
        records.parse_header(memoryview(pdata.records))
        for topic_data in request.topic_data
        for pdata in topic_data.partition_data
        if pdata.records and len(pdata.records) >= records.HEADER_SIZE
    ]


def _request_refusal(version: int, request: Any) -> ErrorCode | None:
    """What Kafka refuses a whole produce request for (ProduceRequest.validateRecords, KafkaApis)."""
    headers = _first_headers(request)
    if version < ZSTD_SINCE_PRODUCE_VERSION and any(h.compression == records.COMPRESSION_ZSTD for h in headers):
        return ErrorCode.unsupported_compression_type
    if getattr(request, "transactional_id", None) is None and any(h.is_transactional for h in headers):
        # A transaction no coordinator knows would hold the partition's last stable offset.
        return ErrorCode.transactional_id_authorization_failed
    return None


def _partition_answer(partition: int, code: ErrorCode, message: str | None = None) -> dict[str, Any]:
    """A partition's produce answer with nothing appended (yet): ``code`` and no offsets."""
    return {
        "index": partition,
        "error_code": code,
        "base_offset": -1,
        "log_append_time": None,
        "log_start_offset": -1,
        "record_errors": [],
        "error_message": message,
    }


def _failed(partition: int, code: ErrorCode, message: str | None = None) -> tuple[dict[str, Any], None, int]:
    """A classic partition's produce refused with ``code``: nothing appended."""
    return _partition_answer(partition, code, message), None, -1


def _refused(request: Any, code: ErrorCode) -> dict[str, Any]:
    """Every partition of the request answered ``code``."""
    return {
        "responses": [
            {
                "name": topic_data.name,
                "partition_responses": [_partition_answer(pdata.index, code) for pdata in topic_data.partition_data],
            }
            for topic_data in request.topic_data
        ],
        "throttle_time": 0,
    }


# Verification outcomes that refuse a batch for a passing reason: the producer retries it.
_PASSING = frozenset({ErrorCode.not_enough_replicas, ErrorCode.not_leader_or_follower})


class ProduceApis(ApiFamily):
    """Produce to classic partitions (append here) and diskless ones (via the representative)."""

    def __init__(self, broker: Broker) -> None:
        super().__init__(broker)
        # Empty but for the first batch of a producer's transaction at a partition, for one round trip.
        self._txn_verification = ClassicTxnVerification(self._verify_leader, self._take_turn)

    def _verify_leader(self, *question: Any) -> Awaitable[TxnGuard | ErrorCode]:
        verification: TxnVerificationRpcs = self.broker.apis.txn_verification
        return verification.verify_leader(*question)

    def handlers(self) -> dict[int, Callable[[m.RequestHeader, Any], Any]]:
        return {
            m.API_PRODUCE: self.produce,
            m.API_INIT_PRODUCER_ID: self.init_producer_id,
        }

    def produce(self, header: m.RequestHeader, request: Any) -> Any:
        """Append synchronously (request order is append order), then wait for acks=all if asked."""
        now = self.broker.now_ms()
        acks = request.acks
        timeout_s = _ms(request.timeout) / 1000
        refusal = _request_refusal(header.api_version, request)
        if refusal is not None:
            if acks == 0:
                raise CloseConnection(f"acks=0 produce refused: {refusal.name}")
            return _refused(request, refusal)
        transactional_id = getattr(request, "transactional_id", None)
        responses = []
        pending: list[tuple[dict[str, Any], Partition, int, int]] = []
        remote: list[tuple[dict[str, Any], asyncio.Future[dict[str, Any]]]] = []
        waiting: list[tuple[list[dict[str, Any]], int, asyncio.Future[Appended]]] = []
        for topic_data in request.topic_data:
            parts = []
            diskless = self._is_diskless(topic_data.name)
            for pdata in topic_data.partition_data:
                if diskless:
                    result, future = self._produce_diskless(
                        topic_data.name,
                        pdata.index,
                        pdata.records,
                        acks,
                        now,
                        transactional_id,
                        int(timeout_s * 1000),
                    )
                    if future is not None:
                        remote.append((result, future))
                    parts.append(result)
                    continue
                outcome = self._produce_partition(
                    topic_data.name, pdata.index, pdata.records, acks, now, transactional_id
                )
                if isinstance(outcome, asyncio.Future):
                    # Waits for a verification: its entry is filled in once appended or refused.
                    waiting.append((parts, len(parts), outcome))
                    parts.append({})
                    continue
                result, replica, last_offset = outcome
                if replica is not None and acks == -1:
                    pending.append((result, replica, last_offset, replica.leader_epoch))
                parts.append(result)
            responses.append({"name": topic_data.name, "partition_responses": parts})
        if acks == 0:
            # As Kafka does: a failed acks=0 produce closes the connection, the client's only signal
            # that its records were refused (it then refreshes metadata and reconnects).
            errors = [p["error_code"] for t in responses for p in t["partition_responses"] if p.get("error_code")]
            if errors:
                raise CloseConnection(f"acks=0 produce failed: {[e.name for e in errors]}")
            if waiting:
                return self._await_waiting_acks0(waiting, remote)
            return self._await_buffered(remote) if remote else None
        body = {"responses": responses, "throttle_time": 0}
        if not pending and not remote and not waiting:
            return body
        return self._await_replication(body, pending, remote, timeout_s, waiting, acks)

    async def _await_waiting_acks0(
        self,
        waiting: list[tuple[list[dict[str, Any]], int, asyncio.Future[Appended]]],
        remote: list[tuple[dict[str, Any], asyncio.Future[dict[str, Any]]]],
    ) -> None:
        """acks=0 with batches waiting for a verification: handled until they are appended, as
        Kafka appends before it reads the connection's next request; a refusal closes the connection."""
        try:
            appended = await asyncio.gather(*(future for _, _, future in waiting))
        except BaseException:
            self._withdraw(remote)
            raise
        errors = [entry["error_code"] for entry, _, _ in appended if entry["error_code"]]
        if errors:
            self._withdraw(remote)
            raise CloseConnection(f"acks=0 produce failed: {[ErrorCode(e).name for e in errors]}")
        if remote:
            await self._await_buffered(remote)

    async def _await_replication(
        self,
        body: dict[str, Any],
        pending: list[tuple[dict[str, Any], Partition, int, int]],
        remote: list[tuple[dict[str, Any], asyncio.Future[dict[str, Any]]]],
        timeout_s: float,
        waiting: list[tuple[list[dict[str, Any]], int, asyncio.Future[Appended]]] | None = None,
        acks: int = -1,
    ) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        if waiting:
            # Not bounded by the request's timeout, as in Kafka (the coordinator question is, and
            # every batch waiting is verified concurrently): a batch still waiting would be appended
            # after its request was answered, which its producer's retry would then duplicate.
            try:
                for parts, index, future in waiting:
                    entry, replica, last_offset = await future
                    parts[index] = entry
                    if replica is not None and acks == -1:
                        pending.append((entry, replica, last_offset, replica.leader_epoch))
            except BaseException:
                self._withdraw(remote)
                raise
        # One deadline for the whole request, as Kafka's delayed produce: a request with diskless
        # and classic partitions waited the timeout for each kind in turn, twice it in all.
        deadline = loop.time() + timeout_s
        if remote:
            try:
                await asyncio.wait([f for _, f in remote], timeout=timeout_s)
            finally:
                self._withdraw(remote)  # timed out or cancelled: no batch waits for room on our behalf
            for entry, future in remote:
                outcome = future.result() if future.done() else {"error_code": int(ErrorCode.request_timed_out)}
                code = ErrorCode(outcome["error_code"])
                if code == ErrorCode.unknown_topic_id:
                    # The leader refused a commit naming a deleted incarnation. Produce v3-9 names
                    # topics, and clients of those versions know only this code for a missing topic.
                    code = ErrorCode.unknown_topic_or_partition
                entry["error_code"] = code
                if code == ErrorCode.none:
                    entry["base_offset"] = outcome["base_offset"]
                    entry["log_start_offset"] = outcome.get("log_start_offset", -1)
                    append_time = outcome.get("log_append_time", -1)
                    entry["log_append_time"] = append_time if append_time >= 0 else None
        waits = [(replica, last, epoch) for _, replica, last, epoch in pending]
        results = await wait_for_commits(waits, max(0.0, deadline - loop.time()), first=False)
        for (entry, replica, _, epoch), committed in zip(pending, results, strict=True):
            if committed:
                if len(replica.isr) < replica.log.config.min_insync_replicas:
                    entry.update(error_code=ErrorCode.not_enough_replicas_after_append, base_offset=-1)
                continue
            code = ErrorCode.request_timed_out if replica.leads_at(epoch) else ErrorCode.not_leader_or_follower
            entry.update(error_code=code, base_offset=-1, log_append_time=None, log_start_offset=-1)
        return body

    async def _await_buffered(self, remote: list[tuple[dict[str, Any], asyncio.Future[dict[str, Any]]]]) -> None:
        """acks=0: handled until its diskless batches are buffered, as Kafka appends an acks=0 batch
        before it reads the connection's next request. Meanwhile its frame stays counted in
        ``queued.max.request.bytes``, the only bound on batches waiting for room in the
        representative's buffer; returning at once let acks=0 producers pile batches up there
        without bound. No timeout, as in Kafka: the representative moves on in bounded time."""
        representative = self.broker.representative
        assert representative is not None
        waits = [w for _, future in remote if (w := representative.until_buffered(future)) is not None]
        try:
            if waits:
                await asyncio.wait(waits)
        finally:
            self._withdraw(remote)  # the connection closed meanwhile: those still waiting go

    def _withdraw(self, remote: list[tuple[dict[str, Any], asyncio.Future[dict[str, Any]]]]) -> None:
        """The request ends: its batches still waiting for room are never written (REQUEST_TIMED_OUT)."""
        representative = self.broker.representative
        if representative is None:
            return
        for _, future in remote:
            if not future.done():
                representative.withdraw(future)

    def _is_diskless(self, topic: str) -> bool:
        meta = self._meta.topics.get(topic)
        return meta is not None and self.broker.is_diskless(meta)

    def _produce_diskless(
        self,
        topic: str,
        partition: int,
        data: bytes | None,
        acks: int,
        now: int,
        transactional_id: str | None = None,
        timeout_ms: int = 30000,
    ) -> tuple[dict[str, Any], asyncio.Future[dict[str, Any]] | None]:
        """Any broker accepts diskless produce: validate the header, hand the batch to the representative."""
        entry = _partition_answer(partition, ErrorCode.none)  # the representative's answer fills it in

        def failed(code: ErrorCode, message: str | None = None) -> tuple[dict[str, Any], None]:
            entry.update(error_code=code, error_message=message)
            return entry, None

        meta = self._meta.topics.get(topic)
        state = self._meta.partition(topic, partition)
        if meta is None or state is None:
            return failed(ErrorCode.unknown_topic_or_partition)
        if acks not in (0, 1, -1):
            return failed(ErrorCode.invalid_required_acks)
        representative = self.broker.representative
        if representative is None:
            return failed(ErrorCode.kafka_storage_error, "diskless topics need diskless.s3.endpoint")
        if not data:
            return failed(ErrorCode.invalid_record, "produce request carries no records")
        config = self.broker.log_config(meta)
        try:
            batches = records.split_batches(data)
            if len(batches) != 1:
                raise records.InvalidBatch("invalid_record", "produce v3+ must carry exactly one record batch")
            header = records.validate_batch(batches[0], config.max_message_bytes)
            if not timestamp_allowed(header, config, now):
                raise records.InvalidBatch("invalid_timestamp", "timestamp outside the allowed range")
            # In the topic's codec before upload: the object holds what consumers of the topic get.
            converted, header = in_topic_codec(batches[0], header, config)
            # No segment.bytes check (RECORD_LIST_TOO_LARGE) here: a diskless partition's segments
            # hold a pointer entry per batch, whatever the batch's size; the batch goes to a WAL object.
        except records.InvalidBatch as exc:
            return failed(ErrorCode[exc.error], str(exc))
        if acks == -1 and len(state.isr) < config.min_insync_replicas:
            return failed(ErrorCode.not_enough_replicas)
        batch = bytearray(converted)
        if config.message_timestamp_type == "LogAppendTime":
            # Stamped before upload: the bytes in object storage are the bytes consumers get.
            records.set_log_append_time(batch, now)
        txn = None
        if header.is_transactional and self.broker.config.transaction_partition_verification_enable:
            if not transactional_id:
                # As Kafka: transactional records need a transactional id to be authorised against.
                return failed(
                    ErrorCode.transactional_id_authorization_failed, "transactional records need a transactional id"
                )
            # Verified with the leader before it is buffered: its commit may come late (KIP-890).
            txn = TxnCheck(transactional_id, header.producer_id, header.producer_epoch, now + timeout_ms)
        return entry, representative.submit(
            topic, meta.topic_id, partition, bytes(batch), acks, txn, timeout_s=timeout_ms / 1000
        )

    def _produce_partition(
        self,
        topic: str,
        partition: int,
        data: bytes | None,
        acks: int,
        now: int,
        transactional_id: str | None = None,
    ) -> Appended | asyncio.Future[Appended]:
        """Append one classic batch now, or (the first batch of a transaction here, or a batch of
        its producer behind one) a future of its append once it is verified (module docstring)."""
        if acks not in (0, 1, -1):
            return _failed(partition, ErrorCode.invalid_required_acks)
        code, plog, replica = self._leader_log(topic, partition)
        if plog is None or replica is None:
            if code == ErrorCode.not_leader_or_follower and data:
                self._note_fenced_refusal(topic, partition, data)
            return _failed(partition, code)
        if not data:
            return _failed(partition, ErrorCode.invalid_record, "produce request carries no records")
        try:
            batches = records.split_batches(data)
            if len(batches) != 1:
                raise records.InvalidBatch("invalid_record", "produce v3+ must carry exactly one record batch")
        except records.InvalidBatch as exc:
            return _failed(partition, ErrorCode[exc.error], str(exc))
        verify = self.broker.config.transaction_partition_verification_enable
        waiting = self._txn_verification.hold(
            plog, replica.leader_epoch, topic, partition, batches, acks, transactional_id, verify
        )
        if waiting is not None:
            return waiting
        return self._append(plog, replica, partition, batches, acks, now, None)

    def _append(
        self,
        plog: PartitionLog,
        replica: Partition,
        partition: int,
        batches: list[memoryview],
        acks: int,
        now: int,
        guard: TxnGuard | None,
    ) -> Appended:
        try:
            if acks == -1 and len(replica.isr) < plog.config.min_insync_replicas:
                plog.producer_state.note_refused(records.parse_header(batches[0]), "not_enough_replicas")
                return _failed(partition, ErrorCode.not_enough_replicas)
            # Compacted topics only (nothing parsed otherwise): Kafka's LogValidator.validateKey.
            check_keys(batches, plog.config, replica.topic, partition)
            verify = self.broker.config.transaction_partition_verification_enable
            result = plog.append_as_leader(batches, replica.leader_epoch, now, txn_guard=guard, verify_txn=verify)
        except KeylessRecords as exc:
            entry, _, _ = _failed(partition, ErrorCode.invalid_record, str(exc))
            # Produce v8+ carry them (produce_response.py); the log start offset as Kafka's
            # processFailedRecord answers it.
            entry["record_errors"] = [
                {"batch_index": index, "batch_index_error_message": message} for index, message in exc.record_errors
            ]
            entry["log_start_offset"] = plog.log_start_offset
            return entry, None, -1
        except records.InvalidBatch as exc:
            return _failed(partition, ErrorCode[exc.error], str(exc))
        if not result.duplicate:
            self.broker.on_leader_append(replica)
        entry = {
            "index": partition,
            "error_code": ErrorCode.none,
            "base_offset": result.base_offset,
            "log_append_time": result.log_append_time if result.log_append_time >= 0 else None,
            "log_start_offset": result.log_start_offset,
            "record_errors": [],
            "error_message": None,
        }
        return entry, replica, result.last_offset

    def _take_turn(self, waited_on: PartitionLog, item: WaitingBatch) -> Appended:
        """A batch's turn at the front of its producer's line on ``waited_on``: appended, or refused
        (leadership moved, the log was replaced, its verification failed)."""
        code, plog, replica = self._leader_log(item.topic, item.partition)
        if plog is not waited_on or replica is None:
            # Leadership moved while it waited (or the log was replaced): this log's line is void.
            if plog is None and code == ErrorCode.not_leader_or_follower:
                self._note_fenced_refusal(item.topic, item.partition, item.batches[0])
            return _failed(item.partition, code or ErrorCode.not_leader_or_follower)
        if isinstance(item.verified, ErrorCode):
            if item.verified in _PASSING:
                # Its pipelined successors must not be answered OUT_OF_ORDER_SEQUENCE_NUMBER for
                # the gap this refusal makes (ProducerStateManager.note_refused).
                plog.producer_state.note_refused(records.parse_header(item.batches[0]), item.verified.name)
            return _failed(item.partition, item.verified, "transaction verification failed")
        return self._append(plog, replica, item.partition, item.batches, item.acks, self.broker.now_ms(), item.verified)

    def _note_fenced_refusal(self, topic: str, partition: int, data: bytes | memoryview) -> None:
        """A replica leading here refused a batch only because its lease may have lapsed: it may
        serve again at the same epoch, so its producer state must know of the gap it made
        (ProducerStateManager.note_refused)."""
        meta = self._meta.topics.get(topic)
        replica = self.broker.replicas.hosted(topic, partition, meta.topic_id) if meta is not None else None
        if replica is None or replica.leader_state is None:
            return
        try:
            batches = records.split_batches(data)
            if len(batches) == 1:
                header = records.parse_header(batches[0])
                replica.log.producer_state.note_refused(header, "not_leader_or_follower")
        except records.InvalidBatch:
            pass

    async def init_producer_id(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        if request.transactional_id is not None:
            from diskless.transactions.handlers import init_producer_id

            answer = await init_producer_id(self.broker.txns, header, request)
            if answer is not None:
                return answer
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.none,
            "producer_id": await self.broker.allocate_producer_id(),
            "producer_epoch": 0,
        }

    # --- Fetch -----------------------------------------------------------------------------------
