"""The limit policy: from anomalies to limit decisions (``gold/limits``, docs/contracts.md §2).

Three steps:

1. :func:`candidate_limits` (Spark-native): which resource should be limited in which window, to what, and why
   (retry storms on the group's retry traffic; surges only with a distressed broker, else advisory and never
   below the observed peak × headroom; protected resources never).
2. :func:`pipelines.transforms.fold.fold_resource` (pure Python, run per resource by
   :func:`pipelines.transforms.policy_fold.decide`): walks the resource's candidate windows and, under a limit,
   its demand evidence (:mod:`pipelines.transforms.demand`) in event-time order with its saved state and emits
   ``set`` / ``relax`` / ``lift`` decisions (hysteresis, cool-down, a maximum cut unless critical, refresh while
   the anomaly or the cap lasts, lift once the limit does nothing, surge probing; per-broker shares).
3. :func:`finish_decisions`: ``gold/limits`` rows with expiry, burst, basis and the event-time version.

Decisions depend only on event-time windows and saved state, never on how windows were cut into micro-batches,
so a replay or a restart produces the same decisions. ``decided_at``/``expires_at`` are processing times.
"""

from __future__ import annotations

import datetime as dt

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipelines import rocketmq as rmq
from pipelines.config import LimitsConfig
from pipelines.transforms.fold import (  # noqa: F401 (the decisions' vocabulary)
    ACTION_LIFT, ACTION_RELAX, ACTION_SET, BASIS_FINAL, BASIS_PRELIMINARY,
)
from pipelines.transforms.anomalies import Anomaly
from pipelines.transforms.reconcile import VERSION_RANK, decision_version
from pipelines.transforms.types import WINDOW_KEYS

# --- step 1: candidates (Spark) --------------------------------------------------------------------------------

#: Columns of a limit candidate (one per resource and window).
CANDIDATE_COLUMNS = (
    "resource_type", "resource", "window_end", "target_qps", "floor_qps", "lift_at_qps", "observed_tps",
    "critical", "mode", "reason", "baseline_tps",
)


def _not_protected(resource: Column, cfg: LimitsConfig) -> Column:
    return ~resource.isin(*cfg.protected) if cfg.protected else F.lit(True)


def _mode(resource: Column, cfg: LimitsConfig, advisory: Column | None = None) -> Column:
    """``advisory`` for a whole advisory deployment, a listed resource, or an advisory-only rule; else enforce."""
    forced = F.lit(cfg.mode == "advisory")
    if cfg.advisory_resources:
        forced = forced | resource.isin(*cfg.advisory_resources)
    if advisory is not None:
        forced = forced | advisory
    return F.when(forced, F.lit("advisory")).otherwise(F.lit("enforce"))


def _bounded(target: Column, cfg: LimitsConfig) -> Column:
    """Clamp a target to [min_limit_qps, max_limit_qps]; a null or NaN target becomes the floor."""
    safe = F.when(target.isNull() | F.isnan(target), F.lit(cfg.min_limit_qps)).otherwise(target)
    return F.least(F.greatest(safe, F.lit(cfg.min_limit_qps)), F.lit(cfg.max_limit_qps))


