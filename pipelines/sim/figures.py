"""The figures and checks of a closed loop (the Spark backtest's and the Spark-free simulator's: both hand
over the same result shape). The ``backtest/results`` table: :mod:`pipelines.backtest.results`.

Figures that do not depend on how long the run is (times UTC, simulated; per second from the cluster's arrays):

* ``onset_to_limit_in_force`` (s): first storm second → the first limit on a culprit resource in force at a broker.
* ``culprit_admitted_over_target``: what the culprit's buckets admitted, summed over brokers, ÷ the decided target
  (the record's cluster-wide ``limit_qps``), over the seconds after containment while the cause persists, but for
  the gaps between a pulsed producer's pulses (:mod:`pipelines.sim.pulses`; ``_with_pulse_gaps`` kept beside).
* ``bystander_rejected_per_minute_before`` / ``_after`` (rejected attempts per storm minute of the other resources
  on the culprit's brokers, before and after containment, all episodes together) and
  ``bystander_after_pct_of_before``; per episode of the cause, ``bystander_after_pct_of_before_episode_<k>``
  (after the episode's own containment, against the first episode's rate before containment); the baseline
  ``bystander_rejected_per_minute_no_governor``: the same seconds after containment in the same cluster without
  any limit.
* ``limit_changes_while_cause_persists``: every change of the value in force (the cluster-wide figure; a limit that
  disappears or appears counts) per culprit resource while the cause persists, from the first second of each
  episode with a limit in force: the most of any episode, and ``limit_changes_all_episodes`` summed. Refreshes and a
  final decision that confirms a preliminary one at the same value do not change the value (values within a
  relative 1e-9 are the same value: floating-point noise); nothing else is left out.
* ``onset_to_limit_in_force_episode_<k>`` and ``remembered_target_episode_<k>`` for an episode that starts after
  a lift: how long it ran unlimited, and whether its first limit was the target remembered from the last one.
* ``fix_to_lift_minutes``: the fix (end of the cause) → no limit on the culprit in force at any broker, per episode
  (the details list every episode; the value is the first).
* ``false_limits``: resources (not culprits) that had an enforced limit below their demand at some broker.

Containment = the first culprit limit in force. Ground truth comes from the scenario's :class:`Incident`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from pipelines.sim.probes import PROBE_TARGET_MAX, TARGET_MAX, judge_probes
from pipelines.sim.pulses import sending_nothing
from pipelines.sim.truth import (  # noqa: F401 (the ground truth, importable from here as before)
    FIX_TO_LIFT_MAX_MIN, FIX_TO_LIFT_RECURRENT_MAX_MIN, STORMS, TARGET_RATIO, _changes, _seconds, causes,
    judge_causes, onset_clock, restart_times, truth, unseen_lift,
)
from pipelines.sim.values_in_force import SAME_VALUE_REL, in_force_spans, value_events

#: The targets (docs and checks use these numbers): onset → limit in force; value changes while the cause persists
#: (a retry storm's limit, a surge's); cluster-wide admitted ÷ decided target; bystanders' rejected sends after
#: containment, % of before; fix → lift (a cause that never came back; one that came back, after two recurrences).
ONSET_TO_LIMIT_MAX_S = 100.0
CHANGES_MAX = {"group": 1, "topic": 3}
BYSTANDER_AFTER_MAX_PCT = 1.0
#: A recurrence's first value within this relative distance of the target remembered at the lift.
REMEMBERED_REL = 0.02
#: A storm's decided level against its true target (:mod:`pipelines.sim.levels`; docs/backtest.md says why).
STORM_LEVEL_MIN, STORM_LEVEL_MAX = 0.8, 1.25
#: The most of a surge's carriers' true room its limit may leave unused while its producers are refused.
SURGE_UNUSED_MAX = 0.75


#: Each check's figure (by the check's name's start): the value of :attr:`Figures.values` it is judged by, and
#: whether a larger one (``max``) or a smaller one (``min``) is worse. A case on the open list
#: (tests/sim/sweep_open.toml) stays an expected failure only while each failed check's figure is within its listed
#: figure.
CHECK_FIGURES = {
    "onset -> limit in force": ("onset_to_limit_in_force", "max"),
    "<= 1 change": ("limit_changes_while_cause_persists", "max"),
    "cluster-wide admitted": ("culprit_admitted_over_target_deviation", "max"),
    "admitted within": ("admitted_over_limit_minute_deviation", "max"),
    "admitted <=": ("admitted_over_target_minute_max", "max"),
    "a storm's probe": ("probes_over_their_cost", "max"),
    "a storm's limit at its true target": ("storm_level_deviation", "max"),
    "a surge's limit leaves": ("surge_room_unused_share", "max"),
    "bystander rejected sends": ("bystander_after_pct_worst_episode", "max"),
    "no lift while a cause is active": ("lifts_while_cause_active", "max"),
    "an episode that starts after a lift": ("onset_to_limit_in_force_worst_episode", "max"),
    "each lift <=": ("fix_to_lift_minutes_worst", "max"),
    "lifted <=": ("fix_to_lift_minutes_last", "max"),
    "no limit set again": ("limits_again_while_quiet", "max"),
    "0 enforced limits": ("false_limits", "max"),
}


def check_figure(name: str) -> tuple[str, str] | None:
    """The figure a check (by its name) is judged by (:data:`CHECK_FIGURES`), None for one without."""
    return next((fig for start, fig in CHECK_FIGURES.items() if name.startswith(start)), None)


@dataclass
class Figures:
    """``values``: metric → (value, unit, resource class); ``details``: metric → text; ``checks``: (name, ok,
    measured); ``carriers``: each required cause's resource (``(resource_type, resource)``) → the brokers carrying
    it, where a limit on it can be in force (the ground truth of the world, for :func:`pipelines.sim.sweep.
    fastest_in_force`)."""

    values: dict[str, tuple[float, str, str]]
    details: dict[str, str]
    checks: list[tuple[str, bool, str]]
    carriers: dict = field(default_factory=dict)

    def value(self, name: str) -> float:
        return self.values.get(name, (float("nan"), "", ""))[0]


def targets_in_force(result, culprits) -> tuple[np.ndarray, dict]:
    """Per second: the culprits' cluster-wide target in force (NaN = none) summed over culprit resources, and per
    resource its per-second target."""
    c = result.cluster
    n = c.T * 60
    per: dict = {r: np.full(n, np.nan) for r in sorted(culprits)}  # sorted: the sum's order, whatever the hash seed
    for lo, hi, snap in in_force_spans(result):
        for (b, rt, r), (_qps, rec) in snap.items():
            if (rt, r) in per:
                per[(rt, r)][lo:hi] = float(rec["limit_qps"])
    total = np.full(n, np.nan)
    for arr in per.values():
        total = np.where(np.isnan(total), arr, np.where(np.isnan(arr), total, total + arr))
    return total, per


def _deviations(values: dict, judged: dict, episodes: list[dict]) -> None:
    """The figures :data:`CHECK_FIGURES` judges checks by that no other step sets: each a number that grows as the
    check fails worse (a ratio's distance from 1 as the larger of it and its inverse; NaN where nothing was
    judged)."""
    nan = float("nan")

    def spread(x: float) -> float:
        return max(x, 1.0 / x) if np.isfinite(x) and x > 0 else nan

    values["culprit_admitted_over_target_deviation"] = (
        spread(values.get("culprit_admitted_over_target", (nan,))[0]), "ratio", "incident")
    lo, hi = (values.get(k, (nan,))[0] for k in ("admitted_over_limit_minute_min", "admitted_over_limit_minute_max"))
    values["admitted_over_limit_minute_deviation"] = (max(spread(lo), spread(hi)) if np.isfinite(lo) else nan,
                                                      "ratio", "incident")
    minutes = judged.get("target_minutes", [])
    values["admitted_over_target_minute_max"] = (max((r for *_, r, _p in minutes), default=nan), "ratio", "incident")
    pr = judged.get("probes") or {}
    values["probes_over_their_cost"] = (float(len(pr.get("high", [])) + len(pr.get("long", [])) +
                                              len(pr.get("blind", []))), "count", "incident")
    storms = [x for x in judged.get("levels", []) if x.kind == "storm" and np.isfinite(x.figure)]
    values["storm_level_deviation"] = (max((max(1.0 / x.figure if x.figure > 0 else np.inf, x.settled)
                                            for x in storms), default=nan), "ratio", "incident")
    pcts = [ep["pct"] for ep in episodes if ep["contained"] is not None and np.isfinite(ep["pct"])]
    values["bystander_after_pct_worst_episode"] = (max(pcts) if pcts else nan, "pct", "bystander")
    again = [ep["contained"] for ep in episodes if ep["k"] > 1 and not ep["in_force_at_start"]]
    values["onset_to_limit_in_force_worst_episode"] = (
        float(max(again)) if again and None not in again else nan, "s", "incident")


def remembered_target(result, per: dict, at: pd.Timestamp) -> float | None:
    """The target the governor remembered for the culprits limited at ``at`` (``per``: resource → per-second
    target, :func:`targets_in_force`): the sum of each one's ``lifted_target_qps`` in its newest ``state/policy``
    row saved before ``at`` (``result.states``); None without saved rows (the Spark backtest), or when one of them
    remembered none."""
    states = getattr(result, "states", None)
    if not states:
        return None
    i = int((at - result.cluster.start).total_seconds())
    total, found = 0.0, False
    for res, arr in per.items():
        if not 0 <= i < arr.size or np.isnan(arr[i]):
            continue
        rows = [(now, r) for now, r in states if (r["resource_type"], r["resource"]) == res and pd.Timestamp(now) < at
                and r.get("last_lift_end") is not None]
        memory = max(rows, key=lambda x: x[0])[1].get("lifted_target_qps") if rows else None
        if memory is None:
            return None
        total, found = total + float(memory), True
    return total if found else None


@dataclass(frozen=True)
class JudgedRun:
    """One closed-loop run as the steps of :func:`compute` read it: its ``cluster`` and its length (``n`` seconds;
    ``sec``: 0..n-1), the ground truth (``culprits``: the resources a correct governor may limit, ``spans``: when a
    cause is active, :func:`truth`; ``found``: the causes, ``required``: those a limit is required for,
    :func:`causes`), each pair's (resource_type, resource) (``key``) and whether it is a culprit's (``is_culprit``),
    and per second: a cause active (``active``), the culprits' cluster-wide target in force (``target``, msg/s,
    NaN: none; ``per``: per culprit resource, :func:`targets_in_force`) and whether one is (``limited``)."""

    cluster: object
    n: int
    sec: np.ndarray
    culprits: set
    spans: list
    found: list
    required: list
    key: list
    is_culprit: np.ndarray
    active: np.ndarray
    target: np.ndarray
    per: dict
    limited: np.ndarray


def _judged_run(result) -> JudgedRun:
    """The :class:`JudgedRun` of ``result`` (:class:`pipelines.backtest.loop.LoopResult`)."""
    c = result.cluster
    culprits, spans = truth(result)
    n = c.T * 60
    key = list(zip(c.pairs["resource_type"], c.pairs["resource"]))
    active = _seconds(result, spans)
    target, per = targets_in_force(result, culprits)
    found = causes(result)
    return JudgedRun(c, n, np.arange(n), culprits, spans, found, [cz for cz in found if cz.required], key,
                     np.array([k in culprits for k in key], dtype=bool), active, target, per, ~np.isnan(target))


def _onset_figures(result, run: JudgedRun, values: dict, details: dict) -> int | None:
    """Adds to ``values`` (and ``details``) the onset → limit in force of the slowest required cause (s from its
    :func:`onset_clock`; NaN: one never limited), when the last of them was first limited and the latest clock (s
    from the run's start). Returns the first second (from the run's start) with every required cause's limit in
    force at a broker; None when one never was, or none is required."""
    c, nan = run.cluster, float("nan")
    first_in: dict = {}
    for cz in run.found:
        res = (cz.resource_type, cz.resource)
        times = [t for t, snap in result.in_force if any((rt, r) == res for _, rt, r in snap)]
        first_in[cz] = min(times) if times else None
    required = run.required
    if not required:
        return None
    delays = [(first_in[cz] - onset_clock(result, cz)).total_seconds() if first_in[cz] is not None else nan
              for cz in required]
    values["onset_to_limit_in_force"] = (nan if any(np.isnan(delays)) else max(delays), "s", "incident")
    if len(required) > 1:
        details["onset_to_limit_in_force"] = "; ".join(
            f"{cz.resource_type} {cz.resource}: " + ("never limited" if np.isnan(d) else f"{d:.0f} s")
            for cz, d in zip(required, delays))
    if not all(first_in[cz] is not None for cz in required):
        return None
    contain = int(np.ceil((max(first_in[cz] for cz in required) - c.start).total_seconds()))
    values["limit_in_force_at_s"] = (float((max(first_in[cz] for cz in required) - c.start).total_seconds()),
                                     "s", "incident")
    values["onset_clock_s"] = (float(max((onset_clock(result, cz) - c.start).total_seconds()
                                         for cz in required)), "s", "incident")
    return contain


def _complete_containment(result, run: JudgedRun) -> np.ndarray:
    """Per second of the run: complete containment, every carrier of every required cause applying its limit (a
    broker applying later, or its send queue's backlog, is not the limit's work yet); without a required cause, a
    culprit's target in force."""
    c, n, key = run.cluster, run.n, run.key
    complete = np.zeros(n, dtype=bool) if run.required else run.limited.copy()
    if run.required:
        complete[:] = True
        need = {(cz.resource_type, cz.resource): set(c.pairs.loc[np.array([k_ == (cz.resource_type, cz.resource)
                                                                            for k_ in key]), "broker"])
                for cz in run.required}
        have = np.zeros(n, dtype=bool)
        for res, carriers in need.items():
            have[:] = False
            for lo_, hi_, snap in in_force_spans(result):
                if carriers <= {b_ for b_, rt, r in snap if (rt, r) == res}:
                    have[lo_:hi_] = True
            complete &= have
    return complete


