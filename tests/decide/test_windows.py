"""The finalized windowed sums → gold TPS tables and the decisions' traffic, on the driver
(:mod:`pipelines.decide.rules.windows`): sums across brokers, retry ratio, broker TPS, failures per class, the per-broker
traffic of each limitable resource and what of it the decisions keep. Inline Arrow rows, no Spark."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pipelines import columns
from pipelines.config import DetectionConfig
from pipelines.decide.rules.facts import sendback_acceptance
from pipelines.decide.rules.windows import reduce_windows
from tests.decide.rows import table, win

T0, T1 = win(0)


def metrics(rows: list[tuple]) -> pa.Table:
    """(broker, topic, group, metric, amount) in window [T0, T1) → WINDOW_METRIC rows."""
    return table(columns.WINDOW_METRIC, [(T0, T1, *r) for r in rows])


def reduced(rows: list[tuple], limited: tuple[str, ...] = ()) -> dict[str, pa.Table]:
    return reduce_windows(metrics(rows), DetectionConfig(), limited)


def sorted_rows(data: pa.Table, *keys: str) -> list[dict]:
    return sorted(data.to_pylist(), key=lambda r: tuple(str(r[k]) for k in keys))


def test_topic_tps_sums_over_brokers_with_failures():
    got = reduced([
        ("broker-a", "orders", None, "TOPIC_PUT_NUMS", 600),
        ("broker-b", "orders", None, "TOPIC_PUT_NUMS", 1200),
        ("broker-a", "orders", None, "failure:TIMEOUT_CLEAN_QUEUE", 150),
        ("broker-a", "orders", None, "failure:CLIENT_TIMEOUT", 50),
        ("broker-a", "pay", None, "failure:OTHER", 3),
        ("broker-b", "limited", None, "TOPIC_PUT_NUMS", 2400),
        ("broker-b", "limited", None, "failure:RATE_LIMITED", 900),
        ("broker-b", "limited", None, "failure:OTHER", 10),
    ])["gold/topic_tps"]
    assert got.schema == table(columns.GOLD_TOPIC_TPS, []).schema
    want = [(T0, T1, "limited", 40.0, 1, 910, 0, [("OTHER", 10), ("RATE_LIMITED", 900)], 10 / 2410, 900, None),
            (T0, T1, "orders", 30.0, 2, 200, 150, [("CLIENT_TIMEOUT", 50), ("TIMEOUT_CLEAN_QUEUE", 150)], 0.1, 0,
             None),
            (T0, T1, "pay", 0.0, 0, 3, 0, [("OTHER", 3)], 1.0, 0, None)]
    assert sorted_rows(got, "topic") == table(columns.GOLD_TOPIC_TPS, want).to_pylist()


def test_failures_by_class_entries_are_in_class_order_whatever_the_row_order():
    rows = [("broker-a", "orders", None, f"failure:{c}", n) for c, n in (("TIMEOUT_CLEAN_QUEUE", 5),
                                                                        ("CLIENT_TIMEOUT", 1), ("OTHER", 2))]
    for ordered in (rows, rows[::-1]):
        got = reduced(ordered)["gold/topic_tps"].column("failures_by_class")[0].as_py()
        assert [k for k, _ in got] == ["CLIENT_TIMEOUT", "OTHER", "TIMEOUT_CLEAN_QUEUE"]


def test_group_tps_consume_retry_and_ratio():
    got = reduced([
        ("broker-a", "pugc", "g", "GROUP_GET_NUMS", 47400),
        ("broker-b", "pugc", "g", "GROUP_GET_NUMS", 600),
        ("broker-a", "pugc", "g", "SNDBCK_PUT_NUMS", 47119),
        ("broker-a", "other", "g2", "SNDBCK_PUT_NUMS", 60),
        ("broker-a", "pugc", None, "TOPIC_PUT_NUMS", 60),
    ])["gold/group_tps"]
    want = [(T0, T1, "g", "pugc", 800.0, 47119 / 60, 47119 / 48000), (T0, T1, "g2", "other", 0.0, 1.0, None)]
    assert sorted_rows(got, "consumer_group") == table(columns.GOLD_GROUP_TPS, want).to_pylist()


def test_broker_tps_puts_topics_and_busy_failures():
    got = reduced([
        ("broker-a", "orders", None, "TOPIC_PUT_NUMS", 600),
        ("broker-a", "%RETRY%g", None, "TOPIC_PUT_NUMS", 47119),
        ("broker-a", None, None, "BROKER_PUT_NUMS", 47700),
        ("broker-a", "orders", None, "failure:TIMEOUT_CLEAN_QUEUE", 40),
        ("broker-b", "pay", None, "TOPIC_PUT_NUMS", 60),
        ("broker-c", "pay", None, "failure:FLUSH_DISK_TIMEOUT", 2),  # failures only: a row of its own
    ])["gold/broker_tps"]
    want = [(T0, T1, "broker-a", 47719 / 60, 47700 / 60, 2, 40, 40, [("TIMEOUT_CLEAN_QUEUE", 40)]),
            (T0, T1, "broker-b", 1.0, None, 1, 0, 0, None),
            (T0, T1, "broker-c", 0.0, None, 0, 2, 0, [("FLUSH_DISK_TIMEOUT", 2)])]
    assert sorted_rows(got, "broker") == table(columns.GOLD_BROKER_TPS, want).to_pylist()


def test_retry_traffic_is_the_larger_of_send_backs_and_fallback_sends_into_the_same_bucket():
    """Per broker, the limiter keyed %RETRY%g counts send-backs (SNDBCK_PUT_NUMS) and the plain sends a consumer
    falls back to (TOPIC_PUT_NUMS of %RETRY%g, which also carry the re-puts of admitted send-backs): the larger of
    the two; the send-backs alone beside it (what the traffic has beyond them: fallback sends). A topic's traffic is
    its puts; RATE_LIMITED failures are its limiter's rejections; a topic's carriers are the brokers with a put
    line."""
    got = reduced([
        ("broker-a", "%RETRY%g", "g", "SNDBCK_PUT_NUMS", 1200),   # 20 msg/s sent back ...
        ("broker-a", "%RETRY%g", None, "TOPIC_PUT_NUMS", 2400),   # ... 40 msg/s into the retry topic
        ("broker-b", "%RETRY%g", "g", "SNDBCK_PUT_NUMS", 1800),
        ("broker-b", "%RETRY%g", None, "failure:RATE_LIMITED", 7),
        ("broker-a", "orders", None, "TOPIC_PUT_NUMS", 600),
        ("broker-a", "orders", None, "failure:RATE_LIMITED", 3),
        ("broker-c", "orders", None, "failure:RATE_LIMITED", 2),         # rejected there, no put line: no carrier
        ("broker-a", "orders", None, "failure:TIMEOUT_CLEAN_QUEUE", 5),  # the broker's fault, not the limiter's
    ])["traffic"]
    rows = [r for r in sorted_rows(got, "resource_type", "resource", "broker") if r["resource"] in ("g", "orders")]
    busy_a = 600 / 605  # broker-a took 600 producers' puts and refused 5 as busy: the share of its sends it
    # accepted (the retry topic's 2,400 puts left out: their refusals leave no line, sweep case 131)
    # the group's fallback sends, 20 msg/s beside 50 of send-backs over its brokers, read at least 29 % of them
    # refused (u + u² + u³ = 0.4): a group's rows read through that, smaller than broker-a's own acceptance
    sent = sendback_acceptance(1.0, 70.0, 50.0)
    assert sent == pytest.approx(0.709, abs=1e-3)
    want = [(T0, T1, "group", "g", "broker-a", 40.0, 0, False, 20.0, sent),
            (T0, T1, "group", "g", "broker-b", 30.0, 7, False, 30.0, sent),
            (T0, T1, "topic", "orders", "broker-a", 10.0, 3, True, None, busy_a),
            (T0, T1, "topic", "orders", "broker-c", 0.0, 2, False, None, 1.0)]
    assert rows == table(columns.WINDOW_TRAFFIC, want).to_pylist()


def test_a_storm_behind_throttled_busy_lines_is_read_through_its_fallback_sends_sweep_case_43():
    """Sweep case 43 (``python -m pipelines.sim.sweep --case 43``), window 06:13: a shared library's storm sends
    78 msg/s back through brokers b and d, busy with the other storms (they accepted 30 % and 16 % of their sends).
    Their producers' busy lines are throttled (200 per topic, broker and minute), so the brokers read as accepting
    97 % of their sends, and the 41.7 msg/s admitted (18.4 as send-backs, the rest the consumer client's fallback
    plain sends to %RETRY%g) read 43 msg/s sent: under the 50 msg/s floor, dropped, the storm limited a window late
    (157 s after its onset). The fallback sends, 1.27x the send-backs, read at least 63 % of them refused (each
    refused attempt retried: u + u² + u³ = 1.27): the group's rows are kept, read through 37 % accepted, 112 msg/s."""
    got = reduced([
        ("broker-b", "%RETRY%g", "g", "SNDBCK_PUT_NUMS", 702),    # 11.7 msg/s sent back ...
        ("broker-b", "%RETRY%g", None, "TOPIC_PUT_NUMS", 1620),   # ... 27.0 msg/s into the retry topic
        ("broker-d", "%RETRY%g", "g", "SNDBCK_PUT_NUMS", 402),    # 6.7 msg/s
        ("broker-d", "%RETRY%g", None, "TOPIC_PUT_NUMS", 882),    # 14.7 msg/s
        ("broker-b", "orders", None, "TOPIC_PUT_NUMS", 6000),
        ("broker-b", "orders", None, "failure:TIMEOUT_CLEAN_QUEUE", 200),  # throttled: 14,000 refused
        ("broker-d", "orders", None, "TOPIC_PUT_NUMS", 6000),
        ("broker-d", "orders", None, "failure:TIMEOUT_CLEAN_QUEUE", 200),
    ])["traffic"]
    rows = [r for r in got.to_pylist() if r["resource"] == "g"]
    assert sorted((r["broker"], r["tps"], r["sendback_tps"]) for r in rows) == [
        ("broker-b", 27.0, 11.7), ("broker-d", 14.7, 6.7)]
    assert [r["acceptance"] for r in rows] == pytest.approx([0.373, 0.373], abs=1e-3)
    assert sum(r["tps"] / r["acceptance"] for r in rows) >= DetectionConfig().retry_floor_tps


