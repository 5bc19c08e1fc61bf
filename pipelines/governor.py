"""The streaming governor's command line: parses the flags, checks the config, takes the lake's lease and runs the
job (:func:`pipelines.job.run.run`, re-exported here as :func:`run` with :func:`start_queries`).

Queries (each a thin flow of :mod:`pipelines.job.flows` over the pure transforms of
:mod:`pipelines.dataplane.transforms`):

* ``ingest`` (:class:`~pipelines.job.flows.ingest.IngestFlow`): every record → ``bronze/*``, parsed → ``silver/*``
  or ``quarantine`` (nothing is dropped).
* ``fast`` (:class:`~pipelines.job.flows.fast.FastFlow`, the fast path): open windows, every micro-batch → preliminary
  ``gold/limits`` decisions on evidence that later input can only strengthen, and the published limits. Runs in
  the continuous job (``windows.fast_path``).
* ``gold`` (:class:`~pipelines.job.flows.gold.GoldFlow`, the final path): the metric events ``ingest`` writes per
  micro-batch (:mod:`pipelines.dataplane.events`: each record is parsed once), windows finalized by the watermark →
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

from pyspark.sql import SparkSession

from control.record import SigningKeyError
from pipelines.cli import OneLineParser, fail
from pipelines.config import ConfigError, GovernorConfig, load_config
from pipelines.dataplane import sources
from pipelines.job.checkpoint import check_checkpoint
from pipelines.job.flows.assembly import build_governor  # noqa: F401 - re-exported: tests and benchmarks build one
from pipelines.job.lease import GovernorLease, LakeHeldError
from pipelines.job.queries import start_queries  # noqa: F401 - re-exported: the backtest and tests start queries
from pipelines.job.run import run
from pipelines.ops import console
from pipelines.writeback.publish import signing_key

log = logging.getLogger("rate_governor")


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
    from pipelines.dataplane.session import build_session

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
