"""The log start and the tier manifest are written durably (file and directory fsynced).

The WAL manager deletes a WAL object once the partition's leader answers that nothing it keeps
references it, judged from the log start and the tier floor in memory. Written without fsync, a
power loss could bring back an older log start or manifest after the object was deleted, and the
restarted broker would serve pointers into a missing object.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from loghelpers import T0
from test_tier_log import pointer_log, segment_of

from diskless import files
from diskless.log.partition_log import LOG_START_FILE, TIER_FILE


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Paths fsynced, recorded by kind: 'dir' or the file's name."""
    seen: list[str] = []
    real = os.fsync

    def recording(fd: int) -> None:
        mode = os.fstat(fd).st_mode
        path = os.readlink(f"/proc/self/fd/{fd}")
        seen.append("dir:" + path if stat.S_ISDIR(mode) else os.path.basename(path))
        real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    return seen


def test_moving_the_log_start_is_durable(tmp_path: Path, synced: list[str]) -> None:
    log, _ = pointer_log(tmp_path)
    synced.clear()
    log.delete_records_before(4)
    assert (tmp_path / LOG_START_FILE).read_text() == "4"
    assert LOG_START_FILE + ".tmp" in synced, "the new log start was not fsynced before the rename"
    assert f"dir:{tmp_path}" in synced, "the rename was not made durable"


def test_a_tier_taking_effect_is_durable(tmp_path: Path, synced: list[str]) -> None:
    log, served = pointer_log(tmp_path)
    log.append_tier_as_leader(segment_of(log, served, 0, 5), 0, T0)
    synced.clear()
    log.high_watermark = log.log_end_offset  # the tier takes effect: floor 6 in the manifest
    assert log.tiered_end == 6
    assert TIER_FILE + ".tmp" in synced and f"dir:{tmp_path}" in synced


def test_replace_durably_leaves_the_new_content_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "checkpoint"
    target.write_bytes(b"old")
    files.replace_durably(str(target), b"new")
    assert target.read_bytes() == b"new"
    assert not (tmp_path / "checkpoint.tmp").exists()
