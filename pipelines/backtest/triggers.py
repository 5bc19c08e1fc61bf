"""The product's trigger grid, imposed on the governor's real queries in the closed loop.

In the product each query runs on a processing-time trigger (``windows.trigger_seconds``): Spark's
``ProcessingTimeExecutor`` calls the query's trigger handler once per interval, and ``MicroBatchExecution`` runs at
most **one** micro-batch per call: new data, or a no-data micro-batch when the watermark moved (that is how the gold
query emits the windows the watermark has just passed, one trigger after the data that moved it). A query started
at trigger ``t`` sees only what existed at ``t``: the gold query finds the events file the ingest query wrote during
trigger ``t`` at ``t + trigger``.

The harness runs the queries with a short poll trigger (``poll_milliseconds``) and imposes that grid:

* **Each query on its own trigger.** Each query's ``foreachBatch`` handler waits at a :class:`Gate` until the
  harness opens it for one micro-batch at one of that query's trigger instants (``windows.trigger_seconds`` for
  ingest and gold, ``windows.fast_trigger_seconds`` for the fast query), so a no-data micro-batch that Spark plans
  right after a data one runs at the next instant, as in the product. The next instant of a query is
  :func:`next_trigger` (a micro-batch that ran long delays it).
* **What existed at the trigger.** The ingest query writes its events files to outboxes; the harness moves them
  where the gold query (or the fast query, its copy) reads at that query's next trigger instant
  (:meth:`Gates.release`).
* **Measured processing.** Simulated time runs 1:1 with wall time while micro-batches run (side by side, as in the
  product, sharing the decision lock), and jumps between instants when nothing runs. A micro-batch's time for its
  query's next trigger is its trigger execution (Spark's progress event) minus the time it waited at the gate.

Not modelled: a micro-batch the poll trigger planned before files were released at the same instant (a no-data
micro-batch waiting at its gate) leaves those files to the next instant, where the product would have read them in
that micro-batch: the harness is late by one trigger then, never early.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

#: Seconds a query may take to reach its gate once it has work, and a gated micro-batch to finish (wall time).
REACH_TIMEOUT_S = 120.0
FINISH_TIMEOUT_S = 900.0


class GovernorKilled(Exception):
    """A micro-batch of a governor the harness killed: planned (its offsets logged), its handler never run."""


@dataclass
class Gate:
    """One query's gate: its handler waits here until the harness hands it a token (one micro-batch)."""

    name: str
    cv: threading.Condition = field(default_factory=threading.Condition)
    tokens: int = 0
    waiting: int | None = None  # the batch id waiting at the gate
    done: int = 0               # handlers finished since the start
    waited_s: dict[int, float] = field(default_factory=dict)  # batch id → seconds spent at the gate
    failed: BaseException | None = None
    killed: bool = False        # the governor was killed: a micro-batch at the gate fails without running

    def wrap(self, handler: Callable) -> Callable:
        """The handler, gated: one token per micro-batch; :class:`GovernorKilled` once :attr:`killed`."""

        def gated(df, batch_id: int) -> None:
            began = time.monotonic()
            with self.cv:
                self.waiting = batch_id
                self.cv.notify_all()
                self.cv.wait_for(lambda: self.tokens > 0 or self.killed)
                self.waiting = None
                if self.killed:
                    raise GovernorKilled(f"query {self.name}: micro-batch {batch_id} was planned, never run: the "
                                         f"governor was killed")
                self.tokens -= 1
            self.waited_s[batch_id] = time.monotonic() - began
            try:
                handler(df, batch_id)
            except BaseException as exc:  # noqa: BLE001 (re-raised: Spark fails the query)
                self.failed = exc
                raise
            finally:
                with self.cv:
                    self.done += 1
                    self.cv.notify_all()

        return gated

    def open_one(self) -> int:
        """Hand out one token; returns the number of finished handlers to wait for (:meth:`wait_done`)."""
        with self.cv:
            self.tokens += 1
            self.cv.notify_all()
            return self.done + 1

    def reach(self, timeout: float, alive: Callable[[], bool]) -> bool:
        """Wait until a micro-batch waits at the gate (True) or ``timeout`` seconds pass (False)."""
        deadline = time.monotonic() + timeout
        with self.cv:
            while self.waiting is None:
                if time.monotonic() > deadline or not alive():
                    return False
                self.cv.wait(0.05)
        return True

    def wait_done(self, target: int, timeout: float, alive: Callable[[], bool]) -> None:
        """Wait until ``target`` handlers have finished.

        Raises:
            RuntimeError: the query stopped (its error) or the handler did not finish within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        with self.cv:
            while self.done < target:
                if not alive():
                    raise RuntimeError(f"query {self.name} stopped during a gated micro-batch: {self.failed!r}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"query {self.name}: a micro-batch did not finish within {timeout:.0f} s")
                self.cv.wait(0.05)


class Gates:
    """The gates of a governor's queries and the events outboxes (module docstring).

    Example:
        >>> gates = Gates.install(gov, outbox)     # before governor.start_queries
        >>> gates.release("gold")                   # at the gold query's trigger: what ingest wrote before it
        >>> gates.open("gold")                      # one micro-batch, if one waits at the gate
    """

    def __init__(self, gates: dict[str, Gate], outboxes: dict[str, tuple[Path, Path]]) -> None:
        self.gates, self.outboxes = gates, outboxes
        self._targets: dict[str, tuple[int | None, int]] = {}

    @classmethod
    def install(cls, gov, outbox: Path) -> "Gates":
        """Gate every flow's handler of ``gov`` (:class:`pipelines.job.flows.assembly.Governor`) and point the ingest
        flow's events files (the gold query's, and the fast query's copy) at outboxes under ``outbox``."""
        gates = {}
        for name in ("ingest", "fast", "gold"):
            flow = getattr(gov, name)
            gate = gates[name] = Gate(name)
            flow.handle = gate.wrap(flow.handle)
        boxes = {"gold": (outbox / "events", gov.ingest.events_dir)}
        gov.ingest.events_dir = boxes["gold"][0]
        if gov.ingest.fast_events_dir is not None:
            boxes["fast"] = (outbox / "events-fast", gov.ingest.fast_events_dir)
            gov.ingest.fast_events_dir = boxes["fast"][0]
        for box, target in boxes.values():
            box.mkdir(parents=True, exist_ok=True)
            target.mkdir(parents=True, exist_ok=True)
        return cls(gates, boxes)

    def release(self, reader: str) -> int:
        """Move the finished events files of ``reader``'s outbox where it reads them; returns how many."""
        if reader not in self.outboxes:
            return 0
        box, target = self.outboxes[reader]
        moved = 0
        for path in sorted(box.glob("batch-*.parquet")):
            shutil.move(str(path), str(target / path.name))
            moved += 1
        return moved

    def pending(self, reader: str) -> bool:
        return reader in self.outboxes and any(self.outboxes[reader][0].glob("batch-*.parquet"))

    def waiting(self, name: str) -> bool:
        return self.gates[name].waiting is not None

    def open(self, name: str, query, planned: bool) -> bool:
        """Let ``name``'s next micro-batch run: the one waiting at its gate, or (``planned``: the query has new
        input) the one it is about to plan. False when none comes (nothing to do after all).

        Raises:
            RuntimeError: the query stopped.
        """
        gate = self.gates[name]
        alive = lambda: query.isActive  # noqa: E731
        if gate.waiting is None and not (planned and gate.reach(REACH_TIMEOUT_S, alive)):
            if not query.isActive:
                raise RuntimeError(f"query {name} failed: {query.exception()}")
            return False
        self._targets[name] = (gate.waiting, gate.open_one())
        return True

    def finished(self, name: str) -> bool:
        batch, target = self._targets[name]
        return self.gates[name].done >= target

    def kill(self) -> None:
        """Every micro-batch waiting at a gate, or reaching one from now on, fails without running its handler."""
        for gate in self.gates.values():
            with gate.cv:
                gate.killed = True
                gate.cv.notify_all()

    def settle(self, seconds: float = 0.3) -> None:
        """Give the poll triggers time to plan what follows a micro-batch (a no-data one reaches its gate), wall
        time."""
        time.sleep(seconds)

    def processing(self, name: str, query, timeout: float = 30.0) -> float:
        """Seconds of ``name``'s last opened micro-batch without its wait at the gate (Spark's progress event,
        which arrives once the micro-batch has committed).

        Raises:
            RuntimeError: no progress event within ``timeout`` seconds, or the handler failed.
        """
        batch_id, _ = self._targets.pop(name)
        gate = self.gates[name]
        if gate.failed is not None:
            raise RuntimeError(f"query {name} failed in micro-batch {batch_id}: {gate.failed!r}")
        deadline = time.monotonic() + timeout
        while True:
            for p in reversed(query.recentProgress):
                if p["batchId"] == batch_id:
                    took = p["durationMs"].get("triggerExecution", 0) / 1000.0
                    return round(max(0.0, took - gate.waited_s.get(batch_id, 0.0)), 3)
            if time.monotonic() > deadline or not query.isActive:
                raise RuntimeError(f"query {name}: no progress event for micro-batch {batch_id}")
            time.sleep(0.02)


def next_trigger(started, seconds: float, interval: int):
    """Spark's ``ProcessingTimeExecutor``: after a micro-batch started at trigger ``started`` (a pandas Timestamp)
    that ran ``seconds``, the next trigger is the next multiple of ``interval`` after ``started``, or at once when
    the micro-batch ran longer (falling behind)."""
    import pandas as pd

    return max(grid_after(started, interval), started + pd.Timedelta(seconds=seconds))


def grid_after(t, trigger: int):
    """Spark's ``ProcessingTimeExecutor.nextBatchTime``: the next multiple of the trigger interval after ``t``
    (a pandas Timestamp, UTC)."""
    import math

    import pandas as pd

    sec = t.value / 1e9
    return pd.Timestamp(int((math.floor(sec / trigger) + 1) * trigger * 1e9), tz="UTC")
