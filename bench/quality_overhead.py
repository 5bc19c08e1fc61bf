"""Throughput of the governor with data quality on vs off, in the same process on the same landing directory.

* off: ``quality.enforce = false``, ``quality.validate_every_n_batches = 0`` (parse checks and the reconciliation
  still run: they are part of the ingest, not of the rule set);
* on: expectations enforced per row and GX validating every ``--every`` micro-batches.

Throughput = input records / wall-clock seconds of ``governor.run(--once)`` (both queries, ingest and gold),
after a small warm-up run that is not counted (JVM start, first GX context).

Usage:
    .venv/bin/python bench/quality_overhead.py [--minutes 30] [--brokers 3] [--files-per-trigger 2] [--every 1]
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("RATE_GOVERNOR_SIGNING_KEY", "bench-signing-key-not-a-secret")

from pipelines import governor  # noqa: E402
from pipelines.sim.render import render_landing  # noqa: E402
from pipelines.sim.spec import ScenarioSpec  # noqa: E402
from pipelines.config import SparkConfig, parse_config  # noqa: E402
from pipelines.job.flows.ingest import IngestFlow  # noqa: E402
from pipelines.dataplane.session import build_session  # noqa: E402


INGEST_SECONDS: list[float] = []


def _timed_ingest(original):
    def ingest_batch(self, raw, batch_id):
        start = time.perf_counter()
        try:
            return original(self, raw, batch_id)
        finally:
            INGEST_SECONDS.append(time.perf_counter() - start)

    return ingest_batch


IngestFlow.handle = _timed_ingest(IngestFlow.handle)


def run_once(spark, landing: Path, lake: Path, *, quality_on: bool, files_per_trigger: int, every: int) -> float:
    cfg = parse_config(
        {
            "source": {"max_files_per_trigger": files_per_trigger},
            "lake": {"writer": "delta-rs"},
            "quality": {"enforce": quality_on, "validate_every_n_batches": every if quality_on else 0},
        }
    ).with_paths(str(landing), str(lake))
    start = time.perf_counter()
    governor.run(spark, cfg, once=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, default=30)
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--topics", type=int, default=10)
    parser.add_argument("--groups", type=int, default=6)
    parser.add_argument("--files-per-trigger", type=int, default=2)
    parser.add_argument("--every", type=int, default=1, help="GX validates every Nth micro-batch when on")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    spark = build_session(SparkConfig(conf={"spark.ui.enabled": "false"}))
    start = dt.datetime(2026, 11, 22, 8, 0, tzinfo=dt.timezone.utc)
    with tempfile.TemporaryDirectory(prefix="rg-bench-") as tmp:
        root = Path(tmp)
        warm = ScenarioSpec(seed=3, start=start, minutes=3, brokers=2, topics=3, groups=2)
        render_landing(warm, root / "warm")
        run_once(spark, root / "warm", root / "warm-on", quality_on=True, files_per_trigger=0, every=1)
        run_once(spark, root / "warm", root / "warm-off", quality_on=False, files_per_trigger=0, every=1)

        spec = ScenarioSpec(seed=7, start=start, minutes=args.minutes, brokers=args.brokers,
                            topics=args.topics, groups=args.groups)
        written = render_landing(spec, root / "landing")
        records = written["stats_lines"] + written["failure_lines"]
        seconds, ingest = {}, {}
        for name, on in (("off", False), ("on", True)):
            INGEST_SECONDS.clear()
            seconds[name] = run_once(spark, root / "landing", root / f"lake-{name}", quality_on=on,
                                     files_per_trigger=args.files_per_trigger, every=args.every)
            ingest[name] = (sum(INGEST_SECONDS), len(INGEST_SECONDS))
    print(f"records: {records} ({written['files']} files, {args.files_per_trigger} per trigger and input)")
    for name in ("off", "on"):
        total, (ing, batches) = seconds[name], ingest[name]
        print(f"validation {name:<3}: governor {total:6.1f} s = {records / total:8,.0f} records/s | ingest query "
              f"{ing:6.1f} s in {batches} batches = {records / ing:8,.0f} records/s")
    print(f"ratio on/off (governor)    : {seconds['off'] / seconds['on']:.2f}")
    print(f"ratio on/off (ingest query): {ingest['off'][0] / ingest['on'][0]:.2f}"
          f"   (on = expectations per row + GX every {args.every} batch(es))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
