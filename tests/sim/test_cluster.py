"""The closed-loop cluster (pipelines/sim/cluster.py) and what it prints and logs (pipelines/sim/admitted.py): the
clients' answers to a rejection, per-broker limits, busy brokers, and the stats lines of what was admitted."""

from __future__ import annotations

import dataclasses
import datetime as dt

import numpy as np
import pandas as pd
import pytest

from pipelines import rocketmq as rmq
from pipelines.sim.admitted import admitted_rows, failure_rows
from pipelines.sim.cluster import ClientConfig, ClosedLoopCluster
from pipelines.sim.failures import CLIENT_INNER_PRODUCER
from pipelines.sim.minutes import stats_files
from pipelines.sim.spec import ScenarioSpec

START = dt.datetime(2026, 11, 22, 8, 0, tzinfo=dt.timezone.utc)
GROUP = "get-pugc-to-ai-consumer"


def spec(**kw) -> ScenarioSpec:
    sizes = dict(name="persisting_storm", seed=11, start=START, minutes=8, brokers=3, topics=5, groups=3,
                 onset_minute=3, culprit_topic_brokers=2)
    sizes.update(kw)
    return ScenarioSpec(**sizes)


def pair(c: ClosedLoopCluster, broker: str, rtype: str, resource: str) -> int:
    hit = np.flatnonzero((c.pairs["broker"] == broker) & (c.pairs["resource_type"] == rtype)
                         & (c.pairs["resource"] == resource))
    assert hit.size == 1
    return int(hit[0])


def limits(c: ClosedLoopCluster, values: dict[int, float]):
    limit = np.full(len(c.pairs), np.nan)
    for i, q in values.items():
        limit[i] = q
    return limit, np.where(np.isnan(limit), 1, np.ceil(np.nan_to_num(limit))), np.full(len(c.pairs), 1000)


def test_a_producer_retries_a_rejected_send_on_the_topics_other_broker():
    roomy = pd.Series(10_000.0, index=["broker-a", "broker-b", "broker-c"])  # no broker gets busy here
    c = ClosedLoopCluster(spec(name="normal_day"), capacity=roomy)
    a, b = pair(c, "broker-a", "topic", "pugc-content"), pair(c, "broker-b", "topic", "pugc-content")
    c.set_limits(*limits(c, {a: 50.0}))
    c.advance_to(c.start + pd.Timedelta(minutes=4))
    m = 3
    demand_a, demand_b = c.demand[a, m] * 60, c.demand[b, m] * 60
    rejected_a = c.limiter_rejected[m, a].sum()
    assert c.admitted[m, a].sum() / 60 == pytest.approx(50, rel=0.03)              # token bucket + 1 s breaker
    retried = c.offered[m, b, 1:].sum()                                           # attempts 2 and 3 landed on b
    assert retried == pytest.approx(0.6 * c.limiter_rejected[m, a, 0], rel=0.02)    # retrying_share of attempt 1
    assert c.admitted[m, b].sum() == pytest.approx(demand_b + retried, rel=1e-6)    # b is not limited, not busy
    assert c.offered[m, a, 0] == pytest.approx(demand_a)                           # demand does not fall
    lines = failure_rows(c, 0, len(c.rejections.tick), np.random.default_rng(1))
    mine = lines[(lines["topic"] == "pugc-content") & (lines["broker"] == "broker-a")]
    assert len(mine) == pytest.approx(c.limiter_rejected[:, a].sum(), abs=3)      # one line per rejected attempt
    assert mine["message"].str.contains(r"\[RateLimit\] for pugc-content need wait:\d+microsecs").all()
    assert (lines["broker"] == "broker-b").sum() == 0

    no_retry = ClosedLoopCluster(spec(name="normal_day"), clients=ClientConfig(retrying_share=0.0), capacity=roomy)
    no_retry.set_limits(*limits(no_retry, {a: 50.0}))
    no_retry.advance_to(no_retry.start + pd.Timedelta(minutes=4))
    assert no_retry.offered[m, b, 1:].sum() == 0 and rejected_a > 0


