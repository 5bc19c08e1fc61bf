"""The closed loop without Spark: the simulated cluster (:class:`pipelines.sim.cluster.ClosedLoopCluster`: token
buckets and breakers, producers retrying on other brokers, consumers falling back to plain sends) against the
governor's decision plane (:mod:`pipelines.decide`) directly, in event time. The same decision code as the
streaming job and the Spark backtest; Spark's part (parsing, the windowed sums) is modelled by
:mod:`pipelines.sim.windows`. Fast enough to sweep hundreds of closed loops (``tests/sim/test_sweep.py``).

Timing, as the product runs (shipped ``conf/local.toml``):

* a minute's stats lines land ``shipping.stats_seconds`` after the end of the minute they cover; a rejected
  attempt's failure line ``shipping.failures_seconds`` after it failed (unless the world's failure-log gaps,
  :class:`pipelines.sim.irregular.FailureShipping`, drop, delay, repeat or hold it: such lines wait in a queue by
  landing second);
* the ingest query runs on ``windows.trigger_seconds``: what landed by its trigger is parsed, and its events are
  written :attr:`Timing.ingest_seconds` later;
* the fast query runs on ``windows.fast_trigger_seconds`` on the events written by then: its running sums of open
  windows, its preliminary decisions published :attr:`Timing.fast_seconds` after its trigger;
* the gold query runs on ``windows.trigger_seconds`` on the events written by then: windows are final one
  micro-batch after the one whose input moved the watermark past them; its decisions are published
  :attr:`Timing.gold_seconds` after its trigger;
* a publication is in force at every broker ``propagation_seconds`` later (the record's own figure per broker),
  until it is replaced, lifted or expires;
* in the observation mode ``limiter_view`` (:class:`pipelines.sim.irregular.Irregularity`) each publication also
  reads every broker's limiters, as the RocketMQ admin sink does (:mod:`pipelines.sim.limiter_view`): their
  ``control/limiter_rejections`` rows reach the next gold micro-batches (``FinalInputs.limiter_rejections``; the
  fast path does not read them). Without it, a limiter's rejections show only as the producers' logged failures.

Processing times are the model's (:class:`Timing`), not measured: the Spark backtest (:mod:`pipelines.backtest.loop`)
measures them.
"""

from __future__ import annotations

import bisect
import datetime as dt
import heapq
import itertools
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa
import polars as pl
import pyarrow.compute as pc
from pydantic import Field

from pipelines import columns
from pipelines import rocketmq as rmq
from pipelines.config import ConfigSection, GovernorConfig
from pipelines.decide.arrow import from_rows, micros, to_polars, when
from pipelines.decide.rules.evidence import expected_brokers, open_evidence
from pipelines.decide.paths.fast import OpenRows, decide_fast, prepare_fast
from pipelines.decide.paths.final import decide_final, decide_open, prepare_final, window_bounds
from pipelines.decide.records.inputs import FastInputs, FinalInputs, LockedInputs
from pipelines.decide.paths.reconcile import latest_per_resource, lift_reach_seconds, read_as_limited
from pipelines.sim.admitted import FailureText, stats_events, trickle
from pipelines.sim.brokers import Broker
from pipelines.sim.cluster import ClosedLoopCluster
from pipelines.sim.irregular import FailureShipping, Irregularity, stats_landings
from pipelines.sim.limiter_view import AdminSinkView
from pipelines.sim.override_tick import tick as override_tick
from pipelines.sim.windows import FAILURE, FinalWindows, OpenWindows, gold_tables

UTC = dt.timezone.utc


class Timing(ConfigSection):
    """Modelled processing seconds of one micro-batch per query (event time), and the simulation's tick."""

    ingest_seconds: float = Field(default=2.0, ge=0)  # landing → its events written for the deciding queries
    fast_seconds: float = Field(default=0.5, ge=0)    # fast trigger → its decisions published
    gold_seconds: float = Field(default=1.0, ge=0)    # gold trigger → its decisions published
    tick_seconds: float = Field(default=0.5, gt=0)    # the cluster's tick (its token buckets and breakers)


