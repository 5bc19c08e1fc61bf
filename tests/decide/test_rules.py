"""Each anomaly rule firing and not firing (pipelines/decide/rules/anomalies.py), on inline rows; the baseline's quantile
against Spark's own ``percentile_approx``."""

from __future__ import annotations

import datetime as dt
import random

import polars as pl
import pytest

from pipelines import columns
from pipelines.config import DetectionConfig, WindowsConfig
from pipelines.decide.rules import anomalies as rules
from tests.decide.rows import empty, frame, win

W, D = WindowsConfig(), DetectionConfig()


def groups(rows):
    """(minute, group, topic, consume_tps, retry_tps)"""
    return frame(columns.GOLD_GROUP_TPS, [(*win(i), g, t, c, r, (r / c if c else None)) for i, g, t, c, r in rows])


def fired(rows):
    rows = rows.to_dicts() if isinstance(rows, pl.DataFrame) else rows
    return sorted((r["resource"], r["anomaly"], r["severity"]) for r in rows)


def test_runaway_retry_fires_for_article_storm_not_for_normal_retries():
    g = groups([
        (0, "get-pugc-to-ai-consumer", "pugc-content", 790.0, 785.32),
        (0, "get-pugc-to-ai-consumer", "%RETRY%get-pugc-to-ai-consumer", 700.0, 0.0),
        (0, "steady", "orders", 100.0, 1.0),            # ratio 1%: normal
        (0, "tiny", "pay", 10.0, 9.0),                  # ratio 90% but 9 TPS: under the floor
    ])
    got = rules.runaway_retry(rules.group_retry(g), D)
    assert fired(got) == [("get-pugc-to-ai-consumer", "RUNAWAY_RETRY", "critical")]
    assert got[0]["observed_tps"] == 785.32 and got[0]["baseline_tps"] == 790.0
    assert got[0]["detail"] == ("consumer group get-pugc-to-ai-consumer sent 785.3 msg/s back to "
                                "%RETRY%get-pugc-to-ai-consumer (SNDBCK_PUT_NUMS) against 790.0 msg/s consumed: retry "
                                "ratio 0.99 (rule: ratio >= 0.50 and retry >= 50.0 msg/s)")


def test_group_retry_ignores_consumption_of_the_retry_topic():
    got = rules.group_retry(groups([(0, "g", "t", 100.0, 60.0), (0, "g", "%RETRY%g", 900.0, 0.0)]))
    assert got.select("consumer_group", "consume_tps", "retry_tps", "retry_ratio").rows() == [("g", 100.0, 60.0, 0.6)]


def topic_series(topic, values, limits=None):
    """gold/topic_tps rows of one topic, window i putting values[i] msg/s (``limits[i]``: the limit in force)."""
    limits = limits or [None] * len(values)
    return frame(columns.GOLD_TOPIC_TPS,
                 [(*win(i), topic, v, 1, 0, 0, None, 0.0, 0, q) for i, (v, q) in enumerate(zip(values, limits))])


def surges(current, history):
    got = rules.detect(current, empty(columns.GOLD_GROUP_TPS), empty(columns.GOLD_BROKER_TPS), history,
                       empty(columns.GOLD_BROKER_TPS), W, D)
    return got.filter(pl.col("anomaly") == "TRAFFIC_SURGE")


def test_traffic_surge_fires_against_own_baseline_from_history():
    series = topic_series("orders", [100.0] * 10 + [800.0])
    got = surges(series.filter(pl.col("put_tps") >= 800), series.filter(pl.col("put_tps") < 800))
    assert fired(got) == [("orders", "TRAFFIC_SURGE", "warning")]
    assert got["baseline_tps"].to_list() == [100.0]
    assert got["detail"][0] == ("topic orders put 800.0 msg/s, 8.0x its baseline of 100.0 msg/s (p50 of the previous "
                                "10 windows; rule: >= 4.0x and >= 50.0 msg/s)")


def test_traffic_surge_does_not_fire_on_noise_small_topics_or_without_baseline():
    noisy = topic_series("orders", [100.0, 120.0, 90.0, 110.0, 100.0, 130.0, 150.0])
    small = topic_series("tiny", [1.0] * 6 + [40.0])          # 40x but under the 50 TPS floor
    young = topic_series("new", [100.0, 100.0, 900.0])         # only 2 windows of baseline
    assert fired(surges(pl.concat([noisy, small, young]), empty(columns.GOLD_TOPIC_TPS))) == []


def test_traffic_surge_baseline_computed_within_one_batch():
    got = surges(topic_series("orders", [100.0] * 6 + [900.0]), empty(columns.GOLD_TOPIC_TPS))
    assert got.select("resource", "window_start").rows() == [("orders", win(6)[0])]


def brokers(rows):
    """(broker, put_tps, failures, busy_failures, by_class)"""
    return frame(columns.GOLD_BROKER_TPS, [(*win(0), b, p, None, 3, f, busy, by) for b, p, f, busy, by in rows])


def test_broker_busy_fires_on_busy_failures_only():
    b = brokers([
        ("broker-a", 3750.0, 240, 200, {"TIMEOUT_CLEAN_QUEUE": 200, "CLIENT_TIMEOUT": 40}),
        ("broker-b", 500.0, 50, 0, {"CLIENT_TIMEOUT": 50}),
        ("broker-c", 500.0, 9, 9, {"OVERLOAD": 9}),
    ])
    got = rules.broker_busy(b, W, D)
    assert fired(got) == [("broker-a", "BROKER_BUSY", "critical")]
    assert got[0]["detail"] == ("broker broker-a rejected 200 sends as busy in the window (CLIENT_TIMEOUT: 40, "
                                "TIMEOUT_CLEAN_QUEUE: 200) while writing 3750.0 msg/s (rule: >= 10 busy failures per "
                                "window)")
    assert got[0]["baseline_tps"] == 3750.0


