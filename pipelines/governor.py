"""The streaming governor: the one place where streams are read and written, paths and checkpoints chosen.

Two streaming queries over the same raw records (:func:`pipelines.sources.raw_records`):

* ``ingest``: every record → ``bronze/*``, parsed → ``silver/*`` or ``quarantine`` (nothing is dropped).
* ``gold``: accepted records → metric events → event-time windows with a watermark → per micro-batch of
  finalized windows: ``gold/topic_tps``, ``gold/group_tps``, ``gold/broker_tps``, ``gold/anomalies``,
  ``gold/limits`` (+ ``state/policy``) and ``<lake>/control/limits.json``.

Every Delta append is tagged with the query's app id and the micro-batch id, so a micro-batch replayed after a
crash writes nothing twice; checkpoints live under ``<lake>/_checkpoints`` (or ``lake.checkpoint_dir``).

Usage:
    python -m pipelines.governor --conf conf/local.toml [--landing DIR] [--lake DIR] [--once]
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from control import record as control_record
from pipelines.transforms import detect, parse, policy, policy_fold, tps
from pipelines.io import publish, sources
from pipelines.quality import gate as quality
from pipelines.cli import OneLineParser, fail
from pipelines.config import ConfigError, GovernorConfig, load_config
from pipelines.faults import crash_point
from pipelines.io.sinks import SinkSet
from pipelines.io.lake import Lake, open_lake
from pipelines.io.lease import GovernorLease, LakeHeldError

log = logging.getLogger("rate_governor")

INGEST_APP_ID = "rate-governor-ingest"
GOLD_APP_ID = "rate-governor-gold"

Clock = Callable[[], dt.datetime]


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


@dataclass
class BatchReport:
    """What one micro-batch wrote (for logs, the summary and tests)."""

    query: str
    batch_id: int
    rows: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


class Governor:
    """The micro-batch logic of both queries, bound to a lake and a config. Pure DataFrame transformations are
    composed here; the only I/O is the lake and the limits file."""

    def __init__(self, spark: SparkSession, cfg: GovernorConfig, lake: Lake, clock: Clock = utc_now) -> None:
        self.spark = spark
        self.cfg = cfg
        self.lake = lake
        self.clock = clock
        self.signing_key = signing_key(cfg)
        self.sinks = SinkSet.from_config(cfg, lake)
        self.reports: list[BatchReport] = []
        self.queries: list[StreamingQuery] = []

    # --- shared parsing ----------------------------------------------------------------------------------------

    def parsed_stats(self, raw: DataFrame) -> DataFrame:
        """Stats records parsed, with the data-quality expectations applied (both queries see the same rows)."""
        return (
            raw.where(F.col("source") == sources.BROKER_STATS)
            .transform(parse.parse_broker_stats(self.cfg.stats))
            .transform(quality.gate(self).enforce_stats)
            .transform(parse.settled)
        )

    def parsed_failures(self, raw: DataFrame) -> DataFrame:
        """Send-failure records parsed, with the data-quality expectations applied."""
        return (
            raw.where(F.col("source") == sources.SEND_FAILURES)
            .transform(parse.parse_send_failures(self.cfg.stats, self.cfg.brokers))
            .transform(quality.gate(self).enforce_failures)
            .transform(parse.settled)
        )

    # --- ingest query ------------------------------------------------------------------------------------------

    def ingest_batch(self, raw: DataFrame, batch_id: int) -> None:
        """One micro-batch of raw records → bronze, silver and quarantine."""
        gate = quality.gate(self)  # data quality: expectations per row, GX validation, reconciliation
        raw = raw.persist()
        try:
            stats = self.parsed_stats(raw).persist()
            failures = self.parsed_failures(raw).persist()
            rejected = stats.transform(parse.quarantine_rows(sources.BROKER_STATS)).unionByName(
                failures.transform(parse.quarantine_rows(sources.SEND_FAILURES))
            )
            outputs = {
                "bronze/broker_stats": raw.where(F.col("source") == sources.BROKER_STATS),
                "bronze/send_failures": raw.where(F.col("source") == sources.SEND_FAILURES),
                "silver/broker_stats": stats.transform(parse.silver_broker_stats),
                "silver/send_failures": failures.transform(parse.silver_send_failures),
                "quarantine": rejected,
            }
            self._write_all("ingest", INGEST_APP_ID, batch_id, outputs)
            gate.after_ingest(batch_id, raw, stats, failures)
            stats.unpersist()
            failures.unpersist()
        finally:
            raw.unpersist()

    # --- gold query --------------------------------------------------------------------------------------------

    def window_stream(self, raw: DataFrame) -> DataFrame:
        """Streaming raw records → windowed metric sums (WINDOW_METRIC), with a watermark; a stats line shipped twice
        counts once (:func:`pipelines.tps.window_metrics`)."""
        # One watermark over the union (a single event-time operator: after a restart Spark restores one
        # watermark, where several per-input watermarks would stay stuck until every input brought data).
        watermark = f"{self.cfg.windows.watermark_seconds} seconds"
        stats_events = self.parsed_stats(raw).transform(parse.silver_broker_stats).transform(tps.stats_metric_events)
        failure_events = (
            self.parsed_failures(raw).transform(parse.silver_send_failures).transform(tps.failure_metric_events)
        )
        return (
            stats_events.unionByName(failure_events)
            .withWatermark("event_time", watermark)
            .transform(tps.window_metrics(self.cfg.windows))
        )

    def gold_batch(self, metrics: DataFrame, batch_id: int) -> None:
        """One micro-batch of finalized windows → gold tables, anomalies, limit decisions, limits.json."""
        metrics = metrics.transform(self._gold_partitioning).persist()
        try:
            bounds = metrics.agg(F.min("window_start").alias("lo"), F.max("window_end").alias("hi")).first()
            if bounds is None or bounds["lo"] is None:
                self.reports.append(BatchReport("gold", batch_id))
                if self.sinks.behind:  # a sink that was down catches up without waiting for a new decision
                    self.publish(self.clock(), batch_id)
                return
            self._gold(metrics, batch_id, bounds["lo"], bounds["hi"])
        finally:
            metrics.unpersist()

    def _gold(self, metrics: DataFrame, batch_id: int, lo: dt.datetime, hi: dt.datetime) -> None:
        windows, detection, limits = self.cfg.windows, self.cfg.detection, self.cfg.limits
        topics = metrics.transform(tps.topic_tps(windows)).persist()
        groups = metrics.transform(tps.group_tps(windows)).persist()
        brokers = metrics.transform(tps.broker_tps(windows)).persist()
        since = lo - dt.timedelta(seconds=detection.baseline_windows * windows.length_seconds)
        anomalies = detect.detect_anomalies(
            topics,
            groups,
            brokers,
            self.lake.read("gold/topic_tps", since=since, before=lo).transform(self._gold_partitioning),
            self.lake.read("gold/broker_tps", since=since, before=lo).transform(self._gold_partitioning),
            windows,
            detection,
            first_window=lo,
        ).transform(self._gold_partitioning).persist()
        candidates = policy.candidate_limits(anomalies, tps.topic_brokers(metrics), limits)
        folded = policy_fold.decide(
            candidates, self._policy_state(batch_id), hi, limits, windows.length_seconds
        ).persist()
        now = self.clock()
        checked = policy.finish_decisions(folded.where(F.col("row_kind") == "decision"), limits, now).withColumn(
            "reject_reason", quality.failed_expectation(quality.gold_limits_suite())
        )
        decisions = checked.where(F.col("reject_reason").isNull()).drop("reject_reason")
        refused = checked.where(F.col("reject_reason").isNotNull()).select(
            F.lit("gold/limits").alias("source"),
            F.to_json(F.struct(*[c for c in checked.columns if c != "reject_reason"])).alias("raw"),
            F.col("reject_reason").alias("reason"),
            F.lit(f"{GOLD_APP_ID}:{batch_id}").alias("origin"),
            F.lit(now).cast("timestamp").alias("ingested_at"),
        )
        new_state = folded.where(F.col("row_kind") == "state").select("*", F.lit(batch_id).alias("batch_id"))
        self._write_all(
            "gold",
            GOLD_APP_ID,
            batch_id,
            {
                "gold/topic_tps": topics,
                "gold/group_tps": groups,
                "gold/broker_tps": brokers,
                "gold/anomalies": anomalies,
                "gold/limits": decisions,
                "quarantine": refused,
                "state/policy": new_state,
            },
        )
        started = time.monotonic()
        self.publish(now, batch_id)
        log.info("gold batch %d: limits published in %.2f s", batch_id, time.monotonic() - started)
        for df in (topics, groups, brokers, anomalies, folded):
            df.unpersist()

    def _gold_partitioning(self, df: DataFrame) -> DataFrame:
        """With ``spark.gold_single_partition`` (the embedded default), a gold-side DataFrame in one partition.

        The gold side works on finalized windows, not records (hundreds to about 10^5 rows per micro-batch). One
        partition satisfies the distribution that an aggregation or a window function requires, so Spark plans no
        shuffle there (joins and unions of several inputs still shuffle). At micro-batch sizes each shuffle costs a
        Spark job and most of a gold batch's time was such jobs: in ``bench/latency.py`` (5 s trigger) the slowest
        gold micro-batch went from 10.7-13.5 s to 7.7-9.6 s and the first-storm-line-to-limit time from 56-63 s to
        50-55 s (README "Performance" lists the runs). With thousands of topics on a cluster, turn it off to spread
        the windows over the executors.
        """
        return df.coalesce(1) if self.cfg.spark.gold_single_partition else df

    def _policy_state(self, batch_id: int) -> DataFrame:
        """The saved policy state as of the start of ``batch_id``: latest row per resource of earlier batches."""
        saved = self.lake.read("state/policy").transform(self._gold_partitioning).where(F.col("batch_id") < batch_id)
        newest_first = Window.partitionBy("resource_type", "resource").orderBy(F.col("batch_id").desc())
        return (
            saved.select("*", F.row_number().over(newest_first).alias("_rank"))
            .where(F.col("_rank") == 1)
            .drop("_rank", "batch_id")
        )

    def publish(self, now: dt.datetime, batch_id: int) -> Path:
        """Publish the limits in force at ``now`` (from gold/limits): first the changes to the sinks (Kafka when
        enabled; failing soft: retried, reported in ``control/sink_status``, caught up next batch), then
        ``<lake>/control/limits.json``, replaced atomically. A crash between the two re-sends the same versions on
        replay, which brokers accept idempotently."""
        current = publish.current_limits(self.lake.read("gold/limits"), now)
        records = publish.control_records(current, self.cfg.limits, self.signing_key)
        self.sinks.publish_all(records, batch_id=batch_id, now=now)
        return publish.write_limits_file(self.lake.root, records, now)

    # --- helpers -----------------------------------------------------------------------------------------------

    def _write_all(self, query: str, app_id: str, batch_id: int, outputs: dict[str, DataFrame]) -> None:
        report = BatchReport(query, batch_id)
        context = self.spark.sparkContext
        try:
            for table, df in outputs.items():
                started = time.monotonic()
                # Names the Spark jobs of this write in the Spark UI and event log ("gold batch 3: gold/limits").
                context.setJobDescription(f"{query} batch {batch_id}: {table}")
                report.rows[table] = self.lake.append(df, table, app_id=app_id, version=batch_id)
                report.seconds[table] = round(time.monotonic() - started, 2)
                crash_point(f"{query}:after:{table}")
        finally:
            context.setJobDescription(None)
        self.reports.append(report)
        log.info("%s batch %d: rows %s, seconds %s", query, batch_id, report.rows, report.seconds)


#: Settings a checkpoint depends on: changing one makes the saved stream state meaningless.
CHECKPOINT_BOUND_SETTINGS = {
    "windows.length_seconds": lambda cfg: cfg.windows.length_seconds,
    "source.kind": lambda cfg: cfg.source.kind,
}
CHECKPOINT_SETTINGS_FILE = "governor-settings.json"


class CheckpointMismatchError(ConfigError):
    """The config changes a setting the existing checkpoint depends on (e.g. the window length)."""


def check_checkpoint(cfg: GovernorConfig) -> None:
    """Refuse a restart whose config is incompatible with the existing checkpoint; record the settings on first
    start. Other settings (thresholds, limits, trigger) may change between restarts.

    Raises:
        CheckpointMismatchError: names the setting, both values and what to do.
    """
    import json

    root = Path(cfg.checkpoint_root)
    current = {name: read(cfg) for name, read in CHECKPOINT_BOUND_SETTINGS.items()}
    saved_file = root / CHECKPOINT_SETTINGS_FILE
    if saved_file.is_file():
        saved = json.loads(saved_file.read_text())
        for name, value in current.items():
            if name in saved and saved[name] != value:
                raise CheckpointMismatchError(
                    f"{name} is {value} but the checkpoint in {root} was made with {saved[name]}; restore "
                    f"{name} = {saved[name]!r}, or start a new stream with another lake.checkpoint_dir "
                    "(and a new lake, since windows of both lengths would mix)"
                )
        return
    if root.exists() and any(root.iterdir()):
        return  # a checkpoint from before settings were recorded: nothing to compare against
    root.mkdir(parents=True, exist_ok=True)
    saved_file.write_text(json.dumps(current, indent=2) + "\n")


def signing_key(cfg: GovernorConfig) -> bytes | None:
    """The HMAC key of the control records (``limits.signing_key_env`` or ``limits.signing_key_file``).

    Raises:
        control_record.SigningKeyError: no key in enforce mode (brokers would refuse unsigned records), or the
            named key file is missing.
    """
    key = control_record.load_signing_key(cfg.limits.signing_key_env, cfg.limits.signing_key_file or None)
    if key is None and cfg.limits.mode == "enforce":
        raise control_record.SigningKeyError(
            f"limits.mode = 'enforce' needs a signing key: set the environment variable {cfg.limits.signing_key_env} "
            "or limits.signing_key_file (or run with limits.mode = 'advisory')"
        )
    return key


def start_queries(spark: SparkSession, cfg: GovernorConfig, governor: Governor, once: bool) -> list[StreamingQuery]:
    """Start both queries; with ``once``, with trigger ``availableNow``, and wait until both have finished.

    The two queries run side by side in either mode: each writes its own tables (both append to ``quarantine``,
    under their own Delta app ids) and neither reads what the other writes in the same run. Side by side, one
    query's driver-side work (Arrow collection, delta-rs commits, GX on pandas) overlaps the other's Spark tasks.

    Raises:
        pyspark.errors.StreamingQueryException: with ``once``, a query failed (the other is stopped first).
    """
    checkpoints = Path(cfg.checkpoint_root)
    raw = sources.raw_records(spark, cfg)
    plans = [
        ("ingest", raw, governor.ingest_batch, "append"),
        ("gold", governor.window_stream(raw), governor.gold_batch, "append"),
    ]
    queries = []
    for name, df, handler, mode in plans:
        writer = (
            df.writeStream.queryName(f"rate-governor-{name}")
            .outputMode(mode)
            .foreachBatch(handler)
            .option("checkpointLocation", str(checkpoints / name))
        )
        writer = writer.trigger(availableNow=True) if once else writer.trigger(
            processingTime=f"{cfg.windows.trigger_seconds} seconds"
        )
        queries.append(writer.start())
    if once:
        _await_all(queries)
    return queries


def _await_all(queries: list[StreamingQuery]) -> None:
    """Wait for every query to finish; when one fails, stop the others and raise its error."""
    try:
        for query in queries:
            query.awaitTermination()
    except Exception:
        for query in queries:
            if query.isActive:
                query.stop()
        raise


def run(
    spark: SparkSession, cfg: GovernorConfig, *, once: bool, clock: Clock = utc_now, lease: GovernorLease | None = None
) -> Governor:
    """Run the governor on ``cfg`` (landing and lake already set). With ``once``, returns when all that has landed
    is processed; otherwise runs until a query stops or fails. Holds the lake's lease (``lease``, or a new one)
    while running and releases it at the end.

    Raises:
        LakeHeldError: another governor holds the lake (nothing was started or written), or took it over while
            this one hung longer than ``lake.lease_ttl_seconds`` (its queries were stopped).
    """
    lease = lease or GovernorLease(cfg.lake.path, cfg.lake.lease_ttl_seconds)
    lease.acquire()
    try:
        check_checkpoint(cfg)
        lake = open_lake(spark, cfg.lake.path, cfg.lake.writer)
        governor = Governor(spark, cfg, lake, clock)
        queries = start_queries(spark, cfg, governor, once)
        governor.queries = queries
        lease.start_renewing(on_lost=lambda: [query.stop() for query in queries])
        if not once:
            spark.streams.awaitAnyTermination()
        if lease.lost:
            raise LakeHeldError(f"lake {cfg.lake.path}: the lease was taken over by another governor; stopped")
        for query in queries:
            if query.exception() is not None:
                raise RuntimeError(f"query {query.name} failed: {query.exception()}")
        return governor
    finally:
        lease.release()


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="python -m pipelines.governor",
        description="rate-governor: per-topic rate limits for RocketMQ from stats.log lines and send failures.",
    )
    parser.add_argument("--conf", required=True, help="config file, e.g. conf/local.toml")
    parser.add_argument("--landing", help="landing directory (overrides source.landing)")
    parser.add_argument("--lake", help="lake directory for the Delta tables (overrides lake.path)")
    parser.add_argument("--once", action="store_true", help="process everything that has landed, then stop")
    return parser


def load_run_config(args: argparse.Namespace, *, checkpoint: bool = True) -> GovernorConfig:
    """Config file + CLI overrides, with the landing directory (and, with ``checkpoint``, the checkpoint) checked.

    Raises:
        ConfigError: bad config file; sources.LandingError: missing landing directory.
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
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)
    lease = None
    try:
        cfg = load_run_config(args, checkpoint=False)
        lease = GovernorLease(cfg.lake.path, cfg.lake.lease_ttl_seconds)
        lease.acquire()  # before anything is written or Spark starts: a second governor refuses here, in one line
        check_checkpoint(cfg)
    except (ConfigError, sources.LandingError, control_record.SigningKeyError, LakeHeldError) as exc:
        if lease is not None:
            lease.release()
        return fail("rate-governor", exc)
    from pipelines.session import build_session

    spark = build_session(cfg.spark)
    try:
        run(spark, cfg, once=args.once, lease=lease)
    except LakeHeldError as exc:
        return fail("rate-governor", exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
