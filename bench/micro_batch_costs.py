"""Fixed costs of a small micro-batch, each against the design it replaced, measured in one run.

    .venv/bin/python bench/micro_batch_costs.py [--rows 200 20000] [--repeat 3]

1. GX validation of the candidate silver rows of N stats lines (the governor's own parse and quality gate):
   GX's Spark engine (the baseline) against its pandas engine (what ``validation.Validator`` picks up to
   ``quality.pandas_max_rows`` rows). Also checks both report the same unexpected counts.
2. The policy fold of an empty micro-batch and of one with two candidates: a grouped pandas UDF (``applyInPandas``,
   the design before session 3, rebuilt here as the baseline) against the driver-side
   :func:`pipelines.transforms.policy_fold.decide`.
Prints the best of ``--repeat`` timings (after one warm-up) and the ratios baseline / new.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipelines import governor, schemas  # noqa: E402
from pipelines.transforms import parse, policy_fold  # noqa: E402
from pipelines.io import tables  # noqa: E402
from pipelines.quality import rules, validation  # noqa: E402
from pipelines.config import load_config  # noqa: E402
from pipelines.session import build_session  # noqa: E402

INGESTED = dt.datetime(2026, 11, 22, 0, 0)
CANDIDATE_SCHEMA = (
    "resource_type string, resource string, window_end timestamp, target_qps double, floor_qps double, "
    "lift_at_qps double, observed_tps double, critical boolean, mode string, reason string"
)


def best(repeat: int, action) -> float:
    """Seconds of the fastest of ``repeat`` runs of ``action`` after one warm-up run."""
    action()
    times = []
    for _ in range(repeat):
        started = time.monotonic()
        action()
        times.append(time.monotonic() - started)
    return min(times)


def candidate_rows(spark, gov, n: int):
    """The candidate silver/broker_stats rows of ``n`` stats lines, as the ingest query hands them to GX."""
    lines = [
        f"2026-11-22 08:{i // 500 % 60:02d}:00 INFO - [TOPIC_PUT_NUMS] [topic-{i % 500}] Stats In One Minute, "
        f"SUM: {i} TPS: {i / 60:.2f} AVGPT: 1.00"
        for i in range(n)
    ]
    raw = spark.createDataFrame(
        [("broker_stats", line, line.encode(), "file:///landing/broker_stats/broker-a/stats.log", "broker-a", INGESTED)
         for line in lines],
        schemas.RAW_RECORD,
    )
    data = rules.candidates(gov.ingest.parse(raw)[0], parse.silver_broker_stats).persist()
    data.count()
    return data


def unexpected(result) -> dict:
    return {validation.expectation_name_from_result(r): r.result.get("unexpected_count") for r in result.results}


def applyinpandas_decide(candidates, state, horizon_end, cfg, window_seconds):
    """The fold as it ran before session 3: the same input rows, grouped on the executors by ``applyInPandas``."""
    rows = policy_fold.fold_input(candidates, state)
    return rows.groupBy("resource_type", "resource").applyInPandas(
        lambda pdf: policy_fold._fold_group(pdf, horizon_end, cfg, window_seconds), schema=schemas.POLICY_FOLD
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[200, 20000], help="stats lines per micro-batch")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)

    os.environ.setdefault("RATE_GOVERNOR_SIGNING_KEY", "bench-key")
    cfg = load_config(Path(__file__).resolve().parent.parent / "conf" / "local.toml")
    spark = build_session(cfg.spark)
    lake_dir = tempfile.mkdtemp(prefix="rg-bench-")  # the flows need a lake; nothing is written
    gov = governor.build_governor(spark, cfg.with_paths(None, lake_dir))

    spark_engine = validation.shared_validator(pandas_max_rows=0)
    pandas_engine = validation.shared_validator(pandas_max_rows=max(args.rows))
    table = tables.SILVER_BROKER_STATS
    for n in args.rows:
        data = candidate_rows(spark, gov, n)
        same = unexpected(spark_engine.validate(table, data, n)) == unexpected(pandas_engine.validate(table, data, n))
        spark_s = best(args.repeat, lambda: spark_engine.validate(table, data, n))
        pandas_s = best(args.repeat, lambda: pandas_engine.validate(table, data, n))
        print(f"GX, {n:>7} stats rows: Spark engine {spark_s:6.2f} s, pandas engine {pandas_s:6.2f} s, "
              f"ratio {spark_s / pandas_s:5.1f}x, same unexpected counts: {same}")
        data.unpersist()

    end = dt.datetime(2026, 11, 22, 10, 1)
    state = spark.createDataFrame([], schemas.POLICY_STATE).drop("batch_id")
    inputs = {
        "empty": [],
        "two candidates": [
            ("group", "g", end, 79.0, 1.0, 790.0, 785.0, True, "enforce", "storm"),
            ("topic", "noisy", end, 400.0, 1.0, 3000.0, 3000.0, True, "enforce", "surge"),
        ],
    }
    for label, rows in inputs.items():
        cands = spark.createDataFrame(rows, CANDIDATE_SCHEMA)
        old_s = best(args.repeat, lambda: applyinpandas_decide(cands, state, end, cfg.limits, 60).collect())
        new_s = best(args.repeat, lambda: policy_fold.decide(cands, state, end, cfg.limits, 60).collect())
        print(f"policy fold, {label:>14}: applyInPandas {old_s:5.2f} s, driver-side {new_s:5.2f} s, "
              f"ratio {old_s / new_s:4.1f}x")
    spark.stop()
    shutil.rmtree(lake_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
