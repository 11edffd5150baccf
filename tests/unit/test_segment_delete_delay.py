"""``file.delete.delay.ms``: a segment the log drops is renamed ``.deleted`` and its files removed
after the delay (Kafka's deleteSegmentFiles), so readers still holding it keep working; a restart
removes what is left."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from loghelpers import T0, open_log, produce, read_records

from diskless.log.partition_log import PartitionLog


def _names(directory: Path, base_offset: int) -> list[str]:
    """The files of the segment at ``base_offset`` (producer snapshots are not the segment's)."""
    return sorted(
        name
        for name in os.listdir(directory)
        if name.startswith(f"{base_offset:020d}") and not name.endswith(".snapshot")
    )


def _three_segments(directory: Path, **config: object) -> PartitionLog:
    log = open_log(directory, **config)  # type: ignore[arg-type]
    for i in range(3):
        produce(log, 2, tag=f"b{i}", roll=True)
    return log


def test_a_dropped_segment_is_renamed_then_removed_after_the_delay(tmp_path: Path) -> None:
    log = open_log(tmp_path, retention_ms=10_000)
    for i, stamped in enumerate((T0 - 20_000, T0 - 20_000, T0)):  # the first two expired
        produce(log, 2, tag=f"b{i}", now_ms=stamped, roll=True)
    assert log.apply_retention(T0) == 2
    assert [s.base_offset for s in log.segments] == [4]
    deleted = ["00000000000000000000.index.deleted", "00000000000000000000.log.deleted"]
    assert _names(tmp_path, 0) == [*deleted, "00000000000000000000.timeindex.deleted"]
    assert log.remove_retired_segments(T0) == 0  # the delay starts at this pass
    assert log.remove_retired_segments(T0 + 59_999) == 0
    assert log.remove_retired_segments(T0 + 60_000) == 2
    assert _names(tmp_path, 0) == _names(tmp_path, 2) == [] and log.retired == []
    assert [r.value for r in read_records(log)] == [b"b2-0", b"b2-1"]


def test_the_topic_delay_is_read(tmp_path: Path) -> None:
    log = _three_segments(tmp_path, file_delete_delay_ms=5)
    log.delete_records_before(4)
    log.remove_retired_segments(T0)
    assert log.remove_retired_segments(T0 + 5) == 2


def test_a_delay_of_zero_removes_at_once(tmp_path: Path) -> None:
    log = _three_segments(tmp_path, file_delete_delay_ms=0)
    log.delete_records_before(4)
    assert _names(tmp_path, 0) == _names(tmp_path, 2) == [] and log.retired == []


def test_a_reader_holding_a_dropped_segment_keeps_reading(tmp_path: Path) -> None:
    """ListOffsets by timestamp walks ``batches_reaching`` across an await (a batch load): a
    DeleteRecords or retention in between used to close the descriptor under it."""
    log = _three_segments(tmp_path)
    walk = log.batches_reaching(0)
    segment, location = next(walk)
    assert segment.base_offset == 0
    log.delete_records_before(4)  # drops the segments of offsets 0-3
    assert segment.read_batch(location)[:8] == (0).to_bytes(8, "big")
    assert [loc.base_offset for _, loc in walk] == [4]  # the walk goes on, from the new log start


def test_truncating_twice_to_one_offset_leaves_the_live_segment_alone(tmp_path: Path) -> None:
    """Each truncation retires a segment with the same base offset: the second rename replaces the
    first one's ``.deleted`` files, and removing either must not touch the live segment."""
    log = _three_segments(tmp_path)
    for round_ in range(2):
        log.truncate_to(2, T0)
        produce(log, 3, tag=f"again{round_}", roll=True)
    assert len(log.retired) == 3  # offsets 4 and 2, then the first "again" segment at 2
    log.remove_retired_segments(T0)
    assert log.remove_retired_segments(T0 + 60_000) == 3
    assert [s.base_offset for s in log.segments] == [0, 2]
    assert [r.value for r in read_records(log)] == [b"b0-0", b"b0-1", b"again1-0", b"again1-1", b"again1-2"]
    log.close()
    assert [r.value for r in read_records(open_log(tmp_path))][-1] == b"again1-2"


@pytest.mark.parametrize("clean", [True, False])
def test_loading_removes_leftover_deleted_files(tmp_path: Path, clean: bool) -> None:
    log = _three_segments(tmp_path)
    log.delete_records_before(4)
    log.close(clean=clean)  # before the delay passed: the renamed files stay, as in Kafka
    assert _names(tmp_path, 0) != []
    (tmp_path / "00000000000000000009.log.deleted").write_bytes(b"junk")
    reopened = open_log(tmp_path)
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".deleted")]
    assert [s.base_offset for s in reopened.segments] == [4] and reopened.log_start_offset == 4


def test_deleting_the_log_removes_retired_segments_too(tmp_path: Path) -> None:
    log = _three_segments(tmp_path / "t-0")
    log.delete_records_before(4)
    log.delete()
    assert not (tmp_path / "t-0").exists()


def test_the_broker_pass_removes_due_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from diskless.broker.broker import Broker
    from diskless.config import load_config

    broker = Broker(load_config(environ={}, overrides={"log.dirs": str(tmp_path / "data")}))
    log = _three_segments(tmp_path / "t-0")
    log.delete_records_before(4)
    broker.replicas.partitions = {("t", 0): SimpleNamespace(log=log)}
    monkeypatch.setattr(broker, "now_ms", lambda: T0)
    assert broker.remove_retired_segments() == 0
    monkeypatch.setattr(broker, "now_ms", lambda: T0 + 60_000)
    assert broker.remove_retired_segments() == 2
    assert _names(tmp_path / "t-0", 0) == []
