"""The atheris (libFuzzer) harness of the request path runs for a bounded time and finds nothing.

Without the length guard it found the kio allocation abort (a Metadata body declaring billions
of topics) within seconds; see ``atheris_requests.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris")

FUZZ_SECONDS = 15


def test_atheris_finds_no_crash_in_request_decoding(tmp_path: Path) -> None:
    harness = Path(__file__).with_name("atheris_requests.py")
    cmd = [sys.executable, str(harness), f"-max_total_time={FUZZ_SECONDS}", "-timeout=10"]
    cmd += [f"-artifact_prefix={tmp_path}/", "-print_final_stats=1"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=FUZZ_SECONDS + 120, cwd=tmp_path)
    report = run.stderr[-4000:]
    assert run.returncode == 0, report
    assert not list(tmp_path.glob("crash-*")) and not list(tmp_path.glob("oom-*")), report
    runs = [line for line in run.stderr.splitlines() if line.startswith("Done ")]
    assert runs and int(runs[0].split()[1]) > 1000, report
