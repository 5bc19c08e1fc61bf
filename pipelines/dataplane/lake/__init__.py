"""The lake: Delta tables of rate-governor behind one interface, :class:`Lake`, with two writers that produce
identical tables.

* :mod:`pipelines.dataplane.lake.registry`: every table of the lake (:data:`TABLES`: name from :mod:`pipelines.tables`,
  schema, time column).
* :mod:`pipelines.dataplane.lake.delta_rs`: :class:`DeltaRsLake`, delta-rs (the ``deltalake`` package) through Arrow, no
  Delta jars: the writer on every Spark line.
* :mod:`pipelines.dataplane.lake.delta_spark`: :class:`DeltaSparkLake`, delta-spark (``df.write.format("delta")``) where
  the Delta jars are on the classpath, as on a cluster.
* :mod:`pipelines.dataplane.lake.base` (what both writers share) and :mod:`pipelines.dataplane.lake.retry` (retried
  appends).

Both append one micro-batch per commit, tagged with a Delta transaction ``(app_id, version=batch_id)``
(``txnAppId``/``txnVersion`` in delta-spark, ``CommitProperties(app_transactions=...)`` in delta-rs). A batch whose
version is already committed for that app id is skipped, so a replayed micro-batch never duplicates rows.

Example:
    >>> lake = open_lake(spark, "/data/lake", writer="auto")
    >>> lake.append(df, "gold/topic_tps", app_id="governor-gold", version=batch_id)  # rows written
    42
    >>> lake.read("gold/topic_tps").count()
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pyspark.sql import DataFrame, SparkSession

from pipelines.dataplane.lake.delta_rs import DeltaRsLake
from pipelines.dataplane.lake.delta_spark import DeltaSparkLake
from pipelines.dataplane.lake.registry import TABLES, TableSpec, UnknownTableError, table_spec

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["Lake", "Writer", "open_lake", "DeltaRsLake", "DeltaSparkLake", "TABLES", "TableSpec",
           "UnknownTableError", "table_spec"]


class Lake(Protocol):
    """The lake as the flows, the quality gate, the publisher and the sinks use it. Table names are the constants
    of :mod:`pipelines.tables`; an unknown one raises :class:`UnknownTableError` everywhere. Timestamps are UTC
    (naive = UTC)."""

    #: ``"delta-rs"`` or ``"delta-spark"``.
    writer: str
    #: The lake directory (local path or URI), without a trailing ``/``.
    root: str
    spark: SparkSession
    #: Called before every write (each append attempt, each publish): raises
    #: :class:`pipelines.job.lease.LakeHeldError` once this governor may no longer write (set by
    #: :func:`pipelines.governor.run`); None = no fence.
    fence: Callable[[], None] | None

    def check_fence(self) -> None:
        """Raise (``LakeHeldError``) when the fence says this governor lost the lake; nothing without a fence."""
        ...

    def path(self, table: str) -> str:
        """``<root>/<table>``, the table's directory."""
        ...

    def exists(self, table: str) -> bool:
        """Whether ``table`` has been written (is a Delta table)."""
        ...

    def empty(self, table: str) -> DataFrame:
        """An empty DataFrame of ``table``'s schema that runs no task."""
        ...

    def version(self, table: str) -> int | None:
        """The table's current Delta version, None when it does not exist (no Spark job)."""
        ...

    def append(self, df: DataFrame, table: str, *, app_id: str, version: int, rows: int | None = None) -> int:
        """Append ``df`` (conformed to the table's schema) as one commit tagged ``(app_id, version)``.

        Nothing is written when the table already holds a commit of ``app_id`` at ``version`` or later (a
        replayed micro-batch) or when ``df`` is empty. ``rows`` is ``df``'s row count when the caller knows it: 0
        skips the append without a Spark job; the delta-rs writer writes a large append from the executors. Storage
        errors are retried (:func:`pipelines.dataplane.lake.retry.retried`). Returns the number of rows written
        (delta-rs: 0 for a skipped replay; delta-spark: the rows handed to Delta, which skips a replay itself without
        telling).

        Raises:
            OSError: the write failed (e.g. ENOSPC, the disk of the lake full) on every attempt; nothing was
                committed.
            pipelines.job.lease.LakeHeldError: the fence refused the write.
        """
        ...

    def collect(self, outputs: dict[str, DataFrame], rows: dict[str, int] | None = None) -> dict[str, "pa.Table"]:
        """The tables of ``outputs`` (name → DataFrame) this writer would append from the driver, collected as Arrow
        (name → rows in the table's schema) by one Spark job, for :meth:`append_arrow`; tables left out (known
        empty or large by ``rows``, or every table of the delta-spark writer) go through :meth:`append`."""
        ...

    def append_arrow(self, data: "pa.Table", table: str, *, app_id: str, version: int) -> int:
        """Append Arrow rows of ``table``'s schema (from :meth:`collect`) as one commit tagged ``(app_id,
        version)``, skipped like :meth:`append`. Returns the number of rows written.

        Raises:
            OSError: the write failed on every attempt; nothing was committed.
        """
        ...

    def append_rows(self, rows: list[tuple], table: str, *, app_id: str, version: int) -> int:
        """Append driver-side records (tuples in the order of the table's schema, timestamps naive UTC or aware),
        such as the quality gate's reconciliation rows, as one commit tagged ``(app_id, version)``: as
        :meth:`append`, without a Spark job on the delta-rs path. Returns the number of rows written.

        Raises:
            OSError: the write failed; nothing was committed.
        """
        ...

    def read(self, table: str, *, since: dt.datetime | None = None, before: dt.datetime | None = None) -> DataFrame:
        """The table (an empty DataFrame of its schema if it does not exist yet), conformed to its current schema
        (columns added later read as null), optionally only the rows whose time column is in ``[since, before)``."""
        ...

    def read_arrow(self, table: str, *, since: dt.datetime | None = None, before: dt.datetime | None = None,
                   columns: list[str] | None = None) -> "pa.Table":
        """:meth:`read` as Arrow on the driver (``columns``: only those), conformed to the table's current schema
        (or the chosen columns). delta-rs reads it without a Spark job (the decisions' history and the limiters'
        rejections); delta-spark reads with Spark and collects."""
        ...

    def latest(self, table: str, keys: list[str], order: str, rank: Callable[[DataFrame], DataFrame],
               below: int | None = None) -> DataFrame:
        """The latest row per ``keys`` of ``table`` by ``order`` (among rows whose ``order`` is below ``below`` when
        given), as ``rank`` shapes it: ``rank`` is the Spark definition (e.g.
        :func:`pipelines.writeback.publish.latest_per_resource`). The delta-rs writer picks the rows on the driver
        first, so only they cross to Spark."""
        ...

    def latest_rows(self, table: str, keys: list[str], order: str, below: int | None = None) -> list[dict[str, Any]]:
        """The row with the highest ``order`` per ``keys`` of ``table`` (among rows whose ``order`` is below
        ``below`` when given) as dicts by column name: nulls None, timestamps UTC-aware ``datetime``, maps as
        lists of (key, value) pairs; [] when the table does not exist yet. delta-rs reads them on the driver without
        a Spark job, delta-spark ranks with Spark."""
        ...


Writer = Literal["auto", "delta-rs", "delta-spark"]


def open_lake(spark: SparkSession, root: str | Path, writer: Writer = "auto",
              executor_write_rows: int = 200_000) -> Lake:
    """The lake at ``root`` with the configured writer; ``auto`` picks delta-spark when its classes load.
    ``executor_write_rows``: see :class:`DeltaRsLake`.

    Raises:
        RuntimeError: ``writer="delta-spark"`` was asked for but the Delta jars are not on the classpath.
    """
    from pipelines.dataplane.session import delta_spark_available

    root = str(root)
    if writer == "delta-rs":
        return DeltaRsLake(spark, root, executor_write_rows)
    available = delta_spark_available(spark)
    if writer == "delta-spark" and not available:
        raise RuntimeError(
            "lake.writer = 'delta-spark' but the Delta jars are not on the Spark classpath; "
            "add them (spark-submit.sh --packages) or set lake.writer = 'auto'"
        )
    return DeltaSparkLake(spark, root) if available else DeltaRsLake(spark, root, executor_write_rows)
