"""The data plane, modelled without Spark for the closed-loop simulator (:mod:`pipelines.sim.loop`): the metric
events a simulated cluster prints → the windowed sums Spark would hand the decision plane.

* :class:`FinalWindows`: the gold query's stateful windowed sums with its watermark, in append mode: a window is
  emitted once, in the micro-batch after the one whose input moved the watermark past its end; each emitted batch
  becomes the gold TPS tables and the per-broker traffic rows (:func:`gold_tables`), as
  :mod:`pipelines.dataplane.transforms.tps` computes them.
* :class:`OpenWindows`: the fast query's running sums per window × resource (update mode: the rows a micro-batch's
  input touched), as :func:`pipelines.dataplane.transforms.fast.open_window_sums` computes them.

A row whose window has ended at or before the watermark is dropped by both, as Spark's windowed aggregation drops
it (its watermark predicate is on the window's end, not the row's event time: a row older than the watermark in a
window still open counts; ``tests/transforms/test_tps.py`` pins it in Spark). A broker whose minute lands later
than that is not counted in its window at all. A stats line shipped twice
counts once in both, as in Spark, where a window's stats amounts are a set of lines
(:func:`pipelines.dataplane.transforms.tps.window_metrics`, ``open_window_sums``): here a stats event equal to one
already in a window's state (same time, broker, topic, group, metric and amount) is skipped; failure events count as
they come. The same events give
the same rows as Spark (``tests/sim/test_windows.py`` checks it against the Spark transforms). Events are tuples
``(event_time, broker, topic, consumer_group, metric, amount)``: event times UTC datetimes, a stats line's at the
start of the minute it covers, a failure's metric ``failure:<class>``.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict

import pyarrow as pa

from pipelines import columns
from pipelines import rocketmq as rmq
from pipelines.config import DetectionConfig
from pipelines.decide.arrow import from_rows, schema
from pipelines.decide.rules.windows import reduce_windows

FAILURE = columns.FAILURE_METRIC_PREFIX
Event = tuple  # (event_time, broker, topic, consumer_group, metric, amount)


def window_of(at: dt.datetime, length: int) -> tuple[dt.datetime, dt.datetime]:
    start = at - dt.timedelta(seconds=at.timestamp() % length)
    return start, start + dt.timedelta(seconds=length)


class _Starts(dict):
    """Event time → its window's start (:func:`window_of`), remembered: a micro-batch's events share few times."""

    def __init__(self, length: int) -> None:
        super().__init__()
        self.length = length

    def __missing__(self, at: dt.datetime) -> dt.datetime:
        if len(self) > 10_000:
            self.clear()
        start = self[at] = window_of(at, self.length)[0]
        return start


def gold_tables(sums: dict, length: int, detection: DetectionConfig,
                limited: tuple[str, ...] = ()) -> dict[str, pa.Table]:
    """Windowed sums ``{(window_start, broker, topic, group, metric): amount}`` of the windows to emit → the gold
    query's reduced outputs: ``gold/topic_tps``, ``gold/group_tps``, ``gold/broker_tps`` and the decisions' traffic
    rows with their markers (``traffic``), by the job's own reduction
    (:func:`pipelines.decide.rules.windows.reduce_windows`) over the rows Spark's stateful aggregation would emit."""
    w = dt.timedelta(seconds=length)
    keys = list(sums)
    starts = [k[0] for k in keys]
    rows = {"window_start": starts, "window_end": [s + w for s in starts],
            "broker": [k[1] for k in keys], "topic": [k[2] for k in keys], "consumer_group": [k[3] for k in keys],
            "metric": [k[4] for k in keys], "amount": list(sums.values())}
    target = schema(columns.WINDOW_METRIC)
    table = pa.Table.from_arrays([pa.array(rows[f.name], type=f.type) for f in target], schema=target)
    return reduce_windows(table, detection, limited)


