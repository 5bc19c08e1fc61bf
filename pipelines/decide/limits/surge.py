"""``TRAFFIC_SURGE``'s limit: a topic's puts while a broker carrying it is busy, its whole life (:class:`SurgeLimit`).

**Visible demand**: the topic's puts plus its producers' logged ``RATE_LIMITED`` rejections (as many as they log
and ship: a sampled or throttled log shows less, none shows nothing). **Gone** =
:func:`pipelines.decide.rules.facts.surge_fires` silent on it against the baseline frozen when the limit was set.

**Set** at ``surge_headroom`` × the baseline (a candidate on healthy brokers is an advisory record, never below its
observed rate × ``surge_headroom``, and never replaces an enforced limit). **Probe**: at its cap (``bound``, or
``capped``: its producers' rejection logs show too little to tell) on healthy carriers for ``recovery_windows``
windows it is probed upward ×``relax_factor`` (NSQ's RDY policy, article 003), bounded three ways so that it
settles:

* **Busy load.** For each carrier the writes (msg/s) of the last window it was busy are known
  (``ResourceState.busy_load``; a busy broker writes about its capacity and fast-fails the rest). A probe never
  raises a carrier's predicted writes (its writes now plus its share of the raise) above ``surge_burst_share``
  of that figure (the lower of it and ``probe_headroom_share``; :meth:`pipelines.decide.limits.base.LimitPolicy.
  raise_bounds`): the breaker's burst below.
* **Ceiling.** A probe that made a carrier busy anyway is stepped back to the level before it, and that level is a
  ceiling: no probe reaches it again for ``recovery_windows`` × 2^n windows (n: how many times it was hit).
* **Budget.** While the cause lasts the limit's value changes at most ``surge_max_changes`` times: a raise is taken
  only when its possible step-back still fits (a lift needs room for itself only).

**Burst.** A limiter rejecting most of a surge's demand opens its breaker, and each time it closes a second of
tokens (``burst_seconds`` × the carrier's share) reaches the broker's 200 ms send queue at once (article 001's
breaker): a carrier goes busy while its average writes are only 0.79-0.90 of what it wrote busy, and stays healthy
at 0.58-0.66 (docs/decisions.md §8). So the
first limit too keeps each busy carrier's writes (its other senders' writes, at their normal once the surge is
limited, plus its share of the limit) at most ``surge_burst_share`` of its busy writes (:meth:`SurgeLimit.
first_bound`), never below ``surge_squeeze_headroom`` × the baseline (the squeeze's floor) unless at that floor a
carrier, its other senders back at their normal, would write more than ``surge_floor_yield_share`` of its busy
writes (0.79, the lowest share at which the carriers above were seen busy) and they alone would not: a broker with
little headroom stays busy at the floor.

**Lift**: a probe whose uncapped step would reach ``lift_at_qps`` (the observed peak × ``surge_headroom``) lifts
the limit: the brokers took the whole demand, and such a lift is not remembered (the demand was legitimate). A
surge that ended on a topic whose normal rate sits near its limit is ``capped`` like a surge still on: a probe
tells them apart (its windows clear, and the limit is lifted after them).
"""

from __future__ import annotations

import datetime as dt
import math
from typing import ClassVar

from pipelines.decide.limits.base import LimitPolicy
from pipelines.decide.limits.steps import Step, above, backoff_hold, decide, too_small
from pipelines.decide.records.resource import Batch, Candidate, Observation, ResourceState
from pipelines.decide.rules.facts import normal_floor, shares_of, surge_fires
from pipelines.decide.words import Action, Anomaly, Status