def test_a_busy_broker_s_baseline_is_its_writes_as_a_surge_probe_reads_them():
    """The ``BROKER_BUSY`` baseline is the busy broker's writes (``broker_writes``: its own BROKER_PUT_NUMS when it
    prints one), the figure a surge's first limit is bounded by (``Candidate.busy_load``, sweep cases 66 and 186) and
    a probe reads as the carrier's load: one definition of a carrier's writes."""
    b = frame(columns.GOLD_BROKER_TPS, [(*win(0), "broker-a", 700.0, 757.0, 3, 200, 200, {"TIMEOUT_CLEAN_QUEUE": 200}),
                                        (*win(0), "broker-b", 300.0, None, 3, 200, 200, {"TIMEOUT_CLEAN_QUEUE": 200})])
    got = rules.broker_busy(b, W, D)
    assert [(r["resource"], r["baseline_tps"]) for r in got] == [("broker-a", 757.0), ("broker-b", 300.0)]


def test_failure_spike_needs_rate_and_count():
    t = frame(columns.GOLD_TOPIC_TPS, [
        (*win(0), "orders", 100.0, 1, 600, 600, {"TIMEOUT_CLEAN_QUEUE": 600}, 600 / 6600, 0, None),
        (*win(0), "pay", 1.0, 1, 10, 0, {"OTHER": 10}, 10 / 70, 0, None),           # rate high, count low
        (*win(0), "big", 10000.0, 1, 100, 0, {"OTHER": 100}, 100 / 600100, 0, None),  # count high, rate low
        # a limited topic's own rejections are its demand at the cap, not a failure spike
        (*win(0), "limited", 40.0, 2, 6000, 0, {"RATE_LIMITED": 6000}, 0.0, 6000, 40.0)])
    assert fired(rules.failure_spike(t, W, D)) == [("orders", "FAILURE_SPIKE", "critical")]


def test_windows_under_a_limit_are_kept_out_of_the_surge_baseline():
    """A topic capped at 200 msg/s for 20 windows: a baseline fed with the cap (200) would make 700 msg/s only
    3.5x; the windows under the limit are left out, so the baseline stays the pre-limit 100 msg/s."""
    series = topic_series("orders", [100.0] * 10 + [200.0] * 20 + [700.0], [None] * 10 + [200.0] * 20 + [None])
    history, current = series.filter(pl.col("put_tps") < 700), series.filter(pl.col("put_tps") >= 700)
    assert surges(current, history).select("resource", "baseline_tps").rows() == [("orders", 100.0)]
    assert fired(surges(current, history.with_columns(pl.lit(None, pl.Float64).alias("limit_qps")))) == []


def test_surge_baseline_is_the_median_not_the_mean_or_the_max():
    spiky = topic_series("spiky", [100.0] * 6 + [1000.0] * 4 + [500.0])   # median 100, mean 460, max 1000
    dippy = topic_series("dippy", [10.0] * 4 + [100.0] * 6 + [350.0])     # median 100, mean 64
    series = pl.concat([spiky, dippy])
    last = win(10)[0]
    got = surges(series.filter(pl.col("window_start") == last), series.filter(pl.col("window_start") < last))
    assert got.select("resource", "baseline_tps").rows() == [("spiky", 100.0)]


def test_a_broker_baseline_prefers_its_own_broker_put_nums():
    """Article 001: a broker's writes rose 8x while the topics it prints stayed flat: the broker's surge is measured
    on its own BROKER_PUT_NUMS; a broker that prints none falls back to the sum of its topics."""
    def broker_rows(broker, topic_sum, own):
        return [(*win(i), broker, t, o, 3, 0, 0, None) for i, (t, o) in enumerate(zip(topic_sum, own))]
    every = frame(columns.GOLD_BROKER_TPS, broker_rows("broker-a", [100.0] * 11, [100.0] * 10 + [800.0])
                  + broker_rows("broker-b", [100.0] * 10 + [800.0], [None] * 11))
    last = win(10)[0]
    got = rules.detect(empty(columns.GOLD_TOPIC_TPS), empty(columns.GOLD_GROUP_TPS),
                       every.filter(pl.col("window_start") == last), empty(columns.GOLD_TOPIC_TPS),
                       every.filter(pl.col("window_start") < last), W, D)
    surged = got.filter(pl.col("anomaly") == "TRAFFIC_SURGE").select("resource", "observed_tps", "baseline_tps")
    assert sorted(surged.rows()) == [("broker-a", 800.0, 100.0), ("broker-b", 800.0, 100.0)]