@dataclass
class Store:
    """The decisions' memory of one simulated governor (as :class:`pipelines.job.flows.store.DecisionStore`, no
    lake)."""

    state: dict = field(default_factory=dict)
    limits: dict = field(default_factory=dict)
    lifted: dict = field(default_factory=dict)  # key → when its newest lift was decided (reconcile.read_as_limited)
    _tables: dict = field(default_factory=dict)

    def state_table(self) -> pa.Table:
        if "state" not in self._tables:
            self._tables["state"] = from_rows(list(self.state.values()), columns.POLICY_STATE)
        return self._tables["state"]

    def limits_table(self) -> pa.Table:
        if "limits" not in self._tables:
            self._tables["limits"] = from_rows(list(self.limits.values()), columns.GOLD_LIMITS)
        return self._tables["limits"]

    def limited_keys(self) -> tuple[str, ...]:
        return tuple(sorted(f"{t}\x1f{r}" for (t, r), row in self.state.items() if row.get("limit_qps") is not None))

    def probing(self) -> bool:
        """Whether a resource has a probe in flight (whose deadline the tick keeps)."""
        return any(row.get("probe_decided_at") is not None for row in self.state.values())

    @classmethod
    def read_back(cls, store: "Store") -> "Store":
        """A restarted governor's memory: ``store``'s ``state/policy`` and ``gold/limits`` rows written as Arrow
        tables of their lake schemas (:data:`pipelines.columns.POLICY_STATE`, :data:`~pipelines.columns.GOLD_LIMITS`)
        and read back, nothing else (no cache, no object shared with ``store``)."""
        state = pa.Table.from_pylist(store.state_table().to_pylist(), schema=store.state_table().schema)
        limits = pa.Table.from_pylist(store.limits_table().to_pylist(), schema=store.limits_table().schema)
        fresh = cls()
        fresh.add(limits, state)
        return fresh

    def add(self, limits: pa.Table, state: pa.Table | None = None) -> None:
        self._tables.clear()
        for r in (state.to_pylist() if state is not None else []):
            self.state[(r["resource_type"], r["resource"])] = r
        for r in limits.to_pylist():
            key = (r["resource_type"], r["resource"])
            if r["action"] == "lift" and (key not in self.lifted or r["decided_at"] > self.lifted[key]):
                self.lifted[key] = r["decided_at"]
            if key not in self.limits or r["version"] >= self.limits[key]["version"]:
                self.limits[key] = r


@dataclass
class SimResult:
    """What a simulated closed loop produced, in the shape the backtest's figures read
    (:func:`pipelines.sim.figures.compute`)."""

    spec: object
    cluster: ClosedLoopCluster
    propagation_seconds: float
    trigger_seconds: int
    watermark_seconds: int
    in_force: list
    limits: pd.DataFrame
    steps: list = field(default_factory=list)
    publications: list = field(default_factory=list)
    wall_seconds: float = 0.0
    failure_lines: int = 0
    bcfg: object = None
    irregular: object = None  # the world's irregularities (pipelines.sim.irregular.Irregularity)
    states: list = field(default_factory=list)  # (decided at, state/policy row) of every row the governor saved
    detection: object = None  # the governor's [detection] (pipelines.config.DetectionConfig)
    limits_cfg: object = None  # the governor's [limits] (pipelines.config.LimitsConfig)


def closed_cluster(spec, bcfg, timing: Timing | None = None) -> ClosedLoopCluster:
    """The cluster :func:`simulate` runs ``spec`` on (the backtest's brokers at the simulation's tick)."""
    timing = timing or Timing()
    return ClosedLoopCluster(spec, bcfg.broker.model_copy(update={"tick_seconds": timing.tick_seconds}),
                             bcfg.clients)


