"""The fast flow's memory of open windows (pipelines/flows/fast.py ``OpenRows``) as the final path's lift veto
evidence: what the open windows show so far of a limited topic and of a limited group's retry traffic. Arrow only."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

from pipelines.flows.fast import OpenRows

T = dt.datetime(2022, 2, 8, 10, 0, tzinfo=dt.timezone.utc)
ROW = pa.schema([("window_start", pa.timestamp("us", tz="UTC")), ("window_end", pa.timestamp("us", tz="UTC")),
                 ("resource_type", pa.string()), ("resource", pa.string()), ("puts", pa.int64()),
                 ("rate_limited", pa.int64()), ("broker_amounts", pa.map_(pa.string(), pa.int64()))])


def rows(*data):
    """(minute, resource_type, resource, puts, rate_limited, {broker: amount})"""
    out = [(T + dt.timedelta(minutes=m), T + dt.timedelta(minutes=m + 1), rt, r, p, rl, list(a.items()))
           for m, rt, r, p, rl, a in data]
    return pa.Table.from_pylist([dict(zip(ROW.names, x)) for x in out], schema=ROW)


def test_open_windows_show_a_topic_s_puts_and_a_group_s_retry_traffic_with_their_rejections():
    memory = OpenRows()
    memory.rows = rows(
        (0, "topic", "orders", 1200, 0, {"broker-a": 1200}),                 # before the horizon: not open
        (1, "topic", "orders", 2400, 6, {"broker-a": 1800, "broker-b": 600}),
        (1, "group", "g", 0, 0, {"broker-a": 1200, "broker-b": 300}),       # send-backs per broker
        (1, "topic", "%RETRY%g", 2100, 4, {"broker-a": 900, "broker-b": 1200}),  # the fallback plain sends
        (1, "broker", "broker-a", 3000, 0, {}),
    )
    got = memory.evidence(T + dt.timedelta(minutes=1), 60)
    naive = (T + dt.timedelta(minutes=2)).replace(tzinfo=None)
    assert set(got) == {("topic", "orders"), ("group", "g")}
    orders, = got["topic", "orders"]
    assert (orders.window_end, orders.observed_tps, orders.rejected) == (naive, 40.0, 6)
    group, = got["group", "g"]
    assert (group.observed_tps, group.rejected) == ((1200 + 1200) / 60, 4)   # per broker the larger of the two


def test_no_open_rows_no_evidence():
    assert OpenRows().evidence(T, 60) == {}