@pytest.mark.parametrize("seed", range(3))
def test_the_baseline_quantile_is_spark_s_percentile_approx(spark, seed):
    """Windows of 1-40 random values (ties included) per resource and quantiles 0.1-0.9: the baseline equals
    Spark's ``percentile_approx`` over the same frame, and its window count Spark's ``count``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    rng = random.Random(seed)
    rows = []
    for k in range(12):
        n = rng.randint(1, 40)
        rows += [(win(i)[0], f"t{k}", float(rng.choice([rng.randint(0, 9), rng.random() * 1000])))
                 for i in range(n)]
    q = rng.choice([0.1, 0.25, 0.5, 0.75, 0.9])
    cfg = DetectionConfig(baseline_quantile=q, baseline_windows=30, baseline_min_windows=1)
    values = pl.DataFrame(rows, schema={"window_start": pl.Datetime("us", "UTC"), "topic": pl.String,
                                        "value": pl.Float64}, orient="row")
    ours = rules.baselines(values, "topic", win(0)[0], W, cfg).sort("topic", "window_start")
    df = spark.createDataFrame(rows, "window_start timestamp, topic string, value double")
    frame_ = Window.partitionBy("topic").orderBy(F.col("window_start").cast("long")).rangeBetween(-1800, -1)
    theirs = df.select("window_start", "topic", F.percentile_approx("value", q).over(frame_).alias("b"),
                       F.count("value").over(frame_).alias("n")).orderBy("topic", "window_start").collect()
    assert [(r["b"], r["n"]) for r in theirs] == list(zip(ours["baseline_tps"].to_list(),
                                                         ours["baseline_windows"].to_list()))


@pytest.mark.parametrize("seed", range(3))
def test_a_baseline_only_for_the_rows_at_the_floor_is_the_same_baseline(seed):
    """``at_least`` (the surge floor) leaves out the current rows under it, never a value of the windows before: the
    rows kept have the baselines they have without it, and a row under the floor (which cannot fire) has none."""
    rng = random.Random(seed)
    rows = [(win(i)[0], f"t{k}", float(rng.choice([rng.randint(0, 99), rng.random() * 100])))
            for k in range(8) for i in range(rng.randint(25, 40))]
    cfg = DetectionConfig(baseline_windows=30, baseline_min_windows=1)
    values = pl.DataFrame(rows, schema={"window_start": pl.Datetime("us", "UTC"), "topic": pl.String,
                                        "value": pl.Float64}, orient="row")
    everything = rules.baselines(values, "topic", win(20)[0], W, cfg)
    floored = rules.baselines(values, "topic", win(20)[0], W, cfg, at_least=50.0)
    at_floor = values.filter((pl.col("window_start") >= win(20)[0]) & (pl.col("value") >= 50.0))
    assert 0 < floored.height == at_floor.height < everything.height
    key = ["window_start", "topic"]
    assert floored.sort(key).rows() == everything.join(at_floor.select(key), on=key, how="semi").sort(key).rows()


def test_runaway_retry_counts_the_plain_sends_a_busy_broker_turned_its_send_backs_into():
    """Sweep case 209 (``python -m pipelines.sim.sweep --case 209``): a storm whose own writes made its broker busy;
    the broker fast-failed most send-backs, the consumer sent them to %RETRY%g as plain sends instead, and the
    send-backs alone (47.4 msg/s) stayed under the 50 msg/s floor: the storm was never limited. Its retry traffic
    is per broker the larger of the two (122.5 msg/s), as the limit's own demand evidence counts it."""
    g = groups([(0, "g", "orders", 22.5, 47.4)])
    assert rules.runaway_retry(rules.group_retry(g), D) == []
    traffic = {(win(0)[0], "g"): 122.5}
    got = rules.runaway_retry(rules.with_retry_traffic(rules.group_retry(g), traffic), D)
    assert fired(got) == [("g", "RUNAWAY_RETRY", "warning")]
    assert got[0]["observed_tps"] == 122.5 and got[0]["baseline_tps"] == 22.5
    assert "sent 122.5 msg/s back to %RETRY%g (47.4 msg/s as SNDBCK_PUT_NUMS, the rest as the plain sends" \
        in got[0]["detail"]
    none = empty(columns.GOLD_TOPIC_TPS), empty(columns.GOLD_BROKER_TPS)
    first = win(0)[0]
    assert fired(rules.detect(none[0], g, none[1], *none, W, D, first, retry_traffic=traffic)) == [
        ("g", "RUNAWAY_RETRY", "warning")]
    assert fired(rules.detect(none[0], g, none[1], *none, W, D, first)) == []
    # send-backs at or above the plain sends: the rule's text is the send-backs' as before
    same = rules.runaway_retry(rules.with_retry_traffic(rules.group_retry(groups([(0, "g", "t", 100.0, 60.0)])),
                                                        {(win(0)[0], "g"): 60.0}), D)
    assert "(SNDBCK_PUT_NUMS) against 100.0 msg/s" in same[0]["detail"]


def test_the_fast_path_counts_the_plain_sends_too():
    """The same storm on an open window complete by census (the open rows as the simulator models Spark's running
    sums, pipelines/sim/windows.py). Its fallback sends, 75.1 msg/s beside 47.4 of send-backs (1.58x), read at least
    71 % of the send-backs refused (:func:`pipelines.decide.rules.facts.sendback_acceptance`): 122.5 msg/s admitted read
    as 427.0 sent."""
    from pipelines.decide.rules import preliminary as pre
    from pipelines.sim.windows import OpenWindows

    start = win(0)[0]
    events = [(start, "broker-a", "orders", "g", "GROUP_GET_NUMS", int(22.5 * 60)),
              (start, "broker-a", "orders", "g", "SNDBCK_PUT_NUMS", int(47.4 * 60)),
              (start, "broker-a", "%RETRY%g", None, "TOPIC_PUT_NUMS", int(122.5 * 60))]
    rows = pl.from_arrow(OpenWindows(60, 120).batch(events))
    history = empty(columns.GOLD_TOPIC_TPS), empty(columns.GOLD_BROKER_TPS)
    got = pre.preliminary_anomalies(rows, *history, ["broker-a"], W, D)
    assert [(r["resource"], round(r["observed_tps"], 1)) for r in got.to_dicts()] == [("g", 427.0)]
    assert pre.preliminary_anomalies(rows, *history, ["broker-a", "broker-b"], W, D).height == 0  # census