class FinalWindows:
    """The gold query's windowed sums and watermark (module docstring). :meth:`batch` is one micro-batch."""

    def __init__(self, length: int, watermark_seconds: int) -> None:
        self.length, self.delay = length, dt.timedelta(seconds=watermark_seconds)
        self.sums: dict = defaultdict(int)
        self.watermark: dt.datetime | None = None
        self.max_seen: dt.datetime | None = None
        self._starts: set = set()  # the window starts in ``sums`` (what is due is known without scanning it)
        self._start_of = _Starts(length)
        self._lines: dict = defaultdict(set)  # window start → its stats events (a line shipped twice counts once)

    def batch(self, events: list[Event]) -> dict | None:
        """One micro-batch: add ``events`` (those whose window the watermark has not passed), emit the windows the
        watermark of the previous micro-batch has passed (their sums, removed from the state; None when there are
        none), then move the watermark."""
        length, sums, starts, start_of = self.length, self.sums, self._starts, self._start_of
        span = dt.timedelta(seconds=length)
        for at, broker, topic, group, metric, amount in events:
            start = start_of[at]
            if self.watermark is not None and start + span <= self.watermark:  # late: its window's end passed
                continue
            if not metric.startswith(FAILURE):
                seen = self._lines[start]
                line = (at, broker, topic, group, metric, amount)
                if line in seen:
                    continue
                seen.add(line)
            sums[(start, broker, topic, group, metric)] += amount
            starts.add(start)
            self.max_seen = at if self.max_seen is None or at > self.max_seen else self.max_seen
        emitted = None
        if self.pending():
            gone = {s for s in starts if s + span <= self.watermark}
            due = {k: v for k, v in sums.items() if k[0] in gone}  # in the order the state first saw them
            for k in due:
                del sums[k]
            starts -= gone
            for start in gone:
                self._lines.pop(start, None)
            emitted = due or None
        if self.max_seen is not None:
            moved = self.max_seen - self.delay
            self.watermark = moved if self.watermark is None or moved > self.watermark else self.watermark
        return emitted

    def pending(self) -> bool:
        """Whether the next micro-batch would emit windows without new input (a no-data micro-batch)."""
        return self.watermark is not None and bool(self._starts) and min(self._starts) + dt.timedelta(
            seconds=self.length) <= self.watermark


#: The open-window row columns (:func:`pipelines.dataplane.transforms.fast.open_window_sums`).
OPEN_COLUMNS = (("window_start", "timestamp"), ("window_end", "timestamp"), ("resource_type", "string"),
                ("resource", "string"), ("puts", "long"), ("broker_puts", "long"), ("consumed", "long"),
                ("retried", "long"), ("failures", "long"), ("busy_failures", "long"), ("rate_limited", "long"),
                ("broker_amounts", "map<string,long>"), ("brokers", "array<string>"), ("carriers", "array<string>"))
OPEN_SCHEMA = schema(OPEN_COLUMNS)
#: The failure classes of a busy broker (``busy_failures``).
_BUSY = frozenset(rmq.BUSY_FAILURE_CLASSES)


