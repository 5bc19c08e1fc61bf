"""Delta tables of rate-governor: one registry of tables and two writers that produce identical tables.

:data:`TABLES` declares every table of the lake (its name, from :mod:`pipelines.io.tables`, schema and time column).

* :class:`DeltaSparkLake` writes with delta-spark (``df.write.format("delta")``) where the Delta jars are on the
  classpath, as on a cluster.
* :class:`DeltaRsLake` writes with delta-rs (the ``deltalake`` package) through Arrow, as on machines without a
  reachable Maven repository.

Both append one micro-batch per commit, tagged with a Delta transaction ``(app_id, version=batch_id)``
(``txnAppId``/``txnVersion`` in delta-spark, ``CommitProperties(app_transactions=...)`` in delta-rs). A batch whose
version is already committed for that app id is skipped, so a replayed micro-batch never duplicates rows: Delta
itself skips it on the delta-spark path (the protocol's "set transaction" action, which Delta keeps in checkpoints
too); on the delta-rs path :meth:`DeltaRsLake.committed_version` reads the same action from the table's snapshot
(``DeltaTable.transaction_version``) before writing.

Example:
    >>> lake = open_lake(spark, "/data/lake", writer="auto")
    >>> lake.append(df, "gold/topic_tps", app_id="governor-gold", version=batch_id)  # rows written
    42
    >>> lake.read("gold/topic_tps").count()
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines import schemas
from pipelines.io import tables
from pipelines.faults import APPEND_FAULT, fault_point

log = logging.getLogger("rate_governor")


@dataclass(frozen=True)
class TableSpec:
    """A Delta table of the lake: its path under the lake root, schema and time column (for range reads)."""

    name: str
    schema: T.StructType
    time_column: str | None = None


TABLES: dict[str, TableSpec] = {
    spec.name: spec
    for spec in (
        TableSpec(tables.BRONZE_BROKER_STATS, schemas.BRONZE, "ingested_at"),
        TableSpec(tables.BRONZE_SEND_FAILURES, schemas.BRONZE, "ingested_at"),
        TableSpec(tables.SILVER_BROKER_STATS, schemas.SILVER_BROKER_STATS, "event_time"),
        TableSpec(tables.SILVER_SEND_FAILURES, schemas.SILVER_SEND_FAILURES, "event_time"),
        TableSpec(tables.QUARANTINE, schemas.QUARANTINE, "ingested_at"),
        TableSpec(tables.GOLD_TOPIC_TPS, schemas.GOLD_TOPIC_TPS, "window_start"),
        TableSpec(tables.GOLD_GROUP_TPS, schemas.GOLD_GROUP_TPS, "window_start"),
        TableSpec(tables.GOLD_BROKER_TPS, schemas.GOLD_BROKER_TPS, "window_start"),
        TableSpec(tables.GOLD_ANOMALIES, schemas.GOLD_ANOMALIES, "window_start"),
        TableSpec(tables.GOLD_LIMITS, schemas.GOLD_LIMITS, "window_end"),
        TableSpec(tables.STATE_POLICY, schemas.POLICY_STATE),
        TableSpec(tables.BACKTEST_RESULTS, schemas.BACKTEST_RESULTS, "recorded_at"),
        TableSpec(tables.QUALITY_VALIDATION_RESULTS, schemas.QUALITY_VALIDATION_RESULTS, "validated_at"),
        TableSpec(tables.QUALITY_VALIDATION_RUNS, schemas.QUALITY_VALIDATION_RUNS, "validated_at"),
        TableSpec(tables.QUALITY_RECONCILIATION, schemas.QUALITY_RECONCILIATION, "recorded_at"),
        TableSpec(tables.CONTROL_SINK_STATUS, schemas.SINK_STATUS, "at"),
        TableSpec(tables.CONTROL_LIMITER_REJECTIONS, schemas.LIMITER_REJECTIONS, "last_rejected_at"),
    )
}


class UnknownTableError(KeyError):
    """The table name is not one of :data:`TABLES`."""


def table_spec(name: str) -> TableSpec:
    try:
        return TABLES[name]
    except KeyError:
        raise UnknownTableError(f"unknown table {name!r}; known: {', '.join(sorted(TABLES))}") from None


def conform(df: DataFrame, schema: T.StructType) -> DataFrame:
    """Select exactly the schema's columns, in order, cast to the schema's types; a column the DataFrame lacks (a
    table written before the column was added) is null."""
    return df.select(*[(F.col(f.name) if f.name in df.columns else F.lit(None)).cast(f.dataType).alias(f.name)
                       for f in schema.fields])


def _conform_arrow(data, spec: "TableSpec"):
    """An Arrow table read from a Delta table → exactly the table's current columns, in order: a column added after
    the data was written (new nullable columns, written with schema merge) reads as nulls."""
    import pyarrow as pa

    target = _arrow_schema(spec)
    columns = [data.column(f.name).cast(f.type) if f.name in data.column_names else pa.nulls(data.num_rows, f.type)
               for f in target]
    return pa.Table.from_arrays(columns, schema=target) if data.num_rows else target.empty_table()


class Lake:
    """Common part of both writers. ``root`` is the lake directory (local path or URI)."""

    writer: str = "abstract"

    def __init__(self, spark: SparkSession, root: str) -> None:
        self.spark = spark
        self.root = root.rstrip("/")
        #: Called before every write (each append attempt, each publish): raises when this governor may no longer
        #: write to the lake (:meth:`pipelines.io.lease.GovernorLease.check`, set by :func:`pipelines.governor.run`).
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
        """Append ``df`` (conformed to the table's schema) as one commit tagged ``(app_id, version)``.

        Nothing is written when the table already holds a commit of ``app_id`` at ``version`` or later (a
        replayed micro-batch) or when ``df`` is empty. ``rows`` is ``df``'s row count when the caller knows it: the
        delta-rs writer then writes a large append from the executors (:class:`DeltaRsLake`). Returns the number of
        rows written (delta-rs: 0 for a skipped replay; delta-spark: the rows handed to Delta, which skips a replay
        itself without telling).

        Raises:
            OSError: the write failed (e.g. ENOSPC, the disk of the lake full); nothing was committed.
        """
        spec = table_spec(table)
        conformed = conform(df, spec.schema)
        return _retried(lambda: self._append(conformed, spec, app_id=app_id, version=version, rows=rows),
                        self.check_fence, self.path(table))

    def append_rows(self, rows: list[tuple], table: str, *, app_id: str, version: int) -> int:
        """Append driver-side records (tuples in the order of the table's schema, timestamps naive UTC or aware),
        such as the quality gate's reconciliation rows, as one commit tagged ``(app_id, version)``: as
        :meth:`append`, without a Spark job on the delta-rs path (the rows become Arrow on the driver; a DataFrame
        built from them would only be collected back). Returns the number of rows written.

        Raises:
            OSError: the write failed; nothing was committed.
        """
        spec = table_spec(table)
        if not rows:
            return 0
        return _retried(lambda: self._append_rows(rows, spec, app_id=app_id, version=version), self.check_fence,
                        self.path(table))

    def read(
        self,
        table: str,
        *,
        since: dt.datetime | None = None,
        before: dt.datetime | None = None,
    ) -> DataFrame:
        """Read a table (empty DataFrame of its schema if it does not exist yet), optionally only the rows whose
        time column is in ``[since, before)`` (UTC)."""
        spec = table_spec(table)
        if not self.exists(table):
            return self.empty(table)
        return conform(self._read(spec, since, before), spec.schema)

    def latest_rows(self, table: str, keys: list[str], order: str, below: int | None = None) -> list[dict] | None:
        """The row with the highest ``order`` per ``keys`` of ``table`` (among rows whose ``order`` is below
        ``below`` when given), as dicts, read on the driver without a Spark job; None when this writer has no such
        path (then read the table and rank it with Spark)."""
        return None

    def latest(self, table: str, keys: list[str], order: str, rank: Callable[[DataFrame], DataFrame],
               below: int | None = None) -> DataFrame:
        """The latest row per ``keys`` of ``table`` by ``order`` (among rows whose ``order`` is below ``below`` when
        given), as ``rank`` shapes it: ``rank`` is the Spark definition (e.g.
        :func:`pipelines.io.publish.latest_per_resource`). Here it ranks the whole table; the delta-rs writer first
        picks the latest rows on the driver from the table's snapshot (:meth:`latest_rows`), so only those cross to
        Spark and ``rank`` changes nothing but the shape (tested: same rows either way)."""
        df = self.read(table)
        if below is not None:
            df = df.where(F.col(order) < F.lit(below))
        return rank(df)

    # implemented by the writers
    def exists(self, table: str) -> bool:
        raise NotImplementedError

    def _append(self, df: DataFrame, spec: TableSpec, *, app_id: str, version: int, rows: int | None = None) -> int:
        raise NotImplementedError

    def _append_rows(self, rows: list[tuple], spec: TableSpec, *, app_id: str, version: int) -> int:
        return self._append(self.spark.createDataFrame(rows, spec.schema), spec, app_id=app_id, version=version)

    def _read(self, spec: TableSpec, since: dt.datetime | None, before: dt.datetime | None) -> DataFrame:
        raise NotImplementedError


#: Attempts of one append before its error fails the micro-batch, and the back-off between them (s): 0.5, 1, 2, 4.
APPEND_ATTEMPTS = 5
APPEND_BACKOFF = (0.5, 4.0)


def _retried(write: Callable[[], int], fence: Callable[[], None], where: str) -> int:
    """``write()`` (one append to the table at ``where``) behind ``fence`` and the append fault point, retried by
    :func:`_append_retrying` (the fence is asked before every attempt; its error is not retried)."""

    def attempt() -> int:
        fence()
        fault_point(APPEND_FAULT, where)
        return write()

    return _append_retrying()(attempt)


def storage_error(exc: BaseException) -> bool:
    """True for an error of the storage under the lake, worth retrying: an ``OSError`` (a full disk, a storage
    hiccup), or delta-rs's ``DeltaError`` carrying an operating-system error (a real ENOSPC reaches Python as
    ``DeltaError: ... No space left on device (os error 28)``, not as an OSError)."""
    return isinstance(exc, OSError) or (type(exc).__name__ == "DeltaError" and "(os error " in str(exc))


def _append_retrying():
    """Tenacity retrying for one append: a storage error (:func:`storage_error`) is retried with back-off (about
    7.5 s in all), then re-raised so the micro-batch fails and is replayed on restart. Retrying is safe: an append
    is skipped when its ``(app_id, version)`` is already committed, and a failed one committed nothing (files
    written before the failure are not in the log; ``VACUUM`` removes them)."""
    import tenacity

    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(storage_error),
        stop=tenacity.stop_after_attempt(APPEND_ATTEMPTS),
        wait=tenacity.wait_exponential(multiplier=APPEND_BACKOFF[0], max=APPEND_BACKOFF[1]),
        before_sleep=lambda state: log.warning(
            "lake append failed (attempt %d of %d), retrying: %s",
            state.attempt_number, APPEND_ATTEMPTS, state.outcome.exception() if state.outcome else "?",
        ),
        reraise=True,
    )


#: Folder (under a table's directory) of the data files Spark writes for the delta-rs lake's large appends.
DATA_FOLDER = "data"


def _file_stats(footer, time_column: str | None) -> dict:
    """Delta ``add`` statistics of one Parquet file from its footer: ``numRecords``, and for the table's time
    column the null count and the min/max (milliseconds, ISO-8601 UTC; min rounded down and max up, so file
    skipping on a time range never skips a matching row)."""
    stats: dict = {"numRecords": footer.num_rows}
    if time_column is None:
        return stats
    index = footer.schema.to_arrow_schema().get_field_index(time_column)
    lows, highs, nulls = [], [], 0
    for group in range(footer.num_row_groups):
        column = footer.row_group(group).column(index).statistics
        if column is None or not column.has_min_max:
            return stats
        lows.append(column.min)
        highs.append(column.max)
        nulls += column.null_count
    if lows:
        low, high = min(lows), max(highs)
        ceil = high if high.microsecond % 1000 == 0 else high + dt.timedelta(microseconds=1000 - high.microsecond % 1000)
        text = lambda t: _utc(t).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"  # noqa: E731
        stats.update(minValues={time_column: text(low)}, maxValues={time_column: text(ceil)},
                     nullCount={time_column: nulls})
    return stats


def _arrow_schema(spec: TableSpec):
    """The Arrow schema of a table (Spark's own type mapping: timestamps are microseconds, UTC)."""
    from pipelines.spark_compat import arrow_schema

    return arrow_schema(spec.schema)


def _utc(ts: dt.datetime) -> dt.datetime:
    return ts.replace(tzinfo=dt.timezone.utc) if ts.tzinfo is None else ts.astimezone(dt.timezone.utc)


class DeltaRsLake(Lake):
    """Writes and reads Delta tables with delta-rs (no Delta jars needed).

    An append goes one of two ways, both one Delta commit tagged ``(app_id, version)``:

    * **through the driver** (the default, and for every append of at most ``executor_write_rows`` rows): the rows
      are collected as Arrow and delta-rs writes the Parquet file and the commit. Cheapest for small micro-batches
      (one Spark job, no output commit protocol).
    * **from the executors** (an append the caller knows to be larger, ``rows`` > ``executor_write_rows``): Spark's
      own Parquet writer writes the data files into ``<table>/data/<uuid>/`` from the executors, and delta-rs
      commits them (``DeltaTable.create_write_transaction`` with one ``AddAction`` per file: size, row count and
      the time column's min/max read from the Parquet footers). Only the file list crosses to the driver, so a
      backlog batch of millions of records no longer has to fit in the driver's heap (2 M records of bronze did
      not in 4 GB). Files of a write that fails or is not committed are in no Delta log: invisible, removed by
      ``VACUUM``.
    """

    writer = "delta-rs"

    def __init__(self, spark: SparkSession, root: str, executor_write_rows: int = 200_000) -> None:
        super().__init__(spark, root)
        self.executor_write_rows = executor_write_rows

    def exists(self, table: str) -> bool:
        from deltalake import DeltaTable

        return DeltaTable.is_deltatable(self.path(table))

    def committed_version(self, table: str, app_id: str) -> int | None:
        """The last micro-batch ``app_id`` committed to ``table`` (the snapshot's app transaction, which survives
        log clean-up through checkpoints), None if none."""
        from deltalake import DeltaTable

        if not self.exists(table):
            return None
        return DeltaTable(self.path(table)).transaction_version(app_id)

    def _append(self, df: DataFrame, spec: TableSpec, *, app_id: str, version: int, rows: int | None = None) -> int:
        if self._committed(spec, app_id, version):
            return 0
        if rows is not None and rows > self.executor_write_rows:
            return self._commit_files(df, spec, app_id=app_id, version=version)
        return self._commit(df.toArrow(), spec, app_id=app_id, version=version)

    def _commit_files(self, df: DataFrame, spec: TableSpec, *, app_id: str, version: int) -> int:
        """Spark writes ``df`` as Parquet under ``<table>/data/<uuid>/``; delta-rs commits those files."""
        import uuid

        import pyarrow.fs as pafs
        import pyarrow.parquet as pq
        from deltalake import CommitProperties, DeltaTable, Transaction
        from deltalake.transaction import AddAction

        path = self.path(spec.name)
        DeltaTable.create(path, schema=_arrow_schema(spec), mode="ignore")
        folder = f"{DATA_FOLDER}/{uuid.uuid4().hex}"
        df.write.parquet(f"{path}/{folder}")
        fs, base = pafs.FileSystem.from_uri(path)
        actions, written = [], 0
        for info in fs.get_file_info(pafs.FileSelector(f"{base}/{folder}")):
            name = info.path.rsplit("/", 1)[-1]
            if not name.endswith(".parquet"):
                continue
            footer = pq.read_metadata(info.path, filesystem=fs)
            if footer.num_rows == 0:
                continue
            written += footer.num_rows
            stats = _file_stats(footer, spec.time_column)
            actions.append(AddAction(f"{folder}/{name}", info.size, {}, int(info.mtime.timestamp() * 1000), True,
                                     json.dumps(stats)))
        if not actions:
            return 0
        DeltaTable(path).create_write_transaction(
            actions, mode="append", schema=_arrow_schema(spec),
            commit_properties=CommitProperties(app_transactions=[Transaction(app_id=app_id, version=version)]),
        )
        return written

    def _append_rows(self, rows: list[tuple], spec: TableSpec, *, app_id: str, version: int) -> int:
        import pyarrow as pa

        if self._committed(spec, app_id, version):
            return 0
        names = spec.schema.names
        columns = {name: [row[i] for row in rows] for i, name in enumerate(names)}
        return self._commit(pa.table(columns, schema=_arrow_schema(spec)), spec, app_id=app_id, version=version)

    def _committed(self, spec: TableSpec, app_id: str, version: int) -> bool:
        committed = self.committed_version(spec.name, app_id)
        return committed is not None and committed >= version

    def _commit(self, data, spec: TableSpec, *, app_id: str, version: int) -> int:
        """One delta-rs append of the Arrow table ``data`` (cast to the table's schema) tagged ``(app_id,
        version)``; nothing for an empty table."""
        from deltalake import CommitProperties, Transaction, write_deltalake

        if data.num_rows == 0:
            return 0
        data = data.cast(_arrow_schema(spec))
        write_deltalake(
            self.path(spec.name),
            data,
            mode="append",
            schema_mode="merge",  # a table written before a column was added gains it (nullable, null before)
            commit_properties=CommitProperties(app_transactions=[Transaction(app_id=app_id, version=version)]),
        )
        return data.num_rows

    def _latest_arrow(self, table: str, keys: list[str], order: str, below: int | None):
        """Driver-side "latest row per key": the table's current snapshot read with delta-rs (rows with ``order`` <
        ``below`` when given), the last row by ``order`` per ``keys`` taken. No cache: every call reads the current
        snapshot, so the rows of every writer (the gold and the fast flow) and a restart are always seen. None when
        the table does not exist yet."""
        import pyarrow as pa
        import pyarrow.compute as pc
        from deltalake import DeltaTable

        spec = table_spec(table)
        if not self.exists(table):
            return None
        filters = pc.field(order) < below if below is not None else None
        delta = DeltaTable(self.path(table))
        present = [n for n in spec.schema.names if n in delta.schema().to_arrow().names]
        data = _conform_arrow(delta.to_pyarrow_table(columns=present, filters=filters), spec)
        if data.num_rows == 0:
            return data
        picked = data.select([*keys, order]).to_pandas().sort_values(order, kind="stable")
        return data.take(pa.array(sorted(picked.drop_duplicates(keys, keep="last").index), type=pa.int64()))

    def latest(self, table: str, keys: list[str], order: str, rank: Callable[[DataFrame], DataFrame],
               below: int | None = None) -> DataFrame:
        data = self._latest_arrow(table, keys, order, below)
        if data is None or data.num_rows == 0:
            return rank(self.empty(table))
        return rank(self.spark.createDataFrame(data, schema=table_spec(table).schema))

    def latest_rows(self, table: str, keys: list[str], order: str, below: int | None = None) -> list[dict] | None:
        """:meth:`_latest_arrow` as dicts: timestamps UTC-aware ``datetime``; an empty list when the table does not
        exist yet."""
        spec = table_spec(table)
        data = self._latest_arrow(table, keys, order, below)
        if data is None or data.num_rows == 0:
            return []
        latest = data.to_pandas()
        rows = latest.astype(object).where(latest.notna(), None).to_dict("records")
        for row in rows:
            for field in spec.schema.fields:
                value = row[field.name]
                if isinstance(field.dataType, T.TimestampType) and value is not None:
                    row[field.name] = _utc(value.to_pydatetime() if hasattr(value, "to_pydatetime") else value)
        return rows

    def _read(self, spec: TableSpec, since: dt.datetime | None, before: dt.datetime | None) -> DataFrame:
        import pyarrow.compute as pc
        from deltalake import DeltaTable

        table = DeltaTable(self.path(spec.name))
        filters = None
        if spec.time_column and (since or before):
            column = pc.field(spec.time_column)
            conditions = []
            if since:
                conditions.append(column >= _utc(since))
            if before:
                conditions.append(column < _utc(before))
            filters = conditions[0] if len(conditions) == 1 else conditions[0] & conditions[1]
        data = table.to_pyarrow_table(filters=filters)
        if data.num_rows == 0:
            return self.empty(spec.name)
        return self.spark.createDataFrame(_conform_arrow(data, spec), schema=spec.schema)


class DeltaSparkLake(Lake):
    """Writes and reads Delta tables with delta-spark (needs the Delta jars on the Spark classpath)."""

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
            df = df.where(F.col(spec.time_column) >= F.lit(_utc(since)))
        if spec.time_column and before:
            df = df.where(F.col(spec.time_column) < F.lit(_utc(before)))
        return df


Writer = Literal["auto", "delta-rs", "delta-spark"]


def open_lake(spark: SparkSession, root: str | Path, writer: Writer = "auto", executor_write_rows: int = 200_000) -> Lake:
    """The lake at ``root`` with the configured writer; ``auto`` picks delta-spark when its classes load.
    ``executor_write_rows``: see :class:`DeltaRsLake`.

    Raises:
        RuntimeError: ``writer="delta-spark"`` was asked for but the Delta jars are not on the classpath.
    """
    from pipelines.session import delta_spark_available

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
