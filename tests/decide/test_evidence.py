"""Demand evidence of limitable resources (pipelines/decide/rules/evidence.py): the brokers' traffic summed, the
carriers' health and writes, a group's consume rate, the limiters' own rejections, the observation grid, and what
the fast path's open windows show so far (the lift veto)."""

from __future__ import annotations

import datetime as dt

import polars as pl
import pyarrow as pa

from pipelines import columns
from pipelines.config import DetectionConfig, WindowsConfig
from pipelines.decide.rules import evidence as ev
from tests.decide.rows import end, frame, win

W, D = WindowsConfig(), DetectionConfig()
T0, T1 = win(0)


def traffic(rows):
    """(resource_type, resource, broker, tps, rejected[, carries]) in window 0."""
    return frame(columns.WINDOW_TRAFFIC, [(T0, T1, *r) if len(r) == 6 else (T0, T1, *r, r[0] == "topic")
                                          for r in rows])


def test_demand_sums_brokers_keeps_the_per_broker_traffic_and_judges_the_carriers_health():
    t = traffic([("topic", "orders", "broker-a", 30.0, 2), ("topic", "orders", "broker-b", 10.0, 0),
                 ("topic", "quiet", "broker-b", 5.0, 0),
                 ("topic", "orders", "broker-c", 0.0, 1)])   # a limiter's rejection on a broker without puts
    brokers = frame(columns.GOLD_BROKER_TPS, [(T0, T1, "broker-a", 40.0, None, 2, 30, 30, {"TIMEOUT_CLEAN_QUEUE": 30}),
                                              (T0, T1, "broker-b", 15.0, None, 2, 0, 0, None)])
    rows = {r["resource"]: r for r in ev.demand(t, brokers, D).to_dicts()}
    assert (rows["orders"]["observed_tps"], rows["orders"]["rejected"]) == (40.0, 3)
    assert ev.broker_tps_of(ev.demand(t, brokers, D))[(T1, "topic", "orders")] == {"broker-a": 30.0, "broker-b": 10.0}
    assert rows["orders"]["healthy"] is False and rows["quiet"]["healthy"] is True   # broker-a is busy (30 >= 10)
    obs = ev.observations(ev.demand(t, brokers, D), {("topic", "orders")})["topic", "orders"][0]
    assert obs.carrier_load == {"broker-a": 40.0, "broker-b": 15.0} and obs.busy_brokers == ("broker-a",)
    assert obs.consume_tps is None


def test_demand_of_a_group_carries_its_consume_rate_on_non_retry_topics():
    """Under a retry limit the rule judges the visible retry traffic against the group's consume rate of the same
    window (tests/decide/test_fold.py): its GROUP_GET_NUMS on non-retry topics, summed over topics and brokers."""
    t = traffic([("group", "g", "broker-a", 24.0, 0)])
    brokers = frame(columns.GOLD_BROKER_TPS, [(T0, T1, "broker-a", 500.0, 900.0, 2, 0, 0, None)])
    groups = frame(columns.GOLD_GROUP_TPS, [(T0, T1, "g", "orders", 300.0, 20.0, 0.07),
                                            (T0, T1, "g", "payments", 100.0, 4.0, 0.04),
                                            (T0, T1, "g", "%RETRY%g", 50.0, 0.0, 0.0)])
    obs = ev.observations(ev.demand(t, brokers, D, groups), {("group", "g")})["group", "g"][0]
    assert (obs.consume_tps, obs.carrier_load) == (400.0, {"broker-a": 900.0})


def test_observations_cover_every_window_of_the_batch_for_every_resource_to_observe():
    t = frame(columns.WINDOW_TRAFFIC, [(*win(0), "group", "g", "broker-a", 40.0, 0, False),
                                       (*win(1), "topic", "other", "broker-a", 5.0, 0, True)])
    brokers = frame(columns.GOLD_BROKER_TPS, [])
    got = ev.observations(ev.demand(t, brokers, D), {("group", "g")}, [end(3)])
    assert [(o.window_end, o.observed_tps, o.rejected, o.healthy) for o in got["group", "g"]] == [
        (end(1).replace(tzinfo=None), 40.0, 0, True), (end(2).replace(tzinfo=None), 0.0, 0, True),
        (end(3).replace(tzinfo=None), 0.0, 0, True)]


