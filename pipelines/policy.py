"""The limit policy: from anomalies to limit decisions (``gold/limits``, CONTRACTS.md §2).

Two steps:

1. :func:`candidate_limits` (Spark-native): which resource should be limited in which window, to what, and why.
   * A ``RUNAWAY_RETRY`` group gets a limit on its retry traffic (``CONSUMER_SEND_MSG_BACK``, the
     ``sendMsgBackLimitQps`` of article 001): ``allowed_retry_share`` × its consume TPS, at least ``min_limit_qps``.
   * A ``TRAFFIC_SURGE`` topic gets a limit only when a broker carrying it is ``BROKER_BUSY`` in the same window
     (a surge alone on healthy brokers stays an anomaly): ``surge_headroom`` × its baseline, at least
     ``min_limit_qps``. Retry and DLQ topics are governed through their group, never as topics.
   * Protected resources (``limits.protected``) never get a candidate.
2. :func:`fold_resource` (pure Python, run per resource by :func:`udfs.policy_fold.decide`): walks the resource's
   candidate windows in event-time order with its saved state and emits decisions:
   ``set`` when there is no limit or the target is lower by more than ``hysteresis_pct``; ``set`` again with the same
   limit (a refresh, new ``expires_at``) every ``refresh_seconds`` of event time while the anomaly lasts; ``lift``
   once no candidate was seen for ``recovery_windows`` windows.

Decisions depend only on event-time windows and saved state, never on how windows were cut into micro-batches,
so a replay or a restart produces the same decisions. ``decided_at``/``expires_at`` are processing times.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipelines import rocketmq as rmq
from pipelines.config import LimitsConfig

WINDOW_KEYS = ("window_start", "window_end")
ACTION_SET = "set"
ACTION_RELAX = "relax"
ACTION_LIFT = "lift"


# --- step 1: candidates (Spark) --------------------------------------------------------------------------------


def _not_protected(resource: Column, cfg: LimitsConfig) -> Column:
    return ~resource.isin(*cfg.protected) if cfg.protected else F.lit(True)


def candidate_limits(anomalies: DataFrame, topic_brokers: DataFrame, cfg: LimitsConfig) -> DataFrame:
    """gold/anomalies rows (+ which brokers carry which topic) → limit candidates.

    Output columns: ``resource_type``, ``resource``, ``window_end`` (timestamp), ``target_qps`` (double, msgs/s,
    finite and ≥ ``min_limit_qps``), ``reason`` (string), at most one row per resource and window (the lowest
    target wins).
    """
    floor = F.lit(cfg.min_limit_qps)
    retry = anomalies.where(F.col("anomaly") == "RUNAWAY_RETRY")
    retry_target = F.greatest(floor, F.coalesce(F.col("baseline_tps"), F.lit(0.0)) * cfg.allowed_retry_share)
    group_candidates = retry.select(
        F.col("resource_type"),
        F.col("resource"),
        F.col("window_end"),
        retry_target.alias("target_qps"),
        F.format_string(
            "RUNAWAY_RETRY: %s; retry traffic limited to %.0f%% of the group's consume rate",
            F.col("detail"),
            F.lit(cfg.allowed_retry_share * 100),
        ).alias("reason"),
    )

    busy = anomalies.where(F.col("anomaly") == "BROKER_BUSY").select(
        *WINDOW_KEYS, F.col("resource").alias("broker"), F.col("detail").alias("busy_detail")
    )
    surges = anomalies.where(
        (F.col("anomaly") == "TRAFFIC_SURGE")
        & (F.col("resource_type") == "topic")
        & ~F.col("resource").startswith(rmq.RETRY_TOPIC_PREFIX)
        & ~F.col("resource").startswith(rmq.DLQ_TOPIC_PREFIX)
    )
    distressed = (
        surges.join(topic_brokers.withColumnRenamed("topic", "resource"), on=[*WINDOW_KEYS, "resource"])
        .join(busy, on=[*WINDOW_KEYS, "broker"])
        .groupBy(*WINDOW_KEYS, "resource_type", "resource", "baseline_tps", "detail")
        .agg(F.array_join(F.sort_array(F.collect_set("broker")), ", ").alias("busy_brokers"))
    )
    surge_target = F.greatest(floor, F.coalesce(F.col("baseline_tps"), F.lit(0.0)) * cfg.surge_headroom)
    topic_candidates = distressed.select(
        F.col("resource_type"),
        F.col("resource"),
        F.col("window_end"),
        surge_target.alias("target_qps"),
        F.format_string(
            "TRAFFIC_SURGE on a distressed broker (%s busy): %s; limited to %.1fx baseline",
            F.col("busy_brokers"),
            F.col("detail"),
            F.lit(cfg.surge_headroom),
        ).alias("reason"),
    )
    candidates = group_candidates.unionByName(topic_candidates).where(_not_protected(F.col("resource"), cfg))
    lowest = candidates.groupBy("resource_type", "resource", "window_end").agg(
        F.min_by(F.struct("target_qps", "reason"), F.col("target_qps")).alias("c")
    )
    return lowest.select("resource_type", "resource", "window_end", "c.target_qps", "c.reason")


# --- step 2: the per-resource fold (pure Python) ---------------------------------------------------------------


@dataclass(frozen=True)
class ResourceState:
    """What the policy remembers about one resource between micro-batches (saved in ``state/policy``)."""

    resource_type: str
    resource: str
    limit_qps: float | None = None
    version: int = 0
    last_candidate_end: dt.datetime | None = None
    last_decision_end: dt.datetime | None = None


@dataclass(frozen=True)
class Candidate:
    window_end: dt.datetime
    target_qps: float
    reason: str


@dataclass(frozen=True)
class Decision:
    resource_type: str
    resource: str
    window_end: dt.datetime
    limit_qps: float
    previous_qps: float | None
    action: str
    reason: str
    version: int


def _tightened(current: float, target: float, hysteresis_pct: float) -> bool:
    """While the anomaly lasts a limit only moves down, and only by more than the hysteresis; it moves up
    through recovery (lift) once the anomaly has cleared, so noise in the observed rates never makes it flap."""
    return target < current * (1.0 - hysteresis_pct / 100.0)


def fold_resource(
    state: ResourceState,
    candidates: Iterable[Candidate],
    horizon_end: dt.datetime,
    cfg: LimitsConfig,
    window_seconds: int,
) -> tuple[list[Decision], ResourceState]:
    """Walk one resource's candidate windows (any order; sorted here) up to ``horizon_end`` (the end of the last
    finalized window) and return its decisions and new state.

    Raises:
        ValueError: a candidate's target is not a finite number > 0 (the candidate step guarantees it).
    """
    decisions: list[Decision] = []
    recovery = dt.timedelta(seconds=cfg.recovery_windows * window_seconds)
    refresh = dt.timedelta(seconds=cfg.refresh_seconds)

    def emit(window_end: dt.datetime, limit: float, action: str, reason: str) -> None:
        nonlocal state
        decisions.append(
            Decision(
                state.resource_type,
                state.resource,
                window_end,
                limit,
                state.limit_qps,
                action,
                reason,
                state.version + 1,
            )
        )
        state = replace(
            state,
            limit_qps=None if action == ACTION_LIFT else limit,
            version=state.version + 1,
            last_decision_end=window_end,
        )

    def lift_if_cleared(until: dt.datetime) -> None:
        if state.limit_qps is None or state.last_candidate_end is None:
            return
        lift_at = state.last_candidate_end + recovery
        if lift_at <= until:
            emit(
                lift_at,
                state.limit_qps,
                ACTION_LIFT,
                f"anomaly absent for {cfg.recovery_windows} windows since {state.last_candidate_end:%Y-%m-%dT%H:%M:%SZ}; "
                "limit lifted, brokers fall back to their defaults",
            )

    for cand in sorted(candidates, key=lambda c: c.window_end):
        if not (math.isfinite(cand.target_qps) and cand.target_qps > 0):
            raise ValueError(f"limit target for {state.resource} must be finite and > 0, got {cand.target_qps}")
        lift_if_cleared(cand.window_end - dt.timedelta(seconds=window_seconds))
        if state.limit_qps is None or _tightened(state.limit_qps, cand.target_qps, cfg.hysteresis_pct):
            emit(cand.window_end, cand.target_qps, ACTION_SET, cand.reason)
        elif state.last_decision_end is not None and cand.window_end - state.last_decision_end >= refresh:
            emit(cand.window_end, state.limit_qps, ACTION_SET, f"refresh (anomaly persists): {cand.reason}")
        state = replace(state, last_candidate_end=cand.window_end)
    lift_if_cleared(horizon_end)
    return decisions, state


def burst_for(limit_qps: Column, cfg: LimitsConfig) -> Column:
    """Token-bucket burst for a limit: ``ceil(limit_qps × burst_seconds)``, at least 1."""
    return F.greatest(F.lit(1), F.ceil(limit_qps * F.lit(cfg.burst_seconds))).cast("long")


def finish_decisions(decisions: DataFrame, cfg: LimitsConfig, decided_at: dt.datetime) -> DataFrame:
    """Decision rows of the fold → ``gold/limits`` rows: adds ``decided_at`` (processing time, UTC),
    ``expires_at`` = decided_at + ``ttl_seconds``, ``burst`` and ``mode``."""
    decided = F.lit(decided_at).cast("timestamp")
    return decisions.select(
        decided.alias("decided_at"),
        F.col("window_end"),
        F.col("resource_type"),
        F.col("resource"),
        F.col("limit_qps"),
        burst_for(F.col("limit_qps"), cfg).alias("burst"),
        F.col("previous_qps"),
        F.col("action"),
        F.lit(cfg.mode).alias("mode"),
        (decided + F.make_dt_interval(secs=F.lit(cfg.ttl_seconds))).alias("expires_at"),
        F.col("reason"),
        F.col("version"),
    )
