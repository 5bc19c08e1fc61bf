"""The closed loop: the governor's real streaming queries (ingest, fast, gold) in continuous mode with the shipped
config, reading what a simulated cluster prints, while the cluster's brokers apply what the governor publishes.

Simulated time ``t`` (UTC, the scenario's own) is stepped the way the shipped trigger paces the queries:

1. The cluster (:class:`pipelines.sim.cluster.ClosedLoopCluster`) runs to ``t`` with the limits in force at its
   brokers. A minute's stats lines are printed at the end of the minute they cover and land
   ``shipping.stats_seconds`` later, rendered by :mod:`pipelines.sim.render` from what the brokers admitted
   (:mod:`pipelines.sim.admitted`); a rejected attempt's send-failure line lands ``shipping.failures_seconds``
   after it failed (or with the shipper's next batch, ``shipping.failures_batch_seconds``).
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
modification time) and reaches every broker ``propagation_seconds`` later, where the reference applier
(:class:`control.applier.LimitApplier`) applies the broker's own figure (:func:`control.record.broker_limit`). No
assumed micro-batch time: every delay from a printed line to a limit in force is landing, trigger pacing, the
measured processing, or propagation.

"""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from control import record as cr
from control.applier import LimitApplier
from control.token_bucket import default_burst
from pipelines.backtest.triggers import Gates, grid_after, next_trigger
from pipelines.sim.settings import BacktestConfig, BacktestError, ShippingConfig, governor_config, with_backtest_key
from pipelines.writeback.publish import LIMITS_FILE, signing_key
from pipelines.sim.admitted import admitted_rows, failure_rows, trickle
from pipelines.sim.cluster import ClosedLoopCluster
from pipelines.sim.minutes import failure_text, land, stats_files
from pipelines.sim.spec import ScenarioSpec

log = logging.getLogger("rate_governor.backtest")
#: Trigger instants the loop keeps stepping after the last line landed, while micro-batches are still pending (the
#: final path's no-data micro-batches emit the last windows one trigger after the data that moved the watermark).
DRAIN_TRIGGERS = 30


class SimClock:
    """The governor's clock: simulated UTC time, advancing 1:1 with wall time inside a step, frozen between."""

    def __init__(self, at: pd.Timestamp) -> None:
        self.base, self.wall = at, None

    def start(self, at: pd.Timestamp) -> float:
        self.base, self.wall = at, time.time()
        return self.wall

    def at_wall(self, wall: float) -> pd.Timestamp:
        """Simulated time of a wall-clock instant (epoch seconds) of the current step."""
        return self.base + pd.Timedelta(seconds=max(0.0, wall - (self.wall or wall)))

    def stop(self, seconds: float) -> None:
        self.base, self.wall = self.base + pd.Timedelta(seconds=seconds), None

    def __call__(self) -> dt.datetime:
        now = self.base if self.wall is None else self.at_wall(time.time())
        return now.floor("us").to_pydatetime()


@dataclass
class Publication:
    """One ``limits.json`` the governor wrote: simulated time, its records, and when the brokers apply it."""

    at: pd.Timestamp
    records: list[dict]
    path: Path
    effective: pd.Timestamp


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


class _Watcher(threading.Thread):
    """Polls ``limits.json`` during a step; every change of its records is a :class:`Publication`."""

    def __init__(self, path: Path, clock: SimClock, out_dir: Path, propagation: float, seen: list) -> None:
        super().__init__(daemon=True)
        self.path, self.clock, self.out_dir, self.propagation = path, clock, out_dir, propagation
        self.published: list[Publication] = []
        self.seen = seen  # [last (mtime_ns, size), last records, copies written]
        self.halt = threading.Event()

    def check(self) -> None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return
        if (st.st_mtime_ns, st.st_size) == self.seen[0]:
            return
        self.seen[0] = (st.st_mtime_ns, st.st_size)
        try:
            records = cr.read_limits_file(self.path)
        except (OSError, ValueError):
            self.seen[0] = None
            return
        if records == self.seen[1]:
            return
        self.seen[1] = records
        at = self.clock.at_wall(st.st_mtime_ns / 1e9)
        self.seen[2] += 1
        copy = self.out_dir / f"limits-{self.seen[2]:05d}.json"
        cr.write_limits_file(records, copy, generated_at=at.floor("us").to_pydatetime())
        self.published.append(Publication(at, records, copy, at + pd.Timedelta(seconds=self.propagation)))

    def run(self) -> None:
        while not self.halt.wait(0.02):
            self.check()