def test_a_rejected_send_back_falls_back_to_a_plain_send_into_the_same_bucket():
    c = ClosedLoopCluster(spec())
    ga, gb = pair(c, "broker-a", "group", GROUP), pair(c, "broker-b", "group", GROUP)
    c.set_limits(*limits(c, {ga: 20.0, gb: 10.0}))                                # each broker its own figure
    c.advance_to(c.end)
    m = 6
    assert c.offered[m, ga, 0] / 60 == pytest.approx(300, rel=0.05)                 # the broken consumer's demand
    assert c.offered[m, ga, 1:].sum() > c.offered[m, ga, 0]                       # fallbacks, and their retries
    assert c.admitted[m, ga].sum() / 60 == pytest.approx(20, rel=0.03)              # one bucket for both streams
    assert c.admitted[m, gb].sum() / 60 == pytest.approx(10, rel=0.03)
    # neither a rejected send-back nor its rejected fallback send leaves a send-failure line: both fail inside the
    # consumer client, whose application never ships them
    lines = failure_rows(c, 0, len(c.rejections.tick), np.random.default_rng(1))
    assert (lines["topic"] == rmq.RETRY_TOPIC_PREFIX + GROUP).sum() == 0
    assert (lines["producer_group"] == CLIENT_INNER_PRODUCER).sum() == 0
    assert c.limiter_rejected[:, [ga, gb], 0].sum() > 0 and c.limiter_rejected[:, [ga, gb], 1:].sum() > 0


def test_a_working_consumer_sends_back_a_share_of_what_it_consumes_not_of_the_demand():
    """Issue 49's 5,000-case run, cases 2614 and 4494: a surging topic limited from 9,892 to 29.9 msg/s while its
    consumer kept sending back 1 % of the demand (54.6 msg/s) beside 29.9 msg/s consumed, which read as a retry
    storm and was limited. A working consumer consumes what the brokers admitted of its topics, and sends back its
    share of that: with pugc-content limited to a quarter of its demand, the group's send-back demand falls to
    about a quarter; the broken consumer of a storm re-consumes its failed messages and sends them back whatever
    it receives (its demand stays the World's)."""
    roomy = pd.Series(10_000.0, index=["broker-a", "broker-b", "broker-c"])

    def sendbacks(name):
        c = ClosedLoopCluster(spec(name=name), capacity=roomy)
        topic = [pair(c, b, "topic", "pugc-content") for b in ("broker-a", "broker-b")]
        m = 6
        c.set_limits(*limits(c, {i: c.demand[i, m] / 4 for i in topic}))
        c.advance_to(c.start + pd.Timedelta(minutes=m + 1))
        group = np.flatnonzero((c.pairs["resource_type"] == "group") & (c.pairs["resource"] == GROUP))
        return c.offered[m, group, 0].sum() / (c.demand[group, m].sum() * 60), \
            c.admitted[m, topic].sum() / (c.demand[topic, m].sum() * 60)

    sent, consumed = sendbacks("normal_day")
    assert consumed == pytest.approx(0.25, rel=0.05) and sent == pytest.approx(consumed, rel=0.05)
    sent, _ = sendbacks("persisting_storm")                                      # broken: the World's demand
    assert sent == pytest.approx(1.0, rel=1e-6)


@pytest.mark.parametrize("share, per_minute", [(1.0, 0), (0.1, 0), (0.0, 0), (1.0, 200)])
def test_a_producers_limiter_rejections_leave_lines_as_far_as_it_logs_and_ships_them(share, per_minute):
    """All of them, a sampled tenth, none, or at most 200 per topic, broker and minute (a log throttle): what the
    governor can see of a topic's rejected demand."""
    roomy = pd.Series(10_000.0, index=["broker-a", "broker-b", "broker-c"])
    c = ClosedLoopCluster(spec(name="normal_day"), capacity=roomy,
                          clients=ClientConfig(rejection_log_share=share, log_lines_per_minute=per_minute))
    a = pair(c, "broker-a", "topic", "pugc-content")
    c.set_limits(*limits(c, {a: 50.0}))
    c.advance_to(c.start + pd.Timedelta(minutes=6))
    rejected = c.limiter_rejected[:, a, :c.clients.producer_attempts].sum()
    lines = failure_rows(c, 0, len(c.rejections.tick), np.random.default_rng(1))
    mine = lines[(lines["topic"] == "pugc-content") & (lines["broker"] == "broker-a")]
    assert rejected > 6 * 200 * 2                                          # far more than the throttle lets through
    if per_minute:
        per = mine.groupby(mine["event_time"].dt.floor("min")).size()
        assert per.max() <= per_minute and per.sum() >= 5 * per_minute      # full minutes at the throttle
    else:
        assert len(mine) == pytest.approx(share * rejected, abs=3)