def test_the_fast_path_reads_the_fallback_sends_only_on_a_window_complete_by_census_sweep_case_44():
    """Sweep case 44: a storm's first open window heard from one of its two brokers so far. Its fallback sends land
    on any broker of %RETRY%g, so their ratio to the send-backs is a figure of all of them: read on broker-a's line
    alone (135.5 msg/s, not the 99.4 both brokers read 10 s later) it decided a limit whose unheard carrier got the
    whole figure (``*``), 1.4x the target for three minutes. Before the census the open window reads its brokers'
    logged acceptance alone (nothing logged: what was admitted); complete, the fallback sends too."""
    from pipelines.decide.rules import preliminary as pre
    from pipelines.sim.windows import OpenWindows

    start = win(0)[0]
    events = [(start, "broker-a", "orders", "g", "SNDBCK_PUT_NUMS", int(47.4 * 60)),
              (start, "broker-a", "%RETRY%g", None, "TOPIC_PUT_NUMS", int(122.5 * 60))]
    rows = pl.from_arrow(OpenWindows(60, 120).batch(events))
    window = rows["window_start"][0]
    key = (window, "g")
    from pipelines.decide.arrow import micros
    partial, admitted = pre.open_retry_traffic(rows, [micros(window)], 60)
    assert round(partial[key], 1) == round(admitted[key], 1) == 122.5
    complete, _ = pre.open_retry_traffic(rows, [micros(window)], 60, {window})
    assert round(complete[key], 1) == 427.0


def test_the_fast_path_does_not_read_a_limited_group_through_its_fallback_sends_sweep_case_13():
    """Sweep case 13 (cold start): a storm limited to 23.8 msg/s, its open window 06:07 complete by census: 13.8
    msg/s admitted, 4.8 as send-backs (the rest the client's fallback sends, 1.9x: at least 78 % refused). Read
    through them the window fired again (63.5 msg/s sent) and the fast path refreshed the limit on that window; the
    final path's squeeze decided a batch later on the older window 06:05 ranked below that refresh by version, and
    was held back two minutes (bystanders 1.21 % of before, 0.45 % without). Under a limit in the saved state
    (``limited``, the final path's keys) a group's fallback sends count the limiter's refusals too: the fast path
    reads it through its brokers' logged acceptance alone (nothing logged: what was admitted), under the floor."""
    from pipelines.decide.rules import preliminary as pre
    from pipelines.sim.windows import OpenWindows

    start = win(0)[0]
    events = [(start, "broker-a", "orders", "g", "GROUP_GET_NUMS", int(20.4 * 60)),
              (start, "broker-a", "orders", "g", "SNDBCK_PUT_NUMS", int(4.8 * 60)),
              (start, "broker-a", "%RETRY%g", None, "TOPIC_PUT_NUMS", int(13.8 * 60))]
    rows = pl.from_arrow(OpenWindows(60, 120).batch(events))
    history = empty(columns.GOLD_TOPIC_TPS), empty(columns.GOLD_BROKER_TPS)
    got = pre.preliminary_anomalies(rows, *history, ["broker-a"], W, D)
    assert [(r["resource"], round(r["observed_tps"], 1)) for r in got.to_dicts()] == [("g", 63.5)]
    limited = ("group\x1fg", "topic\x1forders")
    assert pre.preliminary_anomalies(rows, *history, ["broker-a"], W, D, limited=limited).height == 0
    assert pre.preliminary_anomalies(rows, *history, ["broker-a"], W, D, limited=("topic\x1fg",)).height == 1
    assert pre.limited_groups(limited) == {"g"}
    from pipelines.decide.arrow import micros
    window = rows["window_start"][0]
    read, _ = pre.open_retry_traffic(rows, [micros(window)], 60, {window}, pre.limited_groups(limited))
    assert round(read[window, "g"], 1) == 13.8  # the gate (rules_that_may_fire) and the reading agree


def test_the_fast_path_reads_the_fallback_sends_before_the_census_once_the_group_s_carriers_reported_sweep_case_148():
    """Sweep case 148: two storms on broker-a alone (cache-comment-consumer, cache-video-consumer) fire on their
    fallback sends in the window ending 06:13, but the census waited for broker-d's stats, 27 s late, which carries
    neither: limited at 06:13:32, 102 s after onset. A window not complete by census reads a group's fallback sends
    once every broker that carried it in the earlier open window has reported (``groups_heard``); a group whose
    earlier carriers have not all reported (case 44: the second broker unheard) still waits for the census."""
    from pipelines.decide.rules import preliminary as pre
    from pipelines.decide.arrow import micros
    from pipelines.sim.windows import OpenWindows

    first, second = win(0)[0], win(1)[0]

    def storm(start, broker, share=1.0):
        return [(start, broker, "orders", "g", "SNDBCK_PUT_NUMS", int(47.4 * 60 * share)),
                (start, broker, "%RETRY%g", None, "TOPIC_PUT_NUMS", int(122.5 * 60 * share))]

    def read(earlier_brokers):
        opened = OpenWindows(60, 120)
        earlier = pl.from_arrow(opened.batch([e for b in earlier_brokers for e in storm(first, b, 0.5)]))
        rows = pl.from_arrow(opened.batch(storm(second, "broker-a")))
        window = rows.filter(pl.col("resource_type") == "group")["window_start"][0]
        census = {r["window_start"]: r["brokers"] for r in rows.filter(pl.col("resource_type") == "cluster")
                  .iter_rows(named=True)}
        heard = pre.groups_heard(rows, earlier, census)
        traffic, _ = pre.open_retry_traffic(rows, [micros(window)], 60, set(), frozenset(), heard)
        return heard, round(traffic[window, "g"], 1)

    heard, got = read(["broker-a"])
    assert list(heard.values()) == [frozenset({"g"})] and got == 427.0
    assert read(["broker-a", "broker-b"]) == ({}, 122.5)   # broker-b carried it and has not reported
    assert pre.groups_heard(pl.from_arrow(OpenWindows(60, 120).batch(storm(second, "broker-a"))), None,
                            {second: ["broker-a"]}) == {}   # nothing earlier: the census decides


