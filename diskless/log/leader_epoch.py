"""Leader epoch cache: which epoch started at which offset (Kafka's leader-epoch-checkpoint).

Answers OffsetForLeaderEpoch and lets a follower find where its log diverges from a new leader.

Durability, as Kafka since KAFKA-15046: a new epoch (``assign``) rewrites the file atomically
(temporary file, rename) but does not fsync it; a broker becoming leader of thousands of
partitions at once must not wait for a disk flush each. ``flush`` forces it to disk; the log
calls it when it rolls or flushes a segment and at a clean close. A process crash loses nothing
(the page cache survives). A machine crash can lose unsynced versions, like the unsynced log tail
itself: the log rebuilds the entries of its active segment from the batch headers on an unclean
start, and older segments' entries were synced when those segments rolled. An entry lost with no
batch of its epoch in the log (a leadership that appended nothing) is harmless: that broker's
leadership was fenced by a higher epoch before it serves again, and nothing diverges at an epoch
that wrote nothing. Truncations stay synced at once: they are rare (a diverged follower,
retention), and a truncation undone by a crash would resurrect entries for removed offsets.
"""

from __future__ import annotations

import bisect
import os

UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


class LeaderEpochCache:
    def __init__(self, path: str) -> None:
        self._path = path
        self._entries: list[tuple[int, int]] = []  # (epoch, start offset), both increasing
        self.dirty = False  # the file holds the entries, possibly not yet on disk (see flush)
        try:
            with open(path) as f:
                lines = f.read().split()
            count = int(lines[1])
            for i in range(count):
                self._entries.append((int(lines[2 + 2 * i]), int(lines[3 + 2 * i])))
        except (FileNotFoundError, IndexError, ValueError):
            self._entries = []

    @property
    def latest_epoch(self) -> int:
        return self._entries[-1][0] if self._entries else UNDEFINED_EPOCH

    def assign(self, epoch: int, start_offset: int) -> None:
        if self._entries and epoch <= self._entries[-1][0]:
            return
        # A new epoch starting below older entries means those were truncated away.
        while self._entries and self._entries[-1][1] >= start_offset:
            self._entries.pop()
        self._entries.append((epoch, start_offset))
        self._save(durable=False)

    def epoch_for_offset(self, offset: int) -> int:
        """The epoch in which ``offset`` was written (-1 if unknown)."""
        epoch = UNDEFINED_EPOCH
        for e, start in self._entries:
            if start > offset:
                break
            epoch = e
        return epoch

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(epoch, end offset) as Kafka's LeaderEpochFileCache.endOffsetFor answers it."""
        if epoch == UNDEFINED_EPOCH or not self._entries:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if epoch == self.latest_epoch:
            return epoch, log_end_offset
        epochs = [e for e, _ in self._entries]
        higher = bisect.bisect_right(epochs, epoch)
        if higher == len(epochs):
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if higher == 0:
            return epoch, self._entries[0][1]
        return self._entries[higher - 1][0], self._entries[higher][1]

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget epochs that start at or after ``end_offset`` (log truncated there)."""
        before = len(self._entries)
        self._entries = [(e, s) for e, s in self._entries if s < end_offset]
        if len(self._entries) != before:
            self._save()

    def truncate_from_start(self, start_offset: int) -> None:
        """The log start moved: the epoch covering it now starts there."""
        kept = [(e, s) for e, s in self._entries if s > start_offset]
        covering = [(e, s) for e, s in self._entries if s <= start_offset]
        if covering:
            kept.insert(0, (covering[-1][0], start_offset))
        if kept != self._entries:
            self._entries = kept
            self._save()

    def flush(self) -> None:
        """Force the last written version to disk (a no-op when it already is)."""
        if not self.dirty:
            return
        with open(self._path, "rb") as f:
            os.fsync(f.fileno())
        self.dirty = False

    def _save(self, durable: bool = True) -> None:
        tmp = self._path + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"0\n{len(self._entries)}\n")
            for epoch, offset in self._entries:
                f.write(f"{epoch} {offset}\n")
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, self._path)
        self.dirty = not durable
