"""One console line per micro-batch, from Spark's own ``StreamingQueryProgress`` (not counted by hand).

:class:`ProgressListener` is a ``StreamingQueryListener`` (pyspark 4 runs Python listeners on the driver through
``spark.streams.addListener``). For every progress event of a rate-governor query it logs, on the
``rate_governor.progress`` logger::

    ingest batch 3: 11,520 rows, 1,931 rows/s, 6.0 s (availableNow), backlog 52% (11,520 of 22,150 rows)
    gold batch 3: 6.9 s (availableNow), watermark 2026-11-23 10:41:00, 310 window aggregates in state

* rows and rows/s are ``numInputRows`` and ``processedRowsPerSecond`` of the progress, shown for the ingest query
  only: the gold query reads the metric events the ingest query wrote (records already counted there), and the
  fast query reads the raw stream in two branches (stats, failures), which Spark counts once per branch, so its
  ``numInputRows`` is twice the records;
* the batch duration (``batchDuration``, ms) is set against the trigger interval: ``6.0 s of 30 s trigger``,
  ``(falling behind)`` when it is longer; with ``--once`` the trigger is ``availableNow``;
* the watermark is ``eventTime["watermark"]`` and the windows kept are the state operators' ``numRowsTotal`` (the
  gold query's; the ingest query has neither);
* backlog, with ``--once``: the rows the ingest query has read (sum of ``numInputRows`` of its progress events)
  against the backlog found at start. For landing files that is the lines of every file under the landing
  directory minus the rows already in bronze (a restart does not count what an earlier run ingested); for Kafka it
  is read from the progress itself: the source's ``latestOffset`` minus its ``endOffset``, summed over partitions
  (records still behind), which also gives ``N records behind`` in continuous mode.

Spark reports progress when a micro-batch ends. With ``source.max_files_per_trigger = 0`` (the embedded default)
``--once`` reads everything that has landed in one micro-batch and prints one line per query at its end; bound the
micro-batch (``source.max_files_per_trigger``, ``source.kafka.max_offsets_per_trigger``) to watch a long backlog
move batch by batch.

Each event also feeds the metrics (:func:`pipelines.ops.metrics.observe_progress`: the batch duration, how far it
ran past the trigger, the watermark).

Warnings that need an operator (on ``rate_governor.progress``, WARNING): rows dropped by the window aggregation
because they arrived behind the watermark (``stateOperators[].numRowsDroppedByWatermark``, late data), and an
ingest micro-batch that quarantined records (from the governor's own batch report of the same batch id).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import StreamingQueryProgress

from pipelines import tables
from pipelines.ops import metrics

if TYPE_CHECKING:
    from pipelines.job.flows.assembly import Governor

log = logging.getLogger("rate_governor.progress")

#: Prefix of the governor's query names (``rate-governor-ingest``, ``rate-governor-gold``).
QUERY_PREFIX = "rate-governor-"
#: Spark's watermark before the first event (epoch 0).
NO_WATERMARK = "1970-01-01T00:00:00.000Z"


def count_lines(paths: Iterable[Path]) -> int:
    """Lines in the files, as Spark's text source reads them: every newline, plus a last line without one."""
    total = 0
    for path in paths:
        last = b"\n"
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                total += chunk.count(b"\n")
                last = chunk[-1:]
        total += last != b"\n"
    return total


def landing_lines(landing: str | Path) -> int:
    """Lines of every file under ``<landing>/broker_stats`` and ``<landing>/send_failures`` (hidden files and
    Spark's ``_``-prefixed files excluded, as the file source does)."""
    from pipelines.dataplane.sources import INPUTS

    files = [
        p
        for name in INPUTS
        for p in sorted((Path(landing) / name).rglob("*"))
        if p.is_file() and not any(part.startswith((".", "_")) for part in p.relative_to(landing).parts)
    ]
    return count_lines(files)


def offsets_behind(source: Mapping) -> int | None:
    """Records between a Kafka source's ``endOffset`` and ``latestOffset`` (``{"topic": {"0": 42}}`` JSON), summed
    over partitions; None for a source whose offsets are not per partition (the file source's ``logOffset``)."""
    try:
        end, latest = json.loads(source.get("endOffset") or "null"), json.loads(source.get("latestOffset") or "null")
    except (TypeError, ValueError):
        return None
    if not isinstance(end, dict) or not isinstance(latest, dict) or "logOffset" in latest:
        return None
    behind = 0
    for topic, partitions in latest.items():
        if not isinstance(partitions, dict):
            return None
        done = end.get(topic, {})
        behind += sum(max(int(off) - int(done.get(part, 0)), 0) for part, off in partitions.items())
    return behind