@dataclass(frozen=True)
class Bystanders:
    """The other resources' rejected sends over a run (:func:`_bystanders`): ``resources`` (per pair: a resource
    neither a culprit's nor background traffic), ``rejected`` (per second, their rejected attempts summed), the
    storm seconds ``before`` complete containment and ``after`` it (without a broker restart's gap), the gaps'
    seconds (``gap``) and the gaps as text (``gaps``: broker HH:MM:SS-HH:MM:SS)."""

    resources: np.ndarray
    rejected: np.ndarray
    before: np.ndarray
    after: np.ndarray
    gap: np.ndarray
    gaps: list[str]

    def per_minute(self, mask: np.ndarray) -> float:
        """Their rejected attempts per minute over the seconds of ``mask`` (NaN: none)."""
        return per_minute(self.rejected, mask)


def per_minute(per_second: np.ndarray, mask: np.ndarray) -> float:
    """A per-second count summed over the seconds of ``mask``, per minute of them (NaN: no such second)."""
    return per_second[mask].sum() / (mask.sum() / 60.0) if mask.any() else float("nan")


def _bystanders(result, run: JudgedRun, contain_all: int | None) -> Bystanders:
    """The :class:`Bystanders` of a run whose containment is complete from second ``contain_all`` (None: never):
    every other resource on every broker (the earlier definition: on the culprits' brokers only), before and after it
    from the first second a cause is active, a broker restart's gap left out (its limiter forgot the limit until the
    next publication reached it: the world's, not a decision)."""
    c, n, sec = run.cluster, run.n, run.sec
    others = (~run.is_culprit) & (c.pairs["kind"] != "background").to_numpy()
    onset = run.spans[0][0] if run.spans else None
    start_s = int((onset - c.start).total_seconds()) if onset is not None else 0
    before = run.active & (sec >= start_s) & (sec < (contain_all if contain_all is not None else n))
    after = run.active & (sec >= (contain_all if contain_all is not None else n))
    gap, gaps = np.zeros(n, dtype=bool), []
    for b_, t_ in restart_times(result):
        back = next((t for t, snap in result.in_force if t > t_ and any(
            (bb, rt, r) in snap for bb, rt, r in snap if bb == b_ and (rt, r) in run.culprits)), c.end)
        lo_g, hi_g = int((t_ - c.start).total_seconds()), int(np.ceil((back - c.start).total_seconds()))
        if hi_g > lo_g and after[lo_g:hi_g].any():
            after[lo_g:hi_g] = False
            gap[lo_g:hi_g] = True
            gaps.append(f"{b_} {t_:%H:%M:%S}-{back:%H:%M:%S}")
    return Bystanders(others, c.second_rejected[:, others].sum(axis=1), before, after, gap, gaps)


