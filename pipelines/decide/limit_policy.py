"""Each rule's limit in closed loop: what its evidence is under a limit, when a window still shows the cause, and
what the limit does at its cap. One class per rule that limits something (:data:`POLICIES`), behind one small
interface (:class:`LimitPolicy`), as Netflix concurrency-limits keeps one ``Limit`` interface with an algorithm per
class; :func:`pipelines.decide.fold.fold_resource` walks the windows and asks the resource's policy.

A limit changes the traffic the governor reads next: **a limit at its cap shows the cap, not the demand.** Under an
enforced limit a window is judged on the demand the governor can see (:meth:`LimitPolicy.judge`): what the brokers
admitted of the resource's limited traffic, plus whatever evidence of refused demand there is (the clients' logged
``RATE_LIMITED`` rejections, the limiter's own view, a consumer client's fallback sends). Evidence of refused
demand only ever adds demand; nothing at the cap proves the cause gone:

* ``bound``: the rule fires on the visible demand and the limit binds (it rejects, or the admitted rate sits at
  ``bound_share`` of the cap or above): the cause persists behind the limit;
* ``hold``: the rule fires on the visible demand below the cap, nothing rejected: the cause persists in plain sight;
* ``capped``: the rule does not fire on the visible demand, but the admitted rate is at ``bound_share`` of the cap
  or above (or the limiter's own view reports rejections): how much more the clients wanted is unknown. Never a
  clear window: a limit is never lifted on it. The rule's policy resolves it on purpose with a **probe** (a raised
  cap, so that the demand shows below it or follows it);
* ``clear``: below ``bound_share`` of the cap and the rule silent on the visible demand: the cause is gone, and the
  window counts towards the lift (even when the limiter rejects a little: bursts).

Per rule, "visible" and "gone":

* ``RUNAWAY_RETRY`` (:class:`RetryStormLimit`, a group's retry traffic): visible = the retry traffic the brokers
  admitted (per broker the larger of the send-backs and the plain sends to ``%RETRY%<group>``), the logged
  rejections of ``%RETRY%<group>`` (in practice none: a refused send-back is answered to the consumer, and its
  client's fallback send fails inside the client), and the refused send-backs that the **fallback sends** reveal:
  a consumer client whose send-back a broker refuses sends the message to ``%RETRY%<group>`` as a plain send through
  its own producer (apache/rocketmq ``DefaultMQPushConsumerImpl.sendMessageBack`` →
  ``sendMessageBackAsNormalMessage``, group ``CLIENT_INNER_PRODUCER``), into the same limiter (Sohu's
  ``RateLimitHandler`` keys both by ``%RETRY%<group>``, sohutv/rocketmq 5.3.1-sohu-01). The brokers print those as
  puts of the retry topic beyond the send-backs; with send-backs admitted at a rate a ≤ 1 and the fallbacks at the
  same rate, fallbacks ÷ send-backs ≈ the refused share ρ = 1 − a, so the demand is at least the admitted traffic ÷
  (1 − ρ) (ρ at most :data:`REFUSED_SHARE_MAX`). Gone = the visible demand's ratio to the group's consume rate *in
  the same window* is below ``retry_ratio_threshold`` (with nothing consumed, the retries are below
  ``retry_floor_tps``). A broken consumer at its cap is ``bound`` by its fallback sends; a fixed one whose
  legitimate retries sit just under the cap is ``capped`` and probed: ×``relax_factor`` for one window, back to the
  target at once if the admitted rate follows the raise (:meth:`RetryStormLimit.capped`), lifted after it if not.
  A consumer client without the fallback (one that only re-consumes locally) shows no refused demand: its storm at
  the cap is ``capped`` too, and each probe costs one window at the raised cap (then a doubling pause).
* ``TRAFFIC_SURGE`` (:class:`SurgeLimit`, a topic's puts): visible = the topic's puts plus its logged rejections (as
  many as its producers log and ship: sampled or throttled logs show less); gone = below ``surge_factor`` × the
  baseline frozen when the limit was set (or below ``surge_floor_tps``). At its cap (``bound`` or ``capped``) on
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
from pipelines.decide.facts import TOLERANCE, rate
from pipelines.decide.fold_types import limit_in_force
from pipelines.decide.words import Action, Status

if TYPE_CHECKING:
    from pipelines.decide.fold import Fold, Observation, ResourceState

#: The largest refused share of a group's send-backs read from its fallback sends (demand at most 20× the admitted).
REFUSED_SHARE_MAX = 0.95


class LimitPolicy:
    """The interface: one rule's evidence, hold and probe (the lift is the fold's: ``recovery_windows`` windows
    since the cause was last seen, the last of them clear, doubled per recurrence). Stateless; the resource's state
    is the fold's."""

    kind: Anomaly
    #: Whether a ``capped`` open window the fast path has seen (complete by census) starts a probe at once
    #: (:meth:`on_open`), instead of waiting for the window to be final.
    probe_on_open = False

    def visible(self, obs: Observation, fold: Fold) -> tuple[float, str]:
        """The visible demand (msg/s, cluster-wide) of ``obs``: admitted + logged rejections per second; and a text
        naming the refused demand it adds ("" when none)."""
        logged = rate(obs.rejected, fold.window.total_seconds())
        return obs.observed_tps + logged, ""

    def visible_fires(self, demand: float, obs: Observation, state: ResourceState, fold: Fold) -> tuple[bool, str]:
        """Whether the rule fires on the visible ``demand`` (msg/s) of ``obs``, and why."""
        raise NotImplementedError

    def judge(self, obs: Observation, state: ResourceState, fold: Fold) -> tuple[str, str]:
        """(status, detail) of a window under the enforced limit in force in it (:func:`limit_in_force`; module
        docstring)."""
        cfg, limit = fold.cfg, limit_in_force(state, obs.window_end)
        numbers = f"{obs.observed_tps:.1f} of {limit:.1f} msg/s"
        demand, refused = self.visible(obs, fold)
        rejecting = obs.rejected > 0 or obs.viewed or bool(refused)
        said = ([f"{obs.rejected} sends rejected by the limiter"] if obs.rejected > 0 else []) + (
            [refused] if refused else [])
        how = (f", rejecting ({'; '.join(said)})" if said else "") + (
            ", the limiter's own view reports rejections (no count)" if obs.viewed else "")
        fires, why = self.visible_fires(demand, obs, state, fold)
        at_cap = obs.observed_tps >= cfg.bound_share * limit
        if fires and (rejecting or at_cap):
            return Status.BOUND, f"limit-bound: {numbers}{how}; {why}"
        if fires:
            return Status.HOLD, f"visible demand fires the rule: {numbers}, nothing rejected; {why}"
        if at_cap:
            return Status.CAPPED, (f"at the cap, the demand hidden: {numbers}{how}, at least {cfg.bound_share:.0%} of the "
                            f"cap; {why} on what shows")
        if obs.viewed:
            return Status.CAPPED, f"the demand hidden: {numbers}{how}; {why} on what shows"
        return Status.CLEAR, f"the cause is gone: {numbers}{how}; {why}"

    def at_cap(self, fold: Fold, obs: Observation, status: Status, detail: str) -> None:
        """A window under the enforced limit where no rule fired but the cause persists (``bound`` or ``hold``):
        refresh when due (:meth:`Fold.refresh`); subclasses add their own step first."""
        fold.refresh(obs.window_end, f"refresh (anomaly persists, {detail})")

    def capped(self, fold: Fold, obs: Observation, detail: str) -> None:
        """A final window at the cap with its demand hidden (``capped``): the limit is kept (refreshed when due);
        subclasses probe."""
        fold.refresh(obs.window_end, f"refresh (held at the cap: {detail}; lifted only after a clear window)")

    def on_open(self, fold: Fold, obs: Observation, status: Status, detail: str) -> bool:
        """An open window after the micro-batch's horizon, complete by census, judged ``status`` (not clear): act on
        it now when the policy does so (:attr:`probe_on_open`); True when a decision was made."""
        return False

    # --- probes, shared -------------------------------------------------------------------------------------------
    @staticmethod
    def raise_bounds(fold: Fold, obs: Observation, current: float, step: float) -> tuple[float, list[str]]:
        """How far a probe from ``current`` towards ``step`` (msg/s) may go: below a ceiling a probe hit before
        (until ``probe_hold_until``, less ``hysteresis_pct``), and no carrier's predicted writes (its writes now plus
        its share of the raise) above ``probe_headroom_share`` of what it wrote when it was last busy. Returns the
        raised level and the bounds that shaped it."""
        state, cfg = fold.state, fold.cfg
        raised, bounds = step, []
        if state.probe_ceiling_qps is not None and state.probe_hold_until is not None \
                and obs.window_end < state.probe_hold_until:
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
        return raised, bounds

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


