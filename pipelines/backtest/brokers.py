"""The closed loop's broker side: every ``control/limits.json`` the governor writes (:class:`Watcher`), and the
simulated brokers applying them (:class:`Brokers`).

* **What was published.** A watcher thread polls ``<lake>/control/limits.json`` while micro-batches run. A write
  whose records differ from the last ones is a :class:`Publication` (a copy of the file is kept); a write of the same
  records is a rewrite, which changes no applier but still reaches a broker whose limiter forgot its limits on a
  restart (the applier pushes what the file holds at every publication). Its time is the file's modification time
  on the governor's clock (:class:`pipelines.backtest.clock.SimClock`).
* **When each broker applies it.** The simulator's delivery schedule, one definition for both closed loops
  (:class:`pipelines.sim.brokers.Deliveries`): a publication made at ``at`` is applied by broker ``b`` at ``at`` +
  ``propagation_seconds`` + ``Irregularity.apply_delay_seconds[b]``; at each ``(b, s)`` of
  ``Irregularity.broker_restarts`` broker ``b``'s limiter forgets every limit until the next publication reaches it.
* **What each broker applies.** Each broker runs the reference applier (:class:`control.applier.LimitApplier`:
  signature, expiry at simulated time, stale versions) and enforces its own figure of each enforced record
  (:func:`control.record.broker_limit`: its share, or the cluster-wide figure), until the record expires at its
  ``expires_at`` (UTC) or a later file replaces it.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from control import record as cr
from control.applier import LimitApplier
from control.token_bucket import default_burst
from pipelines.sim.brokers import Deliveries, advance_through
from pipelines.sim.cluster import ClosedLoopCluster
from pipelines.sim.irregular import Irregularity


@dataclass
class Publication:
    """One ``limits.json`` the governor wrote: simulated time (UTC), its records, and a copy of the file."""

    at: pd.Timestamp
    records: list[dict]
    path: Path


class Watcher(threading.Thread):
    """Polls ``limits.json`` every 20 ms (wall time) during a step: every change of its records is a
    :class:`Publication` (in :attr:`published`), every write of the same records a rewrite (in :attr:`rewritten`,
    pointing at the last copy). ``seen`` carries ``[(mtime_ns, size), records, copies written, last copy]`` from one
    watcher to the next."""

    def __init__(self, path: Path, clock, out_dir: Path, seen: list) -> None:
        super().__init__(daemon=True)
        self.path, self.clock, self.out_dir = path, clock, out_dir
        self.published: list[Publication] = []
        self.rewritten: list[Publication] = []
        self.seen = seen
        self.halt = threading.Event()

    @staticmethod
    def fresh() -> list:
        """The ``seen`` of a run that has published nothing yet."""
        return [None, None, 0, None]

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
        at = self.clock.at_wall(st.st_mtime_ns / 1e9)
        if records == self.seen[1]:
            self.rewritten.append(Publication(at, records, self.seen[3]))
            return
        self.seen[1] = records
        self.seen[2] += 1
        copy = self.out_dir / f"limits-{self.seen[2]:05d}.json"
        cr.write_limits_file(records, copy, generated_at=at.floor("us").to_pydatetime())
        self.seen[3] = copy
        self.published.append(Publication(at, records, copy))

    def run(self) -> None:
        while not self.halt.wait(0.02):
            self.check()

    def finish(self) -> tuple[list[Publication], list[Publication]]:
        """Stop polling, read the file once more; returns (publications, rewrites)."""
        self.halt.set()
        self.join()
        self.check()
        return self.published, self.rewritten


class Brokers:
    """The simulated brokers' appliers (module docstring): one :class:`control.applier.LimitApplier` per broker, fed
    with each publication when :class:`pipelines.sim.brokers.Deliveries` brings it to that broker, and the limit
    vectors they give the cluster's pairs. ``timeline``: at each change, ``{(broker, type, resource): (qps at that
    broker, record)}``."""

    def __init__(self, cluster: ClosedLoopCluster, key: bytes | None, propagation: float = 0.0,
                 irregular: Irregularity | None = None) -> None:
        irr = irregular or Irregularity()
        self.cluster = cluster
        self.appliers = {b: LimitApplier(key, broker=b) for b in cluster.brokers}
        self.deliveries = Deliveries(cluster.start, cluster.brokers, propagation, irr.apply_delay_seconds,
                                     irr.broker_restarts)
        self.forgot: set[str] = set()  # brokers restarted since the last publication reached them
        self.timeline: list[tuple[pd.Timestamp, dict]] = []
        logging.getLogger("rate_governor.applier").setLevel(logging.WARNING)

    def publish(self, publication: Publication) -> None:
        """Schedule ``publication`` (or a rewrite of it) at every broker."""
        self.deliveries.publish(publication.at, publication)

    def next_event(self, after: pd.Timestamp) -> pd.Timestamp | None:
        """The next instant after ``after`` when the limits at the brokers change: a delivery, a restart or an
        expiry (one already due is applied at once)."""
        times = [max(t, after) for t in self.deliveries.times()]
        if self.timeline:
            for _qps, rec in self.timeline[-1][1].values():
                expires = pd.Timestamp(cr.parse_expires_at(rec["expires_at"]))
                if expires > after:
                    times.append(expires)
        return min(times) if times else None

    def apply_until(self, when: pd.Timestamp) -> None:
        """Run the cluster to ``when``, changing its limits at every delivery, restart and expiry on the way."""
        advance_through(self.cluster, when, self.next_event, self._refresh)

    def _deliver(self, at: pd.Timestamp) -> None:
        now = at.floor("us").to_pydatetime()
        for _when, brokers, pub in self.deliveries.due(at):
            for b in sorted(brokers):
                if pub is None:
                    self.forgot.add(b)
                else:
                    self.appliers[b].load_file(pub.path, now=now)
                    self.forgot.discard(b)

    def _refresh(self, at: pd.Timestamp) -> None:
        self._deliver(at)
        c, now_ms = self.cluster, int(at.value // 1_000_000)
        L = len(c.pairs)
        limit, burst, open_ms = np.full(L, np.nan), np.ones(L), np.full(L, float(c.cfg.breaker_open_ms))
        snapshot = {}
        for i, (b, rt, r) in enumerate(zip(c.pairs["broker"], c.pairs["resource_type"], c.pairs["resource"])):
            if rt not in cr.RESOURCE_TYPES or b in self.forgot:
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