def _bystander_figures(run: JudgedRun, by: Bystanders, baseline, values: dict, details: dict) -> float:
    """Adds to ``values`` the bystanders' rejected sends per storm minute before and after complete containment
    (msgs/min), after as % of before (over every other resource, and on the culprits' brokers only: the figure
    the earlier definition), and with ``baseline`` (the cluster run without a governor) the rate after without one; to
    ``details`` the restart gaps left out. Returns the rate before (msgs/min; NaN: no second before)."""
    c, nan = run.cluster, float("nan")
    details["bystander_seconds_left_out"] = ("; ".join(f"{g} (a broker restart: its limiter forgot the limit "
                                                       "until the next publication reached it)" for g in by.gaps)
                                             or "none")
    before, after = by.before, by.after
    rb, ra = by.per_minute(before), by.per_minute(after)
    on_hosts = by.resources & c.pairs["broker"].isin(set(c.pairs.loc[run.is_culprit, "broker"])).to_numpy()
    old_rejected = c.second_rejected[:, on_hosts].sum(axis=1)
    ob, oa = per_minute(old_rejected, before), per_minute(old_rejected, after)
    values["bystander_after_pct_of_before_culprit_brokers"] = (100.0 * oa / ob if ob > 0 else nan, "pct",
                                                                "bystander")
    values["bystander_rejected_per_minute_before"] = (rb, "msgs/min", "bystander")
    values["bystander_rejected_per_minute_after"] = (ra, "msgs/min", "bystander")
    values["bystander_after_pct_of_before"] = (100.0 * ra / rb if rb > 0 else nan, "pct", "bystander")
    if baseline is not None:
        base = baseline.second_rejected[:, by.resources].sum(axis=1)
        values["bystander_rejected_per_minute_no_governor"] = (
            per_minute(base, after), "msgs/min", "bystander")
    return rb


