"""The internal RPCs a leader of diskless partitions answers: CommitBatches from representatives,
FetchPointers from brokers without a replica, WalReferences from the WAL file manager.

Every partition named in a request carries its topic id as well as its name, and the leader
serves it only when that id is the topic's current one: a topic deleted and re-created under the
same name is another topic, and a commit or read meant for one must never touch the other.
"""

from __future__ import annotations

import time
from typing import Any

import structlog
from kio.schema.errors import ErrorCode

from diskless.log.partition_log import OffsetOutOfRange
from diskless.log.txn_verification import TxnGuard
from diskless.metrics import DISKLESS_COMMIT_SECONDS
from diskless.protocol import records
from diskless.replication.partition import Partition, wait_for_commits

from .api_base import REF_NO, REF_UNKNOWN, REF_YES, ApiFamily

log = structlog.get_logger(__name__)


class DisklessRpcs(ApiFamily):
    """Leader side of the diskless commit, pointer-fetch and reference-query RPCs."""

    def commit_batches_now(self, body: dict[str, Any]) -> dict[str, Any]:
        """CommitBatches on the leader: append every pointer now, in call order, and answer at once.

        Called directly by a local representative and by the internal RPC handler, whose handlers
        start in request order. The answer is the appends' outcome only: that is all the
        representative's ordering needs. For acks=all each success carries ``last_offset`` and
        ``leader_epoch`` (and ``committed`` when the high watermark already passed it); the
        representative then awaits replication per partition (``await_replicated``), so one slow
        follower never holds back answers to other partitions or the commits behind them."""
        now = self.broker.now_ms()
        key = body["key"]
        expired = now - int(body["created_ms"]) > self.broker.config.diskless_wal_commit_timeout_ms
        results: list[dict[str, Any]] = []
        appended = False
        for entry in body["entries"]:
            if expired:
                results.append({"error_code": int(ErrorCode.request_timed_out)})
                continue
            stale = self._incarnation_error(entry["topic"], entry["partition"], entry.get("topic_id"))
            if stale is not None:
                results.append({"error_code": int(stale)})
                continue
            # The epoch the representative believed in: an entry of another epoch is refused, so
            # a commit refused at one epoch never lets a later one through after leadership returns.
            epoch = entry.get("leader_epoch", -1)
            code, plog, replica = self._leader_log(entry["topic"], entry["partition"], epoch)
            if plog is None or replica is None:
                results.append({"error_code": int(code)})
                continue
            if entry["acks"] == -1 and len(replica.isr) < plog.config.min_insync_replicas:
                results.append({"error_code": int(ErrorCode.not_enough_replicas)})
                continue
            try:
                result = plog.append_pointer_as_leader(
                    entry["header"],
                    key,
                    entry["position"],
                    replica.leader_epoch,
                    now,
                    txn_guard=TxnGuard.from_wire(entry.get("txn_guard")),
                    verify_txn=self.broker.config.transaction_partition_verification_enable,
                )
            except records.InvalidBatch as exc:
                results.append({"error_code": int(ErrorCode[exc.error])})
                continue
            if not result.duplicate:
                self.broker.on_leader_append(replica)
                appended = True
            results.append(
                {
                    "error_code": 0,
                    "base_offset": result.base_offset,
                    "last_offset": result.last_offset,
                    "leader_epoch": replica.leader_epoch,
                    "committed": plog.high_watermark > result.last_offset,
                    "log_append_time": result.log_append_time,
                    "log_start_offset": result.log_start_offset,
                }
            )
        if appended:
            self.broker.prefetch_objects({key})
        return {"results": results}

    async def commit_batches_rpc(self, body: dict[str, Any]) -> dict[str, Any]:
        """The internal RPC: appends happen in this coroutine's first step, i.e. in request order.

        With ``replication_wait_ms`` the answer waits that long at most for acks=all entries to
        replicate (marking them ``committed``), which saves the representative an AwaitReplicated
        round trip when followers are healthy. The wait is short and bounded, and answers on a
        peer connection go out as they finish, so it holds back nothing but this answer."""
        answer = self.commit_batches_now(body)
        wait_ms = int(body.get("replication_wait_ms", 0))
        if wait_ms <= 0:
            return answer
        waits = []
        for entry, result in zip(body["entries"], answer["results"], strict=True):
            if entry["acks"] == -1 and result.get("error_code") == 0 and not result.get("committed"):
                _, plog, replica = self._leader_log(entry["topic"], entry["partition"])
                if plog is not None and replica is not None and replica.leader_epoch == result["leader_epoch"]:
                    waits.append((result, replica))
        if waits:
            # One future for all of them (not a task each): the answer resumes in the loop turn
            # after the follower fetch that replicates the last of them.
            outcomes = await wait_for_commits(
                [(replica, result["last_offset"], result["leader_epoch"]) for result, replica in waits],
                wait_ms / 1000,
                first=False,
            )
            for (result, _), committed in zip(waits, outcomes, strict=True):
                result["committed"] = committed is True
        return answer

    async def await_replicated(self, body: dict[str, Any]) -> dict[str, Any]:
        """AwaitReplicated (acks=all): for each (topic, topic id, partition, offset, leader epoch),
        is the pointer appended at ``offset`` under ``leader_epoch`` replicated (high watermark past
        it)? Answers as soon as any entry is decided, or after ``max_wait_ms`` with all pending, so
        each partition's producers wait for their own followers only. Per entry: ``done`` true,
        ``error_code`` NOT_LEADER_OR_FOLLOWER when we no longer lead it at that epoch (the pointer
        may be truncated by the new leader), or neither (still waiting: ask again)."""
        entries = body["entries"]
        wait_s = max(0, int(body.get("max_wait_ms", 5000))) / 1000

        def check(entry: dict[str, Any]) -> tuple[dict[str, Any] | None, Partition | None]:
            stale = self._incarnation_error(entry["topic"], entry["partition"], entry.get("topic_id"))
            if stale is not None:
                return {"error_code": int(stale)}, None
            _, plog, replica = self._leader_log(entry["topic"], entry["partition"])
            if plog is None or replica is None or replica.leader_epoch != entry["leader_epoch"]:
                return {"error_code": int(ErrorCode.not_leader_or_follower)}, None
            if plog.high_watermark > entry["offset"]:
                return {"error_code": 0, "done": True}, None
            return None, replica

        started = time.monotonic()
        checked = [check(entry) for entry in entries]
        if wait_s > 0 and all(decided is None for decided, _ in checked):
            waits = [
                (replica, entry["offset"], entry["leader_epoch"])
                for entry, (_, replica) in zip(entries, checked, strict=True)
                if replica is not None
            ]
            await wait_for_commits(waits, wait_s, first=True)
            checked = [check(entry) for entry in entries]
        DISKLESS_COMMIT_SECONDS.observe(time.monotonic() - started)
        return {"results": [decided or {"error_code": 0, "done": False} for decided, _ in checked]}

    async def wal_references_rpc(self, body: dict[str, Any]) -> dict[str, Any]:
        """WalReferences from the WAL file manager: for each (object, topic id, partition), does that
        partition, answered by its leader (us), still reference the object? 0 no, 1 yes, 2 cannot
        say. Each answer comes with the leader epoch we lead the partition at (-1 when we cannot
        say), so the manager can discard answers of a leader that was deposed meanwhile.

        A topic id or partition our metadata does not know is UNKNOWN, not "deleted": our view may
        lag its creation; only the manager, with a fresh read of the topics, concludes deletion.
        A broker that cannot refresh its etcd lease is no longer sure to be the leader: UNKNOWN."""
        answers: list[int] = []
        epochs: list[int] = []
        fenced = self._leader_fenced()
        for key, topic_id, index in body["queries"]:
            topic = self._meta.topic_by_id(topic_id)
            replica = None
            if topic is not None and index < len(topic.partitions) and not fenced:
                replica = self.broker.replicas.hosted(topic.name, index, topic_id)
            if replica is None or replica.leader_state is None:
                answers.append(REF_UNKNOWN)
                epochs.append(-1)
            else:
                answers.append(REF_YES if replica.log.references(key) else REF_NO)
                epochs.append(replica.leader_epoch)
        return {"answers": answers, "epochs": epochs}

    async def fetch_pointers_rpc(self, body: dict[str, Any]) -> dict[str, Any]:
        """FetchPointers on the leader: a slice of the log for a broker that has no replica, with the
        last stable offset and, for ``read_committed``, reads bounded by it plus the aborted
        transactions of the range (a consumer there must see what a consumer here would)."""
        stale = self._incarnation_error(body["topic"], body["partition"], body.get("topic_id"))
        if stale is not None:
            return {"error_code": int(stale)}
        code, plog, _ = self._leader_log(body["topic"], body["partition"], int(body.get("current_leader_epoch", -1)))
        if plog is None:
            return {"error_code": int(code)}
        stable = plog.last_stable_offset
        answer = {
            "high_watermark": plog.high_watermark,
            "last_stable_offset": stable,
            "log_start_offset": plog.log_start_offset,
        }
        # read_committed stops at the last stable offset, exactly as a local read does; the reader
        # needs the aborted transactions of the range to drop their records.
        committed = bool(body.get("read_committed", False))
        try:
            result = plog.read(
                body["offset"], body["max_bytes"], max_offset=stable if committed else None, min_one=True
            )
        except OffsetOutOfRange:
            return {"error_code": int(ErrorCode.offset_out_of_range), **answer}
        aborted = []
        if committed and result.records:
            aborted = [[a.producer_id, a.first_offset] for a in plog.txns.aborted_between(body["offset"], stable)]
        return {"error_code": 0, "kind": result.kind, "data": result.records, "aborted_transactions": aborted, **answer}

    def _incarnation_error(self, topic: str, partition: int, topic_id: Any) -> ErrorCode | None:
        """Why a request naming ``topic_id`` must not touch our ``topic``/``partition``, or None.

        No id (a sender from before ids were sent) is INVALID_REQUEST: guessing the incarnation is
        exactly the mistake ids exist to prevent. An id that is not the topic's current one is
        UNKNOWN_TOPIC_ID, as Kafka answers a stale id: the sender's batch belongs to a topic that
        no longer exists. The current id while our hosted replica still belongs to an older
        incarnation (its metadata change not applied yet) is NOT_LEADER_OR_FOLLOWER: retriable,
        the old log must not take it. A topic gone altogether is left to the usual lookup.
        """
        if not isinstance(topic_id, str):
            return ErrorCode.invalid_request
        meta = self._meta.topics.get(topic)
        if meta is None:
            return None
        if meta.topic_id != topic_id:
            return ErrorCode.unknown_topic_id
        hosted = self.broker.replicas.topic_id_of(topic, partition)
        if hosted is not None and hosted != topic_id:
            return ErrorCode.not_leader_or_follower
        return None
