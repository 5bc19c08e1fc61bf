"""The irregular world of the Spark-free closed loop (issue 49, pipelines/sim/irregular.py): shippers that lag, skip,
repeat and stop; brokers that apply a limit each after its own delay or forget it on a restart; a governor restarted
from the lake; failure lines classified by the data plane's pattern table; compound causes and their ground truth.
Small inline data; the whole-loop tests run one short storm each (about a second)."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pytest

from pipelines import rocketmq as rmq
from pipelines.sim.irregular import Irregularity, stats_landings
from pipelines.sim.windows import FinalWindows, OpenWindows
from pipelines.sim.draws import AFTER_FINAL_FIX

T0 = dt.datetime(2026, 1, 5, 6, 0, tzinfo=dt.timezone.utc)


def _at(minute: int) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minute)


def test_a_lagging_brokers_minutes_land_late_and_a_dropped_or_stopped_one_never():
    irr = Irregularity(stats_delay_seconds={"broker-b": 150.0}, dropped_minutes=[("broker-a", 1)],
                       stats_stop_minute={"broker-c": 2})
    landed = stats_landings(irr, ["broker-a", "broker-b", "broker-c"], 4, 5.0)
    when = {(m, b): t for t, m, b in landed}
    assert when[(0, "broker-a")] == 65.0 and when[(0, "broker-b")] == 210.0  # minute 0 ends at 60 s
    assert (1, "broker-a") not in when and (2, "broker-a") in when  # the dropped minute only
    assert [m for (m, b) in when if b == "broker-c"] == [0, 1]  # stopped from minute 2 on
    assert [t for t, _, _ in landed] == sorted(t for t, _, _ in landed)


def test_a_minute_shipped_twice_lands_twice_and_unknown_brokers_are_refused():
    landed = stats_landings(Irregularity(duplicated_minutes=[("broker-a", 0, 90.0)]), ["broker-a"], 2, 5.0)
    assert [(t, m) for t, m, _ in landed] == [(65.0, 0), (125.0, 1), (155.0, 0)]
    with pytest.raises(ValueError, match="unknown brokers"):
        stats_landings(Irregularity(stats_delay_seconds={"broker-z": 1.0}), ["broker-a"], 2, 5.0)


def test_a_stats_line_shipped_twice_counts_once_in_both_speeds_and_failures_count_as_they_come():
    line = (_at(0), "broker-a", "t1", None, rmq.TOPIC_PUT_NUMS, 600)
    failure = (_at(0) + dt.timedelta(seconds=5), "broker-a", "t1", None, "failure:TIMEOUT_CLEAN_QUEUE", 1)
    final = FinalWindows(60, 120)
    final.batch([line, failure])
    final.batch([line, failure])  # the same file again, and a second failure line
    final.batch([(_at(5), "broker-a", "t1", None, rmq.TOPIC_PUT_NUMS, 1)])  # moves the watermark past minute 0
    sums = final.batch([])
    assert sums[(_at(0), "broker-a", "t1", None, rmq.TOPIC_PUT_NUMS)] == 600
    assert sums[(_at(0), "broker-a", "t1", None, "failure:TIMEOUT_CLEAN_QUEUE")] == 2
    opened = OpenWindows(60, 120)
    opened.batch_rows([line])
    _, rows = opened.batch_rows([line])
    assert {(r["resource_type"], r["puts"]) for r in rows if r["resource_type"] != "cluster"} == {
        ("topic", 600), ("broker", 600)}  # output again (update mode), not added again


def test_a_minute_behind_the_watermark_is_dropped_as_spark_drops_late_rows():
    final = FinalWindows(60, 120)
    emitted = {}
    for events in ([(_at(5), "broker-a", "t1", None, rmq.TOPIC_PUT_NUMS, 60)],  # watermark: minute 3
                   [(_at(2), "broker-b", "t1", None, rmq.TOPIC_PUT_NUMS, 60)],  # 3 minutes late: behind it
                   [(_at(9), "broker-a", "t1", None, rmq.TOPIC_PUT_NUMS, 60)], []):
        emitted.update(final.batch(events) or {})
    assert emitted == {(_at(5), "broker-a", "t1", None, rmq.TOPIC_PUT_NUMS): 60}


def test_failure_lines_are_classified_by_the_data_planes_pattern_table():
    from pipelines.sim.admitted import FailureText
    from pipelines.sim.loop import closed_cluster
    from pipelines.sim.settings import load_backtest_config
    from pipelines.sim.spec import ScenarioSpec

    spec = ScenarioSpec(name="persisting_storm", start=T0, minutes=8, onset_minute=5, brokers=3, topics=6, groups=4)
    text = FailureText(closed_cluster(spec, load_backtest_config("conf/backtest.toml")))
    seen = {}
    for pair in range(len(text.topic)):
        for busy in (True, False):
            message, code = text.text(pair, busy)
            seen.setdefault(busy, set()).add(rmq.classify_failure_text(message, code))
    assert seen == {True: {"TIMEOUT_CLEAN_QUEUE"}, False: {rmq.RATE_LIMITED}}
    assert rmq.classify_failure_text("org.apache...RemotingTimeoutException: wait response", None) == "CLIENT_TIMEOUT"
    assert rmq.classify_failure_text("CODE: 14  DESC: nothing known", 14) == "SERVICE_NOT_AVAILABLE"
    assert rmq.classify_failure_text("CODE: 17  DESC: topic not exist", 17) == rmq.OTHER_FAILURE
    # the trickle's generator knows what each of its lines stands for: the table reads the same from the text
    from pipelines.sim.admitted import trickle

    bg = trickle(text.cluster, np.random.default_rng(1))
    got = [rmq.classify_failure_text(m, None if pd.isna(c) else int(c)) for m, c in zip(bg["message"], bg["code"])]
    assert len(bg) and got == bg["expected_class"].tolist()


@pytest.fixture(scope="module")
def storm_runs():
    """One short persisting storm (one carrier, broker-a), regular and irregular: broker-b applies 15 s later,
    broker-a restarts mid-storm, the governor restarts too."""
    from pipelines.sim.loop import simulate
    from pipelines.sim.settings import governor_config, load_backtest_config
    from pipelines.sim.spec import ScenarioSpec

    bcfg = load_backtest_config("conf/backtest.toml")
    cfg = governor_config(bcfg, None, None)
    spec = ScenarioSpec(name="persisting_storm", start=T0, minutes=14, onset_minute=6, brokers=3, topics=6, groups=4,
                        culprit_topic_brokers=2)
    irr = Irregularity(apply_delay_seconds={"broker-b": 15.0}, broker_restarts=[("broker-a", 600.0)],
                       governor_restart_second=560.0)
    return simulate(spec, cfg, bcfg), simulate(spec, cfg, bcfg, irregular=irr)


def _first_in_force(result, broker: str) -> pd.Timestamp:
    return min(t for t, snap in result.in_force if any(b == broker and rt == "group" for b, rt, _ in snap))


def test_each_broker_applies_a_limit_after_its_own_delay(storm_runs):
    regular, late = storm_runs
    assert _first_in_force(regular, "broker-a") == _first_in_force(regular, "broker-b")
    assert _first_in_force(late, "broker-b") - _first_in_force(late, "broker-a") == pd.Timedelta(seconds=15)


def test_a_broker_restart_forgets_the_limit_until_the_next_publication(storm_runs):
    _, late = storm_runs
    restart = late.cluster.start + pd.Timedelta(seconds=600)
    after = [(t, {b for b, rt, _ in snap if rt == "group"}) for t, snap in late.in_force if t >= restart]
    assert after[0][0] == restart and "broker-a" not in after[0][1] and "broker-b" in after[0][1]
    back = next(t for t, brokers in after if "broker-a" in brokers)
    assert pd.Timedelta(0) < back - restart <= pd.Timedelta(seconds=75)  # the next gold publication + propagation


def test_a_restarted_governor_reads_its_memory_back_from_the_lake_schemas():
    from pipelines import columns
    from pipelines.decide.arrow import from_rows
    from pipelines.sim.loop import Store

    store = Store()
    state = {name: None for name, _ in columns.POLICY_STATE}
    state.update(resource_type="group", resource="g", limit_qps=12.5)
    limit = {name: None for name, _ in columns.GOLD_LIMITS}
    limit.update(resource_type="group", resource="g", limit_qps=12.5, version=3)
    store.add(from_rows([limit], columns.GOLD_LIMITS), from_rows([state], columns.POLICY_STATE))
    back = Store.read_back(store)
    assert back.state_table().equals(store.state_table()) and back.limits_table().equals(store.limits_table())
    assert back.state is not store.state and back.limited_keys() == ("group\x1fg",)


def test_a_compound_incidents_ground_truth_lists_every_cause():
    from pipelines.sim.cluster import ClosedLoopCluster
    from pipelines.sim.spec import ScenarioSpec

    spec = ScenarioSpec(name="compound", start=T0, minutes=16, brokers=3, topics=6, groups=5, onset_second=30,
                        ramp_minutes=2.0, causes=(("storm", 2, 630, 900, 150.0, 1), ("surge", 3, 640, -1, 900.0, 0)))
    c = ClosedLoopCluster(spec)
    storm, surge = c.incident.causes
    assert (storm.resource_type, storm.kind, surge.resource_type, surge.kind) == ("group", "storm", "topic", "surge")
    at = lambda s: pd.Timestamp(T0) + pd.Timedelta(seconds=s)  # noqa: E731
    assert storm.active == ((at(630), at(900)),)
    assert surge.active[0][1] == c.end and not surge.required and storm.ramp_seconds == 120.0
    assert c.broken(storm.resource)[10:15].all() and not c.broken(storm.resource)[:10].any()
    # the demand follows the ramp: minute 10 (the start, 30 s in) is below minute 13 (full level)
    group_rows = (c.pairs["resource_type"] == "group").to_numpy() & (c.pairs["resource"] == storm.resource).to_numpy()
    per_minute = c.demand[group_rows].sum(axis=0)
    assert 0 < per_minute[10] < per_minute[13]


def test_any_enforced_limit_on_a_resource_without_a_cause_is_a_false_limit(storm_runs):
    from types import SimpleNamespace

    from pipelines.sim.figures import compute

    regular, _ = storm_runs
    assert compute(regular).value("false_limits") == 0
    snap = {("broker-c", "topic", "bystander"): (5.0, {"limit_qps": 5.0, "version": 1})}
    t = regular.cluster.start + pd.Timedelta(minutes=2)
    fake = SimpleNamespace(**{**regular.__dict__, "in_force": [(t, snap)] + list(regular.in_force)})
    f = compute(fake)
    assert f.value("false_limits") == 1 and f.details["false_limits"] == "topic:bystander"


def test_a_restarts_gap_is_left_out_of_the_changes_and_the_bystanders_and_named():
    """The storm's only carrier restarts mid-storm: its limit is gone for 41 s until the next publication. Not a
    decision: left out of the value changes and of the bystanders' seconds, each named with its reason."""
    from pipelines.sim.figures import compute
    from pipelines.sim.loop import simulate
    from pipelines.sim.settings import governor_config, load_backtest_config
    from pipelines.sim.spec import ScenarioSpec

    bcfg = load_backtest_config("conf/backtest.toml")
    spec = ScenarioSpec(name="persisting_storm", start=T0, minutes=14, onset_minute=6, brokers=3, topics=6, groups=4)
    f = compute(simulate(spec, governor_config(bcfg, None, None), bcfg,
                         irregular=Irregularity(broker_restarts=[("broker-a", 600.0)])))
    changes = next(m for n, ok, m in f.checks if n.startswith("<= 1 change"))
    assert "gone at broker-a's restart" in changes and "back at" in changes and changes.startswith(
        "group get-pugc-to-ai-consumer: 0;")
    assert f.value("limit_value_changes_excluded") == 2
    assert f.details["bystander_seconds_left_out"].startswith("broker-a 06:10:00-06:10:4")


