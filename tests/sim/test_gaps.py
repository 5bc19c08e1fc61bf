"""Observation gaps in the Spark-free closed loop (pipelines/sim/irregular.py, loop.py, draws.py): the producers'
failure logs dropped, late, shipped twice or held by a stopped shipper; a broker's stats shipper stopped and
restarted with its backlog; the sweep's draw of such gaps on a cause's carriers, its failure logs and the other
brokers. Small inline data; the whole-loop tests run one short noisy neighbour each (about 3 s)."""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter, defaultdict

import numpy as np
import pytest

from pipelines import rocketmq as rmq
from pipelines.sim import loop as sim_loop
from pipelines.sim.admitted import stats_events, trickle
from pipelines.sim.draws import (
    GAP_KINDS, STATS_LATE_ROOM, STATS_LOST_SECONDS, FAILURE_LATE_SECONDS, FAILURE_LOST_SECONDS, STOP_SECONDS,
    GapScene, _draw_gaps,
)
from pipelines.sim.irregular import FailureShipping, Irregularity, stats_landings, stopped_shipper
from pipelines.sim.settings import governor_config, load_backtest_config
from pipelines.sim.spec import ScenarioSpec
from pipelines.sim.windows import FAILURE, FinalWindows

T0 = dt.datetime(2026, 1, 5, 6, 0, tzinfo=dt.timezone.utc)


# --- failure logs: when a line lands ----------------------------------------------------------------------------

def test_failure_lines_land_as_their_topic_and_minute_declare():
    irr = Irregularity(failure_dropped_minutes=[("t1", 2)], failure_late_minutes=[("t1", 3, 50.0)],
                       failure_duplicated_minutes=[("t1", 4, 40.0)], failure_stops=[("t2", 300.0, 450.0)])
    ship = FailureShipping(irr, {"t1", "t2", "t3"}, 5.0)
    assert ship.topics == {"t1", "t2"}
    assert ship.landings("t1", 61.0) == (66.0,)  # minute 1: as usual, 5 s after the failed send
    assert ship.landings("t1", 130.0) == ()  # minute 2: dropped
    assert ship.landings("t1", 190.0) == (245.0,)  # minute 3: 50 s more than usual
    assert ship.landings("t1", 250.0) == (255.0, 295.0)  # minute 4: again 40 s after the first
    assert ship.landings("t2", 294.0) == (299.0,)  # due before the stop
    assert ship.landings("t2", 295.0) == (450.0,) and ship.landings("t2", 444.9) == (450.0,)  # held: at the restart
    assert ship.landings("t2", 445.0) == (450.0,)  # due at the restart itself: as usual
    assert ship.landings("t3", 130.0) == (135.0,)
    assert ship.last_landing(10) >= 605.0 + 50.0 + 40.0


def test_a_failure_gap_naming_an_unknown_topic_is_refused():
    with pytest.raises(ValueError, match=r"unknown topics \['nope'\]"):
        FailureShipping(Irregularity(failure_late_minutes=[("nope", 1, 5.0)]), {"t1"}, 5.0)
    with pytest.raises(ValueError, match="unknown topics"):
        FailureShipping(Irregularity(failure_stops=[("%RETRY%g9", 1.0, 2.0)]), {"t1", "%RETRY%g1"}, 5.0)


# --- failure logs through the whole loop ------------------------------------------------------------------------

SURGE = ScenarioSpec(name="noisy_neighbour", start=T0, minutes=18, onset_minute=8, brokers=3, topics=6, groups=4)
#: The surging topic's lines (busy from minute 8, [RateLimit] once limited, a log throttle of 200 a minute) and a
#: bystander's on the same broker (busy, minutes 8-9).
X, Y = "pugc-content", "refund-index"
GAPS = {"failure_dropped_minutes": [(X, 10)], "failure_late_minutes": [(X, 11, 50.0), (X, 12, 300.0)],
        "failure_duplicated_minutes": [(X, 13, 40.0)], "failure_stops": [(Y, 500.0, 650.0)]}


class _Gold(FinalWindows):
    """The gold query's windowed sums, kept as it emits them (the input of the final decisions)."""

    emitted: dict = {}

    def batch(self, events):
        out = super().batch(events)
        if out:
            for key, amount in out.items():
                type(self).emitted[key] = type(self).emitted.get(key, 0) + amount
        return out