class RetryStormLimit(LimitPolicy):
    """``RUNAWAY_RETRY``: limits a consumer group's retry traffic (module docstring).

    At its cap with the demand hidden (``capped``: no fallback sends, the rule silent on what shows) the limit is
    probed at once, on the first such window, final or open and complete by census: ×``relax_factor`` (bounded as
    a surge probe is, :meth:`LimitPolicy.raise_bounds`). A window wholly under the raise where the admitted rate
    follows it (``capped`` or ``bound`` again) undoes it at once: back to the level before, and the raised level is a
    ceiling no probe reaches for ``recovery_windows`` × 2^n windows. Where the admitted rate stays below the raised
    cap the window is clear, and the limit is lifted after it. A persisting storm shows its fallback sends (``bound``)
    and is never probed: its limit changes at most once (a first cut down to the target).
    """

    kind = Anomaly.RUNAWAY_RETRY
    probe_on_open = True

    def visible(self, obs: Observation, fold: Fold) -> tuple[float, str]:
        demand, _ = super().visible(obs, fold)
        sent = obs.sendback_tps
        fallback = obs.observed_tps - sent if sent is not None else 0.0
        if sent is None or fallback <= TOLERANCE * max(obs.observed_tps, 1.0):
            return demand, ""
        refused = min(fallback / sent, REFUSED_SHARE_MAX) if sent > 0 else REFUSED_SHARE_MAX
        hidden = obs.observed_tps / (1.0 - refused)
        if hidden <= demand:
            return demand, ""
        return hidden, (f"fallback sends {fallback:.1f} msg/s beside {sent:.1f} msg/s of send-backs: about "
                        f"{refused:.0%} of the send-backs refused, a demand of {hidden:.1f} msg/s")

    def visible_fires(self, demand: float, obs: Observation, state: ResourceState, fold: Fold) -> tuple[bool, str]:
        threshold = fold.detection.retry_ratio_threshold
        consume = obs.consume_tps or 0.0
        if not obs.complete:  # an open window before its census: the consume rate is partial; judged against the
            consume = max(consume, state.baseline_tps or 0.0)  # rate frozen with the limit too, so it only errs late
        if consume > 0:
            ratio = demand / consume
            text = (f"visible retry demand {demand:.1f} msg/s, ratio {ratio:.2f} against {consume:.1f} msg/s "
                    f"consumed (rule: >= {threshold:.2f})")
            return ratio >= threshold, text
        floor = fold.detection.retry_floor_tps  # nothing consumed: the rule's own case, retries at its floor
        return demand >= floor, (f"visible retry demand {demand:.1f} msg/s with nothing consumed (rule: retry >= "
                                 f"{floor:.1f} msg/s then)")

    def at_cap(self, fold: Fold, obs: Observation, status: Status, detail: str) -> None:
        """A probe whose window shows the cause is undone at once; otherwise the first cut was bounded by
        ``max_cut_pct``: while the cause persists above the frozen target, the limit goes down to it once the
        cool-down is over (one step, so a persisting storm sees at most one change after its first limit)."""
        state = fold.state
        if self.under_raise(state, obs):
            self._undo(fold, obs, detail, obs.window_end)
        elif not self.before_raise(state, obs) and fold.above_target() and fold.cooled(obs.window_end):
            fold.emit(obs.window_end, state.target_qps, Action.SET, fold.outlived(f" ({detail})"), state.mode)
        else:
            super().at_cap(fold, obs, status, detail)

    def capped(self, fold: Fold, obs: Observation, detail: str) -> None:
        if not self._probe_or_undo(fold, obs, detail, obs.window_end):
            super().capped(fold, obs, detail)

    def on_open(self, fold: Fold, obs: Observation, status: Status, detail: str) -> bool:
        if status == Status.CAPPED or (status == Status.BOUND and self.under_raise(fold.state, obs)):
            return self._probe_or_undo(fold, obs, f"the open window ending {obs.window_end:%H:%M}, complete by "
                                                  f"census: {detail}", fold.horizon_end)
        return False

    def _probe_or_undo(self, fold: Fold, obs: Observation, detail: str, at) -> bool:
        """Undo a probe whose window the admitted rate followed, or start one; True when a decision was made."""
        state, cfg = fold.state, fold.cfg
        if state.probe_from_qps is not None:
            if self.under_raise(state, obs):
                self._undo(fold, obs, detail, at)
                return True
            return False  # the raise is not in force in this window yet
        if state.probe_hold_until is not None and obs.window_end < state.probe_hold_until:
            return False
        current = state.limit_qps
        raised, bounds = self.raise_bounds(fold, obs, current, current * cfg.relax_factor)
        if raised < current * (1.0 + cfg.hysteresis_pct / 100.0):
            return False
        how = f"x{cfg.relax_factor}" if not bounds else f"to {raised:.1f} msg/s ({'; '.join(bounds)})"
        fold.raise_to(at, raised, f"probe: {detail}; raised {how} to see the demand: back to "
                                  f"{current:.1f} msg/s at once if the admitted rate follows, lifted if it does not")
        return True

    @staticmethod
    def _undo(fold: Fold, obs: Observation, detail: str, at) -> None:
        state, cfg = fold.state, fold.cfg
        back, raised = state.probe_from_qps, state.limit_qps
        backoff = state.probe_backoff + 1
        hold = fold.window * cfg.recovery_windows * 2 ** min(backoff, 16)
        fold.emit(at, back, Action.SET, f"probe undone: {detail}: the demand stays hidden under the raised cap; back "
                  f"to {back:.1f} msg/s, and no probe reaches {raised:.1f} msg/s for {hold.total_seconds() / 60:g} min",
                  state.mode)
        fold.state = replace(fold.state, probe_ceiling_qps=raised, probe_hold_until=obs.window_end + hold,
                             probe_backoff=backoff, probe_from_qps=None, probe_effective_end=None)