def test_the_fast_path_s_rates_are_the_true_quotient_as_the_final_path_s():
    """An open window's rate is its amount divided by the window's length as Spark and the final path divide
    (facts.per_second): a busy broker that put 47119 messages in 60 s wrote 785.3166666666667 msg/s, where polars'
    division of a column of two or more rows by the literal 60 gives 785.3166666666666 (the reciprocal's product)."""
    from pipelines.decide.rules import preliminary as pre
    from pipelines.sim.windows import OpenWindows

    start = win(0)[0]
    busy = D.busy_failures_floor
    events = [(start, "broker-a", "orders", None, "TOPIC_PUT_NUMS", 47119),
              (start, "broker-b", "orders", None, "TOPIC_PUT_NUMS", 600),
              (start, "broker-a", "orders", None, "failure:TIMEOUT_CLEAN_QUEUE", busy)]
    rows = pl.from_arrow(OpenWindows(60, 120).batch(events))
    history = empty(columns.GOLD_TOPIC_TPS), empty(columns.GOLD_BROKER_TPS)
    got = pre.preliminary_anomalies(rows, *history, ["broker-a", "broker-b"], W, D).to_dicts()
    assert [(r["anomaly"], r["resource"], r["baseline_tps"]) for r in got] == [("BROKER_BUSY", "broker-a", 47119 / 60)]
    assert 47119 / 60 != pl.DataFrame({"n": [47119, 600]}).select(pl.col("n") / 60)["n"][0]  # one ulp off


def test_a_retry_limit_is_based_on_the_group_s_normal_consume_rate_when_the_storm_depressed_it():
    """A storm's busy broker refuses the puts its group would consume: in its first window the group consumes 170
    msg/s instead of its normal 400 (the median of its previous windows), and 10 % of 170 would hold a fixed
    consumer's legitimate retries over the limit. The anomaly's baseline (the basis of a limit) is the larger of
    the two; without history, or when the window's is larger, it is the window's."""
    history = groups([(i, "g", "orders", 400.0 + i, 2.0) for i in range(6)] + [(5, "other", "x", 50.0, 0.0)])
    now = groups([(6, "g", "orders", 170.0, 390.0)])
    retries = rules.group_retry(now)
    basis = rules.consume_basis(retries, history, win(6)[0], W, D)
    assert basis == {(win(6)[0], "g"): (402.0, 6)}                     # p50 of 400..405 at rank ceil(0.5 x 6)
    got, = rules.runaway_retry(retries, D, basis)
    assert got["baseline_tps"] == 402.0 and got["detail"].endswith(
        "; its normal consume rate 402.0 msg/s (p50 of the previous 6 windows) is the basis of a limit")
    assert "against 170.0 msg/s consumed: retry ratio 2.29" in got["detail"]
    assert rules.runaway_retry(retries, D)[0]["baseline_tps"] == 170.0
    assert rules.consume_basis(retries, None, win(6)[0], W, D) == {}
    in_batch = rules.group_retry(groups([(i, "g", "orders", 400.0 + i, 2.0) for i in range(6)]
                                        + [(6, "g", "orders", 170.0, 390.0)]))
    assert rules.consume_basis(in_batch, None, win(0)[0], W, D) == basis   # a backlog: its own earlier windows
    read = []
    lazily = lambda: read.append(1) or history  # noqa: E731  (read only when a storm fires)
    assert rules.consume_basis(rules.group_retry(groups([(6, "g", "orders", 400.0, 2.0)])), lazily, win(6)[0], W,
                               D) == {} and read == []
    detected = rules.detect(empty(columns.GOLD_TOPIC_TPS), now, empty(columns.GOLD_BROKER_TPS),
                            empty(columns.GOLD_TOPIC_TPS), empty(columns.GOLD_BROKER_TPS), W, D,
                            first_window=win(6)[0], group_history=lazily)
    assert detected["baseline_tps"].to_list() == [402.0] and read == [1]


def test_windows_a_busy_broker_capped_are_kept_out_of_a_topic_s_surge_baseline():
    """Sweep case 57: while a storm made its broker busy, a topic's puts were fast-failed down to a third; a
    baseline fed with those windows makes the topic's recovery a surge. Windows with busy_failures_floor busy
    failures of the topic are left out, as limited windows are: 10 normal windows at 60 msg/s and 10 busy ones at
    20, then 200 msg/s is no surge (3.3x its baseline of 60), where the busy windows would have made it one."""
    normal = [(i, 60.0, 0) for i in range(10)]
    busy = [(i, 20.0, 200) for i in range(10, 20)]
    rows = frame(columns.GOLD_TOPIC_TPS, [(*win(i), "t", put, 1, b, b, None, 0.0, 0) for i, put, b in normal + busy])
    history = rows.with_columns(pl.lit(None, pl.Float64).alias("limit_qps"))
    now = frame(columns.GOLD_TOPIC_TPS, [(*win(20), "t", 200.0, 1, 0, 0, None, 0.0, 0)])
    assert rules.unlimited(history, D).height == 10 and rules.unlimited(history).height == 20
    assert fired(surges(now, history)) == []
    unmarked = history.with_columns(pl.lit(0).cast(pl.Int64).alias("busy_failures"))  # the same puts, not busy
    assert fired(surges(now, unmarked)) == [("t", "TRAFFIC_SURGE", "warning")]      # baseline 20: 10x