def _episode_start(result, run: JudgedRun, events_of: dict, restarts: list, a: pd.Timestamp, b: pd.Timestamp,
                   lo: int, hi: int) -> int:
    """The second (from the run's start) an episode active ``a``-``b`` (seconds ``lo``-``hi``) is judged from: its
    first, but for an episode whose limit a lift no window could veto yet lands in (:func:`unseen_lift`): the first
    second unlimited from its landing (its first, when the limit stays)."""
    c = run.cluster
    unseen = [u for res in ((cz.resource_type, cz.resource) for cz in run.found) if res in run.per
              if (u := unseen_lift(result, res, events_of[res], a, b, restarts)) is not None]
    if not unseen:
        return lo
    u = min(int(np.ceil((x - c.start).total_seconds())) for x, _d in unseen)
    gap = np.flatnonzero(~run.limited[u:hi])
    return u + int(gap[0]) if gap.size else lo


def _recurrence(result, run: JudgedRun, at: int, before_value: float, last_value: float, k: int) -> dict:
    """An episode ``k`` after a lift first limited at second ``at``: its first value against the target the
    governor remembered at the lift (:func:`remembered_target`; without saved state rows, the Spark backtest's, no
    looser than ``before_value``, the last value in force before it: a first cut that never reached its target is
    remembered at the target, below that value; the check before this one, kept beside), equal to it, and against
    ``last_value`` (at the previous episode's end: the earlier definition). Returns the episode's keys
    ``remembered*`` that apply (none for the first episode or one limited at its start)."""
    target, ep = run.target, {}
    if k > 1 and np.isfinite(before_value):
        memory = remembered_target(result, run.per, run.cluster.start + pd.Timedelta(seconds=at))
        ep["remembered_no_looser"] = bool(target[at] <= before_value * (1.0 + SAME_VALUE_REL))
        ep["remembered_value"] = (float(target[at]), memory)
        ep["remembered"] = (ep["remembered_no_looser"] if memory is None
                            else bool(abs(target[at] / memory - 1.0) <= REMEMBERED_REL))
        ep["remembered_equal"] = bool(abs(target[at] - before_value) <= SAME_VALUE_REL * abs(before_value))
    if k > 1 and np.isfinite(last_value):  # the earlier definition
        ep["remembered_old"] = bool(abs(target[at] - last_value) <= SAME_VALUE_REL * abs(last_value))
    return ep


def _episodes(result, run: JudgedRun, complete: np.ndarray, by: Bystanders, rb: float) -> tuple[list[dict],
                                                                                               np.ndarray]:
    """(each episode of the causes, in order: ``k`` (from 1), ``in_force_at_start``, ``contained`` (s from its
    clock, the first whole minute at its full level, to its first limit; None: never limited), ``clock`` (s from
    the run's start), ``changes`` (the most value changes of a culprit in it), ``pct`` (the bystanders' rejected
    sends per minute after its complete containment, % of ``rb``, the rate before), ``remembered*``
    (:func:`_recurrence`) and ``fix_to_lift`` (minutes from its end to no limit in force; NaN: none); per second,
    each episode from its own complete containment (``complete``) without a restart's gap)."""
    c, n, nan = run.cluster, run.n, float("nan")
    limited, target = run.limited, run.target
    episodes: list[dict] = []
    episode_complete = np.zeros(n, dtype=bool)
    last_value = nan
    restarts = restart_times(result)
    events_of = {res: value_events(result, res) for res in run.per}  # each culprit's value changes, once
    for k, (a, b) in enumerate(run.spans, start=1):
        lo, hi = max(0, int((a - c.start).total_seconds())), min(n, int(np.ceil((b - c.start).total_seconds())))
        if hi <= lo:
            continue
        start = _episode_start(result, run, events_of, restarts, a, b, lo, hi)
        have = np.flatnonzero(limited[start:hi])
        ep = {"k": k, "in_force_at_start": bool(limited[lo]) and start == lo, "contained": None, "changes": None,
              "pct": nan, "remembered": None, "fix_to_lift": nan}
        seen = np.flatnonzero(limited[:start])  # the last value in force before this episode (the lifted one)
        before_value = target[seen[-1]] if seen.size else last_value
        if have.size:
            at = start + int(have[0])
            ramp = max((cz.ramp_seconds for cz in run.found), default=0.0)
            clock = int(np.ceil((lo + ramp) / 60.0 - 1e-9)) * 60  # as onset_clock: first whole minute at full
            ep["contained"], ep["clock"] = at - clock, clock
            mask = np.zeros(n, dtype=bool)
            whole_ep = np.flatnonzero(complete[at:hi])
            mask[at + (int(whole_ep[0]) if whole_ep.size else 0):hi] = True
            mask &= ~by.gap
            if whole_ep.size:
                episode_complete |= mask
            ep["pct"] = 100.0 * by.per_minute(mask) / rb if rb > 0 else nan
            t_at, t_hi = c.start + pd.Timedelta(seconds=at), c.start + pd.Timedelta(seconds=hi)
            counts = [_changes(events_of[res], t_at, t_hi, restarts)[0]
                      for res, arr in run.per.items() if (~np.isnan(arr[at:hi])).any()]
            ep["changes"] = max(counts) if counts else 0
            if not ep["in_force_at_start"]:
                ep.update(_recurrence(result, run, at, before_value, last_value, k))
        if hi < n:
            free = np.flatnonzero(~limited[hi:])
            ep["fix_to_lift"] = free[0] / 60.0 if free.size else nan
        seen = np.flatnonzero(limited[:hi])
        last_value = target[seen[-1]] if seen.size else last_value
        episodes.append(ep)
    return episodes, episode_complete


