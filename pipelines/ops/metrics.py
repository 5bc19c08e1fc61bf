"""Prometheus metrics of the governor: what on-call sees without opening the lake (docs/metrics.md).

One :class:`GovernorMetrics` per process (:func:`current`), served by the continuous job (:func:`serve`,
``[metrics] port``; 0 = off), is fed where each fact is at hand: the progress listener (durations, watermark), the
writes of a micro-batch's tables (:mod:`pipelines.job.flows.base`: decisions, anomalies, policy state, quarantine,
the brokers' newest stats lines, from the Arrow tables at hand), the publisher and sinks (limits in
force with each broker's share, publish outcomes), the lease. The catalogue and its conventions: docs/metrics.md §2.

Label sets stay bounded: a resource label exists only while that resource has a limit in force, an anomaly in the
newest final window or a held limit (the collector yields only what is current); quarantine reasons are cut to
their kind (:func:`reason_kind`), at most :data:`MAX_REASONS`. Hooks never raise into a micro-batch: the module
functions (:func:`observe_outputs`, …) log a failure once per hook at WARNING and go on.
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import GaugeMetricFamily

from control.record import BROKERS_FIELD, MODES, parse_expires_at
from pipelines import tables
from pipelines.config import GovernorConfig, LimitsConfig, MetricsConfig
from pipelines.ops.metric_labels import label_counts, reason_kind
from pipelines.decide.catalogue import RULES, limited_by, normal_floor
from pipelines.decide.words import Action, Basis

log = logging.getLogger("rate_governor")

NAMESPACE = "rate_governor"
#: Buckets of the micro-batch duration histogram, seconds: around the shipped 10 s trigger and up to 5 minutes.
DURATION_BUCKETS = (0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0)
#: Distinct quarantine reason labels kept; later kinds count as ``other`` (a bound on the label set).
MAX_REASONS = 32
#: The final path's tables whose ``window_end`` tells the newest final window of a micro-batch.
FINAL_WINDOW_TABLES = (tables.GOLD_TOPIC_TPS, tables.GOLD_GROUP_TPS, tables.GOLD_BROKER_TPS, tables.GOLD_ANOMALIES)
#: Columns of each table the metrics read (:meth:`GovernorMetrics.observe_outputs`).
COLUMNS = {tables.GOLD_LIMITS: ("action", "basis", "resource_type", "mode"),
           tables.GOLD_ANOMALIES: ("window_end", "resource_type", "resource", "anomaly"),
           tables.STATE_POLICY: ("resource_type", "resource", "limit_qps", "limited_since", "baseline_tps",
                                 "probe_excess_messages", "at_cap_since"),
           tables.QUARANTINE: ("reason",), tables.SILVER_BROKER_STATS: ("broker", "event_time"),
           **{table: ("window_end",) for table in FINAL_WINDOW_TABLES[:3]}}


def _epoch(value: dt.datetime | None) -> float | None:
    """A datetime (naive = UTC) → Unix seconds; None stays None."""
    return None if value is None else (value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)).timestamp()


@dataclass
class _State:
    """What the gauges show now (guarded by :attr:`GovernorMetrics.lock`)."""

    limits: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    anomalies: set[tuple[str, str, str]] = field(default_factory=set)
    held_since: dict[tuple[str, str], float] = field(default_factory=dict)
    normal_floors: dict[tuple[str, str], float] = field(default_factory=dict)
    probe_excess: dict[tuple[str, str], float] = field(default_factory=dict)
    at_cap_since: dict[tuple[str, str], float] = field(default_factory=dict)
    horizon: float | None = None
    broker_last: dict[str, float] = field(default_factory=dict)
    watermarks: dict[str, float] = field(default_factory=dict)
    behind: dict[str, float] = field(default_factory=dict)
    sink_failing: dict[str, float] = field(default_factory=dict)
    sink_success: dict[str, float] = field(default_factory=dict)
    lease_held: bool = False
    triggers: dict[str, float] = field(default_factory=dict)
    max_held_seconds: float | None = None
    max_at_cap_seconds: float | None = None
    normal_headroom: float = field(default_factory=lambda: LimitsConfig().surge_squeeze_headroom)
    reasons: set[str] = field(default_factory=set)


class GovernorMetrics:
    """The governor's metrics in their own registry (:attr:`registry`). ``clock``: wall-clock Unix seconds (the
    watermark's delay, a sink's last success, whether a limit has expired)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self.state = _State()
        #: True while an endpoint (:func:`serve`) serves these metrics.
        self.serving = False
        self.registry = CollectorRegistry()
        common = {"namespace": NAMESPACE, "registry": self.registry}
        self.decisions = Counter("decisions", "Limit decisions written to gold/limits, by action, basis (preliminary: "
                                 "fast path; final: final path), the anomaly kind whose limit it is, and mode.",
                                 ["action", "basis", "anomaly", "mode"], **common)
        self.anomalies = Counter("anomalies", "Anomalies of final windows (gold/anomalies rows), by kind.",
                                 ["anomaly", "resource_type"], **common)
        self.quarantined = Counter("quarantined_records", "Records (and refused decisions) written to quarantine, "
                                   "by the kind of their reason.", ["reason"], **common)
        self.publishes = Counter("sink_publishes", "Publishes of the limits in force per write-back path (file: "
                                 "control/limits.json), by outcome (ok, failed).", ["sink", "outcome"], **common)
        self.durations = Histogram("micro_batch_duration_seconds", "Duration of each micro-batch per streaming query "
                                   "(Spark's batchDuration).", ["query"], buckets=DURATION_BUCKETS, **common)
        # every known label set from 0, so that rate() and increase() see a first decision or anomaly too (a series
        # born at 1 has no earlier sample to rise from)
        for action, basis, rtype, mode in itertools.product([a.value for a in Action], [b.value for b in Basis],
                                                            ("topic", "group"), sorted(MODES)):
            self.decisions.labels(action, basis, limited_by(rtype).value, mode)
        for kind, rtype in ((kind, rtype) for kind, spec in RULES.items() for rtype in spec.resource_types):
            self.anomalies.labels(kind.value, rtype)
        ProcessCollector(registry=self.registry)
        self.registry.register(_Collector(self))

    def configure(self, cfg: GovernorConfig) -> None:
        """Start of a run on ``cfg``: the settings the held-limit and normal-floor gauges read, and none of an earlier
        run's gauges (counters keep counting, as Prometheus expects)."""
        with self.lock:
            self.state = _State(lease_held=self.state.lease_held, max_held_seconds=float(cfg.limits.max_held_seconds),
                                max_at_cap_seconds=float(cfg.limits.max_at_cap_seconds),
                                normal_headroom=cfg.limits.surge_squeeze_headroom)

    def observe_trigger(self, query: str, interval: str) -> None:
        """``query`` runs on a processing-time trigger of ``interval`` (Spark's ``"10 seconds"``, ``"100 ms"``…)."""
        number, unit = interval.split()
        seconds = float(number) * (0.001 if unit.startswith(("milli", "ms")) else 1.0)
        with self.lock:
            self.state.triggers[query] = seconds

    def observe_progress(self, query: str, progress: Mapping[str, Any]) -> None:
        """One ``StreamingQueryProgress`` (a mapping) of ``query`` (``ingest``, ``fast``, ``gold``): its
        ``batchDuration`` (ms) into the histogram and, in the continuous job, how far it ran past the trigger; its
        ``eventTime.watermark`` (ISO 8601 UTC; Spark's epoch 0 before the first event is left out)."""
        seconds = float(progress.get("batchDuration") or 0) / 1000.0
        self.durations.labels(query).observe(seconds)
        mark = (progress.get("eventTime") or {}).get("watermark")
        at = dt.datetime.fromisoformat(mark.replace("Z", "+00:00")).timestamp() if mark else 0.0
        with self.lock:
            if query in self.state.triggers:
                self.state.behind[query] = max(0.0, seconds - self.state.triggers[query])
            if at > 0:
                self.state.watermarks[query] = at

    def observe_outputs(self, appended: Mapping[str, pa.Table]) -> None:
        """The tables one micro-batch appended rows to, each with at least its :data:`COLUMNS` (leave out a table
        it appended nothing to, as a replayed micro-batch does, so that nothing is counted twice).

        Tables of the final path (:data:`FINAL_WINDOW_TABLES`) also set the newest final window: the anomalies
        active are those of that window (none when it has none), and ``state/policy`` rows say how long each limit
        has been held, from its ``limited_since`` to that window's end (event time), and the lowest limit its normal
        traffic passes under (:func:`pipelines.decide.catalogue.normal_floor` of ``baseline_tps``, may be absent)."""
        for (action, basis, rtype, mode), n in label_counts(appended.get(tables.GOLD_LIMITS, _EMPTY),
                                                            COLUMNS[tables.GOLD_LIMITS]).items():
            self.decisions.labels(action, basis, limited_by(rtype).value, mode).inc(n)
        found = appended.get(tables.GOLD_ANOMALIES, _EMPTY)
        for (anomaly, rtype), n in label_counts(found, ("anomaly", "resource_type")).items():
            self.anomalies.labels(anomaly, rtype).inc(n)
        for (reason,), n in label_counts(appended.get(tables.QUARANTINE, _EMPTY), ("reason",)).items():
            self.quarantined.labels(self._reason_label(reason)).inc(n)
        stats = appended.get(tables.SILVER_BROKER_STATS, _EMPTY)
        newest = stats.group_by("broker").aggregate([("event_time", "max")]).to_pylist() if stats.num_rows else []
        ends = [_epoch(pc.max(appended[t]["window_end"]).as_py()) for t in FINAL_WINDOW_TABLES if t in appended]
        horizon = max((e for e in ends if e is not None), default=None)
        with self.lock:
            s = self.state
            for row in newest:
                if row["broker"] is not None and (at := _epoch(row["event_time_max"])) is not None:
                    s.broker_last[row["broker"]] = max(at, s.broker_last.get(row["broker"], at))
            for r in appended.get(tables.STATE_POLICY, _EMPTY).to_pylist():  # any path's rows: a probe's undo too
                key = (r["resource_type"], r["resource"])
                if r["limit_qps"] is None or r.get("probe_excess_messages") is None:
                    s.probe_excess.pop(key, None)
                else:
                    s.probe_excess[key] = float(r["probe_excess_messages"])
                s.at_cap_since.pop(key, None)
                if r["limit_qps"] is not None and r.get("at_cap_since") is not None:
                    s.at_cap_since[key] = _epoch(r["at_cap_since"])
            if horizon is None:
                return
            s.horizon = horizon
            s.anomalies = {(r["resource_type"], r["resource"], r["anomaly"]) for r in found.to_pylist()
                           if _epoch(r["window_end"]) == horizon}
            for r in appended.get(tables.STATE_POLICY, _EMPTY).to_pylist():
                key = (r["resource_type"], r["resource"])
                s.held_since.pop(key, None)
                s.normal_floors.pop(key, None)
                if r["limit_qps"] is not None and r["limited_since"] is not None:
                    s.held_since[key] = _epoch(r["limited_since"])
                    if (floor := normal_floor(key[0], r.get("baseline_tps"), s.normal_headroom)) is not None:
                        s.normal_floors[key] = floor

    def observe_limits(self, records: Iterable[Mapping[str, Any]]) -> None:
        """The control records just published (docs/contracts.md §3): from now on the limits in force, each until
        its ``expires_at``, with its ``brokers`` shares."""
        current = {(r["resource_type"], r["resource"]): {
            "limit_qps": float(r["limit_qps"]), "mode": r["mode"],
            "brokers": {b: float(f["limit_qps"]) for b, f in (r.get(BROKERS_FIELD) or {}).items()},
            "expires_at": parse_expires_at(r["expires_at"]).timestamp()} for r in records}
        with self.lock:
            self.state.limits = current

    def declare_sinks(self, sinks: Iterable[str]) -> None:
        """The write-back paths of this governor: their publish counters start at 0 (``ok`` and ``failed``)."""
        for sink in sinks:
            for outcome in ("ok", "failed"):
                self.publishes.labels(sink, outcome)

    def observe_publish(self, sink: str, ok: bool) -> None:
        """One publish to write-back path ``sink`` (``file``, ``kafka``, ``rocketmq``) and whether it delivered."""
        self.publishes.labels(sink, "ok" if ok else "failed").inc()
        with self.lock:
            self.state.sink_failing[sink] = 0.0 if ok else 1.0
            if ok:
                self.state.sink_success[sink] = self.clock()

    def observe_lease(self, held: bool) -> None:
        """Whether this process holds the lake's lease now."""
        with self.lock:
            self.state.lease_held = held

    def _reason_label(self, reason: str) -> str:
        kind = reason_kind(None if reason == "null" else reason)
        with self.lock:
            if kind not in self.state.reasons and len(self.state.reasons) >= MAX_REASONS:
                return "other"
            self.state.reasons.add(kind)
        return kind


