"""The final path's decisions of one micro-batch as one pure function: the finalized windows Spark reduced, their
history, the saved policy state, config and ``now`` → every gold output, as Arrow tables.

Steps (each a module of :mod:`pipelines.decide`):

1. anomalies against the resources' own baselines (:mod:`~pipelines.decide.rules`);
2. the demand evidence of limitable resources (:mod:`~pipelines.decide.evidence`), limit candidates
   (:mod:`~pipelines.decide.candidates`) and the per-resource policy fold (:mod:`~pipelines.decide.folding`), which
   judges a resource under a limit by its rule on that evidence (:mod:`~pipelines.decide.limit_policy`);
3. ``gold/limits`` rows (basis ``final``) split by the ``gold/limits`` expectations into accepted decisions and
   quarantine rows (:mod:`~pipelines.decide.limits`);
4. the fast path's preliminary decisions on windows now final are confirmed, corrected or reversed
   (:mod:`~pipelines.decide.reconcile`), so the limits in force once every window is final do not depend on how the
   input was cut into micro-batches.

Example:
    >>> out = decide_final(FinalInputs(topics, groups, brokers, traffic, topic_hist, broker_hist, state, latest),
    ...                    cfg, now, batch_id=7, origin="rate-governor-gold:7")
    >>> out.tables()["gold/limits"].num_rows
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field

import polars as pl
import pyarrow as pa

from pipelines import columns
from pipelines.config import GovernorConfig
from pipelines.decide import evidence as ev
from pipelines.decide.arrow import aware, from_rows, micros, rows_of, to_arrow, to_polars, when
from pipelines.decide.candidates import candidate_limits
from pipelines.decide.catalogue import limited_by
from pipelines.decide.fold_types import BASIS_FINAL
from pipelines.decide.folding import Folded, fold_all, state_row, state_table
from pipelines.decide.limit_policy import BOUND, HOLD, VETO
from pipelines.decide.limits import check, finish
from pipelines.decide.overrides import Applied
from pipelines.decide.reconcile import latest_per_resource, reconcile_preliminary, state_after
from pipelines.decide.rules import anomalies_frame, detect
from pipelines.decide.windows import MARKER
from pipelines import tables


@dataclass(frozen=True)
class FinalInputs:
    """What the final path reads (Arrow tables of the named schemas, times UTC).

    Attributes:
        topics, groups, brokers: the micro-batch's ``gold/topic_tps`` (``limit_qps`` null), ``gold/group_tps`` and
            ``gold/broker_tps`` rows.
        traffic: the per-broker traffic rows (:func:`pipelines.decide.windows.reduce_windows`), with the window markers (:data:`MARKER`).
        topic_history, broker_history: earlier ``gold/topic_tps`` / ``gold/broker_tps`` rows (baselines); Arrow,
            or polars frames of the same rows (:func:`pipelines.decide.arrow.to_polars`).
        policy_state: the saved ``state/policy`` row per resource (of batches before this one).
        latest_limits: the newest ``gold/limits`` row per resource.
        limiter_rejections: ``control/limiter_rejections`` rows of the batch's windows; None when there are none.
        open_evidence: the fast path's open windows after the batch per resource (the lift veto); None without.
        overrides: the operators' overrides (:func:`pipelines.decide.overrides.parse`); () without.
    """

    topics: pa.Table
    groups: pa.Table
    brokers: pa.Table
    traffic: pa.Table
    topic_history: pa.Table
    broker_history: pa.Table
    policy_state: pa.Table
    latest_limits: pa.Table
    limiter_rejections: pa.Table | None = None
    open_evidence: dict | None = None
    overrides: tuple = ()


@dataclass
class FinalOutputs:
    """The Arrow tables of one final micro-batch, by table, and the fold's own outputs (evidence, vetoes)."""

    topic_tps: pa.Table
    group_tps: pa.Table
    broker_tps: pa.Table
    anomalies: pa.Table
    limits: pa.Table
    refused: pa.Table
    state: pa.Table
    folded: Folded = field(default_factory=Folded)

    def tables(self) -> dict[str, pa.Table]:
        """Table name → rows to append, in the order the final path writes them."""
        return {tables.GOLD_TOPIC_TPS: self.topic_tps, tables.GOLD_GROUP_TPS: self.group_tps,
                tables.GOLD_BROKER_TPS: self.broker_tps, tables.GOLD_ANOMALIES: self.anomalies,
                tables.GOLD_LIMITS: self.limits, tables.QUARANTINE: self.refused, tables.STATE_POLICY: self.state}


def rows_by_key(table: pa.Table | None) -> dict[tuple[str, str], dict]:
    """Rows with ``resource_type``, ``resource`` → dicts by key (the last row of a key wins)."""
    if table is None or table.num_rows == 0:
        return {}
    return {(r["resource_type"], r["resource"]): r for r in rows_of(table)}


