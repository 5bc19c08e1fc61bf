"""Operators' overrides in the Spark-free closed loop (:func:`pipelines.sim.loop.simulate` ``overrides=``): the
override tick of the continuous job (:class:`pipelines.job.overrides.OverrideTick`) modelled at every fast trigger
(:func:`pipelines.sim.override_tick.tick`), the checks a closed loop with overrides is judged by (:func:`checks`), and
the sweep's kind that draws them (:func:`draw_overridden`: ``overridden_storm``, its own cases beside the sweep's,
``python -m pipelines.sim.sweep --kind overridden_storm``).

What the checks hold to (docs/operators.md §9), for each override of the culprit, from one fast trigger plus the
propagation delay after its start to its end: a pin is the only limit in force, at its figure; an exemption leaves
no enforced limit in force. After its end, a cause still active is limited by the rules within the onset target
(:data:`pipelines.sim.figures.ONSET_TO_LIMIT_MAX_S`, or the fastest the pipeline allows when that is later,
:func:`pipelines.sim.fastest.fastest_in_force`): they take over from the current evidence, at once after an
exemption (the cause was in plain sight); after a pin, from the first stats minute after its end (the minute it
ended in shows the pin's traffic, not the cause's).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import pandas as pd

from pipelines.config import GovernorConfig
from pipelines.decide.paths.overrides import CREATE, EXEMPT, PIN, Override, parse
from pipelines.sim.draws import PROG, START, Case, _draw, _draw_world
from pipelines.sim.fastest import fastest_in_force
from pipelines.sim.premise import cluster_of as _cluster, premise
from pipelines.sim.figures import ONSET_TO_LIMIT_MAX_S, truth
from pipelines.sim.values_in_force import in_force_spans

#: The sweep's kind of a persisting storm with a drawn override of its culprit group. Its cases are its own
#: (:func:`draw_overridden`, from a generator of their own), not among :data:`pipelines.sim.draws.KINDS`: the
#: sweep's case ``k`` is drawn the same whether this kind exists or not.
KIND = "overridden_storm"


def in_force(result) -> tuple[np.ndarray, np.ndarray]:
    """Per second of the run, the culprit's enforced cluster-wide limit in force at some broker: (set by the rules,
    set by an override); NaN where none."""
    c = result.cluster
    culprits, _ = truth(result)
    n = c.T * 60
    rules, overridden = np.full(n, np.nan), np.full(n, np.nan)
    for lo, hi, snap in in_force_spans(result):
        for (_b, rtype, resource), (_qps, rec) in snap.items():
            if (rtype, resource) in culprits:
                target = overridden if rec["reason"].startswith("[override]") else rules
                target[lo:hi] = float(rec["limit_qps"])
    return rules, overridden


def checks(result, overrides: Sequence[Override], cfg: GovernorConfig, case=None) -> list[tuple[str, bool, str]]:
    """(check, passed, measured) for each override of the culprit (module docstring); ``case``: the sweep's case
    (:class:`OverriddenCase`: its world's shipping and apply delays), None for a regular world."""
    c = result.cluster
    culprits, spans = truth(result)
    rules, overridden = in_force(result)
    world = case.irregular if case is not None else {}
    lag = cfg.windows.fast_trigger_seconds + result.propagation_seconds + 1.0 + max(
        world.get("apply_delay_seconds", {}).values(), default=0.0)
    # the onset target, or the fastest a cause showing first in a minute's lines can be limited when that is later
    # (a propagation delay near 30 s, a slow shipper), as pipelines.sim.sweep.verdict excuses an onset
    regular = Case(0, KIND, {}, result.propagation_seconds)
    bound = max(ONSET_TO_LIMIT_MAX_S, fastest_in_force(case or regular, cfg, result.bcfg) + 1.0)
    seconds = lambda t: (pd.Timestamp(t) - c.start).total_seconds()  # noqa: E731
    out = []
    for o in (o for o in overrides if o.key in culprits):
        b = min(int(np.floor(seconds(o.until))), len(rules))  # the whole seconds before its end
        a = min(int(np.ceil(seconds(o.starts_at) + lag)), b)
        if o.kind == PIN:
            held = int(np.sum(np.isclose(overridden[a:b], o.limit_qps) & np.isnan(rules[a:b])))
            out.append((f"pin {o.override_id}: the only limit in force, at {o.limit_qps:g} msg/s, from one trigger "
                        "after its start to its end", held == b - a, f"{held} of {b - a} s"))
        else:
            free = int(np.sum(np.isnan(overridden[a:b]) & np.isnan(rules[a:b])))
            out.append((f"exempt {o.override_id}: no enforced limit from one trigger after its start to its end",
                        free == b - a, f"{free} of {b - a} s"))
        # from its end; after a pin, from the next stats minute: the minute it ended in shows the pin's traffic
        since = b if o.kind == EXEMPT else min(int(np.ceil(seconds(o.until) / 60.0) * 60), len(rules))
        raging = any(pd.Timestamp(s) <= pd.Timestamp(o.until) < pd.Timestamp(e) for s, e in spans)
        if raging and since + bound < len(rules):
            after = np.flatnonzero(~np.isnan(rules[since:]))
            took = float(after[0]) if after.size else float("nan")
            out.append((f"{o.kind} {o.override_id}: the cause still active at its end is limited by the rules within "
                        f"{ONSET_TO_LIMIT_MAX_S:.0f} s (or the fastest possible)"
                        + ("" if o.kind == EXEMPT else " of the next stats minute"),
                        bool(took <= bound), "not limited" if np.isnan(took) else f"{took:.0f} s"))
    return out


@dataclass(frozen=True)
class OverriddenCase(Case):
    """A case of :data:`KIND`: a persisting storm (its ``spec``) with ``overrides``, ``control/overrides`` rows of
    its culprit group (:func:`overridden`)."""

    overrides: tuple[dict, ...] = ()

    @property
    def scenario(self) -> str:
        return "persisting_storm"

    def describe(self) -> str:
        return super().describe() + "".join(
            f"; {o['kind']} {o['limit_qps'] or ''} {o['starts_at']:%H:%M:%S}-{o['ends_at']:%H:%M:%S}"
            for o in self.overrides)

    def replay(self) -> str:
        return f"{PROG} --kind {KIND} --case {self.seed}"


def draw_overridden(seed: int, bcfg=None, clusters: dict | None = None) -> OverriddenCase:
    """Case ``seed`` of :data:`KIND`, from ``numpy.random.default_rng([seed, 51])`` (not the sweep's generator of
    ``seed``): a persisting storm drawn as the sweep draws one (:func:`pipelines.sim.draws._draw`), one override of
    its culprit (:func:`overridden`), then its world (:func:`pipelines.sim.draws._draw_world`) but for broker
    restarts (a limiter that forgets the pin is not the override's doing). ``clusters``: as
    :func:`pipelines.sim.draws.draw`."""
    rng = np.random.default_rng([seed, 51])
    for _ in range(50):
        base = _draw(seed, "persisting_storm", rng, bcfg)
        case = overridden(OverriddenCase(**{f.name: getattr(base, f.name) for f in fields(Case)}), rng, START)
        case = replace(case, kind=KIND)
        cluster = _cluster(case, bcfg)
        if premise(case, bcfg, cluster) is None:
            hosts = tuple(sorted({b for cz in (cluster.incident.causes if cluster.incident else ())
                                  for b in cz.brokers}))
            world = _draw_world(replace(case, hosts=hosts), rng, cluster)
            world.pop("broker_restarts", None)
            group = cluster.incident.culprit_group
            case = replace(case, hosts=hosts, irregular=world,
                           overrides=tuple({**r, "resource": r["resource"] or group} for r in case.overrides))
            if clusters is not None:
                clusters[seed] = cluster
            return case
    raise RuntimeError(f"case {seed}: no {KIND} holding its premise in 50 draws")


def overridden(case, rng: np.random.Generator, start: dt.datetime):
    """The sweep's ``overridden_storm`` (:func:`draw_overridden`): ``case``, a persisting storm, with one
    override of its culprit group drawn from ``rng``: a pin (at 2-80 msg/s) or an exemption, starting from a minute
    before the storm's onset to 4 minutes after it, lasting 1.5-4 minutes; the run goes on at least 4 minutes after
    it ends. ``start``: the run's first instant (UTC). Returns the case with ``overrides`` (``control/overrides``
    rows) and its ``minutes``."""
    spec = dict(case.spec)
    kind = PIN if rng.random() < 0.5 else EXEMPT
    begin = start + dt.timedelta(minutes=spec["onset_minute"] + float(rng.uniform(-1.0, 4.0)))
    end = begin + dt.timedelta(minutes=float(rng.uniform(1.5, 4.0)))
    spec["minutes"] = max(spec["minutes"], int(np.ceil((end - start).total_seconds() / 60)) + 4)
    row: dict[str, Any] = {"recorded_at": begin, "event": CREATE, "override_id": f"ovr-{case.seed:08x}", "kind": kind,
                           "resource_type": "group", "resource": None, "starts_at": begin, "ends_at": end,
                           "limit_qps": round(float(rng.uniform(2.0, 80.0)), 1) if kind == PIN else None,
                           "author": "sweep", "reason": f"drawn by case {case.seed}"}
    return replace(case, spec=spec, overrides=(row,))


def for_cluster(rows: Sequence[dict], cluster, cfg: GovernorConfig) -> list[Override]:
    """A case's override rows on its cluster: the culprit group named (a drawn row names none), parsed."""
    group = cluster.incident.culprit_group if cluster is not None and cluster.incident is not None else None
    overrides, refused = parse([{**r, "resource": r["resource"] or group} for r in rows], cfg)
    if refused:
        raise ValueError(f"the drawn overrides are refused: {refused}")
    return overrides


def judged(figures, result, overrides: Sequence[Override], cfg: GovernorConfig, case=None):
    """A closed loop with overrides judged by :func:`checks` (``case``: its world) and the backtest's check of
    false limits; its other checks (onset, value changes, admitted share, bystanders) hold for the rules alone, not
    for an operator who pins a storm or lets it rage on purpose."""
    kept = [c for c in figures.checks if c[0].startswith("0 enforced limits ")]
    return replace(figures, checks=checks(result, overrides, cfg, case) + kept)
