"""The one registry of the lake's Delta tables: each table's name (from :mod:`pipelines.tables`), schema (from
:mod:`pipelines.schemas`) and time column, and how rows are made to fit a table's current schema.

Example:
    >>> table_spec("gold/limits").time_column
    'window_end'
    >>> TABLES[tables.GOLD_LIMITS].schema == schemas.GOLD_LIMITS
    True
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines import schemas
from pipelines import tables

if TYPE_CHECKING:
    import pyarrow as pa


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
        TableSpec(tables.CONTROL_OVERRIDES, schemas.OVERRIDES, "recorded_at"),
    )
}


class UnknownTableError(KeyError):
    """The table name is not one of :data:`TABLES`."""


def table_spec(name: str) -> TableSpec:
    """The registered table ``name`` (a constant of :mod:`pipelines.tables`).

    Raises:
        UnknownTableError: ``name`` is not in :data:`TABLES` (the message lists the known names).
    """
    try:
        return TABLES[name]
    except KeyError:
        raise UnknownTableError(f"unknown table {name!r}; known: {', '.join(sorted(TABLES))}") from None


def conform(df: DataFrame, schema: T.StructType) -> DataFrame:
    """Select exactly the schema's columns, in order, cast to the schema's types; a column the DataFrame lacks (a
    table written before the column was added) is null."""
    return df.select(*[(F.col(f.name) if f.name in df.columns else F.lit(None)).cast(f.dataType).alias(f.name)
                       for f in schema.fields])


#: Column of :func:`collect_tables`'s combined frame telling which table a row belongs to.
PART_COLUMN = "_table"


def collect_tables(outputs: dict[str, DataFrame], schemas: dict[str, T.StructType] | None = None
                   ) -> dict[str, "pa.Table"]:
    """Several tables' rows collected to the driver by **one** Spark job: table name → Arrow table of that table's
    schema (:func:`arrow_schema`), the rows in the order Spark emitted them.

    Each DataFrame is conformed (:func:`conform`) and packed as a struct column of its own; the packed frames are
    unioned and collected with one ``toArrow``, then split on the driver. One job instead of one per table: at
    micro-batch sizes a Spark job's fixed cost (scheduling, the Arrow stream, the py4j round trips) is most of an
    append's time (``bench/batch_profile.py`` prints the jobs per micro-batch).

    ``schemas``: the schema of an output that is not a lake table (by its name), e.g. the decisions' traffic rows.

    Example:
        >>> collect_tables({"gold/topic_tps": topics, "gold/limits": limits})["gold/limits"].num_rows
        2
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    names = list(outputs)
    packed = [f"_t{i}" for i in range(len(names))]
    extra = schemas or {}
    specs = [TableSpec(name, extra[name]) if name in extra else table_spec(name) for name in names]
    parts = []
    for i, (name, spec) in enumerate(zip(names, specs)):
        df = conform(outputs[name], spec.schema)
        parts.append(df.select(
            F.lit(i).alias(PART_COLUMN),
            *[(F.struct(*[F.col(f.name) for f in spec.schema.fields]) if j == i else F.lit(None).cast(other.schema))
              .alias(packed[j]) for j, other in enumerate(specs)]))
    combined = parts[0]
    for part in parts[1:]:
        combined = combined.unionAll(part)
    data = combined.toArrow()
    out = {}
    for i, spec in enumerate(specs):
        rows = data.filter(pc.equal(data[PART_COLUMN], i)).column(packed[i])
        out[spec.name] = (pa.Table.from_struct_array(rows.combine_chunks()).cast(arrow_schema(spec)) if len(rows)
                          else arrow_schema(spec).empty_table())
    return out


def arrow_schema(spec: TableSpec) -> "pa.Schema":
    """The Arrow schema of a table (Spark's own type mapping: timestamps are microseconds, UTC)."""
    from pipelines.dataplane.spark_compat import arrow_schema as to_arrow

    return to_arrow(spec.schema)


def conform_arrow(data: "pa.Table", spec: TableSpec) -> "pa.Table":
    """An Arrow table read from a Delta table → exactly the table's current columns, in order: a column added after
    the data was written (new nullable columns, written with schema merge) reads as nulls."""
    import pyarrow as pa

    target = arrow_schema(spec)
    columns = [data.column(f.name).cast(f.type) if f.name in data.column_names else pa.nulls(data.num_rows, f.type)
               for f in target]
    return pa.Table.from_arrays(columns, schema=target) if data.num_rows else target.empty_table()


def arrow_rows(data: "pa.Table", spec: TableSpec) -> list[dict]:
    """Arrow rows of table ``spec`` → dicts by column name; nulls are None and timestamps UTC-aware ``datetime``."""
    if data.num_rows == 0:
        return []
    frame = data.to_pandas()
    rows = frame.astype(object).where(frame.notna(), None).to_dict("records")
    for row in rows:
        for field in spec.schema.fields:
            value = row[field.name]
            if isinstance(field.dataType, T.TimestampType) and value is not None:
                row[field.name] = utc(value.to_pydatetime() if hasattr(value, "to_pydatetime") else value)
    return rows


def utc(ts: dt.datetime) -> dt.datetime:
    """``ts`` as an aware UTC datetime (a naive one is taken as UTC)."""
    return ts.replace(tzinfo=dt.timezone.utc) if ts.tzinfo is None else ts.astimezone(dt.timezone.utc)
