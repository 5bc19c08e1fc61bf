"""The product's trigger grid, imposed on the governor's real queries in the closed loop.

In the product each query runs on a processing-time trigger (``windows.trigger_seconds``): Spark's
``ProcessingTimeExecutor`` calls the query's trigger handler once per interval, and ``MicroBatchExecution`` runs at
most **one** micro-batch per call: new data, or a no-data micro-batch when the watermark moved (that is how the gold
query emits the windows the watermark has just passed, one trigger after the data that moved it). A query started
at trigger ``t`` sees only what existed at ``t``: the gold query finds the events file the ingest query wrote during
trigger ``t`` at ``t + trigger``.

The harness runs the queries with a short poll trigger (``poll_milliseconds``) and imposes that grid:

* **One micro-batch per query per trigger instant.** Each query's ``foreachBatch`` handler waits at a
  :class:`Gate` until the harness opens it for one micro-batch at a trigger instant (:meth:`Gates.step`), so a
  no-data micro-batch that Spark plans right after a data one runs at the next instant, as in the product.
* **What existed at the trigger.** The ingest query writes its events files to an outbox; the harness moves them
  where the gold query reads (:meth:`Gates.release`) at the next trigger instant.
* **Measured processing.** A micro-batch's time is its trigger execution (Spark's progress event) minus the time
  it waited at the gate; the step's time is the longest of the queries' (they run side by side, as in the product,
  sharing the decision lock).

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

    def wrap(self, handler: Callable) -> Callable:
        """The handler, gated: one token per micro-batch."""

        def gated(df, batch_id: int) -> None:
            began = time.monotonic()
            with self.cv:
                self.waiting = batch_id
                self.cv.notify_all()
                self.cv.wait_for(lambda: self.tokens > 0)
                self.tokens -= 1
                self.waiting = None
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
    """The gates of a governor's queries and the events outbox (module docstring).

    Example:
        >>> gates = Gates.install(gov, outbox)          # before governor.start_queries
        >>> gates.release()                              # at a trigger instant: the outbox's files become visible
        >>> seconds = gates.step(queries, work={"ingest"})
    """

    def __init__(self, gates: dict[str, Gate], outbox: Path, events: Path) -> None:
        self.gates, self.outbox, self.events = gates, outbox, events

    @classmethod
    def install(cls, gov, outbox: Path) -> "Gates":
        """Gate every flow's handler of ``gov`` (:class:`pipelines.flows.assembly.Governor`) and point the ingest
        flow's events files at ``outbox``."""
        gates = {}
        for name in ("ingest", "fast", "gold"):
            flow = getattr(gov, name)
            gate = gates[name] = Gate(name)
            flow.handle = gate.wrap(flow.handle)
        events = gov.ingest.events_dir
        outbox.mkdir(parents=True, exist_ok=True)
        gov.ingest.events_dir = outbox
        return cls(gates, outbox, events)

    def pending(self) -> list[Path]:
        return sorted(p for p in self.outbox.glob("batch-*.parquet"))

    def release(self) -> int:
        """Move the outbox's finished events files where the gold query reads them; returns how many."""
        moved = 0
        for path in self.pending():
            shutil.move(str(path), str(self.events / path.name))
            moved += 1
        return moved

    def waiting(self) -> set[str]:
        return {name for name, gate in self.gates.items() if gate.waiting is not None}

    def step(self, queries: dict, work: set[str]) -> tuple[float, int, dict[str, float]]:
        """One trigger instant: the queries in ``work`` (they have new input: they will plan a micro-batch) and
        those already waiting at their gate run one micro-batch each, side by side. Returns (seconds: the longest
        micro-batch's processing, micro-batches run, seconds per query).

        Raises:
            RuntimeError: a query failed, or did not reach its gate or finish in time.
        """
        alive = {name: (lambda q=q: q.isActive) for name, q in queries.items()}
        run = {}
        for name in sorted(work | self.waiting()):
            if name not in queries:
                continue
            gate = self.gates[name]
            if not gate.reach(REACH_TIMEOUT_S, alive[name]):
                if not queries[name].isActive:
                    raise RuntimeError(f"query {name} failed: {queries[name].exception()}")
                continue  # had nothing to plan after all (e.g. a duplicate landing)
            run[name] = (gate.waiting, gate.open_one())
        for name, (_batch, target) in run.items():
            self.gates[name].wait_done(target, FINISH_TIMEOUT_S, alive[name])
        per = {name: self._processing(queries[name], batch) for name, (batch, _t) in run.items()}
        return (max(per.values()) if per else 0.0), len(run), per

    def _processing(self, query, batch_id: int, timeout: float = 30.0) -> float:
        """Seconds of micro-batch ``batch_id`` of ``query`` without its wait at the gate (Spark's progress event,
        which arrives once the micro-batch has committed)."""
        deadline = time.monotonic() + timeout
        while True:
            for p in reversed(query.recentProgress):
                if p["batchId"] == batch_id:
                    took = p["durationMs"].get("triggerExecution", 0) / 1000.0
                    return round(max(0.0, took - self.gates[_short(query.name)].waited_s.get(batch_id, 0.0)), 3)
            if time.monotonic() > deadline or not query.isActive:
                raise RuntimeError(f"query {query.name}: no progress event for micro-batch {batch_id}")
            time.sleep(0.02)

    def settle(self, seconds: float = 0.3) -> None:
        """Give the poll trigger time to plan what follows a micro-batch (a no-data one), wall time."""
        time.sleep(seconds)


def _short(name: str) -> str:
    return name.removeprefix("rate-governor-")


def grid_after(t, trigger: int):
    """Spark's ``ProcessingTimeExecutor.nextBatchTime``: the next multiple of the trigger interval after ``t``
    (a pandas Timestamp, UTC)."""
    import math

    import pandas as pd

    sec = t.value / 1e9
    return pd.Timestamp(int((math.floor(sec / trigger) + 1) * trigger * 1e9), tz="UTC")