def test_limiter_views_are_rejection_evidence_of_the_window_they_fall_in():
    """The RocketMQ admin sink's views report when each limiter last rejected a send: one row per window ×
    resource × broker (no count: ``rejected`` 0, ``carries`` null, which :func:`demand` reports as ``viewed``);
    %RETRY%<group> is the group's retry traffic."""
    seen = T0 + dt.timedelta(minutes=3)
    rejections = frame(columns.LIMITER_REJECTIONS, [
        (seen, "rocketmq", "broker-a", "%RETRY%g", T0 + dt.timedelta(seconds=20), 3),
        (seen, "rocketmq", "broker-a", "%RETRY%g", T0 + dt.timedelta(seconds=50), 4),  # same window and broker: once
        (seen, "rocketmq", "broker-b", "orders", T1 + dt.timedelta(seconds=10), 4),
    ])
    got = sorted(ev.limiter_traffic(rejections, W).rows())
    assert got == [(T0, T1, "group", "g", "broker-a", 0.0, 0, None, None, 1.0),
                   (T1, T1 + dt.timedelta(minutes=1), "topic", "orders", "broker-b", 0.0, 0, None, None, 1.0)]
    carried = traffic([("group", "g", "broker-a", 10.0, 0, False)])
    none = frame(columns.GOLD_BROKER_TPS, [])
    rows = ev.demand(pl.concat([carried, ev.limiter_traffic(rejections, W)], how="vertical_relaxed"), none, D)
    assert sorted(rows.select("resource", "observed_tps", "rejected", "viewed").rows()) == [
        ("g", 10.0, 0, True), ("orders", 0.0, 0, True)]
    assert ev.demand(carried, none, D)["viewed"].to_list() == [False]


OPEN = pa.schema([("window_start", pa.timestamp("us", tz="UTC")), ("window_end", pa.timestamp("us", tz="UTC")),
                  ("resource_type", pa.string()), ("resource", pa.string()), ("rate_limited", pa.int64()),
                  ("broker_amounts", pa.map_(pa.string(), pa.int64())), ("consumed", pa.int64()),
                  ("brokers", pa.list_(pa.string())), ("busy_failures", pa.int64())])


def open_rows(*data):
    """(minute, resource_type, resource, rate_limited, {broker: amount}[, consumed[, census brokers]])"""
    rows = [dict(zip(OPEN.names, (*win(m), rt, r, rl, list(a.items()), *more))) for m, rt, r, rl, a, *more in data]
    return pa.Table.from_pylist(rows, schema=OPEN)


def test_open_windows_show_a_topic_s_puts_and_a_group_s_retry_traffic_with_their_rejections():
    rows = open_rows(
        (0, "topic", "orders", 0, {"broker-a": 1200}),                    # before the horizon: not open
        (1, "topic", "orders", 6, {"broker-a": 1800, "broker-b": 600}),
        (1, "group", "g", 0, {"broker-a": 1200, "broker-b": 300}, 2400),  # send-backs per broker, consumed
        (1, "topic", "%RETRY%g", 4, {"broker-a": 900, "broker-b": 1200}),  # the fallback plain sends
        (1, "broker", "broker-a", 0, {}),
    )
    got = ev.open_evidence(rows, win(1)[0], 60, ["broker-a", "broker-b"])
    assert set(got) == {("topic", "orders"), ("group", "g")}
    orders, = got["topic", "orders"]
    assert (orders.window_end, orders.observed_tps, orders.rejected) == (end(2).replace(tzinfo=None), 40.0, 6)
    group, = got["group", "g"]
    assert (group.observed_tps, group.rejected) == ((1200 + 1200) / 60, 4)   # per broker the larger of the two
    assert (group.consume_tps, group.complete, orders.consume_tps) == (40.0, False, None)  # no census row
    assert ev.open_evidence(None, T0, 60) == {}


