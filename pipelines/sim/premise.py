"""The premise of a sweep case's kind: what its scenario must be for the kind to stand for what it
names, read from its cluster's demand against the brokers' capacity (:func:`premise`); :func:`pipelines.sim.draws.
draw` draws again until it holds."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipelines.sim.case import COMPOUND, START, Case

#: A storm starts at this minute of the run or later. The fast path judges a ratio rule (RUNAWAY_RETRY) on an open
#: window only once it is complete by census, against the brokers of the newest finalized window; a new lake has
#: none, so no open window is complete until the governor's first final window (:func:`pipelines.decide.
#: preliminary.census`). With the shipped settings (watermark 120 s) the fast path reads it 3.5-5.2 minutes into a
#: run (earlier when failure lines move the watermark): a storm from minute 3 or 4 was contained from the final
#: window or the next open one, 132-154 s after its onset. A storm in the governor's first
#: minutes is a cold start (kind ``cold_start``, judged by :func:`pipelines.sim.fastest.cold_start_target`), not
#: what the 100 s target is about; from minute 5 its onset minute is judged at 6:12.5.
FIRST_STORM_MINUTE = 5
#: The kinds whose premise reads their cluster's demand (:func:`premise`).
PREMISED = ("flash_sale", "normal_day", "noisy_neighbour") + COMPOUND
#: A broker whose demand stays under this share of its capacity is never busy (no send queue builds up).
HEALTHY_SHARE = 0.9
#: A noisy neighbour's surge takes its broker at least this far over its capacity (its send queue overflows).
SATURATED_SHARE = 1.1
#: A demand "at capacity" (kind near_capacity): its broker's demand within this band of its capacity.
CAPACITY_BAND = (0.9, 1.1)


def _with_clients(case: Case, bcfg):
    from pipelines.sim.settings import load_backtest_config

    bcfg = bcfg or load_backtest_config("conf/backtest.toml")
    update = {}
    if case.clients:
        update["clients"] = bcfg.clients.model_copy(update=case.clients)
    if case.broker:
        update["broker"] = bcfg.broker.model_copy(update=case.broker)
    return bcfg.model_copy(update=update) if update else bcfg


def _spec(case: Case):
    from pipelines.sim.spec import ScenarioSpec

    fields = {k: v for k, v in case.spec.items() if k != "_scenario"}
    return ScenarioSpec(name=case.spec.get("_scenario", case.scenario), start=START, **fields)


def cluster_of(case: Case, bcfg):
    from pipelines.sim.loop import closed_cluster

    return closed_cluster(_spec(case), _with_clients(case, bcfg))


def premise(case: Case, bcfg=None, cluster=None) -> str | None:
    """Why ``case``'s scenario is not what its kind stands for (None: it is), from the demand of its cluster
    (:func:`pipelines.sim.loop.closed_cluster`: write units per second per broker and minute against the broker's
    capacity): a flash sale and a normal day keep every broker under :data:`HEALTHY_SHARE` of its capacity (the
    right answer is no limit: a flash sale that overloads a broker is a noisy neighbour); a surge that must be
    limited (a noisy neighbour, a required surge of a compound case) takes one of its brokers over
    :data:`SATURATED_SHARE` in each of its full-level minutes (else no broker is busy, and the surge is only
    advised); a surge at capacity (not required) keeps its broker within :data:`CAPACITY_BAND`. A storm starts at
    :data:`FIRST_STORM_MINUTE` or later (after the governor's first final window) but for a cold start; it needs
    nothing else: its consumer is broken whatever the load."""
    if case.kind not in PREMISED:
        if case.kind == "cold_start":
            return None
        onset = case.spec.get("onset_minute", FIRST_STORM_MINUTE)
        return None if onset >= FIRST_STORM_MINUTE else (
            f"the storm starts at minute {onset}, before the governor's first final window (a cold start)")
    c = cluster if cluster is not None else cluster_of(case, bcfg)
    load = np.zeros((len(c.brokers), c.T))
    np.add.at(load, c.pair_broker, c.demand * c.work)
    share = load / c.capacity.to_numpy(dtype=float)[:, None]
    if case.kind in ("flash_sale", "normal_day"):
        worst = float(share.max())
        return None if worst < HEALTHY_SHARE else f"a broker's demand reaches {worst:.2f}x its capacity"
    causes = c.incident.causes if c.incident is not None else ()
    if not causes:
        return "no cause"
    for cause in causes:
        if cause.kind != "surge":
            continue
        lo = int(np.ceil((pd.Timestamp(cause.active[0][0]) + pd.Timedelta(seconds=cause.ramp_seconds) - c.start)
                         .total_seconds() / 60.0))
        hi = int((pd.Timestamp(cause.active[0][1]) - c.start).total_seconds() // 60)
        if case.spec.get("rollout_minutes"):
            hi -= int(np.ceil(case.spec["rollout_minutes"]))
        if hi <= lo:
            return f"{cause.resource} has no minute at its full level"
        rows = [c.brokers.index(b) for b in cause.brokers]
        peak = share[rows, lo:hi].max(axis=0)
        if cause.required and float(peak.min()) <= SATURATED_SHARE:
            return f"the surge of {cause.resource} takes its broker to {float(peak.min()):.2f}x its capacity only"
        if not cause.required and not CAPACITY_BAND[0] <= float(peak.mean()) <= CAPACITY_BAND[1]:
            return f"{cause.resource} at {float(peak.mean()):.2f}x its broker's capacity, outside {CAPACITY_BAND}"
    if case.kind == "surge_and_flash":
        return _flash_fits(c, causes, share)
    return None


#: A contained surge is judged at this many times its rate before the surge (the shipped ``surge_headroom``).
CONTAINED_FACTOR = 2.0


def _flash_fits(c, causes, share: np.ndarray) -> str | None:
    """A legitimate flash sale (kind ``surge_and_flash``): with the surge held at :data:`CONTAINED_FACTOR` × its
    rate before it, its broker stays under :data:`HEALTHY_SHARE` of its capacity in every minute. A flash sale
    that overloads the broker by itself is a noisy neighbour: limiting it would be a false limit and leaving it
    alone would leave the bystanders rejected (drawn without this premise: 115-289 % of the bystanders' rejections
    before containment, one false limit; docs/decisions.md §7)."""
    held = share.copy()
    capacity = c.capacity.to_numpy(dtype=float)
    for cause in causes:
        if cause.kind != "surge" or not cause.required:
            continue
        rows = np.flatnonzero((c.pairs["resource_type"] == "topic").to_numpy()
                              & (c.pairs["resource"] == cause.resource).to_numpy())
        onset = int((pd.Timestamp(cause.active[0][0]) - c.start).total_seconds() // 60)
        for i in rows:
            before = float(c.demand[i, :max(onset, 1)].mean())
            excess = np.maximum(c.demand[i] - CONTAINED_FACTOR * before, 0.0) * c.work[i]
            held[c.pair_broker[i]] -= excess / capacity[c.pair_broker[i]]
    worst = float(held.max())
    return None if worst < HEALTHY_SHARE else (
        f"with the surge contained a broker's demand reaches {worst:.2f}x its capacity (the flash sale overloads it)")


