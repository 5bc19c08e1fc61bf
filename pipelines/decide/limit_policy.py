"""Each rule's limit in closed loop: what its evidence is under a limit, when a window still shows the cause, and
what the limit does at its cap. One class per rule that limits something (:data:`POLICIES`), behind one small
interface (:class:`LimitPolicy`), as Netflix concurrency-limits keeps one ``Limit`` interface with an algorithm per
class; :func:`pipelines.decide.fold.fold_resource` walks the windows and asks the resource's policy.

A limit changes the traffic the governor reads next, so under an enforced limit a window is judged on the demand
the governor can see (:meth:`LimitPolicy.judge`):

* ``bound``: the limiter rejected sends of the resource (``RATE_LIMITED`` failures, or the in-broker limiter's own
  last rejection), or the cluster-wide rate sits at ``bound_share`` (90 %) of the limit or above: the limit may be
  hiding demand, so the cause is taken to persist (the limit is refreshed, never lifted);
* ``hold``: below the cap, nothing rejected, so the demand is fully visible, and the rule still fires on it: the
  cause persists, in plain sight;
* ``clear``: below the cap, nothing rejected, and the rule does not fire on the visible demand: the cause is gone,
  and the window counts towards the lift.

Per rule, "visible" and "gone":

* ``RUNAWAY_RETRY`` (:class:`RetryStormLimit`, a group's retry traffic): visible = the retry traffic the brokers
  admitted (per broker the larger of the send-backs and the plain sends to ``%RETRY%<group>``); gone = its ratio to
  the group's consume rate *in the same window* is below ``retry_ratio_threshold`` (with nothing consumed, the
  retries are below ``retry_floor_tps``, as the rule itself says). The floor is not applied otherwise (the limit
  itself may be below it), and the ratio uses the current consume rate, so a broken consumer whose consumption has fallen under throttling still fires, while a
  fixed one that keeps a legitimate retry level (a few percent) does not. Never probed: its demand is the broken
  consumer.
* ``TRAFFIC_SURGE`` (:class:`SurgeLimit`, a topic's puts): visible = the topic's puts; gone = below
  ``surge_factor`` × the baseline frozen when the limit was set (or below ``surge_floor_tps``). At its cap on
  healthy carriers it is probed upward, bounded by what its carriers were writing when they were last busy
  (:meth:`SurgeLimit.at_cap`).

Under a limit, "the brokers are healthy" describes the brokers *as limited*: it never shows that the limit is no
longer needed, only that a careful probe may be tried.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from pipelines.decide.catalogue import Anomaly

if TYPE_CHECKING:
    from pipelines.decide.fold import Fold, Observation, ResourceState

#: Demand evidence of a window under an enforced limit (:meth:`LimitPolicy.judge`); ``veto``: an open window of the
#: fast path shows the cause back (a lift is not decided while it does).
BOUND, HOLD, CLEAR, VETO = "bound", "hold", "clear", "veto"


class LimitPolicy:
    """The interface: one rule's evidence, hold and probe (the lift is the fold's: ``recovery_windows`` clear
    windows, doubled per recurrence). Stateless; the resource's state is the fold's."""

    kind: Anomaly
    #: Whether the limit is probed upward at its cap on healthy carriers.
    probes = False

    def visible_fires(self, obs: Observation, state: ResourceState, fold: Fold) -> tuple[bool, str]:
        """Whether the rule fires on the visible demand of ``obs`` (below the cap, nothing rejected), and why."""
        raise NotImplementedError

    def judge(self, obs: Observation, state: ResourceState, fold: Fold) -> tuple[str, str]:
        """(status, detail) of a window under the enforced limit ``state.limit_qps`` (module docstring)."""
        cfg, limit = fold.cfg, state.limit_qps
        numbers = f"{obs.observed_tps:.1f} of {limit:.1f} msg/s"
        if obs.rejected > 0 or obs.observed_tps >= cfg.bound_share * limit:
            rejecting = f", rejecting ({obs.rejected} sends rejected by the limiter)" if obs.rejected > 0 else ""
            return BOUND, f"limit-bound: {numbers}{rejecting}"
        fires, why = self.visible_fires(obs, state, fold)
        if fires:
            return HOLD, f"visible demand fires the rule: {numbers}, nothing rejected, {why}"
        return CLEAR, f"the cause is gone: {numbers}, nothing rejected, {why}"

    def at_cap(self, fold: Fold, obs: Observation, status: str, detail: str) -> None:
        """A window under the enforced limit where no rule fired but the cause persists (``bound`` or ``hold``):
        refresh when due (:meth:`Fold.refresh`); subclasses add their own step first."""
        fold.refresh(obs.window_end, f"refresh (anomaly persists, {detail})")


class RetryStormLimit(LimitPolicy):
    """``RUNAWAY_RETRY``: limits a consumer group's retry traffic (module docstring)."""

    kind = Anomaly.RUNAWAY_RETRY

    def visible_fires(self, obs: Observation, state: ResourceState, fold: Fold) -> tuple[bool, str]:
        threshold = fold.detection.retry_ratio_threshold
        consume = obs.consume_tps or 0.0
        if consume > 0:
            ratio = obs.observed_tps / consume
            text = f"retry ratio {ratio:.2f} against {consume:.1f} msg/s consumed (rule: >= {threshold:.2f})"
            return ratio >= threshold, text
        floor = fold.detection.retry_floor_tps  # nothing consumed: the rule's own case, retries at its floor
        return obs.observed_tps >= floor, f"nothing consumed (rule: retry >= {floor:.1f} msg/s then)"

    def at_cap(self, fold: Fold, obs: Observation, status: str, detail: str) -> None:
        """The first cut was bounded by ``max_cut_pct``: while the cause persists above the frozen target, the limit
        goes down to it once the cool-down is over (one step, so a persisting storm sees at most one change after
        its first limit)."""
        state = fold.state
        if fold.above_target() and fold.cooled(obs.window_end):
            fold.emit(obs.window_end, state.target_qps, fold.SET, fold.outlived(f" ({detail})"), state.mode)
        else:
            super().at_cap(fold, obs, status, detail)


