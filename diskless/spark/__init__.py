"""diskless's data pipeline on Spark: the tiering job and the ``diskless`` data source.

``from diskless.spark import DisklessDataSource; spark.dataSource.register(DisklessDataSource)``
(or ``diskless_session()``: a local session with the source registered). Imported lazily, so
that code needing only the tiering job does not load PySpark's data source machinery.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from .source import DisklessDataSource, DisklessSourceError

__all__ = ["DisklessDataSource", "DisklessSourceError", "diskless_session", "register"]


def __getattr__(name: str) -> Any:
    if name in ("DisklessDataSource", "DisklessSourceError"):
        from . import source

        return getattr(source, name)
    raise AttributeError(name)


def register(spark: SparkSession) -> SparkSession:
    """Register ``format("diskless")`` on ``spark``."""
    from .source import DisklessDataSource

    spark.dataSource.register(DisklessDataSource)
    return spark


def diskless_session(master: str = "local[2]", conf: dict[str, str] | None = None) -> SparkSession:
    """A ready local SparkSession (``session.build_session``) with the ``diskless`` source registered."""
    from .session import build_session

    return register(build_session(master, conf=conf))