def _admitted_over_target_figures(run: JudgedRun, contain: int | None, contain_all: int | None, by: Bystanders,
                                  episode_complete: np.ndarray, values: dict, details: dict) -> None:
    """Adds to ``values`` the culprits' admitted rate ÷ the decided (cluster-wide) target (ratios) over the limited
    seconds of each episode from its own complete containment (``episode_complete``: every carrier applies its
    share; a broker applying later is the world's apply delay, not a decision), without a broker restart's gap (its
    limiter forgot: not a decision) nor a pulsed producer's gaps between pulses (nothing sent to admit); kept
    beside: from the first episode's complete containment on (``contain_all``: the figure before this definition,
    which counted a later episode's seconds before its last carrier applied its share), from the first limit in
    force (``contain``: the definition before carriers applied a limit late), and with the pulses' gaps; to ``details``
    its minutes' range and the targets'."""
    c, n, sec, nan = run.cluster, run.n, run.sec, float("nan")
    active, limited, target = run.active, run.limited, run.target
    admitted = c.second_admitted[:, run.is_culprit].sum(axis=1)
    gaps_s = sending_nothing(c)
    first = active & limited & ~gaps_s & (sec >= (contain if contain is not None else n))
    after = first & episode_complete
    after_first_episode = first & (sec >= (contain_all if contain_all is not None else n)) & ~by.gap
    with_gaps = (first | (gaps_s & active & limited)) & episode_complete  # the definition before pulsed producers
    for name, mask in (("culprit_admitted_over_target", after),
                       ("culprit_admitted_over_target_from_first_complete_containment", after_first_episode),
                       ("culprit_admitted_over_target_from_first_limit", first)) + (
            ((("culprit_admitted_over_target_with_pulse_gaps", with_gaps),) if gaps_s.any() else ())):
        values[name] = (admitted[mask].sum() / target[mask].sum() if mask.any() else nan, "ratio", "incident")
    if after.any():
        minute = sec[after] // 60
        per_min = pd.Series(admitted[after]).groupby(minute).sum() / pd.Series(target[after]).groupby(minute).sum()
        details["culprit_admitted_over_target"] = (f"minutes {per_min.min():.2f}-{per_min.max():.2f}; target "
                                                   f"{np.nanmin(target[after]):.1f}-{np.nanmax(target[after]):.1f}"
                                                   " msg/s")


def _recurrence_figures(ep: dict, values: dict) -> None:
    """Adds to ``values`` an episode after a lift's figures (``ep``: :func:`_episodes`'): its onset → limit in force
    (s), its clock (s from the run's start), whether its first value was the remembered target (a bool), and the
    figures beside: its first value ÷ the remembered target, no looser than the last value in force, equal to it,
    and against the value at the previous episode's end."""
    k, nan = ep["k"], float("nan")
    values[f"onset_to_limit_in_force_episode_{k}"] = (
        float(ep["contained"]) if ep["contained"] is not None else nan, "s", "incident")
    values[f"onset_clock_s_episode_{k}"] = (float(ep.get("clock", nan)), "s", "incident")
    values[f"remembered_target_episode_{k}"] = (
        float(ep["remembered"]) if ep["remembered"] is not None else nan, "bool", "incident")
    if ep.get("remembered_value") and ep["remembered_value"][1] is not None:
        value, memory = ep["remembered_value"]
        values[f"recurrence_value_over_remembered_episode_{k}"] = (value / memory, "ratio", "incident")
    if "remembered_no_looser" in ep:  # no looser than the last value in force (the check before)
        values[f"remembered_target_no_looser_episode_{k}"] = (float(ep["remembered_no_looser"]), "bool", "incident")
    if "remembered_equal" in ep:  # equal to the last value in force (the check at 2449589)
        values[f"remembered_target_equal_last_value_episode_{k}"] = (
            float(ep["remembered_equal"]), "bool", "incident")
    if "remembered_old" in ep:  # against the value at the previous episode's end (the earlier definition)
        values[f"remembered_target_at_previous_episode_end_{k}"] = (float(ep["remembered_old"]), "bool", "incident")


def _episode_figures(run: JudgedRun, episodes: list[dict], values: dict, details: dict) -> None:
    """Adds to ``values`` and ``details`` each episode's figures (``episodes``: :func:`_episodes`'): the bystanders'
    rate after its containment (% of before), an episode after a lift's (:func:`_recurrence_figures`), the most
    value changes in one episode and in all (counts), and the fix → lift of the first and the last fix before the
    run's end (minutes)."""
    c, n, nan = run.cluster, run.n, float("nan")
    for ep in episodes:
        values[f"bystander_after_pct_of_before_episode_{ep['k']}"] = (ep["pct"], "pct", "bystander")
        if ep["k"] > 1 and not ep["in_force_at_start"]:
            _recurrence_figures(ep, values)
    changes = [ep["changes"] for ep in episodes if ep["changes"] is not None]
    values["limit_changes_while_cause_persists"] = (float(max(changes)) if changes else nan, "count", "incident")
    values["limit_changes_all_episodes"] = (float(sum(changes)) if changes else nan, "count", "incident")
    details["limit_changes_while_cause_persists"] = ", ".join(
        "n/a" if ep["changes"] is None else str(ep["changes"]) for ep in episodes) + " per episode"
    details["bystander_after_pct_of_before"] = "; ".join(
        f"episode {ep['k']}{'' if ep['in_force_at_start'] or ep['k'] == 1 else ' (after a lift)'}: "
        + ("n/a" if not np.isfinite(ep["pct"]) else f"{ep['pct']:.2f} %") for ep in episodes)
    lifts = [ep["fix_to_lift"] for ep in episodes if int((run.spans[ep["k"] - 1][1] - c.start).total_seconds()) < n]
    if lifts:
        values["fix_to_lift_minutes"] = (lifts[0], "min", "incident")
        values["fix_to_lift_minutes_last"] = (lifts[-1], "min", "incident")
        details["fix_to_lift_minutes"] = ", ".join("not lifted by the end" if np.isnan(x) else f"{x:.1f}"
                                                   for x in lifts)


def _culprit_figures(result, run: JudgedRun, contain: int | None, baseline, values: dict,
                     details: dict) -> tuple[list[dict], list[str]]:
    """Adds to ``values`` and ``details`` the figures of a run with culprits: when containment was complete (s
    after the first limit in force, ``contain``), the bystanders' (:func:`_bystander_figures`), the culprits'
    admitted ÷ target (:func:`_admitted_over_target_figures`) and each episode's (:func:`_episode_figures`).
    Returns (the episodes, :func:`_episodes`; a broker restart's gaps left out of the bystanders' seconds, as
    text)."""
    nan = float("nan")
    complete = _complete_containment(result, run)
    whole = np.flatnonzero(complete & (run.sec >= (contain if contain is not None else run.n)))
    contain_all = int(whole[0]) if whole.size else contain
    values["containment_complete_after_first_s"] = (
        float(contain_all - contain) if contain is not None and contain_all is not None else nan, "s", "incident")
    by = _bystanders(result, run, contain_all)
    rb = _bystander_figures(run, by, baseline, values, details)
    episodes, episode_complete = _episodes(result, run, complete, by, rb)
    _admitted_over_target_figures(run, contain, contain_all, by, episode_complete, values, details)
    _episode_figures(run, episodes, values, details)
    return episodes, by.gaps


