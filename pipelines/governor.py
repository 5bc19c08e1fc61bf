"""The streaming governor: starts the streaming queries over the raw records and waits on them.

Queries (each a thin flow of :mod:`pipelines.flows` over the pure transforms of :mod:`pipelines.transforms`):

* ``ingest`` (:class:`~pipelines.flows.ingest.IngestFlow`): every record → ``bronze/*``, parsed → ``silver/*`` or
  ``quarantine`` (nothing is dropped).
* ``fast`` (:class:`~pipelines.flows.fast.FastFlow`, the fast path): open windows, every micro-batch → preliminary
  ``gold/limits`` decisions on evidence that later input can only strengthen, and the published limits. Runs in
  the continuous job (``windows.fast_path``).
* ``gold`` (:class:`~pipelines.flows.gold.GoldFlow`, the final path): the metric events ``ingest`` writes per
  micro-batch (:mod:`pipelines.io.events`: each record is parsed once), windows finalized by the watermark →
  ``gold/*`` TPS tables, ``gold/anomalies``, ``gold/limits`` (+ ``state/policy``, and the confirmation or reversal
  of preliminary decisions) and the published limits.

Every Delta append is tagged with the query's app id and the micro-batch id, so a micro-batch replayed after a
crash writes nothing twice; checkpoints live under ``<lake>/_checkpoints`` (or ``lake.checkpoint_dir``).

Usage:
    python -m pipelines.governor --conf conf/local.toml [--landing DIR] [--lake DIR] [--once] [--verbose]
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from control.record import SigningKeyError
from pipelines.cli import OneLineParser, fail
from pipelines.config import ConfigError, GovernorConfig, load_config
from pipelines.flows.assembly import Governor, build_governor
from pipelines.flows.fast import CHECKPOINT as FAST_CHECKPOINT, open_window_stream
from pipelines.flows.base import Clock, utc_now
from pipelines.flows.gold import metric_event_stream, window_stream
from pipelines.io import events, sources
from pipelines.io.checkpoint import check_checkpoint, clear_unplanned_first_batch
from pipelines.io.lease import GovernorLease, LakeHeldError
from pipelines.io.publish import signing_key
from pipelines.ops import console, metrics, progress
from pipelines.session import session_conf

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
    (:mod:`pipelines.io.events`: parse once), ``fast`` on its own trigger (``windows.fast_trigger_seconds``).
    Running, all start side by side. With ``once`` the deciding queries start when the ingest query has finished
    (``availableNow`` reads what exists when it starts, and the events of the backlog exist only then). Each query writes its own tables (ingest and gold both append
    to ``quarantine``, under their own Delta app ids). ``fast`` and ``gold`` start with ``[spark] decision_conf``
    (:func:`pipelines.session.session_conf`); ``ingest`` with the session's own settings.

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


def run(
    spark: SparkSession, cfg: GovernorConfig, *, once: bool, clock: Clock = utc_now, lease: GovernorLease | None = None
) -> Governor:
    """Run the governor on ``cfg`` (landing and lake already set). With ``once``, returns when all that has landed
    is processed; otherwise runs until a query stops or fails, serving its metrics (``[metrics] port``,
    :mod:`pipelines.ops.metrics`) meanwhile. Holds the lake's lease (``lease``, or a new one) while running and
    releases it at the end.

    Raises:
        LakeHeldError: another governor holds the lake (nothing was started or written), or this one's lease was
            lost (taken over, or expired while it hung longer than ``lake.lease_ttl_seconds``): its queries were
            stopped and it wrote nothing after its lease expired (every write asks the lease first).
        RuntimeError: a query failed (its name and error).
    """
    lease = lease or GovernorLease(cfg.lake.path, cfg.lake.lease_ttl_seconds)
    metrics.configure(cfg)
    lease.acquire()
    endpoint = None if once else metrics.serve(cfg.metrics)  # never stops the run: a busy port is one log line
    try:
        check_checkpoint(cfg)
        clear_unplanned_first_batch(cfg)  # under the lease: no other governor writes these checkpoints
        governor = build_governor(spark, cfg, clock)
        governor.lake.fence = lease.check  # no write once the lease is lost (taken over, or expired in a hang)
        listener = progress.attach(spark, governor, once=once)  # one console line per micro-batch
        # renewed from before the first query starts: a --once backlog can take longer than the ttl
        lease.start_renewing(on_lost=lambda: _stop_all(governor.queries))
        try:
            governor.known.start()  # the known brokers, read now (the trust line logged once) and kept fresh
            start_queries(spark, governor, once)
            if not once:
                spark.streams.awaitAnyTermination()
        except Exception:
            if not lease.lost:  # a query failed on the fence: the lease, not the query, is the error
                raise
        finally:
            progress.detach(spark, listener)
            governor.known.stop()
        if lease.lost:
            _stop_all(governor.queries)
            raise LakeHeldError(f"lake {cfg.lake.path}: the lease was taken over by another governor; stopped")
        for query in governor.queries:
            if query.exception() is not None:
                raise RuntimeError(f"query {query.name} failed: {query.exception()}")
        return governor
    finally:
        lease.release()
        if endpoint is not None:
            endpoint.close()


def _stop_all(queries: list[StreamingQuery]) -> None:
    for query in list(queries):
        try:
            if query.isActive:
                query.stop()
        except Exception as exc:  # noqa: BLE001 - stopping the others goes on
            log.warning("stopping query %s failed: %s", query.name, exc)


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="python -m pipelines.governor",
        description="rate-governor: per-topic rate limits for RocketMQ from stats.log lines and send failures.",
    )
    parser.add_argument("--conf", required=True, help="config file, e.g. conf/local.toml")
    parser.add_argument("--landing", help="landing directory (overrides source.landing)")
    parser.add_argument("--lake", help="lake directory for the Delta tables (overrides lake.path)")
    parser.add_argument("--once", action="store_true", help="process everything that has landed, then stop")
    parser.add_argument("--verbose", action="store_true", help="show Spark's own log lines (hidden by default)")
    return parser


#: Start-up errors that end the CLI with one line.
STARTUP_ERRORS = (ConfigError, sources.LandingError, SigningKeyError, LakeHeldError)


def load_run_config(args: argparse.Namespace, *, checkpoint: bool = True) -> GovernorConfig:
    """Config file + CLI overrides, with the landing directory, the signing key and (with ``checkpoint``) the
    checkpoint checked.

    Raises:
        one of :data:`STARTUP_ERRORS`.
    """
    cfg = load_config(args.conf).with_paths(args.landing, args.lake)
    if cfg.source.kind == "files":
        sources.prepare_landing(cfg.source.landing)
    signing_key(cfg)
    if checkpoint:
        check_checkpoint(cfg)
    return cfg


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console.configure_logging(args.verbose)
    lease = None
    try:
        cfg = load_run_config(args, checkpoint=False)
        lease = GovernorLease(cfg.lake.path, cfg.lake.lease_ttl_seconds)
        lease.acquire()  # before Spark starts or anything is written: a second governor refuses here, in one line
        check_checkpoint(cfg)
    except STARTUP_ERRORS as exc:
        if lease is not None:
            lease.release()
        return fail("rate-governor", exc)
    from pipelines.session import build_session

    spark = build_session(cfg.spark, verbose=args.verbose)
    try:
        run(spark, cfg, once=args.once, lease=lease)
    except LakeHeldError as exc:
        # Spark reports the cancelled jobs of the stopped queries from its scheduler's thread, after stop() returned:
        # stopping the session drains it, so the governor's line is the last one an SRE reads
        _stop_session(spark)
        return fail("rate-governor", exc)
    return 0


def _stop_session(spark: SparkSession) -> None:
    try:
        spark.stop()
    except Exception as exc:  # noqa: BLE001 - the exit line matters more than a clean stop
        log.warning("stopping Spark: %s", exc)


if __name__ == "__main__":
    sys.exit(main())