class OpenWindows:
    """The fast query's running sums per window × resource with its watermark (module docstring)."""

    def __init__(self, length: int, watermark_seconds: int) -> None:
        self.length, self.delay = length, dt.timedelta(seconds=watermark_seconds)
        self.rows: dict = {}
        self.watermark: dt.datetime | None = None
        self.max_seen: dt.datetime | None = None
        self._start_of = _Starts(length)
        self._lines: dict = defaultdict(set)  # window start → its stats events (a line shipped twice counts once)

    def _row(self, start, rtype, name) -> dict:
        key = (start, rtype, name)
        if key not in self.rows:
            self.rows[key] = {"puts": 0, "broker_puts": None, "consumed": 0, "retried": 0, "failures": 0,
                              "busy_failures": 0, "rate_limited": 0, "amounts": defaultdict(int), "brokers": set(),
                              "carriers": set()}
        return self.rows[key]

    def batch(self, events: list[Event]) -> pa.Table:
        """One micro-batch: add ``events`` (those whose window the watermark has not passed) → the rows they touched
        (Arrow, the columns of :data:`OPEN_COLUMNS`), then move the watermark and drop the windows it has passed."""
        return self.batch_rows(events)[0]

    def batch_rows(self, events: list[Event]) -> tuple[pa.Table, list[dict]]:
        """:meth:`batch` → (the rows as Arrow, the same rows as dicts)."""
        touched: set = set()
        start_of = self._start_of
        span = dt.timedelta(seconds=self.length)
        for at, broker, topic, group, metric, amount in events:
            start = start_of[at]
            if self.watermark is not None and start + span <= self.watermark:  # late: its window's end passed
                continue
            self.max_seen = at if self.max_seen is None or at > self.max_seen else self.max_seen
            if metric.startswith(FAILURE):
                self._add_failure(start, broker, topic, metric[len(FAILURE):], amount, touched)
                continue
            seen = self._lines[start]
            line = (at, broker, topic, group, metric, amount)
            if line in seen:  # counted once; its rows are still output (update mode: the keys it touched)
                amount = 0
            seen.add(line)
            self._add_stats(start, broker, topic, group, metric, amount, touched)
        out = self._output(touched)
        self._advance()
        return from_rows(out, OPEN_COLUMNS), out

    def _add_failure(self, start, broker, topic, klass: str, amount: int, touched: set) -> None:
        """A failure line of class ``klass``: a rate-limited one counts for its topic's ``rate_limited``, any other
        for its topic's and its broker's ``failures`` (and ``busy_failures`` when busy)."""
        if klass == rmq.RATE_LIMITED:
            if topic is not None:
                self._row(start, "topic", topic)["rate_limited"] += amount
                touched.add((start, "topic", topic))
            return
        for rtype, name in (("topic", topic), ("broker", broker)):
            if name is not None:
                r = self._row(start, rtype, name)
                r["failures"] += amount
                r["busy_failures"] += amount if klass in _BUSY else 0
                touched.add((start, rtype, name))

    def _add_stats(self, start, broker, topic, group, metric: str, amount: int, touched: set) -> None:
        """A stats event: its broker reported the window; puts count for the topic and the broker (with the broker's
        amount and as a carrier), the broker's own puts, a group's consumption (not of its retry topic) and
        send-backs (with the broker's amount)."""
        if broker is not None:
            self._row(start, "cluster", "*")["brokers"].add(broker)
            touched.add((start, "cluster", "*"))
        if metric == rmq.TOPIC_PUT_NUMS:
            targets = [("topic", topic)] + ([("broker", broker)] if broker is not None else [])
            for rtype, name in targets:
                r = self._row(start, rtype, name)
                r["puts"] += amount
                if broker is not None:
                    r["amounts"][broker] += amount
                    r["carriers"].add(broker)
                touched.add((start, rtype, name))
        elif metric == rmq.BROKER_PUT_NUMS and broker is not None:
            r = self._row(start, "broker", broker)
            r["broker_puts"] = (r["broker_puts"] or 0) + amount
            touched.add((start, "broker", broker))
        elif metric == rmq.GROUP_GET_NUMS and group is not None and not (topic or "").startswith(
                rmq.RETRY_TOPIC_PREFIX):
            self._row(start, "group", group)["consumed"] += amount
            touched.add((start, "group", group))
        elif metric == rmq.SNDBCK_PUT_NUMS and group is not None:
            r = self._row(start, "group", group)
            r["retried"] += amount
            if broker is not None:
                r["amounts"][broker] += amount
            touched.add((start, "group", group))

    def _output(self, touched: set) -> list[dict]:
        """The rows ``touched`` as dicts of :data:`OPEN_COLUMNS`, in key order."""
        w = dt.timedelta(seconds=self.length)
        return [{"window_start": s, "window_end": s + w, "resource_type": t, "resource": n, "puts": r["puts"],
                 "broker_puts": r["broker_puts"], "consumed": r["consumed"], "retried": r["retried"],
                 "failures": r["failures"], "busy_failures": r["busy_failures"], "rate_limited": r["rate_limited"],
                 "broker_amounts": sorted(r["amounts"].items()) if r["amounts"] else [],
                 "brokers": sorted(r["brokers"]), "carriers": sorted(r["carriers"])}
                for (s, t, n) in sorted(touched) for r in (self.rows[(s, t, n)],)]

    def _advance(self) -> None:
        """The watermark moved to the newest event less the delay; the windows it passed dropped."""
        if self.max_seen is not None:
            w = dt.timedelta(seconds=self.length)
            moved = self.max_seen - self.delay
            self.watermark = moved if self.watermark is None or moved > self.watermark else self.watermark
            for key in [k for k in self.rows if k[0] + w <= self.watermark]:
                del self.rows[key]
            for start in [s for s in self._lines if s + w <= self.watermark]:
                del self._lines[start]
