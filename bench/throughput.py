"""Throughput of the full governor against what any design must at least do, measured in one run on the same files.

    .venv/bin/python bench/throughput.py --events 2000000 [--stats-share 0.2] [--minutes 60] [--keep DIR]
                                         [--min-ratio 0.7] [--baseline COMMIT [--runs 3] [--log FILE]]

1. Generates a landing directory of ``--events`` records: stats.log lines and send-failure JSON lines in the ratio
   1:4 (``--stats-share 0.2``), spread over ``--minutes`` minutes of event time, 4 brokers, 500 topics.
2. (a) floor: Spark reads the same files, parses them (regex for stats lines, from_json for failures), counts per
   1-minute event-time window with a watermark, and writes to the no-op sink (trigger availableNow).
3. (b) a persist floor: the governor's own parse and quality gate, bronze and silver written as plain Parquet by
   Spark's executors (what any design must at least do; no Delta log, GX, gold or limits).
4. (c) the full governor with ``--once`` (bronze, silver, quarantine, gold, anomalies, limits, limits.json).
Prints events/s of each. The figure of merit is governor ÷ persist floor: the persist floor parses and persists the
same records, so the ratio is the share of the work that is the governor's own overhead (Delta, quality gate, gold,
decisions). The bare floor (a) persists nothing and is printed for reference only, not as a target. All run in the
same Spark session, the floors first: they pay the JVM's warm-up, which if anything flatters the governor's ratio.
The check fails (exit 1) when the ratio is below ``--min-ratio`` (default 0.7, issue 25's target).

``--baseline COMMIT``: the landing is generated once, then this tree and COMMIT (a worktree under a temporary
directory, ``bench/ab.py``: this script run with that tree first on ``sys.path`` and its own ``conf/local.toml``) run
the three measurements ``--runs`` times each, interleaved, as separate processes on that landing; prints each run's
seconds and ratio, and the medians per tree (the check: this tree's median ratio against ``--min-ratio``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ab  # noqa: E402  (bench/ab.py: --baseline, --tree)

TREE = ab.tree_from_argv()  # the tree measured: this checkout, or a baseline's worktree (--tree)
sys.path.insert(0, str(TREE))
import old_layout  # noqa: E402,F401 - a baseline tree may have the module paths before issue 43

from pipelines import governor
from pipelines.config import load_config
from pipelines.dataplane.session import build_session

BROKERS = ("broker-a", "broker-b", "broker-c", "broker-d")
TOPICS = 500
GMT8 = dt.timedelta(hours=8)


def generate(root: Path, events: int, stats_share: float, minutes: int, seed: int = 1) -> dict[str, int]:
    """Write the landing directory; returns the number of stats lines and failure lines."""
    rng = np.random.default_rng(seed)
    start = dt.datetime(2026, 11, 22, 0, 0, tzinfo=dt.timezone.utc)
    n_stats = int(events * stats_share)
    n_fail = events - n_stats
    per_broker = np.array_split(np.arange(n_stats), len(BROKERS))
    for broker, idx in zip(BROKERS, per_broker):
        minute = np.sort(rng.integers(1, minutes + 1, idx.size))
        topic = rng.integers(0, TOPICS, idx.size)
        total = rng.integers(0, 60_000, idx.size)
        stamps = {m: (start + dt.timedelta(minutes=int(m)) + GMT8).strftime("%Y-%m-%d %H:%M:%S") for m in np.unique(minute)}
        folder = root / "broker_stats" / broker
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "stats.log", "w") as out:
            out.writelines(
                f"{stamps[m]} INFO - [TOPIC_PUT_NUMS] [topic-{t}] Stats In One Minute, SUM: {s} TPS: {s / 60:.2f} AVGPT: 1.00\n"
                for m, t, s in zip(minute, topic, total)
            )
    start_ms = int(start.timestamp() * 1000)
    ts = np.sort(rng.integers(start_ms, start_ms + minutes * 60_000, n_fail))
    topic = rng.integers(0, TOPICS, n_fail)
    broker = rng.integers(0, len(BROKERS), n_fail)
    folder = root / "send_failures"
    folder.mkdir(parents=True, exist_ok=True)
    message = "CODE: 2  DESC: [TIMEOUT_CLEAN_QUEUE]broker busy, start flow control for a while, period in queue: 205ms, size of queue: 17"
    with open(folder / "failures.jsonl", "w") as out:
        out.writelines(
            json.dumps({"ts": int(t), "topic": f"topic-{p}", "broker": BROKERS[b], "code": None, "message": message,
                        "latency_ms": 3.0}) + "\n"
            for t, p, b in zip(ts, topic, broker)
        )
    return {"stats_lines": n_stats, "failure_lines": n_fail}


def floor_run(spark, landing: Path, checkpoint: Path) -> float:
    """Read, parse, one windowed count, no-op sink; returns seconds."""
    from pyspark.sql import functions as F

    from pipelines import schemas

    stats = spark.readStream.format("text").option("recursiveFileLookup", "true").load(str(landing / "broker_stats"))
    stats_parsed = stats.select(
        F.to_utc_timestamp(F.try_to_timestamp(F.substring("value", 1, 19), F.lit("yyyy-MM-dd HH:mm:ss")), "GMT+8").alias("t"),
        F.regexp_extract("value", r"\[([^\]]*)\] \[([^\]]*)\] Stats In One Minute, SUM: (\d+)", 2).alias("key"),
    )
    failures = spark.readStream.format("text").load(str(landing / "send_failures"))
    fail_parsed = failures.select(F.from_json("value", schemas.SEND_FAILURE_JSON).alias("j")).select(
        F.timestamp_millis(F.col("j.ts").try_cast("long")).alias("t"), F.col("j.topic").alias("key")
    )
    counted = (
        stats_parsed.unionByName(fail_parsed)
        .withWatermark("t", "2 minutes")
        .groupBy(F.window("t", "1 minute"))
        .count()
    )
    started = time.monotonic()
    query = (
        counted.writeStream.format("noop").outputMode("append").trigger(availableNow=True)
        .option("checkpointLocation", str(checkpoint)).start()
    )
    query.awaitTermination()
    return time.monotonic() - started


def persist_floor_run(spark, cfg, work: Path) -> float:
    """What the governor must do at the least, with Spark's own writers: read, the governor's parse and quality
    gate (the same code), bronze and silver written as plain Parquet by the executors (no Delta log, no GX, no
    gold); returns seconds."""
    from pyspark.sql import functions as F

    from pipelines.dataplane.transforms import parse, parse_failures
    from pipelines.dataplane import sources

    gov = governor.build_governor(spark, cfg.with_paths(None, str(work / "persist-floor-lake")))
    out = work / "persist-floor"

    def batch(raw, batch_id: int) -> None:
        raw = raw.persist()
        for name in sources.INPUTS:
            raw.where(F.col("source") == name).write.mode("append").parquet(str(out / "bronze" / name))
        stats, failures = gov.ingest.parse(raw)
        stats.transform(parse.silver_broker_stats).write.mode("append").parquet(
            str(out / "silver" / "broker_stats"))
        failures.transform(parse_failures.silver_send_failures).write.mode("append").parquet(
            str(out / "silver" / "send_failures"))
        raw.unpersist()

    started = time.monotonic()
    query = (
        sources.raw_records(spark, cfg).writeStream.foreachBatch(batch).trigger(availableNow=True)
        .option("checkpointLocation", str(work / "persist-floor-checkpoint")).start()
    )
    query.awaitTermination()
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--stats-share", type=float, default=0.2, help="share of stats lines (1:4 → 0.2)")
    parser.add_argument("--minutes", type=int, default=60)
    parser.add_argument("--keep", help="work directory to keep (default: a temporary one, removed)")
    parser.add_argument("--min-ratio", type=float, default=0.7,
                        help="the lowest governor ÷ persist floor that passes the check")
    parser.add_argument("--baseline", metavar="COMMIT", help="A/B against COMMIT (module docstring)")
    parser.add_argument("--runs", type=int, default=3, help="runs per tree with --baseline (default 3)")
    parser.add_argument("--log", help="with --baseline: the single runs' output appended to this file")
    parser.add_argument("--tree", help=argparse.SUPPRESS)  # the tree measured (bench/ab.py), read before imports
    parser.add_argument("--json", help=argparse.SUPPRESS)  # write the figures here (bench/ab.py)
    args = parser.parse_args(argv)
    if args.baseline:
        return compare(args, sys.argv[1:] if argv is None else list(argv))

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="rg-bench-"))
    landing = work / "landing"
    shutil.rmtree(work / "lake", ignore_errors=True)
    for name in ("floor-checkpoint", "persist-floor", "persist-floor-checkpoint", "persist-floor-lake"):
        shutil.rmtree(work / name, ignore_errors=True)
    t0 = time.monotonic()
    if not landing.exists():
        counts = generate(landing, args.events, args.stats_share, args.minutes)
        print(f"generated {args.events} events ({counts['stats_lines']} stats lines, {counts['failure_lines']} send "
              f"failures) in {time.monotonic() - t0:.1f} s into {landing}")
    os.environ.setdefault("RATE_GOVERNOR_SIGNING_KEY", "bench-key")
    conf = TREE / "conf" / "local.toml"
    cfg = load_config(conf).with_paths(
        str(landing), str(work / "lake"))
    spark = build_session(cfg.spark)

    floor_s = floor_run(spark, landing, work / "floor-checkpoint")
    persist_s = persist_floor_run(spark, cfg, work)
    started = time.monotonic()
    governor.run(spark, cfg, once=True)
    governor_s = time.monotonic() - started

    floor_rate, gov_rate = args.events / floor_s, args.events / governor_s
    print(f"bare floor (read, parse, 1 windowed count, noop):     {floor_s:8.1f} s  {floor_rate:10.0f} events/s")
    persist_rate = args.events / persist_s
    print(f"persist floor (full parse, bronze+silver Parquet):    {persist_s:8.1f} s  {persist_rate:10.0f} events/s")
    print(f"governor (--once, all tables, limits.json):           {governor_s:8.1f} s  {gov_rate:10.0f} events/s")
    ratio = gov_rate / persist_rate
    passed = ratio >= args.min_ratio
    print(f"figure of merit, governor / persist floor: {ratio:.2f}; check >= {args.min_ratio}: "
          f"{'PASS' if passed else 'FAIL'} ({args.events} events, stats share {args.stats_share}, "
          f"{args.minutes} minutes, config {conf}, {os.cpu_count()} cores)")
    print(f"for reference: governor / bare floor {gov_rate / floor_rate:.2f}, persist floor / bare floor "
          f"{persist_rate / floor_rate:.2f}")
    ab.write_json(args.json, {"floor": floor_s, "persist": persist_s, "governor": governor_s, "ratio": ratio,
                              "tree": str(TREE)})
    spark.stop()
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if passed else 1


def compare(args, argv: list[str]) -> int:
    """``--baseline COMMIT`` (module docstring)."""
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="rg-bench-ab-"))
    if not (work / "landing").exists():
        started = time.monotonic()
        counts = generate(work / "landing", args.events, args.stats_share, args.minutes)
        print(f"generated {args.events} events ({counts['stats_lines']} stats lines, {counts['failure_lines']} send "
              f"failures) once, in {time.monotonic() - started:.1f} s", flush=True)
    runs_args = ab.without(ab.without(ab.without(argv, "--baseline"), "--runs"), "--log")
    runs_args = [*ab.without(runs_args, "--keep"), "--keep", str(work)]
    try:
        results = ab.against_baseline(Path(__file__).resolve(), args.baseline, runs_args, args.runs,
                                      Path(args.log) if args.log else None)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    for label, runs in results.items():
        shown = "; ".join(f"floor {r['floor']:.1f} s, persist floor {r['persist']:.1f} s, governor "
                          f"{r['governor']:.1f} s: {r['ratio']:.2f}" if "ratio" in r else f"failed (exit {r['exit']})"
                          for r in runs)
        print(f"{label}: {shown}")
        print(f"   medians: persist floor {ab.median(runs, 'persist') or float('nan'):.1f} s, governor "
              f"{ab.median(runs, 'governor') or float('nan'):.1f} s, governor / persist floor "
              f"{ab.median(runs, 'ratio') or float('nan'):.2f}")
    new = ab.median(results["this tree"], "ratio")
    base = ab.median(results[f"baseline {args.baseline}"], "ratio")
    if new is None or base is None:
        print("a variant reported no figure: see the runs' output", file=sys.stderr)
        return 2
    passed = new >= args.min_ratio
    print(f"governor / persist floor, medians: this tree {new:.2f}, baseline {args.baseline} {base:.2f} "
          f"({new / base:.2f}x); target >= {args.min_ratio}: {'PASS' if passed else 'FAIL'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
