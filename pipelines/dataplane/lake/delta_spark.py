"""The delta-spark writer, for a cluster with the Delta jars on its classpath (``lake.writer = "delta-spark"``)."""

from __future__ import annotations

import datetime as dt

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines.dataplane.lake.base import LakeBase
from pipelines.dataplane.lake.registry import TableSpec, utc


class DeltaSparkLake(LakeBase):
    """Writes and reads Delta tables with delta-spark (``df.write.format("delta")``). An append is tagged with
    ``txnAppId``/``txnVersion``: Delta itself skips a replayed micro-batch (the protocol's "set transaction" action,
    kept in checkpoints too). :meth:`latest` and :meth:`latest_rows` rank with Spark (:class:`LakeBase`)."""

    writer = "delta-spark"

    def exists(self, table: str) -> bool:
        from delta.tables import DeltaTable

        return DeltaTable.isDeltaTable(self.spark, self.path(table))

    def _append(self, df: DataFrame, spec: TableSpec, *, app_id: str, version: int, rows: int | None = None) -> int:
        # No look-up of our own: Delta skips a write whose (txnAppId, txnVersion) the table already holds.
        df = df.persist()
        rows = df.count()
        if rows:
            (
                df.write.format("delta")
                .mode("append")
                .option("mergeSchema", "true")
                .option("txnAppId", app_id)
                .option("txnVersion", version)
                .save(self.path(spec.name))
            )
        df.unpersist()
        return rows

    def _read(self, spec: TableSpec, since: dt.datetime | None, before: dt.datetime | None) -> DataFrame:
        df = self.spark.read.format("delta").load(self.path(spec.name))
        if spec.time_column and since:
            df = df.where(F.col(spec.time_column) >= F.lit(utc(since)))
        if spec.time_column and before:
            df = df.where(F.col(spec.time_column) < F.lit(utc(before)))
        return df
