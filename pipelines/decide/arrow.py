"""Arrow schemas of the decision plane's tables and frames, built from :mod:`pipelines.columns` (the one definition
of every column), and the conversions between Arrow, polars and the fold's Python values.

Types follow Spark's Arrow mapping, so a table the decision plane writes equals one Spark would have collected:
``timestamp`` is microseconds in UTC, ``long`` int64, ``int`` int32, maps ``map<string, …>``.

Example:
    >>> schema(columns.GOLD_LIMITS).field("version").type
    DataType(int64)
    >>> frame = to_polars(table)          # pyarrow → polars (no copy)
    >>> table = to_arrow(frame, columns.GOLD_LIMITS)   # polars → exactly the table's schema
"""

from __future__ import annotations

import datetime as dt

import polars as pl
import pyarrow as pa

from pipelines import columns

_SIMPLE = {"string": pa.string(), "long": pa.int64(), "int": pa.int32(), "double": pa.float64(),
           "boolean": pa.bool_(), "binary": pa.binary(), "timestamp": pa.timestamp("us", tz="UTC")}
UTC = dt.timezone.utc
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)


def arrow_type(name: str) -> pa.DataType:
    """A :mod:`pipelines.columns` type name → its Arrow type."""
    if name.startswith("map<"):
        key, value = name[4:-1].split(",")
        return pa.map_(_SIMPLE[key], _SIMPLE[value])
    if name.startswith("array<"):
        return pa.list_(_SIMPLE[name[6:-1]])
    return _SIMPLE[name]


def schema(spec: columns.Spec) -> pa.Schema:
    """A :mod:`pipelines.columns` spec → an Arrow schema of nullable fields (built once per spec)."""
    key = tuple(spec)
    if key not in _SCHEMAS:
        _SCHEMAS[key] = pa.schema([pa.field(name, arrow_type(kind)) for name, kind in spec])
    return _SCHEMAS[key]


_SCHEMAS: dict[tuple, pa.Schema] = {}


def empty(spec: columns.Spec) -> pa.Table:
    return schema(spec).empty_table()


def to_polars(table: pa.Table | pl.DataFrame | None, spec: columns.Spec | None = None) -> pl.DataFrame:
    """Arrow → polars; None (or no rows and no columns) → an empty frame of ``spec``'s columns; a polars frame is
    returned as it is (a caller that keeps its history as polars frames converts it once, not per micro-batch)."""
    if isinstance(table, pl.DataFrame):
        return table
    if table is None:
        table = empty(spec) if spec is not None else pa.table({})
    return pl.from_arrow(table) if table.num_columns else pl.DataFrame()


def to_arrow(frame: pl.DataFrame, spec: columns.Spec) -> pa.Table:
    """polars → exactly ``spec``'s columns, in order, cast to their Arrow types; a missing column is null."""
    target = schema(spec)
    n = frame.height
    data = frame.to_arrow() if frame.width else pa.table({})
    arrays = []
    for f in target:
        if f.name in data.column_names:
            arrays.append(_cast(data.column(f.name), f.type))
        else:
            arrays.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays(arrays, schema=target)


def _cast(column: pa.ChunkedArray, kind: pa.DataType) -> pa.ChunkedArray:
    if column.type == kind:
        return column
    if pa.types.is_map(kind) and not pa.types.is_map(column.type):
        # a list of {key, value} structs (as polars builds them) → a map
        items = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        offsets, values = items.offsets, items.values  # the raw child: offsets index it, not the flattened view
        keys = values.field(0).cast(kind.key_type)
        vals = values.field(1).cast(kind.item_type)
        mask = items.is_null()
        return pa.chunked_array([pa.MapArray.from_arrays(offsets, keys, vals, mask=mask if mask.true_count else None)])
    return column.cast(kind)


def from_rows(rows: list[dict], spec: columns.Spec) -> pa.Table:
    """Python rows (dicts by column; timestamps naive UTC or aware, maps as dicts or (key, value) pairs) → Arrow.
    Built column by column (one conversion per column, not per cell: the simulator builds thousands of small
    tables)."""
    target = schema(spec)
    if not rows:
        return target.empty_table()
    arrays = []
    for f in target:
        values = [row.get(f.name) for row in rows]
        if pa.types.is_timestamp(f.type):
            values = [v.replace(tzinfo=UTC) if isinstance(v, dt.datetime) and v.tzinfo is None else v
                      for v in values]
        elif pa.types.is_map(f.type):
            values = [(sorted(v.items()) or None) if isinstance(v, dict) else v for v in values]
        arrays.append(pa.array(values, type=f.type))
    return pa.Table.from_arrays(arrays, schema=target)


def rows_of(table: pa.Table) -> list[dict]:
    """Arrow → rows as dicts, as ``Table.to_pylist`` gives them but converted column by column, and a microsecond
    timestamp column through its integers (each distinct time once; UTC-aware datetimes in ``datetime.timezone.utc``
    where the column has a time zone, naive where not): pyarrow converts every aware timestamp through pytz."""
    names, values, times = table.column_names, [], {}
    for f, col in zip(table.schema, table.columns):
        if pa.types.is_timestamp(f.type) and f.type.unit == "us" and f.type.tz in (None, "UTC", "+00:00"):
            out = []
            for v in col.cast(pa.int64()).to_pylist():
                if v is not None and v not in times:
                    times[v] = EPOCH + dt.timedelta(microseconds=v)
                out.append(None if v is None else times[v] if f.type.tz else times[v].replace(tzinfo=None))
            values.append(out)
        else:
            values.append(col.to_pylist())
    return [dict(zip(names, row)) for row in zip(*values)] if names else [{} for _ in range(table.num_rows)]


def naive(value: dt.datetime | None) -> dt.datetime | None:
    """A UTC datetime (aware or naive) → naive UTC, as the fold keeps its times."""
    if value is None:
        return None
    return value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo is not None else value


def aware(value: dt.datetime | None) -> dt.datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def figures(value) -> dict[str, float]:
    """A map cell (dict, list of (key, value) pairs or of {key, value} dicts, or None) → a dict of floats."""
    if value is None:
        return {}
    if isinstance(value, dict):
        items = value.items()
    else:
        items = [(v["key"], v["value"]) if isinstance(v, dict) else v for v in value]
    return {str(k): float(v) for k, v in items if v is not None}


def micros(value: dt.datetime) -> int:
    """Microseconds since the epoch of a UTC datetime (naive = UTC): the value a timestamp column holds."""
    return (aware(value) - EPOCH) // dt.timedelta(microseconds=1)


def when(column: str) -> pl.Expr:
    """A timestamp column as microseconds since the epoch, to compare with :func:`micros` of a datetime (a polars
    datetime literal costs hundreds of microseconds to build; an integer, a few)."""
    return pl.col(column).dt.epoch("us")


def epoch_seconds(value: dt.datetime) -> int:
    """UTC seconds since the epoch of a datetime (naive = UTC)."""
    return int(aware(value).timestamp())

