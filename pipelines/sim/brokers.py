"""The brokers of the Spark-free closed loop applying what the governor publishes (:mod:`pipelines.sim.loop`):
each broker runs a publication ``propagation`` + its own apply delay after it was published, forgets every limit
on a restart until the next publication reaches it (:mod:`pipelines.sim.irregular`), and applies its own figure of
each enforced record (``control.record.broker_limit``'s share, or the cluster-wide figure).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from pipelines.config import GovernorConfig
from pipelines.sim.cluster import ClosedLoopCluster
from pipelines.writeback.records import current_rows, records_from_rows


class Deliveries:
    """When each broker applies what: a publication made at ``at`` is applied by broker ``b`` at ``at`` +
    ``propagation`` + ``apply_delay[b]`` seconds (0 for a broker not named; brokers of one delay together); at
    ``start`` + ``s`` seconds for each ``(b, s)`` of ``restarts`` broker ``b``'s limiter forgets every limit until
    the next publication reaches it (:mod:`pipelines.sim.irregular`). A delivery is ``(when, brokers, payload)``,
    payload None for a restart; the payload is the caller's (records, or a published file)."""

    def __init__(self, start: pd.Timestamp, brokers: list[str], propagation: float,
                 apply_delay: dict | None = None, restarts: list | None = None) -> None:
        delays = {b: float((apply_delay or {}).get(b, 0.0)) for b in brokers}
        self.propagation = propagation
        self._by_delay = sorted((d, frozenset(b for b in brokers if delays[b] == d)) for d in set(delays.values()))
        # (when, brokers, payload or None: the brokers forget every limit), in the order they were scheduled
        self.pending: list[tuple[pd.Timestamp, frozenset, object]] = [
            (start + pd.Timedelta(seconds=float(s)), frozenset([b]), None) for b, s in (restarts or [])]

    def publish(self, at: pd.Timestamp, payload: object) -> None:
        """Schedule a publication made at ``at`` at every broker."""
        for delay, brokers in self._by_delay:
            self.pending.append((at + pd.Timedelta(seconds=self.propagation + delay), brokers, payload))

    def times(self) -> list[pd.Timestamp]:
        """When the deliveries still to come are due."""
        return [t for t, _, _ in self.pending]

    def due(self, at: pd.Timestamp) -> list[tuple[pd.Timestamp, frozenset, object]]:
        """The deliveries due by ``at``, removed, in time order (those of one instant in the order scheduled)."""
        due = sorted((p for p in self.pending if p[0] <= at), key=lambda p: p[0])
        if due:
            self.pending = [p for p in self.pending if p[0] > at]
        return due


def advance_through(cluster: ClosedLoopCluster, when: pd.Timestamp,
                    next_change: Callable[[pd.Timestamp], pd.Timestamp | None],
                    apply: Callable[[pd.Timestamp], None]) -> None:
    """Run ``cluster`` to ``when``, stopping at each instant
    ``next_change(now)`` names on the way (None: no change left) to ``apply`` the change due there: the limits at
    the brokers change only at a delivery, a restart or an expiry."""
    while (at := next_change(cluster.now)) is not None and at <= when:
        cluster.advance_to(at)
        apply(at)
    cluster.advance_to(when)


class Broker:
    """The brokers' limits over time: a publication is in force at broker ``b`` ``propagation`` +
    ``apply_delay[b]`` seconds after it was published; at each ``(b, time)`` of ``restarts`` broker ``b``'s
    limiter forgets every limit until the next publication reaches it (:mod:`pipelines.sim.irregular`)."""

    def __init__(self, cluster: ClosedLoopCluster, cfg: GovernorConfig, propagation: float,
                 apply_delay: dict | None = None, restarts: list | None = None) -> None:
        self.cluster, self.cfg, self.propagation = cluster, cfg, propagation
        self.deliveries = Deliveries(cluster.start, cluster.brokers, propagation, apply_delay, restarts)
        self.records: dict[str, list[dict]] = {b: [] for b in cluster.brokers}
        self.timeline: list[tuple[pd.Timestamp, dict]] = []
        self._expiries: list[pd.Timestamp] = []  # each record's expires_at
        self.index = {(b, t, r): i for i, (b, t, r) in enumerate(zip(
            cluster.pairs["broker"], cluster.pairs["resource_type"], cluster.pairs["resource"]))}

    def publish(self, at: pd.Timestamp, latest: dict) -> None:
        rows = current_rows(list(latest.values()), at.to_pydatetime())
        self.deliveries.publish(at, records_from_rows(rows, self.cfg.limits, None))

    def next_change(self, after: pd.Timestamp) -> pd.Timestamp | None:
        times = self.deliveries.times() + [t for t in self._expiries if t > after]
        return min(times) if times else None

    def run_until(self, when: pd.Timestamp) -> None:
        advance_through(self.cluster, when, self.next_change, self._apply)

    def _apply(self, at: pd.Timestamp) -> None:
        due = self.deliveries.due(at)
        if due:
            for _, brokers, records in due:
                for b in brokers:
                    self.records[b] = records if records is not None else []
            self._expiries = sorted({pd.Timestamp(r["expires_at"]) for recs in self.records.values()
                                     for r in recs})
        c = self.cluster
        n = len(c.pairs)
        limit, burst, open_ms = np.full(n, np.nan), np.ones(n), np.full(n, float(c.cfg.breaker_open_ms))
        snapshot = {}
        for b in c.brokers:
            for rec in self.records[b]:
                if rec["mode"] != "enforce" or pd.Timestamp(rec["expires_at"]) <= at:
                    continue
                i = self.index.get((b, rec["resource_type"], rec["resource"]))
                if i is None:
                    continue
                brokers = rec.get("brokers") or {}
                share = brokers.get(b) or brokers.get("*")
                qps, bu = (share["limit_qps"], share["burst"]) if share else (rec["limit_qps"], rec["burst"])
                limit[i], burst[i], open_ms[i] = qps, bu, rec["breaker_open_ms"]
                snapshot[(b, rec["resource_type"], rec["resource"])] = (qps, rec)
        c.set_limits(limit, burst, open_ms)
        if not self.timeline or self.timeline[-1][1] != snapshot:
            self.timeline.append((at, snapshot))