def _watermark(progress: StreamingQueryProgress) -> str | None:
    mark = (progress.get("eventTime") or {}).get("watermark")
    if not mark:
        return None
    return "not yet" if mark == NO_WATERMARK else mark.replace("T", " ")[:19]


def describe(
    progress: StreamingQueryProgress,
    *,
    trigger_seconds: float | None,
    rows_done: int | None = None,
    backlog_rows: int | None = None,
    counts_records: bool = True,
) -> str:
    """The console line of one progress event (see the module docstring); ``trigger_seconds`` None = availableNow,
    ``rows_done``/``backlog_rows`` give the backlog part (omitted when ``backlog_rows`` is None), and
    ``counts_records`` False leaves out rows and rows/s (a query that reads its source more than once)."""
    name = (progress.get("name") or "query").removeprefix(QUERY_PREFIX)
    seconds = (progress.get("batchDuration") or 0) / 1000
    if trigger_seconds is None:
        pace = f"{seconds:.1f} s (availableNow)"
    else:
        behind = " (falling behind)" if seconds > trigger_seconds else ""
        pace = f"{seconds:.1f} s of {trigger_seconds:g} s trigger{behind}"
    parts = [f"{progress.get('numInputRows') or 0:,} rows",
             f"{progress.get('processedRowsPerSecond') or 0:,.0f} rows/s"]
    parts = (parts if counts_records else []) + [pace]
    if (mark := _watermark(progress)) is not None:
        parts.append(f"watermark {mark}")
    if operators := progress.get("stateOperators"):
        parts.append(f"{sum(int(op.get('numRowsTotal') or 0) for op in operators):,} window aggregates in state")
    kafka_behind = [b for b in (offsets_behind(s) for s in progress.get("sources") or []) if b is not None]
    if backlog_rows is not None and rows_done is not None and counts_records:
        share = 100.0 if backlog_rows <= 0 else min(100.0, 100.0 * rows_done / backlog_rows)
        parts.append(f"backlog {share:.0f}% ({rows_done:,} of {backlog_rows:,} rows)")
    elif kafka_behind and counts_records:
        parts.append(f"{sum(kafka_behind):,} records behind")
    return f"{name} batch {progress.get('batchId')}: " + ", ".join(parts)


def late_rows_dropped(progress: StreamingQueryProgress) -> int:
    """Rows the stateful operators dropped for arriving behind the watermark in this micro-batch."""
    return sum(int(op.get("numRowsDroppedByWatermark") or 0) for op in progress.get("stateOperators") or [])


BatchRows = Callable[[str, int], "Mapping[str, int] | None"]