def _false_limit_figures(result, run: JudgedRun, values: dict, details: dict) -> None:
    """Adds to ``values`` and ``details`` the resources with an enforced limit (a count) and those without a cause
    (``false_limits``: a count, listed), beside the earlier definition: a healthy topic or group limited
    below its demand at some broker."""
    c, key = run.cluster, run.key
    healthy = ~run.is_culprit & c.pairs["resource_type"].isin(["topic", "group"]).to_numpy()
    below = (c.limited_seconds > 0) & (c.limit_min < c.demand.T) & healthy[None, :]
    old = sorted({f"{t}:{r}" for t, r in np.asarray(key, dtype=object)[below.any(axis=0)]}) if below.any() else []
    values["false_limits_below_demand"] = (float(len(old)), "count", "other")  # the earlier definition
    details["false_limits_below_demand"] = ", ".join(old) or "none"
    enforced = {(rt, r) for _, snap in result.in_force for (_b, rt, r) in snap}
    values["enforced_limit_resources"] = (float(len(enforced)), "count", "all")
    false = sorted(f"{t}:{r}" for t, r in enforced - run.culprits)
    values["false_limits"] = (float(len(false)), "count", "other")
    details["false_limits"] = ", ".join(false) or "none"


def _run_figures(result, values: dict) -> None:
    """Adds to ``values`` the run's own figures: its decisions by action (counts), its steps (a count, the median
    and the longest in s, how many took longer than a trigger), each query's batch seconds in all, the failure
    lines, its wall seconds, and the config it ran with (the propagation delay, the trigger, the watermark: s)."""
    lim = result.limits
    for action in ("set", "relax", "lift"):
        count = float((lim["action"] == action).sum()) if len(lim) else 0.0
        values[f"decisions_{action}"] = (count, "count", "all")
    seconds = np.array([s.seconds for s in result.steps]) if result.steps else np.zeros(1)
    values["steps"] = (float(len(result.steps)), "count", "run")
    values["step_seconds_median"] = (float(np.median(seconds)), "s", "run")
    values["step_seconds_max"] = (float(seconds.max()), "s", "run")
    values["steps_over_trigger"] = (float((seconds > result.trigger_seconds).sum()), "count", "run")
    for query in ("ingest", "fast", "gold"):
        values[f"{query}_batch_seconds_total"] = (float(sum(s.query_seconds.get(query, 0.0) for s in result.steps)),
                                                  "s", "run")
    values["failure_lines"] = (float(result.failure_lines), "count", "run")
    values["wall_seconds"] = (float(result.wall_seconds), "s", "run")
    values["propagation_seconds"] = (float(result.propagation_seconds), "s", "config")
    values["trigger_seconds"] = (float(result.trigger_seconds), "s", "config")
    values["watermark_seconds"] = (float(result.watermark_seconds), "s", "config")


def compute(result, baseline=None) -> Figures:
    """The figures and checks of one closed-loop run (:class:`pipelines.backtest.loop.LoopResult`). ``baseline``:
    the same scenario's cluster run to its end without any limit (:class:`~pipelines.sim.cluster.ClosedLoopCluster`),
    for the bystanders' rejected sends per storm minute after containment without a governor."""
    run = _judged_run(result)
    values: dict[str, tuple[float, str, str]] = {}
    details: dict[str, str] = {}
    episodes: list[dict] = []
    gaps: list[str] = []
    contain = _onset_figures(result, run, values, details)
    if run.culprits:
        episodes, gaps = _culprit_figures(result, run, contain, baseline, values, details)
    _false_limit_figures(result, run, values, details)
    judged = judge_causes(result, run.found, values, details)
    judged["bystander_gaps"] = gaps
    judged["probes"] = judge_probes(result, run.found, values, details)
    _run_figures(result, values)
    _deviations(values, judged, episodes)
    # the culprits' resource type; of several (a storm beside a surge), the strictest bound of CHANGES_MAX, so that
    # the check does not depend on a set's order (the hash seed)
    kind = min({t for t, _ in run.culprits}, key=lambda t: (CHANGES_MAX.get(t, 1), t)) if run.culprits else None
    pairs = run.cluster.pairs
    carriers = {(cz.resource_type, cz.resource): tuple(sorted(set(pairs.loc[
        (pairs["resource_type"] == cz.resource_type) & (pairs["resource"] == cz.resource), "broker"])))
        for cz in run.required}
    return Figures(values, details, _checks(values, kind if run.required else None, episodes, len(run.spans), judged),
                   carriers)


#: How a check that found nothing to judge says so (:func:`pipelines.sim.sweep.verdict` excuses it only for the
#: kinds that list it as optional: :data:`pipelines.sim.sweep.OPTIONAL`).
NO_MINUTE = "no qualifying minute"


def left_out(counts: dict, unit: str) -> str:
    """``; left out: N <unit> <reason>, ...`` for the non-zero ``counts`` (reason → how many), "" when none."""
    items = [f"{n} {unit} {why}" for why, n in counts.items() if n]
    return f"; left out: {', '.join(items)}" if items else ""


def _probe_checks(judged: dict) -> list[tuple[str, bool, str]]:
    """The cause's admitted rate against its decided target in every limited minute (outside a probe and inside
    one, :mod:`pipelines.sim.probes`), and each storm probe against its stated cost."""
    out = []
    minutes = judged.get("target_minutes", [])
    if minutes:
        over = [(nm, m, r, p) for nm, m, r, p in minutes if r > (PROBE_TARGET_MAX if p else TARGET_MAX)]
        inside = [r for *_, r, p in minutes if p]
        out.append((f"admitted <= {TARGET_MAX}x the decided target in every limited minute, <= {PROBE_TARGET_MAX}x "
                    "while a probe is in force", not over,
                    f"{max(r for *_, r, _p in minutes):.2f}x at most over {len(minutes)} minutes ({len(inside)} under "
                    f"a probe{f', at most {max(inside):.2f}x' if inside else ''})" + (
                        "; " + ", ".join(f"{nm} minute {m}: {r:.2f}x" + (" (probe)" if p else "")
                                         for nm, m, r, p in over[:4]) if over else "")))
    pr = judged.get("probes") or {}
    if pr.get("probes"):
        bad = pr["high"] + pr["long"] + pr["blind"]
        out.append(("a storm's probe keeps its cost: at most relax_factor x, undone within probe_max_windows "
                    "windows, never after a minute under its cap", not bad,
                    f"{len(pr['probes'])} probes" + (": " + "; ".join(bad[:4]) if bad else "")))
    return out