def test_a_groups_few_fallback_sends_bound_the_share_of_its_send_backs_refused_sweep_case_118():
    """Sweep case 118 (``python -m pipelines.sim.sweep --case 118``), window 06:13: search-stream's producers send in
    pulses (issue 49's pulsed producers) and broker-c refuses 94 % of their sends in each pulse (600 puts beside
    9,030 logged busy failures: 0.062 accepted); the steady send-backs of search-payment-consumer, a consumer of it,
    are refused only in the pulses. Its 25.5 msg/s admitted, 21.7 as send-backs, read through 0.062 were 409 msg/s
    sent back: a runaway by the rule, limited, a false limit. Its fallback sends (3.8 msg/s, 0.175 of the
    send-backs) say at most 17.5 % of them were refused (each refused send-back is sent again as a fallback): read
    through at least 0.825, 31 msg/s, under the 50 msg/s floor."""
    events = [
        ("broker-c", "%RETRY%g", "g", "SNDBCK_PUT_NUMS", 1302),   # 21.7 msg/s sent back ...
        ("broker-c", "%RETRY%g", None, "TOPIC_PUT_NUMS", 1530),   # ... 25.5 msg/s into the retry topic
        ("broker-c", "orders", None, "TOPIC_PUT_NUMS", 600),
        ("broker-c", "orders", None, "failure:TIMEOUT_CLEAN_QUEUE", 9030),
    ]
    assert sendback_acceptance(600 / 9630, 25.5, 21.7) == pytest.approx(1 - 3.8 / 21.7)
    assert 25.5 / (1 - 3.8 / 21.7) < DetectionConfig().retry_floor_tps
    # the traffic rows keep a group that may fire (its reading at the floor): this one cannot, so none is kept
    assert [r for r in reduced(events)["traffic"].to_pylist() if r["resource"] == "g"] == []
    # the same window with the send-backs refused as the producers' sends (fallback sends 2.1x the send-backs) is
    # a storm behind the busy broker, read through the producers' 0.062 (the fallback sends: at most 0.17)
    storm = [e if e[3] != "TOPIC_PUT_NUMS" or e[1] != "%RETRY%g" else (*e[:4], 1302 * 3.1) for e in events]
    (row,) = [r for r in reduced(storm)["traffic"].to_pylist() if r["resource"] == "g"]
    assert row["acceptance"] == pytest.approx(600 / 9630)


