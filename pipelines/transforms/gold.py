"""The gold decisions of one micro-batch as a pure function: finalized windows, history, saved policy state,
config and ``now`` → the DataFrames of every gold output.

Steps (each a module of :mod:`pipelines.transforms`):

1. TPS per topic, consumer group and broker (:mod:`~pipelines.transforms.tps`);
2. anomalies against the resources' own baselines (:mod:`~pipelines.transforms.detect`);
3. limit candidates (:func:`pipelines.transforms.policy.candidate_limits`), the demand evidence of limitable
   resources (:mod:`pipelines.transforms.demand`: what each broker admitted and its limiter rejected) and the
   per-resource policy fold (:func:`pipelines.transforms.policy_fold.decide`), which judges a resource under a
   limit on that evidence (closed loop, :mod:`pipelines.transforms.fold`);
4. ``gold/limits`` rows (:func:`pipelines.transforms.policy.finish_decisions`, basis ``final``), split by the
   ``gold/limits`` expectations into accepted decisions and quarantine rows;
5. the preliminary decisions of the fast path on windows now final are confirmed, corrected or reversed
   (:func:`reconcile_preliminary`), so the limits in force once every window is final do not depend on how the
   input was cut into micro-batches.

Example:
    >>> check = lambda d: gate.check_limits(d, origin="rate-governor-gold:7", at=now)
    >>> out = gold_outputs(GoldInputs(metrics, topic_hist, broker_hist, state, latest_limits), cfg, now,
    ...                    check=check, batch_id=7, first_window=lo, horizon_end=hi)
    >>> out.tables()[tables.GOLD_LIMITS].show()
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from pipelines.io import tables
from pipelines.schemas import RESOURCE_KEYS
from pipelines.config import GovernorConfig
from pipelines.transforms import demand, detect, policy, policy_fold, tps
from pipelines.transforms.fold import ANY_BROKER, BOUND
from pipelines.transforms.types import Transform

#: Decisions → (accepted, quarantine rows): the ``gold/limits`` expectations (the quality gate's ``check_limits``).
LimitsCheck = Callable[[DataFrame], tuple[DataFrame, DataFrame]]


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
    newest_first = Window.partitionBy(*RESOURCE_KEYS).orderBy(F.col("batch_id").desc())
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
        latest_limits: the newest ``gold/limits`` row per resource
            (:func:`pipelines.io.publish.latest_per_resource`), for :func:`reconcile_preliminary`.
        limiter_rejections: ``control/limiter_rejections`` rows of the batch's windows (demand evidence,
            :func:`pipelines.transforms.demand.limiter_traffic`); None when there are none.
    """

    metrics: DataFrame
    topic_history: DataFrame
    broker_history: DataFrame
    policy_state: DataFrame
    latest_limits: DataFrame
    limiter_rejections: DataFrame | None = None


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
            tables.GOLD_TOPIC_TPS: self.topic_tps,
            tables.GOLD_GROUP_TPS: self.group_tps,
            tables.GOLD_BROKER_TPS: self.broker_tps,
            tables.GOLD_ANOMALIES: self.anomalies,
            tables.GOLD_LIMITS: self.limits,
            tables.QUARANTINE: self.refused,
            tables.STATE_POLICY: self.state,
        }


def window_bounds(metrics: DataFrame) -> tuple[dt.datetime | None, dt.datetime | None]:
    """(first ``window_start``, last ``window_end``) of WINDOW_METRIC rows (UTC), (None, None) when empty."""
    bounds = metrics.agg(F.min("window_start").alias("lo"), F.max("window_end").alias("hi")).first()
    return (None, None) if bounds is None else (bounds["lo"], bounds["hi"])


def baseline_since(first_window: dt.datetime, cfg: GovernorConfig) -> dt.datetime:
    """Start of the history a batch starting at ``first_window`` needs for its baselines (UTC)."""
    return first_window - dt.timedelta(seconds=cfg.detection.baseline_windows * cfg.windows.length_seconds)


@dataclass
class Decided:
    """The fold's outputs of one micro-batch: ``gold/limits`` rows, refused quarantine rows, new ``state/policy``
    rows (tagged ``batch_id``) and the demand evidence of the windows under an enforced limit (POLICY_FOLD
    ``evidence`` rows)."""

    limits: DataFrame
    refused: DataFrame
    state: DataFrame
    evidence: DataFrame


