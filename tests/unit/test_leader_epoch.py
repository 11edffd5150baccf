"""Leader epoch cache: Kafka's LeaderEpochFileCache semantics and its checkpoint file."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diskless.log.leader_epoch import UNDEFINED_EPOCH, UNDEFINED_OFFSET, LeaderEpochCache

UNDEFINED = (UNDEFINED_EPOCH, UNDEFINED_OFFSET)


def reference_end_offset_for(entries: list[tuple[int, int]], epoch: int, leo: int) -> tuple[int, int]:
    """LeaderEpochFileCache.endOffsetFor, written with TreeMap floor/higher lookups."""
    if epoch == UNDEFINED_EPOCH:
        return UNDEFINED
    if entries and entries[-1][0] == epoch:
        return epoch, leo
    higher = next(((e, s) for e, s in entries if e > epoch), None)
    if higher is None:
        return UNDEFINED
    floor = [(e, s) for e, s in entries if e <= epoch]
    if not floor:
        return epoch, higher[1]
    return floor[-1][0], higher[1]


@pytest.fixture
def cache(tmp_path: Path) -> LeaderEpochCache:
    c = LeaderEpochCache(str(tmp_path / "leader-epoch-checkpoint"))
    for epoch, start in [(1, 0), (3, 10), (5, 20)]:
        c.assign(epoch, start)
    return c


@pytest.mark.parametrize(
    ("epoch", "expected"),
    [
        (-1, UNDEFINED),
        (0, (0, 0)),  # below the first epoch: the requested epoch ends where the first one starts
        (1, (1, 10)),
        (2, (1, 10)),  # unknown epoch between known ones: the floor epoch, ending at the next start
        (3, (3, 20)),
        (4, (3, 20)),
        (5, (5, 30)),  # the latest epoch ends at the log end
        (6, UNDEFINED),  # above the latest
    ],
)
def test_end_offset_for(cache: LeaderEpochCache, epoch: int, expected: tuple[int, int]) -> None:
    assert cache.end_offset_for(epoch, 30) == expected


def test_empty_cache(tmp_path: Path) -> None:
    c = LeaderEpochCache(str(tmp_path / "ck"))
    assert c.latest_epoch == UNDEFINED_EPOCH
    assert c.end_offset_for(0, 10) == UNDEFINED
    assert c.end_offset_for(-1, 10) == UNDEFINED
    assert c.epoch_for_offset(5) == UNDEFINED_EPOCH


@given(
    steps=st.lists(st.tuples(st.integers(0, 20), st.integers(0, 50)), max_size=15),
    epoch=st.integers(-1, 25),
    extra=st.integers(0, 50),
)
def test_end_offset_for_matches_reference(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[int, int]], epoch: int, extra: int
) -> None:
    c = LeaderEpochCache(str(tmp_path_factory.mktemp("e") / "ck"))
    offset = 0
    for e, delta in sorted(steps):
        offset += delta
        c.assign(e, offset)
    entries = c._entries
    assert [e for e, _ in entries] == sorted({e for e, _ in entries})
    assert [s for _, s in entries] == sorted(s for _, s in entries)
    assert c.end_offset_for(epoch, offset + extra) == reference_end_offset_for(entries, epoch, offset + extra)


def test_assign_keeps_epochs_and_offsets_increasing(tmp_path: Path) -> None:
    c = LeaderEpochCache(str(tmp_path / "ck"))
    c.assign(2, 0)
    c.assign(2, 5)  # same epoch again at a later offset: the existing start stays (as in Kafka)
    assert c._entries == [(2, 0)]
    c.assign(4, 10)
    c.assign(6, 15)
    c.assign(7, 12)  # starts below epoch 6: epoch 6 was truncated away
    assert c._entries == [(2, 0), (4, 10), (7, 12)]
    assert c.latest_epoch == 7


def test_epoch_for_offset(cache: LeaderEpochCache) -> None:
    assert [cache.epoch_for_offset(o) for o in (0, 9, 10, 19, 20, 1000)] == [1, 1, 3, 3, 5, 5]


def test_truncate_from_end(cache: LeaderEpochCache, tmp_path: Path) -> None:
    cache.truncate_from_end(21)
    assert cache._entries == [(1, 0), (3, 10), (5, 20)]
    cache.truncate_from_end(20)  # epoch 5 started at 20: nothing of it is left
    assert cache._entries == [(1, 0), (3, 10)]
    assert cache.end_offset_for(3, 20) == (3, 20)
    assert LeaderEpochCache(str(tmp_path / "leader-epoch-checkpoint"))._entries == [(1, 0), (3, 10)]


def test_truncate_from_start(cache: LeaderEpochCache, tmp_path: Path) -> None:
    cache.truncate_from_start(5)
    assert cache._entries == [(1, 5), (3, 10), (5, 20)]
    cache.truncate_from_start(15)
    assert cache._entries == [(3, 15), (5, 20)]
    cache.truncate_from_start(20)
    assert cache._entries == [(5, 20)]
    cache.truncate_from_start(25)
    assert cache._entries == [(5, 25)]
    assert LeaderEpochCache(str(tmp_path / "leader-epoch-checkpoint"))._entries == [(5, 25)]


def test_persistence_format(cache: LeaderEpochCache, tmp_path: Path) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    assert path.read_text() == "0\n3\n1 0\n3 10\n5 20\n"  # Kafka's checkpoint: version, count, entries
    reloaded = LeaderEpochCache(str(path))
    assert reloaded._entries == [(1, 0), (3, 10), (5, 20)]
    assert reloaded.end_offset_for(3, 30) == (3, 20)
    assert not (tmp_path / "leader-epoch-checkpoint.tmp").exists()


@pytest.mark.parametrize("content", ["", "0\n", "0\n2\n1 0\n", "garbage"])
def test_unreadable_checkpoint_starts_empty(tmp_path: Path, content: str) -> None:
    path = tmp_path / "ck"
    path.write_text(content)
    assert LeaderEpochCache(str(path))._entries == []
