"""The steps every limit policy shares (pipelines/decide/limits/steps.py): hysteresis, the maximum cut, the cool-down, the
refresh, recovery, a probe's back-off, the first window under a decision and the one transition that decides, on
inline rows; and the registry of policies the catalogue keeps (pipelines/decide/catalogue.py)."""

from __future__ import annotations

import datetime as dt

import pytest

from pipelines.config import DetectionConfig, GovernorConfig, LimitsConfig
from pipelines.decide.limits import steps
from pipelines.decide.catalogue import RULES, policy_for
from pipelines.decide.records.resource import ResourceState
from pipelines.decide.limits.retry_storm import RetryStormLimit
from pipelines.decide.limits.surge import SurgeLimit
from pipelines.decide.words import Action, Mode

T0 = dt.datetime(2022, 2, 8, 7, 0)
MINUTE = dt.timedelta(minutes=1)


@pytest.mark.parametrize("target, current, expected", [(89.0, 100.0, True), (90.0, 100.0, False),
                                                       (95.0, 100.0, False), (10.0, 100.0, True)])
def test_a_tighter_limit_is_a_change_only_beyond_the_hysteresis(target, current, expected):
    assert steps.tightens(target, current, 10.0) is expected


@pytest.mark.parametrize("limit, target, expected", [(60.0, 40.0, True), (44.0, 40.0, False),
                                                     (44.1, 40.0, True), (60.0, None, False)])
def test_above_the_frozen_target(limit, target, expected):
    assert steps.above(limit, target, 10.0) is expected


@pytest.mark.parametrize("raised, current, expected", [(60.0, 40.0, False), (43.9, 40.0, True),
                                                       (40.0 * 1.1, 40.0, False), (40.0, 40.0, True)])
def test_a_raise_within_the_hysteresis_is_too_small(raised, current, expected):
    assert steps.too_small(raised, current, 10.0) is expected


@pytest.mark.parametrize("target, rate, expected", [(20.0, 200.0, 100.0), (150.0, 200.0, 150.0),
                                                    (20.0, 30.0, 20.0), (1.0, 0.0, 1.0)])
def test_one_decision_cuts_at_most_max_cut_pct(target, rate, expected):
    assert steps.cut(target, rate, 50.0) == expected


@pytest.mark.parametrize("last, end, expected", [(None, T0, True), (T0, T0 + MINUTE, False),
                                                 (T0, T0 + 2 * MINUTE, True), (T0, T0, False)])
def test_the_cool_down(last, end, expected):
    assert steps.cooled(last, end, MINUTE, 2) is expected


@pytest.mark.parametrize("last, end, expected", [(None, T0, False), (T0, T0 + 4 * MINUTE, False),
                                                 (T0, T0 + 5 * MINUTE, True), (T0, T0 + 9 * MINUTE, True)])
def test_the_refresh_is_due_refresh_seconds_after_the_last_decision(last, end, expected):
    assert steps.refresh_due(last, end, dt.timedelta(seconds=300)) is expected


@pytest.mark.parametrize("recurrences, expected", [(0, 3), (1, 6), (3, 24), (4, 30)])
def test_recovery_doubles_per_recurrence_up_to_the_memory(recurrences, expected):
    assert steps.recovery_needed(recurrences, 3, 30) == expected
    assert steps.recovery_needed(recurrences, 3, 0) == 3


@pytest.mark.parametrize("backoff, minutes", [(1, 6), (2, 12), (3, 24), (40, 3 * 2 ** 16)])
def test_a_probe_s_ceiling_holds_a_doubling_interval(backoff, minutes):
    assert steps.backoff_hold(MINUTE, 3, backoff) == dt.timedelta(minutes=minutes)


@pytest.mark.parametrize("at, expected", [(T0 + dt.timedelta(seconds=210), T0 + 5 * MINUTE),
                                          (T0 + 4 * MINUTE, T0 + 5 * MINUTE),
                                          (T0 + 4 * MINUTE + dt.timedelta(microseconds=1), T0 + 6 * MINUTE),
                                          (T0 + 4 * MINUTE - dt.timedelta(microseconds=1), T0 + 5 * MINUTE)])
def test_the_first_window_wholly_under_a_decision(at, expected):
    assert steps.effective_end(at, MINUTE) == expected