def test_a_storm_makes_its_brokers_busy_for_every_topic_on_them_and_a_limit_ends_it():
    c = ClosedLoopCluster(spec())
    c.advance_to(c.start + pd.Timedelta(minutes=5))
    ga, gb = pair(c, "broker-a", "group", GROUP), pair(c, "broker-b", "group", GROUP)
    by = pair(c, "broker-a", "topic", "risk-notify")
    elsewhere = pair(c, "broker-c", "topic", "payment-index")
    assert c.busy_rejected[4, by].sum() > 0.2 * c.offered[4, by].sum()              # bystander on a busy broker
    assert c.busy_rejected[4, elsewhere].sum() == 0
    assert c.max_wait_ms[0, 4] == pytest.approx(200.0)
    lines = failure_rows(c, 0, len(c.rejections.tick), np.random.default_rng(2))
    busy = lines[lines["topic"] == "risk-notify"]
    assert busy["message"].str.contains(r"\[TIMEOUT_CLEAN_QUEUE\]broker busy, start flow control").all()
    assert (busy["expected_class"] == "TIMEOUT_CLEAN_QUEUE").all() and (busy["broker"] == "broker-a").all()
    c.set_limits(*limits(c, {ga: 20.0, gb: 20.0}))
    c.advance_to(c.end)
    assert c.busy_rejected[7, by].sum() == 0 and c.max_wait_ms[:, 7].max() < 200.0


def test_the_stats_lines_show_what_the_brokers_admitted():
    c = ClosedLoopCluster(spec())
    ga, gb = pair(c, "broker-a", "group", GROUP), pair(c, "broker-b", "group", GROUP)
    c.set_limits(*limits(c, {ga: 20.0, gb: 20.0}))
    c.advance_to(c.end)
    m = 6
    rows = admitted_rows(c, m)
    demand = c.traffic[c.traffic["minute_start"] == c.start + pd.Timedelta(minutes=m)]

    def one(frame, stat, key, broker="broker-a"):
        hit = frame[(frame["stat_name"].astype(str) == stat) & (frame["stats_key"].astype(str) == key)
                    & (frame["broker"].astype(str) == broker)]
        assert len(hit) == 1
        return hit.iloc[0]

    sb = one(rows, rmq.SNDBCK_PUT_NUMS, f"pugc-content@{GROUP}")
    assert sb["sum"] == pytest.approx(c.admitted[m, ga, 0], abs=1)                  # admitted send-backs only
    assert sb["tps"] == pytest.approx(sb["sum"] / 60)
    retry_put = one(rows, rmq.TOPIC_PUT_NUMS, rmq.RETRY_TOPIC_PREFIX + GROUP)
    assert retry_put["sum"] == pytest.approx(c.admitted[m, ga].sum(), abs=1)       # send-backs + fallbacks
    consumed = one(rows, rmq.GROUP_GET_NUMS, f"pugc-content@{GROUP}")["sum"]
    before = one(demand, rmq.GROUP_GET_NUMS, f"pugc-content@{GROUP}")["sum"]
    lost = c.lost[m, [ga, gb]].sum() / (c.demand[[ga, gb], m].sum() * 60)
    assert consumed == pytest.approx(before * (1 - 0.5 * lost), rel=0.01)         # pull flow control
    files = stats_files(c.spec, rows, {m})[m]
    text = "".join(t for path, t in files if path.startswith("broker_stats/broker-a/"))
    stamp = (START + dt.timedelta(minutes=m + 1, hours=8)).strftime("%Y-%m-%d %H:%M:%S")
    assert f"{stamp} INFO - [SNDBCK_PUT_NUMS] [pugc-content@{GROUP}] Stats In One Minute, SUM: {sb['sum']} " in text
    with pytest.raises(ValueError, match="not been simulated"):
        admitted_rows(ClosedLoopCluster(spec()), 0)


@pytest.mark.parametrize("tick", [0.1, 0.5, 1.0])
def test_a_persisting_overload_is_admitted_at_the_limit_whatever_the_tick(tick):
    """The breaker opens when the tokens run out, inside the tick, and stays open for breaker_open_ms (1 s): each
    second a burst of limit × 1 s is admitted, so a limited pair admits its limit whatever the tick length."""
    from pipelines.sim.ticks import TokenBuckets

    buckets = TokenBuckets.empty(1)
    per_tick = np.array([1000.0 * tick])  # 1,000 requests/s offered against a 50 requests/s limit
    admitted = sum(float(buckets.admit(per_tick, np.array([50.0]), np.array([50.0]), round(1.0 / tick), tick)[0])
                   for _ in range(int(round(120 / tick))))
    assert admitted / 120 == pytest.approx(50.0, rel=0.03)