def test_a_topic_refused_as_busy_surges_at_the_busy_factor():
    """Sweep case 6: a topic surged 4.0x on a busy broker, which admitted 3.3x its baseline and fast-failed the rest
    with a tenth of its refusals logged, so 4x never fired. Where the topic's own sends were refused as busy (at
    ``busy_failures_floor``), TRAFFIC_SURGE fires at ``busy_surge_factor`` (2.5x); the same puts without busy
    refusals need ``surge_factor`` (4x); 2.4x refused as busy does not fire. The gate (``rules_to_run``) agrees."""
    history = topic_series("t", [60.0] * 10)

    def now(put, busy):
        return frame(columns.GOLD_TOPIC_TPS, [(*win(10), "t", put, 1, busy, busy, None, 0.0, 0)])

    assert D.busy_surge_factor == 2.5 < D.surge_factor
    got = surges(now(200.0, 300), history)
    assert fired(got) == [("t", "TRAFFIC_SURGE", "warning")]
    assert "(its sends refused as busy: 300 in the window), 3.3x its baseline" in got["detail"][0]
    assert "rule: >= 2.5x on a busy broker" in got["detail"][0]
    assert fired(surges(now(200.0, 0), history)) == []                      # 3.3x, not busy: under 4x
    assert fired(surges(now(144.0, 300), history)) == []                    # 2.4x, busy: under 2.5x
    gate = [rules.rules_to_run(now(put, busy), empty(columns.GOLD_GROUP_TPS), empty(columns.GOLD_BROKER_TPS),
                               history, empty(columns.GOLD_BROKER_TPS), D) for put, busy in ((200.0, 300), (200.0, 0))]
    assert rules.Rule.TOPIC_SURGE in gate[0] and rules.Rule.TOPIC_SURGE not in gate[1]


def test_sweep_case_115_a_surge_its_busy_carriers_cap_is_read_through_the_writes_it_crowds_out():
    """Sweep case 115: pugc-content (236 msg/s over broker-a and broker-b) surged 4.4x on carriers with 1.1x
    headroom; they wrote it at 1.8x (233 + 198 msg/s), never the 2.5x busy factor, and its 398 busy lines were the
    clients' log throttle, as every bystander's. Never limited. A busy broker refuses every sender alike, so the
    other writes it kept (42 of 122 msg/s on broker-a, 2 of 74 on broker-b) are the share the topic kept of its
    own: read through them it sent about 15x its baseline, and TRAFFIC_SURGE fires at ``surge_factor``. The same
    topic at 1.8x on brokers busy with another resource's load (their other writes above their normal) reads
    nothing through: no anomaly. The gate runs the rule on a busy broker once the per-broker puts are given."""
    history = topic_series("pugc-content", [236.0] * 10)
    normal = frame(columns.GOLD_BROKER_TPS, [(*win(i), b, w, None, 4, 0, 0, None)
                                             for i in range(10) for b, w in (("broker-a", 250.0), ("broker-b", 182.0))])
    now = frame(columns.GOLD_TOPIC_TPS, [(*win(10), "pugc-content", 431.0, 2, 398, 398, None, 0.0, 0)])
    per_broker = pl.DataFrame({"window_start": [win(10)[0]] * 2, "topic": ["pugc-content"] * 2,
                               "broker": ["broker-a", "broker-b"], "tps": [233.0, 198.0]},
                              schema_overrides={"window_start": pl.Datetime("us", "UTC")})

    def brokers(a, b):
        return frame(columns.GOLD_BROKER_TPS, [(*win(10), "broker-a", a, None, 4, 600, 600, None),
                                               (*win(10), "broker-b", b, None, 4, 600, 600, None)])

    def detect(broker_rows, topic_brokers):
        got = rules.detect(now, empty(columns.GOLD_GROUP_TPS), broker_rows, history, normal, W, D,
                           topic_brokers=topic_brokers)
        return got.filter(pl.col("anomaly") == "TRAFFIC_SURGE")

    crowded = detect(brokers(274.9, 200.0), per_broker)
    assert fired(crowded) == [("pugc-content", "TRAFFIC_SURGE", "critical")]
    assert "read through the brokers it crowds" in crowded["detail"][0] and "rule: >= 4.0x" in crowded["detail"][0]
    assert fired(detect(brokers(274.9, 200.0), None)) == []          # 1.8x on its own: under the busy 2.5x
    assert fired(detect(brokers(600.0, 400.0), per_broker)) == []    # busy with others' load: nothing read through
    gate = rules.rules_to_run(now, empty(columns.GOLD_GROUP_TPS), brokers(274.9, 200.0), history, normal, D,
                              topic_brokers=per_broker)
    assert rules.Rule.TOPIC_SURGE in gate


def test_a_surge_its_crushed_broker_admits_under_the_floor_is_read_through_sweep_case_2708():
    """Issue 49's 5,000-case run, case 2708: live-stream (3 msg/s) surged to 365 msg/s on a broker of 200 msg/s
    capacity, which admitted 47.5 msg/s of it: 15.8x its baseline, but under the 50 msg/s floor, so the rule never
    ran on it, and a flash sale on the same broker was limited in its place. The floor is of the demand the rule
    reads: read through the other writes the broker kept (12.5 of 17 msg/s) it sent 64.6 msg/s and fires. Without
    the per-broker puts, its 600 busy lines (at most 3 attempts a message) add at least 3.3 msg/s: 50.8 msg/s, at
    the floor; without a busy broker 47.5 msg/s stays under it."""
    history = topic_series("live-stream", [3.0] * 10)
    normal = frame(columns.GOLD_BROKER_TPS, [(*win(i), "broker-c", 20.0, None, 4, 0, 0, None) for i in range(10)])
    per_broker = pl.DataFrame({"window_start": [win(10)[0]], "topic": ["live-stream"], "broker": ["broker-c"],
                               "tps": [47.5]}, schema_overrides={"window_start": pl.Datetime("us", "UTC")})

    def detect(busy, topic_brokers):
        now = frame(columns.GOLD_TOPIC_TPS, [(*win(10), "live-stream", 47.5, 1, busy, busy, None, 0.0, 0)])
        brokers = frame(columns.GOLD_BROKER_TPS, [(*win(10), "broker-c", 60.0, None, 4, busy, busy, None)])
        got = rules.detect(now, empty(columns.GOLD_GROUP_TPS), brokers, history, normal, W, D,
                           topic_brokers=topic_brokers)
        return got.filter(pl.col("anomaly") == "TRAFFIC_SURGE")

    crowded = detect(600, per_broker)
    assert fired(crowded) == [("live-stream", "TRAFFIC_SURGE", "critical")]
    assert "64.6 msg/s read through the brokers it crowds" in crowded["detail"][0]
    assert fired(detect(0, per_broker)) == []
    refused = detect(600, None)
    assert fired(refused) == [("live-stream", "TRAFFIC_SURGE", "critical")]
    assert "50.8 msg/s with the sends refused as busy (600 lines" in refused["detail"][0]