def decisions(
    anomalies: DataFrame,
    topic_brokers: DataFrame,
    demand_rows: DataFrame,
    policy_state: DataFrame,
    horizon_end: dt.datetime,
    cfg: GovernorConfig,
    now: dt.datetime,
    check: LimitsCheck,
    batch_id: int,
) -> Decided:
    """Anomalies and demand evidence → :class:`Decided`.

    ``demand_rows``: :func:`pipelines.transforms.demand.demand` of the batch's windows (the per-broker traffic of
    candidates, the observations of limited resources). ``check`` splits decisions into (accepted, quarantine rows)
    by the ``gold/limits`` expectations (:meth:`pipelines.quality.gate.QualityGate.check_limits`).
    """
    limits_cfg = cfg.limits
    candidates = demand.with_broker_tps(policy.candidate_limits(anomalies, topic_brokers, limits_cfg), demand_rows)
    observed = policy_state.where(F.col("limit_qps").isNotNull()).select(*RESOURCE_KEYS).unionByName(
        candidates.select(*RESOURCE_KEYS))
    folded = policy_fold.decide(candidates, policy_state, horizon_end, limits_cfg, cfg.windows.length_seconds,
                                observations=demand.observations(demand_rows, observed))
    accepted, refused = check(policy.finish_decisions(folded.where(F.col("row_kind") == "decision"), limits_cfg, now))
    state = folded.where(F.col("row_kind") == "state").select("*", F.lit(batch_id).cast("long").alias("batch_id"))
    return Decided(accepted, refused, state, folded.where(F.col("row_kind") == "evidence"))


def bound_anomalies(evidence: DataFrame, windows_cfg) -> DataFrame:
    """Evidence rows of windows where no rule fired but the resource ran at its cap or its limiter rejected sends
    → ``gold/anomalies`` rows: the anomaly that set the limit persists (``RUNAWAY_RETRY`` for a group's retry
    traffic, ``TRAFFIC_SURGE`` for a topic), ``observed_tps`` the admitted rate, ``baseline_tps`` the limit,
    ``detail`` "limit-bound: 38.2 of 40.2 msg/s[, rejecting (n sends rejected by the limiter)]"."""
    kind = F.when(F.col("resource_type") == "group", F.lit("RUNAWAY_RETRY")).otherwise(F.lit("TRAFFIC_SURGE"))
    bound = evidence.where((F.col("status") == BOUND) & ~F.col("rule_fired"))
    return bound.select(
        (F.col("window_end") - F.make_dt_interval(secs=F.lit(windows_cfg.length_seconds))).alias("window_start"),
        "window_end", "resource_type", "resource", kind.alias("anomaly"), "observed_tps",
        F.col("limit_qps").alias("baseline_tps"), F.lit("warning").alias("severity"),
        F.concat(F.col("resource"), F.lit(": "), F.col("reason")).alias("detail"),
    )


def with_limit_in_force(topics: DataFrame, evidence: DataFrame) -> DataFrame:
    """``gold/topic_tps`` rows → the same with ``limit_qps``: the topic's enforced cluster-wide limit in force in
    the window (from the fold's evidence rows), null when none (such windows are left out of surge baselines)."""
    limited = evidence.where(F.col("resource_type") == "topic").select(
        "window_end", F.col("resource").alias("topic"), F.col("limit_qps").alias("_limit"))
    joined = topics.join(limited, ["window_end", "topic"], "left")
    return joined.select(*[F.col("_limit").alias(c) if c == "limit_qps" else F.col(c) for c in topics.columns])


def reconcile_preliminary(
    latest_limits: DataFrame,
    final_limits: DataFrame,
    final_state: DataFrame,
    horizon_end: dt.datetime,
    cfg: GovernorConfig,
    now: dt.datetime,
) -> DataFrame:
    """The final path's answer to preliminary decisions on windows that are now final → ``gold/limits`` rows.

    For each resource whose newest decision is a preliminary ``set`` of a window ending at or before
    ``horizon_end`` (UTC) and that this batch did not decide again (no final row of that window or later):

    * the final policy state has no limit for it (the final window did not confirm the anomaly) → ``lift``:
      the preliminary limit is reversed, with its own reason;
    * the final state's limit differs → ``set`` to the final limit (the partial evidence gave another number);
    * the same limit → confirmed, no row.

    Rows are basis ``final``, ``version`` :func:`~pipelines.transforms.policy.decision_version` of the preliminary
    window with rank :data:`~pipelines.transforms.policy.RECONCILE_RANK` (above the window's preliminary version).

    Args:
        final_state: POLICY_STATE rows (without ``batch_id``) after this batch's fold, one per resource.
    """
    keys = ["resource_type", "resource"]
    prelim = latest_limits.where(
        (F.col("basis") == policy.BASIS_PRELIMINARY) & (F.col("action") == policy.ACTION_SET)
        & (F.col("window_end") <= F.lit(horizon_end))
    )
    decided_again = prelim.alias("p").join(
        final_limits.alias("f"),
        (F.col("p.resource_type") == F.col("f.resource_type")) & (F.col("p.resource") == F.col("f.resource"))
        & (F.col("f.window_end") >= F.col("p.window_end")),
        "left_semi",
    )
    pending = prelim.join(decided_again.select(*keys), keys, "left_anti")
    joined = pending.join(final_state.select(*keys, F.col("limit_qps").alias("final_qps"),
                                             F.col("broker_shares").alias("final_shares")), keys, "left")
    final_qps = F.col("final_qps")
    final_split = _split(final_qps, F.col("final_shares"))
    split_differs = ~F.coalesce(_same_figures(F.col("broker_limits"), final_split), F.lit(False))
    differs = final_qps.isNull() | (F.abs(final_qps - F.col("limit_qps")) > F.lit(1e-9) * F.abs(final_qps)) \
        | split_differs
    window_text = F.date_format(F.col("window_end"), "yyyy-MM-dd'T'HH:mm:ss'Z'")
    lifted = final_qps.isNull()
    reason = F.when(
        lifted,
        F.format_string("[final] the final window ending %s did not confirm the preliminary limit of %.1f msg/s; "
                        "reversed, brokers fall back to their defaults", window_text, F.col("limit_qps")),
    ).otherwise(
        F.format_string("[final] the final window ending %s sets %.1f msg/s where the preliminary decision on "
                        "partial evidence set %.1f msg/s", window_text, final_qps, F.col("limit_qps")),
    )
    limit = F.when(lifted, F.col("limit_qps")).otherwise(final_qps)
    decided = F.lit(now).cast("timestamp")
    reason = F.when(~lifted & split_differs & (F.abs(final_qps - F.col("limit_qps")) <= F.lit(1e-9) * F.abs(final_qps)),
                    F.format_string("[final] the final window ending %s splits the %.1f msg/s limit over its brokers by "
                                    "their complete traffic (the preliminary split saw part of the window)",
                                    window_text, final_qps)).otherwise(reason)
    return joined.where(differs).select(
        decided.alias("decided_at"),
        F.col("window_end"),
        *keys,
        limit.alias("limit_qps"),
        policy.burst_for(limit, cfg.limits).alias("burst"),
        F.col("limit_qps").alias("previous_qps"),
        F.when(lifted, F.lit(policy.ACTION_LIFT)).otherwise(F.lit(policy.ACTION_SET)).alias("action"),
        F.col("mode"),
        (decided + F.make_dt_interval(secs=F.lit(cfg.limits.ttl_seconds))).alias("expires_at"),
        reason.alias("reason"),
        policy.decision_version(F.col("window_end"), policy.RECONCILE_RANK).alias("version"),
        F.lit(policy.BASIS_FINAL).alias("basis"),
        F.when(~lifted, final_split).alias("broker_limits"),
    )