def simulate(spec, cfg: GovernorConfig, bcfg, timing: Timing | None = None,
             propagation_seconds: float | None = None, record=None,
             cluster: ClosedLoopCluster | None = None, *, irregular: Irregularity | None = None,
             overrides: tuple = (), background: pd.DataFrame | None = None) -> SimResult:
    """Run ``spec`` in closed loop against the decision plane (module docstring). ``cfg``: the governor's config
    (shipped ``conf/local.toml``); ``bcfg``: the backtest's world (:class:`pipelines.sim.settings.BacktestConfig`:
    shipping, brokers, clients, propagation). ``record(kind, inputs, outputs)``: called with each fast micro-batch's
    decision inputs and its preliminary ``gold/limits`` rows (kind ``"fast"``; ``bench/same_preliminary.py`` replays
    them through another commit's fast path), and with each ingest micro-batch's trigger second and the events it
    writes for the deciding queries (kind ``"ingest"``: ``{"second": s, "written_at": s}``, the events). ``cluster``:
    :func:`closed_cluster` of the same arguments, not run yet (a caller that built it to look at the scenario first).
    ``irregular``: the world's irregularities (:class:`pipelines.sim.irregular.Irregularity`: shippers that lag, skip,
    repeat or stop, brokers that apply late or forget, a governor restart; default none). ``overrides``: operators'
    overrides (parsed, times in the run's UTC), applied by both paths and by the override tick at every fast trigger
    (:mod:`pipelines.sim.overrides`). ``background``: the run's failures that no limit or queue causes (columns
    ``event_time`` UTC, ``broker``, ``topic``, ``message``, ``code``: a recording's own, :mod:`pipelines.sim.replay`);
    default the demand's generated trickle (:func:`pipelines.sim.admitted.trickle`). Raises ``ValueError`` for a
    cluster that has run already or an irregularity
    naming an unknown broker or topic."""
    import time as _time

    started = _time.monotonic()
    timing = timing or Timing()
    cluster = cluster if cluster is not None else closed_cluster(spec, bcfg, timing)
    if cluster.k:
        raise ValueError("the cluster has run already")
    prop = bcfg.propagation_seconds if propagation_seconds is None else float(propagation_seconds)
    irregular = irregular or Irregularity()
    run = _Run(spec, cfg, bcfg, timing, prop, record, cluster, irregular, overrides, background)
    run.run()
    w = cfg.windows
    limits = pd.DataFrame(run.decided, columns=[n for n, _ in columns.GOLD_LIMITS])
    return SimResult(spec, cluster, prop, w.trigger_seconds, w.watermark_seconds, run.brokers.timeline, limits,
                     wall_seconds=_time.monotonic() - started, failure_lines=run.failure_lines, bcfg=bcfg,
                     irregular=irregular, states=run.states, detection=cfg.detection, limits_cfg=cfg.limits)


class _Governor:
    """The simulated governor's memory and where its decisions go: its :class:`Store`, the fast path's open rows
    (``OpenRows``), the newest finalized window's end and brokers (``horizon``, ``expected``: what an open tick reads,
    :func:`pipelines.decide.paths.final.decide_open`), every ``gold/limits`` row decided (``decided``) and every
    ``state/policy`` row saved with when (``states``); each decision published to ``brokers`` and, when the world
    reads the limiters (``view``), followed by a poll of them."""

    def __init__(self, brokers: Broker, view: AdminSinkView | None) -> None:
        self.brokers, self.view = brokers, view
        self.store, self.memory = Store(), OpenRows()
        self.horizon: dt.datetime | None = None
        self.expected: list = []
        self.decided: list[dict] = []
        self.states: list[tuple] = []

    def restart(self) -> None:
        """A restarted governor: its memory read back from the lake (:meth:`Store.read_back`), no open rows, the
        horizon known again from its first micro-batch that finalizes a window."""
        self.store, self.memory = Store.read_back(self.store), OpenRows()
        self.horizon, self.expected = None, []

    def locked(self, overrides: tuple, open_evidence_rows=None) -> LockedInputs:
        """The decision inputs read under the lock: the state and limits in force, the overrides, ``open_evidence``."""
        return LockedInputs(policy_state=self.store.state_table(), latest_limits=self.store.limits_table(),
                            open_evidence=open_evidence_rows, overrides=overrides)

    def take(self, now: dt.datetime, limits: pa.Table, state: pa.Table | None, poll: bool) -> None:
        """Decided ``limits`` (with the ``state`` rows saved, if any) at ``now`` (UTC): stored, recorded, published;
        the limiters polled when ``poll`` and the world reads them."""
        if state is None:
            self.store.add(limits)
        else:
            self.store.add(limits, state)
        self.decided += limits.to_pylist()
        if state is not None:
            self.states += [(now, r) for r in state.to_pylist()]
        self.brokers.publish(pd.Timestamp(now), self.store.limits)
        if poll and self.view is not None:
            self.view.poll(now, len(self.decided))


