"""Each rule predicate and derived quantity (pipelines/decide/rules/facts.py) on a few inline rows, as numbers and, where
it takes them, as a polars expression over the same rows (the final path computes on frames, the gates and the
policies on numbers: the two must agree)."""

from __future__ import annotations

import datetime as dt
import math

import polars as pl
import pytest

from pipelines.config import DetectionConfig
from pipelines.decide.rules import facts
from pipelines.decide.words import Severity

D = DetectionConfig()  # retry: ratio 0.5, floor 50; surge: 4x, floor 50; busy: 10; spike: 5 %, 20


def column(expr: pl.Expr, **data) -> list:
    return pl.DataFrame(data).select(expr.alias("out"))["out"].to_list()


def test_rate_is_the_true_quotient():
    rows = [(47119, 60, 785.3166666666667), (0, 60, 0.0), (90, 60.0, 1.5), (1.5, 1, 1.5)]
    assert [facts.rate(a, s) for a, s, _ in rows] == [x for _, _, x in rows]
    with pytest.raises(ZeroDivisionError):
        facts.rate(1, 0)


def test_per_second_divides_each_row_by_its_own_window():
    start = dt.datetime(2026, 1, 5, 6, 0, tzinfo=dt.timezone.utc)
    frame = pl.DataFrame({"window_start": [start] * 3, "window_end": [start + dt.timedelta(seconds=s) for s in
                                                                      (60, 60, 30)], "n": [47119, 6, 6]})
    got = frame.select(facts.per_second(pl.col("n")).alias("tps"))["tps"].to_list()
    assert got == [facts.rate(47119, 60), 0.1, 0.2]
    assert got[0] == 785.3166666666667  # not 47119 × (1/60) = 785.3166666666666


@pytest.mark.parametrize("value, floor, expected", [(50.0, 50.0, True), (50.0 * (1 - 1e-10), 50.0, True),
                                                    (50.0 * (1 - 1e-8), 50.0, False), (0.0, 0.0, True)])
def test_at_floor_allows_only_a_sum_s_rounding(value, floor, expected):
    assert facts.at_floor(value, floor) is expected
    assert column(facts.at_floor(pl.col("v"), floor), v=[value]) == [expected]


SENDS = [(30.0, 122.5, 122.5), (47.4, 0.0, 47.4), (0, 0, 0), (12, 7, 12)]


@pytest.mark.parametrize("sent_back, plain, expected", SENDS)
def test_retry_traffic_is_the_larger_of_send_backs_and_plain_sends(sent_back, plain, expected):
    assert facts.retry_traffic(sent_back, plain) == expected


def test_retry_traffic_as_an_expression_is_the_same():
    sent, plain, expected = zip(*SENDS)
    assert column(facts.retry_traffic(pl.col("s"), pl.col("p")), s=list(map(float, sent)),
                  p=list(map(float, plain))) == list(map(float, expected))


RATIOS = [(785.32, 790.0, 785.32 / 790.0), (60.0, 0.0, None), (0.0, 100.0, 0.0), (1.0, -1.0, None)]


def test_retry_ratio_is_null_with_nothing_consumed():
    assert [facts.retry_ratio(r, c) for r, c, _ in RATIOS] == [x for _, _, x in RATIOS]
    retry, consume, expected = zip(*RATIOS)
    assert column(facts.retry_ratio(pl.col("r"), pl.col("c")), r=list(retry), c=list(consume)) == list(expected)


@pytest.mark.parametrize("retry, consume, floor, expected", [
    (785.32, 790.0, True, True),    # article 001
    (50.0, 100.0, True, True),      # at both thresholds exactly
    (9.0, 10.0, True, False),       # ratio 0.9, under the 50 msg/s floor
    (9.0, 10.0, False, True),       # the same under the group's own limit: the ratio alone
    (60.0, 0.0, True, True),        # nothing consumed: the floor alone
    (40.0, 0.0, False, False),      # nothing consumed under a limit: still the floor
    (60.0, 200.0, True, False),     # at the floor, ratio 0.3
    (None, 10.0, True, False), (60.0, None, True, False),   # no evidence
])
def test_retry_fires(retry, consume, floor, expected):
    assert facts.retry_fires(retry, consume, D, floor=floor) is expected


SURGES = [(800.0, 100.0, True), (399.0, 100.0, False), (49.0, 1.0, False), (200.0, 50.0, True)]


@pytest.mark.parametrize("put, baseline, expected", SURGES)
def test_surge_fires(put, baseline, expected):
    assert bool(facts.surge_fires(put, baseline, D)) is expected


def test_surge_fires_as_an_expression_is_the_same():
    put, baseline, expected = zip(*SURGES)
    assert column(facts.surge_fires(pl.col("p"), pl.col("b"), D), p=list(put), b=list(baseline)) == list(expected)


