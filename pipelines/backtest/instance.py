"""One governor process's life in the closed loop through Spark: started on the lake as the job starts
(:func:`pipelines.job.run.run`: the lake's lease taken, the checkpoints checked, the flows built, the queries
started, here gated on the product's trigger grid, :mod:`pipelines.backtest.triggers`), its lease renewed, and
stopped at the end of the run or **killed** mid-run.

**The kill is in-process**, the closest this harness gets to SIGKILL: the governor's queries share the harness's
SparkSession, its gates and its simulated clock, none of which a child process could share without a protocol of
its own. What a SIGKILL leaves behind is left behind:

* every micro-batch that Spark had planned (its offsets logged in the checkpoint) and that waited at its gate fails
  without running its handler (:class:`pipelines.backtest.triggers.GovernorKilled`): no table write, no publication,
  no commit; the restarted query plans it again from the offset log. The harness kills between micro-batches: one
  already running finishes first (a kill in the middle of a handler's writes is the fault tests' business,
  ``tests/e2e/test_crash.py``);
* the queries are stopped, none finishes anything; the lease file is left as last renewed (never released), and
  ``control/limits.json`` as last written;
* the governor's driver memory (decision store cache, the fast path's open rows, the decision lock) goes with its
  objects: a restarted governor builds new ones (:func:`pipelines.job.flows.assembly.build_governor`) and reads its
  decisions' memory back from the lake. Not reproduced: the JVM's own state (a warm JVM restarts in no time where a
  cold one takes about 14 s here), and the state store's cached maps of committed versions (the same data a
  restart reads from the checkpoint).

**The lease** runs on the governor's simulated clock (:class:`pipelines.backtest.loop.SimClock`) and the harness
renews it every ``lake.lease_ttl_seconds / 3`` simulated seconds (the job's renewal thread, in the job's wall time).
A killed governor's lease is stale ``lease_ttl_seconds`` after its last renewal; a governor started on the same lake
takes it over then (:meth:`pipelines.job.lease.GovernorLease.acquire`, with its warning), and refuses before
(:class:`pipelines.job.lease.LakeHeldError`). In-process the killed holder's pid still runs, so the takeover is by
expiry, as a governor on another host takes over; on the same host a real restart takes over at once.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from pipelines.backtest.triggers import Gates


@dataclass
class Life:
    """One governor's life in a run (simulated UTC): when it started, its lease's owner, the owner of the stale lease
    it took over (None: the lake was free), when it was killed (None: it ran to the end of the run)."""

    started: pd.Timestamp
    owner: str
    took_over: str | None = None
    killed: pd.Timestamp | None = None


class GovernorInstance:
    """A started governor (module docstring): its flows, gates, queries (``by_name``: ``ingest``, ``fast``,
    ``gold``), lease and :class:`Life`."""

    def __init__(self, governor, gates: Gates, queries: list, lease, life: Life) -> None:
        self.governor, self.gates, self.queries, self.lease, self.life = governor, gates, queries, lease, life
        self.by_name = {q.name.removeprefix("rate-governor-"): q for q in queries}
        self._renewed = life.started

    @classmethod
    def start(cls, spark, cfg, clock, outbox: Path, poll_milliseconds: int) -> "GovernorInstance":
        """Start a governor on ``cfg``'s lake at the clock's time, its queries polling every ``poll_milliseconds``
        (wall time) behind the gates, events files through ``outbox``.

        Raises:
            pipelines.job.lease.LakeHeldError: another governor's lease on the lake is still valid (nothing started).
        """
        from pipelines.job.checkpoint import check_checkpoint, clear_unplanned_first_batch
        from pipelines.job.flows.assembly import build_governor
        from pipelines.job.lease import GovernorLease
        from pipelines.job.queries import start_queries

        lease = GovernorLease(cfg.lake.path, cfg.lake.lease_ttl_seconds, clock=clock)
        before = lease.read()
        lease.acquire()
        life = Life(pd.Timestamp(clock()), lease.owner, before.get("owner") if before else None)
        try:
            check_checkpoint(cfg)
            clear_unplanned_first_batch(cfg)
            governor = build_governor(spark, cfg, clock)
            gates = Gates.install(governor, outbox)
            queries = start_queries(spark, governor, once=False, interval=f"{poll_milliseconds} milliseconds")
        except BaseException:
            lease.release()
            raise
        return cls(governor, gates, queries, lease, life)

    def renew(self, now: dt.datetime) -> None:
        """Renew the lease when ``lease_ttl_seconds / 3`` simulated seconds have passed since the last renewal."""
        if pd.Timestamp(now) - self._renewed >= self.lease.ttl / 3:
            self.lease.renew()
            self._renewed = pd.Timestamp(now)

    def kill(self, at: pd.Timestamp) -> None:
        """Kill the governor at ``at`` (module docstring): planned micro-batches fail unrun, queries stopped, the lease
        left behind."""
        self.gates.kill()
        for query in self.queries:
            try:
                query.stop()
            except Exception:  # noqa: BLE001 - a query failed by the kill: stopped all the same
                pass
        self.life.killed = at

    def stop(self) -> None:
        """The end of a run: the queries stopped, the lease released."""
        try:
            for query in self.queries:
                if query.isActive:
                    query.stop()
        finally:
            self.lease.release()