def test_a_broker_is_sized_for_its_normal_load_when_a_storm_is_under_way_from_the_start():
    """A cold start (sweep case 14): the storm starts in minute 1, so no minute before it shows a broker's normal
    load, and every broker fell to the capacity floor (200 units/s) while its normal traffic was 2.3x that: busy
    whatever the governor did. Sized from every minute without the storm's own traffic (its group's retry
    traffic), a broker gets its drawn headroom over its normal load, as when the storm starts later."""
    from pipelines.sim.cluster import ClosedLoopCluster
    from pipelines.sim.spec import ScenarioSpec

    def capacity(onset):
        c = ClosedLoopCluster(ScenarioSpec(name="persisting_storm", start=T0, minutes=12, onset_minute=onset,
                                           brokers=3, topics=6, groups=4, seed=3))
        return c.capacity["broker-a"]

    late, cold = capacity(8), capacity(1)
    assert cold > 200.0 and cold == pytest.approx(late, rel=0.1)


def test_a_flash_sale_that_overloads_its_broker_by_itself_is_not_drawn_as_a_legitimate_one():
    """Kind ``surge_and_flash`` stands for a legitimate flash sale beside a noisy neighbour. A flash sale that takes its
    broker past its capacity with the surge contained is a noisy neighbour itself (limiting it is a false limit,
    leaving it alone leaves the bystanders rejected). Such a draw is refused and drawn again: sweep case 28's first
    draw reaches 1.22x; the case drawn holds the premise."""
    from pipelines.sim import draws
    from pipelines.sim.premise import premise

    rng = np.random.default_rng(28)
    kind = str(rng.choice(list(draws.KINDS), p=np.array(list(draws.KINDS.values())) / sum(draws.KINDS.values())))
    first = draws._draw(28, kind, rng, None)
    assert kind == "surge_and_flash" and any(c[0] == "flash" for c in first.spec["causes"])
    assert premise(first) == ("with the surge contained a broker's demand reaches 1.22x its capacity (the flash "
                              "sale overloads it)")
    assert premise(draws.draw(28)) is None