def _level_checks(levels: list) -> list[tuple[str, bool, str]]:
    """Each cause's level against the ground truth in every episode (:mod:`pipelines.sim.levels`): a storm's
    lowest decided level at least :data:`STORM_LEVEL_MIN` × its true target and its last at most
    :data:`STORM_LEVEL_MAX` × it (an episode never limited at every carrier fails, as no qualifying minute); a
    surge's carriers' room left unused at most :data:`SURGE_UNUSED_MAX` of it while its producers are refused (an
    episode in which the limiter refused none of them leaves no room unused)."""
    out = []
    storms = [x for x in levels if x.kind == "storm"]
    if storms:
        def text(x) -> str:
            if not np.isfinite(x.figure):
                return f"{x.name} episode {x.episode}: {NO_MINUTE}" + left_out(
                    {k: v for k, v in x.left_out.items() if k != "target"}, "s")
            return (f"{x.name} episode {x.episode}: lowest {x.figure:.2f}x of {x.target:.1f} msg/s "
                    f"({x.left_out.get('target', '')}), last {x.settled:.2f}x of the rule's")
        none = [x for x in storms if not np.isfinite(x.figure)]
        bad = [x for x in storms if np.isfinite(x.figure) and not (
            x.figure >= STORM_LEVEL_MIN and x.settled <= STORM_LEVEL_MAX)]
        out.append((f"a storm's limit at its true target: lowest >= {STORM_LEVEL_MIN}x, last <= {STORM_LEVEL_MAX}x "
                    "in every episode", not bad and not none,
                    ("" if bad or not none else f"{NO_MINUTE}: ") + "; ".join(text(x) for x in (bad + none or
                                                                                       storms)[:6])))
    surges = [x for x in levels if x.kind == "surge"]
    if surges:
        def said(x) -> str:
            if not x.minutes:
                return f"{x.name} episode {x.episode}: none of its producers' sends refused by the limiter"
            return (f"{x.name} episode {x.episode}: {x.figure:.0%} of {x.target:.1f} msg/s unused over {x.minutes} "
                    "min" + left_out(x.left_out, "minutes"))
        bad = [x for x in surges if x.minutes and not x.figure <= SURGE_UNUSED_MAX]
        out.append((f"a surge's limit leaves at most {SURGE_UNUSED_MAX:.0%} of its carriers' true room unused while "
                    "its producers are refused, in every episode", not bad,
                    "; ".join(said(x) for x in (bad or surges)[:6])))
    return out


def _recurrence_text(ep: dict) -> str:
    """An episode after a lift: its first value against the remembered target (or, without one, against the last
    value in force)."""
    value, memory = ep.get("remembered_value") or (float("nan"), None)
    if memory is None:
        return "no looser than the last value" if ep["remembered"] else "looser than the last value"
    return f"{value:.1f} msg/s against {memory:.1f} remembered ({value / memory:.2f}x)"


def _lift_check(lifts: list, every_fix_worst: float) -> tuple[str, bool, str]:
    """The lift check (:class:`pipelines.sim.truth.LiftAfterFix`): each judged fix lifted within its deadline, or,
    for a topic held under its normal floor, named for a person by then (the alert fired; reported apart, beside the
    automatic lifts); the figure over every fix, the check before recurrences were damped, kept beside."""
    def ok(x) -> bool:  # NaN (not lifted) fails
        return x.minutes <= x.judged() or x.named is not None

    def text(x) -> str:
        lifted = "not lifted" if np.isnan(x.minutes) else f"{x.minutes:.1f} min"
        named = f", named for a person ({x.named[0]} at {x.named[1]:%H:%M:%S})" if x.named else ""
        final = " (final fix)" if x.episodes > 1 else ""
        return f"{x.name} fixed {x.fixed:%H:%M:%S}{final}: {lifted}{named}"

    automatic = sum(1 for x in lifts if x.minutes <= x.judged())
    named = sum(1 for x in lifts if not x.minutes <= x.judged() and x.named is not None)
    lo, hi = FIX_TO_LIFT_MAX_MIN, FIX_TO_LIFT_RECURRENT_MAX_MIN
    return (f"each lift <= {lo:.0f} event minutes after its fix (a cause with one episode, {lo:.0f} quiet minutes "
            f"after it), <= {hi:.0f} after the final fix of one that came back", all(ok(x) for x in lifts),
            "; ".join(text(x) for x in lifts) + f" ({automatic} lifted, {named} named for a person; every fix before "
            f"recurrences were damped: worst {every_fix_worst:.1f} min)")


def _change_check(get, judged: dict, kind: str) -> tuple[str, bool, str]:
    """The value changes' check (``get``: a figure by name; ``judged``: :func:`pipelines.sim.truth.judge_causes`):
    each cause's changes while it persists against :data:`CHANGES_MAX` for its resource type, the changes left
    out listed; without judged causes, the culprit's (``kind``: its resource type) most in one episode."""
    if judged["changes"]:
        ok = all(most <= CHANGES_MAX.get(cz.resource_type, 1) for cz, most in judged["changes"])
        measured = ", ".join(f"{cz.resource_type} {cz.resource}: {most}" for cz, most in judged["changes"])
        excluded = get("limit_value_changes_excluded")
        return ("<= 1 change of a storm's limit value, <= 3 of a surge's, while the cause persists (every "
                "change, whatever its duration)", ok,
                measured + (f"; left out ({len(judged['excluded'])}): {'; '.join(judged['excluded'])}"
                            if excluded else ""))
    most = CHANGES_MAX[kind]
    x = get("limit_changes_while_cause_persists")
    return (f"<= {most} change{'s' if most > 1 else ''} of the limit's value while the cause persists",
            bool(x <= most), f"{x:.0f} (most in one episode; {get('limit_changes_all_episodes'):.0f} in all)")