def test_the_fast_path_reads_a_crowding_surge_as_the_final_path_does_sweep_case_115():
    """Case 115's window on the fast path (the simulator's running sums): complete by census it fires as the final
    path does, and so it does while broker-c (carrying none of it, 33 s late in the case) is still to report. With
    broker-b's minute still to come, the topic's puts so far (233 msg/s, broker-a's) take all of broker-a's normal
    writes but 14 msg/s as its own: nothing read through, nothing fires (1.0x)."""
    from pipelines.decide.rules import preliminary as pre
    from pipelines.sim.windows import OpenWindows

    start = win(10)[0]
    events = []
    for b, topic_tps, other_tps in (("broker-a", 233.0, 41.9), ("broker-b", 198.0, 2.0)):
        events += [(start, b, "pugc-content", None, "TOPIC_PUT_NUMS", int(topic_tps * 60)),
                   (start, b, "orders", None, "TOPIC_PUT_NUMS", int(other_tps * 60))]
        events += [(start + dt.timedelta(seconds=s), b, "pugc-content", None, "failure:TIMEOUT_CLEAN_QUEUE", 1)
                   for s in range(0, 60, 3)]
    rows = pl.from_arrow(OpenWindows(60, 120).batch(events))
    history = topic_series("pugc-content", [236.0] * 10)
    normal = frame(columns.GOLD_BROKER_TPS, [(*win(i), b, w, None, 4, 0, 0, None)
                                             for i in range(10) for b, w in (("broker-a", 250.0), ("broker-b", 182.0))])
    got = pre.preliminary_anomalies(rows, history, normal, ["broker-a", "broker-b"], W, D)
    surge = got.filter(pl.col("anomaly") == "TRAFFIC_SURGE")
    assert fired(surge) == [("pugc-content", "TRAFFIC_SURGE", "critical")]
    assert "read through the brokers it crowds" in surge["detail"][0]
    waiting = pre.preliminary_anomalies(rows, history, normal, ["broker-a", "broker-b", "broker-c"], W, D)
    assert fired(waiting.filter(pl.col("anomaly") == "TRAFFIC_SURGE")) == fired(surge)
    heard_a = pl.from_arrow(OpenWindows(60, 120).batch([e for e in events if e[1] == "broker-a"]))
    partial = pre.preliminary_anomalies(heard_a, history, normal, ["broker-a", "broker-b"], W, D)
    assert partial.filter(pl.col("anomaly") == "TRAFFIC_SURGE").height == 0


def test_a_broker_silent_in_every_open_window_is_not_waited_for_by_the_census():
    """Issue 49's sweep case 54: broker-c ships each minute 123 s late, behind the fast query's watermark, and
    carries none of the storm; the storm comes back after its lift and its consumer stalls (36 msg/s consumed,
    against 559 msg/s in the newest final window, a quiet minute). Waited for, broker-c kept every open window
    incomplete and the consume bound was the quiet minute's: ratio 0.12, no limit for 3 minutes. Not heard from in
    any open window two or more minutes old, it is not waited for: the window is complete by census and the storm
    is proven on its open window (ratio 1.9)."""
    from pipelines.decide.rules import preliminary as pre
    from pipelines.sim.windows import OpenWindows

    windows = OpenWindows(60, 120)
    rows = []
    for k in range(3):
        start = win(k)[0]
        consumed, sent = (2162, 4097) if k == 2 else (33_500, 200)
        rows += windows.batch_rows([(start, "broker-a", "orders", "g", "GROUP_GET_NUMS", consumed),
                                    (start, "broker-a", "%RETRY%g", "g", "SNDBCK_PUT_NUMS", sent),
                                    (start, "broker-b", "news", None, "TOPIC_PUT_NUMS", 600)])[1]
    expected = ["broker-a", "broker-b", "broker-c"]
    assert pre.waited_for(expected, rows, 60) == (["broker-a", "broker-b"], ["broker-c"])
    heard = rows + [{"resource_type": "cluster", "window_start": win(0)[0], "brokers": ["broker-c"]}]
    assert pre.waited_for(expected, heard, 60) == (expected, [])  # heard from two minutes ago: waited for
    assert pre.waited_for(expected, [r for r in rows if r["window_start"] > win(0)[0]], 60) == (expected, [])
    assert pre.waited_for(expected, [r for r in rows if r["resource_type"] != "cluster"], 60) == (expected, [])
    storm = pl.from_arrow(OpenWindows(60, 120).batch([
        (win(2)[0], "broker-a", "orders", "g", "GROUP_GET_NUMS", 2162),
        (win(2)[0], "broker-a", "%RETRY%g", "g", "SNDBCK_PUT_NUMS", 4097),
        (win(2)[0], "broker-b", "news", None, "TOPIC_PUT_NUMS", 600)]))
    quiet = frame(columns.GOLD_GROUP_TPS, [(*win(1), "g", "orders", 558.75, 3.3, 0.006)])
    none = empty(columns.GOLD_TOPIC_TPS), empty(columns.GOLD_BROKER_TPS)
    waited = pre.preliminary_anomalies(storm, *none, expected, W, D, group_history=quiet)
    assert waited.filter(pl.col("anomaly") == "RUNAWAY_RETRY").height == 0
    now = pre.preliminary_anomalies(storm, *none, ["broker-a", "broker-b"], W, D, group_history=quiet)
    retry, = now.filter(pl.col("anomaly") == "RUNAWAY_RETRY").to_dicts()
    assert retry["resource"] == "g" and retry["detail"].endswith("2 of 2 expected brokers reported]")