def test_a_limit_a_restarted_broker_forgot_and_the_next_publication_restored_is_not_a_lift():
    """Sweep cases 20 and 168: a broker restarted during a fixed storm's quiet spell; its limiter forgot the limit
    until the next publication restored it, 51 s later. That gap read as a lift and a limit set again while quiet,
    and as a lift 2.7 minutes after the fix (the governor lifted it 7.4 minutes after). A value gone at a restart's
    instant and back at the same value is no lift; gone at a restart and not restored, it is; a lift at any other
    instant is."""
    from pipelines.sim.truth import _gone

    t = pd.Timestamp("2026-01-05 06:00:00", tz="UTC")
    at = lambda s: t + pd.Timedelta(seconds=s)  # noqa: E731
    restarts = [("broker-a", at(975))]
    forgot = [(at(500), 14.7), (at(975), float("nan")), (at(1026), 14.7), (at(1200), float("nan"))]
    assert _gone(forgot, at(813), restarts) == at(1200)
    assert _gone(forgot, at(813), []) == at(975)                              # the old reading
    never_restored = [(at(500), 14.7), (at(975), float("nan"))]
    assert _gone(never_restored, at(813), restarts) == at(975)
    other_value = [(at(500), 14.7), (at(975), float("nan")), (at(1026), 30.0)]
    assert _gone(other_value, at(813), restarts) == at(975)


