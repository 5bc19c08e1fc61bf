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
   (:func:`pipelines.transforms.reconcile.reconcile_preliminary`), so the limits in force once every window is final do not depend on how the
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

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from pipelines.io import tables
from pipelines.schemas import RESOURCE_KEYS
from pipelines.config import GovernorConfig
from pipelines.transforms import demand, detect, policy, policy_fold, reconcile, tps
from pipelines.transforms.anomalies import limited_by
from pipelines.transforms.fold import BOUND, HOLD, VETO
from pipelines.transforms.policy_fold import OpenEvidence
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


def collected_leaf(df: DataFrame) -> DataFrame:
    """A small intermediate result (anomalies, limit candidates: at most a few rows per resource and window) → the
    same rows as a leaf DataFrame: computed now by one Spark job, collected through Arrow and handed back to Spark
    (a ``LocalRelation``).

    The plans built on it then carry none of its lineage. Spark analyses and optimizes every plan whole, and the
    fold's input refers to the candidates three times, each with the anomaly detection under it; caching does not
    shorten those plans (a cached plan is swapped in only after analysis). Measured: fewer stages per gold
    micro-batch and a shorter fold (docs/performance.md). The rows pass through the driver, as the fold's input does
    anyway (:func:`pipelines.transforms.policy_fold.decide`). Not :func:`pipelines.transforms.parse.settled`,
    which is an optimizer barrier inside one plan.
    """
    return df.sparkSession.createDataFrame(df.toArrow(), schema=df.schema)


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
            (:func:`pipelines.io.publish.latest_per_resource`), for :func:`pipelines.transforms.reconcile.reconcile_preliminary`.
        limiter_rejections: ``control/limiter_rejections`` rows of the batch's windows (demand evidence,
            :func:`pipelines.transforms.demand.limiter_traffic`); None when there are none.
        open_evidence: what the fast path's open windows after the batch show of resources under a limit (the
            lift veto, :func:`pipelines.transforms.fold.fold_resource`); None without a fast path.
    """

    metrics: DataFrame
    topic_history: DataFrame
    broker_history: DataFrame
    policy_state: DataFrame
    latest_limits: DataFrame
    limiter_rejections: DataFrame | None = None
    open_evidence: OpenEvidence | None = None


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
    #: The DataFrames cached while building the outputs, unpersisted by the flow once written
    #: (:func:`pipelines.flows.base.release`): a continuous job would otherwise keep every micro-batch's cached plans
    #: registered on the driver until its heap runs out.
    cached: tuple[DataFrame, ...] = ()

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
    open_evidence: OpenEvidence | None = None,
) -> Decided:
    """Anomalies and demand evidence → :class:`Decided`.

    ``demand_rows``: :func:`pipelines.transforms.demand.demand` of the batch's windows (the per-broker traffic of
    candidates, the observations of limited resources). ``check`` splits decisions into (accepted, quarantine rows)
    by the ``gold/limits`` expectations (:meth:`pipelines.quality.gate.QualityGate.check_limits`).
    """
    limits_cfg = cfg.limits
    candidates = demand.with_broker_tps(policy.candidate_limits(anomalies, topic_brokers, limits_cfg),
                                        demand_rows).transform(collected_leaf)
    observed = policy_state.where(F.col("limit_qps").isNotNull()).select(*RESOURCE_KEYS).unionByName(
        candidates.select(*RESOURCE_KEYS))
    folded = policy_fold.decide(candidates, policy_state, horizon_end, limits_cfg, cfg.windows.length_seconds,
                                observations=demand.observations(demand_rows, observed), detection=cfg.detection,
                                open_evidence=open_evidence)
    accepted, refused = check(policy.finish_decisions(folded.where(F.col("row_kind") == "decision"), limits_cfg, now))
    state = folded.where(F.col("row_kind") == "state").select("*", F.lit(batch_id).cast("long").alias("batch_id"))
    return Decided(accepted, refused, state, folded.where(F.col("row_kind") == "evidence"))


def bound_anomalies(evidence: DataFrame, windows_cfg) -> DataFrame:
    """Evidence rows of windows where no detection rule fired but the cause persists under the limit (the resource
    ran at its cap or its limiter rejected sends: ``bound``; or its visible demand still fires the rule: ``hold``)
    → ``gold/anomalies`` rows: the anomaly that set the limit persists (``RUNAWAY_RETRY`` for a group's retry
    traffic, ``TRAFFIC_SURGE`` for a topic), ``observed_tps`` the admitted rate, ``baseline_tps`` the limit,
    ``detail`` "limit-bound: 38.2 of 40.2 msg/s[, rejecting (n sends rejected by the limiter)]" or "visible demand
    fires the rule: …"."""
    kind = F.when(F.col("resource_type") == "group", F.lit(limited_by("group").value)).otherwise(
        F.lit(limited_by("topic").value))
    bound = evidence.where(F.col("status").isin(BOUND, HOLD) & ~F.col("rule_fired"))
    return bound.select(
        (F.col("window_end") - F.make_dt_interval(secs=F.lit(windows_cfg.length_seconds))).alias("window_start"),
        "window_end", "resource_type", "resource", kind.alias("anomaly"), "observed_tps",
        F.col("limit_qps").alias("baseline_tps"), F.lit("warning").alias("severity"),
        F.concat(F.col("resource"), F.lit(": "), F.col("reason")).alias("detail"),
    )


