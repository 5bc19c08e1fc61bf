"""The fast path: Spark's running sums per window × resource (pipelines/dataplane/transforms/fast.py), and what the driver
judges on them (pipelines/decide/rules/preliminary.py: the broker census, which rules act on partial evidence)."""

from __future__ import annotations

import datetime as dt

import polars as pl

from pipelines import columns, schemas
from pipelines.config import DetectionConfig, WindowsConfig
from pipelines.decide.rules import preliminary as pre
from pipelines.decide.rules.candidates import Keyed
from pipelines.decide.records.resource import Candidate
from pipelines.dataplane.transforms import fast
from tests.decide.rows import empty, frame
from tests.helpers import ts

W = WindowsConfig()
D = DetectionConfig(baseline_min_windows=1, baseline_windows=5)
T0 = "2022-02-08 10:00"


def events(spark, rows):
    """(event_time, broker, topic, group, metric, amount) → METRIC_EVENT rows."""
    return spark.createDataFrame([(ts(t), b, tp, g, m, a) for t, b, tp, g, m, a in rows], schemas.METRIC_EVENT)


def sums(spark, rows):
    return events(spark, rows).transform(fast.resource_events).transform(fast.open_window_sums(W))


def open_rows(spark, rows) -> pl.DataFrame:
    """The running sums Spark emits for ``rows``, as the driver gets them (Arrow → polars)."""
    return pl.from_arrow(sums(spark, rows).toArrow())


def anomalies_of(got: pl.DataFrame, kind: str) -> list[dict]:
    return got.filter(pl.col("anomaly") == kind).to_dicts()


def test_running_sums_per_resource_count_a_duplicated_line_once(spark):
    got = sums(spark, [
        (T0, "broker-a", "orders", None, "TOPIC_PUT_NUMS", 600),
        (T0, "broker-a", "orders", None, "TOPIC_PUT_NUMS", 600),  # shipped twice
        (T0, "broker-b", "orders", None, "TOPIC_PUT_NUMS", 1200),
        (T0, "broker-a", "orders", "g", "GROUP_GET_NUMS", 300),
        (T0, "broker-a", "%RETRY%g", "g", "GROUP_GET_NUMS", 50),  # re-consumed retries are not consumption
        (T0, "broker-a", "%RETRY%g", "g", "SNDBCK_PUT_NUMS", 240),
        (T0, "broker-a", "orders", None, "failure:TIMEOUT_CLEAN_QUEUE", 1),
        (T0, "broker-a", "orders", None, "failure:TIMEOUT_CLEAN_QUEUE", 1),  # failures count as they come
        (T0, "broker-a", "orders", None, "failure:OTHER", 1),
        (T0, "broker-b", "orders", None, "failure:RATE_LIMITED", 1),  # the limiter's own: demand, not a failure
    ])
    rows = {(r["resource_type"], r["resource"]): r for r in got.collect()}
    assert rows["topic", "orders"]["puts"] == 1800 and rows["topic", "orders"]["carriers"] == ["broker-a", "broker-b"]
    assert rows["topic", "orders"]["failures"] == 3 and rows["topic", "orders"]["busy_failures"] == 2
    assert rows["broker", "broker-b"]["failures"] == 0
    # per-broker amounts of the limited traffic: a topic's puts, a group's send-backs (the shares of a new limit)
    assert rows["topic", "orders"]["broker_amounts"] == {"broker-a": 600, "broker-b": 1200}
    assert rows["group", "g"]["broker_amounts"] == {"broker-a": 240}
    assert rows["broker", "broker-a"]["puts"] == 600 and rows["broker", "broker-a"]["broker_puts"] is None
    assert (rows["group", "g"]["consumed"], rows["group", "g"]["retried"]) == (300, 240)
    assert rows["cluster", "*"]["brokers"] == ["broker-a", "broker-b"]
    # the limiter's rejections of a topic so far (the lift veto's evidence), never failures
    assert rows["topic", "orders"]["rate_limited"] == 1 and rows["broker", "broker-b"]["rate_limited"] == 0


