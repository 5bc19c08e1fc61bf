"""The gates in front of the rules (pipelines/decide/rules/anomalies.py ``rules_to_run``, pipelines/decide/rules/preliminary.py
``rules_that_may_fire``) only skip work: on random micro-batches near every rule's thresholds, the anomalies with
the gate are exactly those of every rule run."""

from __future__ import annotations

import datetime as dt
import random

import polars as pl
import pytest

from pipelines import columns
from pipelines.config import DetectionConfig, WindowsConfig
from pipelines.decide.rules import preliminary as pre
from pipelines.decide.rules import anomalies as rules
from pipelines.sim.windows import OpenWindows
from tests.decide.rows import frame, win

W, D = WindowsConfig(), DetectionConfig()
BROKERS = ["broker-a", "broker-b", "broker-c"]
TOPICS = ["orders", "pay", "%RETRY%g1", "%RETRY%g2"]
GROUPS = ["g1", "g2"]


def _rows(got: pl.DataFrame) -> list[tuple]:
    return sorted(tuple(r.values()) for r in got.to_dicts())


def _history(r: random.Random, windows: range) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Finalized topic and broker windows around the surge floor (some at 0: a broker's start minute)."""
    value = lambda: r.choice([0.0, r.uniform(5, 30), r.uniform(30, 120)])  # noqa: E731
    topics = [(*win(i), t, value(), 1, 0, 0, None, 0.0, 0, r.choice([None, None, 40.0]))
              for i in windows for t in TOPICS if r.random() < 0.9]
    brokers = [(*win(i), b, value(), r.choice([None, value()]), 2, 0, 0, None) for i in windows for b in BROKERS
               if r.random() < 0.9]
    return frame(columns.GOLD_TOPIC_TPS, topics), frame(columns.GOLD_BROKER_TPS, brokers)


@pytest.mark.parametrize("seed", range(40))
def test_the_final_gate_leaves_out_only_rules_that_would_not_fire(seed):
    r = random.Random(seed)
    n = r.randint(0, 8)
    th, bh = _history(r, range(n))
    batch = range(n, n + r.randint(1, 3))
    rate = lambda: r.choice([0.0, r.uniform(10, 60), r.uniform(60, 600)])  # noqa: E731
    topics = frame(columns.GOLD_TOPIC_TPS, [
        (*win(i), t, rate(), 2, f, r.randint(0, f), None, r.random() * 0.2, r.randint(0, f), None)
        for i in batch for t in TOPICS for f in [r.choice([0, 5, 25, 80])]])
    sent_back = r.choice([lambda: r.uniform(0, 20), lambda: rate() / 2])  # under the floor alone, or not
    groups = frame(columns.GOLD_GROUP_TPS, [(*win(i), g, t, c, x, (x / c if c else None)) for i in batch
                                            for g in GROUPS for t in TOPICS[:2] for c, x in [(rate(), sent_back())]])
    brokers = frame(columns.GOLD_BROKER_TPS, [(*win(i), b, rate(), r.choice([None, rate()]), 2, 0,
                                               r.choice([0, 4, 12, 60]), None) for i in batch for b in BROKERS])
    traffic = {(win(i)[0], g): rate() for i in batch for g in GROUPS if r.random() < 0.5}
    first = win(batch[0])[0]
    gated = rules.detect(topics, groups, brokers, th, bh, W, D, first, retry_traffic=traffic)
    every = rules.detect(topics, groups, brokers, th, bh, W, D, first, rules.ALL_RULES, retry_traffic=traffic)
    assert _rows(gated) == _rows(every)


@pytest.mark.parametrize("seed", range(40))
def test_the_fast_gate_leaves_out_only_rules_that_would_not_fire(seed):
    r = random.Random(1000 + seed)
    n = r.randint(0, 8)
    th, bh = _history(r, range(n))
    events, sent_back = [], r.choice([1_200, 10_000])
    for i in range(n, n + r.randint(1, 3)):
        start = win(i)[0]
        for b in BROKERS:
            if r.random() < 0.8:
                events.append((start, b, None, None, "BROKER_PUT_NUMS", r.randint(0, 40_000)))
            for t in TOPICS:
                events.append((start, b, t, None, "TOPIC_PUT_NUMS", r.choice([0, r.randint(0, 4000), 20_000])))
                events += [(start + dt.timedelta(seconds=r.randint(0, 59)), b, t, None, "failure:" + r.choice(
                    ["TIMEOUT_CLEAN_QUEUE", "RATE_LIMITED", "TIMEOUT"]), 1)] * r.choice([0, 3, 15])
            for g in GROUPS:  # send-backs often under the floor alone: their fallback sends decide
                events.append((start, b, "orders", g, "GROUP_GET_NUMS", r.randint(0, 20_000)))
                events.append((start, b, "orders", g, "SNDBCK_PUT_NUMS", r.choice([0, r.randint(0, sent_back)])))
    open_rows = pl.from_arrow(OpenWindows(60, 120).batch(events))
    expected = r.choice([[], BROKERS[:2], BROKERS])
    gated = pre.preliminary_anomalies(open_rows, th, bh, expected, W, D)
    every = pre.preliminary_anomalies(open_rows, th, bh, expected, W, D, rules=rules.ALL_RULES)
    assert _rows(gated) == _rows(every)
