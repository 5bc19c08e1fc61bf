"""The limit policy: from anomalies to limit decisions (``gold/limits``, docs/contracts.md §2).

Two steps:

1. :func:`candidate_limits` (Spark-native): which resource should be limited in which window, to what, and why
   (retry storms on the group's retry traffic; surges only with a distressed broker, else advisory and never
   below the observed peak × headroom; protected resources never).
2. :func:`fold_resource` (pure Python, run per resource by :func:`pipelines.transforms.policy_fold.decide`): walks the resource's
   candidate windows in event-time order with its saved state and emits ``set`` / ``relax`` / ``lift`` decisions
   with hysteresis, cool-down, a maximum cut unless critical, refresh while the anomaly lasts, and NSQ-style
   recovery (article 003: ×1.5 per window, then lift).

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
from pipelines.transforms.types import WINDOW_KEYS

ACTION_SET = "set"
ACTION_RELAX = "relax"
ACTION_LIFT = "lift"
#: The basis of a decision: decided on an open window's partial evidence (fast path) or on a finalized window.
BASIS_PRELIMINARY = "preliminary"
BASIS_FINAL = "final"
#: Last digit of a decision's ``version`` by basis: the final decision (or the reversal) of a window outranks
#: the preliminary decision of the same window (see :func:`decision_version`).
VERSION_RANK = {BASIS_PRELIMINARY: 1, BASIS_FINAL: 5}
#: Rank of the final path's confirmation or reversal of a preliminary decision.
RECONCILE_RANK = 6


# --- step 1: candidates (Spark) --------------------------------------------------------------------------------

#: Columns of a limit candidate (one per resource and window).
CANDIDATE_COLUMNS = (
    "resource_type", "resource", "window_end", "target_qps", "floor_qps", "lift_at_qps", "observed_tps",
    "critical", "mode", "reason",
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
    retry = anomalies.where(F.col("anomaly") == "RUNAWAY_RETRY")
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
    )

    busy = anomalies.where(F.col("anomaly") == "BROKER_BUSY").select(
        *WINDOW_KEYS, F.col("resource").alias("broker")
    )
    surges = anomalies.where(
        (F.col("anomaly") == "TRAFFIC_SURGE")
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
    )
    candidates = group_candidates.unionByName(topic_candidates).where(_not_protected(F.col("resource"), cfg))
    lowest = candidates.groupBy("resource_type", "resource", "window_end").agg(
        F.min_by(F.struct(*CANDIDATE_COLUMNS[3:]), F.col("target_qps")).alias("c")
    )
    return lowest.select("resource_type", "resource", "window_end", *[f"c.{name}" for name in CANDIDATE_COLUMNS[3:]])


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
    last_change_end: dt.datetime | None = None
    lift_at_qps: float | None = None
    mode: str = "enforce"


@dataclass(frozen=True)
class Candidate:
    window_end: dt.datetime
    target_qps: float
    reason: str
    floor_qps: float = 0.0
    lift_at_qps: float | None = None
    observed_tps: float | None = None
    critical: bool = True
    mode: str = "enforce"


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
    mode: str = "enforce"


def fold_resource(
    state: ResourceState,
    candidates: Iterable[Candidate],
    horizon_end: dt.datetime,
    cfg: LimitsConfig,
    window_seconds: int,
    recover_windows: bool = True,
) -> tuple[list[Decision], ResourceState]:
    """Walk one resource's candidate windows (any order; sorted here) up to ``horizon_end`` (the end of the last
    finalized window) and return its decisions and new state.

    Rules, in order, for each candidate window:
      1. no limit yet → ``set``: the target, but a non-critical anomaly cuts at most ``max_cut_pct`` of the
         observed rate;
      2. the limit is below the candidate's floor (a growing legitimate surge) → ``set`` to the target;
      3. the target is lower than the limit by more than ``hysteresis_pct``, and the last change is at least
         ``cooldown_windows`` old (or the anomaly is critical) → ``set`` (non-critical: at most ``max_cut_pct``);
      4. else, ``refresh_seconds`` after the last decision → ``set`` with the same limit (new ``expires_at``).
    Between candidates and up to the horizon, recovery: ``recovery_windows`` windows after the last candidate the
    limit is raised ×``relax_factor`` per window (``relax``) and lifted (``lift``) once it reaches ``lift_at_qps``.
    Recovery needs windows known to be free of the anomaly, so the fast path (open windows) folds with
    ``recover_windows=False``. A candidate older than the last one seen (a final window behind a preliminary one)
    may tighten the limit but does not move ``last_candidate_end`` back.

    Raises:
        ValueError: a candidate's target is not a finite number > 0 (the candidate step guarantees it).
    """
    decisions: list[Decision] = []
    window = dt.timedelta(seconds=window_seconds)
    recovery = window * cfg.recovery_windows
    refresh = dt.timedelta(seconds=cfg.refresh_seconds)
    cooldown = window * cfg.cooldown_windows
    keep = 1.0 - cfg.max_cut_pct / 100.0

    def emit(window_end: dt.datetime, limit: float, action: str, reason: str, mode: str, change: bool = True) -> None:
        nonlocal state
        decisions.append(
            Decision(state.resource_type, state.resource, window_end, limit, state.limit_qps, action, reason,
                     state.version + 1, mode)
        )
        state = replace(
            state,
            limit_qps=None if action == ACTION_LIFT else limit,
            version=state.version + 1,
            last_decision_end=window_end,
            last_change_end=window_end if change else state.last_change_end,
            mode=mode,
            lift_at_qps=None if action == ACTION_LIFT else state.lift_at_qps,
        )

    def recover(until: dt.datetime) -> None:
        if not recover_windows or state.limit_qps is None or state.last_candidate_end is None:
            return
        step_at = max(state.last_candidate_end + recovery, (state.last_decision_end or state.last_candidate_end) + window)
        while state.limit_qps is not None and step_at <= until:
            raised = state.limit_qps * cfg.relax_factor
            if state.lift_at_qps is None or raised >= state.lift_at_qps:
                emit(step_at, state.limit_qps, ACTION_LIFT,
                     f"anomaly absent since {state.last_candidate_end:%Y-%m-%dT%H:%M:%SZ}; limit reached the normal "
                     "rate and is lifted, brokers fall back to their defaults", state.mode)
            else:
                emit(step_at, raised, ACTION_RELAX,
                     f"anomaly absent since {state.last_candidate_end:%Y-%m-%dT%H:%M:%SZ}; recovery x{cfg.relax_factor} "
                     f"per window towards {state.lift_at_qps:.1f} msg/s", state.mode)
            step_at += window

    for cand in sorted(candidates, key=lambda c: c.window_end):
        if not (math.isfinite(cand.target_qps) and cand.target_qps > 0):
            raise ValueError(f"limit target for {state.resource} must be finite and > 0, got {cand.target_qps}")
        recover(cand.window_end - window)
        current = state.limit_qps
        if current is None:
            start = cand.target_qps
            if not cand.critical and cand.observed_tps:
                start = max(start, cand.observed_tps * keep)
            emit(cand.window_end, start, ACTION_SET, cand.reason, cand.mode)
        elif current < cand.floor_qps:
            emit(cand.window_end, cand.target_qps, ACTION_SET, cand.reason, cand.mode)
        elif cand.target_qps < current * (1.0 - cfg.hysteresis_pct / 100.0) and (
            cand.critical or state.last_change_end is None or cand.window_end - state.last_change_end >= cooldown
        ):
            tighter = cand.target_qps if cand.critical else max(cand.target_qps, current * keep)
            emit(cand.window_end, tighter, ACTION_SET, cand.reason, cand.mode)
        elif state.last_decision_end is not None and cand.window_end - state.last_decision_end >= refresh:
            emit(cand.window_end, current, ACTION_SET, f"refresh (anomaly persists): {cand.reason}", state.mode,
                 change=False)
        lift_at = max(x for x in (state.lift_at_qps, cand.lift_at_qps, 0.0) if x is not None)
        last_seen = max(cand.window_end, state.last_candidate_end or cand.window_end)
        state = replace(state, last_candidate_end=last_seen, lift_at_qps=lift_at or None)
    recover(horizon_end)
    return decisions, state


def burst_for(limit_qps: Column, cfg: LimitsConfig) -> Column:
    """Token-bucket burst for a limit: ``ceil(limit_qps × burst_seconds)``, at least 1."""
    return F.greatest(F.lit(1), F.ceil(limit_qps * F.lit(cfg.burst_seconds))).cast("long")


def decision_version(window_end: Column, rank: Column | int) -> Column:
    """The ``version`` of a decision: ``unix seconds of window_end × 10 + rank`` (:data:`VERSION_RANK`).

    Built from event time, versions grow per resource across restarts and across lakes (a new lake after a
    checkpoint change continues above the old one), so brokers that refuse a stale version (``control/applier.py``)
    keep accepting a new governor's records; a window's final decision outranks its preliminary one.
    """
    rank_col = rank if isinstance(rank, Column) else F.lit(rank)
    return (F.unix_timestamp(window_end).cast("long") * 10 + rank_col).cast("long")


def finish_decisions(
    decisions: DataFrame, cfg: LimitsConfig, decided_at: dt.datetime, basis: str = BASIS_FINAL
) -> DataFrame:
    """Decision rows of the fold → ``gold/limits`` rows: adds ``decided_at`` (processing time, UTC),
    ``expires_at`` = decided_at + ``ttl_seconds``, ``burst``, ``basis`` and the event-time ``version``
    (:func:`decision_version`); the ``reason`` starts with ``[<basis>]`` (so does the control record's)."""
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
    )