def test_a_lift_decided_before_an_episode_s_first_whole_window_ended_is_not_a_lift_while_active():
    """Issue 49's wider quiet spells (4-12 minutes): in sweep cases 12, 30, 168 and 185 a storm's lift was decided
    in the quiet spell, or within 40 s of the next episode's start, and landed seconds into it, before any stats
    window could show the storm back; no policy can veto that. The episode is judged as one that starts after a
    lift (limited again within the onset bound). A lift decided after the episode's first whole window ended
    (sweep case 168 with mutation p02, no lift veto: decided 2 minutes into the episode) is a lift while active."""
    from types import SimpleNamespace

    from pipelines.sim.truth import first_window_end, unseen_lift

    t = pd.Timestamp("2026-01-05 06:00:00", tz="UTC")
    at = lambda s: t + pd.Timedelta(seconds=s)  # noqa: E731
    a, b = at(21 * 60 + 19), at(24 * 60 + 19)  # an episode 06:21:19-06:24:19
    assert first_window_end(a) == at(23 * 60) and first_window_end(at(22 * 60)) == at(23 * 60)
    events = [(at(500), 14.0), (at(21 * 60 + 43), float("nan")), (at(23 * 60 + 30), 14.0)]

    def lifted(decided_s, landed=events):
        limits = pd.DataFrame({"resource_type": ["group", "group"], "resource": ["g", "g"], "action": ["set", "lift"],
                               "decided_at": [at(480), at(decided_s)]})
        return unseen_lift(SimpleNamespace(limits=limits), ("group", "g"), landed, a, b, [])

    assert lifted(21 * 60 + 41) == (at(21 * 60 + 43), at(21 * 60 + 41))   # case 168: 22 s into the episode
    assert lifted(20 * 60 + 50) == (at(21 * 60 + 43), at(20 * 60 + 50))   # decided in the quiet spell
    late = [(at(500), 14.0), (at(23 * 60 + 5), float("nan"))]
    assert lifted(22 * 60 + 59, late) == (at(23 * 60 + 5), at(22 * 60 + 59))
    assert lifted(23 * 60, late) is None                                  # a whole window could show it: blind
    assert unseen_lift(SimpleNamespace(limits=None), ("group", "g"), events, a, b, []) is None
    not_in_force = [(at(500), float("nan")), (at(23 * 60 + 30), 14.0)]
    assert unseen_lift(SimpleNamespace(limits=pd.DataFrame()), ("group", "g"), not_in_force, a, b, []) is None


