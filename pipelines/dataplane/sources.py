"""Streaming sources: landing directories (Spark's file source, the embedded default) or Kafka (production).

Both yield the same :data:`~pipelines.schemas.RAW_RECORD` stream; only the transport differs. ``source`` is
``broker_stats`` or ``send_failures``.
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.config import GovernorConfig

BROKER_STATS = "broker_stats"
SEND_FAILURES = "send_failures"
INPUTS = (BROKER_STATS, SEND_FAILURES)


class LandingError(Exception):
    """The landing directory does not exist or is not a directory."""


def _parent_folder(path: Column) -> Column:
    """The name of the folder holding a file (the broker for raw stats.log files, docs/contracts.md §1.1)."""
    folder = F.regexp_extract(path, r"/([^/]+)/[^/]+$", 1)
    return F.when((folder == "") | (folder == BROKER_STATS), F.lit(None)).otherwise(folder)


def record_text(data: Column) -> dict[str, Column]:
    """``raw`` and ``raw_bytes`` of an input record from its bytes ``data`` (a binary Column).

    ``raw_bytes`` is ``data`` as is; ``raw`` is ``data`` as valid UTF-8 text, each invalid sequence replaced by
    U+FFFD (``make_valid_utf8``). Spark's text source and a Kafka value cast to string keep invalid bytes as they are,
    which Arrow, Parquet readers and pandas refuse: a single bad byte would make a whole Delta table unreadable.
    """
    return {"raw": F.make_valid_utf8(data.cast("string")), "raw_bytes": data}


def prepare_landing(landing: str) -> None:
    """Check the landing directory and create its two input folders if missing (Spark's file source needs them).

    Raises:
        LandingError: ``landing`` does not exist or is not a directory.
    """
    root = Path(landing)
    if not root.is_dir():
        raise LandingError(f"landing directory not found: {landing}")
    for name in INPUTS:
        (root / name).mkdir(exist_ok=True)


def _file_stream(spark: SparkSession, cfg: GovernorConfig, name: str) -> DataFrame:
    """Lines of the files under ``<landing>/<name>``. A writer should write a hidden file (``.name`` or ``_name``,
    which Spark skips) and rename it into place; a renamed file is a new path
    and is read even if its modification time is older than files already read (up to Spark's ``maxFileAge``,
    7 days before the newest file seen). A file removed between the micro-batch's listing and its reading is
    skipped (``ignoreMissingFiles``): it has no rows to count, the batch and the governor go on."""
    reader = (
        spark.readStream.format("text")
        .option("recursiveFileLookup", "true")
        .option("ignoreMissingFiles", "true")
    )
    if cfg.source.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", cfg.source.max_files_per_trigger)
    lines = reader.load(str(Path(cfg.source.landing) / name))
    path = F.col("_metadata.file_path")
    return lines.select(
        F.lit(name).alias("source"),
        *[column.alias(alias) for alias, column in record_text(F.col("value").cast("binary")).items()],
        path.alias("origin"),
        (_parent_folder(path) if name == BROKER_STATS else F.lit(None).cast("string")).alias("broker_hint"),
        F.current_timestamp().alias("ingested_at"),
    )


def _kafka_stream(spark: SparkSession, cfg: GovernorConfig) -> DataFrame:
    k = cfg.source.kafka
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", k.bootstrap_servers)
        .option("subscribe", f"{k.stats_topic},{k.failures_topic}")
        .option("startingOffsets", k.starting_offsets)
        .options(**{f"kafka.{key}": value for key, value in k.options.items()})
    )
    if k.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", k.max_offsets_per_trigger)
    return from_kafka(reader.load(), k.stats_topic)


def from_kafka(records: DataFrame, stats_topic: str) -> DataFrame:
    """Kafka source rows (``key``, ``value`` binary; ``topic``, ``partition``, ``offset``) → RAW_RECORD rows: a
    message of ``stats_topic`` is a ``broker_stats`` record, any other a ``send_failures`` record; the key is the
    broker hint (as valid UTF-8 text, see :func:`record_text`)."""
    return records.select(
        F.when(F.col("topic") == stats_topic, F.lit(BROKER_STATS)).otherwise(F.lit(SEND_FAILURES)).alias("source"),
        *[column.alias(alias) for alias, column in record_text(F.col("value")).items()],
        F.format_string("kafka:%s:%d:%d", F.col("topic"), F.col("partition"), F.col("offset")).alias("origin"),
        F.make_valid_utf8(F.col("key").cast("string")).alias("broker_hint"),
        F.current_timestamp().alias("ingested_at"),
    )


def raw_records(spark: SparkSession, cfg: GovernorConfig) -> DataFrame:
    """The streaming :data:`~pipelines.schemas.RAW_RECORD` rows of both inputs, from files or Kafka."""
    if cfg.source.kind == "kafka":
        return _kafka_stream(spark, cfg)
    prepare_landing(cfg.source.landing)
    return _file_stream(spark, cfg, BROKER_STATS).unionByName(_file_stream(spark, cfg, SEND_FAILURES))
