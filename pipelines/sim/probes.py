"""A retry-storm limit's probes judged against the ground truth: the cost each stated and kept (for
:mod:`pipelines.sim.figures`).

A probe raises a storm's limit at its cap ×``limits.relax_factor`` to see whether the demand behind it is still
there (docs/decisions.md §4). It is an experiment on a live cluster, so it keeps to its stated cost:

* **at most** ``relax_factor`` × the level before it;
* **at most** ``limits.probe_max_windows`` windows (and one trigger: the earliest a whole window under it is read
  and decided on) from its publication to the publication of its undo or its lift;
* **only while the cause is on**: never published after a whole minute whose admitted rate sat under
  ``limits.bound_share`` of the limit in force (the ground truth of the newest minute the governor could have seen:
  one whose stats landed by the decision, :data:`SEEN_AFTER_SECONDS`).

And while one is in force the cause's admitted rate stays within :data:`PROBE_TARGET_MAX` × the decided target (the
level before it), as it does within :data:`TARGET_MAX` outside probes. A surge limit's upward steps are no
experiments of this kind: they stay while the carriers are healthy (bounded by their busy writes and the change
budget, which the change count judges).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from pipelines.config import LimitsConfig
from pipelines.decide.words import Action
from pipelines.sim.values_in_force import in_force_spans, value_at, value_events

#: The most a cause's admitted rate may be over its decided target in a limited minute, outside a probe and inside
#: one (a probe at relax_factor 1.5, with the bucket's burst: 1.6).
TARGET_MAX = 1.25
PROBE_TARGET_MAX = 1.6
#: A minute's stats line is taken as read by a decision this long after the ingest trigger that found it landed
#: (its events written: the simulator's ingest time).
SEEN_AFTER_SECONDS = 2.0
#: Relative tolerance of a raise's factor (floating-point noise of a limit × 1.5).
FACTOR_REL = 1e-9
#: The windows' length (s: the shipped ``windows.length_seconds``) and the most a decision takes after its trigger
#: (s: the simulator's modelled processing, :class:`pipelines.sim.loop.Timing`): a probe is undone, unless lifted,
#: within ``limits.probe_max_windows`` windows, one trigger and this (:meth:`pipelines.decide.limits.base.LimitPolicy.
#: probe_deadline`).
WINDOW_SECONDS = 60.0
DECISION_SECONDS = 2.0


@dataclass(frozen=True)
class Probe:
    """One probe of a storm cause's limit: decided (``relax``) at ``decided`` (UTC) from ``before`` to ``raised``
    msg/s, ended by the resource's next decision (``ended``, ``how``: its action, None: not by the run's end)."""

    name: str
    decided: pd.Timestamp
    before: float
    raised: float
    ended: pd.Timestamp | None
    how: str | None

    def seconds(self, run_end: pd.Timestamp) -> float:
        """From its decision to its end's (or the run's end), seconds."""
        return ((self.ended or run_end) - self.decided).total_seconds()


def probes(result, resource: tuple[str, str], name: str) -> list[Probe]:
    """The probes of ``resource`` from the run's decisions (``result.limits``: ``relax`` rows and the decision that
    followed each), in decision order."""
    lim = getattr(result, "limits", None)
    if lim is None or len(lim) == 0:
        return []
    mine = lim[(lim["resource_type"] == resource[0]) & (lim["resource"] == resource[1])].sort_values(
        ["decided_at", "version"])
    rows = list(mine.itertuples(index=False))
    out = []
    for i, r in enumerate(rows):
        if r.action != str(Action.RELAX):
            continue
        nxt = next((x for x in rows[i + 1:] if x.limit_qps != r.limit_qps or x.action == str(Action.LIFT)), None)
        out.append(Probe(name, pd.Timestamp(r.decided_at), float(r.previous_qps or np.nan), float(r.limit_qps),
                         pd.Timestamp(nxt.decided_at) if nxt is not None else None,
                         str(nxt.action) if nxt is not None else None))
    return out


def judge_probes(result, found: list, values: dict, details: dict) -> dict:
    """Every storm cause's probes against their stated cost (module docstring): the figures ``probes``,
    ``probe_seconds_max``, ``probe_factor_max`` and the failures of each rule, with their details. Returns
    ``{"probes": [...], "long": [...], "high": [...], "blind": [...]}`` (the probes that broke a rule)."""
    c = result.cluster
    limits_cfg = getattr(result, "limits_cfg", None) or LimitsConfig()
    most, factor, share = limits_cfg.probe_max_windows, limits_cfg.relax_factor, limits_cfg.bound_share
    allowed = most * WINDOW_SECONDS + float(result.trigger_seconds) + DECISION_SECONDS
    run_end = c.start + pd.Timedelta(minutes=c.T)
    out = {"probes": [], "long": [], "high": [], "blind": [], "excused": []}
    for cz in found:
        if cz.resource_type != "group":
            continue
        res = (cz.resource_type, cz.resource)
        for p in probes(result, res, f"{cz.resource_type} {cz.resource}"):
            out["probes"].append(p)
            if p.raised > p.before * factor * (1.0 + FACTOR_REL):
                out["high"].append(f"{p.name} {p.decided:%H:%M:%S}: {p.raised:.1f} from {p.before:.1f} msg/s")
            if p.seconds(run_end) > allowed and (
                    p.ended is not None or run_end - p.decided > pd.Timedelta(seconds=allowed)):
                down = _governor_down(result, p.decided, p.decided + pd.Timedelta(seconds=allowed))
                (out["excused"] if down else out["long"]).append(
                    f"{p.name} {p.decided:%H:%M:%S}: {p.seconds(run_end):.0f} s to its "
                    + (str(p.how) if p.how else "run's end") + (f" (the governor was down {down})" if down else ""))
            under = _under_cap_before(result, res, p.decided, share)
            if under is not None:
                out["blind"].append(f"{p.name} {p.decided:%H:%M:%S} after the minute ending {under:%H:%M} under "
                                    f"{share:.0%} of its cap")
    values["probes"] = (float(len(out["probes"])), "count", "incident")
    values["probe_seconds_max"] = (max((p.seconds(run_end) for p in out["probes"]), default=0.0), "s", "incident")
    details["probes"] = "; ".join(f"{p.name} {p.decided:%H:%M:%S} {p.before:.1f}->{p.raised:.1f} msg/s, "
                                  + (f"{p.how} after {p.seconds(run_end):.0f} s" if p.how else "in force at the end")
                                  for p in out["probes"]) or "none"
    return out


def _governor_down(result, a: pd.Timestamp, b: pd.Timestamp) -> str:
    """The governor's downtime (killed, :class:`pipelines.sim.irregular.Irregularity`) overlapping ``a``-``b``, as
    text ("" when none): no decision of it could be published then."""
    irr = getattr(result, "irregular", None)
    if irr is None or irr.governor_restart_second is None or not irr.governor_down_seconds:
        return ""
    c = result.cluster
    up = c.start + pd.Timedelta(seconds=irr.governor_restart_second)
    down = up - pd.Timedelta(seconds=irr.governor_down_seconds)
    return f"{down:%H:%M:%S}-{up:%H:%M:%S}" if down < b and up > a else ""


def _seen_minute(result, resource: tuple[str, str], decided: pd.Timestamp) -> int | None:
    """The newest minute (index) whose line of each broker carrying the resource the governor had read by
    ``decided``: landed (the world's landings, :func:`pipelines.sim.irregular.stats_landings`) by an ingest trigger
    at least :data:`SEEN_AFTER_SECONDS` before it; None before any."""
    from pipelines.sim.irregular import Irregularity, stats_landings

    c = result.cluster
    carriers = set(c.pairs.loc[((c.pairs["resource_type"] == resource[0])
                                & (c.pairs["resource"] == resource[1])).to_numpy(), "broker"])
    bcfg = getattr(result, "bcfg", None)
    default = bcfg.shipping.stats_seconds if bcfg is not None else 5.0
    cutoff = (decided - c.start).total_seconds() - SEEN_AFTER_SECONDS
    trigger = float(result.trigger_seconds)
    landed: dict[int, set] = {}
    for at, m, b in stats_landings(getattr(result, "irregular", None) or Irregularity(), list(c.brokers), c.T,
                                   default):
        if np.ceil(at / trigger - 1e-9) * trigger <= cutoff and b in carriers:  # read at the next ingest trigger
            landed.setdefault(m, set()).add(b)
    seen = [m for m, brokers in landed.items() if brokers >= carriers]
    return max(seen) if seen else None


def _under_cap_before(result, resource: tuple[str, str], decided: pd.Timestamp, share: float):
    """The newest whole minute the governor had read by ``decided`` (:func:`_seen_minute`), when the resource's
    admitted rate in it (ground truth, cluster-wide) was under ``share`` of the limit in force at its end: its end
    (UTC); None when it was at the cap, or nothing was in force."""
    c = result.cluster
    m = _seen_minute(result, resource, decided)
    if m is None or m >= c.T:
        return None
    end = c.start + pd.Timedelta(minutes=m + 1)
    value = value_at(value_events(result, resource), end - pd.Timedelta(microseconds=1))
    if not np.isfinite(value):
        return None
    pairs = ((c.pairs["resource_type"] == resource[0]) & (c.pairs["resource"] == resource[1])).to_numpy()
    admitted = float(c.second_admitted[m * 60:(m + 1) * 60, pairs].sum()) / 60.0
    return end if admitted < share * value else None


def decided_targets(result, resource: tuple[str, str]) -> tuple[np.ndarray, np.ndarray]:
    """Per second of the run: the cause's decided target (msg/s cluster-wide: the value in force, but the level
    before a probe while the probe's raise is in force at a broker; NaN: no limit) and whether a probe was in force
    (a storm cause's ``relax``; a surge's upward steps are decided targets)."""
    c = result.cluster
    n = c.T * 60
    lim = getattr(result, "limits", None)
    relax = {}
    if resource[0] == "group" and lim is not None and len(lim):
        rows = lim[(lim["resource_type"] == resource[0]) & (lim["resource"] == resource[1])
                   & (lim["action"] == str(Action.RELAX))]
        relax = {int(v): float(p) for v, p in zip(rows["version"], rows["previous_qps"])}
    target, probing = np.full(n, np.nan), np.zeros(n, dtype=bool)
    for lo, hi, snap in in_force_spans(result):
        recs = [rec for (_b, rt, r), (_q, rec) in snap.items() if (rt, r) == resource]
        if not recs:
            continue
        newest = max(recs, key=lambda rec: rec.get("version") or 0)
        raised = [rec for rec in recs if int(rec.get("version") or 0) in relax]
        if raised:
            probing[lo:hi] = True
            target[lo:hi] = relax[int(raised[0]["version"])]
        else:
            target[lo:hi] = float(newest["limit_qps"])
    return target, probing
