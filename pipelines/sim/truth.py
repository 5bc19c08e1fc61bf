"""The ground truth of a closed loop and the judgement of each cause against it, for
:mod:`pipelines.sim.figures`: the incident's causes (:func:`causes`, :func:`truth`), where a cause's onset clock
starts (:func:`onset_clock`), which changes of a limit's value count (:func:`_changes`; the values themselves from
the brokers' timeline: :mod:`pipelines.sim.values_in_force`), and per cause its changes, lifts, limited minutes,
fixes and limits set again while it is quiet (:func:`judge_causes`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

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
            excluded.append(f"{t:%H:%M:%S} {'raised to' if v > last else 'back to'} {v:.1f} msg/s by a probe (judged "
                            "by the probes' rule)")
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


@dataclass(frozen=True)
class CauseTimeline:
    """One cause as :func:`judge_causes` reads it: ``resource`` ((resource_type, resource)), ``name`` (as the details
    print it), ``spans`` (when it is active, UTC), ``events`` (every change of its value in force,
    :func:`value_events`), ``probing`` (the times of those its probes made, :func:`probe_event_times`), ``busy`` (per
    minute of the run: a broker carrying it refused sends busy) and ``start`` (the run's start, UTC)."""

    resource: tuple[str, str]
    name: str
    spans: list[tuple[pd.Timestamp, pd.Timestamp]]
    events: list[tuple[pd.Timestamp, float]]
    probing: set[pd.Timestamp]
    busy: np.ndarray
    start: pd.Timestamp

    def busy_before(self, t: pd.Timestamp) -> bool:
        """Whether a carrier was busy in ``t``'s minute or the :data:`SQUEEZE_LOOKBACK_MIN` minutes before it (a cut
        at ``t`` is then a squeeze, :func:`_changes`)."""
        m = int((t - self.start).total_seconds() // 60)
        return bool(self.busy[max(0, m - SQUEEZE_LOOKBACK_MIN):m + 1].any())


def _cause_timeline(result, cause, busy_minutes: np.ndarray, key: list) -> CauseTimeline:
    """The :class:`CauseTimeline` of ``cause``: its value events and probes' events from the run, and per minute
    whether one of its carriers was busy (``busy_minutes``: [minute, pair] a pair's broker refused sends busy;
    ``key``: each pair's (resource_type, resource))."""
    c = result.cluster
    res = (cause.resource_type, cause.resource)
    events = value_events(result, res)
    carriers = set(c.pairs.loc[[k_ == res for k_ in key], "broker"])
    return CauseTimeline(res, f"{cause.resource_type} {cause.resource}",
                         [(pd.Timestamp(a), pd.Timestamp(b)) for a, b in cause.active], events,
                         probe_event_times(result, res, events),
                         busy_minutes[:, c.pairs["broker"].isin(carriers).to_numpy()].any(axis=1), c.start)


@dataclass
class ChangesWhileActive:
    """A cause's value changes while it is active (:func:`_changes_while_active`): ``most``, the most in one episode
    (counted from after the changes decided before the episode's first whole window ended); ``most_with_unseen``,
    the most counting those; ``with_probes``, the most with its probes' raises and returns counted (None: no episode
    with a limit); the texts of its ``lifts`` while active, of the lifts no window could veto yet
    (``lifts_unseen``, judged as episodes after a lift) and of the changes left out (``excluded``), in time order."""

    most: int = 0
    most_with_unseen: int = 0
    with_probes: int | None = None
    lifts: list[str] = field(default_factory=list)
    lifts_unseen: list[str] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)


def _changes_while_active(result, cause: CauseTimeline, restarts: list) -> ChangesWhileActive:
    """Every episode of ``cause`` from its first second with a limit in force to its end: its value changes and
    lifts (:func:`_changes`), but for changes decided before the episode's first whole window ended
    (:func:`unseen_changes`: counted from after them) and a lift no window could veto yet (:func:`unseen_lift`:
    counted from the next limit, as an episode after a lift); ``restarts``: :func:`restart_times`."""
    res, name, events = cause.resource, cause.name, cause.events
    got = ChangesWhileActive()
    for a, b in cause.spans:
        t0 = next((t for t, v in events if a <= t < b and not np.isnan(v)), None)
        if not np.isnan(value_at(events, a)):
            t0 = a
        unseen = unseen_lift(result, res, events, a, b, restarts)
        early = unseen_changes(result, res, events, a, b)
        # the count before changes decided ahead of the episode were told apart
        whole = _changes(events, t0, b, restarts, cause.busy_before, cause.probing) if t0 is not None else None
        if whole is not None:
            got.most_with_unseen = max(got.most_with_unseen, whole[0])
            with_probes = _changes(events, t0, b, restarts, cause.busy_before)[0]
            got.with_probes = max(got.with_probes or 0, with_probes)
        start = t0
        if whole is not None and unseen is not None:  # as an episode after a lift: from its next limit
            got.lifts_unseen.append(f"{name} lifted {whole[1]}x while active ({a:%H:%M:%S}-{b:%H:%M:%S}), "
                                    f"landed {unseen[0]:%H:%M:%S}, decided {unseen[1]:%H:%M:%S} before the "
                                    f"episode's first whole window ended ({first_window_end(a):%H:%M:%S})")
            t0 = next((t for t, v in events if unseen[0] < t < b and not np.isnan(v)), None)
        elif whole is not None and early:  # a probe or a cut decided in the quiet spell: counted from after it
            got.excluded.append(f"{name}: {', '.join(f'{t:%H:%M:%S}' for t in early)} changed as the episode "
                                f"began ({a:%H:%M:%S}), decided before its first whole window ended "
                                f"({first_window_end(a):%H:%M:%S})")
            t0 = early[-1]
        if t0 is not None:
            changes, lifts, excluded = whole if t0 == start else _changes(events, t0, b, restarts,
                                                                          cause.busy_before, cause.probing)
            got.most = max(got.most, changes)
            got.excluded += [f"{name}: {x}" for x in excluded]
            if lifts:
                got.lifts.append(f"{name} lifted {lifts}x while active ({a:%H:%M:%S}-{b:%H:%M:%S})")
    return got


@dataclass
class FixesJudged:
    """A cause's fixes before the run's end (:func:`_fixes_judged`), in time order: ``fix_to_lift`` (name, the fix
    HH:MM:SS, minutes to its lift (NaN: not lifted in the quiet after it), whether the quiet lasts
    :data:`FIX_TO_LIFT_MAX_MIN` or more), ``lift_after_fix`` (:class:`LiftAfterFix`), and the texts of its limits set
    again while it is quiet (``relimits``) and of those a broker restart's gap made (``relimits_with_restarts``)."""

    fix_to_lift: list[tuple[str, str, float, bool]] = field(default_factory=list)
    lift_after_fix: list[LiftAfterFix] = field(default_factory=list)
    relimits: list[str] = field(default_factory=list)
    relimits_with_restarts: list[str] = field(default_factory=list)


def _fixes_judged(result, cause, timeline: CauseTimeline, restarts: list, run_end: pd.Timestamp) -> FixesJudged:
    """Each fix of ``cause`` (an episode's end before ``run_end``) → its lift in the quiet spell after it (to its
    next episode, or the run's end): the minutes to the lift (:func:`_gone`: a broker restart's gap is no lift),
    whether a person was told of a limit held (:func:`_named`), and a limit set again while the cause is quiet."""
    spans, events, name, nan = timeline.spans, timeline.events, timeline.name, float("nan")
    got = FixesJudged()
    for k, (_a, b) in enumerate(spans):
        if b >= run_end:
            continue
        quiet_end = spans[k + 1][0] if k + 1 < len(spans) else run_end
        raw = next((t for t, v in events if t >= b and np.isnan(v)), None)  # the earlier reading
        gone = _gone(events, b, restarts)
        if np.isnan(value_at(events, b)):
            gone = raw = b
        if raw is not None and raw < quiet_end and raw != gone:
            again = [t for t, v in events if raw < t < quiet_end and not np.isnan(v)]
            if again:
                got.relimits_with_restarts.append(f"{name} fixed {b:%H:%M:%S}, gone {raw:%H:%M:%S} at a "
                                                  f"broker restart, back {again[0]:%H:%M:%S}")
        minutes = (gone - b).total_seconds() / 60.0 if gone is not None and gone < quiet_end else nan
        judged = (quiet_end - b).total_seconds() >= FIX_TO_LIFT_MAX_MIN * 60.0
        got.fix_to_lift.append((name, f"{b:%H:%M:%S}", minutes, judged))
        got.lift_after_fix.append(LiftAfterFix(
            name, b, minutes, len(spans), k == len(spans) - 1, (quiet_end - b).total_seconds() / 60.0,
            _named(result, cause, b, FIX_TO_LIFT_MAX_MIN) if len(spans) == 1 and not minutes <= FIX_TO_LIFT_MAX_MIN
            else None))
        if gone is not None and gone < quiet_end:  # set again while the fixed cause is quiet
            again = [t for t, v in events if gone < t < quiet_end and not np.isnan(v)]
            if again:
                got.relimits.append(f"{name} fixed {b:%H:%M:%S}, lifted {gone:%H:%M:%S}, limited again "
                                    f"{again[0]:%H:%M:%S} while quiet")
    return got


class LimitAtCarriers(NamedTuple):
    """Per second of the run, a resource's limit at its carriers (:func:`_limit_at_carriers`): in force at every
    broker carrying it (``everywhere``), at some broker (``anywhere``), and its cluster-wide value where in force
    everywhere (``target``, msg/s: the newest record's ``limit_qps``; NaN elsewhere)."""

    everywhere: np.ndarray
    anywhere: np.ndarray
    target: np.ndarray


def _limit_at_carriers(result, resource: tuple[str, str], carriers: set) -> LimitAtCarriers:
    """The :class:`LimitAtCarriers` of ``resource`` (carried by the brokers ``carriers``) from the brokers' limits
    in force (:func:`in_force_spans`)."""
    n = result.cluster.T * 60
    everywhere, anywhere = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    target = np.full(n, float("nan"))
    for lo, hi, snap in in_force_spans(result):
        recs = {b_: rec for (b_, rt, r), (_q, rec) in snap.items() if (rt, r) == resource}
        anywhere[lo:hi] = bool(recs)
        if set(recs) >= carriers:
            everywhere[lo:hi] = True
            target[lo:hi] = float(max(recs.values(), key=lambda rec: rec.get("version") or 0)["limit_qps"])
    return LimitAtCarriers(everywhere, anywhere, target)


@dataclass
class LimitedMinutes:
    """A cause's minutes limited at every carrier while it is active (:func:`_limited_minutes`), in minute order:
    ``minutes`` and ``busy_minutes`` (name, minute, admitted ÷ limit over the seconds its producers send; a minute
    with a busy carrier apart), ``pulse_minutes`` (the ratio over every second, for a pulsed producer's minutes),
    ``target_minutes`` (name, minute, admitted ÷ decided target, a probe in force), the minutes ``left_out`` by reason,
    and its levels (:mod:`pipelines.sim.levels`: ``levels``; a surge's per carrier: ``levels_full``)."""

    minutes: list[tuple[str, int, float]] = field(default_factory=list)
    busy_minutes: list[tuple[str, int, float]] = field(default_factory=list)
    pulse_minutes: list[float] = field(default_factory=list)
    target_minutes: list[tuple[str, int, float, bool]] = field(default_factory=list)
    left_out: Counter = field(default_factory=Counter)
    levels: list = field(default_factory=list)
    levels_full: list = field(default_factory=list)


def _limited_minutes(result, cause, timeline: CauseTimeline, storms: list, limits, key: list) -> LimitedMinutes | None:
    """The brokers' admitted traffic of ``cause`` ÷ its limit in every minute it is limited at each of its carriers
    while it is active and its demand reaches the limit, and ÷ its decided target (:func:`decided_targets`), with its
    levels (``storms``: the storm causes' resources; ``limits``: the limits' config); None when no pair carries it."""
    c = result.cluster
    res, name = timeline.resource, timeline.name
    pairs = np.array([k_ == res for k_ in key], dtype=bool)
    if not pairs.any():
        return None
    everywhere, anywhere, target = _limit_at_carriers(result, res, set(c.pairs.loc[pairs, "broker"]))
    act = _seconds(result, cause.active)
    between_pulses = sending_nothing(c)
    admitted = c.second_admitted[:, pairs].sum(axis=1)
    demand = c.demand[pairs].sum(axis=0)
    decided, probing_s = decided_targets(result, res)
    got = LimitedMinutes()
    if cause.kind == "storm":
        got.levels += storm_levels(result, cause, storms, decided, everywhere, limits)
    else:
        got.levels += surge_levels(result, cause, everywhere)
        got.levels_full += surge_levels(result, cause, everywhere, split="carriers")
    for m in range(c.T):
        sl = slice(m * 60, (m + 1) * 60)
        if act[sl].all() and anywhere[sl].any() and not everywhere[sl].all():
            got.left_out["limited at some carriers only"] += 1
        elif act[sl].all() and everywhere[sl].all() and demand[m] < np.mean(target[sl]):
            got.left_out["demand under the limit"] += 1
        if act[sl].all() and everywhere[sl].all() and demand[m] >= np.mean(target[sl]):
            got.target_minutes.append((name, m, float(admitted[sl].sum() / decided[sl].sum()),
                                       bool(probing_s[sl].any())))
            # a carrier busy in the minute refused sends before its limiter saw them: not the limiter's figure
            into = got.busy_minutes if timeline.busy[m] else got.minutes
            sending = ~between_pulses[sl]  # a pulsed producer's seconds between pulses: nothing to admit
            into.append((name, m, float(admitted[sl][sending].sum() / target[sl][sending].sum())))
            # the figure with the pulses' gaps counted (the definition before pulsed producers), beside
            if not sending.all():
                got.pulse_minutes.append(float(admitted[sl].sum() / target[sl].sum()))
    return got


def judge_causes(result, found: list, values: dict, details: dict) -> dict:
    """Each cause judged against the ground truth: its value changes and lifts while it is active (every change,
    :func:`_changes`), the brokers' admitted traffic ÷ its limit in every minute it is limited at each of its
    brokers while it is active and its demand reaches the limit (but for a minute when one of its carriers was
    busy: it refused sends before its limiter saw them; the figure with them kept beside), and each fix → lift where
    the quiet after the fix lasts :data:`FIX_TO_LIFT_MAX_MIN` or more (a shorter quiet spell may hold the limit).
    Adds its figures to ``values`` and ``details``; returns what :func:`_checks` needs."""
    c = result.cluster
    restarts = restart_times(result)
    key = list(zip(c.pairs["resource_type"], c.pairs["resource"]))
    out = {"changes": [], "lifts": [], "minutes": [], "pulse_minutes": [], "fix_to_lift": [], "excluded": [],
           "lift_after_fix": [], "target_minutes": [],
           "relimits": [],
           "busy_minutes": [], "relimits_with_restarts": [], "lifts_unseen": [],
           "changes_with_unseen": [], "levels": [], "levels_full": [], "minutes_left_out": Counter()}
    storms = [cz.resource for cz in found if cz.kind == "storm"]
    limits = getattr(result, "limits_cfg", None) or LimitsConfig()
    run_end = c.start + pd.Timedelta(seconds=c.T * 60)
    busy_minutes = c.busy_rejected.sum(axis=2) > 0  # [minute, pair]
    for cz in found:
        timeline = _cause_timeline(result, cz, busy_minutes, key)
        changed = _changes_while_active(result, timeline, restarts)
        if changed.with_probes is not None:
            out["changes_with_probes"] = max(out.get("changes_with_probes", 0), changed.with_probes)
        for part in ("lifts", "lifts_unseen", "excluded"):
            out[part] += getattr(changed, part)
        fixes = _fixes_judged(result, cz, timeline, restarts, run_end)
        for part in ("fix_to_lift", "lift_after_fix", "relimits", "relimits_with_restarts"):
            out[part] += getattr(fixes, part)
        out["changes"].append((cz, changed.most))
        out["changes_with_unseen"].append((cz, changed.most_with_unseen))
        minutes = _limited_minutes(result, cz, timeline, storms, limits, key)
        if minutes is not None:
            for part in ("levels", "levels_full", "target_minutes", "minutes", "busy_minutes", "pulse_minutes"):
                out[part] += getattr(minutes, part)
            out["minutes_left_out"].update(minutes.left_out)
    _minute_figures(out, values, details)
    _change_and_lift_figures(out, values, details)
    _level_figures(out, values, details)
    values["limit_value_changes_excluded"] = (float(len(out["excluded"])), "count", "incident")
    details["limit_value_changes_excluded"] = "; ".join(out["excluded"]) or "none"
    return out


def _minute_figures(out: dict, values: dict, details: dict) -> None:
    """Adds to ``values`` and ``details`` the causes' admitted ÷ limit over their judged minutes (``out``:
    :func:`judge_causes`'s): the least and the most (ratios), how many minutes were judged (a count), and beside
    them the least with the busy carriers' minutes and over every second of a pulsed producer's minutes."""
    nan = float("nan")
    every = [r for _, _, r in out["minutes"] + out["busy_minutes"]]
    values["admitted_over_limit_minute_min_with_busy"] = (min(every) if every else nan, "ratio", "incident")
    details["admitted_over_limit_minute_min_with_busy"] = (
        f"{len(out['busy_minutes'])} limited minutes with a busy carrier left out of the judged ones (the figure "
        "before the squeeze: every limited minute)")
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


def _change_and_lift_figures(out: dict, values: dict, details: dict) -> None:
    """Adds to ``values`` and ``details`` the causes' lifts while active (a count; with the lifts no window could
    veto yet beside), the worst fix → lift (minutes; inf: a judged fix not lifted), the most value changes counting
    those decided before an episode's first whole window ended, and the limits set again while a fixed cause is
    quiet (a count; with a broker restart's gaps beside), from ``out`` (:func:`judge_causes`'s)."""
    nan = float("nan")
    values["lifts_while_cause_active"] = (float(len(out["lifts"])), "count", "incident")
    details["lifts_while_cause_active"] = "; ".join(out["lifts"]) or "none"
    # the count before quiet spells were widened: a lift no window could have vetoed yet (:func:`unseen_lift`)
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
        "whole window ended (the count before quiet spells were widened)")
    values["limits_again_while_quiet"] = (float(len(out["relimits"])), "count", "incident")
    details["limits_again_while_quiet"] = "; ".join(out["relimits"]) or "none"
    # the count before a broker restart's gap was told from a lift: a limit its limiter forgot and the next
    # publication restored read as lifted and set again (docs/backtest.md §2)
    with_restarts = out["relimits"] + out["relimits_with_restarts"]
    values["limits_again_while_quiet_with_restart_gaps"] = (float(len(with_restarts)), "count", "incident")
    details["limits_again_while_quiet_with_restart_gaps"] = "; ".join(with_restarts) or "none"


def _level_figures(out: dict, values: dict, details: dict) -> None:
    """Adds to ``values`` and ``details`` the causes' levels against the ground truth (``out["levels"]``,
    :mod:`pipelines.sim.levels`): a storm's lowest and highest settled level ÷ its true target (ratios), a surge's
    share of its carriers' room left unused (cluster-wide and per carrier), and every episode's level as text."""
    nan = float("nan")
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
