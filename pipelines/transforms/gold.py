"""The gold decisions of one micro-batch as a pure function: finalized windows, history, saved policy state,
config and ``now`` → the DataFrames of every gold output.

Steps (each a module of :mod:`pipelines.transforms`):

1. TPS per topic, consumer group and broker (:mod:`~pipelines.transforms.tps`);
2. anomalies against the resources' own baselines (:mod:`~pipelines.transforms.detect`);
3. limit candidates (:func:`pipelines.transforms.policy.candidate_limits`) and the per-resource policy fold
   (:func:`pipelines.transforms.policy_fold.decide`);
4. ``gold/limits`` rows (:func:`pipelines.transforms.policy.finish_decisions`), split by the ``gold/limits``
   expectations into accepted decisions and quarantine rows.

Example:
    >>> out = gold_outputs(GoldInputs(metrics, topic_history, broker_history, policy_state), cfg, now,
    ...                    limits_check=failed_expectation(gold_limits_suite()), origin="rate-governor-gold:7")
    >>> out.tables()["gold/limits"].show()
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from pipelines.config import GovernorConfig
from pipelines.transforms import detect, policy, policy_fold, tps
from pipelines.transforms.types import Transform


def partitioning(single: bool) -> Transform:
    """With ``single`` (``spark.gold_single_partition``, the embedded default), a gold-side DataFrame in one
    partition.

    The gold side works on windows, not records (hundreds to about 10^5 rows per micro-batch). One partition
    satisfies the distribution that an aggregation or a window function requires, so Spark plans no shuffle there
    (joins and unions of several inputs still shuffle); at micro-batch sizes each shuffle costs a Spark job. With
    thousands of topics on a cluster, turn it off to spread the windows over the executors.
    """

    def transform(df: DataFrame) -> DataFrame:
        return df.coalesce(1) if single else df

    return transform


def latest_state(saved: DataFrame, before_batch: int | None = None) -> DataFrame:
    """``state/policy`` rows → the saved state per resource (:data:`~pipelines.schemas.POLICY_STATE` without
    ``batch_id``): the newest row per resource, of batches before ``before_batch`` when given (so that a replayed
    micro-batch starts from the state its first run started from)."""
    if before_batch is not None:
        saved = saved.where(F.col("batch_id") < before_batch)
    newest_first = Window.partitionBy("resource_type", "resource").orderBy(F.col("batch_id").desc())
    return (
        saved.select("*", F.row_number().over(newest_first).alias("_rank"))
        .where(F.col("_rank") == 1)
        .drop("_rank", "batch_id")
    )


@dataclass(frozen=True)
class GoldInputs:
    """What the gold decisions read.

    Attributes:
        metrics: :data:`~pipelines.schemas.WINDOW_METRIC` rows of the windows to decide on.
        topic_history, broker_history: earlier ``gold/topic_tps`` / ``gold/broker_tps`` rows (baselines).
        policy_state: the saved policy state per resource (:func:`latest_state`).
    """

    metrics: DataFrame
    topic_history: DataFrame
    broker_history: DataFrame
    policy_state: DataFrame


@dataclass
class GoldOutputs:
    """The DataFrames of one gold micro-batch, by table."""

    topic_tps: DataFrame
    group_tps: DataFrame
    broker_tps: DataFrame
    anomalies: DataFrame
    limits: DataFrame
    refused: DataFrame
    state: DataFrame

    def tables(self) -> dict[str, DataFrame]:
        """Table name → rows to append, in the order the final path writes them."""
        return {
            "gold/topic_tps": self.topic_tps,
            "gold/group_tps": self.group_tps,
            "gold/broker_tps": self.broker_tps,
            "gold/anomalies": self.anomalies,
            "gold/limits": self.limits,
            "quarantine": self.refused,
            "state/policy": self.state,
        }


def window_bounds(metrics: DataFrame) -> tuple[dt.datetime | None, dt.datetime | None]:
    """(first ``window_start``, last ``window_end``) of WINDOW_METRIC rows (UTC), (None, None) when empty."""
    bounds = metrics.agg(F.min("window_start").alias("lo"), F.max("window_end").alias("hi")).first()
    return (None, None) if bounds is None else (bounds["lo"], bounds["hi"])


def baseline_since(first_window: dt.datetime, cfg: GovernorConfig) -> dt.datetime:
    """Start of the history a batch starting at ``first_window`` needs for its baselines (UTC)."""
    return first_window - dt.timedelta(seconds=cfg.detection.baseline_windows * cfg.windows.length_seconds)


def refused_rows(checked: DataFrame, origin: str, now: dt.datetime) -> DataFrame:
    """``gold/limits`` rows that failed an expectation (``reject_reason`` set) → ``quarantine`` rows."""
    return checked.where(F.col("reject_reason").isNotNull()).select(
        F.lit("gold/limits").alias("source"),
        F.to_json(F.struct(*[c for c in checked.columns if c != "reject_reason"])).alias("raw"),
        F.col("reject_reason").alias("reason"),
        F.lit(origin).alias("origin"),
        F.lit(now).cast("timestamp").alias("ingested_at"),
    )


def decisions(
    anomalies: DataFrame,
    topic_brokers: DataFrame,
    policy_state: DataFrame,
    horizon_end: dt.datetime,
    cfg: GovernorConfig,
    now: dt.datetime,
    limits_check: Column,
    origin: str,
    batch_id: int,
) -> tuple[DataFrame, DataFrame, DataFrame]:
    """Anomalies → (``gold/limits`` rows, refused quarantine rows, new ``state/policy`` rows tagged ``batch_id``).

    ``limits_check`` is a Column naming the first failed ``gold/limits`` expectation, null when all pass
    (:func:`pipelines.quality.gate.failed_expectation`).
    """
    limits_cfg = cfg.limits
    candidates = policy.candidate_limits(anomalies, topic_brokers, limits_cfg)
    folded = policy_fold.decide(candidates, policy_state, horizon_end, limits_cfg, cfg.windows.length_seconds)
    checked = policy.finish_decisions(folded.where(F.col("row_kind") == "decision"), limits_cfg, now).withColumn(
        "reject_reason", limits_check
    )
    accepted = checked.where(F.col("reject_reason").isNull()).drop("reject_reason")
    state = folded.where(F.col("row_kind") == "state").select("*", F.lit(batch_id).cast("long").alias("batch_id"))
    return accepted, refused_rows(checked, origin, now), state


def gold_outputs(
    inputs: GoldInputs,
    cfg: GovernorConfig,
    now: dt.datetime,
    *,
    limits_check: Column,
    origin: str,
    batch_id: int,
    first_window: dt.datetime,
    horizon_end: dt.datetime,
) -> GoldOutputs:
    """One micro-batch of finalized windows → every gold output.

    Args:
        inputs: the batch's windows, history and saved policy state (:class:`GoldInputs`).
        now: processing time of the decisions (UTC): ``decided_at``, ``expires_at`` = now + ``limits.ttl_seconds``.
        limits_check: see :func:`decisions`.
        origin: ``origin`` of quarantine rows, e.g. ``rate-governor-gold:<batch_id>``.
        first_window: the batch's first ``window_start``; horizon_end: its last ``window_end`` (UTC).
    Returns:
        :class:`GoldOutputs` (lazy DataFrames; the caller persists what it reuses).
    """
    windows = cfg.windows
    single = partitioning(cfg.spark.gold_single_partition)
    metrics = inputs.metrics
    topics = metrics.transform(tps.topic_tps(windows)).persist()
    groups = metrics.transform(tps.group_tps(windows)).persist()
    brokers = metrics.transform(tps.broker_tps(windows)).persist()
    anomalies = detect.detect_anomalies(
        topics, groups, brokers,
        inputs.topic_history.transform(single), inputs.broker_history.transform(single),
        windows, cfg.detection, first_window=first_window,
    ).transform(single).persist()
    limits, refused, state = decisions(
        anomalies, tps.topic_brokers(metrics), inputs.policy_state, horizon_end, cfg, now, limits_check, origin,
        batch_id,
    )
    return GoldOutputs(topics, groups, brokers, anomalies, limits, refused, state)