def with_limit_in_force(topics: DataFrame, evidence: DataFrame) -> DataFrame:
    """``gold/topic_tps`` rows → the same with ``limit_qps``: the topic's enforced cluster-wide limit in force in
    the window (from the fold's evidence rows), null when none (such windows are left out of surge baselines)."""
    limited = evidence.where((F.col("resource_type") == "topic") & (F.col("status") != VETO)).select(
        "window_end", F.col("resource").alias("topic"), F.col("limit_qps").alias("_limit"))
    joined = topics.join(limited, ["window_end", "topic"], "left")
    return joined.select(*[F.col("_limit").alias(c) if c == "limit_qps" else F.col(c) for c in topics.columns])


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
        inputs: the batch's windows, history and saved policy state (:class:`GoldInputs`). The windows may come in
            any partitioning (the flow caches them in the stateful aggregation's own); they are read in one
            partition with ``spark.gold_single_partition``.
        now: processing time of the decisions (UTC): ``decided_at``, ``expires_at`` = now + ``limits.ttl_seconds``.
        check: see :func:`decisions`.
        first_window: the batch's first ``window_start``; horizon_end: its last ``window_end`` (UTC).
    Returns:
        :class:`GoldOutputs`: lazy DataFrames over cached intermediates (the caller releases ``cached`` once they
        are written). Building them runs Spark jobs: the anomalies and the limit candidates are :func:`collected_leaf`,
        and the fold collects its input.
    """
    windows = cfg.windows
    single = partitioning(cfg.spark.gold_single_partition)
    metrics = inputs.metrics.transform(single)
    topics = metrics.transform(tps.topic_tps(windows)).persist()
    groups = metrics.transform(tps.group_tps(windows)).persist()
    brokers = metrics.transform(tps.broker_tps(windows)).persist()
    anomalies = detect.detect_anomalies(
        topics, groups, brokers,
        inputs.topic_history.transform(single), inputs.broker_history.transform(single),
        windows, cfg.detection, first_window=first_window,
    ).transform(single).transform(collected_leaf)
    traffic = demand.resource_traffic(metrics, windows)
    if inputs.limiter_rejections is not None:
        batch_windows = metrics.select("window_start").distinct()
        traffic = traffic.unionByName(demand.limiter_traffic(inputs.limiter_rejections, windows)
                                      .join(batch_windows, "window_start", "left_semi"))
    demand_rows = demand.demand(traffic, brokers, cfg.detection, groups).transform(single)
    decided = decisions(
        anomalies, tps.topic_brokers(metrics), demand_rows, inputs.policy_state, horizon_end, cfg, now, check,
        batch_id, inputs.open_evidence,
    )
    limits = decided.limits.persist()
    state = decided.state.persist()
    evidence = decided.evidence.persist()
    reconciled = reconcile.reconcile_preliminary(
        inputs.latest_limits, limits, reconcile.state_after(inputs.policy_state, state.drop("batch_id")), horizon_end, cfg, now
    )
    return GoldOutputs(with_limit_in_force(topics, evidence), groups, brokers,
                       anomalies.unionByName(bound_anomalies(evidence, windows)), limits.unionByName(reconciled),
                       decided.refused, state, cached=(topics, groups, brokers, limits, state, evidence))