def candidate_limits(anomalies: DataFrame, topic_brokers: DataFrame, cfg: LimitsConfig) -> DataFrame:
    """gold/anomalies rows (+ which brokers carry which topic) → limit candidates (:data:`CANDIDATE_COLUMNS`).

    * ``RUNAWAY_RETRY`` → the group's retry traffic: target = ``allowed_retry_share`` × consume TPS (the
      anomaly's baseline); lifted once relaxed up to the consume TPS (retrying everything it consumes).
    * ``TRAFFIC_SURGE`` of a topic with a ``BROKER_BUSY`` broker carrying it in the same window → enforce:
      target = ``surge_headroom`` × the topic's baseline; lifted once relaxed up to the observed peak.
    * ``TRAFFIC_SURGE`` of a topic on healthy brokers → an advisory record only, never below the observed rate ×
      ``surge_headroom`` (``floor_qps``), so a legitimate surge is never cut.
    Retry and DLQ topics are governed through their group; protected resources get no candidate. Targets are
    finite, ≥ ``min_limit_qps`` and ≤ ``max_limit_qps``; at most one row per resource and window (lowest target).
    """
    retry = anomalies.where(F.col("anomaly") == Anomaly.RUNAWAY_RETRY.value)
    consume = F.coalesce(F.col("baseline_tps"), F.lit(0.0))
    group_candidates = retry.select(
        F.col("resource_type"),
        F.col("resource"),
        F.col("window_end"),
        _bounded(consume * cfg.allowed_retry_share, cfg).alias("target_qps"),
        F.lit(cfg.min_limit_qps).alias("floor_qps"),
        _bounded(consume, cfg).alias("lift_at_qps"),
        F.col("observed_tps"),
        (F.col("severity") == "critical").alias("critical"),
        _mode(F.col("resource"), cfg).alias("mode"),
        F.format_string(
            "RUNAWAY_RETRY: %s; retry traffic limited to %.0f%% of the group's consume rate",
            F.col("detail"),
            F.lit(cfg.allowed_retry_share * 100),
        ).alias("reason"),
        consume.alias("baseline_tps"),
    )

    busy = anomalies.where(F.col("anomaly") == Anomaly.BROKER_BUSY.value).select(
        *WINDOW_KEYS, F.col("resource").alias("broker")
    )
    surges = anomalies.where(
        (F.col("anomaly") == Anomaly.TRAFFIC_SURGE.value)
        & (F.col("resource_type") == "topic")
        & ~F.col("resource").startswith(rmq.RETRY_TOPIC_PREFIX)
        & ~F.col("resource").startswith(rmq.DLQ_TOPIC_PREFIX)
    )
    carried = surges.join(topic_brokers.withColumnRenamed("topic", "resource"), on=[*WINDOW_KEYS, "resource"], how="left")
    with_busy = carried.join(busy.withColumn("busy", F.lit(True)), on=[*WINDOW_KEYS, "broker"], how="left")
    per_surge = with_busy.groupBy(
        *WINDOW_KEYS, "resource_type", "resource", "observed_tps", "baseline_tps", "severity", "detail"
    ).agg(F.array_join(F.sort_array(F.collect_set(F.when(F.col("busy"), F.col("broker")))), ", ").alias("busy_brokers"))
    distressed = F.col("busy_brokers") != ""
    peak_floor = _bounded(F.col("observed_tps") * cfg.surge_headroom, cfg)
    topic_candidates = per_surge.select(
        F.col("resource_type"),
        F.col("resource"),
        F.col("window_end"),
        F.when(distressed, _bounded(F.col("baseline_tps") * cfg.surge_headroom, cfg)).otherwise(peak_floor).alias("target_qps"),
        F.when(distressed, F.lit(cfg.min_limit_qps)).otherwise(peak_floor).alias("floor_qps"),
        peak_floor.alias("lift_at_qps"),
        F.col("observed_tps"),
        (F.col("severity") == "critical").alias("critical"),
        _mode(F.col("resource"), cfg, ~distressed).alias("mode"),
        F.when(
            distressed,
            F.format_string(
                "TRAFFIC_SURGE on a distressed broker (%s busy): %s; limited to %.1fx baseline",
                F.col("busy_brokers"), F.col("detail"), F.lit(cfg.surge_headroom),
            ),
        ).otherwise(
            F.format_string(
                "TRAFFIC_SURGE on healthy brokers: %s; advisory only, at %.1fx the observed rate",
                F.col("detail"), F.lit(cfg.surge_headroom),
            )
        ).alias("reason"),
        F.col("baseline_tps"),
    )
    candidates = group_candidates.unionByName(topic_candidates).where(_not_protected(F.col("resource"), cfg))
    lowest = candidates.groupBy("resource_type", "resource", "window_end").agg(
        F.min_by(F.struct(*CANDIDATE_COLUMNS[3:]), F.col("target_qps")).alias("c")
    )
    return lowest.select("resource_type", "resource", "window_end", *[f"c.{name}" for name in CANDIDATE_COLUMNS[3:]])


# --- step 3: gold/limits rows ------------------------------------------------------------------------------


def burst_for(limit_qps: Column, cfg: LimitsConfig) -> Column:
    """Token-bucket burst for a limit: ``ceil(limit_qps × burst_seconds)``, at least 1."""
    return F.greatest(F.lit(1), F.ceil(limit_qps * F.lit(cfg.burst_seconds))).cast("long")


def finish_decisions(
    decisions: DataFrame, cfg: LimitsConfig, decided_at: dt.datetime, basis: str = BASIS_FINAL
) -> DataFrame:
    """Decision rows of the fold → ``gold/limits`` rows: adds ``decided_at`` (processing time, UTC),
    ``expires_at`` = decided_at + ``ttl_seconds``, ``burst``, ``basis`` and the event-time ``version``
    (:func:`decision_version`); the ``reason`` starts with ``[<basis>]`` (so does the control record's);
    ``broker_limits`` (each broker's share of ``limit_qps``, msg/s) is kept, null when empty."""
    decided = F.lit(decided_at).cast("timestamp")
    reason = F.concat(F.lit(f"[{basis}] "), F.col("reason"))
    return decisions.select(
        decided.alias("decided_at"),
        F.col("window_end"),
        F.col("resource_type"),
        F.col("resource"),
        F.col("limit_qps"),
        burst_for(F.col("limit_qps"), cfg).alias("burst"),
        F.col("previous_qps"),
        F.col("action"),
        F.col("mode"),
        (decided + F.make_dt_interval(secs=F.lit(cfg.ttl_seconds))).alias("expires_at"),
        reason.alias("reason"),
        decision_version(F.col("window_end"), VERSION_RANK[basis]).alias("version"),
        F.lit(basis).alias("basis"),
        F.when(F.size("broker_limits") > 0, F.col("broker_limits")).alias("broker_limits"),
    )