class SurgeLimit(LimitPolicy):
    """``TRAFFIC_SURGE``: limits a topic's puts while a carrier is distressed (module docstring).

    At its cap on healthy carriers for ``recovery_windows`` windows it is probed upward ×``relax_factor`` (NSQ's
    RDY policy, article 003), bounded three ways so that it settles:

    * **Busy load.** For each carrier the writes (msg/s) of the last window it was busy are known
      (``ResourceState.busy_load``; a busy broker writes about its capacity and fast-fails the rest). A probe never
      raises a carrier's predicted writes (its writes now plus its share of the raise) above
      ``probe_headroom_share`` of that figure.
    * **Ceiling.** A probe that made a carrier busy anyway is stepped back to the level before it, and that level is
      a ceiling: no probe reaches it again for ``recovery_windows`` × 2^n windows (n: how many times it was hit).
    * **Budget.** While the cause lasts the limit's value changes at most ``surge_max_changes`` times: a raise is
      taken only when its possible step-back still fits (a lift needs room for itself only).

    A probe whose uncapped step would reach ``lift_at_qps`` (the observed peak × ``surge_headroom``) lifts the limit:
    the brokers took the whole demand; such a lift is not remembered (the demand was legitimate).
    """

    kind = Anomaly.TRAFFIC_SURGE
    probes = True

    def visible_fires(self, obs: Observation, state: ResourceState, fold: Fold) -> tuple[bool, str]:
        det = fold.detection
        baseline = state.baseline_tps
        if baseline is None:  # a limit saved before the baseline was frozen: its target is headroom x baseline
            baseline = (state.target_qps or state.limit_qps) / fold.cfg.surge_headroom
        factor = obs.observed_tps / baseline if baseline > 0 else math.inf
        fires = obs.observed_tps >= det.surge_floor_tps and obs.observed_tps >= det.surge_factor * baseline
        return fires, (f"{factor:.1f}x the baseline of {baseline:.1f} msg/s frozen with the limit "
                       f"(rule: >= {det.surge_factor:.1f}x and >= {det.surge_floor_tps:.1f} msg/s)")

    def at_cap(self, fold: Fold, obs: Observation, status: str, detail: str) -> None:
        state = fold.state
        end = obs.window_end
        if status == BOUND and not obs.healthy and fold.above_target():
            self._step_back(fold, obs, detail)
            return
        if status == BOUND and obs.healthy and fold.healthy_for(end) and self._probe(fold, obs, detail):
            return
        if fold.above_target() and not obs.healthy and fold.cooled(end):  # a carrier busy under a loose first cut
            fold.emit(end, state.target_qps, fold.SET, fold.outlived(f" ({detail}, a carrier busy)"), state.mode)
            return
        super().at_cap(fold, obs, status, detail)

    @staticmethod
    def _step_back(fold: Fold, obs: Observation, detail: str) -> None:
        state, cfg = fold.state, fold.cfg
        current = state.limit_qps
        back = state.probe_from_qps if state.probe_from_qps is not None and state.probe_from_qps < current \
            else max(state.target_qps, current / cfg.relax_factor)
        backoff = state.probe_backoff + 1
        hold = fold.window * cfg.recovery_windows * 2 ** min(backoff, 16)
        busy = ", ".join(obs.busy_brokers) or "a carrier"
        fold.emit(obs.window_end, back, fold.SET,
                  f"probe undone: {detail} and {busy} busy; back to {back:.1f} msg/s, and {current:.1f} msg/s is a "
                  f"ceiling no probe reaches for {hold.total_seconds() / 60:g} min", state.mode)
        fold.state = replace(fold.state, probe_ceiling_qps=current, probe_hold_until=obs.window_end + hold,
                             probe_backoff=backoff, probe_from_qps=None)

    @staticmethod
    def _probe(fold: Fold, obs: Observation, detail: str) -> bool:
        """Probe upward when the bounds allow a step worth taking (more than ``hysteresis_pct``); True when a
        decision was made."""
        state, cfg = fold.state, fold.cfg
        end, current = obs.window_end, state.limit_qps
        step = current * cfg.relax_factor
        raised, bounds = step, []
        if state.probe_ceiling_qps is not None and state.probe_hold_until is not None and end < state.probe_hold_until:
            below = state.probe_ceiling_qps * (1.0 - cfg.hysteresis_pct / 100.0)
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
            room = (cfg.probe_headroom_share * busy - load) / share
            if current + room < raised:
                raised = current + max(room, 0.0)
                bounds = [f"{broker} writes {load:.1f} msg/s and was busy at {busy:.1f}"]
        text = f"probe: {detail} while every broker carrying it stays healthy since {fold.healthy_since():%Y-%m-%dT%H:%M:%SZ}"
        lifts = state.lift_at_qps is not None and raised == step and step >= state.lift_at_qps
        # the budget: a lift needs room for itself; a raise for itself and its possible step-back
        if state.cause_changes + (1 if lifts else 2) > cfg.surge_max_changes:
            return False
        if lifts:
            fold.emit(end, current, fold.LIFT, f"{text}; x{cfg.relax_factor} would reach the normal rate of "
                      f"{state.lift_at_qps:.1f} msg/s: lifted, brokers fall back to their defaults", state.mode)
            return True
        if raised < current * (1.0 + cfg.hysteresis_pct / 100.0):
            return False
        how = f"raised x{cfg.relax_factor}" if raised == step else f"raised to {raised:.1f} msg/s ({'; '.join(bounds)})"
        fold.emit(end, raised, fold.RELAX, f"{text}; {how}", state.mode)
        fold.state = replace(fold.state, probe_from_qps=current)
        return True


#: The limit policy of each limited resource type (``group`` → RUNAWAY_RETRY, ``topic`` → TRAFFIC_SURGE), the same
#: mapping as :func:`pipelines.decide.catalogue.limited_by`.
POLICIES: dict[str, LimitPolicy] = {"group": RetryStormLimit(), "topic": SurgeLimit()}


def policy_for(resource_type: str) -> LimitPolicy:
    """The :class:`LimitPolicy` of a limited resource type.

    Raises:
        ValueError: no rule limits that type.
    """
    try:
        return POLICIES[resource_type]
    except KeyError:
        raise ValueError(f"no rule limits a {resource_type}") from None