def window_bounds(inputs: FinalInputs) -> tuple[dt.datetime | None, dt.datetime | None]:
    """(first ``window_start``, last ``window_end``) of the micro-batch's windows (UTC), from the markers."""
    marks = pl.from_arrow(inputs.traffic).filter(pl.col("resource_type") == MARKER)
    if marks.height == 0:
        return None, None
    return aware(marks["window_start"].min()), aware(marks["window_end"].max())


def bound_anomalies(folded: Folded, length_seconds: int) -> list[dict]:
    """Evidence of windows where no detection rule fired but the cause persists under the limit (``bound`` or
    ``hold``) → ``gold/anomalies`` rows: the anomaly that set the limit persists, ``observed_tps`` the admitted
    rate, ``baseline_tps`` the limit, ``detail`` "<resource>: limit-bound: 38.2 of 40.2 msg/s…"."""
    out = []
    for (rtype, resource), e in folded.evidence:
        if e.status not in (BOUND, HOLD) or e.rule_fired:
            continue
        end = aware(e.window_end)
        out.append({"window_start": end - dt.timedelta(seconds=length_seconds), "window_end": end,
                    "resource_type": rtype, "resource": resource, "anomaly": limited_by(rtype).value,
                    "observed_tps": e.observed_tps, "baseline_tps": e.limit_qps, "severity": "warning",
                    "detail": f"{resource}: {e.detail}"})
    return out


def with_limit_in_force(topics: pl.DataFrame, folded: Folded) -> pl.DataFrame:
    """``gold/topic_tps`` rows → the same with ``limit_qps``: the topic's enforced cluster-wide limit in force in
    the window (from the fold's evidence), null when none (such windows are left out of surge baselines)."""
    limits = [{"window_end": aware(e.window_end), "topic": r, "_limit": e.limit_qps}
              for (t, r), e in folded.evidence if t == "topic" and e.status != VETO]
    if not limits:
        return topics.with_columns(pl.lit(None, pl.Float64).alias("limit_qps"))
    frame = pl.DataFrame(limits, schema={"window_end": pl.Datetime("us", "UTC"), "topic": pl.String,
                                         "_limit": pl.Float64})
    return topics.drop("limit_qps").join(frame, on=["window_end", "topic"], how="left").rename(
        {"_limit": "limit_qps"})


class Prepared:
    """What the final path derives from a micro-batch before it needs the policy state (computed outside the
    decision lock): the anomalies, the candidates and the observation grid; the demand evidence
    (:func:`pipelines.decide.evidence.demand`) is computed when first read: with candidates here, else only when a
    limit in force is observed (:func:`decide_prepared`)."""

    def __init__(self, topics: pl.DataFrame, anomalies: pl.DataFrame, demand: pl.DataFrame | Callable[[], pl.DataFrame],
                 candidates: list, grid: list, first_window: dt.datetime | None,
                 horizon_end: dt.datetime | None) -> None:
        self.topics, self.anomalies, self.candidates, self.grid = topics, anomalies, candidates, grid
        self.first_window, self.horizon_end = first_window, horizon_end
        self._demand = demand

    @property
    def demand(self) -> pl.DataFrame:
        if callable(self._demand):
            self._demand = self._demand()
        return self._demand


