"""What every limit policy shares: its frozen parameters (:class:`Params`), the outcome of a step (:class:`Step`),
the one state transition that makes a decision (:func:`decide`), and the arithmetic of hysteresis, the maximum cut,
the cool-down, the refresh, the recovery and a probe's back-off as pure functions of numbers and times.

Units: limits and rates in msg/s (cluster-wide); percentages in percent (``10.0`` = 10 %); times naive UTC, as the
fold keeps them (window ends); durations as :class:`datetime.timedelta`. docs/decisions.md §4 gives the rules.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from pipelines.config import DetectionConfig, GovernorConfig, LimitsConfig, WindowsConfig
from pipelines.decide.rules.facts import TOLERANCE, split
from pipelines.decide.records.resource import FORGOTTEN, UNLIMITED, Decision, Evidence, Observation, ResourceState
from pipelines.decide.words import Action, Mode

_EPOCH = dt.datetime(1970, 1, 1)
#: A doubling interval never grows past 2 ** this (a back-off, a recurrence's clear windows).
MAX_DOUBLINGS = 16


@dataclass(frozen=True)
class Params:
    """The settings a limit policy reads, frozen, from ``[limits]``, ``[detection]`` and ``windows.length_seconds``
    (:class:`pipelines.config.LimitsConfig` documents each; :meth:`of` builds one). ``window``: one window's length;
    ``refresh``: ``refresh_seconds``; ``detection``: the rules' thresholds, for the rule judged on a window's visible
    demand (:mod:`pipelines.decide.rules.facts`); ``max_decision_lag``: how long after the window it decides a decision
    is taken at the latest (:func:`decided_at`): the watermark, one window for the trigger and one for a shipper late
    within the watermark (4 one-minute windows with the shipped 120 s watermark); ``trigger``: the final path's
    trigger (``windows.trigger_seconds``: the most a decision waits to be taken, a probe's deadline)."""

    window: dt.timedelta
    max_decision_lag: dt.timedelta
    trigger: dt.timedelta
    detection: DetectionConfig
    hysteresis_pct: float
    max_cut_pct: float
    cooldown_windows: int
    refresh: dt.timedelta
    recovery_windows: int
    max_recovery_windows: int
    recurrence_windows: int
    bound_share: float
    relax_factor: float
    probe_max_windows: int
    probe_headroom_share: float
    surge_max_changes: int
    surge_headroom: float
    surge_squeeze_headroom: float
    min_limit_qps: float
    surge_burst_share: float
    surge_floor_yield_share: float
    storm_room_share: float

    @classmethod
    def of(cls, limits: LimitsConfig, detection: DetectionConfig, window_seconds: int,
           watermark_seconds: int = WindowsConfig().watermark_seconds,
           trigger_seconds: int = WindowsConfig().trigger_seconds) -> Params:
        """The parameters of ``limits`` and ``detection`` for windows of ``window_seconds`` behind a watermark of
        ``watermark_seconds``, decided every ``trigger_seconds`` (defaults:
        :class:`pipelines.config.WindowsConfig`'s)."""
        return cls(window=dt.timedelta(seconds=window_seconds), detection=detection,
                   max_decision_lag=dt.timedelta(seconds=watermark_seconds + 2 * window_seconds),
                   trigger=dt.timedelta(seconds=trigger_seconds), probe_max_windows=limits.probe_max_windows,
                   hysteresis_pct=limits.hysteresis_pct, max_cut_pct=limits.max_cut_pct,
                   cooldown_windows=limits.cooldown_windows, refresh=dt.timedelta(seconds=limits.refresh_seconds),
                   recovery_windows=limits.recovery_windows, max_recovery_windows=limits.max_recovery_windows,
                   recurrence_windows=limits.recurrence_windows,
                   bound_share=limits.bound_share, relax_factor=limits.relax_factor,
                   probe_headroom_share=limits.probe_headroom_share, surge_max_changes=limits.surge_max_changes,
                   surge_headroom=limits.surge_headroom,
                   surge_squeeze_headroom=limits.surge_squeeze_headroom, min_limit_qps=limits.min_limit_qps,
                   surge_burst_share=limits.surge_burst_share,
                   surge_floor_yield_share=limits.surge_floor_yield_share, storm_room_share=limits.storm_room_share)

    @classmethod
    def from_config(cls, cfg: GovernorConfig) -> Params:
        """The parameters of a governor's config."""
        return cls.of(cfg.limits, cfg.detection, cfg.windows.length_seconds, cfg.windows.watermark_seconds,
                      cfg.windows.trigger_seconds)


@dataclass(frozen=True)
class Step:
    """The outcome of a policy's step on one resource: its state after, the decisions made and the evidence rows of
    the windows judged (in order)."""

    state: ResourceState
    decisions: tuple[Decision, ...] = ()
    evidence: tuple[Evidence, ...] = ()

    def then(self, step: Step) -> Step:
        """This step followed by ``step`` (taken from this step's state)."""
        return Step(step.state, self.decisions + step.decisions, self.evidence + step.evidence)

    def moved(self, **changes) -> Step:
        """The same step with its state's fields changed."""
        return Step(replace(self.state, **changes), self.decisions, self.evidence)

    def noted(self, evidence: Evidence) -> Step:
        """The same step with one more evidence row."""
        return Step(self.state, self.decisions, self.evidence + (evidence,))


def higher(value: float, pct: float) -> float:
    """``value`` raised by ``pct`` percent."""
    return value * (1.0 + pct / 100.0)


def lower(value: float, pct: float) -> float:
    """``value`` lowered by ``pct`` percent."""
    return value * (1.0 - pct / 100.0)


def tightens(target: float, current: float, hysteresis_pct: float) -> bool:
    """A new ``target`` is a change worth making below the ``current`` limit: more than ``hysteresis_pct`` lower."""
    return target < lower(current, hysteresis_pct)


def above(limit: float, target: float | None, hysteresis_pct: float) -> bool:
    """The ``limit`` is above its frozen ``target`` by more than ``hysteresis_pct`` (a first cut, or a probe);
    False without a target."""
    return target is not None and limit > higher(target, hysteresis_pct)


def too_small(raised: float, current: float, hysteresis_pct: float) -> bool:
    """A raise from ``current`` to ``raised`` is not worth a decision: below ``hysteresis_pct`` above it."""
    return raised < higher(current, hysteresis_pct)


def cut(target: float, rate: float, max_cut_pct: float) -> float:
    """The ``target`` of one decision, bounded by ``max_cut_pct``: at least ``rate`` (the observed rate or the
    current limit) lowered by that much."""
    return max(target, lower(rate, max_cut_pct))


def cooled(last_change_end: dt.datetime | None, window_end: dt.datetime, window: dt.timedelta,
           cooldown_windows: int) -> bool:
    """The cool-down since the last change is over at ``window_end``: ``cooldown_windows`` windows (or no change)."""
    return last_change_end is None or window_end - last_change_end >= window * cooldown_windows


def refresh_due(last_decision_end: dt.datetime | None, window_end: dt.datetime, refresh: dt.timedelta) -> bool:
    """A limit is re-issued (a new ``expires_at``) at ``window_end``: ``refresh`` after its last decision."""
    return last_decision_end is not None and window_end - last_decision_end >= refresh


def recovery_needed(recurrences: int, recovery_windows: int, max_recovery_windows: int) -> int:
    """Clear windows a limit needs before its lift: ``recovery_windows`` doubled per recurrence, at most
    ``max(recovery_windows, max_recovery_windows)`` (flap damping, docs/decisions.md §4 "Recurrences")."""
    return min(recovery_windows * 2 ** min(recurrences, MAX_DOUBLINGS), max(recovery_windows, max_recovery_windows))


def backoff_hold(window: dt.timedelta, recovery_windows: int, backoff: int) -> dt.timedelta:
    """How long a probe's ceiling holds after its ``backoff``-th hit: ``recovery_windows`` × 2^backoff windows."""
    return window * recovery_windows * 2 ** min(backoff, MAX_DOUBLINGS)


def decided_at(now: dt.datetime | None, stream_end: dt.datetime, max_lag: dt.timedelta) -> dt.datetime:
    """When the brokers get a decision of a micro-batch whose newest window seen (final, or open on the fast path:
    :meth:`pipelines.decide.records.resource.Batch.stream_end`) ends ``stream_end``, in the stream's time (naive UTC):
    its processing time ``now`` (None: ``stream_end``), but never more than ``max_lag`` after ``stream_end``
    (:attr:`Params.max_decision_lag`). Live, and on a restart's backlog (its newest lines land as the governor comes
    back), a decision takes effect when it is published: the windows the micro-batch read, and any before the
    publication, ran under the limit before it. A replay of a recording decides windows of days ago at today's time;
    there its limits take effect in the stream's time, the same whatever run decided them (a restart replays the same
    state, tests/e2e/test_crash.py). Timed by the window a decision is about instead, a backlog's first window would
    put a raise in force in the backlog's later windows, which ran under the limit before it."""
    if now is None:
        return stream_end
    return min(now, stream_end + max_lag)


def effective_end(at: dt.datetime, window: dt.timedelta) -> dt.datetime:
    """The end of the first window wholly after ``at`` (naive UTC): the first window starting at or after it (an
    instant within :data:`~pipelines.decide.rules.facts.TOLERANCE` of a window's start is that start). Brokers apply a
    decision a propagation delay later; a window partly under it is judged against the level before
    (:func:`pipelines.decide.records.resource.limit_in_force`)."""
    seconds, length = (at - _EPOCH).total_seconds(), window.total_seconds()
    start = _EPOCH + dt.timedelta(seconds=math.ceil(seconds / length - TOLERANCE) * length)
    return start + window


def frozen_basis(window_end: dt.datetime, target: float | None, shares: Mapping[str, float] | None,
                 baseline: float | None = None) -> dict:
    """The fields of :class:`~pipelines.decide.records.resource.ResourceState` a new limit freezes from the window
    ending ``window_end`` (docs/decisions.md §4 "Frozen basis"): its ``target`` (msg/s), its per-broker ``shares`` and
    the rule's ``baseline`` (msg/s), kept until the lift; the probe and cap memory of an earlier limit cleared. Used by
    :func:`decide` and by a limit the fast path decided (:meth:`pipelines.decide.limits.base.LimitPolicy.adopt`)."""
    return {"target_qps": target, "broker_shares": shares, "limited_since": window_end, "baseline_tps": baseline,
            "cause_changes": 0, "probe_from_qps": None, "probe_ceiling_qps": None, "probe_hold_until": None,
            "probe_backoff": 0, "last_capped_end": None, "probe_effective_end": None, "at_cap_since": None}


def decide(state: ResourceState, window_end: dt.datetime, limit: float, action: Action, reason: str, mode: Mode, *,
           change: bool = True, shares: Mapping[str, float] | None = None, target: float | None = None,
           remember: bool = False, fresh: bool = False, baseline: float | None = None) -> Step:
    """One decision on ``state`` as a decision of the window ending ``window_end``: the :class:`Decision` (its
    ``version`` the state's next, its per-broker figures :func:`~pipelines.decide.rules.facts.split` by the shares) and
    the state after it.

    ``change``: the value changes (a refresh re-issues it: ``False``); ``shares``, ``target``: new frozen shares and
    target (default: the state's); ``fresh``: the decision starts a new limit (target, shares and ``baseline``
    frozen from this window, the probe and cap memory reset; any set without a limit in force is fresh);
    ``remember``: a lift the recurrence memory keeps (the cause of an enforced limit went away); a lift that does
    not remember forgets (a probe's lift: legitimate demand); an advisory lift leaves the memory as it was. A new
    value supersedes a probe in flight (a raise sets its own after this,
    :meth:`pipelines.decide.limits.base.LimitPolicy.
    raise_to`)."""
    s = state
    lifted = action == Action.LIFT
    if lifted and s.mode == Mode.ENFORCE:
        s = (replace(s, last_lift_end=window_end, lifted_target_qps=s.target_qps or s.limit_qps) if remember
             else replace(s, **FORGOTTEN))
    fresh = fresh or (s.limit_qps is None and not lifted)
    shares = dict(s.broker_shares) if shares is None else dict(shares)
    nth = s.window_decisions + 1 if s.last_decision_end == window_end else 0
    decision = Decision(s.resource_type, s.resource, window_end, limit, s.limit_qps, action, reason, s.version + 1,
                        mode, {} if lifted else split(limit, shares), nth)
    moved = {"version": s.version + 1, "last_decision_end": window_end, "mode": mode, "window_decisions": nth}
    if change:
        moved["last_change_end"] = window_end
        if not lifted and limit != s.limit_qps:  # a change before the last one was wholly in force: windows
            moved["previous_limit_qps"] = s.limit_qps  # before the new one may have run at either earlier value
            if s.previous_limit_qps is not None and s.change_effective_end is not None \
                    and window_end < s.change_effective_end and s.limit_qps is not None:
                moved["previous_limit_qps"] = min(s.limit_qps, s.previous_limit_qps)
    if lifted:
        moved.update(UNLIMITED)
    else:
        moved.update(limit_qps=limit, broker_shares=shares, target_qps=target if target is not None else s.target_qps)
        if fresh:
            moved.update(frozen_basis(window_end, moved["target_qps"], shares, baseline))
        elif change:
            moved.update(cause_changes=s.cause_changes + 1, probe_from_qps=None, probe_effective_end=None)
    return Step(replace(s, **moved), (decision,))


def seen(state: ResourceState, window_end: dt.datetime, field: str = "last_candidate_end") -> dt.datetime:
    """The newer of ``window_end`` and the state's ``field`` (a window older than the last one seen does not move
    it back): the last window where the cause was seen, or (``last_capped_end``) the last one at the cap."""
    last = getattr(state, field)
    return window_end if last is None else max(last, window_end)


def last_kept(state: ResourceState) -> dt.datetime:
    """The end of the last window that kept the limit: the cause seen (a rule fired, ``bound``, ``hold``) or the
    demand hidden at the cap (``capped``); a lift counts its windows from there."""
    return max(x for x in (state.last_candidate_end, state.last_capped_end) if x is not None)


def noted_carriers(state: ResourceState, obs: Observation) -> ResourceState:
    """A window's carriers noted: the last distress (a carrier busy), and the writes of each busy carrier (msg/s;
    a surge probe's bound, :meth:`pipelines.decide.limits.base.LimitPolicy.raise_bounds`): the most it wrote in any
    window it was busy in, since a window busy for part of it only (a cause ramping) writes less than the broker can."""
    s = state
    if not obs.healthy:
        s = replace(s, last_distress_end=max(obs.window_end, s.last_distress_end or obs.window_end))
    busy = {b: max(obs.carrier_load[b], s.busy_load.get(b, 0.0)) for b in obs.busy_brokers if b in obs.carrier_load}
    return replace(s, busy_load={**s.busy_load, **busy}) if busy else s


def outlived(state: ResourceState, evidence: str) -> str:
    """The reason of a cut down to the frozen target once the anomaly outlived the first cut."""
    return (f"the anomaly outlived the first cut{evidence}: down to the target of {state.target_qps:.1f} msg/s "
            f"frozen on {state.limited_since:%Y-%m-%dT%H:%M:%SZ}")
