"""The streaming job's queries: how they start (each a thin flow of :mod:`pipelines.job.flows`, on its trigger and
checkpoint), the lease fence in front of every handler, and how they stop (``--once``: the first failure stops the
others; a lost lease stops all).

May import: pyspark, :mod:`pipelines.job`, :mod:`pipelines.dataplane`, :mod:`pipelines.ops`, the top-level modules.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from pipelines.config import GovernorConfig
from pipelines.dataplane import events, sources
from pipelines.dataplane.session import session_conf
from pipelines.job.flows.assembly import Governor
from pipelines.job.flows.fast import CHECKPOINT as FAST_CHECKPOINT
from pipelines.job.flows.fast import open_window_stream
from pipelines.job.flows.gold import metric_event_stream, window_stream
from pipelines.ops import metrics

log = logging.getLogger("rate_governor")


#: A ``foreachBatch`` handler: (micro-batch, batch id) → nothing.
Handler = Callable[[DataFrame, int], None]


def _fenced(handler: Handler, governor: Governor) -> Handler:
    """``handler`` behind the lake's fence: a micro-batch that starts after this governor lost the lake's lease
    fails before it reads or writes anything (the flows' own appends and publishes ask the fence again), and one
    during which the lease was lost (the process hung past ``lake.lease_ttl_seconds`` inside the handler) fails
    after it, so that Spark does not commit a micro-batch the governor taking the lake over runs again: only a
    hang between this last check and Spark's commit is left (docs/reliability.md, "Not covered"). A micro-batch
    interrupted by its query's stop fails with :class:`StoppedMidBatch`."""

    handler = stopped_short(handler)

    def handle(df: DataFrame, batch_id: int) -> None:
        governor.lake.check_fence()
        handler(df, batch_id)
        governor.lake.check_fence()

    return handle


def stopped_short(handler: Handler) -> Handler:
    """``handler`` raising :class:`StoppedMidBatch` instead of the error of a Spark call its query's stop
    interrupted; every other error goes through unchanged."""

    def handle(df: DataFrame, batch_id: int) -> None:
        try:
            return handler(df, batch_id)
        except Exception as exc:
            stopped = StoppedMidBatch.of(exc)
            if stopped is None:
                raise
            raise stopped from None

    return handle


class StoppedMidBatch(Exception):
    """A ``foreachBatch`` handler's Spark call interrupted because its query was stopped (``query.stop()``, the
    lease lost, the end of a run), told to Spark in the few words it recognises.

    Spark reads the error of a Python ``foreachBatch`` as the text of the Python traceback and takes it for the stop's
    interruption when it matches ``StreamExecution.PROXY_ERROR``: ``py4j.protocol.Py4JJavaError: An error occurred
    while calling`` then any text then one of :data:`INTERRUPTIONS` (``StreamExecution.isInterruptionException``,
    Spark 4.0-4.3, since SPARK-39218). That expression recurses once per character of the text after "calling";
    the traceback of the Py4JJavaError itself carries the whole Java stack (about 9,000 characters), so the stream
    thread died of a ``java.lang.StackOverflowError`` and the JVM printed about 1,000 lines at every stop. This
    error's traceback is a few hundred characters and still matches: the stop stays a clean stop.
    """

    #: The Java exceptions Spark takes for an interruption (``StreamExecution.IO_EXCEPTION_NAMES``).
    INTERRUPTIONS = ("java.lang.InterruptedException", "java.io.InterruptedIOException",
                     "java.nio.channels.ClosedByInterruptException")
    #: How many causes deep an interruption is looked for.
    DEPTH = 8

    @classmethod
    def of(cls, exc: BaseException) -> StoppedMidBatch | None:
        """The short error for ``exc`` when a Java interruption is among its causes (a py4j error's Java
        exception, or a captured pyspark error's), else None (also when the JVM cannot be asked)."""
        java = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)
        try:
            for _ in range(cls.DEPTH):
                if java is None:
                    return None
                name = java.getClass().getName()
                if name in cls.INTERRUPTIONS:
                    call = str(getattr(exc, "errmsg", "An error occurred while calling the JVM")).strip()
                    return cls(f"the query was stopped during micro-batch work: py4j.protocol.Py4JJavaError: "
                               f"{call} {name}")
                java = java.getCause()
        except Exception:  # noqa: BLE001 - the JVM is going away: keep the original error
            return None
        return None


