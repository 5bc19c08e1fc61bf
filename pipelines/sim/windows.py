"""The data plane, modelled without Spark for the closed-loop simulator (:mod:`pipelines.sim.loop`): the metric
events a simulated cluster prints → the windowed sums Spark would hand the decision plane.

* :class:`FinalWindows`: the gold query's stateful windowed sums with its watermark, in append mode: a window is
  emitted once, in the micro-batch after the one whose input moved the watermark past its end; each emitted batch
  becomes the gold TPS tables and the per-broker traffic rows (:func:`gold_tables`), as
  :mod:`pipelines.dataplane.transforms.tps` computes them.
* :class:`OpenWindows`: the fast query's running sums per window × resource (update mode: the rows a micro-batch's
  input touched), as :func:`pipelines.dataplane.transforms.fast.open_window_sums` computes them.

Rows at or older than the watermark are dropped by both, as Spark's stateful operators drop them. The same events give
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

FAILURE = "failure:"
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


def _sorted_classes(counts: dict[str, int]) -> list[tuple[str, int]] | None:
    return sorted(counts.items()) or None


def gold_tables(sums: dict, length: int, detection: DetectionConfig,
                limited: tuple[str, ...] = ()) -> dict[str, pa.Table]:
    """Windowed sums ``{(window_start, broker, topic, group, metric): amount}`` of the windows to emit → the gold
    query's reduced outputs: ``gold/topic_tps``, ``gold/group_tps``, ``gold/broker_tps`` and the decisions' traffic
    rows with their markers (``traffic``), as :mod:`pipelines.dataplane.transforms.tps` computes them."""
    per = float(length)
    w = dt.timedelta(seconds=length)
    topics: dict = defaultdict(lambda: {"puts": 0, "brokers": set(), "classes": defaultdict(int), "put_line": False})
    groups: dict = defaultdict(lambda: {"got": 0, "sent_back": 0})
    brokers: dict = defaultdict(lambda: {"puts": 0, "broker_puts": None, "topics": set(), "classes": defaultdict(int),
                                         "put_line": False})
    tb: dict = defaultdict(lambda: {"puts": 0, "rejected": 0, "carries": False})
    gb: dict = defaultdict(lambda: {"sent_back": 0, "retry_puts": 0, "rejected": 0})
    windows, traffic_windows = set(), set()
    for (start, broker, topic, group, metric), amount in sums.items():
        windows.add(start)
        is_failure = metric.startswith(FAILURE)
        klass = metric[len(FAILURE):] if is_failure else None
        if metric == rmq.TOPIC_PUT_NUMS and topic is not None:
            t = topics[(start, topic)]
            t["puts"] += amount
            t["put_line"] = True
            if broker is not None:
                t["brokers"].add(broker)
        if is_failure and topic is not None:
            topics[(start, topic)]["classes"][klass] += amount
        if metric in (rmq.GROUP_GET_NUMS, rmq.SNDBCK_PUT_NUMS) and group is not None:
            g = groups[(start, group, topic)]
            g["got" if metric == rmq.GROUP_GET_NUMS else "sent_back"] += amount
        if broker is not None:
            if metric == rmq.TOPIC_PUT_NUMS:
                b = brokers[(start, broker)]
                b["puts"] += amount
                b["put_line"] = True
                if topic is not None:
                    b["topics"].add(topic)
            elif metric == rmq.BROKER_PUT_NUMS:
                b = brokers[(start, broker)]
                b["broker_puts"] = (b["broker_puts"] or 0) + amount
                b["put_line"] = True
            elif is_failure:
                brokers[(start, broker)]["classes"][klass] += amount
            # the decisions' per-broker traffic (pipelines.dataplane.transforms.tps.per_broker_traffic)
            limited_fail = metric == FAILURE + rmq.RATE_LIMITED
            is_retry_topic = topic is not None and topic.startswith(rmq.RETRY_TOPIC_PREFIX)
            if topic is not None and (metric == rmq.TOPIC_PUT_NUMS or limited_fail):
                r = tb[(start, topic, broker)]
                if metric == rmq.TOPIC_PUT_NUMS:
                    r["puts"] += amount
                    r["carries"] = True
                else:
                    r["rejected"] += amount
            owner = group if metric == rmq.SNDBCK_PUT_NUMS else (
                topic[len(rmq.RETRY_TOPIC_PREFIX):] if is_retry_topic and (
                    metric == rmq.TOPIC_PUT_NUMS or limited_fail) else None)
            if owner is not None:
                r = gb[(start, owner, broker)]
                if metric == rmq.SNDBCK_PUT_NUMS:
                    r["sent_back"] += amount
                elif metric == rmq.TOPIC_PUT_NUMS:
                    r["retry_puts"] += amount
                else:
                    r["rejected"] += amount
    busy = set(rmq.BUSY_FAILURE_CLASSES)
    topic_rows = []
    for (start, topic), t in topics.items():
        failures = sum(t["classes"].values())
        rate_limited = t["classes"].get(rmq.RATE_LIMITED, 0)
        faults = failures - rate_limited
        attempts = t["puts"] + faults
        topic_rows.append({"window_start": start, "window_end": start + w, "topic": topic, "put_tps": t["puts"] / per,
                           "brokers_reporting": len(t["brokers"]), "failures": failures,
                           "busy_failures": sum(n for c, n in t["classes"].items() if c in busy),
                           "failures_by_class": _sorted_classes(t["classes"]),
                           "failure_rate": faults / attempts if attempts > 0 else 0.0, "rate_limited": rate_limited})
    group_rows = [{"window_start": start, "window_end": start + w, "consumer_group": group, "topic": topic,
                   "consume_tps": g["got"] / per, "retry_tps": g["sent_back"] / per,
                   "retry_ratio": g["sent_back"] / g["got"] if g["got"] > 0 else None}
                  for (start, group, topic), g in groups.items()]
    broker_rows = [{"window_start": start, "window_end": start + w, "broker": broker, "put_tps": b["puts"] / per,
                    "broker_put_tps": None if b["broker_puts"] is None else b["broker_puts"] / per,
                    "topics": len(b["topics"]), "failures": sum(b["classes"].values()),
                    "busy_failures": sum(n for c, n in b["classes"].items() if c in busy),
                    "failures_by_class": _sorted_classes(b["classes"])}
                   for (start, broker), b in brokers.items()]
    rows = [(start, "topic", topic, broker, r["puts"] / per, r["rejected"], r["carries"])
            for (start, topic, broker), r in tb.items()]
    rows += [(start, "group", group, broker, max(r["sent_back"] / per, r["retry_puts"] / per), r["rejected"], False)
             for (start, group, broker), r in gb.items()]
    totals: dict = defaultdict(lambda: [0.0, 0])
    for start, rtype, name, _b, tps, rejected, _c in rows:
        totals[(start, rtype, name)][0] += tps
        totals[(start, rtype, name)][1] += rejected
        traffic_windows.add(start)
    floor = {"topic": detection.surge_floor_tps, "group": detection.retry_floor_tps}
    keep = {k for k, (tps, rejected) in totals.items()
            if tps >= floor[k[1]] * (1.0 - 1e-9) or rejected > 0 or f"{k[1]}\x1f{k[2]}" in limited}
    traffic = [{"window_start": s, "window_end": s + w, "resource_type": t, "resource": n, "broker": b, "tps": tps,
                "rejected": rej, "carries": c} for s, t, n, b, tps, rej, c in rows if (s, t, n) in keep]
    traffic += [{"window_start": s, "window_end": s + w, "resource_type": "*", "resource": name}
                for marks, name in ((windows, "metrics"), (traffic_windows, "traffic")) for s in sorted(marks)]
    return {"gold/topic_tps": from_rows(topic_rows, columns.GOLD_TOPIC_TPS),
            "gold/group_tps": from_rows(group_rows, columns.GOLD_GROUP_TPS),
            "gold/broker_tps": from_rows(broker_rows, columns.GOLD_BROKER_TPS),
            "traffic": from_rows(traffic, columns.WINDOW_TRAFFIC)}


class FinalWindows:
    """The gold query's windowed sums and watermark (module docstring). :meth:`batch` is one micro-batch."""

    def __init__(self, length: int, watermark_seconds: int) -> None:
        self.length, self.delay = length, dt.timedelta(seconds=watermark_seconds)
        self.sums: dict = defaultdict(int)
        self.watermark: dt.datetime | None = None
        self.max_seen: dt.datetime | None = None
        self._starts: set = set()  # the window starts in ``sums`` (what is due is known without scanning it)
        self._start_of = _Starts(length)

    def batch(self, events: list[Event]) -> dict | None:
        """One micro-batch: add ``events`` (those not older than the watermark), emit the windows the watermark of
        the previous micro-batch has passed (their sums, removed from the state; None when there are none), then
        move the watermark."""
        length, sums, starts, start_of = self.length, self.sums, self._starts, self._start_of
        for at, broker, topic, group, metric, amount in events:
            if self.watermark is not None and at <= self.watermark:  # late (Spark: event time <= watermark)
                continue
            start = start_of[at]
            sums[(start, broker, topic, group, metric)] += amount
            starts.add(start)
            self.max_seen = at if self.max_seen is None or at > self.max_seen else self.max_seen
        emitted = None
        if self.pending():
            span = dt.timedelta(seconds=length)
            gone = {s for s in starts if s + span <= self.watermark}
            due = {k: v for k, v in sums.items() if k[0] in gone}  # in the order the state first saw them
            for k in due:
                del sums[k]
            starts -= gone
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