def test_census_is_complete_only_when_every_expected_broker_reported(spark):
    got = pre.census(open_rows(spark, [(T0, "broker-a", "orders", None, "TOPIC_PUT_NUMS", 600)]),
                     ["broker-a", "broker-b"])
    assert list(got.values()) == [(1, False)]
    assert list(pre.census(open_rows(spark, [(T0, "broker-a", "orders", None, "TOPIC_PUT_NUMS", 6)]), []).values()) \
        == [(1, False)]


def _storm(spark, brokers_reporting):
    rows = [(T0, b, "%RETRY%g", "g", "SNDBCK_PUT_NUMS", 47_000) for b in brokers_reporting]
    rows += [(T0, b, "orders", "g", "GROUP_GET_NUMS", 47_400) for b in brokers_reporting]
    return open_rows(spark, rows)


def _prelim(open_windows, expected, history_rows=()):
    brokers = frame(columns.GOLD_BROKER_TPS, list(history_rows))
    return pre.preliminary_anomalies(open_windows, empty(columns.GOLD_TOPIC_TPS), brokers, expected, W, D)


def test_runaway_retry_waits_for_the_census_then_acts_on_the_open_window(spark):
    partial = _prelim(_storm(spark, ["broker-a"]), ["broker-a", "broker-b"])
    assert anomalies_of(partial, "RUNAWAY_RETRY") == []  # broker-b may still add consumption
    retry = anomalies_of(_prelim(_storm(spark, ["broker-a", "broker-b"]), ["broker-a", "broker-b"]), "RUNAWAY_RETRY")
    assert [(r["resource"], round(r["observed_tps"], 1)) for r in retry] == [("g", 1566.7)]
    assert retry[0]["detail"].endswith("[preliminary: open window, 2 of 2 expected brokers reported]")


def test_a_broker_late_or_silent_does_not_hold_back_a_storm_the_others_already_prove(spark):
    """broker-b ships its minutes late (or stopped): the open window never completes its census. broker-a's lines
    already show 783 msg/s sent back; whatever broker-b still adds to the consumption, the group consumed 800 msg/s
    in its newest final window, and its retries only grow: against the larger of that and what is seen so far the
    ratio is 0.98, so the storm is proven now. 333 msg/s would be 0.42 of it: the rule waits for the census, as it
    does without a final window of the group."""
    start = ts(T0)
    before = lambda k: (start - dt.timedelta(minutes=k), start - dt.timedelta(minutes=k - 1))  # noqa: E731
    history = frame(columns.GOLD_GROUP_TPS, [(*before(1), "g", "orders", 800.0, 4.0, 0.005),
                                             (*before(2), "g", "orders", 500.0, 4.0, 0.008)])

    def storm(sent):
        return open_rows(spark, [(T0, "broker-a", "%RETRY%g", "g", "SNDBCK_PUT_NUMS", sent),
                                 (T0, "broker-a", "orders", "g", "GROUP_GET_NUMS", 23_700)])

    def prelim(sent, group_history):
        return pre.preliminary_anomalies(storm(sent), empty(columns.GOLD_TOPIC_TPS), empty(columns.GOLD_BROKER_TPS),
                                         ["broker-a", "broker-b"], W, D, group_history=group_history)

    retry, = anomalies_of(prelim(47_000, history), "RUNAWAY_RETRY")
    assert "against 800.0 msg/s consumed: retry ratio 0.98" in retry["detail"]
    assert "consume taken as at least its last final window's 800.0 msg/s" in retry["detail"]
    assert retry["detail"].endswith("[preliminary: open window, 1 of 2 expected brokers reported]")
    assert anomalies_of(prelim(20_000, history), "RUNAWAY_RETRY") == []
    assert anomalies_of(prelim(47_000, None), "RUNAWAY_RETRY") == []


def test_busy_failures_act_on_a_partial_window(spark):
    rows = [(T0, "broker-a", "orders", None, "failure:TIMEOUT_CLEAN_QUEUE", 1)] * 3
    windows = open_rows(spark, [(T0, "broker-a", "orders", None, "TOPIC_PUT_NUMS", 60)] + rows)
    # floor 10: three failures prove nothing yet, ten do (more can only come)
    assert anomalies_of(_prelim(windows, ["broker-a", "broker-b"]), "BROKER_BUSY") == []
    windows = open_rows(spark, [(T0, "broker-a", "orders", None, "TOPIC_PUT_NUMS", 60)] + rows * 4)
    busy = anomalies_of(_prelim(windows, ["broker-a", "broker-b"]), "BROKER_BUSY")
    assert [(r["resource"], r["severity"]) for r in busy] == [("broker-a", "warning")]
    assert "(busy: 12, other: 0)" in busy[0]["detail"]


