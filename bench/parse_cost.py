"""Cost of the stats-line parse alone: regex evaluations per line (from the optimized plan) and wall time on N
synthetic lines, for the parse of this checkout and, labelled, for the parse of a baseline commit.

    .venv/bin/python bench/parse_cost.py [--lines 2000000] [--repeat 2] [--baseline 74b4287]

The lines are generated inside Spark (``spark.range``): every stats line kind (SUM/TPS/AVGPT minute lines, TIMES/AVGRT,
``Value:``), topic/group/queue keys, 1 in 50 in a JSON envelope and 1 in 1,000 malformed. The measured work is
``parse_broker_stats`` followed by ``settled`` (as the ingest query runs it) written to Spark's ``noop`` sink, so every
column of every row is computed; the plan counts are the ``regexp_extract``/``regexp_replace``/``RLIKE``/``split``
expressions of that optimized plan (each is evaluated once per row that reaches it). The baseline is the
``pipelines/dataplane/transforms/parse.py`` of ``--baseline`` imported as a module of its own (with that commit's own
``checks.py``, the check helpers it calls), run in the same Spark session on
the same cached lines, its runs interleaved with those of this checkout so that a shared machine's load falls on both. Prints the best of
``--repeat`` timings after one warm-up, and whether the two optimized plans are the same (:func:`_without_ids`).
With ``--baseline`` it exits 1 when this checkout's parse takes more than ``--max-slowdown`` times the baseline's.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: How the optimized plan prints each regex-evaluating expression (RegExpExtract, RegExpReplace, RLike, StringSplit).
REGEX_NODES = {"regexp_extract": r"regexp_extract\(", "regexp_replace": r"regexp_replace\(", "rlike": r"RLIKE",
               "split": r"\bsplit\("}


def synthetic_raw(spark, n: int):
    """RAW_RECORD rows of ``n`` broker_stats records (see the module docstring)."""
    from pyspark.sql import functions as F

    from pipelines import schemas

    i = F.col("id")
    kind = i % 10
    key = (
        F.when(kind < 5, F.format_string("topic-%d", i % 5000))
        .when(kind < 7, F.format_string("topic-%d@group-%d", i % 5000, i % 800))
        .when(kind < 8, F.format_string("topic-%d@%d", i % 5000, i % 4))
        .otherwise(F.format_string("%d@topic-%d@group-%d", i % 4, i % 5000, i % 800))
    )
    stat = (
        F.when(kind < 5, F.lit("TOPIC_PUT_NUMS"))
        .when(kind < 7, F.lit("GROUP_GET_NUMS"))
        .when(kind < 8, F.lit("QUEUE_PUT_NUMS"))
        .when(kind < 9, F.lit("GROUP_GET_LATENCY"))
        .otherwise(F.lit("GROUP_GET_FALL_SIZE"))
    )
    detail = (
        F.when(kind < 8, F.format_string("SUM: %d TPS: %.2f AVGPT: 1.00", i % 100000, (i % 100000) / 60.0))
        .when(kind < 9, F.format_string("TIMES: %d AVGRT: 3.50", i % 1000))
        .otherwise(F.format_string("Value: %d", i % 4096))
    )
    period = F.when(kind < 9, F.lit("In One Minute")).otherwise(F.lit("Every 5 Minutes"))
    stamp = F.format_string("2026-11-22 %02d:%02d:00", (i / 60000).cast("int") % 24, (i / 1000).cast("int") % 60)
    line = F.format_string("%s INFO - [%s] [%s] Stats %s, %s", stamp, stat, key, period, detail)
    line = F.when(i % 1000 == 999, F.substring(line, 1, 60)).otherwise(line)  # cut: quarantined
    raw = F.when(
        i % 50 == 7, F.format_string('{"broker": "broker-e", "cluster": "C1", "line": "%s"}', line)
    ).otherwise(line)
    rows = spark.range(n).select(
        F.lit("broker_stats").alias("source"),
        raw.alias("raw"),
        F.encode(raw, "UTF-8").alias("raw_bytes"),
        F.format_string("file:///landing/broker_stats/broker-%d/stats.log", i % 8).alias("origin"),
        F.format_string("broker-%d", i % 8).alias("broker_hint"),
        F.lit("2026-11-22 12:00:00").cast("timestamp").alias("ingested_at"),
    )
    return rows.select(*[F.col(f.name).cast(f.dataType).alias(f.name) for f in schemas.RAW_RECORD.fields])


#: The modules of the baseline that are imported from the baseline itself, not from this checkout: the parse and the
#: check helpers it calls (whose signatures may have changed since).
TRANSFORMS = "pipelines/dataplane/transforms"
BASELINE_OWN = ("checks",)


def _module_at(commit: str, tmp: str, name: str, source: str):
    path = Path(tmp) / f"{name}_{commit}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"{name}_{commit}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def parse_module_at(commit: str, tmp: str):
    """``pipelines/dataplane/transforms/parse.py`` of ``commit`` imported as a module of its own, with that commit's
    modules of :data:`BASELINE_OWN` where it has them; the other modules it imports come from this checkout."""
    def show(name: str) -> str | None:
        done = subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:{TRANSFORMS}/{name}.py"],
                              capture_output=True, text=True)
        return done.stdout if done.returncode == 0 else None

    source = show("parse")
    if source is None:
        raise SystemExit(f"parse_cost: {commit} has no {TRANSFORMS}/parse.py")
    for name in BASELINE_OWN:
        own = show(name)
        if own is not None:
            _module_at(commit, tmp, name, own)
            source = source.replace(f"{TRANSFORMS.replace('/', '.')}.{name} import", f"{name}_{commit} import")
    return _module_at(commit, tmp, "parse", source)


def _without_ids(plan: str) -> str:
    """An optimized plan's text without what differs between two builds of the same plan: expression ids (``#12``)
    and the numbers of common subexpressions (``_common_expr_3``, a counter of the session)."""
    return re.sub(r"_common_expr_\d+", "_common_expr_", re.sub(r"#\d+L?", "#", plan))


def measure(n: int, repeat: int, modules: dict) -> dict[str, dict]:
    """Regex expression counts and the best wall time of the parse of ``n`` lines by each parse module, the runs of
    the modules interleaved (before, after, before, after, ...) so that a shared machine's load falls on both."""
    from pyspark.sql import functions as F

    from pipelines.config import load_config
    from pipelines.dataplane.session import build_session

    cfg = load_config(str(REPO / "conf" / "local.toml"))
    spark = build_session(cfg.spark)
    spark.conf.set("spark.sql.debug.maxToStringFields", "100000")  # the whole plan, not "... 9 more fields"
    raw = synthetic_raw(spark, n).cache()
    raw.count()
    results, parsed = {}, {}
    for label, module in modules.items():
        parsed[label] = raw.transform(module.parse_broker_stats(cfg.stats)).transform(module.settled)
        plan = parsed[label]._jdf.queryExecution().optimizedPlan().toString()
        counts = {name: len(re.findall(pattern, plan)) for name, pattern in REGEX_NODES.items()}
        rejected = parsed[label].where(F.col("reject_reason").isNotNull()).count()
        results[label] = {"lines": n, "times": [], "regex_nodes": {k: v for k, v in counts.items() if v},
                          "rejected": rejected, "plan": _without_ids(plan)}
    for round_ in range(repeat + 1):  # round 0 warms up
        for label in modules:
            started = time.monotonic()
            parsed[label].write.format("noop").mode("overwrite").save()
            if round_:
                results[label]["times"].append(time.monotonic() - started)
    raw.unpersist()
    for result in results.values():
        result["seconds"] = min(result["times"])
    return results


