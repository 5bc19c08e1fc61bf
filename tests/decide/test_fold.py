"""The per-resource policy fold and the limit policies, plain Python over sequences of windows: set, hysteresis,
cool-down, refresh, demand evidence under a limit, surge probing, the lift veto, recurrences. No Spark."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import re

import pytest

from pipelines.config import DetectionConfig, LimitsConfig
from pipelines.decide.catalogue import policy_for
from pipelines.decide.paths.walk import fold_resource
from pipelines.decide.records.resource import Batch
from pipelines.decide.records.resource import Candidate, Observation, PendingPreliminary, ResourceState, limit_in_force
from pipelines.decide.limits.steps import Params, effective_end, recovery_needed
from pipelines.decide.words import Status
from tests.helpers import ts

L = LimitsConfig()
D = DetectionConfig()
T0 = ts("2022-02-08 07:00:00")


def P(cfg: LimitsConfig = L) -> Params:
    """The policies' parameters of ``cfg`` for one-minute windows."""
    return Params.of(cfg, D, 60)


def end(i: int) -> dt.datetime:
    return T0 + dt.timedelta(minutes=i)


# --- the fold --------------------------------------------------------------------------------------------------

def cand(i, qps, **kw):
    kw.setdefault("lift_at_qps", 790.0)
    return Candidate(end(i), qps, f"storm at {i}", **kw)


def fold(cands, horizon, state=None, cfg=L, obs=(), resource_type="group"):
    state = state or ResourceState(resource_type, "g")
    decisions, after, _ = fold_resource(state, cands, end(horizon), P(cfg), observations=obs)
    return decisions, after


def walk(cands, horizon, obs=(), cfg=L, resource_type="group", first=1):
    """Fold one window per micro-batch, as the live job does (each decided at its window's end): a probe decided
    on a window is in force from the next one. (Folded in one micro-batch, every window of it was read before any
    decision of it was published, so none of them ran under a raise decided in it.)"""
    state, out = ResourceState(resource_type, "g"), []
    by_end, seen_at = {c.window_end: c for c in cands}, {o.window_end: o for o in obs}
    for i in range(first, horizon + 1):
        e = end(i)
        decisions, state, _ = fold_resource(state, [by_end[e]] if e in by_end else [], e, P(cfg),
                                            observations=[seen_at[e]] if e in seen_at else [])
        out += decisions
    return out, state


def seen(i, observed, rejected=0, healthy=True):
    return Observation(end(i), observed, rejected, healthy)


def changes(decisions):
    """The decisions that are not refreshes (a refresh re-issues the same limit with a new expiry)."""
    return [(d.action, d.window_end, round(d.limit_qps, 3)) for d in decisions if not d.reason.startswith("refresh")]


def actions(decisions):
    return [(d.action, d.window_end, round(d.limit_qps, 3), d.previous_qps and round(d.previous_qps, 3), d.version) for d in decisions]


def test_fold_sets_once_then_hysteresis_suppresses_a_3_percent_change():
    decisions, state = fold([cand(1, 79.0), cand(2, 76.7), cand(3, 81.5)], horizon=3)
    assert actions(decisions) == [("set", end(1), 79.0, None, 1)]
    assert state.limit_qps == 79.0 and state.last_candidate_end == end(3)


def test_fold_neither_tightens_below_nor_loosens_above_its_frozen_target_while_the_anomaly_lasts():
    """Windows after the first set are under the limit: their targets (40: the consume rate fell; 90: it rose)
    come from capped traffic, so the frozen target of the pre-limit window stands."""
    decisions, state = fold([cand(1, 79.0), cand(2, 40.0), cand(3, 90.0)], horizon=3)
    assert actions(decisions) == [("set", end(1), 79.0, None, 1)]
    assert state.target_qps == 79.0


def test_fold_cooldown_and_max_cut_for_non_critical_anomalies():
    warn = dict(critical=False, observed_tps=200.0)
    decisions, _ = fold([cand(1, 20.0, **warn), cand(2, 10.0, **warn), cand(3, 10.0, **warn), cand(4, 10.0, **warn)], horizon=4)
    # first cut at most 50 % of the observed 200/s; no change in the cool-down (2 windows); then the anomaly has
    # outlived the first cut: down to the target frozen on window 1 in one step (one change after the first limit)
    assert actions(decisions) == [("set", end(1), 100.0, None, 1), ("set", end(3), 20.0, 100.0, 2)]
    assert "outlived the first cut: down to the target of 20.0 msg/s" in decisions[1].reason


def test_a_group_limit_bound_above_its_frozen_target_goes_down_to_it_once_after_the_cool_down():
    """The storm's first window was partial (not critical): the first limit cut 50 % of the observed 200/s. Under
    it the rule falls silent (the cap shows), but the demand runs into the cap: once the cool-down is over the
    limit goes to the frozen target in one step, then holds (refreshes only)."""
    decisions, state = fold([cand(1, 20.0, critical=False, observed_tps=200.0)], horizon=8,
                            obs=[seen(i, 99.0, rejected=36_000) for i in range(2, 9)])
    assert changes(decisions) == [("set", end(1), 100.0), ("set", end(3), 20.0)]
    assert "limit-bound: 99.0 of 100.0 msg/s" in decisions[1].reason
    assert state.limit_qps == 20.0 and state.target_qps == 20.0


def test_fold_critical_cuts_at_once():
    decisions, _ = fold([cand(1, 20.0, critical=True, observed_tps=785.0)], horizon=1)
    assert actions(decisions) == [("set", end(1), 20.0, None, 1)]


def test_fold_refreshes_while_anomaly_lasts():
    decisions, _ = fold([cand(i, 79.0) for i in range(1, 8)], horizon=7, cfg=LimitsConfig(refresh_seconds=180))
    assert [(d.action, d.window_end) for d in decisions] == [("set", end(1)), ("set", end(4)), ("set", end(7))]


def test_fold_lifts_once_the_anomaly_and_the_cap_are_gone_for_recovery_windows():
    """3 clear windows (recovery_windows) and the limit is doing nothing: lifted at once, no x1.5 ramp."""
    decisions, state = fold([cand(1, 100.0, lift_at_qps=300.0)], horizon=10,
                            obs=[seen(i, 3.0) for i in range(2, 11)])
    assert actions(decisions) == [("set", end(1), 100.0, None, 1), ("lift", end(4), 100.0, 100.0, 2)]
    assert decisions[1].reason.startswith("the cause is gone: RUNAWAY_RETRY did not fire on the visible demand (what "
                                          "the brokers admitted and the limiter rejected) under the 100.0 msg/s limit")
    assert state.limit_qps is None and state.target_qps is None and state.broker_shares == {}


def test_fold_does_not_recover_before_recovery_windows():
    decisions, state = fold([cand(1, 79.0)], horizon=3)
    assert [d.action for d in decisions] == ["set"] and state.limit_qps == 79.0


def test_fold_sets_again_if_the_anomaly_returns_after_a_lift():
    decisions, _ = fold([cand(1, 100.0, lift_at_qps=1000.0), cand(6, 100.0, lift_at_qps=1000.0)], horizon=6)
    assert [(d.action, d.window_end, round(d.limit_qps, 1)) for d in decisions] == [
        ("set", end(1), 100.0), ("lift", end(4), 100.0), ("set", end(6), 100.0)]


def test_fold_raises_an_advisory_surge_limit_that_falls_below_a_growing_peak():
    legit = dict(mode="advisory", critical=False)
    decisions, _ = fold([cand(1, 1800.0, floor_qps=1800.0, observed_tps=900.0, **legit),
                         cand(2, 3000.0, floor_qps=3000.0, observed_tps=1500.0, **legit)], horizon=2)
    assert [(d.action, d.limit_qps, d.mode) for d in decisions] == [("set", 1800.0, "advisory"), ("set", 3000.0, "advisory")]


def test_fold_is_the_same_in_one_batch_or_split_across_batches():
    cands = [cand(1, 79.0, lift_at_qps=100.0), cand(2, 79.0, lift_at_qps=100.0), cand(9, 50.0, lift_at_qps=100.0)]
    whole, _ = fold(cands, horizon=16)
    first, mid = fold(cands[:2], horizon=3)
    second, mid2 = fold([], horizon=6, state=mid)
    third, _ = fold(cands[2:], horizon=16, state=mid2)
    assert actions(whole) == actions(first + second + third)
    assert [d.action for d in whole] == ["set", "lift", "set", "lift"]


def test_fold_rejects_non_finite_target():
    with pytest.raises(ValueError, match="finite"):
        fold([cand(1, math.nan)], horizon=1)


def test_fast_fold_does_not_recover_and_an_older_window_does_not_move_the_last_candidate_back():
    state = ResourceState("group", "g")
    decisions, after, _ = fold_resource(state, [cand(5, 79.0)], end(20), P(L), recover_windows=False)
    assert [d.action for d in decisions] == ["set"] and after.limit_qps == 79.0   # no relax/lift on open windows
    _, older, _ = fold_resource(after, [cand(3, 79.0)], end(5), P(L))
    assert older.last_candidate_end == end(5)


# --- closed loop: demand evidence under a limit, frozen basis, per-broker shares, surge probing -------------------

def test_a_capped_storm_keeps_its_limit_refreshed_never_relaxed_then_a_fix_lifts_it():
    """The storm goes on behind the limit: the retry rule falls silent (the stats show the cap, 38-40 of 40 msg/s),
    but the windows are limit-bound, so the limit is refreshed and never relaxed; once the consumer is fixed the
    retry traffic drops to nothing and 3 clear windows lift it."""
    cfg = LimitsConfig(refresh_seconds=300)
    storm = [cand(1, 40.0, broker_tps={"broker-a": 300.0, "broker-b": 300.0})]
    capped = [seen(i, 38.5 + (i % 2), rejected=33_600) for i in range(2, 17)]  # at the cap, 560/s rejected
    fixed = [seen(i, 0.4) for i in range(17, 25)]
    decisions, state = fold(storm, horizon=24, cfg=cfg, obs=capped + fixed)
    assert [(d.action, d.window_end, d.limit_qps) for d in decisions] == [
        ("set", end(1), 40.0), ("set", end(6), 40.0), ("set", end(11), 40.0), ("set", end(16), 40.0),
        ("lift", end(19), 40.0)]
    assert all(d.reason.startswith("refresh (anomaly persists, limit-bound: ") for d in decisions[1:4])
    assert "limit-bound: 39.5 of 40.0 msg/s" in decisions[2].reason or "limit-bound: 38.5 of 40.0" in decisions[2].reason
    assert state.limit_qps is None


def test_rejections_are_visible_demand_and_a_limiter_view_without_a_count_holds():
    """12 msg/s admitted under a 40 msg/s limit (below the bound share): with 3,000 rejected sends in the window (50
    msg/s more) the visible demand is 62 msg/s against 100 consumed, so the rule fires and the limit holds; with 30
    (0.5 msg/s) against 400 consumed it does not, and three such windows lift it. A limiter view that says it
    rejected hides the demand (``capped``), with or without a count logged by some client (a log may be sampled):
    never lifted on it. Under the cap it is not probed either (a probe is an experiment on a cause at its cap);
    at the cap (38 of 40 msg/s) it is, and undone when the demand stays hidden at the raise."""
    g = lambda i, rejected, consume, viewed=False, admitted=12.0: Observation(  # noqa: E731
        end(i), admitted, rejected, True, consume, viewed=viewed)
    decisions, state = fold([cand(1, 40.0)], horizon=8, obs=[g(i, 3000, 100.0) for i in range(2, 9)])
    assert changes(decisions) == [("set", end(1), 40.0)] and state.limit_qps == 40.0
    _, _, evidence = fold_resource(ResourceState("group", "g"), [cand(1, 40.0)], end(2), P(L),
                                      observations=[g(2, 3000, 100.0)])
    assert evidence[0].status == Status.BOUND
    assert evidence[0].detail.startswith("limit-bound: 12.0 of 40.0 msg/s, rejecting (3000 sends rejected by the "
                                         "limiter); visible retry demand 62.0 msg/s, ratio 0.62")
    decisions, state = fold([cand(1, 40.0)], horizon=8, obs=[g(i, 30, 400.0) for i in range(2, 9)])
    assert changes(decisions) == [("set", end(1), 40.0), ("lift", end(4), 40.0)]
    for logged in (0, 30):
        decisions, state = walk([cand(1, 40.0)], horizon=8, obs=[g(i, logged, 400.0, viewed=True)
                                                                 for i in range(2, 9)])
        assert not [d for d in decisions if d.reason.startswith("probe") or d.action == "lift"]
        assert state.limit_qps == 40.0 and state.probe_from_qps is None and state.probe_ceiling_qps is None
        decisions, state = walk([cand(1, 40.0)], horizon=8, obs=[g(i, logged, 400.0, viewed=True, admitted=38.0)
                                                                 for i in range(2, 9)])
        probe, undone = [d for d in decisions if d.reason.startswith("probe")]
        assert (probe.action, probe.window_end, probe.limit_qps) == ("relax", end(2), 60.0)
        assert (undone.action, undone.window_end, undone.limit_qps) == ("set", end(3), 40.0)  # still hidden at 60
        assert "probe undone" in undone.reason and not any(d.action == "lift" for d in decisions)
        assert state.limit_qps == 40.0 and state.probe_ceiling_qps == 60.0