def _minute(m):
    return ts(f"2022-02-08 09:{m:02d}"), ts(f"2022-02-08 09:{m + 1:02d}")


def test_surge_on_partial_sums_uses_the_baseline_of_finalized_windows(spark):
    history = [(*_minute(m), "broker-a", 20.0, None, 5, 0, 0, None) for m in range(50, 59)]
    windows = open_rows(spark, [(T0, "broker-a", "orders", None, "TOPIC_PUT_NUMS", 60 * 100)])
    got = anomalies_of(_prelim(windows, ["broker-a", "broker-b"], history), "TRAFFIC_SURGE")
    assert [(r["resource_type"], r["resource"], r["baseline_tps"]) for r in got] == [("broker", "broker-a", 20.0)]


def test_non_critical_candidates_wait_for_the_census_critical_ones_act_at_once(spark):
    """A partial window's observed rate is below the true one, so a non-critical first cut (at most max_cut_pct of
    the observed rate) would cut deeper than allowed: it waits until every expected broker has reported."""
    at = ts("2022-02-08 10:01").replace(tzinfo=None)
    cands = [Keyed("topic", "a", Candidate(at, 10.0, "r", critical=True)),
             Keyed("topic", "b", Candidate(at, 10.0, "r", critical=False))]
    partial = open_rows(spark, [(T0, "broker-a", "orders", None, "TOPIC_PUT_NUMS", 600)])
    got = pre.cut_bounded_by_final_rates(cands, partial, ["broker-a", "broker-b"], W)
    assert [k.resource for k in got] == ["a"]
    complete = open_rows(spark, [(T0, b, "orders", None, "TOPIC_PUT_NUMS", 600) for b in ("broker-a", "broker-b")])
    got = pre.cut_bounded_by_final_rates(cands, complete, ["broker-a", "broker-b"], W)
    assert sorted(k.resource for k in got) == ["a", "b"]


def with_completed(current: pl.DataFrame, remembered: pl.DataFrame, expected: list[str]) -> pl.DataFrame:
    """``current`` and the remembered rows :func:`pre.completed_rows` gives back, as the fast path adds them."""
    older = pre.completed_rows(current.to_dicts(), remembered.to_dicts(), expected)
    return pl.concat([current, pl.DataFrame(older, schema=current.schema)]) if older else current


def test_a_window_completed_by_a_broker_without_the_group_is_judged_with_the_remembered_group_row(spark):
    """Spark emits only the rows a micro-batch touched: broker-a's lines (the group's storm) came in one micro-batch,
    broker-b's (no line of the group) complete the census in the next. The remembered group row joins the completed
    window, so RUNAWAY_RETRY acts on it as if both files had come at once; an incomplete window gets nothing back."""
    first = _storm(spark, ["broker-a"])
    b_line = (T0, "broker-b", "orders", None, "TOPIC_PUT_NUMS", 600)
    storm_a = [(T0, "broker-a", "%RETRY%g", "g", "SNDBCK_PUT_NUMS", 47_000),
               (T0, "broker-a", "orders", "g", "GROUP_GET_NUMS", 47_400)]
    # what the second micro-batch emits: the running sums of the rows broker-b's line touched
    second = open_rows(spark, storm_a + [b_line]).filter(pl.col("resource_type") != "group")
    assert anomalies_of(_prelim(second, ["broker-a", "broker-b"]), "RUNAWAY_RETRY") == []
    judged = with_completed(second, first, ["broker-a", "broker-b"])
    # the census row is the newer one (broker-b's micro-batch), the group row the remembered one
    assert sorted(judged.select("resource_type", "resource").rows()) == [
        ("broker", "broker-b"), ("cluster", "*"), ("group", "g"), ("topic", "orders")]
    assert judged.filter(pl.col("resource_type") == "cluster")["brokers"].to_list() == [["broker-a", "broker-b"]]
    assert [r["resource"] for r in anomalies_of(_prelim(judged, ["broker-a", "broker-b"]), "RUNAWAY_RETRY")] == ["g"]
    # a window still waiting for broker-c gets no remembered rows: the ratio rule keeps waiting
    waiting = with_completed(second, first, ["broker-a", "broker-b", "broker-c"])
    assert sorted(waiting.select("resource_type", "resource").rows()) == \
        [("broker", "broker-b"), ("cluster", "*"), ("topic", "orders")]