def test_a_group_under_a_limit_is_read_through_its_brokers_acceptance_alone_sweep_case_13():
    """The rows of case 43's storm, the group under a limit: its fallback sends count its limiter's refusals too
    (the policy reads those, ``RetryStormLimit.refused_share``), so its rows read through the brokers' logged
    acceptance alone (broker-b: 6,000 producers' puts, 200 busy lines: 0.968; broker-d the same; the retry topic's
    puts left out, sweep case 131), as the fast path reads a limited group
    (``open_retry.open_retry_traffic``, sweep case 13: a preliminary refresh there held a squeeze back)."""
    events = [
        ("broker-b", "%RETRY%g", "g", "SNDBCK_PUT_NUMS", 702),
        ("broker-b", "%RETRY%g", None, "TOPIC_PUT_NUMS", 1620),
        ("broker-d", "%RETRY%g", "g", "SNDBCK_PUT_NUMS", 402),
        ("broker-d", "%RETRY%g", None, "TOPIC_PUT_NUMS", 882),
        ("broker-b", "orders", None, "TOPIC_PUT_NUMS", 6000),
        ("broker-b", "orders", None, "failure:TIMEOUT_CLEAN_QUEUE", 200),
        ("broker-d", "orders", None, "TOPIC_PUT_NUMS", 6000),
        ("broker-d", "orders", None, "failure:TIMEOUT_CLEAN_QUEUE", 200),
    ]
    rows = [r for r in reduced(events, limited=("group\x1fg",))["traffic"].to_pylist() if r["resource"] == "g"]
    assert [r["acceptance"] for r in sorted(rows, key=lambda r: r["broker"])] == pytest.approx(
        [6000 / 6200, 6000 / 6200])
    kept = [r for r in reduced(events, limited=("topic\x1fg",))["traffic"].to_pylist() if r["resource"] == "g"]
    assert [r["acceptance"] for r in kept] == pytest.approx([0.373, 0.373], abs=1e-3)  # a topic's key: not g's


