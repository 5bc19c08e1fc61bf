"""What both writers share (:class:`LakeBase`): the lake root and its fence, table paths, conforming rows to a
table's schema, retried appends, range reads and the Spark definition of "the latest row per key"."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from pipelines.dataplane.lake.registry import TableSpec, arrow_rows, conform, table_spec
from pipelines.dataplane.lake.retry import retried

if TYPE_CHECKING:
    import pyarrow as pa


class LakeBase:
    """The common part of :class:`~pipelines.dataplane.lake.delta_rs.DeltaRsLake` and
    :class:`~pipelines.dataplane.lake.delta_spark.DeltaSparkLake`; the interface is
    :class:`pipelines.dataplane.lake.Lake`.

    ``root`` is the lake directory (local path or URI). A writer implements :meth:`exists`, :meth:`_append` and
    :meth:`_read`, and may replace :meth:`_append_rows`, :meth:`latest` and :meth:`latest_rows` with cheaper paths.
    """

    writer: str = "abstract"

    def __init__(self, spark: SparkSession, root: str) -> None:
        self.spark = spark
        self.root = root.rstrip("/")
        #: Called before every write (each append attempt, each publish): raises when this governor may no longer
        #: write to the lake (:meth:`pipelines.job.lease.GovernorLease.check`, set by :func:`pipelines.governor.run`).
        self.fence: Callable[[], None] | None = None

    def check_fence(self) -> None:
        """Raise (``LakeHeldError``) when the fence says this governor lost the lake; nothing without a fence."""
        if self.fence is not None:
            self.fence()

    def path(self, table: str) -> str:
        table_spec(table)
        return f"{self.root}/{table}"

    def empty(self, table: str) -> DataFrame:
        """An empty DataFrame of ``table``'s schema. Built on an RDD without partitions: it runs no task, where one
        made from a Python list (``createDataFrame([], schema)``) runs a task per core through a Python worker each
        time a job reads it (about 0.2 s per job here)."""
        return self.spark.createDataFrame(self.spark.sparkContext.emptyRDD(), table_spec(table).schema)

    def append(self, df: DataFrame, table: str, *, app_id: str, version: int, rows: int | None = None) -> int:
        spec = table_spec(table)
        if rows == 0:  # known to be empty: no Spark job, no commit
            return 0
        conformed = conform(df, spec.schema)
        return retried(lambda: self._append(conformed, spec, app_id=app_id, version=version, rows=rows),
                       self.check_fence, self.path(table))

    def append_rows(self, rows: list[tuple], table: str, *, app_id: str, version: int) -> int:
        spec = table_spec(table)
        if not rows:
            return 0
        return retried(lambda: self._append_rows(rows, spec, app_id=app_id, version=version), self.check_fence,
                       self.path(table))

    def collect(self, outputs: dict[str, DataFrame], rows: dict[str, int] | None = None) -> dict[str, "pa.Table"]:
        """The outputs this writer appends from the driver, collected together; {} here (each append writes its
        own DataFrame). :class:`~pipelines.dataplane.lake.delta_rs.DeltaRsLake` collects them with one Spark job."""
        return {}

    def append_arrow(self, data: "pa.Table", table: str, *, app_id: str, version: int) -> int:
        """Append rows already collected (:meth:`collect`) as one commit tagged ``(app_id, version)``, as
        :meth:`append`."""
        spec = table_spec(table)
        if data.num_rows == 0:
            return 0
        return retried(lambda: self._append_arrow(data, spec, app_id=app_id, version=version), self.check_fence,
                       self.path(table))

    def read(self, table: str, *, since: dt.datetime | None = None, before: dt.datetime | None = None) -> DataFrame:
        spec = table_spec(table)
        if not self.exists(table):
            return self.empty(table)
        return conform(self._read(spec, since, before), spec.schema)

    def read_arrow(self, table: str, *, since: dt.datetime | None = None, before: dt.datetime | None = None,
                   columns: list[str] | None = None) -> "pa.Table":
        """:meth:`read` collected as Arrow (one Spark job); ``columns``: only those."""
        df = self.read(table, since=since, before=before)
        return (df.select(*columns) if columns is not None else df).toArrow()

    def latest(self, table: str, keys: list[str], order: str, rank: Callable[[DataFrame], DataFrame],
               below: int | None = None) -> DataFrame:
        """Ranks the whole table (rows with ``order`` < ``below`` when given) with ``rank``, in Spark."""
        df = self.read(table)
        if below is not None:
            df = df.where(F.col(order) < F.lit(below))
        return rank(df)

    def latest_rows(self, table: str, keys: list[str], order: str, below: int | None = None) -> list[dict[str, Any]]:
        """:meth:`latest` ranked by ``order`` per ``keys`` (:func:`newest_per_key`), collected as Arrow."""
        spec = table_spec(table)
        latest = self.latest(table, keys, order, lambda df: newest_per_key(df, keys, order), below)
        return arrow_rows(latest.toArrow(), spec)

    def version(self, table: str) -> int | None:
        """The table's current Delta version (its newest commit), None when it does not exist: a cheap test of
        whether anything was written since a read (delta-rs lists the log; no Spark job, whichever writer wrote it)."""
        from deltalake import DeltaTable

        path = self.path(table)
        if not DeltaTable.is_deltatable(path):
            return None
        return DeltaTable(path).version()

    # implemented by the writers
    def exists(self, table: str) -> bool:
        raise NotImplementedError

    def _append(self, df: DataFrame, spec: TableSpec, *, app_id: str, version: int, rows: int | None = None) -> int:
        raise NotImplementedError

    def _append_rows(self, rows: list[tuple], spec: TableSpec, *, app_id: str, version: int) -> int:
        return self._append(self.spark.createDataFrame(rows, spec.schema), spec, app_id=app_id, version=version)

    def _append_arrow(self, data: "pa.Table", spec: TableSpec, *, app_id: str, version: int) -> int:
        return self._append(self.spark.createDataFrame(data, spec.schema), spec, app_id=app_id, version=version)

    def _read(self, spec: TableSpec, since: dt.datetime | None, before: dt.datetime | None) -> DataFrame:
        raise NotImplementedError


def newest_per_key(df: DataFrame, keys: list[str], order: str) -> DataFrame:
    """The row with the highest ``order`` per ``keys`` of ``df`` (same columns)."""
    newest_first = Window.partitionBy(*keys).orderBy(F.col(order).desc())
    ranked = df.select("*", F.row_number().over(newest_first).alias("_rank"))
    return ranked.where(F.col("_rank") == 1).drop("_rank")