def test_a_broker_surge_on_the_fast_path_is_measured_on_its_own_broker_put_nums(spark):
    """The fast path measures a broker's surge as the final path does (rules.broker_writes): on the broker's own
    BROKER_PUT_NUMS where it prints one (broker-a: its topics flat at 100 msg/s, its own writes 800), on the sum of
    its topics where it prints none (broker-b: topics 800)."""
    history = [(*_minute(m), b, 100.0, own, 5, 0, 0, None)
               for m in range(50, 59) for b, own in (("broker-a", 100.0), ("broker-b", None))]
    windows = open_rows(spark, [
        (T0, "broker-a", "orders", None, "TOPIC_PUT_NUMS", 60 * 100),
        (T0, "broker-a", None, None, "BROKER_PUT_NUMS", 60 * 800),
        (T0, "broker-b", "orders", None, "TOPIC_PUT_NUMS", 60 * 800),
    ])
    got = anomalies_of(_prelim(windows, ["broker-a", "broker-b"], history), "TRAFFIC_SURGE")
    surged = sorted((r["resource_type"], r["resource"], r["observed_tps"], r["baseline_tps"]) for r in got)
    assert surged == [("broker", "broker-a", 800.0, 100.0), ("broker", "broker-b", 800.0, 100.0)]


def test_a_preliminary_limit_s_shares_cover_the_carriers_still_to_report():
    """Sweep case 4: the surge's first open window had only broker-a's puts when the fast path limited it, so the
    record listed broker-a alone and broker-b, a carrier still to report, applied the unlisted figure (the smallest
    listed share: the whole limit): the brokers admitted 2x the limit until the final path split it. The carriers
    the fast path remembers from the window before are listed too, at that window's rate."""
    import polars as pl

    t0 = ts(T0)
    w = lambda k: (t0 + dt.timedelta(minutes=k), t0 + dt.timedelta(minutes=k + 1))  # noqa: E731
    remembered = pl.DataFrame({
        "window_start": [w(0)[0], w(1)[0]], "window_end": [w(0)[1], w(1)[1]], "resource_type": ["topic", "topic"],
        "resource": ["cart", "cart"], "broker_amounts": [{"broker-a": 600, "broker-b": 1200}, {"broker-a": 9000}]})
    now = {(w(1)[1], "topic", "cart"): {"broker-a": 150.0}}
    got = pre.with_earlier_carriers(now, remembered, set(), W)
    assert got == {(w(1)[1], "topic", "cart"): {"broker-a": 150.0, "broker-b": 20.0}}
    assert pre.with_earlier_carriers(now, remembered, {w(1)[1]}, W) == now    # complete by census: as it is
    assert pre.with_earlier_carriers(now, None, set(), W) == now


def test_a_group_s_preliminary_shares_are_its_retry_traffic_per_broker_as_the_final_path_measures_it():
    """Sweep case 199: a busy broker refuses most send-backs and the consumer falls back to plain sends to
    ``%RETRY%<group>``; the final path splits a group's limit by the larger of the two per broker
    (windows.per_broker_traffic), the fast path by the send-backs alone gave broker-d an eighth of its share."""
    t0 = ts(T0)
    start, end = t0, t0 + dt.timedelta(minutes=1)
    rows = pl.DataFrame({
        "window_start": [start] * 3, "window_end": [end] * 3, "resource_type": ["group", "topic", "topic"],
        "resource": ["g", "%RETRY%g", "orders"],
        "broker_amounts": [{"broker-b": 600, "broker-d": 60}, {"broker-b": 300, "broker-d": 480},
                           {"broker-b": 60}]})
    got = pre.open_broker_tps(rows, W)
    assert got[end, "group", "g"] == {"broker-b": 10.0, "broker-d": 8.0}
    assert got[end, "topic", "orders"] == {"broker-b": 1.0}
