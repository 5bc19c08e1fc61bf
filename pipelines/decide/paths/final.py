"""The final path's decisions of one micro-batch as one pure function: the finalized windows Spark reduced, their
history, the saved policy state, config and ``now`` → every gold output, as Arrow tables.

Steps (each a module of :mod:`pipelines.decide`):

1. anomalies against the resources' own baselines (:mod:`~pipelines.decide.rules.anomalies`);
2. the demand evidence of limitable resources (:mod:`~pipelines.decide.rules.evidence`), limit candidates
   (:mod:`~pipelines.decide.rules.candidates`) and the per-resource policy fold
   (:mod:`~pipelines.decide.paths.fold_all`), which judges a resource under a limit by its rule on that evidence
   (:mod:`~pipelines.decide.limits.base`);
3. ``gold/limits`` rows (basis ``final``) split by the ``gold/limits`` expectations into accepted decisions and
   quarantine rows (:mod:`~pipelines.decide.records.limit_rows`);
4. the fast path's preliminary decisions on windows now final are confirmed, corrected or reversed
   (:mod:`~pipelines.decide.paths.reconcile`), so the limits in force once every window is final do not depend on how
   the input was cut into micro-batches.

Entry points: :func:`prepare_final` (steps 1-2 up to the candidates, outside the decision lock) and
:func:`decide_final` (the rest, under it), or :func:`run_final` for both.

Example:
    >>> inputs = FinalInputs(topics=topics, groups=groups, brokers=brokers, traffic=traffic,
    ...                      topic_history=topic_hist, broker_history=broker_hist)
    >>> out = run_final(inputs, LockedInputs(policy_state=state, latest_limits=latest), cfg, now, batch_id=7,
    ...                 origin="rate-governor-gold:7")
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
from pipelines.decide.rules import evidence as ev
from pipelines.decide.arrow import aware, from_rows, micros, rows_of, to_arrow, to_polars, when
from pipelines.decide.rules.candidates import candidate_limits
from pipelines.decide.rules.facts import through_busy
from pipelines.decide.catalogue import limited_by
from pipelines.decide.paths.fold_all import Folded, fold_all, state_row, state_table
from pipelines.decide.records.inputs import FinalInputs, LockedInputs
from pipelines.decide.limits.steps import Params
from pipelines.decide.words import Basis, Severity, Status
from pipelines.decide.records.limit_rows import check, finish
from pipelines.decide.paths.overrides import Applied
from pipelines.decide.paths.reconcile import (
    latest_per_resource, pending_preliminary, reconcile_preliminary, state_after,
)
from pipelines.decide.rules.crowding import busy_normals
from pipelines.decide.rules.anomalies import anomalies_frame, broker_writes, detect
from pipelines.decide.rules.windows import MARKER
from pipelines import tables


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


def window_bounds(traffic: pa.Table) -> tuple[dt.datetime | None, dt.datetime | None]:
    """The ``traffic`` rows of a micro-batch (:func:`pipelines.decide.rules.windows.reduce_windows`) → (first
    ``window_start``, last ``window_end``) of its windows (UTC), from the window markers; (None, None) without."""
    marks = pl.from_arrow(traffic).filter(pl.col("resource_type") == MARKER)
    if marks.height == 0:
        return None, None
    return aware(marks["window_start"].min()), aware(marks["window_end"].max())


def bound_anomalies(folded: Folded, length_seconds: int) -> list[dict]:
    """Evidence of windows where no detection rule fired but the cause persists under the limit (``bound`` or
    ``hold``) → ``gold/anomalies`` rows: the anomaly that set the limit persists, ``observed_tps`` the admitted
    rate, ``baseline_tps`` the limit, ``detail`` "<resource>: limit-bound: 38.2 of 40.2 msg/s…"."""
    out = []
    for (rtype, resource), e in folded.evidence:
        if e.status not in (Status.BOUND, Status.HOLD) or e.rule_fired:
            continue
        end = aware(e.window_end)
        out.append({"window_start": end - dt.timedelta(seconds=length_seconds), "window_end": end,
                    "resource_type": rtype, "resource": resource, "anomaly": limited_by(rtype).value,
                    "observed_tps": e.observed_tps, "baseline_tps": e.limit_qps, "severity": Severity.WARNING,
                    "detail": f"{resource}: {e.detail}"})
    return out


def with_limit_in_force(topics: pl.DataFrame, folded: Folded) -> pl.DataFrame:
    """``gold/topic_tps`` rows → the same with ``limit_qps``: the topic's enforced cluster-wide limit in force in
    the window (from the fold's evidence), null when none (such windows are left out of surge baselines)."""
    limits = [{"window_end": aware(e.window_end), "topic": r, "_limit": e.limit_qps}
              for (t, r), e in folded.evidence if t == "topic" and e.status != Status.VETO]
    if not limits:
        return topics.with_columns(pl.lit(None, pl.Float64).alias("limit_qps"))
    frame = pl.DataFrame(limits, schema={"window_end": pl.Datetime("us", "UTC"), "topic": pl.String,
                                         "_limit": pl.Float64})
    return topics.drop("limit_qps").join(frame, on=["window_end", "topic"], how="left").rename(
        {"_limit": "limit_qps"})


class FinalPrepared:
    """What the final path derives from a micro-batch before it needs the decisions' memory (outside the decision
    lock, :func:`prepare_final`): the batch's gold TPS tables, the anomalies, the candidates, the observation grid
    (window ends, naive UTC) and the batch's first window start and last window end (UTC; None: no window); the
    demand evidence (:func:`pipelines.decide.rules.evidence.demand`) is computed when first read: with candidates here,
    else only when a limit in force is observed (:func:`decide_final`)."""

    def __init__(self, inputs: FinalInputs, topics: pl.DataFrame, anomalies: pl.DataFrame,
                 demand: pl.DataFrame | Callable[[], pl.DataFrame], candidates: list, grid: list,
                 first_window: dt.datetime | None, horizon_end: dt.datetime | None) -> None:
        self.groups, self.brokers = inputs.groups, inputs.brokers
        self.topics, self.anomalies, self.candidates, self.grid = topics, anomalies, candidates, grid
        self.first_window, self.horizon_end = first_window, horizon_end
        self._demand = demand

    @property
    def demand(self) -> pl.DataFrame:
        if callable(self._demand):
            self._demand = self._demand()
        return self._demand


def prepare_final(inputs: FinalInputs, cfg: GovernorConfig, first_window: dt.datetime | None = None,
                  horizon_end: dt.datetime | None = None) -> FinalPrepared:
    """Steps 1-2 of the module docstring up to the candidates: everything that does not read the decisions' memory.
    ``first_window``, ``horizon_end``: the batch's first ``window_start`` and last ``window_end`` (UTC); default
    from the window markers of ``inputs.traffic`` (:func:`window_bounds`)."""
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
    retries = traffic.filter(pl.col("resource_type") == "group").group_by("window_start", "resource").agg(
        through_busy(pl.col("tps"), pl.col("acceptance").fill_null(1.0)).sum().alias("sent"),
        pl.col("tps").sum().alias("admitted"))
    retry_traffic = {(r[0], r[1]): r[2] for r in retries.iter_rows()}
    retry_admitted = {(r[0], r[1]): r[3] for r in retries.iter_rows()}
    broker_history = to_polars(inputs.broker_history, columns.GOLD_BROKER_TPS)
    anomalies = detect(topics, groups, brokers, to_polars(inputs.topic_history, columns.GOLD_TOPIC_TPS),
                       broker_history, windows, cfg.detection,
                       first_window=first_window, retry_traffic=retry_traffic, group_history=inputs.group_history,
                       retry_admitted=retry_admitted, topic_brokers=traffic.filter(
                           pl.col("resource_type") == "topic").select(
                           "window_start", pl.col("resource").alias("topic"), "broker", "tps"))
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
        return FinalPrepared(inputs, topics, anomalies, demand, [], sorted(grid), first_window, horizon_end)
    demand_rows = demand()
    carriers: dict = {}
    for r in traffic.filter((pl.col("resource_type") == "topic") & pl.col("carries")).select(
            "window_start", "resource", "broker").unique().sort("broker").iter_rows(named=True):
        carriers.setdefault((r["window_start"], r["resource"]), []).append(r["broker"])
    candidates = candidate_limits(anomalies, carriers, limits_cfg, ev.broker_tps_of(demand_rows), busy_normals(
        anomalies, broker_history, first_window, windows, cfg.detection, broker_writes()))
    return FinalPrepared(inputs, topics, anomalies, demand_rows, candidates, sorted(grid), first_window, horizon_end)


def decide_final(prepared: FinalPrepared, locked: LockedInputs, cfg: GovernorConfig, now: dt.datetime, *,
                 batch_id: int, origin: str) -> FinalOutputs:
    """Steps 2-4 of the module docstring from :func:`prepare_final`: the fold on the decisions' memory, the rows (the
    part the flow runs under the decision lock). ``now``: processing time of the decisions (UTC): ``decided_at``,
    ``expires_at`` = now + ``limits.ttl_seconds``; ``batch_id``: the ``state/policy`` rows' micro-batch;
    ``origin``: the quarantine rows' ``origin`` of refused decisions (``<app id>:<batch id>``)."""
    windows, limits_cfg = cfg.windows, cfg.limits
    candidates = prepared.candidates
    saved = rows_by_key(locked.policy_state)
    latest = latest_per_resource(list(rows_by_key(locked.latest_limits).values()))
    view = Applied(locked.overrides, now, saved, latest, cfg)  # the operators' overrides
    standing = view.standing(prepared.horizon_end, lambda: ev.broker_tps_of(prepared.demand)) if view else []
    observed = {k for k, r in saved.items() if r.get("limit_qps") is not None} | {
        (k.resource_type, k.resource) for k in candidates}
    folded = view.fold_out(fold_all(
        view.candidates(candidates), view.saved(saved), prepared.horizon_end, Params.from_config(cfg),
        observations=ev.observations(prepared.demand, observed, prepared.grid) if observed else {},
        open_evidence=locked.open_evidence, now=now, preliminary=pending_preliminary(view.latest)))
    accepted, refused = check(standing + view.shape(finish(folded.decisions, limits_cfg, now, Basis.FINAL,
                                                           view.latest)), origin, now)
    after = state_after(saved, {(s.resource_type, s.resource): state_row(s) for s in folded.states})
    reconciled = view.shape(reconcile_preliminary(latest_per_resource(list(view.newest.values())), accepted, after,
                                                  prepared.horizon_end, cfg, now))
    bound = bound_anomalies(folded, windows.length_seconds)
    every_anomaly = pl.concat([prepared.anomalies, anomalies_frame(bound)], how="vertical_relaxed") if bound \
        else prepared.anomalies
    return FinalOutputs(
        topic_tps=to_arrow(with_limit_in_force(prepared.topics, folded), columns.GOLD_TOPIC_TPS),
        group_tps=prepared.groups, broker_tps=prepared.brokers,
        anomalies=to_arrow(every_anomaly, columns.GOLD_ANOMALIES),
        limits=from_rows(accepted + reconciled, columns.GOLD_LIMITS),
        refused=from_rows(refused, columns.QUARANTINE),
        state=view.mark(state_table(folded.states, batch_id)), folded=folded)


def decide_open(horizon_end: dt.datetime, locked: LockedInputs, cfg: GovernorConfig, now: dt.datetime, *,
                batch_id: int, origin: str) -> tuple[pa.Table, pa.Table, pa.Table]:
    """A final micro-batch that finalized no window: what the fast path's open windows now show decides for every
    resource with a limit in force, as the end of a finalizing micro-batch would (its open-window steps,
    :meth:`pipelines.decide.limits.base.LimitPolicy.act_on_open`, and the lift due at the horizon): a probe undone by
    the first line of a carrier that took it, or at its deadline; a lift the open windows prove, unless one vetoes it;
    a probe or a squeeze. Each decision is one of the window ending ``horizon_end`` (UTC: the newest window
    finalized before), ranked after the decisions already taken on it. → (accepted ``gold/limits`` rows, refused
    ``quarantine`` rows, ``state/policy`` rows of the resources folded); all empty without a limit in force, or
    without open evidence and a probe in flight (its deadline: every trigger of the tick that runs it, input or
    not). Runs under the decision lock, like :func:`decide_final`."""
    empty = (from_rows([], columns.GOLD_LIMITS), from_rows([], columns.QUARANTINE), state_table([], batch_id))
    saved = rows_by_key(locked.policy_state)
    probing = any(r.get("probe_decided_at") is not None for r in saved.values())
    if not (locked.open_evidence or probing) or not any(r.get("limit_qps") is not None for r in saved.values()):
        return empty
    latest = latest_per_resource(list(rows_by_key(locked.latest_limits).values()))
    view = Applied(locked.overrides, now, saved, latest, cfg)
    folded = view.fold_out(fold_all(view.candidates([]), view.saved(saved), horizon_end, Params.from_config(cfg),
                                    open_evidence=locked.open_evidence, now=now))
    if not folded.decisions:
        return empty
    accepted, refused = check(view.shape(finish(folded.decisions, cfg.limits, now, Basis.FINAL, view.latest)),
                              origin, now)
    decided = {(d.resource_type, d.resource) for d in folded.decisions}
    states = [st for st in folded.states if (st.resource_type, st.resource) in decided]
    return (from_rows(accepted, columns.GOLD_LIMITS), from_rows(refused, columns.QUARANTINE),
            view.mark(state_table(states, batch_id)))


def run_final(inputs: FinalInputs, locked: LockedInputs, cfg: GovernorConfig, now: dt.datetime, *, batch_id: int,
              origin: str, first_window: dt.datetime | None = None,
              horizon_end: dt.datetime | None = None) -> FinalOutputs:
    """One micro-batch of finalized windows → every gold output (module docstring): :func:`prepare_final`, then
    :func:`decide_final` (their arguments)."""
    prepared = prepare_final(inputs, cfg, first_window, horizon_end)
    return decide_final(prepared, locked, cfg, now, batch_id=batch_id, origin=origin)