@pytest.mark.parametrize("name", ["persisting_storm", "normal_day"])
def test_the_cheap_clean_tick_leaves_every_total_as_the_full_tick_does(name, monkeypatch):
    """:meth:`ClosedLoopCluster._clean_tick` (no limit, nothing pending, an empty queue) against every tick run by
    ``_tick``: the same totals to the last bit, with a limit set and lifted on the way (which turns it off and on)."""

    clean, real = [], ClosedLoopCluster._clean_tick

    def run(cheap: bool) -> ClosedLoopCluster:
        monkeypatch.setattr(ClosedLoopCluster, "_clean_tick",
                            (lambda self: clean.append(real(self)) or clean[-1]) if cheap else (lambda self: False))
        c = ClosedLoopCluster(spec(name=name, minutes=10))
        c.advance_to(c.start + pd.Timedelta(minutes=4, seconds=20))
        ga = pair(c, "broker-a", "group", GROUP)
        c.set_limits(*limits(c, {ga: 20.0}))
        c.advance_to(c.start + pd.Timedelta(minutes=6))
        c.set_limits(*limits(c, {}))
        c.advance_to(c.end)
        monkeypatch.undo()
        return c

    cheap, full = run(True), run(False)
    for name_ in ("offered", "admitted", "limiter_rejected", "busy_rejected", "lost", "limited_seconds",
                  "second_admitted", "second_rejected", "arrived_work", "max_wait_ms", "pending"):
        np.testing.assert_array_equal(getattr(cheap, name_), getattr(full, name_), err_msg=name_)
    np.testing.assert_array_equal(cheap.queues.queue, full.queues.queue)
    for field in dataclasses.fields(cheap.rejections):  # NaN limits: compared as equal
        np.testing.assert_array_equal(getattr(cheap.rejections, field.name), getattr(full.rejections, field.name))
    assert cheap.k == full.k and sum(clean) > 100 and clean.count(False) > 100  # both paths taken
    assert (len(cheap.rejections.tick) > 0) == (name == "persisting_storm")


def test_a_pulsed_producer_sends_each_minutes_demand_in_pulses_that_a_limit_refuses_under_its_cap():
    """Pulsed producers (``ClientConfig.pulse_*``, issue 49, mutation p01): while the surge is active its topic's
    demand arrives in the first 8 s of every 20 s at 2.5x the minute's rate and nothing between (``pulses.off``), the
    minute's sum unchanged; the other pairs stay steady. A limit between the minute's rate and the pulses' refuses
    in every pulse while the minute admits about 0.4 of the cap (only the refusals tell the limit binds); in the
    pulses it admits the limit."""
    roomy = pd.Series(100_000.0, index=["broker-a", "broker-b", "broker-c"])
    pulsed = ClientConfig(pulse_period_seconds=20, pulse_on_seconds=8)
    c = ClosedLoopCluster(spec(name="noisy_neighbour", minutes=8, onset_minute=3), clients=pulsed, capacity=roomy)
    steady = ClosedLoopCluster(spec(name="noisy_neighbour", minutes=8, onset_minute=3), capacity=roomy)
    (i,) = np.flatnonzero(c.pulses.pairs)
    assert c.pairs.loc[i, "resource"] == c.incident.causes[0].resource
    c.advance_to(c.start + pd.Timedelta(minutes=5))
    steady.advance_to(steady.start + pd.Timedelta(minutes=5))
    m, sec = 4, np.arange(240, 300)
    on = sec % 20 < 8
    np.testing.assert_array_equal(c.pulses.off[sec], ~on)
    assert not c.pulses.off[:180].any()  # before the onset: steady
    assert c.second_admitted[sec[~on], i].sum() == 0
    assert c.second_admitted[sec[on], i] == pytest.approx(np.full(on.sum(), c.demand[i, m] * 20 / 8), rel=1e-9)
    assert c.admitted[m, i].sum() == pytest.approx(steady.admitted[m, i].sum(), rel=1e-9)
    others = np.flatnonzero(~c.pulses.pairs)
    np.testing.assert_allclose(c.second_admitted[:300, others], steady.second_admitted[:300, others], rtol=1e-9)

    cap = c.demand[i, 5] * 1.5  # over the minute's rate, under the pulses' 2.5x
    c.set_limits(*limits(c, {i: cap}))
    c.advance_to(c.start + pd.Timedelta(minutes=7))
    m, sec = 6, np.arange(360, 420)
    on = sec % 20 < 8
    assert c.admitted[m, i].sum() / 60 < 0.6 * cap                 # under the 0.9 "at the cap" share by far
    assert c.limiter_rejected[m, i].sum() > 0.3 * c.demand[i, m] * 60
    assert c.second_admitted[sec[on], i].sum() / (on.sum() * cap) == pytest.approx(1.0, abs=0.2)
