"""Which writer for the ingest batch's events file (pipelines/dataplane/events.py): pyarrow on the driver or Spark's executors.

    .venv/bin/python bench/events_write.py --events 2000000 [--repeat 3]

Builds ``--events`` METRIC_EVENT rows (persisted, as the ingest batch's parsed rows are), then writes them as one
batch's file both ways and prints the best of ``--repeat`` runs of each and their ratio:

(a) driver: ``toArrow()`` + ``pyarrow.parquet.write_table`` to a hidden name + rename (:func:`write_batch`);
(b) executors: ``coalesce(1).write.parquet`` to a hidden temporary directory + rename of its one part file (one
    file per ingest batch keeps the gold query's micro-batches equal to the ingest query's).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipelines.config import load_config
from pipelines.dataplane import events
from pipelines.dataplane.session import build_session


def executor_write(df, directory: Path, batch_id: int) -> None:
    """(b): Spark's executors write one part file to a hidden directory, renamed into place."""
    target = events.batch_file(directory, batch_id)
    temporary = directory / f".{target.name}.dir"
    df.coalesce(1).write.mode("overwrite").parquet(str(temporary))
    (part,) = temporary.glob("part-*.parquet")
    os.replace(part, target)
    shutil.rmtree(temporary)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    from pyspark.sql import functions as F

    cfg = load_config(Path(__file__).resolve().parent.parent / "conf" / "local.toml")
    spark = build_session(cfg.spark)
    rows = spark.range(args.events).select(
        F.timestamp_seconds(F.lit(1_795_000_000) + F.col("id") % 3600).alias("event_time"),
        F.concat(F.lit("broker-"), (F.col("id") % 4).cast("string")).alias("broker"),
        F.concat(F.lit("topic-"), (F.col("id") % 500).cast("string")).alias("topic"),
        F.when(F.col("id") % 5 == 0, F.lit("group-1")).alias("consumer_group"),
        F.when(F.col("id") % 5 == 0, F.lit("TOPIC_PUT_NUMS")).otherwise(F.lit("failure:busy")).alias("metric"),
        (F.col("id") % 60_000).alias("amount"),
    ).persist()
    rows.count()
    work = Path(tempfile.mkdtemp(prefix="rg-events-"))
    best = {}
    for name, write in (("driver (pyarrow)", events.write_batch), ("executors (Spark)", executor_write)):
        times = []
        for batch_id in range(args.repeat):
            started = time.monotonic()
            write(rows, work, batch_id)
            times.append(time.monotonic() - started)
        best[name] = min(times)
        size = events.batch_file(work, 0).stat().st_size / 1e6
        print(f"{name:18s} best of {args.repeat}: {best[name]:6.2f} s  ({size:.1f} MB per file, {args.events} events)")
    print(f"executors / driver: {best['executors (Spark)'] / best['driver (pyarrow)']:.2f}")
    shutil.rmtree(work, ignore_errors=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