class SurgeLimit(LimitPolicy):
    """``TRAFFIC_SURGE``: limits a topic's puts while a carrier is distressed (module docstring)."""

    kind = Anomaly.TRAFFIC_SURGE
    fills_room: ClassVar[bool] = True

    def fires(self, demand: float, obs: Observation, state: ResourceState) -> tuple[bool, str]:
        """:func:`~pipelines.decide.rules.facts.surge_fires` of the visible demand against the baseline frozen with the
        limit (msg/s; a limit saved without one: its target ÷ ``surge_headroom``)."""
        det = self.params.detection
        baseline = state.baseline_tps
        if baseline is None:  # a limit saved before the baseline was frozen: its target is headroom x baseline
            baseline = (state.target_qps or state.limit_qps) / self.params.surge_headroom
        factor = demand / baseline if baseline > 0 else math.inf
        return surge_fires(demand, baseline, det), (
            f"visible demand {demand:.1f} msg/s, {factor:.1f}x the baseline of {baseline:.1f} msg/s frozen with the "
            f"limit (rule: >= {det.surge_factor:.1f}x and >= {det.surge_floor_tps:.1f} msg/s)")

    def view_hides_demand(self, obs: Observation) -> bool:
        """The limiter's own view, or a carrier busy in the window (``obs.busy_brokers``): a busy broker fast-fails
        part of what the limiter passed, and its producers' busy lines are thinned by their log throttle, so the
        topic's admitted rate under the cap says nothing of its demand (docs/decisions.md §8)."""
        return obs.viewed or bool(obs.busy_brokers)

    def first_bound(self, cand: Candidate) -> tuple[float, str] | None:
        """The breaker's burst (:meth:`LimitPolicy.start` applies it): the highest first limit (msg/s cluster-wide)
        that keeps every carrier busy in the candidate's window (``cand.busy_load``: its writes W, msg/s) at most
        ``surge_burst_share`` of W: its other senders' writes plus its share of the limit (the module's **Burst**),
        and a text saying why. Its other senders write what they kept of W (W less the topic's puts there,
        ``cand.broker_tps``) while the surge crowds them, and their normal once it is limited: the carrier's normal
        writes (``cand.busy_normal``: N, msg/s, :func:`pipelines.decide.rules.crowding.busy_normals`) less the topic's
        baseline share of them, when that is more. Not below ``surge_squeeze_headroom`` × the candidate's baseline
        (the floor), unless at the floor a carrier with a known normal would write more than
        ``surge_floor_yield_share`` of W, its other senders at their normal (not at what they write while crowding
        it: another surge's writes there are limited too), and those alone would not (a yield that cannot bring the
        carrier under that share spares no one and holds the topic under its normal traffic): a broker with little
        headroom stays busy at the floor, so the limit then yields to the room at ``surge_burst_share``, but where
        that leaves less than the topic's baseline, no lower than what fits under ``surge_floor_yield_share`` beside
        them (that share × W less their normal, ÷ its share) up to the baseline; never below ``min_limit_qps``
        (docs/decisions.md §8). None without a busy carrier the topic writes to, or without a baseline."""
        p = self.params
        shares = shares_of(cand.broker_tps)
        if cand.baseline_tps is None or not shares:
            return None
        floor = max(p.min_limit_qps, normal_floor(cand.baseline_tps, p.surge_squeeze_headroom))
        best, why, crowded, fits = math.inf, "", "", math.inf
        for broker, busy in sorted(cand.busy_load.items()):
            share = shares.get(broker)
            if share is None or busy is None or not math.isfinite(busy):
                continue
            other = max(busy - cand.broker_tps[broker], 0.0)
            normal = cand.busy_normal.get(broker)
            at_normal = None if normal is None else max(normal - cand.baseline_tps * share, 0.0)
            usual = other if at_normal is None else max(at_normal, other)
            room = max(p.surge_burst_share * busy - usual, 0.0) / share
            if room < best:
                best, why = room, f"{broker} wrote {busy:.1f} msg/s busy, {other:.1f} of them other topics'" + (
                    f" ({usual:.1f} at their normal)" if usual > other else "")
            yield_at = p.surge_floor_yield_share * busy
            if at_normal is not None and at_normal <= yield_at < at_normal + share * floor:
                fits = min(fits, (yield_at - at_normal) / share)
                crowded = crowded or (f"; at {floor:.1f} msg/s {broker} would write {at_normal + share * floor:.1f}, "
                                      f"over {p.surge_floor_yield_share:g} of what it wrote busy")
        if not math.isfinite(best):
            return None
        bound = max(best, max(p.min_limit_qps, min(fits, cand.baseline_tps)) if crowded else floor)
        floored = f" (not below {p.surge_squeeze_headroom:g}x the baseline)" if bound > best else ""
        return bound, (f"bounded to {bound:.1f} msg/s by the breaker's burst: {why}; its share of the limit keeps its "
                       f"writes at most {p.surge_burst_share:g} of that" + (crowded or floored))

    def squeeze_floor(self, state: ResourceState) -> float:
        """``surge_squeeze_headroom`` × the baseline frozen with the limit (msg/s; its target when none was frozen,
        or when the target is lower already). A carrier can stay busy at the target though its average writes sit
        well under its capacity: a limiter rejecting most of the demand opens its breaker, and each time it closes
        the bucket's second of tokens (``burst_seconds``) reaches the send queue at the demand's rate, more than the
        200 ms queue absorbs (article 001's breaker). The floor stays above the topic's normal traffic (1.0x), which
        its fix returns to: a squeeze to it would hold a fixed topic at the cap (docs/decisions.md §8)."""
        floor = state.target_qps or 0.0
        if state.baseline_tps is not None:
            floor = min(floor, normal_floor(state.baseline_tps, self.params.surge_squeeze_headroom))
        return max(self.params.min_limit_qps, floor)

    def hold(self, state: ResourceState, obs: Observation, status: Status, detail: str, batch: Batch) -> Step:
        """At the cap (``bound`` or ``capped``): a carrier busy under a raise steps the probe back; healthy for
        ``recovery_windows`` windows, a probe; a carrier busy under a loose first cut, down to the target."""
        p, end = self.params, obs.window_end
        if self.before_raise(state, obs):  # the window ran at the level before the probe
            return self._kept(state, obs, status, detail, batch)
        at_limit = status in (Status.BOUND, Status.CAPPED)
        high = above(state.limit_qps, state.target_qps, p.hysteresis_pct)
        if at_limit and not obs.healthy and high:
            return self._step_back(state, obs, detail)
        if at_limit and obs.healthy and end - self.healthy_since(state) >= p.window * p.recovery_windows:
            probed = self._probe(state, obs, detail, batch)
            if probed is not None:
                return probed
        if not obs.healthy and self.cut_due(state, end):
            return self.cut_to_target(state, end, f"{detail}, a carrier busy")
        return self._kept(state, obs, status, detail, batch)

    def capped(self, state: ResourceState, obs: Observation, detail: str, batch: Batch) -> Step:
        """As :meth:`hold`: at the cap, ``capped`` or ``bound`` alike, a surge limit is probed, stepped back or cut."""
        return self.hold(state, obs, Status.CAPPED, detail, batch)

    def _kept(self, state: ResourceState, obs: Observation, status: Status, detail: str, batch: Batch) -> Step:
        return super().capped(state, obs, detail, batch) if status == Status.CAPPED else \
            super().hold(state, obs, status, detail, batch)

    @staticmethod
    def healthy_since(state: ResourceState) -> dt.datetime:
        """Since when every carrier has been healthy and the limit unchanged."""
        return max(x for x in (state.last_change_end, state.last_distress_end, state.limited_since) if x is not None)

    def _step_back(self, state: ResourceState, obs: Observation, detail: str) -> Step:
        """A carrier busy above the target: back to the level before the probe (or one step down), that level a
        ceiling for a doubling interval."""
        p = self.params
        current = state.limit_qps
        back = state.probe_from_qps if state.probe_from_qps is not None and state.probe_from_qps < current \
            else max(state.target_qps, current / p.relax_factor)
        backoff = state.probe_backoff + 1
        hold = backoff_hold(p.window, p.recovery_windows, backoff)
        busy = ", ".join(obs.busy_brokers) or "a carrier"
        return self.back_from_probe(
            state, obs.window_end, back, f"probe undone: {detail} and {busy} busy; back to {back:.1f} msg/s, and "
            f"{current:.1f} msg/s is a ceiling no probe reaches for {hold.total_seconds() / 60:g} min",
            obs.window_end + hold, backoff)

    def _probe(self, state: ResourceState, obs: Observation, detail: str, batch: Batch) -> Step | None:
        """Probe upward when the bounds and the budget allow a step worth taking (more than ``hysteresis_pct``), or
        lift when the step reaches ``lift_at_qps``; None when neither, or when a carrier of the limit that was busy
        shows no writes in the window (the topic's lines there missing: nothing bounds the raise on it)."""
        p = self.params
        end, current = obs.window_end, state.limit_qps
        if any(b in state.broker_shares and b not in obs.carrier_load for b in state.busy_load):
            return None  # a carrier that was busy, its writes not shown in the window: nothing bounds the raise
        if self.newer_under_cap(state, obs, batch) is not None:
            return None  # the surge may have ended: no experiment after a window under the cap
        step = current * p.relax_factor
        raised, bounds = self.raise_bounds(state, obs, current, step,
                                           min(p.probe_headroom_share, p.surge_burst_share))
        text = (f"probe: {detail} while every broker carrying it stays healthy since "
                f"{self.healthy_since(state):%Y-%m-%dT%H:%M:%SZ}")
        lifts = state.lift_at_qps is not None and raised == step and step >= state.lift_at_qps
        # the budget: a lift needs room for itself; a raise for itself and its possible step-back
        if state.cause_changes + (1 if lifts else 2) > p.surge_max_changes:
            return None
        if lifts:
            return decide(state, end, current, Action.LIFT, f"{text}; x{p.relax_factor} would reach the normal rate of "
                          f"{state.lift_at_qps:.1f} msg/s: lifted, brokers fall back to their defaults", state.mode)
        if too_small(raised, current, p.hysteresis_pct):
            return None
        how = f"raised x{p.relax_factor}" if raised == step else f"raised to {raised:.1f} msg/s ({'; '.join(bounds)})"
        return self.raise_to(state, end, raised, f"{text}; {how}", batch)
