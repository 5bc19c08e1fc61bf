"""Cost of the stats-line parse alone: regex evaluations per line (from the optimized plan) and wall time on N
synthetic lines, for the parse of this checkout and, labelled, for the parse of a baseline commit.

    .venv/bin/python bench/parse_cost.py [--lines 2000000] [--repeat 2] [--baseline 74b4287]

The lines are generated inside Spark (``spark.range``): every stats line kind (SUM/TPS/AVGPT minute lines, TIMES/AVGRT,
``Value:``), topic/group/queue keys, 1 in 50 in a JSON envelope and 1 in 1,000 malformed. The measured work is
``parse_broker_stats`` followed by ``settled`` (as the ingest query runs it) written to Spark's ``noop`` sink, so every
column of every row is computed; the plan counts are the ``regexp_extract``/``regexp_replace``/``RLIKE``/``split``
expressions of that optimized plan (each is evaluated once per row that reaches it). The baseline runs in a subprocess
on ``git archive <commit> pipelines``, at the same time as the measure of this checkout, so that both use the same
lines and Spark settings and see the same load of a shared machine. Prints the best of
``--repeat`` timings after one warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
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


def measure(n: int, repeat: int) -> dict:
    """Regex node counts and the best wall time of the parse of ``n`` lines, with the ``pipelines`` on sys.path."""
    from pyspark.sql import functions as F

    from pipelines.config import load_config
    from pipelines.session import build_session
    from pipelines.transforms import parse

    cfg = load_config(str(REPO / "conf" / "local.toml"))
    spark = build_session(cfg.spark)
    spark.conf.set("spark.sql.debug.maxToStringFields", "100000")  # the whole plan, not "... 9 more fields"
    raw = synthetic_raw(spark, n).cache()
    raw.count()
    parsed = raw.transform(parse.parse_broker_stats(cfg.stats)).transform(parse.settled)
    plan = parsed._jdf.queryExecution().optimizedPlan().toString()
    counts = {name: len(re.findall(pattern, plan)) for name, pattern in REGEX_NODES.items()}
    counts = {k: v for k, v in counts.items() if v}
    rejected = parsed.where(F.col("reject_reason").isNotNull()).count()

    def run() -> None:
        parsed.write.format("noop").mode("overwrite").save()

    run()
    times = []
    for _ in range(repeat):
        started = time.monotonic()
        run()
        times.append(time.monotonic() - started)
    raw.unpersist()
    return {"lines": n, "seconds": min(times), "regex_nodes": counts, "rejected": rejected}


def baseline(commit: str, n: int, repeat: int, tmp: str) -> subprocess.Popen:
    """Start :func:`measure` on the ``pipelines`` package of ``commit`` (extracted into ``tmp``) in a subprocess."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit, "pipelines", "control"], check=True, capture_output=True
    ).stdout
    tar = Path(tmp) / "code.tar"
    tar.write_bytes(archive)
    with tarfile.open(tar) as t:
        t.extractall(tmp, filter="data")
    env = dict(os.environ, PYTHONPATH=tmp)
    return subprocess.Popen(
        [sys.executable, __file__, "--lines", str(n), "--repeat", str(repeat), "--json", "--code", tmp],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )


def show(label: str, result: dict) -> None:
    nodes = ", ".join(f"{k} {v}" for k, v in sorted(result["regex_nodes"].items()))
    print(f"{label:<28} {result['seconds']:7.2f} s  {result['lines'] / result['seconds']:>10,.0f} lines/s  "
          f"regex nodes in plan: {nodes}  (rejected {result['rejected']:,})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--baseline", default="", help="git commit whose parse is measured too (e.g. 74b4287)")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--code", default=str(REPO), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    sys.path.insert(0, args.code)
    if args.json:
        print(json.dumps(measure(args.lines, args.repeat)))
        return 0
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    with tempfile.TemporaryDirectory() as tmp:
        # Both at the same time, so that both see the same load of a shared machine (each gets about half of it).
        proc = baseline(args.baseline, args.lines, args.repeat, tmp) if args.baseline else None
        after = measure(args.lines, args.repeat)
        before = json.loads(proc.communicate()[0].strip().splitlines()[-1]) if proc else None
    print(f"parse of {args.lines:,} synthetic stats lines (parse_broker_stats + settled → noop sink), best of "
          f"{args.repeat}{', before and after run concurrently' if before else ''}")
    if before:
        show(f"before ({args.baseline})", before)
    show(f"after (working tree, {head.stdout.strip()})", after)
    if before:
        print(f"ratio before/after: {before['seconds'] / after['seconds']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
