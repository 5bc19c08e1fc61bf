"""The final path end to end on inline rows (pipelines/decide/paths/final.py): the limiters' own evidence wired in, the
persisting-anomaly rows and the limit in force written beside the windows."""

from __future__ import annotations

import datetime as dt

from pipelines import columns
from pipelines.config import GovernorConfig
from pipelines.decide.paths.final import run_final
from pipelines.decide.records.inputs import FinalInputs, LockedInputs
from tests.decide.rows import T0, table, win

CFG = GovernorConfig()
NOW = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.timezone.utc)


def inputs(rejections=None):
    """A group limited to 40 msg/s (10 % of 400 consumed) whose retry traffic shows 10 msg/s in 4 windows."""
    windows = [win(i) for i in range(4)]
    groups = table(columns.GOLD_GROUP_TPS, [(s, e, "g", "orders", 400.0, 10.0, 0.025) for s, e in windows])
    traffic = table(columns.WINDOW_TRAFFIC, [(s, e, "group", "g", "broker-a", 10.0, 0, False) for s, e in windows]
                    + [(s, e, "*", m, None, None, None, None) for s, e in windows for m in ("metrics", "traffic")])
    state = table(columns.POLICY_STATE, [("group", "g", 40.0, 3, T0, T0, T0, 400.0, "enforce", 40.0, T0,
                                          {"broker-a": 1.0})])
    empty = lambda spec: table(spec, [])  # noqa: E731
    return (FinalInputs(topics=empty(columns.GOLD_TOPIC_TPS), groups=groups, brokers=empty(columns.GOLD_BROKER_TPS),
                        traffic=traffic, topic_history=empty(columns.GOLD_TOPIC_TPS),
                        broker_history=empty(columns.GOLD_BROKER_TPS), limiter_rejections=rejections),
            LockedInputs(policy_state=state, latest_limits=empty(columns.GOLD_LIMITS)))


def test_a_limited_group_whose_limiter_rejected_in_the_window_is_never_lifted_blind():
    """Only 10 msg/s of retry traffic under a 40 msg/s limit (below the 90 % bound), but the RocketMQ admin sink saw
    its %RETRY% limiter reject sends in each window: the demand is hidden (``capped``: rejected, how much unknown),
    so the limit is not lifted; nor is it probed, the window being under its cap (a probe is an experiment on a
    cause at its cap), and no window is written as the anomaly (the cause is not proven either). Without that view,
    10 of 40 msg/s at a 2.5 % retry ratio is the cause gone: lifted."""
    rejections = table(columns.LIMITER_REJECTIONS, [(win(3)[1], "rocketmq", "broker-a", "%RETRY%g",
                                                     s + dt.timedelta(seconds=30), 7) for s, _ in (win(i) for i in range(4))])
    out = run_final(*inputs(rejections), CFG, NOW, batch_id=1, origin="rate-governor-gold:1")
    assert [e.status for _k, e in out.folded.evidence] == ["capped"] * 4
    assert out.folded.evidence[0][1].detail == (
        "the demand hidden: 10.0 of 40.0 msg/s, the limiter's own view reports rejections (no count); visible retry "
        "demand 10.0 msg/s, ratio 0.03 against 400.0 msg/s consumed (rule: >= 0.50) on what shows")
    assert [r for r in out.anomalies.to_pylist() if r["resource"] == "g"] == []
    assert out.limits.num_rows == 0  # held: neither lifted nor probed
    assert out.state.column("limit_qps").to_pylist() == [40.0] and out.state.column("batch_id").to_pylist() == [1]
    assert out.state.column("probe_from_qps").to_pylist() == [None]
    without = run_final(*inputs(), CFG, NOW, batch_id=1, origin="rate-governor-gold:1")
    lifted, = without.limits.to_pylist()
    assert lifted["action"] == "lift" and lifted["reason"].startswith("[final] the cause is gone")
    assert without.tables()["gold/limits"].schema == out.limits.schema


def test_a_storm_whose_send_backs_fell_back_to_plain_sends_is_limited():
    """Sweep case 209 (``python -m pipelines.sim.sweep --case 209``) through the whole final path: 47.4 msg/s of
    send-backs (under the 50 msg/s floor alone) and 122.5 msg/s of retry traffic on the broker (the plain sends to
    %RETRY%g its busy broker turned them into) against 22.5 msg/s consumed: RUNAWAY_RETRY fires on the traffic rows
    Spark reduced and the group is limited."""
    s, e = win(0)
    groups = table(columns.GOLD_GROUP_TPS, [(s, e, "g", "orders", 22.5, 47.4, 47.4 / 22.5)])
    traffic = table(columns.WINDOW_TRAFFIC, [(s, e, "group", "g", "broker-a", 122.5, 0, False)]
                    + [(s, e, "*", m, None, None, None, None) for m in ("metrics", "traffic")])
    empty = lambda spec: table(spec, [])  # noqa: E731
    out = run_final(FinalInputs(topics=empty(columns.GOLD_TOPIC_TPS), groups=groups,
                                brokers=empty(columns.GOLD_BROKER_TPS), traffic=traffic,
                                topic_history=empty(columns.GOLD_TOPIC_TPS), broker_history=empty(columns.GOLD_BROKER_TPS)),
                    LockedInputs(policy_state=empty(columns.POLICY_STATE), latest_limits=empty(columns.GOLD_LIMITS)),
                    CFG, NOW, batch_id=1, origin="rate-governor-gold:1")
    fired, = out.anomalies.to_pylist()
    assert (fired["resource"], fired["anomaly"], fired["observed_tps"]) == ("g", "RUNAWAY_RETRY", 122.5)
    limit, = out.limits.to_pylist()
    assert (limit["resource_type"], limit["resource"], limit["action"]) == ("group", "g", "set")
    # a retry limit has no lift_at_qps (only a surge limit's probe lifts at a rate)
    assert out.state.column("lift_at_qps").to_pylist() == [None]
