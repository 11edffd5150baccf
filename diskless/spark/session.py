"""A ready local SparkSession for diskless's data pipeline (tiering job, data source, tests).

PySpark starts Python workers with ``python3`` from PATH unless told otherwise; they must be this
interpreter, which has diskless, pyarrow and the object-store client installed. The session is
kept quiet (no UI, few shuffle partitions) because the jobs are small and run beside brokers.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def build_session(
    master: str = "local[2]", app_name: str = "diskless", conf: dict[str, str] | None = None
) -> SparkSession:
    """Get or create a SparkSession whose Python workers run this interpreter."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