def _split(limit: Column, shares: Column) -> Column:
    """A limit split by frozen shares, as :func:`pipelines.transforms.fold.broker_limits` does (the ``"*"`` entry
    at the smallest share); null without shares."""
    split = F.transform_values(shares, lambda _, share: limit * share)
    with_any = F.map_concat(split, F.create_map(F.lit(ANY_BROKER), F.array_min(F.map_values(split))))
    return F.when(F.size(shares) > 0, with_any)


def _same_figures(a: Column, b: Column) -> Column:
    """Two per-broker maps with the same brokers and figures within 1e-9 relative (null = no split)."""
    both_null = a.isNull() & b.isNull()
    keys_equal = F.array_sort(F.map_keys(a)) == F.array_sort(F.map_keys(b))
    close = F.forall(F.map_keys(a), lambda k: F.abs(a[k] - b[k]) <= F.lit(1e-9) * F.abs(b[k]))
    return both_null | (a.isNotNull() & b.isNotNull() & keys_equal & close)


def state_after(saved: DataFrame, folded_state: DataFrame) -> DataFrame:
    """The policy state per resource after a fold: the fold's state rows where it ran, else the saved rows."""
    keys = ["resource_type", "resource"]
    untouched = saved.join(folded_state.select(*keys), keys, "left_anti")
    return folded_state.select(*saved.columns).unionByName(untouched)


def gold_outputs(
    inputs: GoldInputs,
    cfg: GovernorConfig,
    now: dt.datetime,
    *,
    check: LimitsCheck,
    batch_id: int,
    first_window: dt.datetime,
    horizon_end: dt.datetime,
) -> GoldOutputs:
    """One micro-batch of finalized windows → every gold output.

    Args:
        inputs: the batch's windows, history and saved policy state (:class:`GoldInputs`).
        now: processing time of the decisions (UTC): ``decided_at``, ``expires_at`` = now + ``limits.ttl_seconds``.
        check: see :func:`decisions`.
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
    traffic = demand.resource_traffic(metrics, windows)
    if inputs.limiter_rejections is not None:
        batch_windows = metrics.select("window_start").distinct()
        traffic = traffic.unionByName(demand.limiter_traffic(inputs.limiter_rejections, windows)
                                      .join(batch_windows, "window_start", "left_semi"))
    demand_rows = demand.demand(traffic, brokers, cfg.detection).transform(single)
    decided = decisions(
        anomalies, tps.topic_brokers(metrics), demand_rows, inputs.policy_state, horizon_end, cfg, now, check,
        batch_id,
    )
    limits = decided.limits.persist()
    state = decided.state.persist()
    evidence = decided.evidence.persist()
    reconciled = reconcile_preliminary(
        inputs.latest_limits, limits, state_after(inputs.policy_state, state.drop("batch_id")), horizon_end, cfg, now
    )
    return GoldOutputs(with_limit_in_force(topics, evidence), groups, brokers,
                       anomalies.unionByName(bound_anomalies(evidence, windows)), limits.unionByName(reconciled),
                       decided.refused, state)
