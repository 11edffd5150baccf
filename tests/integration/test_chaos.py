"""``diskless chaos --quick``: every kind of fault once under idempotent producers and
read_committed consumers on a classic and a diskless topic; nothing acknowledged is lost,
nothing is duplicated, no offset is skipped, no referenced WAL object is deleted, and every
partition gets its full ISR back.

The command runs as a user runs it; its JSON result is checked along with its printed summary.
The schedule itself is checked to be seeded: the same seed gives the same faults.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diskless.chaos.run import FAULT_KINDS, schedule

pytestmark = pytest.mark.integration


def test_schedule_is_seeded_and_covers_every_fault() -> None:
    assert schedule(5, 120) == schedule(5, 120)
    assert schedule(5, 120) != schedule(6, 120)
    long_run = schedule(7, 200)
    assert {kind for kind, _ in long_run} == set(FAULT_KINDS)
    assert sum(kind == "broker_kill" for kind, _ in long_run) >= 10
    assert sorted(kind for kind, _ in schedule(1, 0, quick=True)) == sorted(FAULT_KINDS)


def test_quick_chaos_run_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    result_path = tmp_path / "chaos.json"
    cmd = [sys.executable, "-m", "diskless", "chaos", "--quick", "--seed", "3", "--rate", "80"]
    cmd += ["--data-dir", str(tmp_path / "cluster"), "--json", str(result_path)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    print(run.stdout[-3000:])
    assert result_path.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(result_path.read_text())
    assert result["faults"] == dict.fromkeys(FAULT_KINDS, 1), result
    assert result["acknowledged"] > 500, result
    assert result["read"] >= result["acknowledged"], result
    assert result["lost"] == 0 and result["duplicated"] == 0 and result["offset_gaps"] == 0, result
    assert result["offset_mismatches"] == 0, result
    assert result["deleted_while_referenced"] == 0 and result["referenced_wal_objects"] > 0, result
    assert 0 <= result["seconds_to_full_isr"] < 60, result
    assert result["unwatched_changes"] == 0, result  # every partition change fired its watches
    assert result["ok"] and run.returncode == 0, run.stdout[-3000:]
    for line in (
        "lost = 0",
        "duplicated = 0",
        "offset gaps = 0",
        "WAL objects deleted while referenced = 0",
        "partition changes found without their watch = 0",
    ):
        assert line in run.stdout