def test_a_probe_decided_before_an_episode_s_first_whole_window_ended_is_not_a_change_while_it_persists():
    """Sweep case 94 (the limiter's view, quiet spells of 5 minutes): a limit at its cap with its demand hidden was
    probed in the quiet spell (41.6 → 62.3 msg/s, decided 06:18:31) and the probe landed as the next episode began
    (06:18:38); the episode undid it (06:21:31). Two changes while the cause persisted by the old count; the probe
    answered the quiet spell, not the episode: one. A change decided after the first whole window ended counts."""
    from types import SimpleNamespace

    from pipelines.sim.truth import unseen_changes

    t = pd.Timestamp("2026-01-05 06:00:00", tz="UTC")
    at = lambda m, s: t + pd.Timedelta(seconds=60 * m + s)  # noqa: E731
    events = [(at(9, 20), 41.6), (at(18, 40), 62.3), (at(21, 40), 41.6)]
    limits = pd.DataFrame({"resource_type": ["group"] * 3, "resource": ["g"] * 3, "action": ["set", "relax", "set"],
                           "decided_at": [at(9, 12), at(18, 31), at(21, 31)]})
    result = SimpleNamespace(limits=limits)
    assert unseen_changes(result, ("group", "g"), events, at(18, 38), at(23, 38)) == [at(18, 40)]
    assert unseen_changes(result, ("group", "g"), events, at(17, 0), at(23, 38)) == []   # decided in the episode
    late = limits.assign(decided_at=[at(9, 12), at(20, 0), at(21, 31)])
    landed = [(at(9, 20), 41.6), (at(20, 5), 62.3), (at(21, 40), 41.6)]
    assert unseen_changes(SimpleNamespace(limits=late), ("group", "g"), landed, at(18, 38), at(23, 38)) == []


def test_a_recurring_surge_of_a_mid_size_topic_is_limited_long_before_it_comes_back():
    """Mutation p12 (a topic's surge baseline fed with its limited windows) shows only for a surge limited for 16+ of
    the 30 windows of its baseline that comes back near the rule's factor: the baseline then holds the capped level
    (2x the rate before, more where a probe raised it) and the comeback is under 2.5x that on its busy broker. Sweep
    cases 13, 117 and 194 draw a mid-size topic surging 7-12x its rate, limited first for 21-22 minutes (a length
    from a stream of its own), and the run lasts ``AFTER_FINAL_FIX`` (22) minutes after the third episode; a small
    topic's surge (case 9) keeps three short episodes of the same length."""
    from pipelines.sim import draws

    for seed, topic, first in ((13, 4, 21), (117, 3, 21), (194, 3, 22)):
        case = draws.draw(seed)
        causes = case.spec["causes"]
        assert case.kind == "recurring_surge" and [c[1] for c in causes] == [topic] * 3
        assert causes[0][3] - causes[0][2] == first * 60 and causes[1][3] - causes[1][2] < 8 * 60
        assert case.spec["minutes"] == causes[2][3] // 60 + AFTER_FINAL_FIX + int(np.ceil(case.spec.get(
            "rollout_minutes", 0)))
    short = draws.draw(9).spec["causes"]
    assert short[0][2:4] == (688, 1108) and len({c[3] - c[2] for c in short}) == 1


def test_a_pulsed_surge_is_drawn_where_every_refusal_is_logged_and_judged_on_the_seconds_it_sends():
    """Pulsed producers (issue 49, mutation p01): sweep case 90's noisy neighbour sends in pulses of 7 s every 20 s
    (a stream of its own: its other draws as without them); its producers log every refusal. Its limit, between the
    surge's minute rate and its pulses', admits about half the cap a minute while refusing in each pulse; the
    admitted checks judge the seconds its producers send (the limit is met there), and it passes. Case 129's noisy
    neighbour logs none of its refusals: no minute line would tell its pulses under a limit from a fixed surge, so it
    is drawn without pulses."""
    from pipelines.sim import draws, sweep

    case = draws.draw(90)
    assert (case.clients["pulse_period_seconds"], case.clients["pulse_on_seconds"]) == (20, 7)
    assert (case.clients["rejection_log_share"], case.clients["log_lines_per_minute"]) == (1.0, 0)
    assert "pulse_period_seconds" not in draws.draw(129).clients
    f = sweep.run(case)
    assert 0.9 <= f.value("culprit_admitted_over_target") <= 1.25
    assert f.value("culprit_admitted_over_target_with_pulse_gaps") < 0.5  # the gaps counted: kept beside
    assert f.value("admitted_over_limit_minute_min") >= 0.75 > f.value("admitted_over_limit_minute_min_with_pulse_gaps")
    assert all(ok for _name, ok, _m in f.checks), [m for _n, ok, m in f.checks if not ok]
