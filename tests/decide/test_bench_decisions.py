"""bench/decisions.py renders a cluster's windows with numpy instead of the simulator's per-sum loop: its windowed
sums must be the simulator's, and its tables those the driver's reduction builds from the same sums (no Spark, under
a second)."""

from __future__ import annotations

import datetime as dt
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipelines import rocketmq as rmq
from pipelines.config import GovernorConfig
from pipelines.sim.windows import gold_tables

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import decisions  # noqa: E402

CFG = GovernorConfig()
START = dt.datetime(2026, 11, 26, 8, 0, tzinfo=dt.timezone.utc)


def sums_of(c: decisions.Cluster, w: decisions.Window) -> dict:
    """The windowed sums (window, broker, topic, group, metric) the bench's window stands for."""
    sums: dict = defaultdict(int)
    split = decisions.retry_split(c, w)
    for i, topic in enumerate(c.topics):
        for j, b in enumerate(c.placement[i]):
            sums[(START, c.brokers[b], topic, None, rmq.TOPIC_PUT_NUMS)] += int(w.puts[i, j])
    for g, group in enumerate(c.groups):
        topic, brokers = c.topics[c.group_topic[g]], c.placement[c.group_topic[g]]
        sums[(START, c.brokers[brokers[0]], topic, group, rmq.GROUP_GET_NUMS)] += int(w.consumed[g])
        for j, b in enumerate(brokers):
            sums[(START, c.brokers[b], topic, group, rmq.SNDBCK_PUT_NUMS)] += int(split[g, j])
            sums[(START, c.brokers[b], decisions.retry_topic(group), None, rmq.TOPIC_PUT_NUMS)] += int(split[g, j])
    puts, _ = decisions.broker_puts(c, w)
    for b, broker in enumerate(c.brokers):
        sums[(START, broker, None, None, rmq.BROKER_PUT_NUMS)] += int(puts[b])
    return sums


def rows(table: pa.Table) -> list[tuple]:
    return sorted(tuple(str(v) for v in r.values()) for r in table.to_pylist())


def test_the_bench_tables_are_the_simulators():
    c = decisions.make_cluster(3000, 8, seed=7)
    assert len(c.surging) == decisions.SURGES and len(c.storming) == decisions.STORMS  # both kinds of traffic rows
    w = decisions.window_rates(c, START, np.random.default_rng(1), anomalies=True)
    expected = gold_tables(sums_of(c, w), 60, CFG.detection)
    assert rows(decisions.topic_tps(c, w)) == rows(expected["gold/topic_tps"])
    assert rows(decisions.group_tps(c, w)) == rows(expected["gold/group_tps"])
    assert rows(decisions.broker_tps(c, w)) == rows(expected["gold/broker_tps"])
    assert rows(decisions.traffic(c, w, CFG.detection, set())) == rows(expected["traffic"])


def test_the_bench_collects_the_windowed_sums_its_tables_stand_for():
    c = decisions.make_cluster(3000, 8, seed=7)
    w = decisions.window_rates(c, START, np.random.default_rng(1), anomalies=True)
    collected = decisions.window_metric_rows(c, w).to_pylist()
    assert len(collected) == len({(r["broker"], r["topic"], r["consumer_group"], r["metric"]) for r in collected})
    assert {(r["window_start"], r["broker"], r["topic"], r["consumer_group"], r["metric"]): r["amount"]
            for r in collected} == dict(sums_of(c, w))


def test_the_bench_windows_decide_something():
    result = decisions.run_scale(CFG, 2000, 10, windows=2, history=8, seed=7)
    assert any(result["decided"]), "the mix made no candidate: the bench would time an empty fold"