class ProgressListener(StreamingQueryListener):
    """Logs :func:`describe` for every micro-batch of the governor's queries, and the warnings above.

    Args:
        trigger_seconds: the processing-time trigger; None with ``--once`` (availableNow).
        backlog_rows: with ``--once``, the rows waiting at start (None: no backlog part; with Kafka the backlog is
            read from the progress's own offsets).
        batch_rows: ``(query, batch_id) -> {table: rows written}`` (the governor's batch report), for the
            quarantine warning; None = no quarantine warning.
        record_queries: queries (name without ``rate-governor-``) whose ``numInputRows`` counts each record once;
            rows, rows/s and the backlog are shown for these only.
    """

    def __init__(
        self,
        *,
        trigger_seconds: float | None,
        backlog_rows: int | None = None,
        batch_rows: BatchRows | None = None,
        record_queries: tuple[str, ...] = ("ingest",),
    ) -> None:
        self.record_queries = record_queries
        self.trigger_seconds = trigger_seconds
        self.backlog_rows = backlog_rows
        self.batch_rows = batch_rows
        self.rows_done: dict[str, int] = {}
        self.lines: list[str] = []

    def onQueryStarted(self, event) -> None:  # noqa: N802 - Spark's API
        pass

    def onQueryIdle(self, event) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event) -> None:  # noqa: N802
        if event.exception:
            held = [line for line in event.exception.splitlines() if "LakeHeldError: " in line]
            why = held[0].split("LakeHeldError: ", 1)[1] if held else event.exception.splitlines()[0]
            log.error("query %s stopped: %s", event.id, why)

    def onQueryProgress(self, event) -> None:  # noqa: N802
        try:
            self.on_progress(event.progress)
        except Exception:  # noqa: BLE001 - a console line must never break the stream
            log.debug("progress line failed", exc_info=True)

    def on_progress(self, progress: StreamingQueryProgress) -> str | None:
        """Log the line (and warnings) of one progress event; returns the line (None for other queries)."""
        name = progress.get("name") or ""
        if not name.startswith(QUERY_PREFIX):
            return None
        query = name.removeprefix(QUERY_PREFIX)
        metrics.observe_progress(query, progress)
        done = self.rows_done.get(query, 0) + int(progress.get("numInputRows") or 0)
        self.rows_done[query] = done
        backlog = self.backlog_rows
        behind = [b for b in (offsets_behind(s) for s in progress.get("sources") or []) if b is not None]
        if backlog is None and behind and self.trigger_seconds is None:
            backlog = done + sum(behind)  # availableNow over Kafka: what is read plus what is still behind
        line = describe(
            progress,
            trigger_seconds=self.trigger_seconds,
            rows_done=done if backlog is not None else None,
            backlog_rows=backlog,
            counts_records=query in self.record_queries,
        )
        self.lines.append(line)
        log.info("%s", line)
        batch_id = int(progress.get("batchId") or 0)
        if dropped := late_rows_dropped(progress):
            log.warning(
                "%s batch %d: %d rows arrived behind the watermark and were left out of the windows (late data; "
                "they are in silver; raise windows.watermark_seconds if this is routine)", query, batch_id, dropped
            )
        if self.batch_rows is not None and query == "ingest":
            rows = self.batch_rows(query, batch_id) or {}
            quarantined = int(rows.get(tables.QUARANTINE, 0))
            if quarantined:
                read = sum(rows.get(t, 0) for t in (tables.BRONZE_BROKER_STATS, tables.BRONZE_SEND_FAILURES))
                log.warning(
                    "ingest batch %d: %d of %d records quarantined; see the quarantine table (python -m "
                    "pipelines.ops.query --lake LAKE \"SELECT reason, count(*) FROM %s GROUP BY reason\")",
                    batch_id, quarantined, read, tables.sql_name(tables.QUARANTINE),
                )
        return line


#: Listeners registered by :func:`attach` and not yet removed, per session (one governor run at a time).
_ATTACHED: list[tuple[object, ProgressListener]] = []


def attach(spark: SparkSession, governor: Governor, *, once: bool) -> ProgressListener:
    """Register a :class:`ProgressListener` for ``governor``'s queries on ``spark`` (call before starting them),
    first removing one an earlier run left registered (a run that raised before :func:`detach`).

    With ``once`` and the files source, the backlog is the landing directory's lines minus the rows already in
    bronze (both counted now, before the queries start).
    """
    for session, old in [entry for entry in _ATTACHED if entry[0] is spark]:
        detach(session, old)
    cfg = governor.cfg
    backlog = None
    if once and cfg.source.kind == "files":
        backlog = max(landing_lines(cfg.source.landing) - _bronze_rows(str(cfg.lake.path)), 0)

    def batch_rows(query: str, batch_id: int) -> dict[str, int] | None:
        for report in reversed(governor.reports):
            if report.query == query and report.batch_id == batch_id:
                return report.rows
        return None

    listener = ProgressListener(
        trigger_seconds=None if once else float(cfg.windows.trigger_seconds),
        backlog_rows=backlog,
        batch_rows=batch_rows,
    )
    spark.streams.addListener(listener)
    _ATTACHED.append((spark, listener))
    return listener


def _bronze_rows(lake: str) -> int:
    """Rows already in both bronze tables (0 for a new lake)."""
    from pipelines.ops import query

    total = 0
    for table in (tables.BRONZE_BROKER_STATS, tables.BRONZE_SEND_FAILURES):
        try:
            sql = f"SELECT count(*) AS n FROM {tables.sql_name(table)}"
            total += int(query.run_sql(lake, sql).column("n")[0].as_py())
        except ValueError:
            pass  # the table does not exist yet
    return total


def detach(spark: SparkSession, listener: ProgressListener) -> None:
    """Let Spark's listener bus deliver the events already posted (the last micro-batch's line), then remove the
    listener (a test session runs the governor many times)."""
    try:
        spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()
    except Exception:  # noqa: BLE001 - private Spark API: at worst the last line is missing
        log.debug("could not wait for the listener bus", exc_info=True)
    spark.streams.removeListener(listener)
    if (spark, listener) in _ATTACHED:
        _ATTACHED.remove((spark, listener))