def test_a_first_decision_freezes_the_basis_and_a_lift_remembers_or_forgets():
    state = ResourceState("group", "g", probe_backoff=2, cause_changes=3)
    first = steps.decide(state, T0, 40.0, Action.SET, "storm", Mode.ENFORCE, shares={"a": 0.75, "b": 0.25},
                         target=40.0, baseline=400.0)
    decision, = first.decisions
    assert (decision.version, decision.previous_qps, dict(decision.broker_limits)) == (
        1, None, {"a": 30.0, "b": 10.0, "*": 10.0})
    s = first.state
    assert (s.limit_qps, s.target_qps, s.limited_since, s.baseline_tps, s.cause_changes, s.probe_backoff) == (
        40.0, 40.0, T0, 400.0, 0, 0)
    refresh = steps.decide(s, T0 + MINUTE, 40.0, Action.SET, "refresh", Mode.ENFORCE, change=False)
    assert refresh.state.last_change_end == T0 and refresh.state.cause_changes == 0
    kept = steps.decide(s, T0 + 4 * MINUTE, 40.0, Action.LIFT, "gone", Mode.ENFORCE, remember=True).state
    assert (kept.limit_qps, kept.last_lift_end, kept.lifted_target_qps, kept.broker_shares) == (
        None, T0 + 4 * MINUTE, 40.0, {})
    forgot = steps.decide(s, T0 + 4 * MINUTE, 40.0, Action.LIFT, "probe reached", Mode.ENFORCE).state
    assert forgot.last_lift_end is None and forgot.lifted_target_qps is None


def test_the_params_are_the_config_s():
    cfg = GovernorConfig()
    p = steps.Params.from_config(cfg)
    assert p == steps.Params.of(cfg.limits, cfg.detection, cfg.windows.length_seconds)
    assert (p.window, p.refresh, p.hysteresis_pct) == (dt.timedelta(seconds=cfg.windows.length_seconds),
                                                       dt.timedelta(seconds=cfg.limits.refresh_seconds),
                                                       cfg.limits.hysteresis_pct)
    with pytest.raises(Exception):
        p.hysteresis_pct = 5.0  # frozen


def test_the_catalogue_maps_each_limited_resource_type_to_its_rule_s_policy():
    p = steps.Params.of(LimitsConfig(), DetectionConfig(), 60)
    assert isinstance(policy_for("group", p), RetryStormLimit) and isinstance(policy_for("topic", p), SurgeLimit)
    for kind, spec in RULES.items():
        assert (spec.policy is None) == (not spec.limited), kind
        assert spec.policy is None or spec.policy.kind is kind
    with pytest.raises(ValueError, match="no rule limits a broker"):
        policy_for("broker", p)


def test_a_decision_is_timed_in_the_stream_s_time_not_a_backlog_s_wall_clock():
    """A live decision of the window ending 08:11 made at 08:13:10 is judged from the window ending 08:15 (the first
    wholly after it). A backlog run deciding that window a week later takes it at most ``Params.max_decision_lag``
    after the window (the watermark and two windows: 4 minutes with the shipped 120 s; 7 with a 300 s one) (tests/e2e/test_crash.py: a restart decided it a minute later on the wall clock, and the state
    differed by that minute; tests/e2e/test_two_speeds.py: a backlog's limits never reached their first window
    wholly under them, so it never squeezed where the incremental run did)."""
    from pipelines.config import DetectionConfig, LimitsConfig, load_config
    from pipelines.decide.limits.steps import Params, decided_at, effective_end

    lag = Params.from_config(load_config("conf/local.toml")).max_decision_lag
    assert lag == dt.timedelta(minutes=4) == Params.of(LimitsConfig(), DetectionConfig(), 60).max_decision_lag
    assert Params.of(LimitsConfig(), DetectionConfig(), 60, 300).max_decision_lag == dt.timedelta(minutes=7)
    w, minute = dt.datetime(2026, 11, 22, 8, 11), dt.timedelta(minutes=1)
    assert decided_at(None, w, lag) == w
    live = w + dt.timedelta(seconds=130)
    assert decided_at(live, w, lag) == live and effective_end(live, minute) == dt.datetime(2026, 11, 22, 8, 15)
    for later in (dt.timedelta(days=7), dt.timedelta(days=7, minutes=1)):
        assert decided_at(w + later, w, lag) == w + 4 * minute
