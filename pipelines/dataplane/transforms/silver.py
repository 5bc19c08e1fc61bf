"""One ingest micro-batch as pure transforms: raw records → parsed rows → bronze, silver and quarantine outputs,
and the metric events that feed the gold windows.

Both streaming queries parse with the same two factories, so the gold windows see exactly the rows silver keeps.

Example:
    >>> stats = raw.transform(parsed_stats(cfg, gate.enforce_stats, known))     # known: the batch's known brokers
    >>> failures = raw.transform(parsed_failures(cfg, gate.enforce_failures, known))
    >>> outputs = ingest_outputs(raw, stats, failures)          # {table name: DataFrame}
    >>> events = metric_events(stats, failures)                 # METRIC_EVENT rows
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines import tables
from pipelines.config import GovernorConfig
from pipelines.dataplane.known_brokers import KnownBrokers
from pipelines.dataplane.sources import BROKER_STATS, SEND_FAILURES
from pipelines.dataplane.transforms import parse, parse_failures, tps
from pipelines.dataplane.transforms.known import judged
from pipelines.dataplane.transforms.types import Transform


def _identity(df: DataFrame) -> DataFrame:
    return df


def parsed_stats(cfg: GovernorConfig, enforce: Transform = _identity, known: KnownBrokers | None = None) -> Transform:
    """RAW_RECORD rows → the stats records parsed (:func:`pipelines.dataplane.transforms.parse.parse_broker_stats`
    columns, ``reject_reason`` null for accepted rows), records of brokers not in ``known`` rejected
    (:func:`pipelines.dataplane.transforms.known.judged`; None: every broker trusted), with the data-quality
    expectations applied by ``enforce``."""

    def transform(raw: DataFrame) -> DataFrame:
        return (
            raw.where(F.col("source") == BROKER_STATS)
            .transform(parse.parse_broker_stats(cfg.stats))
            .transform(judged(known))
            .transform(enforce)
            .transform(parse.settled)
        )

    return transform


def parsed_failures(cfg: GovernorConfig, enforce: Transform = _identity,
                    known: KnownBrokers | None = None) -> Transform:
    """RAW_RECORD rows → the send-failure records parsed, failures naming a broker not in ``known`` rejected, with
    the data-quality expectations applied."""

    def transform(raw: DataFrame) -> DataFrame:
        return (
            raw.where(F.col("source") == SEND_FAILURES)
            .transform(parse_failures.parse_send_failures(cfg.stats, cfg.brokers))
            .transform(judged(known))
            .transform(enforce)
            .transform(parse.settled)
        )

    return transform


def ingest_outputs(raw: DataFrame, stats: DataFrame, failures: DataFrame) -> dict[str, DataFrame]:
    """The tables one ingest micro-batch appends to, by table name: ``bronze/*`` (every record), ``silver/*``
    (accepted rows) and ``quarantine`` (rejected rows with their reason). Nothing is dropped: every raw record is in
    bronze and in exactly one of silver or quarantine."""
    rejected = stats.transform(parse.quarantine_rows(BROKER_STATS)).unionByName(
        failures.transform(parse.quarantine_rows(SEND_FAILURES))
    )
    return {
        tables.BRONZE_BROKER_STATS: raw.where(F.col("source") == BROKER_STATS),
        tables.BRONZE_SEND_FAILURES: raw.where(F.col("source") == SEND_FAILURES),
        tables.SILVER_BROKER_STATS: stats.transform(parse.silver_broker_stats),
        tables.SILVER_SEND_FAILURES: failures.transform(parse_failures.silver_send_failures),
        tables.QUARANTINE: rejected,
    }


def ingest_rows(measured: dict[str, dict]) -> dict[str, int]:
    """The row count of each :func:`ingest_outputs` table from the micro-batch's counts per source
    (:meth:`pipelines.dataplane.quality.reconcile.Reconciler.measure`: ``records``, ``silver``, ``late``,
    ``quarantine``): bronze holds every record, silver the accepted rows (late ones included), quarantine the rejected
    rows."""
    count = lambda source, *keys: sum(int(measured.get(source, {}).get(k) or 0) for k in keys)  # noqa: E731
    return {
        tables.BRONZE_BROKER_STATS: count(BROKER_STATS, "records"),
        tables.BRONZE_SEND_FAILURES: count(SEND_FAILURES, "records"),
        tables.SILVER_BROKER_STATS: count(BROKER_STATS, "silver", "late"),
        tables.SILVER_SEND_FAILURES: count(SEND_FAILURES, "silver", "late"),
        tables.QUARANTINE: count(BROKER_STATS, "quarantine") + count(SEND_FAILURES, "quarantine"),
    }


def metric_events(stats: DataFrame, failures: DataFrame) -> DataFrame:
    """Parsed stats and send-failure rows → :data:`~pipelines.schemas.METRIC_EVENT` rows (event time UTC)."""
    stats_events = stats.transform(parse.silver_broker_stats).transform(tps.stats_metric_events)
    failure_events = failures.transform(parse_failures.silver_send_failures).transform(tps.failure_metric_events)
    return stats_events.unionByName(failure_events)