def show(label: str, result: dict) -> None:
    nodes = ", ".join(f"{k} {v}" for k, v in sorted(result["regex_nodes"].items()))
    print(f"{label:<28} {result['seconds']:7.2f} s  {result['lines'] / result['seconds']:>10,.0f} lines/s  "
          f"regex nodes in plan: {nodes}  (rejected {result['rejected']:,})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--baseline", default="", help="git commit whose parse is measured too (e.g. 74b4287)")
    ap.add_argument("--max-slowdown", type=float, default=1.10,
                    help="with --baseline: exit 1 when this checkout's best time exceeds the baseline's times this")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from pipelines.dataplane.transforms import parse

    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    with tempfile.TemporaryDirectory() as tmp:
        modules = {f"before ({args.baseline})": parse_module_at(args.baseline, tmp)} if args.baseline else {}
        modules[f"after (working tree, {head.stdout.strip()})"] = parse
        results = measure(args.lines, args.repeat, modules)
    print(f"parse of {args.lines:,} synthetic stats lines (parse_broker_stats + settled → noop sink), best of "
          f"{args.repeat}, runs interleaved")
    for label, result in results.items():
        show(label, result)
    if args.baseline:
        before, after = results.values()
        same = "the same" if before["plan"] == after["plan"] else "different"
        print(f"optimized plans (ids aside): {same}")
        ratio = before["seconds"] / after["seconds"]
        print(f"ratio before/after: {ratio:.2f}x (check: after at most {args.max_slowdown:.2f}x before)")
        if after["seconds"] > args.max_slowdown * before["seconds"]:
            print(f"parse_cost: this checkout's parse is {1 / ratio:.2f}x the baseline's, over --max-slowdown "
                  f"{args.max_slowdown:.2f}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
