"""The closed loop through Spark in a named scenario's world, without Spark: the shippers land each broker's minute when
the simulator's shipping model says (late, dropped, twice), the brokers apply each publication after their own
delay and forget on a restart until the next one, a killed governor's planned micro-batches never run, the world is
printed and a world naming an unknown broker is refused in one line. The world through the real queries:
tests/e2e/test_closed_loop_world.py (slow)."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import threading

import numpy as np
import pandas as pd
import pytest

from control import record as cr
from pipelines.backtest.brokers import Brokers, Publication, Watcher
from pipelines.backtest.cli import check_world, world_line
from pipelines.backtest.shipper import Shipper
from pipelines.backtest.triggers import Gate, Gates, GovernorKilled
from pipelines.sim.cluster import ClosedLoopCluster
from pipelines.sim.irregular import Irregularity, stats_landings
from pipelines.sim.settings import BacktestConfig, BacktestError, ShippingConfig, build_spec, scenario_world
from pipelines.sim.spec import ScenarioSpec

START = dt.datetime(2026, 11, 22, 8, 0, tzinfo=dt.timezone.utc)
GROUP = "get-pugc-to-ai-consumer"
KEY = b"backtest-world-key"


def _spec(**kw) -> ScenarioSpec:
    sizes = dict(name="persisting_storm", seed=11, start=START, minutes=6, brokers=3, topics=5, groups=3,
                 onset_minute=2, culprit_topic_brokers=2)
    sizes.update(kw)
    return ScenarioSpec(**sizes)


def test_each_broker_s_minute_lands_when_the_simulator_s_shipping_model_says():
    irr = Irregularity(stats_delay_seconds={"broker-c": 40.0}, dropped_minutes=[("broker-a", 1)],
                       duplicated_minutes=[("broker-b", 1, 30.0)], stats_jitter_seconds=3.0, seed=5)
    cluster = ClosedLoopCluster(_spec())
    shipper = Shipper(cluster, ShippingConfig(), np.random.default_rng(0), irr)
    landed: dict[str, tuple[float, str]] = {}
    for second in range(10, 6 * 60 + 60, 2):
        at = cluster.start + pd.Timedelta(seconds=second)
        cluster.advance_to(at)
        for path, text in shipper.due(at, second)[0]:
            if path.startswith("broker_stats/"):
                assert path not in landed
                landed[path] = (second, text)
    expected = stats_landings(irr, cluster.brokers, cluster.T, 5.0)  # the one definition of when a file lands
    resent = {}
    for when, m, b in expected:
        path = f"broker_stats/{b}/m{m + 1:04d}.log"
        if path in landed and landed[path][0] < when:  # the copy
            path = path.removesuffix(".log") + f".resent-{resent.setdefault(path, 1)}.log"
        assert path in landed and when <= landed[path][0] < when + 2, (path, when)
    assert len(landed) == len(expected) == 3 * 6 - 1 + 1
    assert "broker_stats/broker-a/m0002.log" not in landed                                    # dropped
    first, copy = landed["broker_stats/broker-b/m0002.log"], landed["broker_stats/broker-b/m0002.resent-1.log"]
    assert copy[1] == first[1] and copy[0] - first[0] >= 30 - 2                                # the same text, later
    assert landed["broker_stats/broker-c/m0001.log"][0] >= 60 + 40                             # late


def _publication(tmp_path, name: str, at: pd.Timestamp, expires: pd.Timestamp) -> Publication:
    rec = cr.sign({"resource_type": "group", "resource": GROUP, "limit_qps": 40.0, "burst": 40,
                   "breaker_open_ms": 1000, "mode": "enforce", "expires_at": cr.format_expires_at(expires),
                   "version": 1, "reason": "test"}, KEY)
    path = tmp_path / name
    cr.write_limits_file([rec], path, generated_at=at.to_pydatetime())
    return Publication(at, [rec], path)


def test_a_broker_applies_after_its_delay_and_forgets_on_a_restart_until_the_next_publication(tmp_path):
    cluster = ClosedLoopCluster(_spec())
    irr = Irregularity(apply_delay_seconds={"broker-b": 30.0}, broker_restarts=[("broker-a", 200.0)])
    brokers = Brokers(cluster, KEY, 10.0, irr)
    at = lambda s: cluster.start + pd.Timedelta(seconds=s)  # noqa: E731
    first = _publication(tmp_path, "limits-1.json", at(100), at(3000))
    brokers.publish(first)
    brokers.publish(Publication(at(250), first.records, first.path))  # the same file written again
    brokers.apply_until(cluster.end)
    holds = lambda b: [(t - cluster.start).total_seconds() for t, snap in brokers.timeline  # noqa: E731
                       if (b, "group", GROUP) in snap]
    changes = [(t - cluster.start).total_seconds() for t, _ in brokers.timeline]
    assert holds("broker-a")[0] == 110 and holds("broker-b")[0] == 140    # the carriers: b 30 s after a
    assert 200 in changes and 200 not in holds("broker-a")                # forgotten at the restart ...
    assert 260 in holds("broker-a") and not [s for s in holds("broker-a") if 200 <= s < 260]  # ... until the rewrite


def test_a_rewrite_of_the_same_records_is_no_new_publication(tmp_path):
    class Clock:
        def at_wall(self, wall):
            return pd.Timestamp(wall, unit="s", tz="UTC")

    path, out = tmp_path / "limits.json", tmp_path / "published"
    out.mkdir()
    pub = _publication(tmp_path, "limits.json", pd.Timestamp(START), pd.Timestamp(START) + pd.Timedelta(hours=1))
    watcher = Watcher(path, Clock(), out, Watcher.fresh())
    watcher.check()
    cr.write_limits_file(pub.records, path, generated_at=(START + dt.timedelta(seconds=7)))
    watcher.check()
    assert len(watcher.published) == 1 and len(watcher.rewritten) == 1
    assert watcher.rewritten[0].path == watcher.published[0].path and watcher.published[0].path.parent == out


def test_a_killed_governor_s_planned_micro_batch_never_runs():
    gate, ran, failed = Gate("gold"), [], []
    handler = gate.wrap(lambda df, batch_id: ran.append(batch_id))

    def micro_batch(batch_id: int) -> None:
        try:
            handler(None, batch_id)
        except GovernorKilled as exc:
            failed.append(str(exc))

    worker = threading.Thread(target=micro_batch, args=(7,))
    worker.start()
    assert gate.reach(5.0, lambda: True)
    Gates({"gold": gate}, {}).kill()
    worker.join(5.0)
    assert not ran and failed and "micro-batch 7 was planned, never run" in failed[0]
    micro_batch(8)  # and every one planned after the kill
    assert not ran and len(failed) == 2


def test_a_named_scenario_runs_in_its_world_and_prints_it():
    base = BacktestConfig()
    bcfg, irr = scenario_world("storm_irregular_evidence", base)
    result = type("R", (), {"bcfg": bcfg, "irregular": irr})()
    line = world_line(result, base)
    assert line.startswith("world: clients fallback_send=False; ") and "apply_delay_seconds={'broker-b': 120.0}" in line
    assert "dropped_minutes=[('broker-a', 8)]" in line and "seed" not in line
    assert world_line(type("R", (), {"bcfg": base, "irregular": Irregularity()})(), base) == "world: regular"
    spec = build_spec("storm_late_broker", {"brokers": 3}, now=START)
    with pytest.raises(BacktestError, match=r"unknown brokers \['broker-d'\]"):
        check_world(spec, *scenario_world("storm_late_broker", base))
    with pytest.raises(BacktestError, match="limiter_view is played by the Spark-free loop only"):
        check_world(spec, base, Irregularity(limiter_view=True))


def test_the_cli_refuses_a_world_naming_a_broker_the_scenario_lacks_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pipelines.backtest", "--scenario", "storm_late_broker", "--lake",
                           str(tmp_path / "lake"), "--brokers", "3"], capture_output=True, text=True, timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "unknown brokers ['broker-d']" in lines[0], done.stderr