def test_a_storm_at_its_cap_with_a_busy_carrier_is_squeezed_never_probed():
    """38 of 40 msg/s in every window (at the cap, the demand hidden): on healthy carriers the limit is probed x1.5
    at once; with broker-a busy in each window it is never raised (a raise would load the busy broker more), and
    the squeeze cuts it to the share the broker's other load leaves."""
    healthy = [Observation(end(i), 38.0, 0, True, 400.0) for i in range(2, 9)]
    decisions, _ = walk([cand(1, 40.0)], horizon=8, obs=healthy)
    assert [(d.action, d.window_end, d.limit_qps) for d in decisions][1] == ("relax", end(2), 60.0)
    busy = [Observation(end(i), 38.0, 0, True, 400.0, busy_brokers=("broker-a",)) for i in range(2, 9)]
    decisions, state = walk([cand(1, 40.0)], horizon=8, obs=busy)
    assert not [d for d in decisions if d.action == "relax" or d.reason.startswith("probe")]
    squeeze, = [d for d in decisions if d.reason.startswith("squeeze")]
    assert squeeze.limit_qps == 20.0 and state.limit_qps == 20.0


def test_the_target_is_frozen_at_the_pre_limit_rate():
    """A throttled consumer's consume rate falls, and with it the rule's target: the limit must not ratchet down."""
    falling = [cand(1, 40.0, observed_tps=600.0)] + [cand(i, 40.0 * 0.6 ** (i - 1), observed_tps=300.0)
                                                       for i in range(2, 8)]
    decisions, state = fold(falling, horizon=7)
    assert {(d.action, d.limit_qps) for d in decisions} == {("set", 40.0)}
    assert state.target_qps == 40.0


def test_per_broker_shares_add_up_to_the_decision_and_stay_frozen():
    """Shares come from the window that set the limit (75/25 here); the capped windows after it (where broker-b
    now carries more) do not move them: a capped share must not feed on itself."""
    capped = [cand(i, 40.0, broker_tps={"broker-a": 20.0, "broker-b": 30.0}) for i in range(2, 7)]
    decisions, state = fold([cand(1, 40.0, broker_tps={"broker-a": 450.0, "broker-b": 150.0})] + capped, horizon=6)
    first, refresh = decisions
    assert first.broker_limits == {"broker-a": 30.0, "broker-b": 10.0, "*": 10.0}
    assert sum(v for b, v in first.broker_limits.items() if b != "*") == pytest.approx(first.limit_qps)
    assert refresh.reason.startswith("refresh") and refresh.broker_limits == first.broker_limits
    assert state.broker_shares == {"broker-a": 0.75, "broker-b": 0.25}