def _start(df: DataFrame, name: str, handler: Handler, mode: str, cfg: GovernorConfig, once: bool,
           interval: str | None = None, checkpoint: str | None = None) -> StreamingQuery:
    writer = (
        df.writeStream.queryName(f"rate-governor-{name}")
        .outputMode(mode)
        .foreachBatch(handler)
        .option("checkpointLocation", str(Path(cfg.checkpoint_root) / (checkpoint or name)))
    )
    if once:
        return writer.trigger(availableNow=True).start()
    interval = interval or f"{cfg.windows.trigger_seconds} seconds"
    metrics.observe_trigger(name, interval)  # what its micro-batches are measured against
    return writer.trigger(processingTime=interval).start()


def start_queries(spark: SparkSession, governor: Governor, once: bool,
                  interval: str | None = None) -> list[StreamingQuery]:
    """Start the queries; with ``once`` (trigger ``availableNow``) wait until all have finished. ``interval``
    (e.g. ``"100 milliseconds"``) replaces the processing-time trigger of a continuous run: the closed-loop
    backtest (:mod:`pipelines.backtest.loop`) polls with a short one and steps the shipped
    ``windows.trigger_seconds`` in simulated time.

    ``ingest`` reads the raw records; ``gold`` and ``fast`` read the metric events ``ingest`` writes per micro-batch
    (:mod:`pipelines.dataplane.events`: parse once), ``fast`` on its own trigger (``windows.fast_trigger_seconds``).
    Running, all start side by side. With ``once`` the deciding queries start when the ingest query has finished
    (``availableNow`` reads what exists when it starts, and the events of the backlog exist only then). Each query
    writes its own tables (ingest and gold both append to ``quarantine``, under their own Delta app ids). ``fast`` and
    ``gold`` start with ``[spark] decision_conf`` (:func:`pipelines.dataplane.session.session_conf`); ``ingest`` with
    the session's own settings.

    Raises:
        pyspark.errors.StreamingQueryException: with ``once``, a query failed (the others are stopped first).
    """
    cfg = governor.cfg
    raw = sources.raw_records(spark, cfg)
    if not cfg.windows.fast_path_on(once):
        governor.ingest.fast_events_dir = None  # no fast query reads a copy of the events in this run
    governor.queries = [
        _start(raw, "ingest", _fenced(governor.ingest.handle, governor), "append", cfg, once, interval)
    ]
    if once:
        _await_all(governor.queries[:1], stop=governor.queries)
    with session_conf(spark, cfg.spark.decision_conf):
        if cfg.windows.fast_path_on(once):
            open_windows = open_window_stream(events.read_stream(spark, cfg, events.fast_events_dir(cfg)), cfg)
            governor.queries.append(
                _start(open_windows, "fast", _fenced(governor.fast.handle, governor), "update", cfg, once,
                       interval or f"{cfg.windows.fast_trigger_seconds} seconds", checkpoint=FAST_CHECKPOINT))
        windowed = window_stream(metric_event_stream(spark, cfg), cfg)
        governor.queries.append(
            _start(windowed, "gold", _fenced(governor.gold.handle, governor), "append", cfg, once, interval))
    if once:
        _await_all(governor.queries)
    return governor.queries


def _await_all(queries: list[StreamingQuery], stop: list[StreamingQuery] | None = None) -> None:
    """Wait for every query of ``queries`` to finish; as soon as one fails (whichever of them), stop those of
    ``stop`` (default: ``queries``) and raise its error."""
    pending = list(queries)
    try:
        while pending:
            pending = [q for q in pending if not q.awaitTermination(0.2)]  # raises the failure of a failed query
    except Exception:
        for query in stop or queries:
            if query.isActive:
                query.stop()
        raise


def _stop_all(queries: list[StreamingQuery]) -> None:
    for query in list(queries):
        try:
            if query.isActive:
                query.stop()
        except Exception as exc:  # noqa: BLE001 - stopping the others goes on
            log.warning("stopping query %s failed: %s", query.name, exc)


