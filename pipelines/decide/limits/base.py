"""A limit's whole life in closed loop, behind one interface (:class:`LimitPolicy`), with one class per rule that
limits something (:class:`pipelines.decide.limits.retry_storm.RetryStormLimit`, :class:`pipelines.decide.limits.surge.
SurgeLimit`; the catalogue maps resource types to them, :func:`pipelines.decide.catalogue.policy_for`), as Netflix
concurrency-limits keeps one ``Limit`` interface with an algorithm per class. A policy is stateless: built from its
frozen :class:`~pipelines.decide.limits.steps.Params`, every method is a pure function from a resource's state and a
window's evidence to the state after and the decisions made (a :class:`~pipelines.decide.limits.steps.Step`).

The life of a limit, one method each (docs/decisions.md §4):

* **judge** a window under the enforced limit on its visible demand (:meth:`LimitPolicy.judge`: ``bound``,
  ``hold``, ``capped``, ``clear``; :class:`pipelines.decide.words.Status`);
* **set** it when a rule fires (:meth:`LimitPolicy.set`, :meth:`LimitPolicy.start`; a **recurrence** goes straight
  to the remembered target, :meth:`LimitPolicy.recurrence`);
* **hold** it while the cause persists (:meth:`LimitPolicy.hold`) or its demand is hidden at the cap
  (:meth:`LimitPolicy.capped`), **refreshed** every ``refresh_seconds`` (:meth:`LimitPolicy.refresh`);
* **probe** it upward where the rule says so (:meth:`LimitPolicy.raise_to`, :meth:`LimitPolicy.raise_bounds`; the
  fast path's open windows start, undo or prove a probe: :meth:`LimitPolicy.act_on_open`);
* **lift** it ``recovery_needed`` clear windows after the last window that kept it (:meth:`LimitPolicy.lift_due`),
  unless a later window is not clear (the **veto**, :meth:`LimitPolicy.veto`).

:meth:`LimitPolicy.on_window` is one window of a resource; :func:`pipelines.decide.paths.walk.fold_resource` walks them.
Rates are cluster-wide msg/s, times naive UTC window ends.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import replace
from typing import ClassVar, Protocol

from pipelines.decide.rules.facts import close, rate, shares_of
from pipelines.decide.records.resource import (
    FORGOTTEN, Batch, Candidate, Evidence, Judged, Observation, ResourceState, limit_in_force,
)
from pipelines.decide.limits.open_windows import OpenWindowSteps
from pipelines.decide.records.limit_rows import EXTRA_RANKS
from pipelines.decide.limits.steps import (
    Params, Step, above, backoff_hold, cooled, cut, decide, decided_at, effective_end, frozen_basis, higher, last_kept,
    lower, noted_carriers, outlived, recovery_needed, refresh_due, seen, tightens,
)
from pipelines.decide.words import Action, Anomaly, Mode, Status


class Limit(Protocol):
    """What the per-resource walk (:func:`pipelines.decide.paths.walk.fold_resource`) asks of a limit kind, and all it
    asks: each window in event-time order, the lift that came due before it, and at the horizon what the fast path's
    open windows let the final path decide; each step timed (when a new value reaches the brokers). Each returns
    the :class:`~pipelines.decide.limits.steps.Step` taken (the state after, the decisions made, the evidence rows);
    every other step is the kind's own (:class:`LimitPolicy`)."""

    def on_window(self, state: ResourceState, end: dt.datetime, cand: Candidate | None, obs: Observation | None,
                  batch: Batch) -> Step:
        """The window ending ``end``: its candidate (a rule fired) and its observation under the limit, either None."""

    def lift_due(self, state: ResourceState, until: dt.datetime, batch: Batch) -> Step:
        """The lift due at or before ``until``, else a refresh of a limit held through clear windows."""

    def act_on_open(self, state: ResourceState, batch: Batch, decided: bool = False) -> Step:
        """What the open windows after the horizon let the final path decide now."""

    def timed(self, step: Step, then: Step, batch: Batch) -> Step:
        """``step`` followed by ``then``, with the time a new value comes into force at the brokers."""