class Brokers:
    """The simulated brokers' appliers: one :class:`control.applier.LimitApplier` per broker, fed with the
    publications at their effective times, and the limit vectors they give the cluster's pairs."""

    def __init__(self, cluster: ClosedLoopCluster, key: bytes | None) -> None:
        self.cluster = cluster
        self.appliers = {b: LimitApplier(key, broker=b) for b in cluster.brokers}
        self.pending: list[Publication] = []
        self.timeline: list[tuple[pd.Timestamp, dict]] = []
        logging.getLogger("rate_governor.applier").setLevel(logging.WARNING)

    def next_event(self, after: pd.Timestamp) -> pd.Timestamp | None:
        """The next instant after ``after`` when the limits at the brokers change: a delivery or an expiry."""
        times = [max(p.effective, after) for p in self.pending]  # one already due is applied at once
        if self.timeline:
            for _qps, rec in self.timeline[-1][1].values():
                expires = pd.Timestamp(cr.parse_expires_at(rec["expires_at"]))
                if expires > after:
                    times.append(expires)
        return min(times) if times else None

    def apply_until(self, when: pd.Timestamp) -> None:
        """Run the cluster to ``when``, changing its limits at every delivery and expiry on the way."""
        c = self.cluster
        while True:
            event = self.next_event(c.now)
            if event is None or event > when:
                break
            c.advance_to(event)
            self._refresh(event)
        c.advance_to(when)

    def _refresh(self, at: pd.Timestamp) -> None:
        now = at.floor("us").to_pydatetime()
        for pub in [p for p in self.pending if p.effective <= at]:
            for applier in self.appliers.values():
                applier.load_file(pub.path, now=now)
            self.pending.remove(pub)
        c, now_ms = self.cluster, int(at.value // 1_000_000)
        L = len(c.pairs)
        limit, burst, open_ms = np.full(L, np.nan), np.ones(L), np.full(L, float(c.cfg.breaker_open_ms))
        snapshot = {}
        for i, (b, rt, r) in enumerate(zip(c.pairs["broker"], c.pairs["resource_type"], c.pairs["resource"])):
            if rt not in cr.RESOURCE_TYPES:
                continue
            rec = self.appliers[b].current_record(rt, r, now_ms)
            if rec is None or rec["mode"] != "enforce":
                continue
            qps, bu = cr.broker_limit(rec, b)
            limit[i], burst[i] = qps, bu if bu is not None else default_burst(qps)
            open_ms[i] = rec["breaker_open_ms"]
            snapshot[(b, rt, r)] = (qps, rec)
        c.set_limits(limit, burst, open_ms)
        if not self.timeline or self.timeline[-1][1] != snapshot:
            self.timeline.append((at, snapshot))


class Shipper:
    """What has landed by a simulated time: each minute's stats lines ``stats_seconds`` after the end of the minute
    they cover (rendered from what the brokers admitted), each send-failure line ``failures_seconds`` after it was
    logged (or at the shipper's last batch, every ``failures_batch_seconds``), the demand's trickle of ordinary
    failures included. The cluster must have run to the time asked for."""

    def __init__(self, cluster: ClosedLoopCluster, shipping: ShippingConfig, rng: np.random.Generator) -> None:
        self.cluster, self.ship, self.rng = cluster, shipping, rng
        self.background = trickle(cluster, rng)
        self.landed: set[int] = set()
        self.admitted: list[pd.DataFrame] = []
        self.logged = self.trickled = 0

    def due(self, t: pd.Timestamp, serial: int) -> tuple[list[tuple[str, str]], list[int], int]:
        """(files to land at ``t``: relative path and text, the minutes whose stats lines they hold, failure lines);
        ``serial`` names the failures file."""
        c, ship = self.cluster, self.ship
        minutes = [m for m in range(c.minutes_done()) if m not in self.landed
                   and c.start + pd.Timedelta(minutes=m + 1, seconds=ship.stats_seconds) <= t]
        files: list[tuple[str, str]] = []
        if minutes:
            self.admitted += [admitted_rows(c, m) for m in minutes]
            self.landed.update(minutes)
            rendered = stats_files(c.spec, pd.concat(self.admitted, ignore_index=True), set(minutes))
            files += [f for m in sorted(rendered) for f in rendered[m]]
        cutoff = t - pd.Timedelta(seconds=ship.failures_seconds)
        if ship.failures_batch_seconds > 0:
            batch = ship.failures_batch_seconds
            cutoff = pd.Timestamp(int(math.floor(cutoff.value / 1e9 / batch) * batch * 1e9), tz="UTC")
        last_tick = int(np.floor((cutoff - c.start).total_seconds() / c.dt))
        upto = self.logged
        while upto < len(c.rejections.tick) and c.rejections.tick[upto] < last_tick:
            upto += 1
        parts = [failure_rows(c, self.logged, upto, self.rng)]
        self.logged = upto
        bg_end = int(self.background["event_time"].searchsorted(cutoff, side="left")) if len(self.background) else 0
        parts.append(self.background.iloc[self.trickled:bg_end])
        self.trickled = max(self.trickled, bg_end)
        parts = [p for p in parts if len(p)]
        n = 0
        if parts:
            failures = pd.concat(parts, ignore_index=True)
            files.append((f"send_failures/s{serial:05d}.jsonl", failure_text(failures)))
            n = len(failures)
        return files, minutes, n


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
             propagation_seconds: float | None = None, progress=None, backlog_minutes: int = 0) -> LoopResult:
    """Run ``spec`` in closed loop against the governor's real queries, tables in ``lake`` (fresh).
    ``backlog_minutes``: the lines of the first minutes land as one backlog (the first step is when the last of
    them lands): cheaper, for a test whose incident starts later; 0 = minute by minute from the start.
    ``progress(step, publications)`` is called after every step.

    Raises:
        BacktestError: ``lake`` already holds governor tables.
        RuntimeError: a governor query failed (its name and error).
    """
    from pipelines import governor
    from pipelines.job.flows.assembly import build_governor
    from pipelines.job.lease import GovernorLease
    from pipelines.dataplane.lake import open_lake
    from pipelines.backtest.results import read_limits

    lake = Path(lake)
    if (lake / "_checkpoints").exists() or (lake / "gold").exists():
        raise BacktestError(f"lake {lake} already holds governor tables; use a fresh --lake")
    prop = bcfg.propagation_seconds if propagation_seconds is None else float(propagation_seconds)
    landing, work_dir = lake / "backtest" / "landing", lake / "backtest" / "published"
    for d in (landing / "broker_stats", landing / "send_failures", work_dir):
        d.mkdir(parents=True, exist_ok=True)
    cfg = with_backtest_key(governor_config(bcfg, str(landing), str(lake)), lake)
    trigger, ship = cfg.windows.trigger_seconds, bcfg.shipping
    cluster = ClosedLoopCluster(spec, bcfg.broker, bcfg.clients)
    brokers = Brokers(cluster, signing_key(cfg))
    rng = np.random.default_rng(spec.seed + 1)
    clock = SimClock(cluster.start)
    lease = GovernorLease(cfg.lake.path, cfg.lake.lease_ttl_seconds)
    lease.acquire()
    previous_level = _log_level(spark, _POLL_LOGGER, "ERROR")
    started = time.monotonic()
    steps: list[Step] = []
    publications: list[Publication] = []
    seen: list = [None, None, 0]
    shipper = Shipper(cluster, ship, rng)
    lines_total = 0
    queries: list = []
    try:
        gov = build_governor(spark, cfg, clock)
        gates = Gates.install(gov, lake / "backtest" / "events-outbox")
        queries = governor.start_queries(spark, gov, once=False, interval=f"{bcfg.poll_milliseconds} milliseconds")
        by_name = {q.name.removeprefix("rate-governor-"): q for q in queries}
        every = {"ingest": trigger, "gold": trigger, "fast": cfg.windows.fast_trigger_seconds}
        every = {name: every[name] for name in by_name}
        grid = math.gcd(*every.values())
        t = max(grid_after(cluster.start, trigger),
                cluster.start + pd.Timedelta(minutes=backlog_minutes, seconds=ship.stats_seconds))
        t = grid_after(t - pd.Timedelta(microseconds=1), trigger)
        due = {name: t for name in by_name}
        last_land = cluster.end + pd.Timedelta(seconds=max(ship.stats_seconds, ship.failures_seconds
                                                           + ship.failures_batch_seconds))
        stop = last_land + pd.Timedelta(seconds=trigger * DRAIN_TRIGGERS)
        running: dict[str, tuple[pd.Timestamp, Step]] = {}
        watcher = None
        clock.start(t)
        while t <= stop:
            brokers.apply_until(t)
            started_here, landed, n_failures = [], [], 0
            for name in sorted(by_name):
                if name in running or due[name] > t:
                    continue
                if name == "ingest":
                    files, landed, n_failures = shipper.due(t, len(steps))
                    lines_total += n_failures
                    land(landing, files)
                    work = bool(files)
                else:
                    work = gates.release(name) > 0
                if (work or gates.waiting(name)) and gates.open(name, by_name[name], planned=work):
                    if watcher is None:
                        watcher = _Watcher(lake / LIMITS_FILE, clock, work_dir, prop, seen)
                        watcher.start()
                    started_here.append(name)
                else:
                    due[name] = grid_after(t, every[name])
            if started_here:
                step = Step(t, 0.0, landed, n_failures, len(started_here))
                steps.append(step)
                running.update({name: (t, step) for name in started_here})
            following = t + pd.Timedelta(seconds=grid)
            while running:
                for name in [n for n in running if gates.finished(n)]:
                    seconds = gates.processing(name, by_name[name])
                    began, step = running.pop(name)
                    due[name] = next_trigger(began, seconds, every[name])
                    step.query_seconds[name] = seconds
                    step.seconds = max(step.seconds, seconds)
                if running and pd.Timestamp(clock()) >= following:
                    break
                time.sleep(0.01)
            if watcher is not None and not running:
                watcher.halt.set()
                watcher.join()
                watcher.check()
                publications += watcher.published
                brokers.pending += watcher.published
                if progress is not None and steps:
                    progress(steps[-1], watcher.published)
                watcher = None
            if running:
                t = following
                continue
            gates.settle()  # a no-data micro-batch Spark plans right after the last one reaches its gate
            now = pd.Timestamp(clock())
            t = max(following, grid_after(now - pd.Timedelta(microseconds=1), grid) if now > t else following)
            if t > last_land and not any(gates.waiting(n) or gates.pending(n) for n in by_name):
                break
            clock.start(t)
    finally:
        for q in queries:
            if q.isActive:
                q.stop()
        lease.release()
        _log_level(spark, _POLL_LOGGER, previous_level)
    brokers.apply_until(cluster.end)
    limits = read_limits(open_lake(spark, lake, cfg.lake.writer))
    return LoopResult(spec=spec, bcfg=bcfg, cluster=cluster, propagation_seconds=prop, trigger_seconds=trigger,
                      watermark_seconds=cfg.windows.watermark_seconds, steps=steps, publications=publications,
                      in_force=brokers.timeline, limits=limits, lake=lake,
                      wall_seconds=time.monotonic() - started, failure_lines=lines_total)
