"""Broker memory (issue 10: peak RSS <= 300 MB at 1,000 partitions): what a broker process loads
and holds that it does not need."""

from __future__ import annotations

import subprocess
import sys

# Analytics libraries only the Spark tiering job and the benchmark use. pyarrow alone maps about
# 50 MB of shared libraries (libarrow, libparquet, numpy) plus a jemalloc thread into every broker.
HEAVY = ("pyarrow", "numpy", "pyspark", "pandas")


def test_broker_command_does_not_import_analytics_libraries() -> None:
    # `diskless broker` builds the whole command line (every subcommand's arguments) before it runs.
    code = (
        "import sys\n"
        "from diskless import cli\n"
        "try:\n"
        "    cli.main(['broker', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout[-2000:]
