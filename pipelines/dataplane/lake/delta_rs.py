"""The delta-rs writer (the ``deltalake`` package, no Delta jars): :class:`DeltaRsLake`, the lake's writer on every
Spark line, and the Delta ``add`` statistics of the Parquet files it commits (:func:`file_stats`)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame, SparkSession

from pipelines.dataplane.lake.base import LakeBase
from pipelines.dataplane.lake.registry import (TableSpec, arrow_rows, arrow_schema, collect_tables, conform_arrow,
                                        table_spec, utc)

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

#: Folder (under a table's directory) of the data files Spark writes for the delta-rs lake's large appends.
DATA_FOLDER = "data"


class DeltaRsLake(LakeBase):
    """Writes and reads Delta tables with delta-rs (no Delta jars needed).

    An append goes one of two ways, both one Delta commit tagged ``(app_id, version)``:

    * **through the driver** (the default, and for every append of at most ``executor_write_rows`` rows): the rows
      are collected as Arrow and delta-rs writes the Parquet file and the commit. Cheapest for small micro-batches
      (one Spark job, no output commit protocol).
    * **from the executors** (an append the caller knows to be larger, ``rows`` > ``executor_write_rows``): Spark's
      own Parquet writer writes the data files into ``<table>/data/<uuid>/`` from the executors, and delta-rs
      commits them (``DeltaTable.create_write_transaction`` with one ``AddAction`` per file: size, row count and
      the time column's min/max read from the Parquet footers, :func:`file_stats`). Only the file list crosses to
      the driver, so a backlog batch of millions of records does not have to fit in the driver's heap. Files of a
      write that fails or is not committed are in no Delta log: invisible, removed by ``VACUUM``.

    A replayed micro-batch is skipped before anything is written: :meth:`committed_version` reads the table's app
    transaction (the protocol's "set transaction" action, ``DeltaTable.transaction_version``).
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

    def collect(self, outputs: dict[str, DataFrame], rows: dict[str, int] | None = None) -> dict[str, "pa.Table"]:
        """Every output appended through the driver (not known to be empty nor larger than
        ``executor_write_rows``), collected by one Spark job
        (:func:`~pipelines.dataplane.lake.registry.collect_tables`); {} when fewer than two are."""
        known = rows or {}
        small = {table: df for table, df in outputs.items()
                 if known.get(table) is None or 0 < known[table] <= self.executor_write_rows}
        return collect_tables(small) if len(small) > 1 else {}

    def _append_arrow(self, data: "pa.Table", spec: TableSpec, *, app_id: str, version: int) -> int:
        if self._committed(spec, app_id, version):
            return 0
        return self._commit(data, spec, app_id=app_id, version=version)

    def _commit_files(self, df: DataFrame, spec: TableSpec, *, app_id: str, version: int) -> int:
        """Spark writes ``df`` as Parquet under ``<table>/data/<uuid>/``; delta-rs commits those files."""
        import uuid

        import pyarrow.fs as pafs
        import pyarrow.parquet as pq
        from deltalake import CommitProperties, DeltaTable, Transaction
        from deltalake.transaction import AddAction

        path = self.path(spec.name)
        DeltaTable.create(path, schema=arrow_schema(spec), mode="ignore")
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
            stats = file_stats(footer, spec.time_column)
            actions.append(AddAction(f"{folder}/{name}", info.size, {}, int(info.mtime.timestamp() * 1000), True,
                                     json.dumps(stats)))
        if not actions:
            return 0
        DeltaTable(path).create_write_transaction(
            actions, mode="append", schema=arrow_schema(spec),
            commit_properties=CommitProperties(app_transactions=[Transaction(app_id=app_id, version=version)]),
        )
        return written

    def _append_rows(self, rows: list[tuple], spec: TableSpec, *, app_id: str, version: int) -> int:
        import pyarrow as pa

        if self._committed(spec, app_id, version):
            return 0
        names = spec.schema.names
        columns = {name: [row[i] for row in rows] for i, name in enumerate(names)}
        return self._commit(pa.table(columns, schema=arrow_schema(spec)), spec, app_id=app_id, version=version)

    def _committed(self, spec: TableSpec, app_id: str, version: int) -> bool:
        committed = self.committed_version(spec.name, app_id)
        return committed is not None and committed >= version

    def _commit(self, data: "pa.Table", spec: TableSpec, *, app_id: str, version: int) -> int:
        """One delta-rs append of the Arrow table ``data`` (cast to the table's schema) tagged ``(app_id,
        version)``; nothing for an empty table."""
        from deltalake import CommitProperties, Transaction, write_deltalake

        if data.num_rows == 0:
            return 0
        data = data.cast(arrow_schema(spec))
        write_deltalake(
            self.path(spec.name),
            data,
            mode="append",
            schema_mode="merge",  # a table written before a column was added gains it (nullable, null before)
            commit_properties=CommitProperties(app_transactions=[Transaction(app_id=app_id, version=version)]),
        )
        return data.num_rows

    def _latest_arrow(self, table: str, keys: list[str], order: str, below: int | None) -> "pa.Table | None":
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
        data = conform_arrow(delta.to_pyarrow_table(columns=present, filters=filters), spec)
        if data.num_rows == 0:
            return data
        picked = data.select([*keys, order]).to_pandas().sort_values(order, kind="stable")
        return data.take(pa.array(sorted(picked.drop_duplicates(keys, keep="last").index), type=pa.int64()))

    def latest(self, table: str, keys: list[str], order: str, rank: Callable[[DataFrame], DataFrame],
               below: int | None = None) -> DataFrame:
        """The latest rows picked on the driver (:meth:`_latest_arrow`), so only they cross to Spark; ``rank``
        then changes nothing but the shape (tested: the same rows as :meth:`LakeBase.latest`)."""
        data = self._latest_arrow(table, keys, order, below)
        if data is None or data.num_rows == 0:
            return rank(self.empty(table))
        return rank(self.spark.createDataFrame(data, schema=table_spec(table).schema))

    def latest_rows(self, table: str, keys: list[str], order: str, below: int | None = None) -> list[dict[str, Any]]:
        """:meth:`_latest_arrow` as dicts, without a Spark job."""
        data = self._latest_arrow(table, keys, order, below)
        return [] if data is None else arrow_rows(data, table_spec(table))

    def read_arrow(self, table: str, *, since: dt.datetime | None = None, before: dt.datetime | None = None,
                   columns: list[str] | None = None) -> "pa.Table":
        """The table's rows in ``[since, before)`` of its time column, read by delta-rs on the driver (files pruned
        by their statistics), conformed to its schema (or ``columns`` of it); empty when it does not exist."""
        from deltalake import DeltaTable

        spec = table_spec(table)
        target = arrow_schema(spec)
        if columns is not None:
            target = pa_schema_subset(target, columns)
        if not self.exists(table):
            return target.empty_table()
        delta = DeltaTable(self.path(table))
        present = set(delta.schema().to_arrow().names)
        data = delta.to_pyarrow_table(columns=[n for n in target.names if n in present],
                                      filters=_time_filter(spec, since, before))
        return conform_schema(data, target)

    def _read(self, spec: TableSpec, since: dt.datetime | None, before: dt.datetime | None) -> DataFrame:
        from deltalake import DeltaTable

        table = DeltaTable(self.path(spec.name))
        data = table.to_pyarrow_table(filters=_time_filter(spec, since, before))
        if data.num_rows == 0:
            return self.empty(spec.name)
        return self.spark.createDataFrame(conform_arrow(data, spec), schema=spec.schema)


def _time_filter(spec: TableSpec, since: dt.datetime | None, before: dt.datetime | None):
    """A pyarrow filter on the table's time column for ``[since, before)`` (None: no filter)."""
    import pyarrow.compute as pc

    if not spec.time_column or not (since or before):
        return None
    column = pc.field(spec.time_column)
    conditions = []
    if since:
        conditions.append(column >= utc(since))
    if before:
        conditions.append(column < utc(before))
    return conditions[0] if len(conditions) == 1 else conditions[0] & conditions[1]


def pa_schema_subset(schema: "pa.Schema", names: list[str]) -> "pa.Schema":
    import pyarrow as pa

    return pa.schema([schema.field(n) for n in names])


def conform_schema(data: "pa.Table", target: "pa.Schema") -> "pa.Table":
    """Arrow rows → exactly ``target``'s columns, in order; a column added after the data was written is null."""
    import pyarrow as pa

    columns = [data.column(f.name).cast(f.type) if f.name in data.column_names else pa.nulls(data.num_rows, f.type)
               for f in target]
    return pa.Table.from_arrays(columns, schema=target) if data.num_rows else target.empty_table()


def file_stats(footer: "pq.FileMetaData", time_column: str | None) -> dict:
    """Delta ``add`` statistics of one Parquet file from its footer: ``numRecords``, and for the table's time
    column the null count and the min/max (milliseconds, ISO-8601 UTC; min rounded down and max up, so file
    skipping on a time range never skips a matching row). Without a time column, or when a row group has no
    min/max statistics, only ``numRecords``."""
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
        ceil = (high if high.microsecond % 1000 == 0
                else high + dt.timedelta(microseconds=1000 - high.microsecond % 1000))
        text = lambda t: utc(t).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"  # noqa: E731
        stats.update(minValues={time_column: text(low)}, maxValues={time_column: text(ceil)},
                     nullCount={time_column: nulls})
    return stats