def prepare_final(inputs: FinalInputs, cfg: GovernorConfig, first_window: dt.datetime | None = None,
                  horizon_end: dt.datetime | None = None) -> Prepared:
    """Steps 1-2 of the module docstring up to the candidates: everything that does not read the policy state."""
    windows, limits_cfg = cfg.windows, cfg.limits
    traffic = pl.from_arrow(inputs.traffic)
    marks = traffic.filter(pl.col("resource_type") == MARKER).select("window_start", "window_end", "resource").rows()
    if first_window is None or horizon_end is None:
        first_window = aware(min(r[0] for r in marks)) if marks else None
        horizon_end = aware(max(r[1] for r in marks)) if marks else None
    topics = to_polars(inputs.topics, columns.GOLD_TOPIC_TPS)
    groups = to_polars(inputs.groups, columns.GOLD_GROUP_TPS)
    brokers = to_polars(inputs.brokers, columns.GOLD_BROKER_TPS)
    traffic = traffic.filter(pl.col("resource_type") != MARKER).select(list(ev.TRAFFIC))
    retry_traffic = {(r[0], r[1]): r[2] for r in traffic.filter(pl.col("resource_type") == "group").group_by(
        "window_start", "resource").agg(pl.col("tps").sum()).iter_rows()}
    anomalies = detect(topics, groups, brokers, to_polars(inputs.topic_history, columns.GOLD_TOPIC_TPS),
                       to_polars(inputs.broker_history, columns.GOLD_BROKER_TPS), windows, cfg.detection,
                       first_window=first_window, retry_traffic=retry_traffic)
    batch_windows = {start for start, _end, name in marks if name == "metrics"}
    grid = {end for _start, end, name in marks if name == "traffic"}
    if inputs.limiter_rejections is not None and inputs.limiter_rejections.num_rows:
        limited = ev.limiter_traffic(pl.from_arrow(inputs.limiter_rejections), windows).filter(
            when("window_start").is_in([micros(x) for x in batch_windows]))
        grid |= set(limited["window_end"].to_list())
        traffic = pl.concat([traffic, limited], how="vertical_relaxed")

    def demand() -> pl.DataFrame:
        return ev.demand(traffic, brokers, cfg.detection, groups)

    if anomalies.height == 0:  # no candidate: the demand evidence only for a limit in force
        return Prepared(topics, anomalies, demand, [], sorted(grid), first_window, horizon_end)
    demand_rows = demand()
    carriers: dict = {}
    for r in traffic.filter((pl.col("resource_type") == "topic") & pl.col("carries")).select(
            "window_start", "resource", "broker").unique().sort("broker").iter_rows(named=True):
        carriers.setdefault((r["window_start"], r["resource"]), []).append(r["broker"])
    candidates = candidate_limits(anomalies, carriers, limits_cfg, ev.broker_tps_of(demand_rows))
    return Prepared(topics, anomalies, demand_rows, candidates, sorted(grid), first_window, horizon_end)


def decide_prepared(prepared: Prepared, inputs: FinalInputs, cfg: GovernorConfig, now: dt.datetime, *,
                    batch_id: int, origin: str) -> FinalOutputs:
    """Steps 2-4 of the module docstring from :func:`prepare_final`: the fold on the policy state, the rows (the part
    the flow runs under the decision lock)."""
    windows, limits_cfg = cfg.windows, cfg.limits
    candidates = prepared.candidates
    saved = rows_by_key(inputs.policy_state)
    view = Applied(inputs.overrides, now, saved, rows_by_key(inputs.latest_limits), cfg)  # the operators' overrides
    standing = view.standing(prepared.horizon_end, lambda: ev.broker_tps_of(prepared.demand)) if view else []
    observed = {k for k, r in saved.items() if r.get("limit_qps") is not None} | {
        (k.resource_type, k.resource) for k in candidates}
    folded = view.fold_out(fold_all(
        view.candidates(candidates), view.saved(saved), prepared.horizon_end, limits_cfg, windows.length_seconds,
        observations=ev.observations(prepared.demand, observed, prepared.grid) if observed else {},
        detection=cfg.detection, open_evidence=inputs.open_evidence))
    accepted, refused = check(standing + view.shape(finish(folded.decisions, limits_cfg, now, BASIS_FINAL)), origin,
                              now)
    after = state_after(saved, {(s.resource_type, s.resource): state_row(s) for s in folded.states})
    reconciled = view.shape(reconcile_preliminary(latest_per_resource(list(view.newest.values())), accepted, after,
                                                  prepared.horizon_end, cfg, now))
    bound = bound_anomalies(folded, windows.length_seconds)
    every_anomaly = pl.concat([prepared.anomalies, anomalies_frame(bound)], how="vertical_relaxed") if bound \
        else prepared.anomalies
    return FinalOutputs(
        topic_tps=to_arrow(with_limit_in_force(prepared.topics, folded), columns.GOLD_TOPIC_TPS),
        group_tps=inputs.groups, broker_tps=inputs.brokers,
        anomalies=to_arrow(every_anomaly, columns.GOLD_ANOMALIES),
        limits=from_rows(accepted + reconciled, columns.GOLD_LIMITS),
        refused=from_rows(refused, columns.QUARANTINE),
        state=view.mark(state_table(folded.states, batch_id)), folded=folded)


def decide_final(inputs: FinalInputs, cfg: GovernorConfig, now: dt.datetime, *, batch_id: int, origin: str,
                 first_window: dt.datetime | None = None, horizon_end: dt.datetime | None = None) -> FinalOutputs:
    """One micro-batch of finalized windows → every gold output (module docstring): :func:`prepare_final`, then
    :func:`decide_prepared`.

    Args:
        now: processing time of the decisions (UTC): ``decided_at``, ``expires_at`` = now + ``limits.ttl_seconds``.
        origin: the quarantine rows' ``origin`` of refused decisions (``<app id>:<batch id>``).
        first_window, horizon_end: the batch's first ``window_start`` and last ``window_end`` (UTC); default from
            the window markers of ``inputs.traffic``.
    """
    prepared = prepare_final(inputs, cfg, first_window, horizon_end)
    return decide_prepared(prepared, inputs, cfg, now, batch_id=batch_id, origin=origin)
