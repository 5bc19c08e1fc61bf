"""The limiter's own view in the Spark-free closed loop (issue 48, pipelines/sim/limiter_view.py): the simulated
RocketMQ admin sink reads what the brokers' token buckets rejected, row for row as the real sink's
``control/limiter_rejections``; and a governor that reads it keeps a storm held at its cap with nothing logged
limited while it lasts, and lifts it after its fix."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pytest

from pipelines import columns
from pipelines import rocketmq as rmq
from pipelines.sim.cluster import ClosedLoopCluster
from pipelines.sim.irregular import Irregularity, observation
from pipelines.sim.limiter_view import AdminSinkView
from pipelines.sim.spec import ScenarioSpec

T0 = dt.datetime(2026, 1, 5, 6, 0, tzinfo=dt.timezone.utc)
CAPACITY_A = 80.0  # write units/s: broker-a is busy with the storm limited too


def _tiny_cluster() -> tuple[ClosedLoopCluster, int, int]:
    """Two brokers, a storm from minute 1 on broker-a; broker-a's capacity too small for its load (busy rejections
    of every pair there), broker-b's ample. Returns (cluster, the storm group's pair on broker-a, a topic pair on
    broker-a) with a limit of 20 msg/s on the group's pair from the start, none on the topic."""
    spec = ScenarioSpec(name="persisting_storm", seed=3, start=T0, minutes=4, onset_minute=1, brokers=2, topics=3,
                        groups=2, storm_consume_tps=100.0, storm_sendback_tps=150.0)
    c = ClosedLoopCluster(spec, capacity=pd.Series({"broker-a": CAPACITY_A, "broker-b": 10_000.0}))
    pairs = list(zip(c.pairs["broker"], c.pairs["resource_type"], c.pairs["resource"]))
    group = pairs.index(("broker-a", "group", spec.culprit_group))
    topic = pairs.index(("broker-a", "topic", spec.culprit_topic))
    limit = np.full(len(pairs), np.nan)
    limit[group] = 20.0
    c.set_limits(limit, np.ones(len(pairs)), np.zeros(len(pairs)))
    return c, group, topic


def test_the_admin_sinks_rows_are_the_limiters_own_rejections():
    c, group, topic = _tiny_cluster()
    view = AdminSinkView(c)
    before = np.zeros(len(c.pairs), dtype=np.int64)
    polls = 0
    for second in range(10, 4 * 60 + 1, 10):  # a publish every 10 s; the limit lifted at 3:05
        at = T0 + dt.timedelta(seconds=second)
        if second == 190:
            c.advance_to(at - dt.timedelta(seconds=5))
            c.set_limits(np.full(len(c.pairs), np.nan), np.ones(len(c.pairs)), np.zeros(len(c.pairs)))
        c.advance_to(at)
        rows = view.poll(at, second)
        moved = np.flatnonzero(c.limiter_count > before)
        assert sorted((r[2], r[3]) for r in rows) == sorted(view.keys[i] for i in moved)
        for r in rows:
            i = view.keys.index((r[2], r[3]))
            tick = int(c.limiter_last_tick[i])
            assert r[4] == (T0 + dt.timedelta(seconds=(tick + 0.5) * c.dt)).replace(tzinfo=None)
            assert r[0] == at.replace(tzinfo=None) and r[1] == "rocketmq" and r[5] == second
        before = c.limiter_count.copy()
        polls += bool(rows)
    # the limiter's count is what its bucket rejected (whole sends); only the limited pair has one
    assert c.limiter_count[group] == int(np.floor(c.limiter_rejected[:, group].sum() + 1e-9)) > 0
    assert np.count_nonzero(c.limiter_count) == 1 and polls == 13  # every poll from the onset (1:00) to 3:10
    assert max(r[4] for r in view.rows) < (T0 + dt.timedelta(seconds=185)).replace(tzinfo=None)
    # the busy broker refused the topic's sends too: not the limiter's, no row of them
    assert c.busy_rejected[:, topic].sum() > 0 and c.limiter_count[topic] == 0
    assert {r[3] for r in view.rows} == {rmq.RETRY_TOPIC_PREFIX + "get-pugc-to-ai-consumer"}
    table = view.table(T0 + dt.timedelta(minutes=2), T0 + dt.timedelta(minutes=3))
    assert table.column_names == [n for n, _ in columns.LIMITER_REJECTIONS]
    assert 0 < table.num_rows < len(view.rows)


def test_the_rows_are_those_the_real_sink_set_records():
    from pipelines.writeback.sinks import SinkSet

    c, _, _ = _tiny_cluster()
    view, twin = AdminSinkView(c), AdminSinkView(c)
    sinks = SinkSet([twin], lake_root="")  # the real rows of a sink whose views are the same limiters
    for second in range(15, 3 * 60, 15):
        at = T0 + dt.timedelta(seconds=second)
        c.advance_to(at)
        twin.read()
        assert view.poll(at, second) == sinks.rejection_rows(second, at)


def test_the_sweep_draws_the_view_for_about_a_third_from_its_own_stream():
    viewed = [k for k in range(300) if observation(k)]
    assert 80 <= len(viewed) <= 120 and observation(viewed[0]) == {"limiter_view": True}
    assert observation(1) in ({}, {"limiter_view": True}) and Irregularity().limiter_view is False


@pytest.fixture(scope="module")
def fixed_storm_viewed():
    """The named storm_fixed scenario (a storm held at its cap, fixed at minute 14) with nothing logged, read
    through the limiter's own view."""
    from pipelines.sim.loop import simulate
    from pipelines.sim.settings import build_spec, governor_config, load_backtest_config

    bcfg = load_backtest_config("conf/backtest.toml")
    bcfg = bcfg.model_copy(update={"clients": bcfg.clients.model_copy(update={"rejection_log_share": 0.0})})
    spec = build_spec("storm_fixed", {}, now=dt.datetime(2026, 1, 5, 12, tzinfo=dt.timezone.utc))
    result = simulate(spec, governor_config(bcfg, None, None), bcfg, irregular=Irregularity(limiter_view=True))
    return spec, result


def test_a_storm_at_its_cap_seen_by_the_view_is_held_while_it_lasts_and_lifted_after_its_fix(fixed_storm_viewed):
    spec, result = fixed_storm_viewed
    fix = pd.Timestamp(spec.start_utc + dt.timedelta(minutes=spec.storm_fix_minute))
    rows = result.limits[result.limits["resource"] == spec.culprit_group].sort_values("decided_at", kind="stable")
    decided = pd.to_datetime(rows["decided_at"], utc=True)
    assert all(result.cluster.rejections.busy)  # no RATE_LIMITED line logged: the view is the only evidence
    during = rows[decided < fix]
    assert len(during) and during["action"].iloc[0] == "set"
    assert not during["action"].isin(["lift"]).any() and (during["mode"] == "enforce").all()
    # held exactly at the cap, the final path read the limiter's own view of its rejections
    storm = rows[(pd.to_datetime(rows["window_end"], utc=True) < fix).to_numpy() & (rows["basis"] == "final")]
    assert storm["reason"].str.contains("the limiter's own view reports rejections").any()
    lifts = decided[(rows["action"] == "lift").to_numpy() & (decided >= fix).to_numpy()]
    assert len(lifts) and lifts.iloc[0] <= fix + pd.Timedelta(minutes=8)
    after = rows[decided > lifts.iloc[0]]
    assert not (after["action"] == "set").any()  # not limited again