class OpenWindows:
    """The fast query's running sums per window × resource with its watermark (module docstring)."""

    def __init__(self, length: int, watermark_seconds: int) -> None:
        self.length, self.delay = length, dt.timedelta(seconds=watermark_seconds)
        self.rows: dict = {}
        self.watermark: dt.datetime | None = None
        self.max_seen: dt.datetime | None = None
        self._start_of = _Starts(length)

    def _row(self, start, rtype, name) -> dict:
        key = (start, rtype, name)
        if key not in self.rows:
            self.rows[key] = {"puts": 0, "broker_puts": None, "consumed": 0, "retried": 0, "failures": 0,
                              "busy_failures": 0, "rate_limited": 0, "amounts": defaultdict(int), "brokers": set(),
                              "carriers": set()}
        return self.rows[key]

    def batch(self, events: list[Event]) -> pa.Table:
        """One micro-batch: add ``events`` (not older than the watermark) → the rows they touched (Arrow, the
        columns of :data:`OPEN_COLUMNS`), then move the watermark and drop the windows it has passed."""
        return self.batch_rows(events)[0]

    def batch_rows(self, events: list[Event]) -> tuple[pa.Table, list[dict]]:
        """:meth:`batch` → (the rows as Arrow, the same rows as dicts)."""
        touched = set()
        busy = set(rmq.BUSY_FAILURE_CLASSES)
        start_of = self._start_of
        for at, broker, topic, group, metric, amount in events:
            if self.watermark is not None and at <= self.watermark:  # late (Spark: event time <= watermark)
                continue
            start = start_of[at]
            self.max_seen = at if self.max_seen is None or at > self.max_seen else self.max_seen
            if metric.startswith(FAILURE):
                klass = metric[len(FAILURE):]
                if klass == rmq.RATE_LIMITED:
                    if topic is not None:
                        self._row(start, "topic", topic)["rate_limited"] += amount
                        touched.add((start, "topic", topic))
                    continue
                for rtype, name in (("topic", topic), ("broker", broker)):
                    if name is not None:
                        r = self._row(start, rtype, name)
                        r["failures"] += amount
                        r["busy_failures"] += amount if klass in busy else 0
                        touched.add((start, rtype, name))
                continue
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
        w = dt.timedelta(seconds=self.length)
        out = [{"window_start": s, "window_end": s + w, "resource_type": t, "resource": n, "puts": r["puts"],
                "broker_puts": r["broker_puts"], "consumed": r["consumed"], "retried": r["retried"],
                "failures": r["failures"], "busy_failures": r["busy_failures"], "rate_limited": r["rate_limited"],
                "broker_amounts": sorted(r["amounts"].items()) if r["amounts"] else [],
                "brokers": sorted(r["brokers"]), "carriers": sorted(r["carriers"])}
               for (s, t, n) in sorted(touched) for r in (self.rows[(s, t, n)],)]
        if self.max_seen is not None:
            moved = self.max_seen - self.delay
            self.watermark = moved if self.watermark is None or moved > self.watermark else self.watermark
            for key in [k for k in self.rows if k[0] + w <= self.watermark]:
                del self.rows[key]
        return from_rows(out, OPEN_COLUMNS), out