@pytest.fixture(scope="module")
def gapped_run():
    """A noisy neighbour with :data:`GAPS` in its failure logs: (result, ingest batches [(second, events)], fast
    micro-batches' open rows [(now, rows)], gold sums)."""
    bcfg = load_backtest_config("conf/backtest.toml")
    ingests, fasts = [], []

    def keep(kind, inputs, outputs):
        if kind == "ingest":
            ingests.append((inputs["second"], outputs))
        elif kind == "fast":
            fasts.append((inputs["now"], inputs["rows"].to_pylist()))

    mp = pytest.MonkeyPatch()
    _Gold.emitted = {}
    mp.setattr(sim_loop, "FinalWindows", _Gold)
    try:
        result = sim_loop.simulate(SURGE, governor_config(bcfg, None, None), bcfg, record=keep,
                                   irregular=Irregularity(**GAPS))
    finally:
        mp.undo()
    return result, ingests, fasts, dict(_Gold.emitted)


def _truth(result) -> Counter:
    """What the clients logged (ground truth): (topic, minute the send failed in) → failure lines."""
    c = result.cluster
    topic = [rmq.RETRY_TOPIC_PREFIX + r if k == "group" else r for k, r in zip(c.pairs["resource_type"],
                                                                                 c.pairs["resource"])]
    per_minute = Counter()
    rj = c.rejections
    for tick, pair, count in zip(rj.tick, rj.pair, rj.count):
        per_minute[topic[pair], int((tick + 0.5) * c.dt // 60)] += count
    bg = trickle(c, np.random.default_rng(c.spec.seed + 1))  # the loop's background trickle, drawn the same way
    for t, at in zip(bg["topic"], bg["event_time"]):
        per_minute[t, int((at - c.start).total_seconds() // 60)] += 1
    return per_minute


def _written(ingests, start, topic: str) -> list[tuple[int, float, int]]:
    """(ingest trigger second, failed at s, lines) of every failure event of ``topic`` the ingest query wrote."""
    return [(second, (e[0] - start).total_seconds(), e[5]) for second, events in ingests for e in events
            if e[2] == topic and e[4].startswith(FAILURE)]


def _read_at(landing: float, trigger: int) -> int:
    """The ingest trigger that reads a line landing at ``landing`` s: the first at or after it."""
    return int(math.ceil(landing / trigger - 1e-9) * trigger)


def test_failure_lines_of_a_topic_reach_the_ingest_as_declared(gapped_run):
    result, ingests, _, _ = gapped_run
    per_minute = _truth(result)
    start, trig, usual = result.cluster.start, result.trigger_seconds, result.bcfg.shipping.failures_seconds
    assert all(per_minute[X, m] > 0 for m in (9, 10, 11, 12, 13)), "no lines to lose: the test would prove nothing"
    by_minute = defaultdict(list)
    for second, at, n in _written(ingests, start, X):
        by_minute[int(at // 60)].append((second, at, n))
    assert 10 not in by_minute  # dropped
    for m, more in ((9, 0.0), (11, 50.0), (12, 300.0)):  # as usual; 50 s late; 300 s late (written, Spark drops it)
        assert sum(n for *_, n in by_minute[m]) == per_minute[X, m]
        assert all(second == _read_at(at + usual + more, trig) for second, at, _ in by_minute[m]), m
    copies = Counter(second == _read_at(at + usual, trig) for second, at, n in by_minute[13] for _ in range(n))
    assert copies == {True: per_minute[X, 13], False: per_minute[X, 13]}  # every line twice ...
    assert all(second in (_read_at(at + usual, trig), _read_at(at + usual + 40.0, trig))
               for second, at, _ in by_minute[13])  # ... the copy 40 s after the first
    held = _written(ingests, start, Y)
    assert sum(n for *_, n in held) == sum(per_minute[Y, m] for m in range(SURGE.minutes))
    for second, at, _ in held:  # due while its shipper was stopped: at the restart, else as usual
        due = at + usual
        assert second == (_read_at(650.0, trig) if 500.0 <= due < 650.0 else _read_at(due, trig)), (at, second)
    assert any(500.0 <= at + usual < 650.0 for _, at, _ in held)
    assert result.failure_lines == sum(e[5] for _, events in ingests for e in events if e[4].startswith(FAILURE))


def test_failure_lines_with_gaps_reach_both_deciding_queries_as_counted(gapped_run):
    """The final path counts a late line inside the watermark once, a duplicated one twice, a dropped one or one late
    past the watermark not at all; the fast path's open sums show the duplicate twice and the dropped minute empty."""
    result, _, fasts, gold = gapped_run
    per_minute = _truth(result)

    def final(topic, m):
        at = T0 + dt.timedelta(minutes=m)
        return sum(v for (start, _b, t, _g, metric), v in gold.items()
                   if start == at and t == topic and metric.startswith(FAILURE))

    assert final(X, 9) == per_minute[X, 9]
    assert final(X, 10) == 0
    assert final(X, 11) == per_minute[X, 11]  # 50 s late: inside the watermark
    assert final(X, 12) == 0  # 300 s late: past it
    assert final(X, 13) == 2 * per_minute[X, 13]  # shipped twice, counted twice (the data plane sums failures)
    assert final(Y, 7) == per_minute[Y, 7]

    def opened(m):
        at = T0 + dt.timedelta(minutes=m)
        return max((r["failures"] + r["rate_limited"] for _, rows in fasts for r in rows
                    if r["window_start"] == at and r["resource_type"] == "topic" and r["resource"] == X), default=0)

    assert opened(13) == 2 * per_minute[X, 13]
    assert opened(10) == 0
    assert opened(9) == per_minute[X, 9]


# --- a stats shipper stopped and restarted ----------------------------------------------------------------------

def test_a_stopped_shippers_minutes_land_at_its_restart():
    late = stopped_shipper("broker-b", 360.0, 650.0, 5.0, 12)  # minute m's file is due at (m + 1) * 60 + 5 s
    assert late == [("broker-b", 5, 285.0), ("broker-b", 6, 225.0), ("broker-b", 7, 165.0), ("broker-b", 8, 105.0),
                    ("broker-b", 9, 45.0)]
    landed = stats_landings(Irregularity(late_minutes=late), ["broker-a", "broker-b"], 12, 5.0)
    when = {(b, m): t for t, m, b in landed}
    assert [when["broker-b", m] for m in range(5, 10)] == [650.0] * 5
    assert when["broker-b", 4] == 305.0 and when["broker-b", 10] == 665.0  # before and after: as usual
    assert when["broker-a", 7] == 485.0


def test_a_stopped_shippers_backlog_past_the_watermark_is_not_counted():
    bcfg = load_backtest_config("conf/backtest.toml")
    late = stopped_shipper("broker-b", 360.0, 650.0, bcfg.shipping.stats_seconds, SURGE.minutes)
    _Gold.emitted = {}
    mp = pytest.MonkeyPatch()
    mp.setattr(sim_loop, "FinalWindows", _Gold)
    try:
        result = sim_loop.simulate(SURGE, governor_config(bcfg, None, None), bcfg,
                                   irregular=Irregularity(late_minutes=late))
    finally:
        mp.undo()
    gold = dict(_Gold.emitted)

    def counted(b, m):
        at = T0 + dt.timedelta(minutes=m)
        return {(t, g, metric): v for (start, bb, t, g, metric), v in gold.items()
                if start == at and bb == b and not metric.startswith(FAILURE)}

    def printed(b, m):
        return {(t, g, metric): v for at, bb, t, g, metric, v in stats_events(result.cluster, m) if bb == b}

    assert printed("broker-b", 5), "the stopped broker prints nothing: the test would prove nothing"
    assert counted("broker-b", 5) == {} and counted("broker-b", 6) == {}  # 285 s and 225 s late: past the watermark
    assert counted("broker-b", 9) == printed("broker-b", 9)  # 45 s late: counted, once
    assert counted("broker-b", 4) == printed("broker-b", 4) and counted("broker-b", 10) == printed("broker-b", 10)
    assert counted("broker-a", 6) == printed("broker-a", 6)


# --- the sweep's draw of gaps -----------------------------------------------------------------------------------

SCENE = GapScene(brokers=("broker-a", "broker-b", "broker-c", "broker-d"), minutes=30, onset=10,
                 causes=(("pugc-content", ("broker-a", "broker-b")), (None, ("broker-c",))),
                 topics={"pugc-content": ("broker-a", "broker-b"), "order-sync": ("broker-a",),
                         "user-log": ("broker-c",), "im-index": ("broker-d",)})
WORLD = {"stats_delay_seconds": {"broker-a": 8.0, "broker-b": 30.0, "broker-c": 57.0, "broker-d": 3.0},
         "stats_jitter_seconds": 3.0}
CARRIERS = {"broker-a", "broker-b", "broker-c"}


def _kinds(gaps: dict) -> list[tuple[str, str, str, int]]:
    """(where: "carrier"/"other"/"cause topic"/"bystander"/"quiet topic", name, kind, first minute) of each gap."""
    out = []
    late = defaultdict(list)
    for b, m, more in gaps.get("late_minutes", []):
        late[b].append((m, more))
    for b, runs in late.items():
        where = "carrier" if b in CARRIERS else "other"
        if len(runs) > 1:
            out.append((where, b, "stopped", min(m for m, _ in runs)))
        else:
            m, more = runs[0]
            out.append((where, b, "late" if more < 60 else "lost", m))
    out += [("carrier" if b in CARRIERS else "other", b, "dropped", m) for b, m in gaps.get("dropped_minutes", [])]
    out += [("carrier" if b in CARRIERS else "other", b, "duplicated", m)
            for b, m, _ in gaps.get("duplicated_minutes", [])]

    def topic(t):
        return "cause topic" if t == "pugc-content" else "quiet topic" if t == "im-index" else "bystander"

    out += [(topic(t), t, "dropped", m) for t, m in gaps.get("failure_dropped_minutes", [])]
    out += [(topic(t), t, "duplicated", m) for t, m, _ in gaps.get("failure_duplicated_minutes", [])]
    out += [(topic(t), t, "late" if more < 120 else "lost", m) for t, m, more in gaps.get("failure_late_minutes", [])]
    out += [(topic(t), t, "stopped", int(a // 60)) for t, a, _ in gaps.get("failure_stops", [])]
    return out


@pytest.fixture(scope="module")
def drawn():
    return {seed: _draw_gaps(seed, SCENE, WORLD) for seed in range(200)}


def test_the_draw_puts_every_kind_of_gap_on_carriers_and_failure_logs(drawn):
    counts = Counter((where, kind) for gaps in drawn.values() for where, _, kind, _ in _kinds(gaps))
    for kind in GAP_KINDS:
        assert counts["carrier", kind] >= 6, (kind, counts)
        assert counts["cause topic", kind] + counts["bystander", kind] >= 6, (kind, counts)
    assert sum(counts[w, k] for w in ("other", "quiet topic") for k in GAP_KINDS) >= 30, counts
    assert sum(counts["bystander", k] for k in GAP_KINDS) >= 10 and sum(counts["cause topic", k] for k in GAP_KINDS) >= 20
    assert 40 <= sum(1 for g in drawn.values() if any(w == "carrier" for w, *_ in _kinds(g))) <= 80  # about 30 %


def test_the_draw_keeps_each_gap_in_its_minutes_and_ranges(drawn):
    onset_hit = 0
    for seed, gaps in drawn.items():
        for where, name, kind, m in _kinds(gaps):
            if where in ("carrier", "cause topic", "bystander"):
                assert SCENE.onset - 1 <= m <= SCENE.minutes - 2, (seed, where, name, kind, m)
                onset_hit += m in (SCENE.onset - 1, SCENE.onset)
            else:
                assert SCENE.onset + 3 <= m <= SCENE.minutes - 2, (seed, where, name, kind, m)
            if where == "carrier" or where == "other":
                assert name in (CARRIERS if where == "carrier" else {"broker-d"})
        for b, m, more in gaps.get("late_minutes", []):
            if len([x for x in gaps["late_minutes"] if x[0] == b]) == 1:
                room = STATS_LATE_ROOM - WORLD["stats_delay_seconds"][b] - WORLD["stats_jitter_seconds"]
                assert 10.0 <= more <= room or STATS_LOST_SECONDS[0] <= more <= STATS_LOST_SECONDS[1], (seed, b, more)
                assert b != "broker-c" or more >= STATS_LOST_SECONDS[0]  # 57 s delay: no room inside the watermark
        for t, m, more in gaps.get("failure_late_minutes", []):
            assert FAILURE_LATE_SECONDS[0] <= more <= FAILURE_LATE_SECONDS[1] or \
                FAILURE_LOST_SECONDS[0] <= more <= FAILURE_LOST_SECONDS[1]
        for t, a, b in gaps.get("failure_stops", []):
            assert STOP_SECONDS[0] <= b - a <= STOP_SECONDS[1] + 0.1
        runs = defaultdict(list)
        for b, m, more in gaps.get("late_minutes", []):
            runs[b].append((m, more))
        for b, run in runs.items():
            if len(run) > 1:  # a stopped shipper: consecutive minutes, all landing at one restart (2-5 min after)
                ms = sorted(m for m, _ in run)
                assert ms == list(range(ms[0], ms[-1] + 1))
                delay = WORLD["stats_delay_seconds"][b]
                assert len({round((m + 1) * 60 + delay + more, 1) for m, more in run}) == 1
    assert onset_hit >= 5  # the onset minute and the one before are drawn too


def test_the_draw_adds_to_the_worlds_gaps_and_never_puts_a_storms_own_topic_in_a_failure_log(drawn):
    world = {**WORLD, "dropped_minutes": [("broker-d", 2)], "late_minutes": [("broker-d", 3, 190.0)]}
    for seed in range(200):
        gaps = _draw_gaps(seed, SCENE, world)
        assert gaps.get("dropped_minutes", world["dropped_minutes"])[:1] == [("broker-d", 2)]
        assert gaps.get("late_minutes", world["late_minutes"])[:1] == [("broker-d", 3, 190.0)]
    topics = {t for g in drawn.values() for k in ("failure_dropped_minutes", "failure_duplicated_minutes",
                                                  "failure_late_minutes", "failure_stops") for t, *_ in g.get(k, [])}
    assert topics <= set(SCENE.topics) and not any(t.startswith(rmq.RETRY_TOPIC_PREFIX) for t in topics)
    assert _draw_gaps(7, SCENE, WORLD) == drawn[7]  # a seed draws the same gaps every time


# --- what the sweep excuses: minutes its carriers did not ship, or shipped late -----------------------------------

def test_unseen_minutes_count_the_delay_until_a_minute_of_every_carrier_shows():
    from types import SimpleNamespace

    from pipelines.sim.fastest import unseen_minutes

    case = SimpleNamespace(irregular={"dropped_minutes": [("broker-a", 5)],
                                      "late_minutes": [("broker-a", 6, 90.0), ("broker-b", 7, 36.0),
                                                       *stopped_shipper("broker-b", 590.0, 740.0, 5.0, 20)]})
    carriers = {("topic", "t1"): ("broker-a", "broker-b")}
    assert unseen_minutes(case, carriers, 300.0) == pytest.approx(2.6)  # 5 dropped, 6 past, 7 shows 36 s late
    assert unseen_minutes(case, carriers, 420.0) == pytest.approx(0.6)
    assert unseen_minutes(case, carriers, 480.0) == 0.0
    # broker-b stopped at 590 s, restarted at 740 s: minutes 8 (due 545 s: before the stop) as usual, 9 and 10 held
    # (135 s and 75 s late: past the watermark), 11 (due 725 s) shows 15 s late, at the restart
    assert [(m, more) for _, m, more in stopped_shipper("broker-b", 590.0, 740.0, 5.0, 20)] == [
        (9, 135.0), (10, 75.0), (11, 15.0)]
    assert unseen_minutes(case, carriers, 540.0) == pytest.approx(2.25)
    assert unseen_minutes(case, {("topic", "t2"): ("broker-c",)}, 300.0) == 0.0  # not a carrier's gap
    assert unseen_minutes(case, carriers, float("nan")) == 0 and unseen_minutes(case, {}, 300.0) == 0