@pytest.mark.parametrize("busy, expected", [(10, True), (9, False), (60, True), (0, False)])
def test_busy_fires(busy, expected):
    assert facts.busy_fires(busy, D) is expected
    assert column(facts.busy_fires(pl.col("n"), D), n=[busy]) == [expected]


@pytest.mark.parametrize("rate, failures, expected", [(0.05, 20, True), (0.5, 19, False), (0.049, 80, False),
                                                      (1.0, 20, True)])
def test_spike_fires(rate, failures, expected):
    assert bool(facts.spike_fires(rate, failures, D)) is expected
    assert column(facts.spike_fires(pl.col("r"), pl.col("n"), D), r=[rate], n=[failures]) == [expected]


@pytest.mark.parametrize("observed, floor, expected", [(200.0, 50.0, Severity.CRITICAL), (199.9, 50.0, Severity.WARNING),
                                                       (40, 10, Severity.CRITICAL), (0.0, 0.0, Severity.CRITICAL)])
def test_severity(observed, floor, expected):
    assert facts.severity(observed, floor, D) is expected


@pytest.mark.parametrize("a, b, expected", [(40.0, 40.0, True), (40.0 + 4e-8, 40.0, False),
                                            (40.0 + 3e-8, 40.0, True), (0.0, 0.0, True)])
def test_close(a, b, expected):
    assert facts.close(a, b) is expected


def test_shares_of_leaves_out_brokers_without_traffic():
    got = facts.shares_of({"broker-b": 150.0, "broker-a": 450.0, "broker-c": 0.0, "broker-d": math.nan,
                           "": 5.0, "broker-e": None})
    assert got == {"broker-a": 0.75, "broker-b": 0.25} and list(got) == ["broker-a", "broker-b"]
    assert facts.shares_of({"broker-a": 0.0}) == {} and facts.shares_of({}) == {}


@pytest.mark.parametrize("limit, shares, expected", [
    (40.0, {"broker-a": 0.75, "broker-b": 0.25}, {"broker-a": 30.0, "broker-b": 10.0, "*": 10.0}),
    (40.0, {"broker-a": 1.0}, {"broker-a": 40.0, "*": 40.0}),
    (40.0, {}, {}),
    (1.0, {"a": 0.5, "b": 0.3, "c": 0.2}, {"a": 0.5, "b": 0.3, "c": 0.2, "*": 0.2}),
])
def test_split_adds_up_to_the_limit_and_names_the_smallest_share_for_any_other_broker(limit, shares, expected):
    got = facts.split(limit, shares)
    assert got == pytest.approx(expected)
    assert math.isclose(sum(v for b, v in got.items() if b != "*"), limit if shares else 0.0)


@pytest.mark.parametrize("retry, expected", [(50.0, True), (49.99999999995, True), (49.9, False), (785.3, True)])
def test_retry_may_fire_is_the_retry_floor_within_the_tolerance(retry, expected):
    assert facts.retry_may_fire(retry, D) is expected
    assert column(facts.retry_may_fire(pl.col("r"), D), r=[retry]) == [expected]
    assert not (facts.retry_fires(retry, 0.0, D) and not expected)  # a necessary condition of the rule


def test_sendback_acceptance_reads_the_least_refused_share_the_fallback_sends_can_mean():
    """Sweep case 43 (window 06:13): 41.6 msg/s admitted, 18.4 as send-backs, its brokers' throttled busy lines read
    92 % accepted: the fallback sends (1.26x the send-backs) read at least 63 % refused (u + u² + u³ = 1.26).
    Sweep case 71's healthy audit-inventory-consumer (3.3 msg/s admitted, 0.4 as send-backs: 7.25x, more than three
    refused attempts of each can make) reads its brokers' acceptance alone: its fallbacks were admitted elsewhere.
    No fallback, no change; numbers and expressions agree."""
    from pipelines.decide.rules.facts import REFUSED_SHARE_MAX, sendback_acceptance
    storm = sendback_acceptance(0.92, 41.6, 18.4)
    assert storm == pytest.approx(1 - 0.6255, abs=1e-3)
    assert 41.6 / storm >= 50.0
    assert sendback_acceptance(0.92, 3.3, 0.4) == 0.92
    assert sendback_acceptance(0.8, 20.0, 20.0) == 0.8
    assert sendback_acceptance(1.0, 76.0, 20.0) == pytest.approx(1 - REFUSED_SHARE_MAX)  # 2.8x: u ≈ 0.97, capped
    few = sendback_acceptance(0.062, 25.5, 21.7)  # sweep case 118: 3.8 msg/s of fallback sends, at most 17.5 %
    assert few == pytest.approx(1 - 3.8 / 21.7)    # refused, whatever the producers' 0.062 (pulsed, refused more)
    frame = pl.DataFrame({"a": [0.92, 0.92, 0.8, 0.062], "adm": [41.6, 3.3, 20.0, 25.5], "sb": [18.4, 0.4, 20.0, 21.7]})
    got = frame.select(sendback_acceptance(pl.col("a"), pl.col("adm"), pl.col("sb")).alias("x"))["x"].to_list()
    assert got == pytest.approx([storm, 0.92, 0.8, few])


