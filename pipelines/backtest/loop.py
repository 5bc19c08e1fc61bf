"""The closed loop: the governor's real streaming queries (ingest, fast, gold) in continuous mode with the shipped
config, reading what a simulated cluster prints, while the cluster's brokers apply what the governor publishes, in
the world of the scenario (:class:`pipelines.sim.irregular.Irregularity`, regular by default).

Simulated time ``t`` (UTC, the scenario's own) is stepped the way the shipped trigger paces the queries:

1. The cluster (:class:`pipelines.sim.cluster.ClosedLoopCluster`) runs to ``t`` with the limits in force at its
   brokers (:class:`pipelines.backtest.brokers.Brokers`). What has landed by ``t`` is written to the landing
   directory (:class:`pipelines.backtest.shipper.Shipper`: each broker's stats file of a minute when the
   simulator's shipping model lands it, late, dropped, twice or never; send-failure lines
   ``shipping.failures_seconds`` after they were logged).
2. When something landed, or a query has a micro-batch to run, one step on the product's trigger grid
   (:mod:`pipelines.backtest.triggers`): each query runs at most one micro-batch, on what existed at the instant
   (the gold query finds the events files the ingest query wrote at the previous instant; a no-data micro-batch
   that emits the windows the watermark has just passed runs one instant after the data that moved it); the
   governor's clock (:class:`SimClock`: ``decided_at``, ``expires_at``, the publisher's "now") reads ``t`` + the
   wall time elapsed in this step. The step's measured time is its longest micro-batch (Spark's progress events,
   without the wait at the harness's gate), added to simulated time 1:1.
3. The next step starts as Spark's processing-time trigger would start it
   (``ProcessingTimeExecutor``: at the next multiple of ``windows.trigger_seconds`` after this one started, or at
   once when this one ran longer); a trigger that finds nothing new costs nothing and is skipped.

Every ``control/limits.json`` the governor writes is seen by a watcher thread (its publication time: the file's
modification time) and reaches broker ``b`` ``propagation_seconds`` + its own apply delay later, where the reference
applier applies the broker's own figure. No assumed micro-batch time: every delay from a printed line to a limit in
force is landing, trigger pacing, the measured processing, propagation or a broker's delay.

**A governor killed and restarted** (``Irregularity.governor_restart_second``, ``governor_down_seconds``): at the
first instant of the harness's grid (the gcd of the queries' triggers) at or after ``governor_restart_second -
governor_down_seconds`` with no micro-batch running, the governor is killed
(:meth:`pipelines.backtest.instance.GovernorInstance.kill`: no shutdown, its lease left behind); while it is down
the cluster runs with the limits last applied at its brokers (each expiring at its ``expires_at``) and the lines
keep landing, at the ingest trigger's instants; at the first instant at or after ``governor_restart_second`` a new
governor starts on the same lake and checkpoints, taking the stale lease over (retried at each ingest trigger while
the old lease is still valid), and reads what landed meanwhile as its backlog.
"""

from __future__ import annotations

import bisect
import datetime as dt
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from pipelines.backtest.brokers import Brokers, Publication, Watcher
from pipelines.backtest.instance import GovernorInstance, Life
from pipelines.backtest.shipper import Shipper
from pipelines.backtest.triggers import grid_after, next_trigger
from pipelines.sim.cluster import ClosedLoopCluster
from pipelines.sim.irregular import Irregularity
from pipelines.sim.minutes import land
from pipelines.sim.settings import BacktestConfig, BacktestError, governor_config, with_backtest_key
from pipelines.sim.spec import ScenarioSpec
from pipelines.writeback.publish import LIMITS_FILE, signing_key

log = logging.getLogger("rate_governor.backtest")
#: Trigger instants the loop keeps stepping after the last line landed, while micro-batches are still pending (the
#: final path's no-data micro-batches emit the last windows one trigger after the data that moved the watermark).
DRAIN_TRIGGERS = 30
_TICK = pd.Timedelta(microseconds=1)