class _Landing:
    """What the ingest query reads, in event time: the stats files as they land (``landings``, as
    :func:`pipelines.sim.irregular.stats_landings` gives them), the cluster's rejected attempts as failure lines
    ``shipping.failures_seconds`` after them, the background failures (no limit or queue causes them), and the lines
    of the world's failure-log gaps (:class:`pipelines.sim.irregular.FailureShipping`) from a queue by landing
    second. :meth:`batch` is one ingest micro-batch's events; ``failure_lines`` counts the failure lines read."""

    def __init__(self, spec, cluster: ClosedLoopCluster, irregular: Irregularity, ship, background,
                 landings: list[tuple[float, int, str]]) -> None:
        self.cluster, self.ship, self.landings = cluster, ship, landings
        self.minute_events: dict[int, list] = {}  # minute → its stats events (every broker),
        #                                           while a landing needs them
        self.classify = FailureText(cluster)
        if background is None:
            background = trickle(cluster, np.random.default_rng(spec.seed + 1))
        self.bg = sorted(zip((pd.Timestamp(t) for t in background["event_time"]), background["broker"],
                             background["topic"], [rmq.classify_failure_text(m, None if pd.isna(c) else int(c))
                                                   for m, c in zip(background["message"], background["code"])]))
        self.pair_broker = [cluster.brokers[i] for i in cluster.pair_broker]
        self.pair_topic = [rmq.RETRY_TOPIC_PREFIX + r if k == "group" else r
                           for k, r in zip(cluster.pairs["resource_type"], cluster.pairs["resource"])]
        self.shipper = FailureShipping(irregular, set(self.pair_topic) | set(background["topic"]),
                                       ship.failures_seconds)
        self.gapped = self.shipper.topics  # failure lines of these topics go through the queue below
        self.held: list[tuple] = []  # (landing second, order, event): failure lines landing otherwise than usual
        self.order = itertools.count()
        self.seen_rejections = self.landed_done = self.bg_done = 0
        self.failure_lines = 0

    def last_landing(self) -> float:
        """The last second a line of the run lands."""
        cluster = self.cluster
        return max([self.ship.stats_seconds + cluster.T * 60] + [x[0] for x in self.landings[-1:]]
                   + ([self.shipper.last_landing(cluster.T)] if self.gapped else []))

    def batch(self, second: int, t: pd.Timestamp) -> list:
        """The events of what landed by ``second`` (``t`` UTC) and was not read before."""
        batch = self._stats(second)
        self._rejections(second, batch)
        self._background(t - pd.Timedelta(seconds=self.ship.failures_seconds), batch)
        while self.held and self.held[0][0] <= second:
            event = heapq.heappop(self.held)[2]
            batch.append(event)
            self.failure_lines += event[5]
        return batch

    def _stats(self, second: int) -> list:
        """The stats events of the files landed by ``second``: a minute's events of the brokers whose file landed."""
        batch = []
        arrived: dict[int, set] = {}  # minute → the brokers whose file of it landed by now
        while self.landed_done < len(self.landings) and self.landings[self.landed_done][0] <= second:
            _, m, b = self.landings[self.landed_done]
            arrived.setdefault(m, set()).add(b)
            self.landed_done += 1
        for m in sorted(arrived):
            if m not in self.minute_events:
                self.minute_events[m] = stats_events(self.cluster, m)
            bs = arrived[m]
            batch += self.minute_events[m] if len(bs) == len(self.cluster.brokers) else [
                e for e in self.minute_events[m] if e[1] in bs]
        return batch

    def _rejections(self, second: int, batch: list) -> None:
        """The failure lines of the attempts rejected up to ``shipping.failures_seconds`` before ``second``, into
        ``batch`` (or the queue, for a gapped topic): a tick's lines of one pair and kind, whatever their attempt, one
        event (same time)."""
        cluster, rj, lo = self.cluster, self.cluster.rejections, self.seen_rejections
        last_tick = (second - self.ship.failures_seconds) / cluster.dt - 0.5
        upto = bisect.bisect_right(rj.tick, last_tick, lo=lo)
        lines: dict = {}
        for tick, pair, busy, count in zip(rj.tick[lo:upto], rj.pair[lo:upto], rj.busy[lo:upto], rj.count[lo:upto]):
            lines[tick, pair, busy] = lines.get((tick, pair, busy), 0) + int(count)
        start, times = cluster.start.to_pydatetime(), {}
        for (tick, pair, busy), count in lines.items():
            if tick not in times:
                times[tick] = start + dt.timedelta(seconds=(tick + 0.5) * cluster.dt)
            event = (times[tick], self.pair_broker[pair], self.pair_topic[pair], None,
                     FAILURE + self.classify.rejection(pair, busy), count)
            if event[2] in self.gapped:
                for at in self.shipper.landings(event[2], (tick + 0.5) * cluster.dt):
                    heapq.heappush(self.held, (at, next(self.order), event))
                continue
            batch.append(event)
            self.failure_lines += count
        self.seen_rejections = upto

    def _background(self, cutoff: pd.Timestamp, batch: list) -> None:
        """The background failure lines up to ``cutoff`` (UTC), into ``batch`` (or the queue, for a gapped topic)."""
        while self.bg_done < len(self.bg) and self.bg[self.bg_done][0] <= cutoff:
            at, b, topic, klass = self.bg[self.bg_done]
            event = (at.to_pydatetime(), b, topic, None, FAILURE + klass, 1)
            self.bg_done += 1
            if topic in self.gapped:
                for landing in self.shipper.landings(topic, (at - self.cluster.start).total_seconds()):
                    heapq.heappush(self.held, (landing, next(self.order), event))
                continue
            batch.append(event)
            self.failure_lines += 1