_EMPTY = pa.table({})


class _Collector:
    """The gauges of :class:`_State`, built at each scrape: only current label sets (an expired limit is gone)."""

    def __init__(self, metrics: GovernorMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[GaugeMetricFamily]:
        now = self.metrics.clock()
        with self.metrics.lock:
            s = self.metrics.state
            limits = {key: v for key, v in s.limits.items() if v["expires_at"] > now}
            resource = ("resource_type", "resource")
            yield _gauge("limit_messages_per_second", "Limits in force (published, not expired): the cluster-wide "
                         "limit in msg/s, the anomaly kind it answers, its mode.", (*resource, "anomaly", "mode"),
                         {(rt, r, limited_by(rt).value, v["mode"]): v["limit_qps"] for (rt, r), v in limits.items()})
            yield _gauge("limit_broker_messages_per_second", "Each broker's share of a limit in force, msg/s (broker "
                         "\"*\": any broker not listed).", (*resource, "broker", "mode"),
                         {(rt, r, b, v["mode"]): q for (rt, r), v in limits.items() for b, q in v["brokers"].items()})
            yield _gauge("limit_expires_timestamp_seconds", "When a limit in force expires unless refreshed, Unix "
                         "seconds.", resource, {key: v["expires_at"] for key, v in limits.items()})
            yield _gauge("anomaly_active", "1 for each anomaly of the newest final window.", (*resource, "anomaly"),
                         {key: 1.0 for key in s.anomalies})
            yield _gauge("limit_held_seconds", "How long each limit has been held, seconds of event time (from the "
                         "window that set it to the newest final window).", resource,
                         {key: max(0.0, (s.horizon or since) - since) for key, since in s.held_since.items()})
            yield _gauge("limit_normal_floor_messages_per_second", "The lowest limit a limited topic's normal traffic "
                         "passes under (limits.surge_squeeze_headroom x its frozen baseline), msg/s.", resource,
                         s.normal_floors)
            yield _gauge("probe_excess_messages", "What the last undone probe of a limited resource admitted beyond "
                         "the level before it, messages cluster-wide (its stated cost: at most "
                         "limits.probe_max_windows windows at limits.relax_factor x).", resource,
                         {key: v for key, v in s.probe_excess.items() if key in limits})
            yield _gauge("limit_at_cap_seconds", "How long each limit has been held at its cap (bound or "
                         "capped), seconds of event time (from the end of the first of them to the newest final "
                         "window).", resource,
                         {key: max(0.0, (s.horizon or since) - since) for key, since in s.at_cap_since.items()})
            yield _gauge("limit_max_at_cap_seconds", "limits.max_at_cap_seconds: a limit at its cap longer is named "
                         "for a person.", (), {(): s.max_at_cap_seconds} if s.max_at_cap_seconds is not None else {})
            yield _gauge("limit_max_held_seconds", "limits.max_held_seconds: a limit held longer is flagged.", (),
                         {(): s.max_held_seconds} if s.max_held_seconds is not None else {})
            yield _gauge("lease_held", "1 while this process holds the lake's lease (<lake>/_governor.lease).", (),
                         {(): 1.0 if s.lease_held else 0.0})
            for name, doc, label, values in (
                ("trigger_seconds", "Each query's processing-time trigger in the continuous job, seconds.", "query",
                 s.triggers),
                ("query_behind_trigger_seconds", "How far each query's last micro-batch ran past the trigger, "
                 "seconds (0: within it).", "query", s.behind),
                ("watermark_timestamp_seconds", "Each stateful query's event-time watermark, Unix seconds.", "query",
                 s.watermarks),
                ("watermark_delay_seconds", "Wall-clock time minus each stateful query's watermark, seconds.", "query",
                 {q: now - w for q, w in s.watermarks.items()}),
                ("broker_last_report_timestamp_seconds", "Event time of each broker's newest stats.log line (the end "
                 "of the minute it covers), Unix seconds.", "broker", s.broker_last),
                ("sink_failing", "1 while a write-back path's last publish failed, else 0.", "sink", s.sink_failing),
                ("sink_last_success_timestamp_seconds", "When each write-back path last delivered, Unix seconds.",
                 "sink", s.sink_success),
            ):
                yield _gauge(name, doc, (label,), {(k,): v for k, v in values.items()})


def _gauge(name: str, doc: str, labels: tuple[str, ...], values: Mapping[tuple, float]) -> GaugeMetricFamily:
    """The gauge family ``rate_governor_<name>`` with one sample per label tuple of ``values``."""
    family = GaugeMetricFamily(f"{NAMESPACE}_{name}", doc, labels=list(labels))
    for key, value in sorted(values.items()):
        family.add_metric(list(key), value)
    return family


# --- the process's metrics, its hooks and its endpoint ---------------------------------------------------------------

_current = GovernorMetrics()
_failed_hooks: set[str] = set()


def current() -> GovernorMetrics:
    """The metrics the hooks below feed (one per process)."""
    return _current


def install(metrics: GovernorMetrics) -> GovernorMetrics:
    """Make ``metrics`` the process's metrics (tests start from a fresh one); returns the one it replaces."""
    global _current
    previous, _current = _current, metrics
    return previous


@dataclass
class Endpoint:
    """A running metrics endpoint (:func:`serve`); ``url`` is what Prometheus scrapes."""

    server: Any
    thread: threading.Thread
    url: str
    metrics: GovernorMetrics

    def close(self) -> None:
        """Stop serving and free the port."""
        self.metrics.serving = False
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def serve(cfg: MetricsConfig, metrics: GovernorMetrics | None = None) -> Endpoint | None:
    """Serve ``metrics`` (default :func:`current`) at ``http://<cfg.address>:<cfg.port>/metrics`` from a daemon
    thread (prometheus_client's HTTP server). None when ``cfg.port`` is 0 (off) or the port cannot be bound: that
    is logged in one ERROR line, and the governor goes on without its endpoint."""
    from prometheus_client import start_http_server

    if cfg.port == 0:
        return None
    metrics = metrics or _current
    try:
        server, thread = start_http_server(cfg.port, cfg.address, registry=metrics.registry)
    except OSError as exc:
        log.error("metrics endpoint not started: cannot listen on %s:%d (%s); the governor goes on without it (set "
                  "[metrics] port to a free port, or 0 for none)", cfg.address, cfg.port, exc.strerror or exc)
        return None
    metrics.serving = True
    endpoint = Endpoint(server, thread, f"http://{cfg.address}:{server.server_address[1]}/metrics", metrics)
    log.info("metrics endpoint: %s", endpoint.url)
    return endpoint


def _hook(name: str, call: Callable[[GovernorMetrics], None]) -> None:
    """Run a hook on the current metrics; a failure is logged once per hook and never reaches the caller."""
    try:
        call(_current)
    except Exception as exc:  # noqa: BLE001 - metrics must never fail a micro-batch
        if name not in _failed_hooks:
            _failed_hooks.add(name)
            log.warning("metrics: %s not recorded (%s: %s); the governor goes on", name, type(exc).__name__, exc)


def configure(cfg: GovernorConfig) -> None:
    """A run on ``cfg`` starts: fresh metrics, as a new process has them (no series of an earlier run in this
    process), the lease state kept. The ``observe_*`` functions below: the methods, on the current metrics."""

    def fresh(m: GovernorMetrics) -> None:
        new = GovernorMetrics(m.clock)
        new.observe_lease(m.state.lease_held)
        new.configure(cfg)
        install(new)

    _hook("configure", fresh)


def observe_trigger(query: str, interval: str) -> None:
    _hook("trigger", lambda m: m.observe_trigger(query, interval))


def observe_progress(query: str, progress: Mapping[str, Any]) -> None:
    _hook("progress", lambda m: m.observe_progress(query, progress))


def observe_outputs(appended: Mapping[str, pa.Table], rows: Mapping[str, int],
                    others: Mapping[str, Any] | None = None) -> None:
    """:meth:`GovernorMetrics.observe_outputs` for one micro-batch: the tables of :data:`COLUMNS` it appended rows to
    (``rows``, its report) at hand as Arrow (``appended``). While an endpoint serves, one written another way
    (``others``: Spark DataFrames written from the executors or by delta-spark) is read, its :data:`COLUMNS` only
    (a small Spark job each); otherwise it is left out."""

    def found(m: GovernorMetrics) -> None:
        arrow = {}
        for table, columns in COLUMNS.items():
            if rows.get(table) and table in appended:
                arrow[table] = appended[table]
            elif rows.get(table) and table in (others or {}) and m.serving:
                arrow[table] = others[table].select(*columns).toArrow()
        m.observe_outputs(arrow)

    _hook("outputs", found)


def observe_limits(records: Iterable[Mapping[str, Any]]) -> None:
    _hook("limits", lambda m: m.observe_limits(records))


def declare_sinks(sinks: Iterable[str]) -> None:
    _hook("sinks", lambda m: m.declare_sinks(list(sinks)))


def observe_publish(sink: str, ok: bool) -> None:
    _hook("publish", lambda m: m.observe_publish(sink, ok))


def observe_lease(held: bool) -> None:
    _hook("lease", lambda m: m.observe_lease(held))
