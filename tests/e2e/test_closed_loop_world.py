"""Continuous mode, closed loop, in an irregular world (slow): the world of a named scenario reaches the governor's real
queries through the closed-loop harness (pipelines/backtest/loop.py), and the governor's own tables show it.

One short run (12 simulated minutes, 4 brokers; a retry storm from minute 3 on broker-a and broker-b), the shipped
conf/local.toml, and every irregularity at a place of its own:

* broker-d ships each stats minute 40 s late (its lines are read late, and still counted: the watermark is 120 s);
* broker-c's minute 4 is shipped twice (the copy 30 s after the first), its minute 6 never;
* broker-b, a carrier of the storm, applies every publication 30 s after the others;
* the governor is killed at 7:00 and a new one is started on the same lake at 9:00.

Kept small as tests/e2e/test_closed_loop_e2e.py is: the failure shipper sends once a minute, the first two minutes
land as one backlog, two small storm rates.
"""

from __future__ import annotations

import pandas as pd
import pytest
from pyspark.sql import functions as F

from pipelines import tables
from pipelines.backtest.loop import run_loop
from pipelines.dataplane.lake import open_lake
from pipelines.sim.figures import compute
from pipelines.sim.irregular import Irregularity
from pipelines.sim.settings import build_spec, governor_config, load_backtest_config

pytestmark = pytest.mark.slow

GROUP = "get-pugc-to-ai-consumer"
ONSET, MINUTES, KILL, RESTART = 3, 12, 420.0, 540.0
LATE, APPLY_DELAY, RESENT_AFTER = 40.0, 30.0, 30.0
WORLD = Irregularity(stats_delay_seconds={"broker-d": LATE}, apply_delay_seconds={"broker-b": APPLY_DELAY},
                     dropped_minutes=[("broker-c", 6)], duplicated_minutes=[("broker-c", 4, RESENT_AFTER)],
                     governor_restart_second=RESTART, governor_down_seconds=RESTART - KILL)


@pytest.fixture(scope="module")
def run(spark, tmp_path_factory):
    bcfg = load_backtest_config("conf/backtest.toml")
    bcfg = bcfg.model_copy(update={"shipping": bcfg.shipping.model_copy(update={"failures_batch_seconds": 60.0}),
                                   "broker": bcfg.broker.model_copy(update={"capacity_min_tps": 500.0})})
    spec = build_spec("persisting_storm", {"minutes": MINUTES, "onset_minute": ONSET, "brokers": 4, "topics": 5,
                                           "groups": 3, "seed": 11, "storm_consume_tps": 100.0,
                                           "storm_sendback_tps": 150.0})
    lake = tmp_path_factory.mktemp("closed-loop-world") / "lake"
    result = run_loop(spark, spec, bcfg, lake, backlog_minutes=ONSET - 1, irregular=WORLD)
    read = open_lake(spark, lake, governor_config(bcfg, None, None).lake.writer).read
    return {"result": result, "read": read, "start": pd.Timestamp(spec.start_utc),
            "carriers": compute(result).carriers[("group", GROUP)]}


def _minute_file(broker: str, minute: int) -> str:
    """The landed stats file of ``broker``'s minute ``minute`` (printed at its end: stamp index minute + 1)."""
    return f"broker_stats/{broker}/m{minute + 1:04d}"