class _Run:
    """One simulated closed loop (:func:`simulate`): the cluster run second by second on the queries' triggers, each
    query a method (:meth:`_ingest`, :meth:`_override_tick`, :meth:`_probe_tick`, :meth:`_fast`, :meth:`_gold`)."""

    def __init__(self, spec, cfg: GovernorConfig, bcfg, timing: Timing, prop: float, record,
                 cluster: ClosedLoopCluster, irregular: Irregularity, overrides: tuple, background) -> None:
        self.cfg, self.timing, self.record, self.cluster, self.overrides = cfg, timing, record, cluster, overrides
        w = self.w = cfg.windows
        self.length = w.length_seconds
        self.under = lift_reach_seconds(w)  # a lift's windows still to be finalized
        landings = stats_landings(irregular, cluster.brokers, cluster.T, bcfg.shipping.stats_seconds)
        self.brokers = Broker(cluster, cfg, prop, irregular.apply_delay_seconds, irregular.broker_restarts)
        view = AdminSinkView(cluster) if irregular.limiter_view else None  # polled at each publish, as the sink reads
        self.gov = _Governor(self.brokers, view)
        self.restart = irregular.governor_restart_second
        self.down_from = self.restart - irregular.governor_down_seconds if self.restart is not None else None
        self.final = FinalWindows(self.length, w.watermark_seconds)
        self.opened = OpenWindows(self.length, w.watermark_seconds)
        self.landing = _Landing(spec, cluster, irregular, bcfg.shipping, background, landings)
        self.landed: list[tuple] = []  # events, in the order they are written for the deciding queries
        self.written_at: list[float] = []  # when each was written (seconds from the start)
        self.history = History(cfg)
        self.fast_seen = self.gold_seen = 0

    @property
    def decided(self) -> list[dict]:
        return self.gov.decided

    @property
    def states(self) -> list[tuple]:
        return self.gov.states

    @property
    def failure_lines(self) -> int:
        return self.landing.failure_lines

    def run(self) -> None:
        """Every query at each of its triggers, on the grid of both trigger intervals, until every line landed and
        its windows were decided; then the cluster to its end."""
        w, cluster = self.w, self.cluster
        step = w.fast_trigger_seconds if w.fast_path != "never" else w.trigger_seconds
        grid = np.gcd(int(step), int(w.trigger_seconds))
        second = int(grid)
        end = int(self.landing.last_landing()) + 6 * w.trigger_seconds + w.watermark_seconds + 60
        while second <= end:
            t = cluster.start + pd.Timedelta(seconds=second)
            self.brokers.run_until(min(t, cluster.end))
            if self.restart is not None and second >= self.restart:  # the governor restarts
                self.gov.restart()
                self.restart = None
            if self.restart is not None and second >= self.down_from:  # killed: no micro-batch runs until the restart
                second += int(grid)
                continue
            if second % w.trigger_seconds == 0:  # ingest: what landed by now
                self._ingest(second, t)
            if self.overrides and second % w.fast_trigger_seconds == 0:
                self._override_tick(t)
            if self.gov.horizon is not None and second % w.fast_trigger_seconds == 0 and self.gov.store.probing():
                self._probe_tick(t)
            if w.fast_path != "never" and second % w.fast_trigger_seconds == 0:
                self._fast(second, t)
            if second % w.trigger_seconds == 0:  # gold: the windows the watermark passed
                self._gold(second, t)
            second += int(grid)
        self.brokers.run_until(cluster.end)

    def _ingest(self, second: int, t: pd.Timestamp) -> None:
        """The ingest micro-batch at ``second``: what landed by now, written ``timing.ingest_seconds`` later."""
        batch = self.landing.batch(second, t)
        self.landed += batch
        self.written_at += [second + self.timing.ingest_seconds] * len(batch)
        if self.record is not None:
            self.record("ingest", {"second": second, "written_at": second + self.timing.ingest_seconds}, batch)

    def _override_tick(self, t: pd.Timestamp) -> None:
        """The override tick: pin, exempt, end, input or not (:func:`pipelines.sim.override_tick.tick`)."""
        gov = self.gov
        if ticked := override_tick(self.overrides, gov.store, t.to_pydatetime(), self.cfg):
            gov.decided += ticked
            self.brokers.publish(t, gov.store.limits)

    def _probe_tick(self, t: pd.Timestamp) -> None:
        """A probe's deadline, kept at every fast trigger: the open windows decided again."""
        gov = self.gov
        now = (t + pd.Timedelta(seconds=self.timing.fast_seconds)).to_pydatetime()
        evidence = open_evidence(gov.memory.rows, gov.horizon, self.length, gov.expected, self.cfg.detection)
        limits, _refused, state = decide_open(gov.horizon, gov.locked(self.overrides, evidence), self.cfg, now,
                                              batch_id=len(gov.decided), origin="sim-tick")
        if limits.num_rows:
            gov.take(now, limits, state, poll=False)

    def _written(self, second: int, seen: int) -> tuple[list, int]:
        """The events written by ``second`` after the first ``seen``, and how many are written by then."""
        new = bisect.bisect_right(self.written_at, second, lo=seen)
        return self.landed[seen:new], max(seen, new)

    def _fast(self, second: int, t: pd.Timestamp) -> None:
        """The fast micro-batch at ``second``: the open windows' running sums, preliminary decisions published
        ``timing.fast_seconds`` later."""
        events, self.fast_seen = self._written(second, self.fast_seen)
        if not events:
            return
        rows, dicts = self.opened.batch_rows(events)
        if not rows.num_rows:
            return
        gov, cfg = self.gov, self.cfg
        now = (t + pd.Timedelta(seconds=self.timing.fast_seconds)).to_pydatetime()
        first = pc.min(rows.column("window_start")).as_py()
        th, bh = self.history.view(first, None)
        inputs = FastInputs(open_rows=rows, topic_history=th, broker_history=bh, open_dicts=dicts,
                            group_history=self.history.groups(first, None),
                            limited=read_as_limited(gov.store.limited_keys(), gov.store.lifted, t.to_pydatetime(),
                                                    self.under))
        remembered = gov.memory.rows if self.record is not None else None
        prepared = prepare_fast(inputs, gov.memory, cfg)
        accepted, _ = decide_fast(prepared, gov.locked(self.overrides), cfg, now, origin="sim-fast")
        if self.record is not None:
            self.record("fast", {"rows": rows, "remembered": remembered,
                                 "topic_history": inputs.topic_history.to_arrow(),
                                 "broker_history": inputs.broker_history.to_arrow(), "state": gov.store.state_table(),
                                 "limits": gov.store.limits_table(), "now": now}, accepted)
        if accepted.num_rows:
            gov.take(now, accepted, None, poll=True)

    def _gold(self, second: int, t: pd.Timestamp) -> None:
        """The gold micro-batch at ``second``: the windows the watermark passed decided (:meth:`_final`), or, when
        none is finalized and a limit is in force, the open ones (:meth:`_open`)."""
        events, self.gold_seen = self._written(second, self.gold_seen)
        if not (events or self.final.pending()):
            return
        sums = self.final.batch(events)
        now = (t + pd.Timedelta(seconds=self.timing.gold_seconds)).to_pydatetime()
        if not sums and self.gov.horizon is not None and self.gov.store.limited_keys():
            self._open(now)
        if sums:
            self._final(sums, t, now)

    def _open(self, now: dt.datetime) -> None:
        """No window finalized: the open windows decided (:func:`pipelines.decide.paths.final.decide_open`)."""
        gov = self.gov
        evidence = open_evidence(gov.memory.rows, gov.horizon, self.length, gov.expected, self.cfg.detection)
        limits, _refused, state = decide_open(gov.horizon, gov.locked(self.overrides, evidence), self.cfg, now,
                                              batch_id=len(gov.decided), origin="sim-gold")
        if limits.num_rows:
            gov.take(now, limits, state, poll=True)

    def _final(self, sums, t: pd.Timestamp, now: dt.datetime) -> None:
        """The finalized windows' gold tables (:func:`pipelines.sim.windows.gold_tables`) decided
        (:func:`pipelines.decide.paths.final.decide_final`) and kept for the baselines."""
        gov, cfg, view = self.gov, self.cfg, self.gov.view
        reduced = gold_tables(sums, self.length, cfg.detection,
                              read_as_limited(gov.store.limited_keys(), gov.store.lifted, t.to_pydatetime(),
                                              self.under))
        first = pc.min(reduced["traffic"].column("window_start")).as_py()
        th, bh = self.history.view(first, first)
        gh = self.history.groups(first, first)
        bounds = window_bounds(reduced["traffic"]) if view is not None else (None, None)
        inputs = FinalInputs(topics=reduced["gold/topic_tps"], groups=reduced["gold/group_tps"],
                             brokers=reduced["gold/broker_tps"], traffic=reduced["traffic"],
                             topic_history=th, broker_history=bh, group_history=gh,
                             limiter_rejections=view.table(*bounds) if bounds[0] else None)
        prepared = prepare_final(inputs, cfg)
        if prepared.first_window is None:
            return
        gov.horizon, gov.expected = prepared.horizon_end, expected_brokers(inputs.brokers)
        # the lift veto's evidence, read only for a resource folded (a candidate or a limit in force)
        evidence = open_evidence(gov.memory.rows, gov.horizon, self.length, gov.expected, cfg.detection) \
            if prepared.candidates or gov.store.limited_keys() else None
        out = decide_final(prepared, gov.locked(self.overrides, evidence), cfg, now, batch_id=len(gov.decided),
                           origin="sim-gold")
        self.history.add(out.tables(), first)
        gov.take(now, out.limits, out.state, poll=True)


