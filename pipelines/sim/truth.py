"""The ground truth of a closed loop and the judgement of each cause against it (issue 49), for
:mod:`pipelines.sim.figures`: the incident's causes (:func:`causes`, :func:`truth`), where a cause's onset clock
starts (:func:`onset_clock`), which changes of a limit's value count (:func:`_changes`; the values themselves from
the brokers' timeline: :mod:`pipelines.sim.values_in_force`), and per cause its changes, lifts, limited minutes,
fixes and limits set again while it is quiet (:func:`judge_causes`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pandas as pd

from pipelines.config import LimitsConfig
from pipelines.decide.words import Action
from pipelines.sim.levels import storm_levels, surge_levels
from pipelines.sim.probes import decided_targets
from pipelines.sim.pulses import sending_nothing
from pipelines.sim.scenarios import NO_CAUSE, STORM_SCENARIOS
from pipelines.sim.spec import span_seconds
from pipelines.sim.values_in_force import SAME_VALUE_REL, in_force_spans, value_at, value_events

#: Scenarios whose culprit is a consumer group's retry traffic.
STORMS = STORM_SCENARIOS
#: Bounds of the checks that :func:`judge_causes` measures against (the figures module states them all).
TARGET_RATIO = (0.75, 1.25)
FIX_TO_LIFT_MAX_MIN = 8.0
FIX_TO_LIFT_RECURRENT_MAX_MIN = 20.0


def _seconds(result, spans) -> np.ndarray:
    """Per second of the run: inside one of ``spans`` (:func:`pipelines.sim.spec.span_seconds`)."""
    return span_seconds(result.cluster.start, result.cluster.T * 60, spans)


def causes(result) -> list:
    """The incident's causes (:class:`pipelines.sim.spec.Cause`): its own list, or else the one culprit of a
    single-cause scenario (a retry storm's group, a surge's topic); none for a scenario without one
    (:data:`pipelines.sim.scenarios.NO_CAUSE`)."""
    from pipelines.sim.spec import Cause

    inc, c = result.cluster.incident, result.cluster
    if inc is None or inc.kind in NO_CAUSE:
        return []
    if inc.causes:
        return list(inc.causes)
    spans = tuple((pd.Timestamp(a), pd.Timestamp(b)) for a, b in inc.active) or ((pd.Timestamp(inc.onset), c.end),)
    if inc.kind in STORMS:
        return [Cause("group", inc.culprit_group, "storm", spans)]
    return [Cause("topic", inc.culprit_topic, "surge", spans)]


def truth(result) -> tuple[set[tuple[str, str]], list[tuple[pd.Timestamp, pd.Timestamp]]]:
    """(culprit resources a correct governor may limit: every cause's, the spans when a cause is active: the union
    of the causes' spans, merged)."""
    found = causes(result)
    spans = sorted((pd.Timestamp(a), pd.Timestamp(b)) for cause in found for a, b in cause.active)
    merged: list = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return {(cause.resource_type, cause.resource) for cause in found}, merged


def onset_clock(result, cause) -> pd.Timestamp:
    """Where a cause's onset → limit in force is measured from: the first whole stats minute at its full level
    (its start + its ramp, up to the next whole minute of the run). The governor reads minute lines: a cause that
    starts mid-minute, or ramps, shows in that minute's line only in part (a start on a whole minute: the start).
    A surge's clock starts no earlier than its **observable onset** (:func:`observable_onset`): a surge its busy
    brokers cap (another cause crushing them) shows the rule nothing until they admit it."""
    c = result.cluster
    full = (pd.Timestamp(cause.active[0][0]) + pd.Timedelta(seconds=cause.ramp_seconds) - c.start).total_seconds()
    clock = c.start + pd.Timedelta(minutes=int(np.ceil(full / 60.0 - 1e-9)))
    if cause.kind == "surge":
        seen = observable_onset(result, cause)
        clock = max(clock, seen) if seen is not None else clock
    return clock


def observable_onset(result, cause) -> pd.Timestamp | None:
    """The start of the first minute from a surge's start in which its topic's cluster-wide admitted puts (ground
    truth: what the brokers admitted, every attempt) reach the factor the rule applies in that minute
    (``busy_surge_factor`` where ``busy_failures_floor`` of its sends were refused busy, else ``surge_factor``) ×
    its baseline: the median of its admitted puts per minute before the start (the first minute, a broker's start,
    left out; as the rule's baseline is a median of earlier windows). None when no minute does, or without a
    minute before the start."""
    from pipelines.config import DetectionConfig

    c, det = result.cluster, getattr(result, "detection", None) or DetectionConfig()
    pairs = ((c.pairs["resource_type"] == cause.resource_type) & (c.pairs["resource"] == cause.resource)).to_numpy()
    first = int((pd.Timestamp(cause.active[0][0]) - c.start).total_seconds() // 60)
    admitted = c.admitted[:, pairs, :].sum(axis=(1, 2)) / 60.0
    before = admitted[1:first]
    if not pairs.any() or before.size == 0:
        return None
    base = float(np.median(before))
    refused = c.busy_rejected[:, pairs, :].sum(axis=(1, 2))
    for m in range(first, min(c.T, c.minutes_done())):
        factor = det.busy_surge_factor if refused[m] >= det.busy_failures_floor else det.surge_factor
        if admitted[m] >= factor * base:
            return c.start + pd.Timedelta(minutes=m)
    return None


def probe_event_times(result, resource: tuple[str, str], events: list) -> set[pd.Timestamp]:
    """The value events (``events``: :func:`value_events`) of a storm cause's probes (:mod:`pipelines.sim.probes`,
    judged by their own rule): from a ``relax`` decision to the decision that ended it (and the brokers' apply
    delays after it, :data:`PROBE_EVENT_SLACK`), the raise to its level (whichever record carried it: a final
    decision confirming it counts), and the first return to the level before it."""
    from pipelines.sim.probes import probes

    if resource[0] != "group":
        return set()
    out: set[pd.Timestamp] = set()
    same = lambda a, b: abs(a - b) <= SAME_VALUE_REL * abs(b)  # noqa: E731
    run_end = result.cluster.start + pd.Timedelta(minutes=result.cluster.T)
    for p in probes(result, resource, ""):
        until = (p.ended or run_end) + PROBE_EVENT_SLACK
        back = False
        for t, v in events:
            if t < p.decided or t > until or np.isnan(v):
                continue
            if same(v, p.raised) and (p.ended is None or t <= until):
                out.add(t)
            elif not back and p.ended is not None and t >= p.ended and np.isfinite(p.before) and same(v, p.before):
                out.add(t)
                back = True
    return out


#: How long after a decision the brokers may still be applying it (the propagation, an apply delay).
PROBE_EVENT_SLACK = pd.Timedelta(seconds=120)


def restart_times(result) -> list[tuple[str, pd.Timestamp]]:
    """The brokers' restarts of the run's irregular world (``result.irregular``; none for the Spark backtest)."""
    irr = getattr(result, "irregular", None)
    if irr is None:
        return []
    c = result.cluster
    return [(b, c.start + pd.Timedelta(seconds=float(s))) for b, s in irr.broker_restarts]


def first_window_end(a: pd.Timestamp) -> pd.Timestamp:
    """The end of the first whole stats minute of an episode starting at ``a`` (UTC): the earliest instant at which
    a broker's minute line (final or open) can show the episode for a whole window. Its line lands later still, by
    the broker's shipping delay; the bound leaves that out, so it is the policy's best case."""
    return a.ceil("min") + pd.Timedelta(minutes=1) if a != a.floor("min") else a + pd.Timedelta(minutes=1)


def unseen_lift(result, resource: tuple[str, str], events: list, a: pd.Timestamp, b: pd.Timestamp,
                restarts: list) -> tuple[pd.Timestamp, pd.Timestamp] | None:
    """(when it lands, when it was decided) of a lift of ``resource`` that lands in the episode ``a``-``b`` (its
    limit in force at ``a``) but was decided before :func:`first_window_end` of ``a``: no window could show the cause
    back yet, so no policy could have vetoed it (a lift decided in a quiet spell that lands seconds into the next
    episode). Such an episode is judged as one that starts after a lift (limited again within the onset bound at
    the remembered target), not as a lift while active. None: the limit was not in force at ``a``, or was not
    lifted in the episode, or its lift was decided after the episode's first whole window ended (a blind lift)."""
    if np.isnan(value_at(events, a)):
        return None
    gone = _gone(events, a, restarts)
    if gone is None or gone >= b:
        return None
    decided = [t for t in _decided(result, resource, Action.LIFT) if t <= gone]
    if not decided:
        return None
    last = max(decided)
    return (gone, last) if last < first_window_end(a) else None


def _decided(result, resource: tuple[str, str], action=None) -> list[pd.Timestamp]:
    """When ``resource``'s decisions (of ``action``; None: every one) were taken (``result.limits.decided_at``),
    sorted; none without them."""
    limits = getattr(result, "limits", None)
    if limits is None or len(limits) == 0 or "decided_at" not in limits:
        return []
    mine = (limits["resource_type"] == resource[0]) & (limits["resource"] == resource[1])
    if action is not None:
        mine &= limits["action"] == str(action)
    return sorted(pd.Timestamp(t) for t in limits.loc[mine, "decided_at"])


def unseen_changes(result, resource: tuple[str, str], events: list, a: pd.Timestamp, b: pd.Timestamp,
                   ) -> list[pd.Timestamp]:
    """The value changes of ``resource`` (``events``, :func:`value_events`) that land in the episode ``a``-``b``
    (its limit in force at ``a``) but were decided before :func:`first_window_end` of ``a``: the newest decision of
    the resource taken at or before the change is older than the episode's first whole window. A probe, a lift or
    a cut decided in the quiet spell on its evidence is no answer to the episode: the change count starts after
    them (the lift's episode is judged as one after a lift, :func:`unseen_lift`)."""
    if np.isnan(value_at(events, a)):
        return []
    times = _decided(result, resource)
    bound = first_window_end(a)
    out = []
    for t, _v in events:
        if not a < t < b:
            continue
        i = bisect_right(times, t)  # the newest decision at or before the change
        if i == 0 or times[i - 1] >= bound:
            break
        out.append(t)
    return out


@dataclass(frozen=True)
class LiftAfterFix:
    """A cause's fix (an episode's end, ``fixed`` UTC) and its lift: ``minutes`` from the fix to no limit in force at
    any broker (NaN: not before the cause came back, or the run's end), the cause's ``episodes``, whether this is
    its ``final`` fix, the ``quiet`` minutes after it (to the next episode, or the run's end), and for a fix not
    lifted in time when its topic's limit was named for a person by then (:mod:`pipelines.sim.alerts`), the
    instant the alert fired (else None)."""

    name: str
    fixed: pd.Timestamp
    minutes: float
    episodes: int
    final: bool
    quiet: float
    named: object = None

    def judged(self) -> float | None:
        """The deadline this fix is judged by (minutes), None when none: a cause with one episode, its fix followed
        by :data:`FIX_TO_LIFT_MAX_MIN` quiet minutes; a cause that came back, its final fix followed by
        :data:`FIX_TO_LIFT_RECURRENT_MAX_MIN` (an earlier fix may hold the limit through its quiet spell: flap
        damping)."""
        if self.episodes == 1:
            return FIX_TO_LIFT_MAX_MIN if self.quiet >= FIX_TO_LIFT_MAX_MIN else None
        return FIX_TO_LIFT_RECURRENT_MAX_MIN if self.final and self.quiet >= FIX_TO_LIFT_RECURRENT_MAX_MIN else None


def _named(result, cause, fixed: pd.Timestamp, within_min: float):
    """(alert, when) a person was told of ``cause``'s limit held after its fix (:mod:`pipelines.sim.alerts`; the
    run's saved ``state/policy`` rows), None when no alert fired in time or without saved rows (the Spark
    backtest): a topic's by ``RateGovernorLimitUnderNormal`` within ``within_min`` minutes of the fix; any limit by
    ``RateGovernorLimitAtCap`` within :func:`at_cap_named_minutes` of it (it waits for 30 minutes at the cap). Either
    fires before the run's end: a spell still open there is not projected past it."""
    from pipelines.sim.alerts import AT_CAP, alert_for_minutes, at_cap_spells, named_by, under_normal_spells

    states, limits = getattr(result, "states", None), getattr(result, "limits_cfg", None)
    if not states or limits is None:
        return None
    c = result.cluster
    ends = (c.start + pd.Timedelta(minutes=c.T)).to_pydatetime()
    if cause.resource_type == "topic":
        deadline = min((fixed + pd.Timedelta(minutes=within_min)).to_pydatetime(), ends)
        at = named_by(under_normal_spells(states, limits.surge_squeeze_headroom), cause.resource, deadline,
                      alert_for_minutes())
        if at is not None:
            return "RateGovernorLimitUnderNormal", at
    deadline = min((fixed + pd.Timedelta(minutes=at_cap_named_minutes(limits))).to_pydatetime(warn=False), ends)
    at = named_by(at_cap_spells(states, limits.max_at_cap_seconds), cause.resource, deadline,
                  alert_for_minutes(AT_CAP), cause.resource_type)
    return (AT_CAP, at) if at is not None else None


#: Minutes the final path's figures run behind the fix's own minute (the watermark, a trigger, the shipping): how
#: much later than ``max_at_cap_seconds`` after the cap was first reached ``RateGovernorLimitAtCap`` may fire.
AT_CAP_LAG_MIN = 3.0


def at_cap_named_minutes(limits) -> float:
    """The deadline after a fix (minutes) by which ``RateGovernorLimitAtCap`` must have named a limit at its cap
    since the fix at the latest: ``limits.max_at_cap_seconds``, the alert's ``for`` and :data:`AT_CAP_LAG_MIN`."""
    from pipelines.sim.alerts import AT_CAP, alert_for_minutes

    return limits.max_at_cap_seconds / 60.0 + alert_for_minutes(AT_CAP) + AT_CAP_LAG_MIN


#: Minutes before a cut in which a busy carrier makes it a squeeze (:func:`_changes`): a window's stats, the final
#: path's lateness and the propagation.
SQUEEZE_LOOKBACK_MIN = 4


def _gone(events: list, after: pd.Timestamp, restarts: list) -> pd.Timestamp | None:
    """When the value in force is gone (lifted) at or after ``after``: the first NaN event there, but for one at the
    instant a broker restarted that the next event restores at the same value (its limiter forgot the limit until
    the next publication reached it: no decision, as :func:`_changes` reads it). None: never gone."""
    restart_at = {t for _b, t in restarts}
    later = [(t, v) for t, v in events if t >= after]
    for i, (t, v) in enumerate(later):
        if not np.isnan(v):
            continue
        if t in restart_at and i + 1 < len(later) and not np.isnan(later[i + 1][1]):
            before = value_at(events, t - pd.Timedelta(microseconds=1))
            if abs(later[i + 1][1] - before) <= SAME_VALUE_REL * abs(before):
                continue
        return t
    return None


def _changes(events: list, t0: pd.Timestamp, t1: pd.Timestamp, restarts: list,
             busy_before=None, probing: set | None = None) -> tuple[int, int, list[str]]:
    """(value changes in (t0, t1), of which lifts (the value gone at every broker), the changes left out with their
    reason): every change counts whatever its duration, except a value gone at the instant a broker restarted
    (its limiter's memory, not a decision) and its return at the same value, a cut while a broker carrying the
    resource was busy (``busy_before(t)``: one of them fast-failed sends in the :data:`SQUEEZE_LOOKBACK_MIN` minutes
    before ``t``; a limit its brokers could not take, not a flap), and a probe's raise and return (``probing``: their
    times, :func:`probe_event_times`; judged by the probes' own rule)."""
    count = lifts = 0
    excluded: list[str] = []
    restart_at = {t: b for b, t in restarts}
    last = value_at(events, t0)
    skip_return = None
    for t, v in events:
        if not t0 < t < t1:
            continue
        if np.isnan(v) and t in restart_at:
            excluded.append(f"{t:%H:%M:%S} gone at {restart_at[t]}'s restart (its limiter forgot, no decision)")
            skip_return = last
            last = v
            continue
        if skip_return is not None and not np.isnan(v) and abs(v - skip_return) <= SAME_VALUE_REL * abs(skip_return):
            excluded.append(f"{t:%H:%M:%S} back at {v:.1f} msg/s after the restart")
            skip_return, last = None, v
            continue
        skip_return = None
        if probing and t in probing:
            excluded.append(f"{t:%H:%M:%S} {'raised to' if v > last else 'back to'} {v:.1f} msg/s by a probe (judged by "
                            "the probes' rule)")
            last = v
            continue
        if busy_before is not None and not np.isnan(v) and not np.isnan(last) and v < last and busy_before(t):
            excluded.append(f"{t:%H:%M:%S} cut from {last:.1f} to {v:.1f} msg/s while a carrier was busy (squeeze)")
            last = v
            continue
        count += 1
        lifts += int(np.isnan(v))
        last = v
    return count, lifts, excluded


def judge_causes(result, found: list, values: dict, details: dict) -> dict:
    """Each cause judged against the ground truth: its value changes and lifts while it is active (every change,
    :func:`_changes`), the brokers' admitted traffic ÷ its limit in every minute it is limited at each of its
    brokers while it is active and its demand reaches the limit (but for a minute when one of its carriers was
    busy: it refused sends before its limiter saw them; the figure with them kept beside), and each fix → lift where the quiet after the fix
    lasts :data:`FIX_TO_LIFT_MAX_MIN` or more (a shorter quiet spell may hold the limit). Adds its figures to
    ``values`` and ``details``; returns what :func:`_checks` needs."""
    c = result.cluster
    n, nan = c.T * 60, float("nan")
    restarts = restart_times(result)
    key = list(zip(c.pairs["resource_type"], c.pairs["resource"]))
    out = {"changes": [], "lifts": [], "minutes": [], "pulse_minutes": [], "fix_to_lift": [], "excluded": [],
           "lift_after_fix": [], "target_minutes": [],
           "relimits": [],
           "busy_minutes": [], "relimits_with_restarts": [], "lifts_unseen": [],
           "changes_with_unseen": [], "levels": [], "levels_full": [], "minutes_left_out": Counter()}
    storms = [cz.resource for cz in found if cz.kind == "storm"]
    limits = getattr(result, "limits_cfg", None) or LimitsConfig()
    run_end = c.start + pd.Timedelta(seconds=n)
    busy_minutes = c.busy_rejected.sum(axis=2) > 0  # [minute, pair]
    for cz in found:
        res = (cz.resource_type, cz.resource)
        name = f"{cz.resource_type} {cz.resource}"
        events = value_events(result, res)
        probing = probe_event_times(result, res, events)
        carriers = set(c.pairs.loc[[k_ == res for k_ in key], "broker"])
        on_carriers = busy_minutes[:, c.pairs["broker"].isin(carriers).to_numpy()].any(axis=1)

        def busy_before(t: pd.Timestamp, on=on_carriers) -> bool:
            m = int((t - c.start).total_seconds() // 60)
            return bool(on[max(0, m - SQUEEZE_LOOKBACK_MIN):m + 1].any())

        spans = [(pd.Timestamp(a), pd.Timestamp(b)) for a, b in cz.active]
        most = most_with_unseen = 0
        for k, (a, b) in enumerate(spans):
            t0 = next((t for t, v in events if a <= t < b and not np.isnan(v)), None)
            if not np.isnan(value_at(events, a)):
                t0 = a
            unseen = unseen_lift(result, res, events, a, b, restarts)
            early = unseen_changes(result, res, events, a, b)
            # the count before changes decided ahead of the episode were told apart
            whole = _changes(events, t0, b, restarts, busy_before, probing) if t0 is not None else None
            if whole is not None:
                most_with_unseen = max(most_with_unseen, whole[0])
                with_probes = _changes(events, t0, b, restarts, busy_before)[0]
                out["changes_with_probes"] = max(out.get("changes_with_probes", 0), with_probes)
            start = t0
            if whole is not None and unseen is not None:  # as an episode after a lift: from its next limit
                out["lifts_unseen"].append(f"{name} lifted {whole[1]}x while active ({a:%H:%M:%S}-{b:%H:%M:%S}), "
                                           f"landed {unseen[0]:%H:%M:%S}, decided {unseen[1]:%H:%M:%S} before the "
                                           f"episode's first whole window ended ({first_window_end(a):%H:%M:%S})")
                t0 = next((t for t, v in events if unseen[0] < t < b and not np.isnan(v)), None)
            elif whole is not None and early:  # a probe or a cut decided in the quiet spell: counted from after it
                out["excluded"].append(f"{name}: {', '.join(f'{t:%H:%M:%S}' for t in early)} changed as the episode "
                                       f"began ({a:%H:%M:%S}), decided before its first whole window ended "
                                       f"({first_window_end(a):%H:%M:%S})")
                t0 = early[-1]
            if t0 is not None:
                changes, lifts, excluded = whole if t0 == start else _changes(events, t0, b, restarts, busy_before,
                                                                              probing)
                most = max(most, changes)
                out["excluded"] += [f"{name}: {x}" for x in excluded]
                if lifts:
                    out["lifts"].append(f"{name} lifted {lifts}x while active ({a:%H:%M:%S}-{b:%H:%M:%S})")
            if b < run_end:
                quiet_end = spans[k + 1][0] if k + 1 < len(spans) else run_end
                raw = next((t for t, v in events if t >= b and np.isnan(v)), None)  # before issue 49's last fix
                gone = _gone(events, b, restarts)
                if np.isnan(value_at(events, b)):
                    gone = raw = b
                if raw is not None and raw < quiet_end and raw != gone:
                    again = [t for t, v in events if raw < t < quiet_end and not np.isnan(v)]
                    if again:
                        out["relimits_with_restarts"].append(f"{name} fixed {b:%H:%M:%S}, gone {raw:%H:%M:%S} at a "
                                                             f"broker restart, back {again[0]:%H:%M:%S}")
                minutes = (gone - b).total_seconds() / 60.0 if gone is not None and gone < quiet_end else nan
                judged = (quiet_end - b).total_seconds() >= FIX_TO_LIFT_MAX_MIN * 60.0
                out["fix_to_lift"].append((name, f"{b:%H:%M:%S}", minutes, judged))
                out["lift_after_fix"].append(LiftAfterFix(
                    name, b, minutes, len(spans), k == len(spans) - 1, (quiet_end - b).total_seconds() / 60.0,
                    _named(result, cz, b, FIX_TO_LIFT_MAX_MIN) if len(spans) == 1 and not minutes <= FIX_TO_LIFT_MAX_MIN
                    else None))
                if gone is not None and gone < quiet_end:  # set again while the fixed cause is quiet
                    again = [t for t, v in events if gone < t < quiet_end and not np.isnan(v)]
                    if again:
                        out["relimits"].append(f"{name} fixed {b:%H:%M:%S}, lifted {gone:%H:%M:%S}, limited again "
                                               f"{again[0]:%H:%M:%S} while quiet")
        out["changes"].append((cz, most))
        out["changes_with_unseen"].append((cz, most_with_unseen))
        # admitted ÷ limit per limited minute
        pairs = np.array([k_ == res for k_ in key], dtype=bool)
        if not pairs.any():
            continue
        brokers_of = set(c.pairs.loc[pairs, "broker"])
        everywhere, anywhere = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        target = np.full(n, nan)
        for lo, hi, snap in in_force_spans(result):
            recs = {b_: rec for (b_, rt, r), (_q, rec) in snap.items() if (rt, r) == res}
            anywhere[lo:hi] = bool(recs)
            if set(recs) >= brokers_of:
                everywhere[lo:hi] = True
                target[lo:hi] = float(max(recs.values(), key=lambda rec: rec.get("version") or 0)["limit_qps"])
        act = _seconds(result, cz.active)
        between_pulses = sending_nothing(c)
        admitted = c.second_admitted[:, pairs].sum(axis=1)
        demand = c.demand[pairs].sum(axis=0)
        decided, probing_s = decided_targets(result, res)
        if cz.kind == "storm":
            out["levels"] += storm_levels(result, cz, storms, decided, everywhere, limits)
        else:
            out["levels"] += surge_levels(result, cz, everywhere)
            out["levels_full"] += surge_levels(result, cz, everywhere, split="carriers")
        for m in range(c.T):
            sl = slice(m * 60, (m + 1) * 60)
            if act[sl].all() and anywhere[sl].any() and not everywhere[sl].all():
                out["minutes_left_out"]["limited at some carriers only"] += 1
            elif act[sl].all() and everywhere[sl].all() and demand[m] < np.mean(target[sl]):
                out["minutes_left_out"]["demand under the limit"] += 1
            if act[sl].all() and everywhere[sl].all() and demand[m] >= np.mean(target[sl]):
                out["target_minutes"].append((name, m, float(admitted[sl].sum() / decided[sl].sum()),
                                              bool(probing_s[sl].any())))
                # a carrier busy in the minute refused sends before its limiter saw them: not the limiter's figure
                into = "busy_minutes" if on_carriers[m] else "minutes"
                sending = ~between_pulses[sl]  # a pulsed producer's seconds between pulses: nothing to admit
                out[into].append((name, m, float(admitted[sl][sending].sum() / target[sl][sending].sum())))
                if not sending.all():  # the figure with the pulses' gaps counted (before issue 49's pulses), beside
                    out["pulse_minutes"].append(float(admitted[sl].sum() / target[sl].sum()))
    every = [r for _, _, r in out["minutes"] + out["busy_minutes"]]
    values["admitted_over_limit_minute_min_with_busy"] = (min(every) if every else nan, "ratio", "incident")
    details["admitted_over_limit_minute_min_with_busy"] = (
        f"{len(out['busy_minutes'])} limited minutes with a busy carrier left out of the judged ones (the figure "
        "before issue 49's squeeze: every limited minute)")
    if out["pulse_minutes"]:
        values["admitted_over_limit_minute_min_with_pulse_gaps"] = (min(out["pulse_minutes"]), "ratio", "incident")
        details["admitted_over_limit_minute_min_with_pulse_gaps"] = (
            f"{len(out['pulse_minutes'])} limited minutes of pulsed producers judged on the seconds they send; over "
            "every second of those minutes (the gaps between pulses counted), the least")
    ratios = [r for _, _, r in out["minutes"]]
    values["admitted_over_limit_minute_min"] = (min(ratios) if ratios else nan, "ratio", "incident")
    values["admitted_over_limit_minute_max"] = (max(ratios) if ratios else nan, "ratio", "incident")
    values["limited_minutes_judged"] = (float(len(ratios)), "count", "incident")
    lo_, hi_ = TARGET_RATIO
    worst = [f"{nm} minute {m}: {r:.2f}x" for nm, m, r in out["minutes"] if not lo_ <= r <= hi_]
    details["admitted_over_limit_minute_min"] = "; ".join(worst[:6]) or "every judged minute within bounds"
    values["lifts_while_cause_active"] = (float(len(out["lifts"])), "count", "incident")
    details["lifts_while_cause_active"] = "; ".join(out["lifts"]) or "none"
    # the count before issue 49's wider quiet spells: a lift no window could have vetoed yet (:func:`unseen_lift`)
    # counted as a lift while active
    values["lifts_while_cause_active_with_unseen"] = (float(len(out["lifts"]) + len(out["lifts_unseen"])), "count",
                                                      "incident")
    details["lifts_while_cause_active_with_unseen"] = "; ".join(out["lifts"] + out["lifts_unseen"]) or "none"
    judged_lifts = [x for x in out["fix_to_lift"] if x[3]]
    values["fix_to_lift_minutes_worst"] = (max((x[2] for x in judged_lifts), default=nan)
                                           if not any(np.isnan(x[2]) for x in judged_lifts) else float("inf"),
                                           "min", "incident")
    details["fix_to_lift_minutes_worst"] = "; ".join(
        f"{nm} fixed {at}: " + ("not lifted" if np.isnan(m) else f"{m:.1f} min") + ("" if j else " (quiet < 8 min)")
        for nm, at, m, j in out["fix_to_lift"]) or "no fix"
    values["limit_changes_with_unseen_most"] = (float(max((m for _c, m in out["changes_with_unseen"]), default=0)),
                                                "count", "incident")
    details["limit_changes_with_unseen_most"] = (
        "the most value changes of a cause while it persists, counting those decided before its episode's first "
        "whole window ended (the count before issue 49's wider quiet spells)")
    values["limits_again_while_quiet"] = (float(len(out["relimits"])), "count", "incident")
    details["limits_again_while_quiet"] = "; ".join(out["relimits"]) or "none"
    # the count before a broker restart's gap was told from a lift: a limit its limiter forgot and the next
    # publication restored read as lifted and set again (sweep cases 20, 168)
    with_restarts = out["relimits"] + out["relimits_with_restarts"]
    values["limits_again_while_quiet_with_restart_gaps"] = (float(len(with_restarts)), "count", "incident")
    details["limits_again_while_quiet_with_restart_gaps"] = "; ".join(with_restarts) or "none"
    storm = [x for x in out["levels"] if x.kind == "storm" and np.isfinite(x.figure)]
    surge = [x for x in out["levels"] if x.kind == "surge" and np.isfinite(x.figure)]
    values["storm_level_lowest_over_true_target"] = (min((x.figure for x in storm), default=nan), "ratio", "incident")
    values["storm_level_settled_over_true_target"] = (max((x.settled for x in storm), default=nan), "ratio",
                                                      "incident")
    values["surge_room_unused_share"] = (max((x.figure for x in surge), default=nan), "ratio", "incident")
    values["surge_room_unused_share_per_carrier"] = (
        max((x.figure for x in out["levels_full"] if np.isfinite(x.figure)), default=nan), "ratio", "incident")
    details["levels"] = "; ".join(
        f"{x.name} episode {x.episode}: " + (f"lowest {x.figure:.2f}x, settled {x.settled:.2f}x of {x.target:.1f} msg/s"
                                             if x.kind == "storm" else f"{x.figure:.0%} of {x.target:.1f} msg/s unused")
        + f" over {x.minutes} min" for x in out["levels"]) or "none"
    values["limit_value_changes_excluded"] = (float(len(out["excluded"])), "count", "incident")
    details["limit_value_changes_excluded"] = "; ".join(out["excluded"]) or "none"
    return out