class SurgeLimit(LimitPolicy):
    """``TRAFFIC_SURGE``: limits a topic's puts while a carrier is distressed (module docstring).

    At its cap (``bound``, or ``capped``: its producers' rejection logs show too little to tell) on healthy
    carriers for ``recovery_windows`` windows it is probed upward ×``relax_factor`` (NSQ's RDY policy, article
    003), bounded three ways so that it settles:

    * **Busy load.** For each carrier the writes (msg/s) of the last window it was busy are known
      (``ResourceState.busy_load``; a busy broker writes about its capacity and fast-fails the rest). A probe never
      raises a carrier's predicted writes (its writes now plus its share of the raise) above
      ``probe_headroom_share`` of that figure.
    * **Ceiling.** A probe that made a carrier busy anyway is stepped back to the level before it, and that level is
      a ceiling: no probe reaches it again for ``recovery_windows`` × 2^n windows (n: how many times it was hit).
    * **Budget.** While the cause lasts the limit's value changes at most ``surge_max_changes`` times: a raise is
      taken only when its possible step-back still fits (a lift needs room for itself only).

    A probe whose uncapped step would reach ``lift_at_qps`` (the observed peak × ``surge_headroom``) lifts the limit:
    the brokers took the whole demand; such a lift is not remembered (the demand was legitimate). A surge that ended
    on a topic whose normal rate sits near its limit is ``capped`` like a surge still on: a probe tells them apart
    (its windows clear, and the limit is lifted after them).
    """

    kind = Anomaly.TRAFFIC_SURGE

    def visible_fires(self, demand: float, obs: Observation, state: ResourceState, fold: Fold) -> tuple[bool, str]:
        det = fold.detection
        baseline = state.baseline_tps
        if baseline is None:  # a limit saved before the baseline was frozen: its target is headroom x baseline
            baseline = (state.target_qps or state.limit_qps) / fold.cfg.surge_headroom
        factor = demand / baseline if baseline > 0 else math.inf
        fires = demand >= det.surge_floor_tps and demand >= det.surge_factor * baseline
        return fires, (f"visible demand {demand:.1f} msg/s, {factor:.1f}x the baseline of {baseline:.1f} msg/s frozen "
                       f"with the limit (rule: >= {det.surge_factor:.1f}x and >= {det.surge_floor_tps:.1f} msg/s)")

    def at_cap(self, fold: Fold, obs: Observation, status: Status, detail: str) -> None:
        state = fold.state
        end = obs.window_end
        if self.before_raise(state, obs):  # the window ran at the level before the probe
            super().capped(fold, obs, detail) if status == Status.CAPPED else super().at_cap(fold, obs, status, detail)
            return
        at_limit = status in (Status.BOUND, Status.CAPPED)
        if at_limit and not obs.healthy and fold.above_target():
            self._step_back(fold, obs, detail)
            return
        if at_limit and obs.healthy and fold.healthy_for(end) and self._probe(fold, obs, detail):
            return
        if fold.above_target() and not obs.healthy and fold.cooled(end):  # a carrier busy under a loose first cut
            fold.emit(end, state.target_qps, Action.SET, fold.outlived(f" ({detail}, a carrier busy)"), state.mode)
            return
        if status == Status.CAPPED:
            super().capped(fold, obs, detail)
        else:
            super().at_cap(fold, obs, status, detail)

    def capped(self, fold: Fold, obs: Observation, detail: str) -> None:
        self.at_cap(fold, obs, Status.CAPPED, detail)

    @staticmethod
    def _step_back(fold: Fold, obs: Observation, detail: str) -> None:
        state, cfg = fold.state, fold.cfg
        current = state.limit_qps
        back = state.probe_from_qps if state.probe_from_qps is not None and state.probe_from_qps < current \
            else max(state.target_qps, current / cfg.relax_factor)
        backoff = state.probe_backoff + 1
        hold = fold.window * cfg.recovery_windows * 2 ** min(backoff, 16)
        busy = ", ".join(obs.busy_brokers) or "a carrier"
        fold.emit(obs.window_end, back, Action.SET,
                  f"probe undone: {detail} and {busy} busy; back to {back:.1f} msg/s, and {current:.1f} msg/s is a "
                  f"ceiling no probe reaches for {hold.total_seconds() / 60:g} min", state.mode)
        fold.state = replace(fold.state, probe_ceiling_qps=current, probe_hold_until=obs.window_end + hold,
                             probe_backoff=backoff, probe_from_qps=None, probe_effective_end=None)

    def _probe(self, fold: Fold, obs: Observation, detail: str) -> bool:
        """Probe upward when the bounds allow a step worth taking (more than ``hysteresis_pct``); True when a
        decision was made."""
        state, cfg = fold.state, fold.cfg
        end, current = obs.window_end, state.limit_qps
        step = current * cfg.relax_factor
        raised, bounds = self.raise_bounds(fold, obs, current, step)
        text = f"probe: {detail} while every broker carrying it stays healthy since {fold.healthy_since():%Y-%m-%dT%H:%M:%SZ}"
        lifts = state.lift_at_qps is not None and raised == step and step >= state.lift_at_qps
        # the budget: a lift needs room for itself; a raise for itself and its possible step-back
        if state.cause_changes + (1 if lifts else 2) > cfg.surge_max_changes:
            return False
        if lifts:
            fold.emit(end, current, Action.LIFT, f"{text}; x{cfg.relax_factor} would reach the normal rate of "
                      f"{state.lift_at_qps:.1f} msg/s: lifted, brokers fall back to their defaults", state.mode)
            return True
        if raised < current * (1.0 + cfg.hysteresis_pct / 100.0):
            return False
        how = f"raised x{cfg.relax_factor}" if raised == step else f"raised to {raised:.1f} msg/s ({'; '.join(bounds)})"
        fold.raise_to(end, raised, f"{text}; {how}")
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
