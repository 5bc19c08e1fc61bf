"""Fixed costs of a small micro-batch, each against the design it replaced, measured in one run.

    .venv/bin/python bench/micro_batch_costs.py [--rows 200 20000] [--repeat 3] [--baseline COMMIT]

1. GX validation of the candidate silver rows of N stats lines (the governor's own parse and quality gate):
   GX's Spark engine (the baseline) against its pandas engine (what ``validation.Validator`` picks up to
   ``quality.pandas_max_rows`` rows). Also checks both report the same unexpected counts.
2. With ``--baseline COMMIT`` (a commit before issue 40, e.g. ``ecd9528``): the policy fold of an empty micro-batch
   and of one with two candidates, the baseline's Spark decision path (``pipelines.dataplane.transforms.policy_fold.decide``
   on candidate and state DataFrames, collected: what the gold and fast handlers ran per micro-batch; and its
   ``applyInPandas`` variant, the design before session 3) in a worktree of COMMIT, run by this interpreter with
   that tree first on ``sys.path`` and its own Spark session after this run's has stopped, against this tree's
   :mod:`pipelines.decide` on the same candidates: :func:`pipelines.decide.paths.fold_all.fold_all`, then
   :func:`pipelines.decide.records.limit_rows.finish` and :func:`~pipelines.decide.records.limit_rows.check` (the fold and the ``gold/limits``
   rows, what ``decide_final`` runs under the decision lock), no Spark. The two sides take the same candidates in
   their own types (a Spark DataFrame of the baseline's candidate schema; :class:`~pipelines.decide.rules.candidates.Keyed`
   candidates). Without ``--baseline`` this part is skipped: since issue 40 the tree has no Spark decision path to
   compare with, and the fold's own cost is ``bench/decisions.py``'s.
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
from pipelines.dataplane.transforms import parse  # noqa: E402
from pipelines import tables  # noqa: E402
from pipelines.dataplane.quality import rules, validation  # noqa: E402
from pipelines.config import load_config  # noqa: E402
from pipelines.dataplane.session import build_session  # noqa: E402

INGESTED = dt.datetime(2026, 11, 22, 0, 0)


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


#: The baseline's fold on its own tree (run as a file: Spark's Python workers re-import ``__main__``): argv = tree,
#: repeat; prints JSON {label: [applyInPandas s, Spark path s]}.
BASELINE_FOLD = r"""
import datetime as dt, json, os, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
import old_layout  # a baseline tree may have the module paths before issue 43
from pipelines import schemas
from pipelines.config import load_config
from pipelines.dataplane.session import build_session
from pipelines.dataplane.transforms import policy_fold

CANDIDATE_SCHEMA = (
    "resource_type string, resource string, window_end timestamp, target_qps double, floor_qps double, "
    "lift_at_qps double, observed_tps double, critical boolean, mode string, reason string")
repeat = int(sys.argv[2])
cfg = load_config(sys.argv[1] + "/conf/local.toml")
spark = build_session(cfg.spark)

def best(action):
    action()
    times = []
    for _ in range(repeat):
        started = time.monotonic()
        action()
        times.append(time.monotonic() - started)
    return min(times)

def applyinpandas_decide(candidates, state, horizon_end, cfg, window_seconds):
    rows = policy_fold.fold_input(candidates, state)
    return rows.groupBy("resource_type", "resource").applyInPandas(
        lambda pdf: policy_fold._fold_group(pdf, horizon_end, cfg, window_seconds), schema=schemas.POLICY_FOLD)

end = dt.datetime(2026, 11, 22, 10, 1)
state = spark.createDataFrame([], schemas.POLICY_STATE).drop("batch_id")
inputs = json.loads(os.environ["RG_FOLD_INPUTS"])
out = {}
for label, rows in inputs.items():
    rows = [(r[0], r[1], dt.datetime.fromisoformat(r[2]), *r[3:]) for r in rows]
    cands = spark.createDataFrame(rows, CANDIDATE_SCHEMA)
    out[label] = [best(lambda: applyinpandas_decide(cands, state, end, cfg.limits, 60).collect()),
                  best(lambda: policy_fold.decide(cands, state, end, cfg.limits, 60).collect())]
spark.stop()
print("RESULT " + json.dumps(out))
"""
END = dt.datetime(2026, 11, 22, 10, 1)
#: The fold's inputs, as the baseline's candidate rows (resource_type, resource, window_end, target_qps, floor_qps,
#: lift_at_qps, observed_tps, critical, mode, reason).
FOLD_INPUTS = {
    "empty": [],
    "two candidates": [
        ("group", "g", END.isoformat(), 79.0, 1.0, 790.0, 785.0, True, "enforce", "storm"),
        ("topic", "noisy", END.isoformat(), 400.0, 1.0, 3000.0, 3000.0, True, "enforce", "surge"),
    ],
}


def driver_fold(rows: list[tuple], cfg) -> list[dict]:
    """This tree's fold of the same candidates on the driver, and its ``gold/limits`` rows (no Spark)."""
    from pipelines.decide.rules.candidates import Keyed
    from pipelines.decide.records.resource import Candidate
    from pipelines.decide.words import Basis
    from pipelines.decide.paths.fold_all import fold_all
    from pipelines.decide.records.limit_rows import check, finish

    keyed = [Keyed(r[0], r[1], Candidate(window_end=dt.datetime.fromisoformat(r[2]), target_qps=r[3], floor_qps=r[4],
                                         lift_at_qps=r[5], observed_tps=r[6], critical=r[7], mode=r[8], reason=r[9]))
             for r in rows]
    now = dt.datetime(2026, 11, 22, 10, 5, tzinfo=dt.timezone.utc)
    folded = fold_all(keyed, {}, END.replace(tzinfo=dt.timezone.utc), cfg.limits, 60)
    return check(finish(folded.decisions, cfg.limits, now, Basis.FINAL), "bench:0", now)[0]


def baseline_fold(commit: str, repeat: int) -> dict[str, list[float]]:
    """The baseline's fold timings (:data:`BASELINE_FOLD`) in a worktree of ``commit``."""
    import json
    import subprocess

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import ab

    with ab.worktree(commit) as tree:
        script = tree / ".micro_batch_costs_fold.py"
        script.write_text(BASELINE_FOLD)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(Path(__file__).resolve().parent)]), "RG_FOLD_INPUTS": json.dumps(FOLD_INPUTS)}
        done = subprocess.run([sys.executable, str(script), str(tree), str(repeat)], cwd=tree, env=env,
                              capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"the baseline's fold failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[200, 20000], help="stats lines per micro-batch")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline", metavar="COMMIT",
                        help="a commit before issue 40 whose Spark decision path the fold is compared with")
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

    spark.stop()
    shutil.rmtree(lake_dir, ignore_errors=True)
    if args.baseline:
        old = baseline_fold(args.baseline, args.repeat)  # its own Spark session, after this one stopped
        for label, rows in FOLD_INPUTS.items():
            new_s = best(args.repeat, lambda: driver_fold(rows, cfg))
            udf_s, spark_s = old[label]
            print(f"policy fold, {label:>14}: {args.baseline} applyInPandas {udf_s:5.2f} s, {args.baseline} Spark "
                  f"decision path {spark_s:5.2f} s, pipelines.decide {new_s * 1000:7.2f} ms; ratio Spark path / "
                  f"pipelines.decide {spark_s / new_s:,.0f}x ({len(driver_fold(rows, cfg))} gold/limits rows)")
    else:
        print("policy fold: skipped (no --baseline: this tree's decisions have no Spark path; bench/decisions.py "
              "times pipelines.decide at scale)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