def test_a_surge_limit_at_its_cap_on_healthy_brokers_is_probed_upward_then_lifted():
    """A topic limited on a busy broker keeps hitting its cap, but the brokers stay healthy: every recovery_windows
    windows the limit is raised x1.5, and lifted once the next step would reach the normal rate."""
    surge = cand(1, 200.0, lift_at_qps=600.0, broker_tps={"broker-a": 800.0})
    capped = [seen(i, 0.95 * 200.0 * 1.5 ** ((i - 1) // 3), rejected=30_000) for i in range(2, 12)]
    decisions, state = walk([surge], horizon=11, obs=capped, resource_type="topic")
    assert [(d.action, d.window_end, round(d.limit_qps, 1)) for d in decisions] == [
        ("set", end(1), 200.0), ("relax", end(4), 300.0), ("relax", end(7), 450.0), ("lift", end(10), 450.0)]
    assert decisions[1].reason.startswith("probe: limit-bound: ")
    assert state.limit_qps is None


def test_a_probe_that_makes_a_broker_busy_again_steps_back():
    surge = cand(1, 200.0, lift_at_qps=6000.0)
    obs = [seen(2, 195.0, 36_000), seen(3, 195.0, 36_000), seen(4, 196.0, 36_000), seen(5, 290.0, 30_000),
           seen(6, 295.0, 30_000, healthy=False)]
    decisions, state = walk([surge], horizon=6, obs=obs, resource_type="topic")
    assert [(d.action, round(d.limit_qps, 1)) for d in decisions] == [("set", 200.0), ("relax", 300.0), ("set", 200.0)]
    assert decisions[-1].reason.startswith("probe undone: ")
    assert state.last_distress_end == end(6)


def test_a_retry_limit_at_its_cap_is_never_probed():
    decisions, state = fold([cand(1, 40.0)], horizon=12, obs=[seen(i, 39.0, 33_600) for i in range(2, 13)])
    assert changes(decisions) == [("set", end(1), 40.0)] and len(decisions) == 3
    assert state.limit_qps == 40.0


# --- recurrence memory (flap damping) ------------------------------------------------------------------------------

def test_an_intermittent_storm_keeps_its_limit_through_its_quiet_spells_from_its_second_storm_on():
    """With flap damping configured (``max_recovery_windows`` 30; the shipped default does not double): 4 storm
    minutes, 4 quiet, again and again (limit 40 msg/s, frozen), one window per micro-batch as the job runs. The first
    quiet spell lifts the limit after recovery_windows (3) clear windows; the second storm is a recurrence: straight
    to the remembered target, and the next lift needs 6 clear windows, more than the 4-minute quiet spell, so the
    third storm finds it in force. Folded in one micro-batch (a replay), the later storm windows veto the first
    lift: held throughout, lifted after the last storm's 3 clear windows."""
    damping = LimitsConfig(max_recovery_windows=30)
    storm = lambda i: seen(i, 39.0, 33_600)  # noqa: E731 (at the cap, rejecting)
    quiet = lambda i: seen(i, 0.3)   # noqa: E731
    obs = ([storm(i) for i in range(2, 5)] + [quiet(i) for i in range(5, 9)]
           + [quiet(i) for i in range(9, 10)] + [storm(i) for i in range(10, 13)] + [quiet(i) for i in range(13, 17)]
           + [storm(i) for i in range(17, 21)] + [quiet(i) for i in range(21, 40)])
    # the second storm's first window fires the rule, against a lower (throttled) consume rate
    cands = {1: cand(1, 40.0), 9: cand(9, 25.0, critical=False, observed_tps=300.0)}
    state, decisions = ResourceState("group", "g"), []
    for i in range(1, 41):
        done, state, _ = fold_resource(state, [cands[i]] if i in cands else [], end(i), P(damping),
                                          observations=[o for o in obs if o.window_end == end(i)])
        decisions += done
    assert changes(decisions) == [
        ("set", end(1), 40.0), ("lift", end(7), 40.0),    # first quiet spell: 3 clear windows (5, 6, 7)
        ("set", end(9), 40.0),                            # recurrence: the remembered 40, not 25, no max-cut step
        ("lift", end(26), 40.0)]                          # held through 13-16; lifted after 6 clear windows (21-26)
    kept = [d for d in decisions if not d.reason.startswith("refresh")]
    assert "recurrence 1 within 30 windows of the lift at" in kept[2].reason
    assert "(6 windows, doubled for each of 1 recurrences)" in kept[-1].reason
    # refreshed every 5 windows while held, bound or clear (its record must not expire at the brokers)
    assert [d.window_end for d in decisions if d.reason.startswith("refresh")] == [end(6), end(14), end(19), end(24)]
    assert (state.recurrences, state.last_lift_end, state.lifted_target_qps) == (1, end(26), 40.0)
    replayed, _ = fold(list(cands.values()), horizon=40, obs=obs, cfg=damping)
    assert changes(replayed) == [("set", end(1), 40.0), ("lift", end(23), 40.0)]


def test_recurrences_double_the_clear_windows_up_to_the_memory_and_a_quiet_memory_is_forgotten():
    """Each recurrence within ``recurrence_windows`` doubles the clear windows the next lift needs, up to
    ``max_recovery_windows``: the shipped 12 gives 3, 6, 12 (a cause that came back twice is still lifted within 20
    minutes of its final fix); at or below ``recovery_windows`` nothing doubles."""
    cfg = LimitsConfig(max_recovery_windows=30)
    assert [recovery_needed(n, cfg.recovery_windows, cfg.max_recovery_windows) for n in range(6)] == [3, 6, 12, 24, 30, 30]
    assert [recovery_needed(n, 3, 0) for n in range(3)] == [3, 3, 3]
    shipped = LimitsConfig()
    assert [recovery_needed(n, shipped.recovery_windows, shipped.max_recovery_windows) for n in range(5)] == [
        3, 6, 12, 12, 12]
    remembered = ResourceState("group", "g", version=4, last_lift_end=end(10), lifted_target_qps=40.0,
                                  recurrences=2)
    decisions, later = fold([cand(41, 60.0)], horizon=41, state=remembered)   # 31 windows after the lift: forgotten
    assert changes(decisions) == [("set", end(41), 60.0)] and "recurrence" not in decisions[0].reason
    assert (later.recurrences, later.last_lift_end, later.lifted_target_qps) == (0, None, None)
    decisions, again = fold([cand(40, 60.0)], horizon=40, state=remembered)   # 30 windows after: a recurrence
    assert changes(decisions) == [("set", end(40), 40.0)] and again.recurrences == 3
    decisions, off = fold([cand(12, 60.0)], horizon=12, state=remembered, cfg=LimitsConfig(recurrence_windows=0))
    assert changes(decisions) == [("set", end(12), 60.0)] and off.recurrences == 0


def test_a_surge_limit_probed_up_to_its_normal_rate_is_not_remembered():
    """A probe-lift means the demand was legitimate: a later surge starts afresh (max-cut step, 3-window recovery)."""
    probed = ResourceState("topic", "g", limit_qps=600.0, version=3, target_qps=400.0, lift_at_qps=800.0,
                              last_candidate_end=end(1), last_decision_end=end(1), last_change_end=end(1),
                              limited_since=end(1), last_lift_end=end(0), lifted_target_qps=300.0, recurrences=1)
    decisions, state = fold([], horizon=5, state=probed, obs=[seen(i, 599.0, 18_000) for i in range(2, 6)])
    assert [d.action for d in decisions][-1] == "lift"
    assert (state.recurrences, state.last_lift_end, state.lifted_target_qps) == (0, None, None)


# --- a limit right in every closed loop ---------------------------------------------------------------------------
# Small plants drive the fold window by window: what a limit admits changes the next windows, and the final path
# decides a window only ``lag`` windows after it ends (the watermark), its decisions in force from the next window.


def group_seen(i, retry, consume, rejected=0):
    return Observation(end(i), retry, rejected, True, consume)


def test_an_advisory_candidate_never_replaces_or_loosens_an_enforced_limit():
    """A surge limit holds the topic at 374.5 msg/s; under it the brokers are healthy, so the surge rule's candidate
    is advisory (2x the capped rate): it only shows that the cause persists."""
    surge = cand(1, 374.5, critical=False, observed_tps=700.0, baseline_tps=187.25, lift_at_qps=3000.0)
    advisory = [cand(i, 1123.6, floor_qps=1123.6, observed_tps=561.8, critical=False, mode="advisory",
                     lift_at_qps=1123.6) for i in range(2, 12)]
    decisions, state = fold([surge, *advisory], horizon=11, resource_type="topic")
    assert {(d.mode, round(d.limit_qps, 1)) for d in decisions} == {("enforce", 374.5)}
    assert [d.window_end for d in decisions] == [end(1), end(6), end(11)]   # the first set, then refreshes
    assert "the enforced limit stays, the brokers are healthy because of it" in decisions[1].reason
    assert (state.mode, state.limit_qps) == ("enforce", 374.5)


def test_an_advisory_record_gives_way_to_an_enforced_limit_that_starts_afresh():
    advisory = cand(1, 1800.0, floor_qps=1800.0, observed_tps=900.0, critical=False, mode="advisory")
    busy = cand(3, 240.0, observed_tps=900.0, critical=False, baseline_tps=120.0, broker_tps={"b": 900.0})
    decisions, state = fold([advisory, busy], horizon=3, resource_type="topic")
    assert [(d.mode, d.limit_qps) for d in decisions] == [("advisory", 1800.0), ("enforce", 450.0)]  # max cut 50 %
    assert (state.limited_since, state.target_qps, state.baseline_tps) == (end(3), 240.0, 120.0)


def test_a_fixed_consumer_that_keeps_a_legitimate_retry_level_is_lifted():
    """Limited to 40 msg/s (10 % of 400 consumed); fixed after window 10, it keeps retrying 6 % of what it consumes
    (24 of 40 msg/s: neither at the cap nor rejecting): the rule does not fire on that visible demand, so three
    windows lift it."""
    storm = [cand(1, 40.0, baseline_tps=400.0)] + [group_seen(i, 39.5, 150.0, rejected=30_000) for i in range(2, 11)]
    fixed = [group_seen(i, 23.0 + i % 3, 400.0) for i in range(11, 25)]
    decisions, state = fold([storm[0]], horizon=24, obs=storm[1:] + fixed)
    assert changes(decisions) == [("set", end(1), 40.0), ("lift", end(13), 40.0)]
    assert "the cause is gone" in decisions[-1].reason and state.limit_qps is None
    _, _, evidence = fold_resource(ResourceState("group", "g"), [storm[0]], end(2), P(L),
                                      observations=[group_seen(2, 23.0, 400.0)])
    assert evidence[0].status == Status.CLEAR
    assert evidence[0].detail == ("the cause is gone: 23.0 of 40.0 msg/s; visible retry demand 23.0 msg/s, ratio 0.06 "
                                  "against 400.0 msg/s consumed (rule: >= 0.50)")


def test_a_consumer_still_broken_keeps_its_limit_even_when_its_consumption_fell_under_throttling():
    """Throttled pulls: it now consumes 30 msg/s and sends back 28 (below the cap, nothing rejected): the rule
    still fires on that visible demand (ratio 0.93), so the cause persists."""
    obs = [group_seen(i, 28.0, 30.0) for i in range(2, 20)]
    decisions, state = fold([cand(1, 40.0, baseline_tps=400.0)], horizon=19, obs=obs)
    assert changes(decisions) == [("set", end(1), 40.0)] and state.limit_qps == 40.0
    assert decisions[1].reason.startswith("refresh (anomaly persists, visible demand fires the rule: 28.0 of 40.0 "
                                          "msg/s, nothing rejected; visible retry demand 28.0 msg/s, ratio 0.93")


def test_nothing_consumed_is_judged_by_the_rule_floor():
    quiet = [group_seen(i, 0.3, 0.0) for i in range(2, 6)]
    decisions, _ = fold([cand(1, 40.0)], horizon=5, obs=quiet)
    assert changes(decisions) == [("set", end(1), 40.0), ("lift", end(4), 40.0)]


def test_a_lift_is_vetoed_while_a_later_window_shows_the_cause_back():
    """Three clear final windows would lift the limit, but the fast path's open window after them already shows
    the storm (600 msg/s rejected against 150 consumed, its census complete): no lift now. Before its census an
    open window's consume rate is partial, so it is judged against the larger of it and the consume rate frozen
    with the limit (400 msg/s): 600 msg/s rejected still vetoes, a fixed consumer's 15 msg/s does not. One below the
    rule lets the lift through. A later final window of the same micro-batch that shows the cause vetoes too."""
    clear = [Observation(end(i), 0.5, 0, True, 400.0) for i in range(2, 5)]
    state = ResourceState("group", "g")
    storm = [Observation(end(5), 37.0, 36_000, True, 150.0), Observation(end(6), 4.0, 0, True, 400.0)]

    def actions(open_evidence, obs=clear, horizon=4):
        decisions, after, evidence = fold_resource(state, [cand(1, 40.0, baseline_tps=400.0)], end(horizon), P(L),
                                                      observations=obs, open_evidence=open_evidence)
        return [d.action for d in decisions], evidence

    acted, evidence = actions(storm)
    assert acted == ["set"]
    veto, = [e for e in evidence if e.status == Status.VETO]
    assert veto.window_end == end(5) and veto.detail.startswith(
        "lift vetoed: the open window ending 07:05 shows the cause back: limit-bound: 37.0 of 40.0 msg/s, rejecting")
    partial = [Observation(end(5), 0.0, 36_000, True, 20.0, complete=False)]  # 600/s rejected, no stats yet
    acted, evidence = actions(partial)
    assert acted == ["set"] and "ratio 1.50 against 400.0 msg/s consumed" in evidence[-1].detail
    legit = [Observation(end(5), 0.0, 900, True, 20.0, complete=False)]      # 15/s: a fixed consumer's retries
    assert actions(legit)[0] == ["set", "lift"]
    below = [Observation(end(5), 20.0, 0, True, 400.0)]
    assert actions(below)[0] == ["set", "lift"]
    back_in_batch = clear + [Observation(end(5), 39.0, 36_000, True, 150.0)]
    acted, evidence = actions((), back_in_batch, horizon=5)
    assert acted == ["set"] and any(e.status == Status.VETO and "final window ending 07:05" in e.detail for e in evidence)


def test_the_recurrence_memory_keeps_enforced_limits_only():
    """An advisory record's lift is not remembered: a later surge on a busy broker starts from its own rule target
    (200), not the advisory figure (2,000). Within ``recurrence_windows`` of an enforced limit's lift, an advisory
    candidate (the surge back on brokers not busy yet) is enforced at the remembered target: a recurrence."""
    advisory = cand(1, 2000.0, floor_qps=2000.0, observed_tps=1000.0, critical=False, mode="advisory")
    decisions, state = fold([advisory], horizon=6, resource_type="topic")
    assert [(d.action, d.mode) for d in decisions] == [("set", "advisory"), ("lift", "advisory")]
    assert (state.last_lift_end, state.lifted_target_qps, state.recurrences) == (None, None, 0)
    busy = cand(8, 200.0, critical=True, observed_tps=1000.0, baseline_tps=100.0)
    decisions, state = fold([busy], horizon=8, state=state, resource_type="topic")
    assert [(d.limit_qps, d.mode) for d in decisions] == [(200.0, "enforce")] and state.recurrences == 0
    remembered = ResourceState("topic", "t", last_lift_end=end(0), lifted_target_qps=150.0)
    decisions, again = fold([advisory], horizon=1, state=remembered, resource_type="topic")
    assert [(d.limit_qps, d.mode) for d in decisions] == [(150.0, "enforce")] and again.recurrences == 1
    assert "enforced: its enforced limit was lifted 2022-02-08T07:00:00Z, a recurrence" in decisions[0].reason
    forgotten = dataclasses.replace(remembered, last_lift_end=end(0) - 31 * (end(1) - end(0)))
    decisions, _ = fold([advisory], horizon=1, state=forgotten, resource_type="topic")
    assert [d.mode for d in decisions] == ["advisory"]   # 31 windows after the lift: forgotten


def surge_loop(minutes, demand, capacity=lambda w: 900.0, others=300.0, baseline=120.0, lag=2, cfg=L,
               logged=lambda rejected: rejected):
    """One topic on broker ``b`` (``others`` msg/s of other topics there, ``capacity(w)`` msg/s): ``demand(w)``
    msg/s offered in window ``w``. What the limit admits is written while the broker can; above its capacity the
    broker fast-fails a share of every topic (busy). The surge rule fires at 4x ``baseline``: with a busy broker an
    enforced candidate (target 2x baseline), else an advisory one. The fold runs ``lag`` windows behind (the final
    path); a decision made at the end of window ``w`` applies from window ``w + 1``. ``logged``: how many of a
    window's rejected sends the producers log and ship (default all). Returns (decisions, per window (limit in force
    or None, busy))."""
    state, limit, decisions, trace = ResourceState("topic", "t"), None, [], []
    windows: dict[int, tuple] = {}
    for w in range(1, minutes + 1):
        offered = demand(w)
        admitted = offered if limit is None else min(offered, limit)
        total = others + admitted
        busy = total > capacity(w)
        written = min(total, capacity(w))
        topic = admitted * written / total
        rejected = 0 if limit is None else logged(int(max(0.0, offered - limit) * 60))
        obs = Observation(end(w), topic, rejected, not busy, None, {"b": written}, ("b",) if busy else ())
        fires = topic >= D.surge_factor * baseline and topic >= D.surge_floor_tps
        c = None
        if fires and busy:
            c = cand(w, 2 * baseline, critical=False, observed_tps=topic, baseline_tps=baseline,
                     lift_at_qps=2 * topic, broker_tps={"b": topic})
        elif fires:
            c = cand(w, 2 * topic, floor_qps=2 * topic, observed_tps=topic, critical=False, mode="advisory",
                     lift_at_qps=2 * topic, baseline_tps=baseline, broker_tps={"b": topic})
        windows[w] = (c, obs)
        trace.append((limit, busy))
        if w - lag >= 1:
            c, o = windows[w - lag]
            made, state, _ = fold_resource(state, [c] if c else [], end(w - lag), P(cfg), observations=[o],
                                              now=end(w) - dt.timedelta(seconds=1))
            decisions += made
            if made:
                last = made[-1]
                limit = None if last.action == "lift" or last.mode != "enforce" else last.limit_qps
    return decisions, trace


def value_changes(decisions):
    """Changes of the enforced value after the first limit (refreshes are not changes; a lift is)."""
    values = [None if d.action == "lift" or d.mode != "enforce" else round(d.limit_qps, 3) for d in decisions]
    return sum(1 for a, b in zip(values, values[1:]) if a != b)


def test_a_surge_limit_settles_within_three_changes_and_keeps_the_broker_healthy():
    """40 minutes at 800 msg/s on a broker of 900 (others 300): limited, probed once up to what the broker wrote
    when it was busy (x0.9), then held; never busy again after the first limit; lifted once the demand is back."""
    decisions, trace = surge_loop(52, lambda w: 800.0 if 6 <= w < 46 else 120.0)
    first = next(i for i, (limit, _) in enumerate(trace) if limit is not None)
    cause = trace[first:45]
    assert not any(busy for _, busy in cause)
    assert value_changes([d for d in decisions if d.window_end <= end(45)]) <= 3
    assert {d.mode for d in decisions} == {"enforce"}
    relaxed = [d for d in decisions if d.action == "relax"]
    assert relaxed and all(300.0 + d.limit_qps <= 0.9 * 900.0 + 1e-6 for d in relaxed)
    assert decisions[-1].action == "lift" and decisions[-1].window_end <= end(46 + 3 + 2)


def test_a_long_surge_from_120_to_1500_on_a_busy_broker_is_never_unlimited_while_it_lasts():
    """The held-out surge: 120 → 1,500 msg/s for 34 minutes on a broker of 900. No advisory record replaces the
    limit, no probe makes the broker busy, at most 3 value changes."""
    decisions, trace = surge_loop(50, lambda w: 1500.0 if 6 <= w < 40 else 120.0)
    first = next(i for i, (limit, _) in enumerate(trace) if limit is not None)
    assert all(limit is not None for limit, _ in trace[first:39])
    assert not any(busy for _, busy in trace[first + 1:39])
    assert value_changes([d for d in decisions if d.window_end <= end(39)]) <= 3
    assert "advisory" not in {d.mode for d in decisions}


def test_a_probe_that_makes_a_carrier_busy_is_stepped_back_and_marks_a_ceiling():
    """The broker loses capacity after a probe (900 → 600 msg/s from window 16): the probe's level (330 msg/s: 300
    of others and 0.7 x 900 = 630 of writes) turns it busy, the limit steps back to where it was, and that level is
    a ceiling no probe reaches for a growing interval."""
    decisions, trace = surge_loop(40, lambda w: 800.0 if w >= 6 else 120.0,
                                  capacity=lambda w: 900.0 if w < 16 else 600.0)
    undone = [d for d in decisions if d.reason.startswith("probe undone")]
    assert len(undone) == 1
    ceiling = undone[0].previous_qps
    assert undone[0].limit_qps < ceiling and f"{ceiling:.1f} msg/s is a ceiling" in undone[0].reason
    later = [d for d in decisions if d.window_end > undone[0].window_end and d.action == "relax"]
    assert all(d.limit_qps < ceiling for d in later)
    assert value_changes(decisions) <= L.surge_max_changes
    after = trace[undone[0].window_end.minute + 3:]
    assert after and not any(busy for _, busy in after)


def test_the_probe_budget_leaves_room_for_a_step_back():
    """With one change already spent, a raise (two with its step-back) would exceed a budget of 2: no probe."""
    state = ResourceState("topic", "t", limit_qps=200.0, target_qps=200.0, limited_since=end(0),
                             last_change_end=end(0), last_decision_end=end(0), last_candidate_end=end(0),
                             cause_changes=1, baseline_tps=100.0)
    capped = [Observation(end(i), 199.0, 15_000, True, None, {"b": 400.0}) for i in range(1, 8)]
    decisions, _ = fold([], horizon=7, state=state, obs=capped, cfg=LimitsConfig(surge_max_changes=2))
    assert [d.action for d in decisions if d.action != "set"] == []
    decisions, _ = fold([], horizon=7, state=state, obs=capped, cfg=LimitsConfig(surge_max_changes=3))
    assert [d.action for d in decisions][:1] == ["relax"]


def test_a_surge_limit_is_lifted_once_the_demand_is_back_near_its_baseline():
    state = ResourceState("topic", "t", limit_qps=240.0, target_qps=240.0, limited_since=end(0),
                             last_change_end=end(0), last_decision_end=end(0), last_candidate_end=end(0),
                             baseline_tps=120.0)
    near = [Observation(end(i), 130.0, 0, True, None, {"b": 430.0}) for i in range(1, 5)]
    decisions, after = fold([], horizon=4, state=state, obs=near)
    assert [d.action for d in decisions] == ["lift"] and after.limit_qps is None
    # a probed limit whose visible demand still fires the rule (600 >= 4 x 120) is held
    probed = ResourceState(**{**state.__dict__, "limit_qps": 700.0})
    visible = [Observation(end(i), 600.0, 0, True, None, {"b": 900.0}) for i in range(1, 5)]
    decisions, after = fold([], horizon=4, state=probed, obs=visible)
    assert [d.action for d in decisions] == [] and after.limit_qps == 700.0


def test_the_fold_remembers_what_a_busy_carrier_wrote():
    obs = [Observation(end(1), 700.0, 0, False, None, {"b": 905.0, "c": 300.0}, ("b",))]
    _, state, _ = fold_resource(ResourceState("topic", "t"), [cand(1, 240.0, baseline_tps=120.0)], end(1),
                                   P(L), observations=obs)
    assert state.busy_load == {"b": 905.0} and state.last_distress_end == end(1)


def _probed(**kw):
    """A surge limit of 400 msg/s (target 240) at its cap on healthy brokers since window 0."""
    base = dict(limit_qps=400.0, target_qps=240.0, limited_since=end(0), last_change_end=end(0),
                last_decision_end=end(0), last_candidate_end=end(0), baseline_tps=120.0, broker_shares={"b": 1.0})
    return ResourceState("topic", "t", **{**base, **kw})


def test_a_probe_never_raises_a_carrier_above_what_it_wrote_when_it_was_last_busy():
    """broker b wrote 900 msg/s when it was last busy and writes 500 now: x1.5 (600) would add 200 and put it at
    700; the probe stops at ``surge_burst_share`` 0.7 x 900 = 630 msg/s of writes (the breaker's burst, below
    ``probe_headroom_share`` 0.9), i.e. 530 msg/s."""
    capped = [Observation(end(i), 399.0, 30_000, True, None, {"b": 500.0}) for i in range(1, 4)]
    decisions, state = fold([], horizon=3, state=_probed(busy_load={"b": 900.0}), obs=capped)
    assert [(d.action, round(d.limit_qps, 1)) for d in decisions] == [("relax", 530.0)]
    assert "raised to 530.0 msg/s (b writes 500.0 msg/s and was busy at 900.0)" in decisions[0].reason
    assert state.probe_from_qps == 400.0
    full = [Observation(end(i), 399.0, 30_000, True, None, {"b": 640.0}) for i in range(1, 4)]
    decisions, _ = fold([], horizon=3, state=_probed(busy_load={"b": 900.0}), obs=full)
    assert [d.action for d in decisions] == []   # no room left: no probe


def test_a_probe_leaves_its_busy_carrier_room_for_the_breaker_s_burst_sweep_cases_6_and_135():
    """Sweep case 6: search-sync held at 133.1 msg/s on broker-b (busy at 214.4 msg/s of writes, 142.5 now) was
    probed to 183.6 (0.9 x 214.4 of predicted writes); broker-b went busy writing 155-167 msg/s (capacity 231.6):
    the limiter rejecting most of the demand opens its breaker, and each time it closes a second of tokens reaches
    the 200 ms send queue at once, so the bystanders lost 5.56 % of their sends until the undo. Case 135: probes to
    641.1 on broker-b (busy at 922.4, writing 550) made it busy at 696-710 of 946. A probe keeps the carrier's
    writes at ``surge_burst_share`` (0.7) of its busy writes: none in case 6 (150.1 leaves 7.6 msg/s, under the
    10 % hysteresis), 523.1 instead of 641.1 in case 135."""
    six = ResourceState("topic", "search-sync", limit_qps=133.1, target_qps=133.1, limited_since=end(0),
                        last_change_end=end(0), last_decision_end=end(0), last_candidate_end=end(0),
                        baseline_tps=67.0, broker_shares={"broker-b": 1.0}, busy_load={"broker-b": 214.4})
    capped = [Observation(end(i), 133.1, 1848, True, None, {"broker-b": 142.5}) for i in range(1, 5)]
    decisions, _ = fold([], horizon=4, state=six, obs=capped)
    assert [d.action for d in decisions if d.action != "set"] == []
    one35 = ResourceState("topic", "profile-sync", limit_qps=427.4, target_qps=427.4, limited_since=end(0),
                          last_change_end=end(0), last_decision_end=end(0), last_candidate_end=end(0),
                          baseline_tps=213.7, broker_shares={"broker-b": 1.0}, busy_load={"broker-b": 922.4})
    capped = [Observation(end(i), 427.4, 199, True, None, {"broker-b": 550.0}) for i in range(1, 5)]
    decisions, _ = fold([], horizon=4, state=one35, obs=capped)
    assert [(d.action, round(d.limit_qps, 1)) for d in decisions] == [("relax", 523.1)]   # 427.4 + 0.7 x 922.4 - 550


def test_a_surge_is_not_probed_on_a_window_without_its_busy_carrier_s_writes_sweep_case_190():
    """Sweep case 190: video-sync held at 252.6 msg/s on broker-a (busy at 549.4 msg/s, writing 450 since: no room
    at 0.7 of it) was probed x1.5 to 378.9 on a window that showed none of its puts (0.0 of 252.6 admitted, the
    limiter's view rejecting) and so no writes of broker-a to bound it: broker-a went busy, bystanders 1 %+. A
    carrier that was busy and shows no writes in the window stops the probe."""
    held = ResourceState("topic", "video-sync", limit_qps=252.6, target_qps=252.6, limited_since=end(0),
                         last_change_end=end(0), last_decision_end=end(0), last_candidate_end=end(0),
                         baseline_tps=98.0, broker_shares={"broker-a": 1.0}, busy_load={"broker-a": 549.4})
    blind = [Observation(end(i), 0.0, 0, True, viewed=True) for i in range(1, 5)]
    decisions, _ = fold([], horizon=4, state=held, obs=blind)
    assert [d.action for d in decisions if d.action != "set"] == []
    roomy = [Observation(end(i), 252.6, 199, True, None, {"broker-a": 300.0}) for i in range(1, 5)]
    decisions, _ = fold([], horizon=4, state=held, obs=roomy)
    assert [d.action for d in decisions][:1] == ["relax"]   # its writes shown, with room: probed


def _first_surge_limit(broker_tps, busy_load, baseline, target=None, busy_normal=None):
    """The first enforced limit of a surge on busy carriers (target ``surge_headroom`` x ``baseline``)."""
    c = Candidate(end(1), target or 2.0 * baseline, "surge on a busy broker", lift_at_qps=5_000.0,
                  observed_tps=sum(broker_tps.values()), baseline_tps=baseline, broker_tps=broker_tps,
                  busy_load=busy_load, busy_normal=busy_normal or {})
    decisions, state = fold([c], horizon=1, resource_type="topic")
    return decisions[0], state


def test_a_surge_s_first_limit_leaves_its_busy_carrier_room_for_the_breaker_s_burst_sweep_cases_66_and_186():
    """Sweep case 186: cart-audit limited at 2.0x its baseline, 544.9 msg/s, on broker-b that wrote 757.7 msg/s
    busy (25.3 of them other topics'): broker-b stayed busy writing 552 msg/s of 754.5 (the breaker's burst: a
    second of 544.9 tokens reaches the 200 ms send queue at once each time it closes), and the squeeze to 1.5x came
    only on the first window wholly under the limit: bystanders 1.20 % of before. Case 66: coupon-audit at 2.0x,
    307.6 msg/s over broker-c and broker-d (200.8 msg/s busy each, 9.0 of broker-d's other topics'): 4.80 %. The
    first limit keeps each busy carrier's other writes plus its share at most ``surge_burst_share`` (0.7) of its
    busy writes: 505.1 and 269.3 msg/s."""
    first, state = _first_surge_limit({"broker-b": 732.4}, {"broker-b": 757.7}, 272.45)
    assert round(first.limit_qps, 1) == round(state.target_qps, 1) == 505.1   # 0.7 x 757.7 - 25.3
    assert "bounded to 505.1 msg/s by the breaker's burst: broker-b wrote 757.7 msg/s busy" in first.reason
    first, _ = _first_surge_limit({"broker-c": 200.66, "broker-d": 191.84}, {"broker-c": 200.8, "broker-d": 200.8},
                                  153.8)
    assert round(first.limit_qps, 1) == 269.3   # broker-d: (0.7 x 200.8 - 8.96) / its share 0.4888
    assert "broker-d wrote 200.8 msg/s busy, 9.0 of them other topics'" in first.reason


def test_a_surge_s_burst_bound_stops_at_the_squeeze_headroom_and_needs_a_busy_carrier():
    """Case 135's coupon-changed (214.5 msg/s on broker-b, 734.6 of its 949.1 busy writes other topics'): no room
    is left, the first limit is 1.5x its baseline (``surge_squeeze_headroom``, the squeeze's floor), not below.
    Case 6's search-sync (226.8 of broker-b's 232.6): 0.7 x 232.6 leaves 157.0, more than 2.0x its baseline: the
    first limit takes that room (``SurgeLimit.fills_room``: a surge is held to what its busy carrier can write, not
    to twice its baseline); a surge without a busy carrier's writes gets the target, 2.0x."""
    first, _ = _first_surge_limit({"broker-b": 214.5}, {"broker-b": 949.1}, 10.5)
    assert round(first.limit_qps, 2) == 15.75 and "(not below 1.5x the baseline)" in first.reason
    first, _ = _first_surge_limit({"broker-b": 226.8}, {"broker-b": 232.6}, 66.55)
    assert round(first.limit_qps, 1) == 157.0 and "bounded to 157.0 msg/s by the breaker's burst" in first.reason
    first, _ = _first_surge_limit({"broker-b": 226.8}, {}, 66.55)
    assert round(first.limit_qps, 1) == 133.1


def test_a_surge_s_first_limit_counts_its_carriers_other_senders_at_their_normal_sweep_cases_809_and_98():
    """Sweep case 809 (``python -m pipelines.sim.sweep --case 809``): news-feed surging for good over broker-a and
    broker-b (1.15x and 1.18x headroom). The burst bound read their other topics at what they kept while crowded
    (63.4 and 22.2 msg/s) and the squeeze floor held 1.5x the 251.1 msg/s baseline, 376.6 msg/s: at it broker-a,
    its other topics back at their normal (269.0 msg/s written before, less the topic's 129.9), writes 333.9 msg/s,
    over what it wrote busy (319.4), and the bystanders lost 9.65 % of their sends for good. Counted at their
    normal, broker-a leaves 163.3 msg/s: the floor yields, bystanders 0.00 %. Case 98: search-updated, 1.35 msg/s
    before its surge, on broker-a writing 138.6 msg/s busy against 99.5 normal (pulsed traffic): at the floor it
    adds 0.9 msg/s to a broker far under what it wrote busy, so the floor holds (2.0 msg/s: under 1.0 msg/s, the
    room left at 0.7 of those writes, its normal traffic of 1.7-1.8 msg/s after the fix stayed at the cap and was
    never lifted)."""
    first, state = _first_surge_limit({"broker-a": 256.0, "broker-b": 238.9}, {"broker-a": 319.4, "broker-b": 261.1},
                                      251.1, busy_normal={"broker-a": 269.0, "broker-b": 220.4})
    # the room at 0.7 of its busy writes, (0.7 x 319.4 - 139.1) / 0.5173 = 163.3, is under its baseline: it yields no
    # lower than what fits under 0.79 of them, (0.79 x 319.4 - 139.1) / 0.5173 = 218.9
    assert round(first.limit_qps, 1) == round(state.target_qps, 1) == 218.9
    assert ("broker-a wrote 319.4 msg/s busy, 63.4 of them other topics' (139.1 at their normal)" in first.reason
            and "at 376.6 msg/s broker-a would write 333.9, over 0.79 of what it wrote busy" in first.reason)
    first, _ = _first_surge_limit({"broker-a": 256.0, "broker-b": 238.9}, {"broker-a": 319.4, "broker-b": 261.1},
                                  251.1)   # no normal known: the floor stands
    assert round(first.limit_qps, 1) == 376.6 and "(not below 1.5x the baseline)" in first.reason
    first, _ = _first_surge_limit({"broker-a": 62.8, "broker-b": 76.3}, {"broker-a": 138.6, "broker-b": 91.7}, 1.35,
                                  busy_normal={"broker-a": 99.5, "broker-b": 22.0})
    assert round(first.limit_qps, 3) == 2.025 and "(not below 1.5x the baseline)" in first.reason
    # no room left at 0.7 where the floor yields: what fits under 0.79 beside its other senders' normal,
    # 0.79 x 210 - (255 - 100) = 10.9 msg/s, and the text names the yield, not the floor
    first, _ = _first_surge_limit({"b": 200.0}, {"b": 210.0}, 100.0, busy_normal={"b": 255.0})
    assert round(first.limit_qps, 1) == 10.9 and "over 0.79 of what it wrote busy" in first.reason
    first, _ = _first_surge_limit({"b": 200.0}, {"b": 210.0}, 100.0, busy_normal={"b": 265.0})
    assert first.limit_qps == L.min_limit_qps   # 0.79 x 210 - 165 < 1: min_limit_qps
    assert "not below" not in first.reason


def test_a_surge_s_floor_yields_where_its_carrier_would_write_where_bursts_kept_carriers_busy_sweep_case_307():
    """Sweep case 307 (``python -m pipelines.sim.sweep --case 307``): a storm on broker-a and a persisting surge of
    a topic of 154.9 msg/s written before, all on broker-d (305.9 msg/s written busy, 189.9 normal). At the 1.5x
    floor, 232.4 msg/s, broker-d writes 267.4 msg/s with its other topics back at their normal: 0.874 of its busy
    writes, under the 0.9 at which the floor used to yield but above the 0.79 at which the breaker's bursts were seen
    to keep a carrier busy; the bystanders lost 1.91 % of their sends for good. The floor now yields at
    ``surge_floor_yield_share`` (0.79): 0.7 x 305.9 - 35.0 = 179.1 msg/s, bystanders 0.00 %. Case 135: coupon-changed
    (10.55 msg/s before) and a second surge crowd broker-b (949.9 msg/s busy, 737.6 of them other topics', 319.1
    normal); at its 15.8 msg/s floor broker-b writes 0.34 of that with its other senders at their normal, 0.79 with
    them at what they kept while the other surge crowded them: the yield reads them at their normal (the other
    surge is limited too), and the floor holds (yielded to 1.0 msg/s, its normal traffic stayed at the cap after its
    fix and was never lifted). Case 430: a topic of 2.45 msg/s on a broker whose other senders alone write 0.796 of
    its busy writes at their normal: no limit of the topic brings that broker under 0.79, and a yield to 1.0 msg/s
    held its normal traffic at the cap after its fix; the floor holds."""
    first, state = _first_surge_limit({"broker-d": 291.9}, {"broker-d": 305.9}, 154.9,
                                      busy_normal={"broker-d": 189.9})
    assert round(first.limit_qps, 1) == round(state.target_qps, 1) == 179.1   # 0.7 x 305.9 - (189.9 - 154.9)
    assert "at 232.4 msg/s broker-d would write 267.4, over 0.79 of what it wrote busy" in first.reason
    first, _ = _first_surge_limit({"broker-b": 212.3}, {"broker-b": 949.9}, 10.55, busy_normal={"broker-b": 319.1})
    assert round(first.limit_qps, 2) == 15.83 and "(not below 1.5x the baseline)" in first.reason
    # case 430: pugc-content (2.45 msg/s before) over three brokers; broker-a's other senders alone write 248.4 msg/s
    # at their normal, 0.796 of its busy 311.9: no limit of the topic brings it under 0.79, so the floor holds
    first, _ = _first_surge_limit({"broker-a": 61.8, "broker-b": 59.0, "broker-c": 1.3},
                                  {"broker-a": 311.9, "broker-b": 200.6}, 2.45,
                                  busy_normal={"broker-a": 249.6, "broker-b": 146.2})
    assert round(first.limit_qps, 3) == 3.675 and "(not below 1.5x the baseline)" in first.reason


def _first_storm_limit(admitted, observed, busy_load, busy_normal, consume):
    """The first enforced limit of a storm on busy carriers (target 10 % of ``consume``, critical: at once)."""
    c = Candidate(end(1), 0.1 * consume, "storm on a busy broker", observed_tps=observed, baseline_tps=consume,
                  broker_tps=admitted, busy_load=busy_load, busy_normal=busy_normal)
    decisions, state = fold([c], horizon=1)
    return decisions[0], state


def test_a_storm_s_first_limit_fits_the_room_its_busy_carrier_leaves_sweep_cases_25_and_131():
    """Sweep case 25: get-pugc-to-ai-consumer's storm (3,548.8 msg/s read through broker-a, 346.3 of it admitted)
    on broker-a of 1.10x headroom (949.0 msg/s written busy, 843.0 normal) was limited to 10 % of its 700.5 msg/s
    consume rate, 70.1 msg/s: broker-a stayed busy (a send-back costs it more than one write) and the bystanders
    lost 1.79 % of their sends after containment until a squeeze. Its usual senders kept about 10 % of their 843.0
    (the group's share accepted), so the storms wrote about 866.7; the room beyond the normal up to
    ``storm_room_share`` (0.95) of the busy writes, 58.6, takes 6.8 % of what it admitted: 23.4 msg/s (bystanders
    0.04 %; 42.4 msg/s and 0.07 % with the whole busy writes as the room's top, until case 297; at 0.9, 4.4 msg/s,
    the fixed group's 16 msg/s of legitimate retries stayed over it and it was never lifted). Case 131: seven storms
    on three brokers of 1.26x headroom; audit-coupon-consumer (18.9 of 104.0 msg/s admitted on broker-c, 307.5
    written busy, 241.6 normal) at 3.6 msg/s instead of its 16.0 target (bystanders 2.33 % → 0.00 %)."""
    first, state = _first_storm_limit({"broker-a": 346.3}, 3548.8, {"broker-a": 949.0}, {"broker-a": 843.0}, 700.5)
    assert round(first.limit_qps, 1) == round(state.target_qps, 1) == 23.4   # 346.3 x 58.55 / (949.0 - 0.0976 x 843)
    assert ("bounded to 23.4 msg/s by the room its busy carrier leaves: broker-a wrote 949.0 msg/s busy against "
            "843.0 normal, about 866.7 of them the storms' at 10% accepted; the storms there fit in 0.95 of what it "
            "wrote busy beyond its normal") in first.reason
    first, _ = _first_storm_limit({"broker-c": 18.9}, 104.0, {"broker-c": 307.5}, {"broker-c": 241.6}, 160.2)
    assert round(first.limit_qps, 2) == 3.62   # 18.9 x 50.525 / (307.5 - 0.1817 x 241.6)


def test_a_storm_s_first_limit_leaves_its_busy_carrier_a_margin_below_its_busy_writes_sweep_case_297():
    """Sweep case 297 (``python -m pipelines.sim.sweep --case 297``): get-pugc-to-ai-consumer's persisting storm,
    1,157.6 msg/s read through broker-a (1.37x headroom: 977.6 msg/s written busy, 706.6 normal), 176.5 admitted.
    Sized to fill broker-a's whole busy writes beside its normal (55.0 msg/s), the storm kept it busy: a limiter
    rejecting most of a demand bursts as its breaker closes, and its bystanders lost 1.63 % of their sends after
    containment until a squeeze. Sized to ``storm_room_share`` (0.95) of them, 45.1 msg/s: 0.48 % (constant first
    limits of 1-45 msg/s pass, 0.47 % at 45: ``bench/first_limit_frontier.py --case 297 --kind storm``)."""
    first, _ = _first_storm_limit({"broker-a": 167.7, "broker-c": 8.8}, 1157.6, {"broker-a": 977.6},
                                  {"broker-a": 706.6}, 624.05)
    assert round(first.limit_qps, 1) == 45.1   # 176.5 x (0.95 x 977.6 - 706.6) / (977.6 - 0.1525 x 706.6)
    assert "the storms there fit in 0.95 of what it wrote busy beyond its normal" in first.reason


def test_a_storm_s_room_binds_only_on_a_busy_carrier_without_room():
    """A broker of 3x headroom (900 msg/s busy, 300 normal) leaves a storm admitted at 200 of 400 msg/s 160 msg/s,
    more than its 40 msg/s target: the target stands; so does a storm without a busy carrier's normal. A busy
    broker writing no more than its normal leaves no room: ``min_limit_qps``."""
    first, _ = _first_storm_limit({"b": 200.0}, 400.0, {"b": 900.0}, {"b": 300.0}, 400.0)
    assert round(first.limit_qps, 1) == 40.0 and "bounded" not in first.reason
    first, _ = _first_storm_limit({"b": 200.0}, 400.0, {"b": 900.0}, {}, 400.0)
    assert round(first.limit_qps, 1) == 40.0
    first, _ = _first_storm_limit({"b": 200.0}, 400.0, {"b": 500.0}, {"b": 520.0}, 400.0)
    assert first.limit_qps == L.min_limit_qps and "bounded to 1.0 msg/s" in first.reason


def test_a_ceiling_holds_probes_below_it_until_its_interval_is_over():
    capped = [Observation(end(i), 399.0, 30_000, True, None, {"b": 500.0}) for i in range(1, 4)]
    held = _probed(probe_ceiling_qps=500.0, probe_hold_until=end(10), probe_backoff=1)
    decisions, _ = fold([], horizon=3, state=held, obs=capped)
    assert [(d.action, round(d.limit_qps, 1)) for d in decisions] == [("relax", 450.0)]   # below 500 x 0.9
    over = _probed(probe_ceiling_qps=500.0, probe_hold_until=end(2), probe_backoff=1)
    decisions, _ = fold([], horizon=3, state=over, obs=capped)
    assert [(d.action, round(d.limit_qps, 1)) for d in decisions] == [("relax", 600.0)]   # the interval is over


def test_a_limit_held_through_clear_windows_is_refreshed_so_that_its_record_never_expires_at_the_brokers():
    """Sweep cases 359 and 165 (``python -m pipelines.sim.sweep --case 359``): an intermittent storm limited at
    window 1, bound to window 5, then quiet; the lift is vetoed because the storm is back in the fast path's open
    windows. Only a candidate or a bound window refreshed a limit, so the record issued for window 1 (ttl_seconds
    600 after its decision) expired at the very final trigger that refreshed it once the storm's window was final,
    and the propagation delay left the storm unlimited for 4-5 s mid-episode (2 value changes, 1.7 % of the
    bystanders' rejections back). A limit the fold holds is now re-issued every refresh_seconds (5 windows)
    through clear windows too: at window 6 here; a recurrence's longer hold (12 clear windows) every 5 until its
    lift."""
    storm = lambda i: seen(i, 39.0, 33_600)  # noqa: E731 (at the cap, rejecting)
    quiet = lambda i: seen(i, 0.3)  # noqa: E731

    def one_window_per_batch(state, obs, until, opened=None, params=P(L)):
        decisions = []
        for i in range(1, until + 1):
            done, state, _ = fold_resource(state, [cand(1, 40.0)] if i == 1 else [], end(i), params,
                                              observations=[o for o in obs if o.window_end == end(i)],
                                              open_evidence=(opened or {}).get(i, ()))
            decisions += done
        return [(d.action, d.window_end, d.version) for d in decisions], decisions

    vetoed = {8: [Observation(end(9), 37.0, 36_000, True, 150.0)]}  # the storm back in an open window
    got, decisions = one_window_per_batch(ResourceState("group", "g"),
                                          [storm(i) for i in range(2, 6)] + [quiet(i) for i in range(6, 9)], 8,
                                          vetoed)
    assert got == [("set", end(1), 1), ("set", end(6), 2)]
    assert decisions[1].reason == ("refresh (held: RUNAWAY_RETRY silent since 2022-02-08T07:05:00Z, lifted after 3 "
                                   "clear windows; in force until it is lifted)")
    damped = ResourceState("group", "g", recurrences=2)  # recovery_needed: 12 clear windows (damping configured)
    got, _ = one_window_per_batch(damped, [storm(i) for i in range(2, 6)] + [quiet(i) for i in range(6, 20)], 19,
                                  params=P(LimitsConfig(max_recovery_windows=30)))
    assert got == [("set", end(1), 1), ("set", end(6), 2), ("set", end(11), 3), ("set", end(16), 4),
                   ("lift", end(17), 5)]


# --- at the cap, the demand hidden: never lifted blind (a limit at its cap shows the cap, not the demand) ----------

def group_loop(minutes, demand, consume=400.0, limit=40.0, lag=3, fallback=True, cfg=L, busy_above=None):
    """A consumer group limited to ``limit`` msg/s of retry traffic (10 % of the ``consume`` msg/s it consumes)
    offering ``demand(w)`` msg/s of send-backs in window ``w``. Its limiter admits at most the limit in force; no
    rejection is logged (a refused send-back is answered to the consumer). A refused send-back falls back to a plain
    send into the same limiter (``fallback``): of what is admitted, the share that came as fallback sends grows with
    the refused share (none refused, none). The final path folds window ``w - lag`` 30 s after the end of window
    ``w``, the windows after it being the fast path's open windows (complete by census); a decision made then is in
    force 10 s later (its propagation): for the last 20 s of window ``w + 1``, and from window ``w + 2``. Returns
    (decisions, per window the limit in force or None). ``busy_above``: the carrier ``b`` is busy (``BROKER_BUSY``)
    in a window where the group's admitted traffic is above it (msg/s: what its other load leaves)."""
    state = ResourceState("group", "g", limit_qps=limit, target_qps=limit, limited_since=end(0),
                             last_change_end=end(0), last_decision_end=end(0), last_candidate_end=end(0),
                             baseline_tps=consume, broker_shares={"b": 1.0})
    in_force, windows, decisions, trace, tail = {1: limit}, {}, [], [], {}
    for w in range(1, minutes + 1):
        cap = in_force[max(k for k in in_force if k <= w)]
        offered = demand(w)
        admitted = offered if cap is None else min(offered, cap)
        if w in tail:  # the last third of the window under the decision made in it
            late = offered if tail[w] is None else min(offered, tail[w])
            admitted = (2.0 * admitted + late) / 3.0
        refused = 1.0 - admitted / offered if offered > 0 else 0.0
        sent = admitted / (1.0 + 1.6 * refused) if fallback else admitted
        hot = ("b",) if busy_above is not None and admitted > busy_above else ()
        windows[w] = Observation(end(w), admitted, 0, not hot, consume, {"b": 500.0}, hot, sendback_tps=sent)
        trace.append(cap)
        if w - lag >= 1 and state.limit_qps is not None:
            made, state, _ = fold_resource(state, [], end(w - lag), P(cfg), observations=[windows[w - lag]],
                                              open_evidence=[windows[k] for k in range(w - lag + 1, w + 1)],
                                              now=end(w) + dt.timedelta(seconds=30))
            decisions += made
            if made:
                in_force[w + 2] = tail[w + 1] = None if made[-1].action == "lift" else made[-1].limit_qps
    return decisions, trace


def test_the_persisting_storm_at_exactly_its_limit_with_nothing_logged_is_never_lifted_while_it_lasts():
    """Issue 48's first run: a group consuming 400 msg/s sends back 600 for 16 minutes under a 40 msg/s limit; the
    brokers admit exactly 40 msg/s of it and no rejection reaches a log. At 3f6d0c6 three such windows lifted it
    mid-storm ("RUNAWAY_RETRY did not fire on the visible demand"). Its client's fallback sends show the refused
    send-backs (more than half of what is admitted): every window is limit-bound, the limit never changes while the
    storm lasts, and the fix lifts it."""
    decisions, trace = group_loop(30, lambda w: 600.0 if w <= 16 else 2.0)
    during = [d for d in decisions if d.action != "lift"]
    assert during and all(d.action == "set" and d.limit_qps == 40.0 and d.reason.startswith(
        "refresh (anomaly persists, limit-bound: 40.0 of 40.0 msg/s, rejecting (fallback sends") for d in during)
    assert all(cap == 40.0 for cap in trace[:18])
    lift, = [d for d in decisions if d.action == "lift"]
    # proven by four clear open windows after the fix (07:17-07:20: one more than a final lift needs), decided at
    # the end of window 20
    assert "the open window ending 07:20, complete by census" in lift.reason and trace.index(None) == 21


def test_a_storm_whose_client_does_not_fall_back_is_probed_and_never_lifted_while_it_lasts():
    """The same storm from a consumer client that only re-consumes a refused message (no fallback send): at its cap
    nothing shows the refused demand, so the window is ``capped``, never clear. The limit is probed at once
    (x1.5 for a window); the admitted rate follows the raise and the probe is undone, then tried again only after
    a doubling pause (3, 6, 12 windows). No lift while the storm lasts; the fix lifts it after a probe shows the
    demand below the raised cap."""
    decisions, trace = group_loop(40, lambda w: 600.0 if w <= 30 else 2.0, fallback=False)
    during = [d for d in decisions if d.window_end <= end(30)]
    assert not any(d.action == "lift" for d in during)
    probes = [d for d in during if d.action == "relax"]
    undone = [d for d in during if d.reason.startswith("probe undone")]
    assert [d.limit_qps for d in probes] == [60.0] * len(probes) and len(undone) == len(probes) >= 2
    assert [u.limit_qps for u in undone] == [40.0] * len(undone)
    # the pause, in the windows each decision read (the probe's newest window at the cap, the window its undo read)
    read = lambda d: int(re.search(r"window ending 07:(\d\d)", d.reason).group(1))  # noqa: E731
    gaps = [read(b) - read(a) for a, b in zip(undone, probes[1:])]
    assert gaps == sorted(gaps) and gaps[0] >= 6          # the pause doubles
    assert "no probe reaches 60.0 msg/s for 6 min" in undone[0].reason
    lift, = [d for d in decisions if d.action == "lift"]
    assert lift.window_end > end(30)


def test_a_storm_limit_far_under_its_consume_rate_bound_by_fallback_sends_is_not_probed_sweep_case_125():
    """Issue 49's sweep case 125 (cold start: the storm under way when the governor starts on a new lake): the limit
    is 10 % of the consume rate the storm's own windows showed (118.7 msg/s: 11.9), and under it the group consumes
    513 msg/s again. At the cap its fallback sends read every send-back refused (``REFUSED_SHARE_MAX``): a demand of
    at least 20x the cap, 238 msg/s, ratio 0.46, under the rule only because the reading stops at 20x. At e7062aa
    the window was ``capped`` and probed x1.5 (17.8 msg/s), then the probe undone: two more changes of a storm's
    limit (the sweep's check allows one). A probe cannot show a demand below its raise there, so none starts: the
    limit holds unchanged while the storm lasts, and the fix lifts it."""
    decisions, trace = group_loop(24, lambda w: 1300.0 if w <= 14 else 2.0, consume=513.0, limit=11.9)
    assert not any(d.action == "relax" for d in decisions)
    assert all(d.limit_qps == 11.9 for d in decisions if d.action != "lift")
    assert all(cap == 11.9 for cap in trace[:16])
    lift, = [d for d in decisions if d.action == "lift"]
    assert lift.window_end > end(14)


def test_a_storm_limit_its_broker_cannot_take_is_squeezed_once_and_held():
    """Issue 49's sweep case 126: a storm limited to 10 % of a 590 msg/s consume rate on a broker with a quarter of
    headroom; at its target the storm's writes keep the broker busy and the bystanders lose 3.6 % of what they lost
    before the limit. Here the broker can take 25 msg/s of the group's retries: a complete open window
    wholly under the 40 msg/s limit after the first one, at the cap with the carrier busy, squeezes it (limit and
    target) by ``max_cut_pct`` to 20 msg/s; the broker is then healthy and the limit holds, unchanged, until the fix lifts it. A broker never busy
    is never squeezed."""
    decisions, trace = group_loop(24, lambda w: 600.0 if w <= 14 else 2.0, busy_above=25.0)
    squeeze, = [d for d in decisions if d.reason.startswith("squeeze")]
    assert (squeeze.limit_qps, squeeze.previous_qps) == (20.0, 40.0)
    # the first complete open window that qualifies, in window order: 07:03, the second wholly under the limit (the
    # first, 07:02, drains the send queue the window before filled: no evidence)
    assert "b busy under the limit in the open window ending 07:03, complete by census (limit-bound" in squeeze.reason
    assert trace[:6] == [40.0] * 5 + [20.0]             # decided at the end of window 4, in force from window 6
    held = [d for d in decisions if d.window_end > squeeze.window_end and d.window_end <= end(14)]
    assert all(d.limit_qps == 20.0 and d.reason.startswith("refresh") for d in held)
    assert all(cap == 20.0 for cap in trace[5:15])
    assert [d.action for d in decisions if d.action == "lift"] == ["lift"] and trace[-1] is None
    calm, calm_trace = group_loop(24, lambda w: 600.0 if w <= 14 else 2.0)
    assert not any(d.reason.startswith("squeeze") for d in calm) and all(c == 40.0 for c in calm_trace[:15])


def test_a_fixed_consumer_at_9_percent_of_its_consume_rate_is_lifted_within_8_minutes_of_the_fix():
    """Fixed after window 8, it keeps retrying 9 % of the 400 msg/s it consumes: 36 msg/s against a 40 msg/s limit
    (90 % of the cap, nothing refused): ``capped``, its demand hidden. The first complete open window at the cap
    starts a probe (x1.5 to 60 msg/s); the windows under it are clear (36 of 60), and three windows after the last
    capped window lift it, the one the probe was decided in (still at 40) not counted as keeping it once those under
    the raise are clear (sweep case 102): decided at the end of window 12, in force 4-5 minutes after the fix."""
    decisions, trace = group_loop(24, lambda w: 600.0 if w <= 8 else 36.0)
    probe, = [d for d in decisions if d.action == "relax"]
    assert probe.limit_qps == 60.0 and "the open window ending 07:09, complete by census: at the cap, the demand " \
                                      "hidden: 36.0 of 40.0 msg/s" in probe.reason
    lift, = [d for d in decisions if d.action == "lift"]
    decided = trace.index(None) - 1      # the loop step (end of window) whose decision lifted it
    assert decided <= 8 + 7, "lifted more than 8 minutes after the fix"
    assert "raised from 40.0 msg/s to see it" in lift.reason and "under the probe" in lift.reason
    assert not any(d.action == "lift" for d in decisions if d.window_end < end(8))


def test_a_capped_window_never_counts_towards_a_lift():
    """A retry limit at its cap with nothing showing more demand (39 of 40 msg/s): capped windows keep the limit,
    and the lift needs three clear windows after the last of them, not after the cause was last seen."""
    state = ResourceState("group", "g", limit_qps=40.0, target_qps=40.0, limited_since=end(0),
                             last_change_end=end(0), last_decision_end=end(0), last_candidate_end=end(0),
                             baseline_tps=400.0, probe_hold_until=end(30))    # no probe: judged as it is
    capped = [Observation(end(i), 39.0, 0, True, 400.0, sendback_tps=39.0) for i in range(1, 7)]
    clear = [Observation(end(i), 20.0, 0, True, 400.0, sendback_tps=20.0) for i in range(7, 12)]
    decisions, after, evidence = fold_resource(state, [], end(11), P(L), observations=capped + clear)
    assert [e.status for e in evidence[:6]] == [Status.CAPPED] * 6 and evidence[6].status == Status.CLEAR
    assert [(d.action, d.window_end) for d in decisions if d.action == "lift"] == [("lift", end(9))]
    assert after.limit_qps is None


def test_the_windows_before_a_raise_are_judged_against_the_level_before_it():
    """A probe decided at 07:03:30 raises 40 to 60 msg/s from the window starting 07:04 (its first whole window):
    the window ending 07:04 ran at 40 (36 of 40: capped), the one ending 07:05 at 60 (36 of 60: clear)."""
    state = ResourceState("group", "g", limit_qps=60.0, target_qps=40.0, probe_from_qps=40.0,
                             probe_effective_end=end(5), baseline_tps=400.0)
    assert limit_in_force(state, end(4)) == 40.0 and limit_in_force(state, end(5)) == 60.0
    policy = policy_for("group", P(L))
    seen_ = lambda i: Observation(end(i), 36.0, 0, True, 400.0, sendback_tps=36.0)  # noqa: E731
    assert policy.judge(seen_(4), state)[0] == Status.CAPPED
    assert policy.judge(seen_(5), state)[0] == Status.CLEAR
    assert effective_end(dt.datetime(2022, 2, 8, 7, 3, 30), P().window) == end(5)
    assert effective_end(end(4), P().window) == end(5)  # decided at a window's start: that window is wholly under it


def test_fallback_sends_reveal_the_refused_send_backs():
    """40 msg/s admitted, 16 of them send-backs and 24 the fallback sends of refused ones (more than refused share
    0.95 reads): at least 40 / 0.05 = 800 msg/s of retry demand, ratio 2.0 against 400 consumed: bound. A few
    fallback sends beside the send-backs (2 beside 38: 5 % refused) add a little: 42.1 msg/s, ratio 0.11, capped."""
    policy = policy_for("group", P(L))
    state = ResourceState("group", "g", limit_qps=40.0, target_qps=40.0, baseline_tps=400.0)
    storm = Observation(end(1), 40.0, 0, True, 400.0, sendback_tps=16.0)
    assert policy.visible(storm)[0] == pytest.approx(800.0)
    status, detail = policy.judge(storm, state)
    assert status == Status.BOUND and "fallback sends 24.0 msg/s beside 16.0 msg/s of send-backs" in detail
    few = Observation(end(1), 40.0, 0, True, 400.0, sendback_tps=38.0)
    assert policy.visible(few)[0] == pytest.approx(40.0 / (1 - 2.0 / 38.0))
    assert policy.judge(few, state)[0] == Status.CAPPED
    plain = Observation(end(1), 40.0, 0, True, 400.0, sendback_tps=40.0)
    assert policy.visible(plain) == (40.0, "")


@pytest.mark.parametrize("demand, baseline", [(1500.0, 120.0), (700.0, 80.0)])
def test_a_surge_at_its_cap_with_throttled_rejection_logs_is_never_lifted_while_it_lasts(demand, baseline):
    """Issue 48's second run: promo-clicks 120 -> 1,500 msg/s and promo-views 80 -> 700 msg/s on a broker of 900;
    each producer ships at most 200 failure lines per topic, broker and minute (a log throttle), so the visible
    demand at the cap is the cap plus 3.3 msg/s, under the rule. At 3f6d0c6 each was lifted three windows after its
    limit while still surging. Now the windows are capped: probed within the busy bound, never lifted while the
    surge lasts, at most three value changes; lifted after it."""
    decisions, trace = surge_loop(44, lambda w: demand if 6 <= w < 36 else baseline, baseline=baseline,
                                  logged=lambda rejected: min(rejected, 200))
    first = next(i for i, (limit, _) in enumerate(trace) if limit is not None)
    assert all(limit is not None for limit, _ in trace[first:36])
    assert value_changes([d for d in decisions if d.window_end <= end(35)]) <= 3
    assert not any(busy for _, busy in trace[first + 2:36])
    assert [d.action for d in decisions][-1] == "lift" and decisions[-1].window_end > end(35)


def test_a_window_the_lift_already_judged_does_not_limit_again_once_it_is_final():
    """Issue 49's lagging shipper: the lift was proven by open windows up to 07:13 (complete by census), then a
    broker's late lines make the final window ending 07:12 fire the rule: that window was judged already and is
    stale, so it does not limit again; a window after the proof that fires is a recurrence, at the remembered target."""
    lifted = ResourceState("group", "g", version=4, last_lift_end=end(13), lifted_target_qps=40.0,
                              last_decision_end=end(10))
    decisions, state = fold([cand(12, 40.0, baseline_tps=400.0)], horizon=12, state=lifted)
    assert decisions == [] and state.limit_qps is None and state.lift_at_qps is None
    decisions, state = fold([cand(14, 55.0, baseline_tps=550.0)], horizon=14, state=lifted)
    assert [(d.action, d.limit_qps) for d in decisions] == [("set", 40.0)] and state.recurrences == 1


def test_an_open_window_proof_remembers_the_lift_where_the_proof_ends():
    """The fixed consumer of issue 48, lifted on the open windows under its probe: the lift is a decision of the
    horizon's window, remembered at the end of the last window that proved it. The window the probe was decided in
    (ending 07:10, at the old cap: 36 of 40) does not keep the limit once the windows under the raise are clear
    (sweep case 102). On the limit's first episode neither does the window that started the probe (07:09, final
    here): the demand under the raise, 36 msg/s, fits the 40 it was probed from, so that cap hid nothing; the lift
    is timed from the last window where the rule fired (07:08), within the probe's two windows. A recurrence's lift
    still counts that window as keeping it (flap damping)."""
    decisions, _ = group_loop(24, lambda w: 600.0 if w <= 8 else 36.0)
    lift, = [d for d in decisions if d.action == "lift"]
    state = ResourceState("group", "g", limit_qps=60.0, target_qps=40.0, limited_since=end(0),
                             last_change_end=end(6), last_decision_end=end(6), last_candidate_end=end(8),
                             last_capped_end=end(9), probe_from_qps=40.0, probe_effective_end=end(11),
                             baseline_tps=400.0)
    applying = Observation(end(10), 36.0, 0, True, 400.0, sendback_tps=36.0)     # at 40 msg/s: capped
    clear = [Observation(end(i), 36.0, 0, True, 400.0, sendback_tps=36.0) for i in range(11, 13)]
    decisions, after, _ = fold_resource(state, [], end(9), P(L), open_evidence=[applying] + clear[:1])
    assert [(d.action, d.window_end) for d in decisions] == [("lift", end(9))] and after.last_lift_end == end(11)
    assert lift.window_end == end(8)  # the loop: proven by its first window under the raise
    again = dataclasses.replace(state, recurrences=1)
    decisions, _, _ = fold_resource(again, [], end(9), P(L), open_evidence=[applying] + clear)
    assert [d.action for d in decisions] == []  # 07:09 still keeps it: 6 clear windows after it


def test_the_final_path_keeps_a_preliminary_limit_within_hysteresis_of_its_own():
    """Sweep case 14's restart test (tests/sim/test_world.py): the fast path set 36.0 msg/s on the storm's first
    window from a consume basis of fewer finalized windows; the final path's own start on the same window is 36.9
    (2.5 % more). Within hysteresis_pct the final decision keeps the preliminary value and target, so the brokers'
    limit does not change; 20 % apart, the final figure stands (a correction)."""
    storm = cand(7, 36.88, baseline_tps=368.8)
    for prelim, kept in ((35.99, 35.99), (30.0, 36.88)):
        decisions, after, _ = fold_resource(ResourceState("group", "g"), [storm], end(7), P(L),
                                            preliminary=PendingPreliminary(end(7), prelim, "enforce"))
        assert [(d.action, round(d.limit_qps, 2)) for d in decisions] == [("set", kept)]
        assert round(after.target_qps, 2) == kept
    decisions, _, _ = fold_resource(ResourceState("group", "g"), [storm], end(7), P(L),
                                    preliminary=PendingPreliminary(end(7), 35.99, "advisory"))
    assert decisions[0].limit_qps == 36.88       # another mode is another decision


def _surge_squeeze_cases():
    """(a surge and a storm policy, a window at the cap with its carrier busy, a state builder): baseline 24.2
    msg/s, so the target is 48.4 (2.0x) and ``surge_squeeze_headroom`` 1.5x is 36.3."""
    from pipelines.decide.records.resource import Judged

    at_cap = Judged(Status.BOUND, "limit-bound")
    busy = Observation(end(8), 48.4, 500, False, busy_brokers=("b",))

    def state(kind, limit, target):
        return ResourceState(kind, "r", limit_qps=limit, target_qps=target, baseline_tps=24.2, limited_since=end(0),
                             last_change_end=end(0), last_decision_end=end(7), change_effective_end=end(2))

    return policy_for("topic", P()), policy_for("group", P()), at_cap, busy, state


def test_a_surge_limit_is_never_squeezed_to_its_normal_traffic():
    """Sweep cases 19 and 141: a surge limit at its target (2x the frozen baseline) on a carrier still busy was
    squeezed to 1.0x the baseline, so after the fix the topic's normal traffic sat at the cap, its demand hidden,
    and the lift came late. A surge's squeeze stops at ``surge_squeeze_headroom`` (1.5x) the baseline, above its
    normal traffic (a looser first cut is cut by ``max_cut_pct`` at most); a retry storm's goes on to
    ``min_limit_qps``."""
    surge, storm, at_cap, busy, state = _surge_squeeze_cases()
    assert surge.squeeze(state("topic", 36.3, 36.3), busy, at_cap) is None   # at 1.5x: no further
    looser = surge.squeeze(state("topic", 100.0, 48.4), busy, at_cap)
    assert looser.decisions[0].limit_qps == 50.0                            # max_cut_pct 50 %: above the floor
    assert storm.squeeze(state("group", 48.4, 48.4), busy, at_cap).decisions[0].limit_qps == 24.2


def test_a_surge_limit_its_busy_carrier_cannot_take_at_the_target_is_squeezed_to_the_squeeze_headroom():
    """Sweep cases 42 and 45: a surge limited at its target (2.0x the baseline) kept a carrier busy while its
    average writes sat under its capacity (case 45: broker-e wrote 157 msg/s of 203; the limiter rejecting 2.5x
    the share opens its breaker, and each time it closes a second of tokens reaches the 200 ms send queue at once),
    so the bystanders on it lost 1.14 % of their sends before the limit (case 42, 1.28x headroom brokers at
    capacity: 5.58 %). The squeeze cuts it, and its target, to 1.5x the baseline (36.3 msg/s here), once."""
    surge, _, at_cap, busy, state = _surge_squeeze_cases()
    squeezed = surge.squeeze(state("topic", 48.4, 48.4), busy, at_cap)
    assert [round(d.limit_qps, 1) for d in squeezed.decisions] == [36.3]
    assert round(squeezed.state.target_qps, 1) == 36.3
    assert round(surge.squeeze(state("topic", 60.0, 48.4), busy, at_cap).decisions[0].limit_qps, 1) == 36.3


def test_a_squeeze_is_decided_on_the_first_complete_open_window_that_shows_its_broker_busy():
    """Sweep case 3: a storm limited to 38.9 msg/s on a broker with 1.28x headroom. The open windows after the
    horizon ending 07:04 and 07:05 are both complete by census and at the cap; the carrier's busy failures of the
    first had landed, the newest's not yet (the clients' failure lines ship on their own clocks). Only the newest
    was judged, so the squeeze waited a minute for the final window 07:04 (the bystanders lost 1.33 % of what they
    lost before the limit; 0.73 % with the squeeze a minute sooner). Every complete open window is judged, in the
    order the final path folds them."""
    state = ResourceState("group", "g", limit_qps=40.0, target_qps=40.0, limited_since=end(1), last_change_end=end(1),
                          last_decision_end=end(1), change_effective_end=end(3), mode="enforce")
    busy = Observation(end(4), 40.0, 0, False, 400.0, busy_brokers=("b",), sendback_tps=15.0)
    quiet = Observation(end(5), 40.0, 0, True, 400.0, sendback_tps=15.0)
    decisions, after, _ = fold_resource(state, [], end(3), P(L), open_evidence=[busy, quiet])
    squeeze, = decisions
    assert squeeze.reason.startswith("squeeze: b busy under the limit in the open window ending 07:04, complete by")
    assert (squeeze.limit_qps, squeeze.window_end, after.target_qps) == (20.0, end(3), 20.0)
    decisions, _, _ = fold_resource(state, [], end(3), P(L), open_evidence=[quiet])
    assert not any(d.reason.startswith("squeeze") for d in decisions)


def test_a_squeeze_on_a_complete_open_window_is_not_held_back_by_a_decision_on_the_horizon():
    """Sweep cases 25 and 57: the final path's batch that confirms the fast path's limit on the horizon's window
    (a decision of that window) skipped the open windows, though the first window wholly under the limit was complete
    and its carrier busy: the squeeze waited for the next batch, a minute later (case 57: bystanders 1.17 % of
    before, under 1 % with it). A squeeze the broker forces is decided in that batch too; nothing else is in the fold
    that decided on the horizon (a probe or a lift on the open windows waits for the next trigger's fold, which takes
    it as the next decision of the same window, the next version rank)."""
    state = ResourceState("group", "g", limit_qps=40.0, target_qps=40.0, limited_since=end(1), last_change_end=end(1),
                          last_candidate_end=end(1), last_decision_end=end(3), change_effective_end=end(3),
                          mode="enforce")
    busy = Observation(end(4), 40.0, 0, False, 400.0, busy_brokers=("b",), sendback_tps=15.0)
    squeeze, = fold_resource(state, [], end(3), P(L), open_evidence=[busy])[0]
    assert squeeze.reason.startswith("squeeze: b busy under the limit in the open window ending 07:04")
    assert (squeeze.limit_qps, squeeze.window_end, squeeze.nth) == (20.0, end(3), 1)
    clear = tuple(Observation(end(i), 2.0, 0, True, 400.0, sendback_tps=2.0) for i in range(4, 9))
    storm = policy_for("group", P(L))
    assert storm.act_on_open(state, Batch(end(3), opened=clear), decided=True).decisions == ()
    lift, = storm.act_on_open(state, Batch(end(3), opened=clear)).decisions  # the next trigger's fold
    assert (lift.action, lift.window_end, lift.nth) == ("lift", end(3), 1)


def test_the_limiters_view_hides_no_retry_demand_the_fallback_sends_count_sweep_case_187():
    """Sweep case 187 (the limiter's view on): after each fix the consumer's legitimate retries ran at 2.6 msg/s
    under its 50.9 msg/s limit, refused in bursts: the view reported rejections and the fallback sends (0.5 beside
    2.2 msg/s of send-backs) counted about a fifth refused, a demand of 3.3 msg/s. Read as hidden demand, each lift
    waited for a probe (8.1 minutes after one fix). Where the fallback sends count the refusals the window is clear;
    where nothing counts them (no fallback, or every send-back refused) the view still hides the demand."""
    storm = policy_for("group", P())
    state = ResourceState("group", "g", limit_qps=50.9, target_qps=50.9, limited_since=end(0), mode="enforce")

    def judged(observed, sent):
        return storm.judge(Observation(end(5), observed, 0, True, 510.0, viewed=True, sendback_tps=sent), state).status

    assert judged(2.6, 2.2) == Status.CLEAR
    assert judged(2.6, 2.6) == Status.CAPPED          # no fallback sends: nothing counts the refusals
    assert judged(2.6, 1.3) == Status.CAPPED          # every send-back refused (REFUSED_SHARE_MAX): hidden
    assert policy_for("topic", P()).judge(Observation(end(5), 2.6, 0, True, viewed=True),
                                          ResourceState("topic", "t", limit_qps=50.9, mode="enforce")).status \
        == Status.CAPPED                              # a topic's limiter view: hidden, as before


def test_a_surge_under_its_limit_on_a_busy_carrier_is_never_read_as_gone_sweep_case_115():
    """Sweep case 115: pugc-content surging at 1,033 msg/s under a 335.5 msg/s limit on carriers with 1.1x headroom.
    The busy brokers fast-failed part of what the limiter passed: it wrote 275-303 msg/s (0.82-0.9 of the cap),
    and its producers' rejection lines, a tenth logged and throttled, added 5 msg/s. Read as clear, the limit was
    lifted 5 minutes before the fix. A window under the limit whose carrier was busy hides the demand (capped); the
    same window on healthy carriers is clear, as before."""
    surge = policy_for("topic", P())
    state = ResourceState("topic", "pugc-content", limit_qps=335.5, target_qps=335.5, limited_since=end(0),
                          mode="enforce", baseline_tps=223.7)

    def judged(busy):
        return surge.judge(Observation(end(5), 275.3, 274, not busy, 335.5, busy_brokers=busy), state)

    capped = judged(("broker-a", "broker-b"))
    assert capped.status == Status.CAPPED and capped.detail.startswith("the demand hidden: 275.3 of 335.5 msg/s")
    assert judged(()).status == Status.CLEAR


def test_a_window_that_ran_above_its_limit_is_not_a_squeeze():
    """Issue 49's sweep cases 111 and 75: broker-a restarts and its limiter forgets the 56.6 msg/s retry limit for
    11 s; the storm floods it and the window (06:13 in case 111) shows 139.7 msg/s admitted, 2.5x the limit, with
    the carrier busy. The limit did not hold in that window, so the busy carrier says nothing of what the broker
    takes at the limit: no squeeze (at e7062aa it cut the limit and its target to 28.3 msg/s, below the fixed
    consumer's legitimate retries of 54 msg/s, which then read as a persisting storm and were never lifted). The same
    window at the limit (56.6 admitted) with the carrier busy squeezes it, as before."""
    state = ResourceState("group", "g", limit_qps=56.6, target_qps=56.6, limited_since=end(0),
                          last_change_end=end(0), last_decision_end=end(0), last_candidate_end=end(0),
                          baseline_tps=566.0, broker_shares={"b": 1.0})
    final = Observation(end(4), 56.6, 0, True, 540.0, {"b": 500.0}, sendback_tps=19.3)
    flooded = Observation(end(5), 139.7, 0, False, 385.4, {"b": 900.0}, ("b",), sendback_tps=52.2)
    held = Observation(end(5), 56.6, 0, False, 385.4, {"b": 900.0}, ("b",), sendback_tps=19.3)

    def squeezes(window):
        made, _, _ = fold_resource(state, [], end(4), P(L), observations=[final], open_evidence=[window],
                                   now=end(5) + dt.timedelta(seconds=30))
        return [d for d in made if d.reason.startswith("squeeze")]

    assert squeezes(flooded) == []
    squeeze, = squeezes(held)
    assert (squeeze.limit_qps, squeeze.previous_qps) == (pytest.approx(28.3), 56.6)


def test_a_capped_window_before_the_raise_does_not_keep_a_limit_the_probe_shows_clear():
    """Issue 49's sweep case 102: a consumer fixed at 06:16:06 retries 58 msg/s under its 61.2 msg/s limit. The
    window ending 06:18 (here 2) at the cap starts a probe to 91.8 msg/s, in force from the window ending 06:21
    (here 5); the window ending 06:20 (here 4) still ran at 61.2 and is at the cap (60.8), the one ending 06:21 is
    clear under the raise (55.7 of 91.8). The capped window before the raise asks what the probe answers: it does
    not keep the limit, and the lift is proven at the end of 06:21's window, 6.2 minutes after the fix (at e7062aa
    it counted, the lift waited for three clear windows after it: 8.7 minutes). A window under the raise at the cap
    (the admitted rate following it) still undoes the probe, and nothing is lifted."""
    state = ResourceState("group", "g", limit_qps=91.8, target_qps=61.2, limited_since=end(-8),
                          last_change_end=end(1), last_decision_end=end(1), last_candidate_end=end(1),
                          last_capped_end=end(2), baseline_tps=631.0, broker_shares={"b": 1.0},
                          probe_from_qps=61.2, probe_effective_end=end(5))
    final = Observation(end(3), 54.5, 0, True, 650.0, sendback_tps=54.5)
    before_raise = Observation(end(4), 60.8, 0, True, 650.0, sendback_tps=60.8)
    partial = Observation(end(6), 57.5, 0, True, 400.0, sendback_tps=57.5, complete=False)

    def fold_with(under_raise):
        made, after, _ = fold_resource(state, [], end(3), P(L), observations=[final],
                                       open_evidence=[before_raise, under_raise, partial],
                                       now=end(5) + dt.timedelta(seconds=60))
        return made, after

    policy = policy_for("group", P(L))
    assert policy.judge(before_raise, state)[0] == Status.CAPPED
    made, after = fold_with(Observation(end(5), 55.7, 0, True, 660.0, sendback_tps=55.7))
    lift, = made
    assert lift.action == "lift" and lift.window_end == end(3) and after.limit_qps is None
    assert "raised from 61.2 msg/s to see it" in lift.reason and "under the probe" in lift.reason
    made, after = fold_with(Observation(end(5), 91.0, 0, True, 660.0, sendback_tps=91.0))
    assert [d.action for d in made] == ["set"] and made[0].reason.startswith("probe undone")
    assert after.limit_qps == 61.2