def test_an_open_window_names_the_busy_carriers_of_a_resource_so_far():
    """A squeeze's evidence on the fast path's open windows (LimitPolicy.squeeze): a carrier of the group's retry
    traffic with busy_failures_floor busy failures so far is busy; a busy broker not carrying it is not named."""
    rows = open_rows(
        (1, "group", "g", 0, {"broker-a": 600}, 1200),
        (1, "topic", "orders", 0, {"broker-b": 600}),
        (1, "broker", "broker-a", 0, {}, 0, [], DetectionConfig().busy_failures_floor),
        (1, "broker", "broker-b", 0, {}, 0, [], 500),
    )
    got = ev.open_evidence(rows, win(1)[0], 60, ["broker-a", "broker-b"], DetectionConfig())
    group, = got["group", "g"]
    orders, = got["topic", "orders"]
    assert (group.busy_brokers, group.healthy, orders.busy_brokers) == (("broker-a",), False, ("broker-b",))
    quiet = open_rows((1, "group", "g", 0, {"broker-a": 600}, 1200),
                      (1, "broker", "broker-a", 0, {}, 0, [], DetectionConfig().busy_failures_floor - 1))
    calm, = ev.open_evidence(quiet, win(1)[0], 60, ["broker-a"], DetectionConfig())["group", "g"]
    assert (calm.busy_brokers, calm.healthy) == ((), True)
    untold, = ev.open_evidence(rows, win(1)[0], 60, ["broker-a", "broker-b"])["group", "g"]  # without the rule
    assert untold.busy_brokers == ()


def test_an_open_window_is_complete_once_every_broker_of_the_newest_final_window_reported():
    rows = open_rows((1, "group", "g", 0, {"broker-a": 600}, 1200), (1, "cluster", "*", 0, {}, 0, ["broker-a"]))
    partial, = ev.open_evidence(rows, win(1)[0], 60, ["broker-a", "broker-b"])["group", "g"]
    assert not partial.complete and partial.consume_tps == 20.0
    done, = ev.open_evidence(rows, win(1)[0], 60, ["broker-a"])["group", "g"]
    assert done.complete
    gold = frame(columns.GOLD_BROKER_TPS, [(*win(m), b, 0.0, None, 1, 0, 0, None) for m, b in
                                           ((0, "broker-a"), (1, "broker-a"), (1, "broker-b"))]).to_arrow()
    assert ev.expected_brokers(gold) == ["broker-a", "broker-b"] and ev.expected_brokers(None) == []


def test_an_open_window_is_complete_without_a_broker_silent_in_every_open_window_two_minutes_old():
    """The fast path's census (:func:`pipelines.decide.rules.preliminary.waited_for`) in the open evidence the final path
    acts on (a probe, a lift's proof, the veto): broker-c ships behind the watermark and is in no open window; the
    newest window, heard from by broker-a and broker-b, is complete. Heard from two minutes ago, it is waited for."""
    census = lambda m, brokers: (m, "cluster", "*", 0, {}, 0, brokers)  # noqa: E731
    group = lambda m: (m, "group", "g", 0, {"broker-a": 120}, 2400)  # noqa: E731
    silent = open_rows(census(0, ["broker-a", "broker-b"]), census(1, ["broker-a", "broker-b"]),
                       census(2, ["broker-a", "broker-b"]), group(2))
    expected = ["broker-a", "broker-b", "broker-c"]
    g, = ev.open_evidence(silent, win(2)[0], 60, expected)["group", "g"]
    assert g.complete
    heard = open_rows(census(0, expected), census(1, ["broker-a", "broker-b"]), census(2, ["broker-a", "broker-b"]),
                      group(2))
    g, = ev.open_evidence(heard, win(2)[0], 60, expected)["group", "g"]
    assert not g.complete
