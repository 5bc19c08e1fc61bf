"""Latency of the continuous governor: a writer lands the article-001 retry storm minute by minute while the
governor runs with the shipped config (``conf/local.toml``: its trigger, watermark and fast path); measures each
micro-batch's processing time against the trigger interval and the wall time from the first storm line landing to
the culprit's limit appearing in ``limits.json`` (with the basis of that limit).

    .venv/bin/python bench/latency.py [--minute-seconds 20] [--trigger-seconds N] [--fast-path never] [--timeline]

Time-lapse: one minute of stats.log lines (RocketMQ prints them once a minute, at the end of the minute they
cover) lands every ``--minute-seconds`` of wall time. The fast path acts on the open window of the first storm
minute, so the expected time is the trigger wait plus one fast micro-batch (target: <= 30 s at a 10 s trigger).
With ``--fast-path never`` (the final path only) the limit waits for the watermark: (window + line lag +
watermark) of event time, converted to wall time, plus two triggers.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipelines import governor  # noqa: E402
from pipelines.sim.spec import ScenarioSpec  # noqa: E402
from pipelines.config import load_config  # noqa: E402
from pipelines.session import build_session  # noqa: E402
from pipelines.sim.minutes import land, minute_files  # noqa: E402

CULPRIT = "get-pugc-to-ai-consumer"
LINE_LAG_SECONDS = 60  # a minute line is printed at the end of the minute it covers (pipelines/transforms/tps.py)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minute-seconds", type=float, default=20.0)
    parser.add_argument("--trigger-seconds", type=int, default=None, help="default: the shipped config's")
    parser.add_argument("--fast-path", choices=("continuous", "always", "never"), default=None,
                        help="default: the shipped config's")
    parser.add_argument("--steady-minutes", type=int, default=6)
    parser.add_argument("--storm-minutes", type=int, default=6)
    parser.add_argument("--timeline", action="store_true",
                        help="also print every micro-batch: start relative to the first storm line, duration, rows")
    args = parser.parse_args(argv)

    minutes = args.steady_minutes + args.storm_minutes
    start = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=minutes + 5)).replace(second=0, microsecond=0)
    spec = ScenarioSpec(seed=7, start=start, minutes=minutes, brokers=2, topics=8, groups=4,
                        onset_minute=args.steady_minutes)
    per_minute = minute_files(spec)
    work = Path(tempfile.mkdtemp(prefix="rg-latency-"))
    landing, lake = work / "landing", work / "lake"
    for name in ("broker_stats", "send_failures"):
        (landing / name).mkdir(parents=True)
    os.environ.setdefault("RATE_GOVERNOR_SIGNING_KEY", "bench-key")
    base = load_config(Path(__file__).resolve().parent.parent / "conf" / "local.toml")
    windows = {"trigger_seconds": args.trigger_seconds, "fast_path": args.fast_path}
    cfg = base.model_copy(update={"windows": base.windows.model_copy(
        update={k: v for k, v in windows.items() if v is not None})})
    args.trigger_seconds = cfg.windows.trigger_seconds
    cfg = cfg.with_paths(str(landing), str(lake))
    spark = build_session(cfg.spark)
    runner = threading.Thread(target=lambda: governor.run(spark, cfg, once=False), daemon=True)
    runner.start()
    time.sleep(3)

    limits_file = lake / "control" / "limits.json"
    storm_landed = limit_seen = basis = None
    for m, files in enumerate(per_minute):
        land(landing, files)
        # minute m's files hold the lines printed at the end of minute m - 1: the first storm minute lands next
        if m == args.steady_minutes + 1 and storm_landed is None:
            storm_landed, storm_landed_epoch = time.monotonic(), time.time()
        deadline = time.monotonic() + args.minute_seconds
        while time.monotonic() < deadline:
            if storm_landed and limit_seen is None and limits_file.exists():
                records = json.loads(limits_file.read_text())["records"]
                found = [r for r in records if r["resource"] == CULPRIT]
                if found:
                    limit_seen, basis = time.monotonic(), found[0]["reason"].split("]")[0].lstrip("[")
            time.sleep(0.2)
    wait_until = time.monotonic() + 6 * args.minute_seconds
    while limit_seen is None and time.monotonic() < wait_until:
        found = [r for r in json.loads(limits_file.read_text())["records"] if r["resource"] == CULPRIT] \
            if limits_file.exists() else []
        if found:
            limit_seen, basis = time.monotonic(), found[0]["reason"].split("]")[0].lstrip("[")
        time.sleep(0.2)

    progress = {q.name: [p for p in q.recentProgress if p.get("numInputRows", 0) or p["batchId"] > 0] for q in spark.streams.active}
    for q in spark.streams.active:
        q.stop()
    print(f"trigger interval {args.trigger_seconds} s, watermark {cfg.windows.watermark_seconds} s, fast path "
          f"{cfg.windows.fast_path}; one stats minute lands every {args.minute_seconds} s (this machine: "
          f"{os.cpu_count()} cores)")
    for name, batches in progress.items():
        durations = [p["durationMs"].get("triggerExecution", 0) / 1000 for p in batches]
        over = sum(d > args.trigger_seconds for d in durations)
        if durations:
            print(f"{name}: {len(durations)} micro-batches, processing time median {sorted(durations)[len(durations) // 2]:.1f} s, "
                  f"max {max(durations):.1f} s, {over} over the trigger interval")
    if args.timeline and storm_landed:
        for name, batches in progress.items():
            for p in batches:
                begun = dt.datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
                print(f"  {name} batch {p['batchId']}: starts {begun - storm_landed_epoch:+7.1f} s after the storm "
                      f"landed, takes {p['durationMs'].get('triggerExecution', 0) / 1000:5.1f} s, "
                      f"{p.get('numInputRows', 0)} input rows")
    speed = 60.0 / args.minute_seconds
    watermark_wait = (cfg.windows.length_seconds + LINE_LAG_SECONDS + cfg.windows.watermark_seconds) / speed
    final_only = 2 * args.trigger_seconds + watermark_wait
    if storm_landed and limit_seen:
        print(f"first storm line landed -> limit in limits.json: {limit_seen - storm_landed:.1f} s, basis {basis} "
              f"(fast path target <= 30 s; the final path alone would need ~{final_only:.0f} s = 2 triggers + "
              f"window/line-lag/watermark wait {watermark_wait:.1f} s)")
    else:
        print("no limit for the culprit appeared in limits.json")
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
