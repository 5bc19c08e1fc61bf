"""The metric events handed from the ingest query to the gold query: parse once.

The ingest micro-batch ``N`` already parses every record; it also writes the batch's compact
:data:`~pipelines.schemas.METRIC_EVENT` rows (six columns) as one Parquet file ``<events>/batch-<N>.parquet``, and
the gold query streams these files with Spark's own file source instead of parsing the raw records a second time.

* **Where**: ``<checkpoint root>/events`` (:func:`events_dir`; ``<lake>/_checkpoints/events`` by default). The files
  belong to the ingest checkpoint's batch ids, so a new checkpoint directory starts an empty events directory.
* **Atomic, deterministic, exactly once**: a batch's file is written under a hidden name (``.batch-<N>.parquet.tmp``,
  which Spark's file source skips) and renamed into place. A micro-batch replayed after a crash reads the same raw
  files (the ingest checkpoint's offsets) and writes the same path with the same rows; Spark's file source never
  reads a path twice, so a file the gold query has already read is not read again.
* **Two readers**: the gold query reads ``events``, the fast query its own hard link of each file in
  ``events-fast`` (:func:`fast_events_dir`), so the fast path uses what ingest parsed too, and each reader's
  clean-up deletes its own name.
* **Clean-up**: the gold query's file source deletes a file once the gold micro-batch that read it is committed
  (``cleanSource = delete``, Spark's own option). A file read by the last batch before a stop is deleted by a later
  run (Spark cleans on the next batch's commit); at most one ingest batch's events can be rewritten after the gold
  query read them (a crash of ingest between the events file and its checkpoint commit) and stay: a few kB to MB,
  removed with the checkpoint directory. Spark's file source cleans a micro-batch's files on every commit of its
  offset, and a no-data micro-batch (the watermark moved) commits the same offset again: its
  ``WARN FileStreamSource$SourceFileRemover: Failed to remove …`` names a file already deleted, nothing is lost.
* **Batches**: one file per ingest batch. With ``source.max_files_per_trigger`` set the gold query reads one file
  per micro-batch (``maxFilesPerTrigger = 1``): its micro-batches are the ingest query's, so its watermark advances
  exactly as it did when it parsed the same raw files itself; with 0 (no limit) it reads what has been written.

Written on the driver with pyarrow (the batch's events are collected as Arrow, as the delta-rs writes of the same
batch are): faster and smaller than Spark's executors writing one part file to a temporary directory and a rename
(``bench/events_write.py``; the figures are in docs/performance.md).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from pipelines.config import GovernorConfig
from pipelines.schemas import METRIC_EVENT

EVENTS_DIR = "events"
#: The fast query's own copy of each events file (a hard link: each reader's file source deletes its own name).
FAST_EVENTS_DIR = "events-fast"


def events_dir(cfg: GovernorConfig) -> Path:
    """The directory of the ingest query's metric-event files: ``<checkpoint root>/events``."""
    return Path(cfg.checkpoint_root) / EVENTS_DIR


def fast_events_dir(cfg: GovernorConfig) -> Path:
    """The fast query's events directory: ``<checkpoint root>/events-fast``."""
    return Path(cfg.checkpoint_root) / FAST_EVENTS_DIR


def batch_file(directory: Path, batch_id: int) -> Path:
    """The events file of ingest micro-batch ``batch_id``: ``batch-000000042.parquet`` (zero-padded, so names sort
    in batch order)."""
    return directory / f"batch-{batch_id:09d}.parquet"


def write_batch(events: DataFrame, directory: Path, batch_id: int, also: Path | None = None) -> int:
    """Write ``events`` (METRIC_EVENT rows) as the file of ``batch_id``: collected as Arrow on the driver, written
    to a hidden temporary file, renamed into place (an existing file of a replayed batch is replaced by the same
    rows). A batch without events still gets its (empty) file, so every ingest batch has exactly one. ``also``: a
    second directory that gets the same file under the same name (a hard link, a copy where the file system has
    none; renamed into place the same way), for the fast query. Returns the number of rows.

    Raises:
        OSError: the file could not be written (nothing was renamed into place).
    """
    import pyarrow.parquet as pq
    from pipelines.dataplane.spark_compat import arrow_schema

    data = events.select(*METRIC_EVENT.fieldNames()).toArrow().cast(arrow_schema(METRIC_EVENT))
    directory.mkdir(parents=True, exist_ok=True)
    target = batch_file(directory, batch_id)
    temporary = directory / f".{target.name}.tmp"
    pq.write_table(data, temporary)
    if also is not None:
        also.mkdir(parents=True, exist_ok=True)
        second = also / f".{target.name}.tmp"
        second.unlink(missing_ok=True)
        try:
            os.link(temporary, second)
        except OSError:
            shutil.copyfile(temporary, second)
        os.replace(second, also / target.name)
    os.replace(temporary, target)
    return data.num_rows


def read_stream(spark: SparkSession, cfg: GovernorConfig, directory: Path | None = None) -> DataFrame:
    """The streaming METRIC_EVENT rows of the events files in ``directory`` (default :func:`events_dir`; the fast
    query reads :func:`fast_events_dir`), oldest first (``latestFirst = false``), one ingest batch per micro-batch
    when ``source.max_files_per_trigger`` is set; each file is deleted once the micro-batch that read it is committed
    (``cleanSource = delete``)."""
    directory = directory or events_dir(cfg)
    directory.mkdir(parents=True, exist_ok=True)
    reader = (
        spark.readStream.format("parquet")
        .schema(METRIC_EVENT)
        .option("latestFirst", "false")
        .option("cleanSource", "delete")
    )
    if cfg.source.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", 1)
    return reader.load(str(directory))