def test_the_driver_keeps_the_traffic_of_the_resources_a_decision_can_need():
    """Kept: resources at their rule's floor, rejecting, or under a limit; the rest is dropped. The markers name
    every window of the batch and those with any traffic."""
    got = reduced([
        ("broker-a", "big", None, "TOPIC_PUT_NUMS", 60 * 60),        # 60 msg/s >= surge_floor_tps (50)
        ("broker-a", "small", None, "TOPIC_PUT_NUMS", 60 * 10),      # 10 msg/s: dropped
        ("broker-a", "limited", None, "TOPIC_PUT_NUMS", 60 * 5),     # under a limit: kept
        ("broker-a", "refused", None, "failure:RATE_LIMITED", 1),    # rejecting: kept
        ("broker-a", "%RETRY%g", "g", "SNDBCK_PUT_NUMS", 60 * 49),   # 49 msg/s < retry_floor_tps (50): dropped
        ("broker-b", "split", None, "TOPIC_PUT_NUMS", 60 * 30),      # 30 + 30 msg/s cluster-wide: kept on both
        ("broker-c", "split", None, "TOPIC_PUT_NUMS", 60 * 30),
    ], limited=("topic\x1flimited",))["traffic"]
    assert sorted((r["resource_type"], r["resource"], r["broker"]) for r in got.to_pylist()) == [
        ("*", "metrics", None), ("*", "traffic", None), ("topic", "big", "broker-a"),
        ("topic", "limited", "broker-a"), ("topic", "refused", "broker-a"), ("topic", "split", "broker-b"),
        ("topic", "split", "broker-c")]


def test_a_topic_under_the_floor_on_a_busy_broker_is_kept_for_its_crowding_reading_sweep_case_2708():
    """Issue 49's 5,000-case run, case 2708: live-stream's 365 msg/s on a broker of 200 msg/s capacity, admitted at
    47 msg/s, under the 50 msg/s floor. Read through the writes it crowds out it may reach up to its puts ÷
    MIN_ACCEPTANCE (pipelines.decide.rules.crowding.crowded_reach): its rows on a broker that refused sends as busy are
    kept from 1 msg/s; the same puts on a healthy broker are dropped as before, and so is a topic under 1 msg/s."""
    got = reduced([
        ("broker-c", "live-stream", None, "TOPIC_PUT_NUMS", int(60 * 47.5)),
        ("broker-c", "crumbs", None, "TOPIC_PUT_NUMS", 30),                   # 0.5 msg/s: dropped
        ("broker-c", "live-stream", None, "failure:TIMEOUT_CLEAN_QUEUE", 600),
        ("broker-a", "quiet", None, "TOPIC_PUT_NUMS", int(60 * 47.5)),        # healthy broker: dropped
    ])["traffic"]
    assert sorted((r["resource"], r["broker"]) for r in got.to_pylist() if r["resource_type"] == "topic") == [
        ("live-stream", "broker-c")]


def test_a_window_without_resource_traffic_has_only_its_metrics_marker():
    t2, t3 = win(1)
    data = table(columns.WINDOW_METRIC, [(T0, T1, "broker-a", None, None, "BROKER_PUT_NUMS", 600),
                                         (t2, t3, "broker-a", "orders", None, "TOPIC_PUT_NUMS", 600)])
    marks = [r for r in reduce_windows(data, DetectionConfig())["traffic"].to_pylist() if r["resource_type"] == "*"]
    assert sorted((r["window_start"], r["resource"]) for r in marks) == [
        (T0, "metrics"), (t2, "metrics"), (t2, "traffic")]


@pytest.mark.parametrize("name", ["gold/topic_tps", "gold/group_tps", "gold/broker_tps", "traffic"])
def test_no_windows_give_empty_tables_of_the_right_schema(name):
    spec = {"gold/topic_tps": columns.GOLD_TOPIC_TPS, "gold/group_tps": columns.GOLD_GROUP_TPS,
            "gold/broker_tps": columns.GOLD_BROKER_TPS, "traffic": columns.WINDOW_TRAFFIC}[name]
    got = reduce_windows(table(columns.WINDOW_METRIC, []), DetectionConfig())[name]
    assert got.num_rows == 0 and got.schema == table(spec, []).schema