def test_sweep_case_131_a_busy_broker_s_acceptance_leaves_out_the_retry_topics_whose_refusals_leave_no_line():
    """Sweep case 131: seven storms on three brokers; the last, cache-user-consumer, sends back 92 msg/s on broker-c
    alone, which accepts 2 % of every send. Its producers logged 498 busy failures a second beside 11 puts, and the
    retry topics of the storms put 65 a second more: the consumers' send-backs and fallback sends, whose refusals
    leave no line. Read with those puts, broker-c accepted 0.13 of its sends and the storm's 5.9 msg/s admitted
    meant 45 msg/s, under the 50 msg/s floor: limited a window later, 162 s after onset. Its producers' own puts and
    failures read 0.022: 273 msg/s, and the storm fires on the open window."""
    from pipelines.decide.rules import preliminary as pre
    from pipelines.decide.arrow import micros
    from pipelines.sim.windows import FAILURE, OpenWindows

    start = win(1)[0]
    per_minute = lambda tps: int(round(tps * 60))  # noqa: E731
    events = [(start, "broker-c", "audio-audit", None, "TOPIC_PUT_NUMS", per_minute(11.0)),
              (start, "broker-c", "audio-audit", None, FAILURE + "TIMEOUT_CLEAN_QUEUE", per_minute(498.0)),
              (start, "broker-c", "orders", "g", "GROUP_GET_NUMS", per_minute(120.0)),
              (start, "broker-c", "orders", "g", "SNDBCK_PUT_NUMS", per_minute(2.1)),
              (start, "broker-c", "%RETRY%g", None, "TOPIC_PUT_NUMS", per_minute(5.9)),
              (start, "broker-c", "%RETRY%other", None, "TOPIC_PUT_NUMS", per_minute(59.1))]
    rows = pl.from_arrow(OpenWindows(60, 120).batch(events))
    window = rows.filter(pl.col("resource_type") == "group")["window_start"][0]
    traffic, admitted = pre.open_retry_traffic(rows, [micros(window)], 60)
    assert round(admitted[window, "g"], 1) == 5.9
    assert round(traffic[window, "g"]) == 273      # 5.9 / (11 / 509); 45 through 76 / 574 = 0.13
    history = empty(columns.GOLD_TOPIC_TPS), empty(columns.GOLD_BROKER_TPS)
    got = pre.preliminary_anomalies(rows, *history, ["broker-c"], W, D).to_dicts()
    assert [(r["anomaly"], r["resource"]) for r in got if r["anomaly"] == "RUNAWAY_RETRY"] == [("RUNAWAY_RETRY", "g")]


def test_a_busy_broker_s_normal_writes_are_its_median_over_its_windows_not_busy_sweep_case_25():
    """The normal a storm's first limit leaves room beside (:func:`pipelines.decide.rules.crowding.busy_normals`, sweep
    case 25: broker-a wrote 949.0 msg/s busy against 843.0 normal): the median of the broker's own
    ``BROKER_PUT_NUMS`` over its previous windows, its busy windows left out (a busy window writes the capacity);
    only for a broker busy in a window with a storm or a surge (sweep case 809: a surge's first limit counts its
    carriers' other senders at their normal), and only with ``baseline_min_windows`` windows."""
    from pipelines.decide.rules.crowding import busy_normals
    history = frame(columns.GOLD_BROKER_TPS, [(*win(i), "broker-a", 800.0, 843.0 + i % 3 - 1, 4, 0, 0, None)
                                              for i in range(5)] + [
        (*win(i), "broker-a", 900.0, 949.0, 4, 700, 700, None) for i in range(5, 10)])  # busy: left out
    now = pl.DataFrame({"window_start": [win(10)[0]] * 3, "window_end": [win(10)[1]] * 3,
                        "resource_type": ["group", "broker", "broker"], "resource": ["g", "broker-a", "broker-b"],
                        "anomaly": ["RUNAWAY_RETRY", "BROKER_BUSY", "BROKER_BUSY"]},
                       schema_overrides={"window_start": pl.Datetime("us", "UTC"),
                                         "window_end": pl.Datetime("us", "UTC")})
    got = busy_normals(now, history, win(10)[0], W, D, rules.broker_writes())
    assert got == {(win(10)[0], "broker-a"): 843.0}   # broker-b: no history, no normal
    assert busy_normals(now.filter(pl.col("anomaly") != "RUNAWAY_RETRY"), history, win(10)[0], W, D,
                        rules.broker_writes()) == {}
    surge = now.with_columns(pl.col("anomaly").replace("RUNAWAY_RETRY", "TRAFFIC_SURGE"),
                             pl.col("resource_type").replace("group", "topic"))
    assert busy_normals(surge, history, win(10)[0], W, D, rules.broker_writes()) == {(win(10)[0], "broker-a"): 843.0}
    assert busy_normals(now, history.head(4), win(10)[0], W, D, rules.broker_writes()) == {}  # 4 < 5 windows