def _broker_windows(run, broker: str) -> dict[int, float | None]:
    """gold/broker_tps of ``broker``: minute index → broker_put_tps (None: no BROKER_PUT_NUMS line counted)."""
    rows = run["read"](tables.GOLD_BROKER_TPS).where(F.col("broker") == broker).toPandas()
    starts = pd.to_datetime(rows["window_start"]).dt.tz_localize("UTC") if len(rows) else []
    return {int((s - run["start"]).total_seconds() // 60): (None if pd.isna(v) else float(v))
            for s, v in zip(starts, rows["broker_put_tps"])}


def _ingested(run, broker: str) -> dict[str, pd.Timestamp]:
    """bronze/broker_stats of ``broker``: landed file (origin, from ``broker_stats/``) → when the ingest query read it,
    in simulated time (its ``ingested_at`` is the wall clock)."""
    rows = (run["read"](tables.BRONZE_BROKER_STATS).where(F.col("broker_hint") == broker)
            .groupBy("origin").agg(F.min(F.col("ingested_at").cast("double")).alias("wall")).toPandas())
    clock = run["result"].clock
    return {o[o.index("broker_stats/"):]: clock.simulated(w) for o, w in zip(rows["origin"], rows["wall"])}


def test_a_minute_shipped_twice_is_read_twice_and_counted_once(run):
    files = _ingested(run, "broker-c")
    first, copy = _minute_file("broker-c", 4) + ".log", _minute_file("broker-c", 4) + ".resent-1.log"
    assert first in files and copy in files, sorted(files)
    assert files[copy] - files[first] >= pd.Timedelta(seconds=RESENT_AFTER - 10)
    lines = (run["read"](tables.SILVER_BROKER_STATS)
             .where((F.col("broker") == "broker-c") & (F.col("stat_name") == "BROKER_PUT_NUMS")
                    & (F.col("period") == "minute")).select("origin", "sum", "event_time").toPandas())
    lines = lines[lines["origin"].str.contains("/m0005")]
    assert len(lines) == 2 and lines["sum"].nunique() == 1 and lines["sum"].iloc[0] > 0, lines
    assert _broker_windows(run, "broker-c")[4] == pytest.approx(lines["sum"].iloc[0] / 60.0)


def test_a_dropped_minute_never_lands_and_its_window_has_no_stats(run):
    files = _ingested(run, "broker-c")
    assert not [f for f in files if f.startswith(_minute_file("broker-c", 6))], sorted(files)
    assert _minute_file("broker-c", 5) + ".log" in files and _minute_file("broker-c", 7) + ".log" in files
    windows = _broker_windows(run, "broker-c")
    assert windows.get(6) is None, windows
    assert windows[5] and windows[7]


def test_a_late_broker_s_minutes_are_read_late_and_counted(run):
    late, on_time = _ingested(run, "broker-d"), _ingested(run, "broker-a")
    start = run["start"]
    for minute in range(ONSET, 6):  # minutes that land live, before the kill
        end = start + pd.Timedelta(minutes=minute + 1)
        path = _minute_file("broker-d", minute) + ".log"
        assert late[path] >= end + pd.Timedelta(seconds=LATE), (path, late[path], end)
        assert on_time[_minute_file("broker-a", minute) + ".log"] < end + pd.Timedelta(seconds=LATE)
    windows = _broker_windows(run, "broker-d")
    assert all(windows.get(m) is not None for m in range(ONSET, 6)), windows  # its minute line counted


def test_the_limit_is_applied_late_at_the_broker_with_an_apply_delay(run):
    result = run["result"]
    assert set(run["carriers"]) == {"broker-a", "broker-b"}
    first = next(p for p in result.publications if any(r["resource"] == GROUP for r in p.records))
    decided = pd.to_datetime(result.limits["decided_at"], utc=True)
    assert decided.min() <= first.at
    applied = {b: next(at for at, snap in result.in_force if (b, "group", GROUP) in snap) for b in run["carriers"]}
    prop = pd.Timedelta(seconds=result.propagation_seconds)
    assert applied["broker-a"] == first.at + prop
    assert applied["broker-b"] == first.at + prop + pd.Timedelta(seconds=APPLY_DELAY)


def test_a_killed_governor_s_limit_holds_and_the_restarted_one_takes_the_lease_and_decides(run):
    result, start = run["result"], run["start"]
    killed, restarted = result.lives
    assert killed.killed is not None and start + pd.Timedelta(seconds=KILL) <= killed.killed
    assert killed.killed < start + pd.Timedelta(seconds=KILL + 60)
    assert restarted.started >= start + pd.Timedelta(seconds=RESTART) and restarted.killed is None
    assert restarted.took_over == killed.owner != restarted.owner  # the stale lease, left behind, taken over
    assert not [p for p in result.publications if killed.killed < p.at < restarted.started]
    before_kill = [p for p in result.publications if p.at <= killed.killed]
    versions = {r["version"] for p in before_kill for r in p.records if r["resource"] == GROUP}
    last = next(r["version"] for r in before_kill[-1].records if r["resource"] == GROUP)
    down = [[snap for at, snap in result.in_force if at < killed.killed][-1]]
    down += [snap for at, snap in result.in_force if killed.killed <= at < restarted.started]
    for snap in down:  # in force at both carriers all along, as published before the kill
        assert {b for b, t, r in snap if r == GROUP} == {"broker-a", "broker-b"}
        assert {rec["version"] for (b, t, r), (_q, rec) in snap.items() if r == GROUP} <= versions
    assert {rec["version"] for (b, t, r), (_q, rec) in down[-1].items() if r == GROUP} == {last}
    decided = pd.to_datetime(result.limits["decided_at"], utc=True)
    assert (decided >= restarted.started).any(), result.limits[["decided_at", "action", "reason"]]
    groups = run["read"](tables.GOLD_GROUP_TPS).where(F.col("consumer_group") == GROUP).toPandas()
    minutes = {int((pd.Timestamp(s).tz_localize("UTC") - start).total_seconds() // 60) for s in groups["window_start"]}
    # every window the watermark closed (the last minute's lines hold it at 9:00), those landed while the governor
    # was down read from the backlog by the restarted one
    assert set(range(ONSET, MINUTES - 3)) <= minutes, sorted(minutes)
