"""Broker model (pipelines/sim/broker_model.py): fast failure, token bucket + breaker, limit schedule, offered traffic."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pytest

from pipelines.sim import broker_model as bm
from pipelines.sim.spec import ScenarioSpec
from pipelines.sim.traffic import build_traffic

T0 = pd.Timestamp("2026-11-22T08:00:00Z")
CFG = bm.BrokerModelConfig(capacity_min_tps=1.0)


def offered(rows: list[tuple[int, str, str, str, float, float]]) -> pd.DataFrame:
    """(minute, broker, resource_type, resource, requests_tps, work_per_request) → offered frame."""
    return pd.DataFrame([(T0 + pd.Timedelta(minutes=m), b, t, r, q, w) for m, b, t, r, q, w in rows],
                        columns=list(bm.OFFERED_COLUMNS))


def steady(minutes: int, per_minute: list[tuple[str, str, str, float, float]]) -> pd.DataFrame:
    return offered([(m, *row) for m in range(minutes) for row in per_minute])


def limits(*rows: tuple) -> pd.DataFrame:
    """(window_end minute, resource_type, resource, limit_qps, action, mode, version) → gold/limits rows."""
    return pd.DataFrame([{
        "decided_at": pd.Timestamp("2030-01-01T00:00:00Z"), "window_end": T0 + pd.Timedelta(minutes=w),
        "resource_type": t, "resource": r, "limit_qps": q, "burst": int(np.ceil(q)), "action": a, "mode": mode,
        "expires_at": pd.Timestamp("2030-01-01T00:10:00Z"), "version": v} for w, t, r, q, a, mode, v in rows])


def test_no_rejection_under_capacity():
    off = steady(3, [("b1", "topic", "x", 400.0, 1.0), ("b1", "topic", "y", 500.0, 1.0)])
    out = bm.simulate(off, None, CFG, capacity=pd.Series({"b1": 1000.0}))
    assert out.resources["busy_rejected"].sum() == 0
    assert out.brokers["max_wait_ms"].max() == pytest.approx(0.0)


def test_fast_failure_rejects_every_topic_alike_and_caps_the_wait():
    # 2000 units/s on a 1000 units/s broker: half of what arrives is dropped, for every topic on it
    off = steady(3, [("b1", "topic", "noisy", 1800.0, 1.0), ("b1", "topic", "quiet", 200.0, 1.0),
                     ("b2", "topic", "elsewhere", 100.0, 1.0)])
    out = bm.simulate(off, None, CFG, capacity=pd.Series({"b1": 1000.0, "b2": 1000.0}))
    r = out.resources.groupby("resource")[["offered", "busy_rejected"]].sum()
    share = r["busy_rejected"] / r["offered"]
    assert share["noisy"] == pytest.approx(0.5, abs=0.01)
    assert share["quiet"] == pytest.approx(share["noisy"], abs=1e-9)
    assert share["elsewhere"] == 0
    b1 = out.brokers[out.brokers["broker"] == "b1"]
    assert b1["max_wait_ms"].max() == pytest.approx(CFG.wait_time_ms_in_send_queue)
    assert b1["served_work"].max() <= 1000.0 + 1e-6


def test_token_bucket_with_breaker_admits_about_the_limit_only_while_in_force():
    off = steady(6, [("b1", "group", "g", 100.0, 1.0)])
    sched = bm.limit_schedule(limits((1, "group", "g", 10.0, "set", "enforce", 1),
                                     (3, "group", "g", 10.0, "lift", "enforce", 2)), delay_seconds=0)
    out = bm.simulate(off, sched, CFG, capacity=pd.Series({"b1": 10_000.0}))
    per_min = out.resources.set_index("minute_start")
    admitted = per_min["admitted"].to_numpy() / 60.0
    assert admitted[0] == pytest.approx(100.0)                 # before the limit
    assert 8.0 <= admitted[1] <= 10.5 and 8.0 <= admitted[2] <= 10.5   # breaker: a bit under the rate
    assert admitted[3] == pytest.approx(100.0)                 # lifted
    assert per_min["limited_rejected"].iloc[1] == pytest.approx(6000 - admitted[1] * 60)


def test_schedule_delay_refresh_expiry_advisory():
    rows = limits((10, "group", "g", 30.0, "set", "enforce", 1), (15, "group", "g", 30.0, "set", "enforce", 2),
                  (10, "topic", "t", 5.0, "set", "advisory", 1))
    sched = bm.limit_schedule(rows, delay_seconds=90)
    assert list(sched["resource"]) == ["g", "g"]               # advisory rows are never enforced
    first, second = sched.iloc[0], sched.iloc[1]
    assert first["start"] == T0 + pd.Timedelta(minutes=10, seconds=90)
    assert first["end"] == second["start"]                     # the refresh takes over
    assert second["end"] == second["start"] + pd.Timedelta(minutes=10)   # ttl = expires_at - decided_at


def test_offered_from_storm_stats_charges_the_broker_writes_to_the_send_backs():
    spec = ScenarioSpec(seed=3, start=dt.datetime(2026, 11, 22, 8, 0, tzinfo=dt.timezone.utc), minutes=12,
                        brokers=2, topics=5, groups=3, onset_minute=6)
    traffic = build_traffic(spec)
    stats = traffic[traffic["period"] == "minute"]
    off = bm.offered_from_stats(stats)
    storm = off[(off["minute_start"] == pd.Timestamp(spec.onset) + pd.Timedelta(minutes=2))
                & (off["broker"] == "broker-a")]
    g = storm[storm["resource"] == spec.culprit_group].iloc[0]
    assert g["resource_type"] == "group" and 700 < g["requests_tps"] < 860
    assert 3.5 < g["work_per_request"] < 5.0                    # 225,400 writes/min for ~785 send-backs/s
    total = (storm["requests_tps"] * storm["work_per_request"]).sum() * 60
    broker_put = stats[(stats["stat_name"] == "BROKER_PUT_NUMS") & (stats["broker"] == "broker-a")
                       & (stats["minute_start"] == storm["minute_start"].iloc[0])]["sum"].sum()
    assert total == pytest.approx(broker_put, rel=0.01)


def test_capacity_from_the_first_minutes():
    off = steady(12, [("b1", "topic", "x", 100.0, 1.0)])
    cap = bm.broker_capacity(off, bm.BrokerModelConfig(capacity_factor=3.0, capacity_min_tps=10.0))
    assert cap["b1"] == pytest.approx(300.0)