class SimClock:
    """The governor's clock: simulated UTC time, advancing 1:1 with wall time inside a step, frozen between."""

    def __init__(self, at: pd.Timestamp) -> None:
        self.base, self.wall = at, None
        self.anchors: list[tuple[float, pd.Timestamp]] = []  # (wall epoch seconds, simulated time) of each start

    def start(self, at: pd.Timestamp) -> float:
        self.base, self.wall = at, time.time()
        self.anchors.append((self.wall, at))
        return self.wall

    def simulated(self, wall: float) -> pd.Timestamp | None:
        """The simulated time of any wall-clock instant (epoch seconds) of the run so far: the last start at or
        before it + the wall time since (a governor table's wall-clock column, e.g. ``ingested_at``, read in the
        scenario's time); None before the first start."""
        i = bisect.bisect_right([w for w, _ in self.anchors], wall) - 1
        return None if i < 0 else self.anchors[i][1] + pd.Timedelta(seconds=wall - self.anchors[i][0])

    def at_wall(self, wall: float) -> pd.Timestamp:
        """Simulated time of a wall-clock instant (epoch seconds) of the current step."""
        return self.base + pd.Timedelta(seconds=max(0.0, wall - (self.wall or wall)))

    def stop(self, seconds: float) -> None:
        self.base, self.wall = self.base + pd.Timedelta(seconds=seconds), None

    def __call__(self) -> dt.datetime:
        now = self.base if self.wall is None else self.at_wall(time.time())
        return now.floor("us").to_pydatetime()


@dataclass
class Step:
    """One step: simulated start, measured processing seconds (wall), what landed, micro-batches run."""

    at: pd.Timestamp
    seconds: float
    stats_minutes: list[int]
    failure_lines: int
    batches: int
    query_seconds: dict[str, float] = field(default_factory=dict)  # per query: its micro-batches' time in the step


@dataclass
class LoopResult:
    """Everything a closed-loop run produced (simulated times UTC)."""

    spec: ScenarioSpec
    bcfg: BacktestConfig
    cluster: ClosedLoopCluster
    propagation_seconds: float
    trigger_seconds: int
    watermark_seconds: int
    steps: list[Step]
    publications: list[Publication]
    in_force: list[tuple[pd.Timestamp, dict]]  # at each change: {(broker, type, resource): (qps here, record)}
    limits: pd.DataFrame  # gold/limits
    lake: Path
    wall_seconds: float
    failure_lines: int = 0
    notes: list[str] = field(default_factory=list)
    irregular: Irregularity = field(default_factory=Irregularity)  # the world the run ran in
    lives: list[Life] = field(default_factory=list)  # each governor started on the lake, in order
    clock: SimClock | None = None  # the governor's clock: SimClock.simulated reads a wall-clock column


#: Spark's "Current batch is falling behind" warning: with the harness's short poll trigger it says nothing (the
#: shipped trigger is stepped in simulated time, and the steps report their measured time).
_POLL_LOGGER = "org.apache.spark.sql.execution.streaming.ProcessingTimeExecutor"


def _log_level(spark, name: str, level: str | None) -> str | None:
    """Set a driver JVM logger's level (None: inherit); returns the previous one."""
    log4j = spark._jvm.org.apache.logging.log4j
    previous = log4j.LogManager.getLogger(name).getLevel()
    log4j.core.config.Configurator.setLevel(name, log4j.Level.toLevel(level) if level else None)
    return previous.toString() if previous is not None else None


def run_loop(spark, spec: ScenarioSpec, bcfg: BacktestConfig, lake: Path,
             propagation_seconds: float | None = None, progress=None, backlog_minutes: int = 0,
             irregular: Irregularity | None = None) -> LoopResult:
    """Run ``spec`` in closed loop against the governor's real queries, tables in ``lake`` (fresh), in the world
    ``bcfg`` (shipping, brokers, clients) and ``irregular`` (module docstring; default the regular world).
    ``backlog_minutes``: the lines of the first minutes land as one backlog (the first step is when the last of
    them lands): cheaper, for a test whose incident starts later; 0 = minute by minute from the start.
    ``progress(step, publications)`` is called after every step.

    Raises:
        BacktestError: ``lake`` already holds governor tables, or ``irregular`` names a broker the scenario does not
            have or asks for ``limiter_view`` (not played through Spark).
        RuntimeError: a governor query failed (its name and error).
    """
    from pipelines.backtest.results import read_limits
    from pipelines.dataplane.lake import open_lake

    started = time.monotonic()
    loop = ClosedLoop(spark, spec, bcfg, Path(lake), propagation_seconds, irregular or Irregularity())
    previous_level = _log_level(spark, _POLL_LOGGER, "ERROR")
    try:
        loop.run(backlog_minutes, progress)
    finally:
        if loop.instance is not None:
            loop.instance.stop()
        _log_level(spark, _POLL_LOGGER, previous_level)
    loop.brokers.apply_until(loop.cluster.end)
    limits = read_limits(open_lake(spark, loop.lake, loop.cfg.lake.writer))
    return LoopResult(spec=spec, bcfg=bcfg, cluster=loop.cluster, propagation_seconds=loop.prop,
                      trigger_seconds=loop.trigger, watermark_seconds=loop.cfg.windows.watermark_seconds,
                      steps=loop.steps, publications=loop.publications, in_force=loop.brokers.timeline,
                      limits=limits, lake=loop.lake, wall_seconds=time.monotonic() - started,
                      failure_lines=loop.lines_total, irregular=loop.irregular, lives=loop.lives,
                      clock=loop.clock)


