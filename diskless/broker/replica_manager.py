"""The partition replicas this broker hosts: their logs on disk, roles, fetchers and wake-ups.

A log directory is ``<log.dirs>/<topic>-<partition>`` with a ``partition.metadata`` file holding
the topic id. A hosted replica belongs to one incarnation of its topic (its topic id): when the
metadata shows the name under another id (a deletion and re-creation, possibly never seen as such
after a lost etcd watch), the old replica is deleted and a fresh log created, never reused.
``apply`` follows the metadata store: it creates replicas this broker was assigned, switches
their roles (leader, follower, offline) and moves followers between per-leader fetchers.

High watermarks of all hosted replicas are checkpointed in ONE file per log directory, as Kafka's
``replication-offset-checkpoint`` (a file per partition rewritten every few seconds is 10,000
writes per pass on a big broker). Format, text: a version line (``1``), a count line, then one
line per replica ``<topic> <partition> <high watermark> <topic id>``; Kafka's version 0 has no
topic id, which we add so a topic re-created under the same name never inherits the old
incarnation's HW. Written to a temporary file, fsynced, renamed over the old one and the directory
fsynced: a crash leaves the previous or the new checkpoint whole. A stale checkpoint only
under-reports (HWs only grow; the leader recomputes its HW from the ISR, a follower learns it from
the leader), and a replica with no entry starts at 0 or at the per-partition file older versions
wrote, which is read once and deleted after the first checkpoint here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import threading
import uuid
from collections import Counter
from collections.abc import Callable

import structlog

from diskless.cluster.metadata import BrokerInfo, PartitionState, TopicMetadata
from diskless.files import fsync_directory
from diskless.log.config import LogConfig
from diskless.log.partition_log import HW_FILE, PartitionLog
from diskless.replication.fetcher import ReplicaFetcher
from diskless.replication.partition import FOLLOWER, Partition
from diskless.security.internal_auth import ClusterSecret

log = structlog.get_logger(__name__)

PARTITION_METADATA = "partition.metadata"
HW_CHECKPOINT_FILE = "replication-offset-checkpoint"
_HW_CHECKPOINT_VERSION = 1


class ReplicaManager:
    def __init__(
        self,
        log_dir: str,
        node_id: int,
        lookup: Callable[[int], BrokerInfo | None],
        fetch_wait_max_ms: int = 500,
        fetch_max_bytes: int = 1048576,
        on_pointers: Callable[[bytes], None] = lambda entries: None,
        local_host: str | None = None,
        credentials: ClusterSecret | None = None,
    ) -> None:
        self.local_host = local_host
        self.credentials = credentials  # replica fetches are internal: their connections prove the secret
        self.log_dir = log_dir
        self.node_id = node_id
        self.lookup = lookup
        self.fetch_wait_max_ms = fetch_wait_max_ms
        self.fetch_max_bytes = fetch_max_bytes
        self.on_pointers = on_pointers
        os.makedirs(log_dir, exist_ok=True)
        self.partitions: dict[tuple[str, int], Partition] = {}
        # The incarnation each hosted replica belongs to. Lookups stay by name (one incarnation of a
        # name exists at a time); every path that creates or reuses a replica checks the id.
        self.topic_ids: dict[tuple[str, int], str] = {}
        self.fetchers: dict[int, ReplicaFetcher] = {}
        # Parked long polls, each a future an append resolves: followers' fetches of partitions led
        # here, and consumers' fetches, which only new readable data (or a role change) concerns.
        # Plain futures, not an Event under wait_for (a task per wait): a woken fetch resumes in the
        # next loop turn (tests/unit/test_commit_wakeups.py).
        self._append_waiters: set[asyncio.Future[None]] = set()
        self._readable_waiters: set[asyncio.Future[None]] = set()
        # DeleteRecords waiting for followers to report the new log start (Kafka's
        # DelayedDeleteRecords): woken by replica fetches, which carry each follower's log start.
        self._follower_fetch_waiters: set[asyncio.Future[None]] = set()
        self._closed = False
        self._checkpointed: list[str] | None = None  # lines of the last HW checkpoint written
        self._checkpoint_lock = threading.Lock()
        self._checkpoint_generation = 0  # of the lines last taken; taken on the loop only
        self._written_generation = 0  # of the lines last written (under the lock)
        self._legacy_hw_files: list[str] = []  # per-partition HW files of older versions
        # Roles taken since the last summary: topic -> role -> count, and topics that had a replica
        # take its first role (epoch 0). One info line per batch of changes, not per partition.
        self._roles_taken: dict[str, Counter[str]] = {}
        self._first_roles: set[str] = set()

    # --- opening and deleting logs ------------------------------------------------------------

    def load(
        self, topics: dict[str, TopicMetadata], config_for: Callable[[TopicMetadata], LogConfig], now_ms: int
    ) -> None:
        """Open logs found on disk that belong to live topics; delete those of topics that are gone."""
        checkpointed = self._read_hw_checkpoint()
        for name in sorted(os.listdir(self.log_dir)):
            path = os.path.join(self.log_dir, name)
            if name.endswith("-delete") and os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)  # a topic deletion interrupted by a crash
                continue
            if not os.path.isfile(os.path.join(path, PARTITION_METADATA)):
                continue  # not a partition directory of ours: leave it alone
            topic, _, part = name.rpartition("-")
            meta = topics.get(topic)
            if (
                not part.isdigit()
                or meta is None
                or _read_topic_id(path) != meta.topic_id
                or int(part) >= len(meta.partitions)
                or self.node_id not in meta.partitions[int(part)].replicas
            ):
                log.info("deleting stale log directory", dir=name)
                shutil.rmtree(path, ignore_errors=True)
                continue
            plog = PartitionLog(path, config_for(meta), now_ms, hw_file=False)
            hw = checkpointed.get((topic, int(part), meta.topic_id))
            if hw is not None:
                plog.high_watermark = min(hw, plog.log_end_offset)
            if os.path.exists(os.path.join(path, HW_FILE)):
                self._legacy_hw_files.append(os.path.join(path, HW_FILE))
            if plog.recovered_bytes_truncated:
                log.warning("truncated torn log tail", dir=name, bytes=plog.recovered_bytes_truncated)
            self.partitions[(topic, int(part))] = Partition(topic, int(part), plog, self.node_id, meta.topic_id)
            self.topic_ids[(topic, int(part))] = meta.topic_id

    def _ensure(self, topic: TopicMetadata, index: int, config: LogConfig, now_ms: int) -> Partition:
        key = (topic.name, index)
        partition = self.partitions.get(key)
        if partition is not None and self.topic_ids.get(key) != topic.topic_id:
            log.info(
                "replacing the replica of an older incarnation",
                topic=topic.name,
                partition=index,
                old_topic_id=self.topic_ids.get(key),
                topic_id=topic.topic_id,
            )
            self._drop(key)
            partition = None
        if partition is None:
            path = os.path.join(self.log_dir, f"{topic.name}-{index}")
            if os.path.isdir(path) and _read_topic_id(path) != topic.topic_id:
                # Not hosted, yet on disk: left by another incarnation (or a creation cut short by a
                # crash before its metadata file). Never adopt its data.
                _delete_directory(path)
            os.makedirs(path, exist_ok=True)
            with open(os.path.join(path, PARTITION_METADATA), "w") as f:
                f.write(f"version: 0\ntopic_id: {topic.topic_id}\n")
            plog = PartitionLog(path, config, now_ms, hw_file=False)
            partition = Partition(topic.name, index, plog, self.node_id, topic.topic_id)
            self.partitions[key] = partition
            self.topic_ids[key] = topic.topic_id
        return partition

    def topic_id_of(self, topic: str, index: int) -> str | None:
        """The topic id of the hosted replica of ``topic``/``index``, None if none is hosted."""
        return self.topic_ids.get((topic, index)) if (topic, index) in self.partitions else None

    def hosted(self, topic: str, index: int, topic_id: str) -> Partition | None:
        """The hosted replica of that partition of incarnation ``topic_id``, if this broker has it."""
        partition = self.partitions.get((topic, index))
        return partition if partition is not None and self.topic_ids.get((topic, index)) == topic_id else None

    def on_topic(self, topic: TopicMetadata, config: LogConfig) -> None:
        """A topic record changed: drop replicas of another incarnation of that name (or of
        partitions the current one does not have), then apply the configs to the rest."""
        for key in [k for k in self.partitions if k[0] == topic.name]:
            if self.topic_ids.get(key) != topic.topic_id or key[1] >= len(topic.partitions):
                log.info("deleting the replica of an older incarnation", topic=key[0], partition=key[1])
                self._drop(key)
        self.update_config(topic.name, config)

    def delete_topic(self, name: str) -> None:
        for key in [k for k in self.partitions if k[0] == name]:
            self._drop(key)

    def _drop(self, key: tuple[str, int]) -> None:
        partition = self.partitions.pop(key)
        self.topic_ids.pop(key, None)
        for fetcher in self.fetchers.values():
            fetcher.remove(key)
        partition.apply_state(PartitionState(replicas=[], leader=-1, leader_epoch=partition.leader_epoch + 1), 0)
        partition.log.close(clean=False)  # the descriptors of its segments, retired ones too
        _delete_directory(partition.log.directory)

    def update_config(self, topic: str, config: LogConfig) -> None:
        for (name, _), partition in self.partitions.items():
            if name == topic:
                partition.log.update_config(config)

    # --- following the metadata store -----------------------------------------------------------

    def apply(self, topic: TopicMetadata, index: int, config: LogConfig, now_ms: int) -> Partition | None:
        """Bring one partition replica in line with its stored state; returns it if hosted here."""
        if self._closed:
            # Metadata still arrives while the broker stops (leaderships moving away): reopening a
            # log or starting a fetcher after close() would leave a task nobody stops.
            return None
        state = topic.partitions[index]
        key = (topic.name, index)
        if self.node_id not in state.replicas:
            if key in self.partitions:
                self._drop(key)
            return None
        partition = self._ensure(topic, index, config, now_ms)
        bounds = partition.log.read_bounds
        changed = partition.apply_state(state, now_ms)
        if changed is None and partition.log.read_bounds != bounds:
            self.notify_append()  # an ISR shrink committed what the remaining replicas hold
        if changed is not None:
            self._roles_taken.setdefault(topic.name, Counter())[changed] += 1
            if state.leader_epoch == 0:
                self._first_roles.add(topic.name)
            # Debug: a broker takes thousands of roles at once when a big topic is created; the
            # info line is log_role_summary's.
            log.debug(
                "partition role",
                topic=topic.name,
                partition=index,
                role=changed,
                epoch=state.leader_epoch,
                leader=state.leader,
            )
        for leader_id, fetcher in self.fetchers.items():
            if partition.role != FOLLOWER or leader_id != partition.leader_id:
                fetcher.remove(key)
        if partition.role == FOLLOWER:
            self._fetcher_for(partition.leader_id).add(partition)
        if changed is not None:
            self.notify_append()  # wake long polls so they re-check leadership
        return partition

    def log_role_summary(self) -> None:
        """One info line for the roles taken since the last call (if any)."""
        if not self._roles_taken:
            return
        log.info(
            "partition roles",
            topics={name: dict(roles) for name, roles in sorted(self._roles_taken.items())[:20]},
            topic_count=len(self._roles_taken),
            replicas=sum(sum(roles.values()) for roles in self._roles_taken.values()),
            first_role_topics=sorted(self._first_roles)[:20],
        )
        self._roles_taken.clear()
        self._first_roles.clear()

    def _fetcher_for(self, leader_id: int) -> ReplicaFetcher:
        fetcher = self.fetchers.get(leader_id)
        if fetcher is None:
            fetcher = ReplicaFetcher(
                self.node_id,
                leader_id,
                self.lookup,
                self.fetch_wait_max_ms,
                self.fetch_max_bytes,
                self.notify_append,
                self.on_pointers,
                self.local_host,
                self.credentials,
            )
            fetcher.start()
            self.fetchers[leader_id] = fetcher
        return fetcher

    def leading(self) -> list[Partition]:
        return [p for p in self.partitions.values() if p.leader_state is not None]

    async def close(self) -> None:
        self._closed = True
        # A snapshot: a metadata change applied while a fetcher stops may add one.
        fetchers, self.fetchers = list(self.fetchers.values()), {}
        for fetcher in fetchers:
            await fetcher.stop()
        with contextlib.suppress(OSError):
            self.checkpoint_high_watermarks()
        for partition in self.partitions.values():
            partition.log.close(clean=True)
        self.partitions.clear()

    def checkpoint_high_watermarks(self) -> None:
        """Write every hosted replica's HW to the log directory's checkpoint file (when changed)."""
        lines = self._checkpoint_lines()
        if lines is not None:
            self._write_checkpoint(*lines)

    async def checkpoint_high_watermarks_async(self) -> None:
        """The periodic checkpoint: the HWs are read on the loop, the file is written and fsynced
        (twice, ~20 ms each here) in a thread, so commits and fetches never wait behind it."""
        lines = self._checkpoint_lines()
        if lines is not None:
            await asyncio.to_thread(self._write_checkpoint, *lines)

    def _checkpoint_lines(self) -> tuple[list[str], int] | None:
        """The checkpoint's lines as of now with their generation, or None when they are what was
        last written."""
        lines = [
            f"{topic} {index} {partition.log.high_watermark} {self.topic_ids[(topic, index)]}\n"
            for (topic, index), partition in self.partitions.items()
        ]
        if lines == self._checkpointed:
            return None
        self._checkpoint_generation += 1
        return lines, self._checkpoint_generation

    def _write_checkpoint(self, lines: list[str], generation: int) -> None:
        # One writer at a time (a thread's periodic write and close()'s share the temporary file),
        # and never an older generation over a newer one (HWs only grow).
        with self._checkpoint_lock:
            if generation < self._written_generation:
                return
            self._written_generation = generation
            path = os.path.join(self.log_dir, HW_CHECKPOINT_FILE)
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                f.write(f"{_HW_CHECKPOINT_VERSION}\n{len(lines)}\n")
                f.writelines(lines)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            fsync_directory(self.log_dir)
            self._checkpointed = lines
            legacy_files, self._legacy_hw_files = self._legacy_hw_files, []
        for legacy in legacy_files:
            with contextlib.suppress(OSError):
                os.unlink(legacy)

    def _read_hw_checkpoint(self) -> dict[tuple[str, int, str], int]:
        """(topic, partition, topic id) -> HW from the checkpoint file; empty if none is usable."""
        try:
            with open(os.path.join(self.log_dir, HW_CHECKPOINT_FILE)) as f:
                lines = f.read().splitlines()
            if int(lines[0]) != _HW_CHECKPOINT_VERSION:
                raise ValueError(f"unknown version {lines[0]}")
            entries = {}
            for line in lines[2 : 2 + int(lines[1])]:
                topic, index, hw, topic_id = line.split()
                entries[(topic, int(index), topic_id)] = int(hw)
            return entries
        except FileNotFoundError:
            return {}
        except (IndexError, ValueError) as exc:
            # Only reachable by outside damage (writes are atomic); HWs are relearned from leaders.
            log.warning("ignoring unreadable high watermark checkpoint", error=str(exc))
            return {}

    # --- long-poll wake-ups -------------------------------------------------------------------

    def notify_append(self) -> None:
        """Wake every parked fetch: readable data may have moved (a high watermark or last stable
        offset), or a role changed."""
        self._append_waiters = _wake(self._append_waiters)
        self._readable_waiters = _wake(self._readable_waiters)

    def notify_log_end(self) -> None:
        """Only a log end moved (a leader appended what its followers have yet to copy): wake the
        parked replica fetches, not the consumers', which would find nothing new to read.

        A sessionless consumer names every partition it reads (librdkafka's do), so each needless
        wake-up is a pass over all of them: at 1,000 partitions, every append did that once before
        the high watermark moved and once after."""
        self._append_waiters = _wake(self._append_waiters)

    def on_leader_append(self, partition: Partition) -> None:
        """A leader appended to ``partition``: wake whoever its append concerns."""
        bounds = partition.log.read_bounds
        partition.on_local_append()  # an ISR of the leader alone commits at once
        # A transaction marker moves the last stable offset without moving the high watermark.
        if partition.log.read_bounds != bounds:
            self.notify_append()
        else:
            self.notify_log_end()

    async def wait_for_append(self, timeout: float, readable_only: bool = False) -> None:
        """Wait until some partition receives data (or changes role), or ``timeout`` seconds pass;
        with ``readable_only`` (a consumer's fetch), until some partition has new readable data.

        Only appends after this call count: the caller checked its partitions in the same loop
        turn, with no await in between, so nothing can slip between its check and this wait."""
        await _park(self._readable_waiters if readable_only else self._append_waiters, timeout)

    def notify_follower_fetch(self) -> None:
        """A follower fetched (and said where its log starts), or metadata changed (a broker left,
        a leader moved): wake parked DeleteRecords to look again."""
        if self._follower_fetch_waiters:
            self._follower_fetch_waiters = _wake(self._follower_fetch_waiters)

    async def wait_for_follower_fetch(self, timeout: float) -> None:
        """Wait until some follower fetches a partition led here, or ``timeout`` seconds pass; only
        fetches after this call count (the caller checked in the same loop turn)."""
        await _park(self._follower_fetch_waiters, timeout)


async def _park(waiters: set[asyncio.Future[None]], timeout: float) -> None:
    """Wait on a future put in ``waiters`` until a wake-up releases it or ``timeout`` seconds pass.
    Discarding it from that set on the way out is enough: a wake-up drops the set whole."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()
    waiters.add(waiter)
    timer = loop.call_later(max(0.0, timeout), _release, waiter)
    try:
        await waiter
    finally:
        timer.cancel()
        waiters.discard(waiter)


def _wake(waiters: set[asyncio.Future[None]]) -> set[asyncio.Future[None]]:
    """Release ``waiters``; returns the empty set that replaces them."""
    for waiter in waiters:
        _release(waiter)
    return set()


def _release(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _delete_directory(path: str) -> None:
    # Rename first so a crash mid-delete never leaves a directory that looks live.
    doomed = f"{path}.{uuid.uuid4().hex}-delete"
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _read_topic_id(path: str) -> str | None:
    try:
        with open(os.path.join(path, PARTITION_METADATA)) as f:
            for line in f:
                if line.startswith("topic_id:"):
                    return line.split(":", 1)[1].strip()
    except FileNotFoundError:
        return None
    return None