class LimitPolicy(OpenWindowSteps):
    """One rule's limit (module docstring). Subclasses give :attr:`kind` and :meth:`fires`, and add their own steps
    to :meth:`visible`, :meth:`hold`, :meth:`capped` and :meth:`on_open`."""

    kind: ClassVar[Anomaly]
    #: Whether a ``capped`` open window, complete by census, starts a probe at once (:meth:`on_open`).
    probe_on_open: ClassVar[bool] = False
    #: Whether a first limit is the room its busy carriers leave (:meth:`first_bound`) when that is above the target,
    #: not only when it is below.
    fills_room: ClassVar[bool] = False

    def __init__(self, params: Params) -> None:
        self.params = params

    # --- judge ----------------------------------------------------------------------------------------------------
    def visible(self, obs: Observation) -> tuple[float, str]:
        """The visible demand of ``obs`` (msg/s): admitted + logged rejections per second; and a text naming the
        refused demand it adds ("" when none)."""
        return obs.observed_tps + rate(obs.rejected, self.params.window.total_seconds()), ""

    def view_hides_demand(self, obs: Observation) -> bool:
        """Whether the limiter's own view (``obs.viewed``: it rejected something in the window, no count) hides
        demand :meth:`visible` does not count: always, unless a rule counts the refusals another way."""
        return obs.viewed

    def fires(self, demand: float, obs: Observation, state: ResourceState) -> tuple[bool, str]:
        """Whether the rule fires on the visible ``demand`` (msg/s) of ``obs``, and why."""
        raise NotImplementedError

    @staticmethod
    def reported_share(state: ResourceState, obs: Observation) -> float | None:
        """The share of the cluster-wide limit held by the brokers whose line of ``obs`` has landed (0..1): 1 for a
        window every broker has reported in (final, or complete by census); for an open window before its census,
        the frozen shares of the carriers that reported (a broker carrying it outside the frozen shares at the
        smallest one: the ``*`` figure it applies, :func:`pipelines.decide.rules.facts.split`). A broker's minute line
        carries all its keys at once, so what those carriers admitted is final: the window is judged on them
        against their part of the cap. None when none of its carriers has reported yet (or the limit has no
        shares): the window tells nothing of the limit yet."""
        if obs.reported is None:
            return 1.0
        shares = state.broker_shares
        if not shares:
            return None
        smallest = min(shares.values())
        part = sum(shares[b] for b in obs.reported if b in shares) + sum(
            smallest for b in obs.broker_tps if b not in shares and b in obs.reported)
        return part if part > 0 else None

    @staticmethod
    def carriers_reported(state: ResourceState, obs: Observation) -> bool:
        """Whether ``obs`` is complete for the resource: every broker, or (an open window before its census) every
        broker holding a frozen share of its limit, has reported in it. A broker that carries none of it, late or
        silent, holds no decision of it back (a probe's undo or lift, a lift's proof)."""
        return obs.complete or (obs.reported is not None and bool(state.broker_shares)
                                and set(state.broker_shares) <= set(obs.reported))

    def judge(self, obs: Observation, state: ResourceState) -> Judged:
        """A window under the enforced limit in force in it (:func:`limit_in_force`; before its census, the part of
        it its reported carriers hold, :meth:`reported_share`) → its status: ``bound`` (the rule fires and the
        limit binds: refused demand shows, or the admitted rate is at ``bound_share`` of the cap), ``hold`` (fires
        below the cap), ``capped`` (silent on what shows but at the cap, or the limiter's own view reports
        rejections: the demand hidden) or ``clear``."""
        p, limit = self.params, limit_in_force(state, obs.window_end)
        part = self.reported_share(state, obs)
        if part is not None and part < 1.0:
            limit *= part
        numbers = f"{obs.observed_tps:.1f} of {limit:.1f} msg/s" + (
            "" if obs.reported is None else f" (so far: {', '.join(sorted(obs.reported)) or 'no broker'} reported)")
        demand, refused = self.visible(obs)
        rejecting = obs.rejected > 0 or obs.viewed or bool(refused)
        said = ([f"{obs.rejected} sends rejected by the limiter"] if obs.rejected > 0 else []) + (
            [refused] if refused else [])
        how = (f", rejecting ({'; '.join(said)})" if said else "") + (
            ", the limiter's own view reports rejections (no count)" if obs.viewed else "")
        fires, why = self.fires(demand, obs, state)
        at_cap = self.at_cap(obs, limit)
        if fires and (rejecting or at_cap):
            return Judged(Status.BOUND, f"limit-bound: {numbers}{how}; {why}")
        if fires:
            return Judged(Status.HOLD, f"visible demand fires the rule: {numbers}, nothing rejected; {why}")
        if at_cap:
            return Judged(Status.CAPPED, f"at the cap, the demand hidden: {numbers}{how}, at least "
                                         f"{p.bound_share:.0%} of the cap; {why} on what shows")
        if self.view_hides_demand(obs):
            return Judged(Status.CAPPED, f"the demand hidden: {numbers}{how}; {why} on what shows")
        return Judged(Status.CLEAR, f"the cause is gone: {numbers}{how}; {why}")

    def at_cap(self, obs: Observation, cap: float) -> bool:
        """Whether ``obs`` admitted at least ``bound_share`` (0.9) of ``cap`` (msg/s: the limit in force in it, on
        the carriers that reported): a limit that binds, whatever else shows."""
        return obs.observed_tps >= self.params.bound_share * cap

    def at_cap_since(self, state: ResourceState, end: dt.datetime, status: Status) -> dt.datetime | None:
        """``ResourceState.at_cap_since`` after the window ending ``end`` judged ``status``: the end of the first
        window at the cap (``bound`` or ``capped``) since the limit was set, kept through windows under it until
        ``recovery_windows`` of them in a row were clear since the last window that kept the limit (what a lift
        counts; a demand that dips under the cap now and then is still held there)."""
        since, p = state.at_cap_since, self.params
        if status in (Status.BOUND, Status.CAPPED):
            return end if since is None or end < since else since
        kept = max((x for x in (state.last_candidate_end, state.last_capped_end) if x is not None), default=None)
        if since is not None and status == Status.CLEAR and (
                kept is None or end - kept >= p.window * p.recovery_windows):
            return None
        return since

    # --- one window -----------------------------------------------------------------------------------------------
    def on_window(self, state: ResourceState, end: dt.datetime, cand: Candidate | None, obs: Observation | None,
                  batch: Batch) -> Step:
        """The window ending ``end`` with its candidate (a rule fired) and its observation, either may be None: the
        carriers noted; under an enforced limit the window judged (an evidence row); then a candidate sets (or
        refreshes) the limit, a ``bound``/``hold`` window holds it, a ``capped`` one keeps it (or probes)."""
        step = Step(noted_carriers(state, obs) if obs is not None else state)
        s = step.state
        judged = None
        if s.limit_qps is not None and s.mode == Mode.ENFORCE and obs is not None:
            judged = self.judge(obs, s)
            step = step.noted(Evidence(end, judged.status, s.limit_qps, obs.observed_tps, obs.rejected,
                                       judged.detail, rule_fired=cand is not None))
            step = step.moved(at_cap_since=self.at_cap_since(s, end, judged.status))
        squeezed = self.squeeze(step.state, obs, judged) if judged is not None else None
        if squeezed is not None:
            step = step.then(squeezed)
            return step.moved(last_candidate_end=seen(step.state, end)) if cand is not None or \
                judged.status == Status.BOUND else step.moved(last_capped_end=seen(step.state, end, "last_capped_end"))
        taken = self.set(step.state, cand, batch) if cand is not None else None
        if taken is not None:
            taken = self.paused(step.state, taken, end)
            step = step.then(taken)
            lift_at = max(x for x in (step.state.lift_at_qps, cand.lift_at_qps, 0.0) if x is not None)
            return step.moved(lift_at_qps=lift_at or None, last_candidate_end=seen(step.state, end))
        if judged is None or judged.status == Status.CLEAR:
            return step
        if judged.status == Status.CAPPED:
            step = step.moved(last_capped_end=seen(step.state, end, "last_capped_end"))
            return step.then(self.capped(step.state, obs, judged.detail, batch))
        step = step.then(self.hold(step.state, obs, judged.status, judged.detail, batch))
        return step.moved(last_candidate_end=seen(step.state, end)) if step.state.limit_qps is not None else step

    # --- squeeze --------------------------------------------------------------------------------------------------
    def squeeze(self, state: ResourceState, obs: Observation, judged: Judged,
                at: dt.datetime | None = None) -> Step | None:
        """A limit its brokers cannot take: a window complete and wholly under the value in force, after the first
        such window (``change_effective_end``: the send queue the window before filled drains into it), no probe
        in flight, the cool-down over, where the resource ran at its cap
        (``bound`` or ``capped``) while a broker carrying it was busy (``BROKER_BUSY`` on it: it fast-fails the
        sends of every topic it hosts) → the limit and its frozen target cut by ``max_cut_pct``, not below
        ``min_limit_qps``. A target sized for the resource alone (a share of its consume rate, its baseline times
        the headroom) does not know the broker's other load: several storms on one broker, or one with little
        headroom, keep it busy at their targets. A window that admitted more than ``hysteresis_pct`` above the
        limit is no such evidence: the limit did not hold in it (a restarted broker's limiter forgot it until the
        limit was applied again), so its busy
        carrier says nothing of the load the broker takes at the limit. A decision of the window ending ``at``
        (default ``obs``'s: an open window's is made as one of the horizon's, :meth:`act_on_open`). None when not
        due."""
        p, s = self.params, state
        if s.limit_qps is None or s.mode != Mode.ENFORCE or not obs.busy_brokers or not obs.complete \
                or judged.status not in (Status.BOUND, Status.CAPPED) or s.probe_from_qps is not None \
                or not cooled(s.last_change_end, obs.window_end, p.window, p.cooldown_windows):
            return None
        since = s.change_effective_end or (
            s.last_change_end + 2 * p.window if s.last_change_end is not None else None)  # a state saved without it
        if since is None or obs.window_end <= since:  # the first whole window under it drains the queue the one
            return None  # before filled: its busy lines (the first seconds' fast failures) say nothing of the limit
        if obs.observed_tps > higher(s.limit_qps, p.hysteresis_pct):  # the limit did not hold in it
            return None
        tighter = max(lower(s.limit_qps, p.max_cut_pct), self.squeeze_floor(s))
        if not tightens(tighter, s.limit_qps, p.hysteresis_pct):
            return None
        where = "" if at is None else f" in the open window ending {obs.window_end:%H:%M}, complete by census"
        return decide(s, at or obs.window_end, tighter, Action.SET, (
            f"squeeze: {', '.join(obs.busy_brokers)} busy under the limit{where} ({judged.detail}): the limit and its "
            f"target cut by {p.max_cut_pct:g} % to {tighter:.1f} msg/s, the share of the broker its other load "
            "leaves"), s.mode, target=tighter)

    def squeeze_floor(self, state: ResourceState) -> float:
        """The lowest value a squeeze cuts to (msg/s cluster-wide): ``min_limit_qps``."""
        return self.params.min_limit_qps

    # --- set ------------------------------------------------------------------------------------------------------
    def set(self, state: ResourceState, cand: Candidate, batch: Batch | None = None) -> Step | None:
        """A rule fired in the candidate's window: a new limit (:meth:`start`) or, under one, a refresh, a raise to
        an advisory floor, or a cut towards the (frozen) target by more than ``hysteresis_pct``, once the cool-down
        is over unless critical. An advisory candidate never replaces or loosens an enforced limit. None when the
        window is stale: no limit in force and the window at or before the last lift (decided on it or on later
        windows: a broker's lines that landed late, or an open window that proved the lift, finalized after it); or
        when it ran at the level before a probe in flight (the window is then judged against that level, and the
        probe is undone if the window shows the demand taking the raise).""

        Raises:
            ValueError: the candidate's target is not a finite number > 0 (the candidate step guarantees it).
        """
        if not (math.isfinite(cand.target_qps) and cand.target_qps > 0):
            raise ValueError(f"limit target for {state.resource} must be finite and > 0, got {cand.target_qps}")
        s, p = state, self.params
        current = s.limit_qps
        if current is None and s.last_lift_end is not None and cand.window_end <= s.last_lift_end:
            return None
        if self.before_raise(s, cand):  # it ran at the level before the probe: judged as such (:meth:`on_window`)
            return None
        if current is None or (s.mode != Mode.ENFORCE and cand.mode == Mode.ENFORCE):
            return self.start(s, cand, batch.preliminary if batch is not None else None)
        if s.mode == Mode.ENFORCE and cand.mode != Mode.ENFORCE:  # never replaced by an advisory record
            return self.refresh(s, cand.window_end, f"refresh (anomaly persists: {cand.reason}; the enforced limit "
                                                    "stays, the brokers are healthy because of it)")
        frozen = s.mode == Mode.ENFORCE and s.target_qps is not None
        target = s.target_qps if frozen else cand.target_qps
        shares = None if s.broker_shares else shares_of(cand.broker_tps)  # adopt shares a limit lacks
        if current < cand.floor_qps:
            return decide(s, cand.window_end, target, Action.SET, cand.reason, cand.mode, shares=shares, target=target)
        if tightens(target, current, p.hysteresis_pct) and (
                cand.critical or cooled(s.last_change_end, cand.window_end, p.window, p.cooldown_windows)):
            # max_cut_pct bounds a cut on one window's evidence; a frozen target is proven by the limit's first
            # window and by this one (the anomaly outlived the first cut): reached in one step
            tighter = target if cand.critical or frozen else cut(target, current, p.max_cut_pct)
            reason = f"{cand.reason}; {outlived(s, '')}" if frozen else cand.reason
            return decide(s, cand.window_end, tighter, Action.SET, reason, cand.mode, shares=shares, target=target)
        return self.refresh(s, cand.window_end, f"refresh (anomaly persists): {cand.reason}")

    def start(self, state: ResourceState, cand: Candidate,
              preliminary: tuple[dt.datetime, float, str] | None = None) -> Step:
        """A new limit (none in force, or an enforced one replacing an advisory record): the target (at most the
        policy's :meth:`first_bound`), but a non-critical anomaly cuts at most ``max_cut_pct`` of the observed rate;
        a recurrence goes straight to the remembered target. Target, shares and the rule's baseline are frozen here.
        ``preliminary``: the fast path's decision on the same cause (a window at or before this one, the same mode;
        :class:`Batch`): within ``hysteresis_pct`` of it the final path keeps its value (and target), so that the
        two speeds' figures of one limit (consume basis, baselines from fewer windows) do not change its value."""
        if (bound := self.first_bound(cand)) is not None and (bound[0] < cand.target_qps or self.fills_room):
            cand = replace(cand, target_qps=bound[0], reason=f"{cand.reason}; {bound[1]}")
        if cand.mode != Mode.ENFORCE and self.remembered(state, cand):
            cand = replace(cand, mode=Mode.ENFORCE, reason=f"{cand.reason}; enforced: its enforced limit was lifted "
                                                            f"{state.last_lift_end:%Y-%m-%dT%H:%M:%SZ}, a recurrence")
        state, again = self.recurrence(state, cand)
        start, reason, target = cand.target_qps, cand.reason, cand.target_qps
        if again is not None:
            start = target = again[0]
            reason += again[1]
        elif not cand.critical and cand.observed_tps:
            start = cut(start, cand.observed_tps, self.params.max_cut_pct)
        if preliminary is not None and preliminary.window_end <= cand.window_end and preliminary.mode == cand.mode \
                and not above(start, preliminary.limit_qps, self.params.hysteresis_pct) \
                and not tightens(start, preliminary.limit_qps, self.params.hysteresis_pct):
            kept = preliminary.limit_qps
            reason += (f"; kept at the preliminary decision's {kept:.1f} msg/s (within "
                       f"{self.params.hysteresis_pct:g} % of {start:.1f})") if not close(start, kept) else ""
            if start == target:
                target = kept
            start = kept
        step = decide(state, cand.window_end, start, Action.SET, reason, cand.mode, shares=shares_of(cand.broker_tps),
                      target=target, fresh=True, baseline=cand.baseline_tps)
        if preliminary is not None and preliminary.mode == cand.mode and preliminary.limit_qps != start:
            # the fast path's value ran at the brokers until this one is in force: windows before it are judged
            # against the lower of the two (limit_in_force), never clear on a value they did not run under
            step = step.moved(previous_limit_qps=preliminary.limit_qps)
        return step

    def first_bound(self, cand: Candidate) -> tuple[float, str] | None:
        """The highest first limit its candidate's window allows (msg/s cluster-wide) and why; None: the target."""
        return None

    def remembered(self, state: ResourceState, cand: Candidate) -> bool:
        """Whether ``cand``'s window is within ``recurrence_windows`` of an enforced limit's remembered lift (an
        advisory record's lift is not remembered): the cause came back, and a candidate that would be only advisory
        (a surge on brokers still healthy in its first window) is enforced at the remembered target, before its
        broker is crushed again."""
        last, p = state.last_lift_end, self.params
        return (last is not None and state.lifted_target_qps is not None and cand.window_end >= last
                and cand.window_end - last <= p.window * p.recurrence_windows)

    def recurrence(self, state: ResourceState, cand: Candidate) -> tuple[ResourceState, tuple[float, str] | None]:
        """Whether a new enforced limit is a recurrence: within ``recurrence_windows`` of the last remembered lift →
        (the state with one more recurrence, (the remembered target, a reason suffix)); a memory older than that
        is forgotten. An advisory candidate neither uses nor counts the memory."""
        p, last = self.params, state.last_lift_end
        if cand.mode != Mode.ENFORCE or last is None or cand.window_end < last:
            return state, None
        if cand.window_end - last > p.window * p.recurrence_windows:
            return replace(state, **FORGOTTEN), None
        s = replace(state, recurrences=state.recurrences + 1)
        if s.lifted_target_qps is None:
            return s, None
        lifted = (p.window * self.recovery_needed(s)).total_seconds() / 60
        return s, (s.lifted_target_qps, (
            f"; recurrence {s.recurrences} within {p.recurrence_windows} windows of the lift at "
            f"{last:%Y-%m-%dT%H:%M:%SZ}: straight to the target of {s.lifted_target_qps:.1f} msg/s frozen "
            f"before, lifted only after {lifted:g} min of clear windows"))

    # --- hold and refresh -----------------------------------------------------------------------------------------
    def hold(self, state: ResourceState, obs: Observation, status: Status, detail: str, batch: Batch) -> Step:
        """A window where no rule fired but the cause persists under the limit (``bound`` or ``hold``): refreshed
        when due; subclasses add their own step first."""
        return self.refresh(state, obs.window_end, f"refresh (anomaly persists, {detail})")

    def capped(self, state: ResourceState, obs: Observation, detail: str, batch: Batch) -> Step:
        """A final window at the cap with its demand hidden (``capped``, never clear): kept, refreshed when due;
        subclasses probe."""
        return self.refresh(state, obs.window_end, f"refresh (held at the cap: {detail}; lifted only after a clear "
                                                   "window)")

    def refresh(self, state: ResourceState, window_end: dt.datetime, reason: str) -> Step:
        """Re-issue the limit in force (a new ``expires_at``) ``refresh_seconds`` after its last decision."""
        if refresh_due(state.last_decision_end, window_end, self.params.refresh):
            return decide(state, window_end, state.limit_qps, Action.SET, reason, state.mode, change=False)
        return Step(state)

    def cut_due(self, state: ResourceState, end: dt.datetime) -> bool:
        """Whether a first cut bounded by ``max_cut_pct`` (the limit more than ``hysteresis_pct`` above the frozen
        target) may go down to the target in the window ending ``end``: the cool-down of ``cooldown_windows``
        windows since the last change is over."""
        p = self.params
        return above(state.limit_qps, state.target_qps, p.hysteresis_pct) and cooled(
            state.last_change_end, end, p.window, p.cooldown_windows)

    def cut_to_target(self, state: ResourceState, at: dt.datetime, detail: str) -> Step:
        """Down to the frozen target in one step, as a decision of the window ending ``at``: the cause outlived the
        first cut (:meth:`cut_due`); ``detail`` what the window showed."""
        return decide(state, at, state.target_qps, Action.SET, outlived(state, f" ({detail})"), state.mode)

    # --- probe ----------------------------------------------------------------------------------------------------
    def back_from_probe(self, state: ResourceState, at: dt.datetime, back: float, reason: str,
                        until: dt.datetime, backoff: int, **noted) -> Step:
        """The end of a raise the demand took (or that its deadline ended): back to ``back`` (msg/s), as a decision
        of the window ending ``at``; the raised level (the limit now) a ceiling no probe reaches until ``until``,
        ``backoff`` the probes counted for the doubling pause (:func:`~pipelines.decide.limits.steps.backoff_hold`);
        ``noted``: more fields of the state the kind keeps (a retry storm's probe time and its cost)."""
        return decide(state, at, back, Action.SET, reason, state.mode).moved(
            probe_ceiling_qps=state.limit_qps, probe_hold_until=until, probe_backoff=backoff, probe_from_qps=None,
            probe_effective_end=None, **noted)

    def raise_to(self, state: ResourceState, window_end: dt.datetime, raised: float, reason: str,
                 batch: Batch) -> Step:
        """A probe: the limit raised to ``raised`` (``relax``), remembering the level before it and the first
        window wholly under the raise (:func:`~pipelines.decide.limits.steps.effective_end` of ``batch.now``, else of
        ``window_end``)."""
        before = state.limit_qps
        at = decided_at(batch.now, batch.stream_end(window_end), self.params.max_decision_lag)
        return decide(state, window_end, raised, Action.RELAX, reason, state.mode).moved(
            probe_from_qps=before, probe_effective_end=effective_end(at, self.params.window), probe_decided_at=at)

    def raise_bounds(self, state: ResourceState, obs: Observation, current: float,
                     step: float, headroom: float | None = None) -> tuple[float, list[str]]:
        """How far a probe from ``current`` towards ``step`` may go: below a ceiling a probe hit before (until
        ``probe_hold_until``, less ``hysteresis_pct``), and no carrier's predicted writes (its writes now plus its
        share of the raise) above ``headroom`` (default ``probe_headroom_share``) of what it wrote when it was last
        busy. Returns the raised level and the bounds that shaped it."""
        p = self.params
        headroom = p.probe_headroom_share if headroom is None else headroom
        raised, bounds = step, []
        if state.probe_ceiling_qps is not None and state.probe_hold_until is not None \
                and obs.window_end < state.probe_hold_until:
            below = lower(state.probe_ceiling_qps, p.hysteresis_pct)
            if below < raised:
                raised, bounds = below, [f"below the ceiling of {state.probe_ceiling_qps:.1f} msg/s until "
                                         f"{state.probe_hold_until:%Y-%m-%dT%H:%M:%SZ}"]
        shares = state.broker_shares
        for broker, busy in sorted(state.busy_load.items()):
            load = obs.carrier_load.get(broker)
            if load is None:
                continue
            share = shares.get(broker, min(shares.values()) if shares else 1.0)
            if share <= 0:
                continue
            room = (headroom * busy - load) / share
            if current + room < raised:
                raised = current + max(room, 0.0)
                bounds = [f"{broker} writes {load:.1f} msg/s and was busy at {busy:.1f}"]
        return raised, bounds

    def newer_under_cap(self, state: ResourceState, obs: Observation, batch: Batch) -> Observation | None:
        """A window of the resource newer than ``obs`` that the governor has seen (a final window of the batch, or
        an open one of whose carriers one has reported, judged on them: :meth:`reported_share`) under its cap
        (``clear`` or ``hold``); None when each such window is at its cap (``bound``, ``capped``) or there is none.
        A probe is an experiment on a cause that is on: it is decided only while the newest window the governor
        has seen is at the cap, never after one under it (a cause that ended while its last capped window was
        being judged)."""
        for o in sorted((*batch.observations, *batch.opened), key=lambda o: o.window_end):
            if o.window_end <= obs.window_end or self.reported_share(state, o) is None:
                continue
            if self.judge(o, state).status not in (Status.BOUND, Status.CAPPED):
                return o
        return None

    def took_raise(self, state: ResourceState, obs: Observation) -> bool:
        """Whether ``obs`` shows the demand taking a probe in flight: a window wholly under the raise at its cap
        (``bound`` or ``capped``, on the carriers that reported so far), or the window the raise came into force in
        (:meth:`applying_raise`) admitting more than ``hysteresis_pct`` over the level before on those carriers:
        part of it ran under the raise and the demand filled it. Either is evidence enough to undo the probe (a
        demand below the raise would not have gone over the level before), a window earlier than a whole one."""
        if state.probe_from_qps is None or self.reported_share(state, obs) is None:
            return False
        if self.under_raise(state, obs):
            return self.judge(obs, state).status in (Status.BOUND, Status.CAPPED)
        return self.applying_raise(state, obs) and self.took_level(state, obs)

    def took_level(self, state: ResourceState, obs: Observation) -> bool:
        """Whether ``obs`` admitted more than ``hysteresis_pct`` over the level before the probe in flight, on the
        carriers that reported (:meth:`reported_share`): a demand beyond it, which the level before would have
        refused."""
        part = self.reported_share(state, obs)
        return part is not None and state.probe_from_qps is not None and obs.observed_tps > higher(
            state.probe_from_qps * part, self.params.hysteresis_pct)

    @staticmethod
    def may_decide_again(state: ResourceState) -> bool:
        """Whether one more decision may be taken as a decision of the window of the state's last decision: each
        gets the next version rank (:data:`pipelines.decide.records.limit_rows.EXTRA_RANKS`), so a later decision of the
        same window outranks the earlier at the brokers."""
        return state.window_decisions < len(EXTRA_RANKS)

    def probe_deadline(self, state: ResourceState) -> dt.datetime | None:
        """When the probe in flight is undone unless lifted (stream time, naive UTC): ``probe_max_windows`` windows
        and one ``trigger`` after it was decided; None without a probe. A probe's stated cost: at most that long at
        ``relax_factor`` × the level before, whatever its carriers' lines do (late, missing, a carrier that applied
        the raise late) and whatever they answered (a probe the demand left alone ends in its lift by then, or is
        undone too). Why two windows and a trigger: a probe is decided when its window at the cap has been read, some
        latency after that window's end; its first whole window ends two windows after that same end and is read
        with the same latency, so the earliest a whole window under it answers is two windows after its decision,
        and the trigger is the time that answer takes to be decided. The demand taking the raise is seen earlier, in
        the window it came into force in (:meth:`took_raise`)."""
        s, p = state, self.params
        if s.probe_from_qps is None or s.probe_decided_at is None:
            return None
        return s.probe_decided_at + p.window * p.probe_max_windows + p.trigger

    def probe_overdue(self, state: ResourceState, batch: Batch) -> bool:
        """A probe in flight past :meth:`probe_deadline` at the micro-batch's time (its processing time, at most
        ``max_decision_lag`` after its newest window: :func:`~pipelines.decide.limits.steps.decided_at`)."""
        deadline = self.probe_deadline(state)
        if deadline is None or batch.now is None or batch.horizon_end is None:
            return False
        return decided_at(batch.now, batch.stream_end(batch.horizon_end), self.params.max_decision_lag) >= deadline

    def probe_excess(self, state: ResourceState, batch: Batch, obs: Observation | None = None) -> float:
        """What the probe in flight admitted beyond the level before it so far (messages, cluster-wide): over the
        windows seen from the one it came into force in (the batch's final windows, the open ones on the carriers
        that reported, and ``obs``), each window's admitted rate above its part of the level before, times the
        window's length. Its undo states it (the probe's cost, paid by the bystanders)."""
        s = state
        if s.probe_from_qps is None or s.probe_effective_end is None:
            return 0.0
        first = s.probe_effective_end - self.params.window
        seen: dict[dt.datetime, Observation] = {}
        for o in (*batch.opened, *((obs,) if obs is not None else ()), *batch.observations):
            if o.window_end >= first and self.reported_share(s, o) is not None:
                seen[o.window_end] = o  # a final window replaces the open one of the same end
        seconds = self.params.window.total_seconds()
        return sum(max(o.observed_tps - s.probe_from_qps * self.reported_share(s, o), 0.0) * seconds
                   for o in seen.values())

    def paused(self, before: ResourceState, step: Step, end: dt.datetime) -> Step:
        """``step`` taken on a state with a probe in flight: where it cut the limit below the raised level (the rule
        fired under the raise: the demand took it), the raised level is a ceiling and the pause of an undo holds
        (``recovery_windows`` × 2^n windows, :func:`~pipelines.decide.limits.steps.backoff_hold`), as after an undo."""
        if before.probe_from_qps is None or step.state.limit_qps is None or step.state.limit_qps >= before.limit_qps:
            return step
        p, backoff = self.params, before.probe_backoff + 1
        return step.moved(probe_ceiling_qps=before.limit_qps, probe_backoff=backoff,
                          probe_hold_until=end + backoff_hold(p.window, p.recovery_windows, backoff))

    @staticmethod
    def under_raise(state: ResourceState, obs: Observation) -> bool:
        """A probe is in flight and ``obs`` is a window wholly under it."""
        return (state.probe_from_qps is not None and state.probe_effective_end is not None
                and obs.window_end >= state.probe_effective_end)

    @staticmethod
    def before_raise(state: ResourceState, obs: Observation) -> bool:
        """A probe is in flight and ``obs`` is a window before it came into force: it says nothing of the probe."""
        return (state.probe_from_qps is not None and state.probe_effective_end is not None
                and obs.window_end < state.probe_effective_end)

    def applying_raise(self, state: ResourceState, obs: Observation) -> bool:
        """A probe is in flight and ``obs`` is the window it was decided in, the last before the raise (ending one
        window before ``probe_effective_end``): it ran at the level before, after the evidence that started the
        probe."""
        return (state.probe_from_qps is not None and state.probe_effective_end is not None
                and obs.window_end == state.probe_effective_end - self.params.window)

    def on_open(self, state: ResourceState, obs: Observation, status: Status, detail: str,
                batch: Batch) -> Step | None:
        """An open window after the horizon, complete by census, judged ``status`` (not clear): a decision now when
        the policy makes one on open windows (:attr:`probe_on_open`), else None."""
        return None

    # --- lift and veto --------------------------------------------------------------------------------------------
    def recovery_needed(self, state: ResourceState) -> int:
        """Clear windows the limit needs before its lift (:func:`~pipelines.decide.limits.steps.recovery_needed`)."""
        return recovery_needed(state.recurrences, self.params.recovery_windows, self.params.max_recovery_windows)

    def lift_point(self, state: ResourceState) -> dt.datetime:
        """The end of the window after which the limit may be lifted: :meth:`recovery_needed` windows after the last
        window that kept it (the cause seen, or its demand hidden at the cap), and after the last decision."""
        kept = last_kept(state)
        return max(kept + self.params.window * self.recovery_needed(state),
                   (state.last_decision_end or kept) + self.params.window)

    def veto(self, state: ResourceState, lift_at: dt.datetime, batch: Batch,
             exempt: frozenset | set = frozenset()) -> Evidence | None:
        """A ``veto`` evidence row when a window after ``lift_at`` is not clear: a later final window of the batch,
        or an open window the fast path has seen (before its census a ratio rule takes the larger of its partial
        consume rate and the one frozen with the limit; judged on the carriers that reported, :meth:`judge`); None
        (no veto) otherwise, and for an advisory record. ``exempt``: window ends a probe's answer showed hid nothing
        (:meth:`pipelines.decide.limits.open_windows.OpenWindowSteps.forgiven`)."""
        if state.mode != Mode.ENFORCE:
            return None
        later = [o for o in batch.observations if o.window_end > lift_at and o.window_end not in exempt] + [
            o for o in batch.opened if o.window_end > lift_at and o.window_end not in exempt
            and self.reported_share(state, o) is not None]
        for obs in later:
            judged = self.judge(obs, state)
            if judged.status != Status.CLEAR:
                where = "open window" if obs in batch.opened else "final window"
                return Evidence(obs.window_end, Status.VETO, state.limit_qps, obs.observed_tps, obs.rejected,
                                f"lift vetoed: the {where} ending {obs.window_end:%H:%M} shows the cause back: "
                                f"{judged.detail}")
        return None

    def lift_due(self, state: ResourceState, until: dt.datetime, batch: Batch) -> Step:
        """The lift of a limit whose :meth:`lift_point` is at or before ``until`` and not vetoed; else an enforced
        limit held through clear windows is refreshed (its record must not expire at the brokers mid-episode)."""
        s = state
        if s.limit_qps is None or s.last_candidate_end is None:
            return Step(s)
        lift_at = self.lift_point(s)
        veto = self.veto(s, lift_at, batch) if lift_at <= until else None
        if lift_at <= until and veto is None:
            return self.lift(s, lift_at)
        step = Step(s, evidence=(veto,) if veto is not None else ())
        if s.mode == Mode.ENFORCE and s.last_candidate_end < until:  # held through clear windows
            why = veto.detail if veto is not None else (
                f"{self.kind.value} silent since {last_kept(s):%Y-%m-%dT%H:%M:%SZ}, lifted after "
                f"{self.recovery_needed(s)} clear windows")
            step = step.then(self.refresh(s, until, f"refresh (held: {why}; in force until it is lifted)"))
        return step

    def lift(self, state: ResourceState, at: dt.datetime, proof: str = "",
             proven_to: dt.datetime | None = None) -> Step:
        """Lift the limit as a decision of the window ending ``at`` (remembered by the recurrence memory when
        enforced); ``proof``: the open windows that proved it, when not the final ones, up to the window ending
        ``proven_to``: the lift is remembered there, so that those windows, once final, cannot limit again."""
        s = state
        enforced = s.mode == Mode.ENFORCE
        why = (f"the cause is gone: {self.kind.value} did not fire on the visible demand (what the brokers admitted "
               f"and the limiter rejected) under the {s.limit_qps:.1f} msg/s limit" if enforced else "anomaly absent")
        if enforced and s.probe_from_qps is not None:
            why += f", raised from {s.probe_from_qps:.1f} msg/s to see it"
        damped = f", doubled for each of {s.recurrences} recurrences" if s.recurrences else ""
        at_cap = (f", at the cap with its demand hidden until {s.last_capped_end:%Y-%m-%dT%H:%M:%SZ}"
                  if enforced and s.last_capped_end is not None and s.last_capped_end > s.last_candidate_end else "")
        step = decide(s, at, s.limit_qps, Action.LIFT,
                      f"{why} since {s.last_candidate_end:%Y-%m-%dT%H:%M:%SZ}{at_cap} ({self.recovery_needed(s)} "
                      f"windows{damped}){proof}: the limit is doing nothing and is lifted, brokers fall back to their "
                      "defaults", s.mode, remember=True)
        if proven_to is not None and step.state.last_lift_end is not None:
            step = step.moved(last_lift_end=max(step.state.last_lift_end, proven_to))
        return step

    # --- in force: when a new value reaches the brokers ------------------------------------------------------------
    def timed(self, step: Step, then: Step, batch: Batch) -> Step:
        """``step`` followed by ``then``, the state's ``change_effective_end`` moved when ``then`` changed the value
        (a set to a new value or a raise): the end of the first window wholly after the decision's processing time
        (``batch.now``, at most ``max_decision_lag`` after the stream's newest window,
        :func:`~pipelines.decide.limits.steps.decided_at`; None: the end of the window decided), the first window
        the brokers ran at the new value (:func:`~pipelines.decide.limits.steps.effective_end`). A new limit the
        final path sets at the fast path's preliminary value (``batch.preliminary``) is in force since the fast
        path's decision: taken as made within the window after the preliminary's window."""
        out = step.then(then)
        changed = [d for d in then.decisions if d.action != Action.LIFT and d.limit_qps != d.previous_qps]
        if changed and out.state.limit_qps is not None:
            last, early = changed[-1], batch.preliminary
            window = self.params.window
            at = decided_at(batch.now, batch.stream_end(last.window_end), self.params.max_decision_lag)
            if last.previous_qps is None and early is not None and early.limit_qps == last.limit_qps:
                at = min(at, early.window_end + window)
            out = out.moved(change_effective_end=effective_end(at, window))
        return out

    # --- a limit decided elsewhere: the fast path's, an operator's -----------------------------------------------
    @staticmethod
    def adopt(state: ResourceState, limit_qps: float | None, window_end: dt.datetime, mode: Mode,
              shares: Mapping[str, float] | None) -> ResourceState:
        """``state`` with a limit the fast path decided on the open window ending ``window_end`` (naive UTC) in
        force, as the fast path's next micro-batch folds from it (the final path has not folded that window yet):
        ``limit_qps`` (msg/s cluster-wide; None: the fast path lifted it) decided and changed at that window, in
        ``mode``, so that hysteresis, the cool-down and the maximum cut apply from it and it is not decided again
        every micro-batch. A first limit (none in ``state``) also freezes its target and its per-broker ``shares``
        (fractions summing to 1) as a set does (:func:`~pipelines.decide.limits.steps.frozen_basis`), as the final
        path will freeze them when it folds the same window."""
        out = replace(state, limit_qps=limit_qps, last_decision_end=window_end, last_change_end=window_end, mode=mode)
        return replace(out, **frozen_basis(window_end, limit_qps, shares)) if state.limit_qps is None else out

    @staticmethod
    def pin(key: tuple[str, str], limit_qps: float, mode: Mode, shares: Mapping[str, float],
            at: dt.datetime) -> ResourceState:
        """A fresh state for the resource ``key`` ((resource_type, resource)) held at an operator's figure (an
        override ``pin``): ``limit_qps`` (msg/s cluster-wide) in force, and its target, since the window ending
        ``at`` (naive UTC), split by ``shares`` (fractions summing to 1; empty: by the traffic), in ``mode``. The
        rules judge the resource's windows from it in shadow; what they decide is not published while the pin is in
        force."""
        return ResourceState(*key, limit_qps=limit_qps, mode=mode, target_qps=limit_qps, broker_shares=dict(shares),
                             limited_since=at, last_candidate_end=at, last_decision_end=at, last_change_end=at)
