"""Small builders shared by the tests."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from pipelines import schemas

INGESTED = dt.datetime(2022, 2, 9, 0, 0)


def raw_records(spark, source: str, lines: list[str], broker_hint: str | None = "broker-a"):
    """RAW_RECORD rows for ``lines`` as if read from one file in ``<landing>/<source>/<broker_hint>/``."""
    rows = [
        (source, line, line.encode("utf-8"), f"file:///landing/{source}/{broker_hint}/stats.log", broker_hint, INGESTED)
        for line in lines
    ]
    return spark.createDataFrame(rows, schemas.RAW_RECORD)


def stats_line(local_time: str, stat: str, key: str, detail: str, period: str = "In One Minute") -> str:
    """A stats.log line as RocketMQ prints it (``local_time`` in GMT+8)."""
    return f"{local_time} INFO - [{stat}] [{key}] Stats {period}, {detail}"


def ts(text: str) -> dt.datetime:
    """'2022-02-08 07:40' → naive UTC datetime."""
    return dt.datetime.fromisoformat(text)


def write_config(path, base: str = "conf/local.toml", **settings) -> Path:
    """Write ``base`` with ``settings`` changed (dotted names: ``write_config(p, **{"windows.length_seconds": 120})``)
    to ``path`` as TOML and return it. A setting ``base`` does not have raises KeyError, so a renamed setting
    cannot make the change a silent no-op."""

    import tomli_w

    from pipelines.config import read_toml

    data = read_toml(base)
    for dotted, value in settings.items():
        *parents, leaf = dotted.split(".")
        node = data
        for name in parents:
            node = node[name]
        if leaf not in node:
            raise KeyError(f"{base} has no setting {dotted}")
        node[leaf] = value
    out = Path(path)
    out.write_text(tomli_w.dumps(data))
    return out


def lean_config_file(path) -> Path:
    """conf/local.toml without per-batch GX validation (its results table is covered by tests/quality): the
    end-to-end tests that only check governance run faster with it."""
    return write_config(path, **{"quality.validate_every_n_batches": 0})


def set_comparable(df):
    """``df`` with every MAP column as its entries sorted by key (set operations such as ``exceptAll`` refuse maps,
    and a map's entry order is not part of its value)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import MapType

    return df.select(*[F.array_sort(F.map_entries(f.name)).alias(f.name) if isinstance(f.dataType, MapType)
                       else F.col(f.name) for f in df.schema.fields])


def assert_every_table_readable(spark, lake) -> list[str]:
    """Every Delta table of the lake ``lake`` (a :class:`pipelines.dataplane.lake.Lake`) is valid Arrow (``validate(full=
    True)`` checks UTF-8), reads into pandas, through Spark's Parquet reader (the files of the Delta log), through
    the lake's own reader and through the SQL of ``python -m pipelines.ops.query``, with the same row count each way.
    Returns the tables found."""
    from deltalake import DeltaTable

    from pipelines.ops import query
    from pipelines.dataplane.lake import TABLES

    existing = [t for t in TABLES if DeltaTable.is_deltatable(lake.path(t))]
    for table in existing:
        delta = DeltaTable(lake.path(table))
        arrow = delta.to_pyarrow_table()
        arrow.validate(full=True)
        assert len(delta.to_pandas()) == arrow.num_rows, table
        assert spark.read.format("parquet").load(delta.file_uris()).count() == arrow.num_rows, table
        assert len(lake.read(table).collect()) == arrow.num_rows, table
        assert query.run_sql(lake.root, f"SELECT * FROM {query.sql_name(table)}").num_rows == arrow.num_rows
    return existing


def leave_unplanned_batch_zero(query_checkpoint: Path) -> list[Path]:
    """What Spark leaves when its process is killed while it writes the first offset-log entry: the entry's temporary
    file (named as ``CheckpointFileManager.createAtomic`` names it) and its checksum, never renamed to ``offsets/0``."""
    offsets = query_checkpoint / "offsets"
    offsets.mkdir(parents=True, exist_ok=True)
    entry = offsets / ".0.5f0c2a7e-1d9b-4c1e-9a55-0b8e3c9d2f11.tmp"
    entry.write_text('v1\n{"batchWatermarkMs":0,"batchTimestampMs":17')       # cut off mid-write
    crc = offsets / f".{entry.name}.crc"
    crc.write_bytes(b"crc\0")
    return [entry, crc]
