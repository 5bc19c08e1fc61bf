"""Latency of the continuous governor: a writer lands the article-001 retry storm minute by minute while the
governor runs with a processing-time trigger; measures each micro-batch's processing time against the trigger
interval and the time from the first storm line landing to the limit appearing in limits.json.

    .venv/bin/python bench/latency.py [--minute-seconds 10] [--trigger-seconds 5] [--steady-minutes 6] [--storm-minutes 6]

Time-lapse: one minute of stats.log lines (RocketMQ prints them once a minute) lands every ``--minute-seconds`` of
wall time, so event time runs 60 / minute-seconds times faster than the wall clock. The expected wait is then
(window + line lag + watermark) in event time, converted to wall time, plus processing; the target is below
2 trigger intervals + that watermark wait.
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
from pipelines.sim.failures import build_send_failures  # noqa: E402
from pipelines.sim.render import render_stats_lines  # noqa: E402
from pipelines.sim.spec import ScenarioSpec  # noqa: E402
from pipelines.sim.traffic import build_traffic  # noqa: E402
from pipelines.config import load_config  # noqa: E402
from pipelines.session import build_session  # noqa: E402

CULPRIT = "get-pugc-to-ai-consumer"
LINE_LAG_SECONDS = 60  # a minute line is printed at the end of the minute it covers (pipelines/tps.py)


def minute_files(spec: ScenarioSpec) -> list[list[tuple[str, str]]]:
    """Per simulated minute: (relative path, text) of the files that land at that minute."""
    traffic = build_traffic(spec)
    lines = render_stats_lines(spec, traffic)
    failures = build_send_failures(spec, traffic)
    per_minute: dict[int, list[tuple[str, str]]] = {}
    for broker, group in lines.groupby("broker", observed=True):
        stamps = group["line"].str.slice(0, 16)
        for stamp, block in group.groupby(stamps):
            local = dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M").replace(tzinfo=dt.timezone.utc) - dt.timedelta(hours=8)
            m = int((local - spec.start_utc).total_seconds() // 60)
            per_minute.setdefault(m, []).append((f"broker_stats/{broker}/m{m:04d}.log", "\n".join(block["line"]) + "\n"))
    fields = ["ts", "topic", "broker", "producer_group", "client", "code", "message", "latency_ms"]
    failures = failures.assign(minute=((failures["event_time"] - spec.start_utc).dt.total_seconds() // 60).astype(int))
    for m, block in failures.groupby("minute"):
        text = "".join(json.dumps({k: (None if v != v else v) for k, v in row.items()}) + "\n"
                       for row in block[fields].to_dict("records"))
        per_minute.setdefault(int(m) + 1, []).append((f"send_failures/m{m:04d}.jsonl", text))
    return [per_minute.get(m, []) for m in range(max(per_minute) + 1)]


def land(root: Path, files: list[tuple[str, str]]) -> None:
    for rel, text in files:
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        hidden = target.with_name("." + target.name)  # Spark's file source ignores dot files
        hidden.write_text(text)
        os.replace(hidden, target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minute-seconds", type=float, default=10.0)
    parser.add_argument("--trigger-seconds", type=int, default=5)
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
    cfg = base.model_copy(update={"windows": base.windows.model_copy(update={"trigger_seconds": args.trigger_seconds})})
    cfg = cfg.with_paths(str(landing), str(lake))
    spark = build_session(cfg.spark)
    runner = threading.Thread(target=lambda: governor.run(spark, cfg, once=False), daemon=True)
    runner.start()
    time.sleep(3)

    limits_file = lake / "control" / "limits.json"
    storm_landed = limit_seen = None
    for m, files in enumerate(per_minute):
        land(landing, files)
        if m == args.steady_minutes and storm_landed is None:
            storm_landed, storm_landed_epoch = time.monotonic(), time.time()
        deadline = time.monotonic() + args.minute_seconds
        while time.monotonic() < deadline:
            if storm_landed and limit_seen is None and limits_file.exists():
                records = json.loads(limits_file.read_text())["records"]
                if any(r["resource"] == CULPRIT for r in records):
                    limit_seen = time.monotonic()
            time.sleep(0.2)
    wait_until = time.monotonic() + 6 * args.minute_seconds
    while limit_seen is None and time.monotonic() < wait_until:
        if limits_file.exists() and any(r["resource"] == CULPRIT for r in json.loads(limits_file.read_text())["records"]):
            limit_seen = time.monotonic()
        time.sleep(0.2)

    progress = {q.name: [p for p in q.recentProgress if p.get("numInputRows", 0) or p["batchId"] > 0] for q in spark.streams.active}
    for q in spark.streams.active:
        q.stop()
    print(f"trigger interval {args.trigger_seconds} s; one stats minute lands every {args.minute_seconds} s")
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
    target = 2 * args.trigger_seconds + watermark_wait
    if storm_landed and limit_seen:
        print(f"first storm line landed -> limit in limits.json: {limit_seen - storm_landed:.1f} s "
              f"(target < {target:.1f} s = 2 triggers + window/line-lag/watermark wait {watermark_wait:.1f} s)")
    else:
        print("no limit for the culprit appeared in limits.json")
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