class ClosedLoop:
    """One run of :func:`run_loop`: the world (cluster, brokers, shipper), the governor started on the lake, and the
    stepping of simulated time (module docstring)."""

    def __init__(self, spark, spec: ScenarioSpec, bcfg: BacktestConfig, lake: Path,
                 propagation_seconds: float | None, irregular: Irregularity) -> None:
        if (lake / "_checkpoints").exists() or (lake / "gold").exists():
            raise BacktestError(f"lake {lake} already holds governor tables; use a fresh --lake")
        self.spark, self.spec, self.bcfg, self.lake, self.irregular = spark, spec, bcfg, lake, irregular
        self.prop = bcfg.propagation_seconds if propagation_seconds is None else float(propagation_seconds)
        self.landing, self.work_dir = lake / "backtest" / "landing", lake / "backtest" / "published"
        self.cfg = with_backtest_key(governor_config(bcfg, str(self.landing), str(lake)), lake)
        if irregular.limiter_view:
            raise BacktestError(f"scenario {spec.name}: limiter_view is played by the Spark-free loop only")
        self.cluster = ClosedLoopCluster(spec, bcfg.broker, bcfg.clients)
        try:
            self.shipper = Shipper(self.cluster, bcfg.shipping, np.random.default_rng(spec.seed + 1), irregular)
        except ValueError as exc:
            raise BacktestError(f"scenario {spec.name}: {exc}") from None
        for d in (self.landing / "broker_stats", self.landing / "send_failures", self.work_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.brokers = Brokers(self.cluster, signing_key(self.cfg), self.prop, irregular)
        self.clock = SimClock(self.cluster.start)
        w = self.cfg.windows
        self.trigger = w.trigger_seconds
        self.every = {"ingest": w.trigger_seconds, "gold": w.trigger_seconds, "fast": w.fast_trigger_seconds}
        self.grid = math.gcd(*self.every.values())
        self.steps: list[Step] = []
        self.publications: list[Publication] = []
        self.lives: list[Life] = []
        self.seen = Watcher.fresh()
        self.lines_total = self.landings = 0
        self.instance: GovernorInstance | None = None
        self.due: dict[str, pd.Timestamp] = {}
        self.running: dict[str, tuple[pd.Timestamp, Step]] = {}
        self.watcher: Watcher | None = None
        ship = bcfg.shipping
        self.last_land = max(self.shipper.last_landing, self.cluster.end + pd.Timedelta(
            seconds=ship.failures_seconds + ship.failures_batch_seconds))
        restart = irregular.governor_restart_second
        at = lambda seconds: self.cluster.start + pd.Timedelta(seconds=seconds)  # noqa: E731
        self.kill_at = None if restart is None else at(restart - irregular.governor_down_seconds)
        self.restart_at = None if restart is None else at(restart)

    # --- the governor's life -----------------------------------------------------------------------------------------
    def start_governor(self, t: pd.Timestamp) -> None:
        """Start a governor at ``t`` (:meth:`GovernorInstance.start`); every query's first trigger is ``t``."""
        self.clock.start(t)
        self.instance = GovernorInstance.start(self.spark, self.cfg, self.clock, self.lake / "backtest" /
                                               "events-outbox", self.bcfg.poll_milliseconds)
        self.clock.start(t)  # starting Spark's queries is no micro-batch: the first trigger is at t
        self.lives.append(self.instance.life)
        every = {name: self.every[name] for name in self.instance.by_name}
        self.every, self.due, self.running = every, {name: t for name in every}, {}

    def kill_and_restart(self, t: pd.Timestamp) -> pd.Timestamp:
        """Kill the governor at ``t``, run the world while it is down (lines land at the ingest trigger's instants),
        start a new one at the first instant at or after the restart it can take the lease at; returns that
        instant."""
        from pipelines.job.lease import LakeHeldError

        self.instance.kill(t)
        self.instance, self.kill_at = None, None
        log.info("governor killed at %s; restart at %s", t, self.restart_at)
        restart = grid_after(self.restart_at - _TICK, self.grid)
        while True:
            t = min(grid_after(t, self.trigger), restart) if t < restart else t
            self.brokers.apply_until(t)
            self.land(t)
            if t < restart:
                continue
            try:
                self.start_governor(t)
                return t
            except LakeHeldError as exc:
                log.info("restart at %s refused (%s); retried at the next trigger", t, exc)
                t = grid_after(t, self.trigger)

    def land(self, t: pd.Timestamp) -> tuple[bool, list[int], int]:
        """Land what is due at ``t``; returns (anything landed, the stats minutes, failure lines)."""
        files, landed, n_failures = self.shipper.due(t, self.landings)
        self.landings += 1
        self.lines_total += n_failures
        land(self.landing, files)
        return bool(files), landed, n_failures

    # --- one step ----------------------------------------------------------------------------------------------------
    def open_queries(self, t: pd.Timestamp) -> None:
        """At ``t``: land what is due for the ingest query, release the events files for the deciding ones, and let
        every query whose trigger is due and that has work run one micro-batch."""
        inst = self.instance
        started_here, landed, n_failures = [], [], 0
        for name in sorted(inst.by_name):
            if name in self.running or self.due[name] > t:
                continue
            if name == "ingest":
                work, landed, n_failures = self.land(t)
            else:
                work = inst.gates.release(name) > 0
            if (work or inst.gates.waiting(name)) and inst.gates.open(name, inst.by_name[name], planned=work):
                if self.watcher is None:
                    self.watcher = Watcher(self.lake / LIMITS_FILE, self.clock, self.work_dir, self.seen)
                    self.watcher.start()
                started_here.append(name)
            else:
                self.due[name] = grid_after(t, self.every[name])
        if started_here:
            step = Step(t, 0.0, landed, n_failures, len(started_here))
            self.steps.append(step)
            self.running.update({name: (t, step) for name in started_here})

    def await_running(self, following: pd.Timestamp) -> None:
        """Wait until the running micro-batches finish, or the governor's clock reaches ``following``; each finished
        one's measured time sets its query's next trigger (:func:`next_trigger`)."""
        inst = self.instance
        while self.running:
            for name in [n for n in self.running if inst.gates.finished(n)]:
                seconds = inst.gates.processing(name, inst.by_name[name])
                began, step = self.running.pop(name)
                self.due[name] = next_trigger(began, seconds, self.every[name])
                step.query_seconds[name] = seconds
                step.seconds = max(step.seconds, seconds)
            if self.running and pd.Timestamp(self.clock()) >= following:
                return
            time.sleep(0.01)

    def collect_publications(self, progress) -> None:
        """Once no micro-batch runs: what the watcher saw is published to the brokers."""
        if self.watcher is None or self.running:
            return
        published, rewritten = self.watcher.finish()
        self.publications += published
        for pub in sorted(published + rewritten, key=lambda p: p.at):
            self.brokers.publish(pub)
        if progress is not None and self.steps:
            progress(self.steps[-1], published)
        self.watcher = None

    # --- the run -----------------------------------------------------------------------------------------------------
    def first_instant(self, backlog_minutes: int) -> pd.Timestamp:
        """The first step: the first trigger after the start, or when the backlog's last minute lands."""
        ship, start = self.bcfg.shipping, self.cluster.start
        t = max(grid_after(start, self.trigger),
                start + pd.Timedelta(minutes=backlog_minutes, seconds=ship.stats_seconds))
        return grid_after(t - _TICK, self.trigger)

    def run(self, backlog_minutes: int, progress) -> None:
        """Step simulated time from the first instant until the last line has landed and no micro-batch is pending
        (or :data:`DRAIN_TRIGGERS` triggers after the last landing)."""
        t = self.first_instant(backlog_minutes)
        stop = self.last_land + pd.Timedelta(seconds=self.trigger * DRAIN_TRIGGERS)
        self.start_governor(t)
        while t <= stop:
            self.brokers.apply_until(t)
            if self.kill_at is not None and t >= self.kill_at and not self.running:
                t = self.kill_and_restart(t)
                continue
            self.open_queries(t)
            following = grid_after(t, self.grid)
            self.await_running(following)
            self.collect_publications(progress)
            if self.running:
                t = following
                continue
            gates = self.instance.gates
            gates.settle()  # a no-data micro-batch Spark plans right after the last one reaches its gate
            now = pd.Timestamp(self.clock())
            t = max(following, grid_after(now - _TICK, self.grid) if now > t else following)
            if t > self.last_land and not any(gates.waiting(n) or gates.pending(n) for n in self.instance.by_name):
                break
            self.clock.start(t)
            self.instance.renew(self.clock())