def simulate_named(name: str, cfg: GovernorConfig, bcfg, now: dt.datetime | None = None, **kwargs) -> SimResult:
    """:func:`simulate` of the named scenario ``name`` (:data:`pipelines.sim.settings.SCENARIO_SIZES`) in its world
    (:func:`pipelines.sim.settings.scenario_world`: its clients and irregularities); ``now``: as
    :func:`pipelines.sim.settings.build_spec` reads it; ``kwargs``: :func:`simulate`'s."""
    from pipelines.sim.settings import build_spec, scenario_world

    bcfg, irregular = scenario_world(name, bcfg)
    return simulate(build_spec(name, {}, now=now), cfg, bcfg, irregular=irregular, **kwargs)


class History:
    """The finalized windows the gold query has written (``gold/topic_tps``, ``gold/broker_tps``, as polars frames),
    kept for the baselines, and the views the two paths read (cached until the next gold batch: most fast
    micro-batches read the same view)."""

    SPECS = {"gold/topic_tps": columns.GOLD_TOPIC_TPS, "gold/broker_tps": columns.GOLD_BROKER_TPS,
             "gold/group_tps": columns.GOLD_GROUP_TPS}

    def __init__(self, cfg: GovernorConfig) -> None:
        self.cfg = cfg
        self.frames: dict[str, pl.DataFrame | None] = {name: None for name in self.SPECS}
        self._views: dict = {}

    def add(self, tables: dict[str, pa.Table], first: dt.datetime) -> None:
        """A gold batch's tables, without windows older than the baselines of windows from ``first`` on need."""
        since = micros(first - dt.timedelta(seconds=(self.cfg.detection.baseline_windows + 1)
                                            * self.cfg.windows.length_seconds))
        for name in self.SPECS:
            new = pl.from_arrow(tables[name])
            kept = self.frames[name]
            frame = new if kept is None else pl.concat([kept, new], how="vertical")
            self.frames[name] = frame.filter(when("window_start") >= since).rechunk()
        self._views.clear()

    def view(self, first: dt.datetime, before: dt.datetime | None) -> tuple[pl.DataFrame, pl.DataFrame]:
        """The finalized topic and broker windows the baselines of windows from ``first`` need (before ``before``)."""
        return self._view(first, before)[:2]

    def groups(self, first: dt.datetime, before: dt.datetime | None):
        """A function returning the finalized group windows a retry limit's consume basis of windows from ``first``
        needs (before ``before``): read only when a storm fires, as the job reads ``gold/group_tps``."""
        return lambda: self._view(first, before)[2]

    def _view(self, first: dt.datetime, before: dt.datetime | None) -> tuple[pl.DataFrame, ...]:
        key = (first, before)
        if key not in self._views:
            since = micros(first - dt.timedelta(seconds=self.cfg.detection.baseline_windows
                                                * self.cfg.windows.length_seconds))
            out = []
            for name, spec in self.SPECS.items():
                frame = self.frames[name]
                if frame is None or frame.height == 0:
                    out.append(to_polars(None, spec))
                    continue
                keep = when("window_start") >= since
                if before is not None:
                    keep = keep & (when("window_start") < micros(before))
                out.append(frame.filter(keep))
            self._views[key] = tuple(out)
        return self._views[key]


__all__ = ["Timing", "simulate", "simulate_named", "SimResult", "latest_per_resource"]
