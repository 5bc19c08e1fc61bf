"""Prometheus gauges of operators' overrides (docs/metrics.md §2), beside the governor's own metrics
(:mod:`pipelines.ops.metrics`, the same registry): how many overrides are in force by kind, and when each ends, for
the alert on an override about to end while its resource's rule still fires (``RateGovernorOverrideEnding``,
``conf/prometheus/rate-governor.rules.yml``). Fed by the override tick (:class:`pipelines.job.overrides.OverrideTick`)
every ``windows.fast_trigger_seconds``; label sets stay bounded: only overrides in force have a series."""

from __future__ import annotations

import datetime as dt
import threading
import weakref
from collections.abc import Iterable

from prometheus_client.core import GaugeMetricFamily

from pipelines.decide.paths.overrides import KINDS, Override, in_force
from pipelines.ops import metrics

_collectors: "weakref.WeakKeyDictionary[metrics.GovernorMetrics, _Collector]" = weakref.WeakKeyDictionary()
_guard = threading.Lock()


class _Collector:
    """The overrides in force at the last :func:`observe`, as gauges at each scrape."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active: list[Override] = []

    def collect(self) -> Iterable[GaugeMetricFamily]:
        with self.lock:
            active = list(self.active)
        count = GaugeMetricFamily(f"{metrics.NAMESPACE}_overrides_active", "Operators' overrides in force, by kind "
                                  "(pin: held at a fixed limit; exempt: no enforced limit).", labels=["kind"])
        for kind in KINDS:
            count.add_metric([kind], float(sum(1 for o in active if o.kind == kind)))
        yield count
        ends = GaugeMetricFamily(f"{metrics.NAMESPACE}_override_ends_timestamp_seconds", "When each override in force "
                                 "ends (its end, or its release), Unix seconds.",
                                 labels=["resource_type", "resource", "kind", "override_id"])
        for o in sorted(active, key=lambda o: (o.resource_type, o.resource)):
            ends.add_metric([o.resource_type, o.resource, o.kind, o.override_id], o.until.timestamp())
        yield ends


def observe(overrides: Iterable[Override], now: dt.datetime, into: metrics.GovernorMetrics | None = None) -> None:
    """The overrides read at ``now`` (UTC): those in force (the newest per resource) become the gauges of ``into``
    (default the process's current metrics, :func:`pipelines.ops.metrics.current`). Never raises."""
    try:
        current = into or metrics.current()
        with _guard:
            collector = _collectors.get(current)
            if collector is None:
                collector = _collectors[current] = _Collector()
                current.registry.register(collector)
        with collector.lock:
            collector.active = list(in_force(overrides, now).values())
    except Exception:  # noqa: BLE001 - metrics never fail the governor
        metrics.log.warning("metrics: the overrides' gauges not updated", exc_info=True)