def test_the_float_bisection_of_the_refused_share_gives_the_array_s_bits():
    """``_fallback_refused_one`` (the fast path's one window, plain floats) returns exactly what ``_fallback_refused``
    returns for the same window in an array, NaN where it is NaN: 20,000 drawn windows with the edges (no
    send-back, no fallback, a fallback beyond three refused attempts, a capped share)."""
    import numpy as np
    import random

    rng = random.Random(49)
    pairs = [(20.0, 0.0), (0.0, 20.0), (-3.0, 5.0), (3.0 * 18.4 + 1e-9, 18.4), (76.0 - 20.0, 20.0), (23.2, 18.4)]
    pairs += [(rng.uniform(-5.0, 400.0), rng.choice([0.0, rng.uniform(0.0, 300.0)])) for _ in range(10_000)]
    pairs += [(float(rng.randint(-10, 2000)), float(rng.randint(0, 1500))) for _ in range(10_000)]
    arrays = facts._fallback_refused(np.array([f for f, _s in pairs]), np.array([s for _f, s in pairs]))
    floats = np.array([facts._fallback_refused_one(f, s) for f, s in pairs])
    assert np.isnan(arrays).sum() > 1000 and (~np.isnan(arrays)).sum() > 1000
    assert np.array_equal(arrays, floats, equal_nan=True)


def test_the_refused_attempts_give_the_same_bits_in_an_array_and_in_floats():
    """``_attempts`` uses only operations IEEE 754 rounds once (``+``, ``*``): 100,000 random shares give the same
    bits through numpy's vector loops as one float at a time. Written with ``**``, numpy's SIMD ``pow`` (AVX-512)
    rounds about 5 % of the cubes differently from Python's."""
    import numpy as np

    shares = np.random.default_rng(66).random(100_000)
    arrays = facts._attempts(shares)
    floats = np.array([facts._attempts(u) for u in shares.tolist()])
    assert np.array_equal(arrays, floats)
    assert facts._attempts(0.5) == 0.5 + 0.25 + 0.125


def test_newest_carriers_are_those_of_the_newest_earlier_window_with_a_carrier():
    """The one definition behind ``open_split.topics_heard`` and ``open_retry.groups_heard``: the brokers with the
    resource's traffic in the newest window before the given one (a window without a carrier skipped)."""
    from pipelines.decide.rules.facts import newest_carriers

    t = [dt.datetime(2026, 1, 5, 6, m) for m in range(4)]
    windows = {t[0]: {"broker-a"}, t[1]: {"broker-a", "broker-b"}, t[2]: set()}
    assert newest_carriers(windows, t[3]) == {"broker-a", "broker-b"}
    assert newest_carriers(windows, t[1]) == {"broker-a"}
    assert newest_carriers(windows, t[0]) == frozenset()
    assert newest_carriers({}, t[3]) == frozenset()


def test_crowded_acceptance_is_the_share_a_busy_broker_kept_of_its_other_writes_sweep_case_115():
    """Sweep case 115's broker-a: normal writes 250 msg/s, the surging topic's 127.9 of them; busy at 274.9 msg/s
    with the topic at 233, its other writes 41.9 of 122.1: 0.343. A broker busy with others' load keeps them at or
    above their normal: 1. No normal other writes: 1. Never below MIN_ACCEPTANCE. Numbers and expressions agree."""
    assert facts.crowded_acceptance(274.9, 250.0, 233.0, 127.9) == pytest.approx(41.9 / 122.1)
    assert facts.crowded_acceptance(600.0, 250.0, 233.0, 127.9) == 1.0
    assert facts.crowded_acceptance(274.9, 250.0, 233.0, 250.0) == 1.0
    assert facts.crowded_acceptance(233.0, 250.0, 233.0, 127.9) == facts.MIN_ACCEPTANCE
    frame = pl.DataFrame({"w": [274.9, 600.0], "n": [250.0, 250.0], "p": [233.0, 233.0], "t": [127.9, 127.9]})
    got = frame.select(facts.crowded_acceptance(pl.col("w"), pl.col("n"), pl.col("p"), pl.col("t")))
    assert got.to_series().to_list() == pytest.approx([41.9 / 122.1, 1.0])