def _admitted_checks(get, judged: dict) -> list[tuple[str, bool, str]]:
    """The culprits' admitted rate within :data:`TARGET_RATIO` of the decided target, cluster-wide and in every
    judged limited minute (no judged minute fails, with the minutes left out by reason); ``get``: a figure by name,
    ``judged``: :func:`pipelines.sim.truth.judge_causes`."""
    out = []
    x = get("culprit_admitted_over_target")
    lo, hi = TARGET_RATIO
    out.append((f"cluster-wide admitted within {lo}x-{hi}x the decided target", bool(lo <= x <= hi), f"{x:.2f}x"))
    left = dict(judged.get("minutes_left_out") or {})
    if judged.get("busy_minutes"):
        left[f"with a busy carrier (it refused sends before its limiter; with them "
             f"{get('admitted_over_limit_minute_min_with_busy'):.2f}x at the least)"] = len(judged["busy_minutes"])
    name = f"admitted within {lo}x-{hi}x the limit in every limited minute"
    if judged["minutes"]:
        bad = [(nm, m, r) for nm, m, r in judged["minutes"] if not lo <= r <= hi]
        out.append((name, not bad,
                    f"{get('admitted_over_limit_minute_min'):.2f}x-{get('admitted_over_limit_minute_max'):.2f}x "
                    f"over {len(judged['minutes'])} minutes" + (
                        "; " + ", ".join(f"{nm} minute {m}: {r:.2f}x" for nm, m, r in bad[:4]) if bad else "")
                    + left_out(left, "minutes")))
    else:
        out.append((name, False, NO_MINUTE + left_out(left, "minutes")))
    return out


def _bystander_check(get, judged: dict, episodes: list[dict]) -> tuple[str, bool, str]:
    """The bystanders' rejected sends after each limited episode's own containment at most
    :data:`BYSTANDER_AFTER_MAX_PCT` % of before (``episodes``: :func:`_episodes`'), a broker restart's gaps left
    out; ``get``: a figure by name, ``judged``: :func:`pipelines.sim.truth.judge_causes`."""
    held = [ep for ep in episodes if ep["contained"] is not None]  # every episode limited, after a lift too
    ok = bool(held) and all(ep["pct"] <= BYSTANDER_AFTER_MAX_PCT for ep in held)
    measured = "; ".join(f"episode {ep['k']}" + ("" if ep["k"] == 1 or ep["in_force_at_start"] else
                                                 " (after a lift)") + ": "
                         + ("n/a" if not np.isfinite(ep["pct"]) else f"{ep['pct']:.2f} %") for ep in held)
    return (f"bystander rejected sends per storm minute after containment <= {BYSTANDER_AFTER_MAX_PCT:.0f} % "
            "of before, in every episode (each from its own containment)", ok,
            f"{measured} (all episodes: {get('bystander_after_pct_of_before'):.2f} %)" + (
                "; left out: " + "; ".join(f"{g} (a broker restart's gap)" for g in judged["bystander_gaps"])
                if judged.get("bystander_gaps") else ""))


def _after_lift_checks(get, v: dict, judged: dict, episodes: list[dict],
                       n_spans: int) -> list[tuple[str, bool, str]]:
    """The checks of what follows a lift or a fix: no lift while a cause is active, an episode after a lift limited
    within :data:`ONSET_TO_LIMIT_MAX_S` at the remembered target, each fix lifted in time (:func:`_lift_check`; or,
    without judged causes, the last fix of the run's ``n_spans`` episodes), and no limit set again while a fixed
    cause is quiet; ``get``: a figure by name of ``v``, ``judged``: :func:`pipelines.sim.truth.judge_causes`."""
    out = []
    if judged["changes"]:
        out.append(("no lift while a cause is active", not judged["lifts"],
                    ("; ".join(judged["lifts"]) or "none") + (
                        "; left out (judged as episodes after a lift): " + "; ".join(judged["lifts_unseen"])
                        if judged.get("lifts_unseen") else "")))
    again = [ep for ep in episodes if ep["k"] > 1 and not ep["in_force_at_start"]]
    if again:
        ok = all(ep["contained"] is not None and ep["contained"] <= ONSET_TO_LIMIT_MAX_S and ep["remembered"]
                 for ep in again)
        out.append((f"an episode that starts after a lift is limited within {ONSET_TO_LIMIT_MAX_S:.0f} s at the "
                    f"remembered target (within {REMEMBERED_REL:.0%})", ok,
                    "; ".join(f"episode {ep['k']}: {ep['contained']} s, {_recurrence_text(ep)}" for ep in again)))
    lifts = [x for x in judged.get("lift_after_fix", []) if x.judged() is not None]
    if lifts:
        out.append(_lift_check(lifts, get("fix_to_lift_minutes_worst")))
    elif "fix_to_lift_minutes" in v and not judged["changes"]:
        recurrent = n_spans > 1
        most = FIX_TO_LIFT_RECURRENT_MAX_MIN if recurrent else FIX_TO_LIFT_MAX_MIN
        x = get("fix_to_lift_minutes_last")
        out.append((f"lifted <= {most:.0f} event minutes after the {'last ' if recurrent else ''}fix",
                    bool(x <= most), "not lifted" if np.isnan(x) else f"{x:.1f} min"))
    if judged["fix_to_lift"]:
        out.append(("no limit set again while a fixed cause is quiet (after its lift, before it comes back)",
                    not judged["relimits"], "; ".join(judged["relimits"]) or "none"))
    return out


def _checks(v: dict, kind: str | None, episodes: list[dict], n_spans: int,
            judged: dict | None = None) -> list[tuple[str, bool, str]]:
    """The targets for this scenario: (check, passed, measured). ``kind``: the culprit's resource type (None: no
    cause a limit is required for, e.g. a flash sale or a normal day); ``judged``:
    :func:`pipelines.sim.truth.judge_causes`."""
    def get(name: str) -> float:
        return v.get(name, (float("nan"), "", ""))[0]

    judged = judged or {"changes": [], "lifts": [], "minutes": [], "fix_to_lift": [], "relimits": []}
    out: list[tuple[str, bool, str]] = []
    if kind is not None:
        x = get("onset_to_limit_in_force")
        out.append((f"onset -> limit in force <= {ONSET_TO_LIMIT_MAX_S:.0f} s", bool(x <= ONSET_TO_LIMIT_MAX_S),
                    "a required cause never limited" if np.isnan(x) else f"{x:.0f} s"))
        out.append(_change_check(get, judged, kind))
        out += _admitted_checks(get, judged)
        out += _probe_checks(judged)
        out += _level_checks(judged.get("levels", []))
        out.append(_bystander_check(get, judged, episodes))
        out += _after_lift_checks(get, v, judged, episodes, n_spans)
    x = get("false_limits")
    out.append(("0 enforced limits on a resource without a cause", x == 0, f"{x:.0f}"))
    return out
