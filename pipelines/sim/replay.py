"""``python -m pipelines.sim.replay``: what the governor would have done on an operator's own recording, in closed
loop: the step before ``limits.mode = "enforce"`` (docs/operators.md §3).

Usage::

    python -m pipelines.sim.replay --landing DIR --report DIR [--conf conf/local.toml]
                                   [--capacity BROKER=WRITES_PER_S ...] [--limits-lake LAKE]
                                   [--backtest-conf conf/backtest.toml]

1. The governor's own ``--once`` run on the landing directory (``stats.log`` lines and send-failure JSON lines,
   docs/contracts.md §1) writes its tables to ``<report>/lake`` (:mod:`pipelines.sim.replay_job`); a re-run on the
   same report directory processes only what landed since.
2. Its tables give the demand per minute, broker, topic and consumer group, with the refused sends added back once
   per message (:mod:`pipelines.sim.replay_refused`, :mod:`pipelines.sim.replay_demand`) and, with
   ``--limits-lake`` (the lake of a governor that enforced limits while the recording was made), the demand its
   limits hid (:mod:`pipelines.sim.replay_enforced`).
3. A cluster of the recording's brokers (capacity per broker from its own minutes, or ``--capacity``: messages the
   broker writes per second, its ``BROKER_PUT_NUMS`` rate, at which its send queue begins to fast-fail) runs that
   demand against the governor's decisions minute by minute (:mod:`pipelines.sim.replay_run`).
4. The report (:mod:`pipelines.sim.replay_report`): ``<report>/report.md``, ``replay.json``, a PNG per resource.

Exit codes: 0 the report is written; 1 the recording cannot be replayed (no stats, too short, the job failed, a
table unreadable) or the report cannot be written; 2 a bad flag or config. Each error is one line on stderr.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Sequence

from pipelines.cli import OneLineParser
from pipelines.config import ConfigError, load_config
from pipelines.sim.replay_input import RecordingError, read_enforced, read_recording, recorded_counts
from pipelines.sim.replay_job import JobError, ROOT, run_once, write_job_config
from pipelines.sim.replay_report import summary_lines, write_json, write_report
from pipelines.sim.replay_run import ReplayError, min_minutes, replay_recording
from pipelines.sim.settings import BacktestError, load_backtest_config

PROG = "python -m pipelines.sim.replay"


def capacity_flag(text: str) -> tuple[str, float]:
    """``BROKER=N`` → (broker, N writes/s); N finite and above 0."""
    broker, sep, value = text.partition("=")
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not sep or not broker or not math.isfinite(number) or number <= 0:
        raise argparse.ArgumentTypeError(f"expected BROKER=WRITES_PER_S with a number above 0, got {text!r}")
    return broker, number


def build_parser() -> OneLineParser:
    p = OneLineParser(prog=PROG, description="Replay a recording of your brokers in closed loop: what the governor "
                                             "would have limited, when, and what it would have saved.")
    p.add_argument("--landing", required=True, type=Path, help="the recording: a landing directory (broker_stats/, "
                                                               "send_failures/)")
    p.add_argument("--report", required=True, type=Path, help="directory for the report (and the job's lake)")
    p.add_argument("--conf", default=str(ROOT / "conf" / "local.toml"), help="the governor's config (TOML)")
    p.add_argument("--capacity", nargs="+", type=capacity_flag, default=[], metavar="BROKER=WRITES_PER_S",
                   help="a broker's capacity, messages written per second (its BROKER_PUT_NUMS rate)")
    p.add_argument("--limits-lake", type=Path, default=None,
                   help="the lake of a governor that enforced limits while the recording was made")
    p.add_argument("--backtest-conf", default=str(ROOT / "conf" / "backtest.toml"),
                   help="the simulated world: write-back delay, shipping, brokers, clients")
    return p


def config_line(conf: str, cfg, bcfg) -> str:
    """The settings a replay ran with, one line."""
    w = cfg.windows
    return (f"Governor config `{conf}` with `limits.mode = \"enforce\"` (trigger {w.trigger_seconds} s, fast trigger "
            f"{w.fast_trigger_seconds} s, watermark {w.watermark_seconds} s); write-back delay "
            f"{bcfg.propagation_seconds:g} s, stats shipped {bcfg.shipping.stats_seconds:g} s and failures "
            f"{bcfg.shipping.failures_seconds:g} s after they happen; producers retry code 2 in "
            f"{bcfg.clients.retrying_share:.0%} of sends, {bcfg.clients.producer_attempts} attempts "
            f"(`conf/backtest.toml`).")


def run(args: argparse.Namespace) -> int:
    """Steps 1-4 of the module docstring; raises the errors :func:`main` turns into one line."""
    cfg = load_config(args.conf)
    bcfg = load_backtest_config(args.backtest_conf)
    stats = args.landing / "broker_stats"
    if not stats.is_dir() or not any(p.is_file() for p in stats.rglob("*")):
        raise RecordingError(f"no stats: {args.landing} has no file under broker_stats/ (docs/contracts.md §1)")
    if args.limits_lake is not None and not args.limits_lake.is_dir():
        raise RecordingError(f"--limits-lake {args.limits_lake}: no such directory")
    report = args.report.resolve()
    lake = report / "lake"
    config = write_job_config(args.conf, args.landing.resolve(), lake, report / "job.toml")
    job_seconds = run_once(config, args.landing.resolve(), lake, report / "job.log")
    rec = read_recording(lake, min_minutes(cfg))
    enforced = read_enforced(args.limits_lake) if args.limits_lake is not None else None
    outcome = replay_recording(rec, cfg, bcfg, dict(args.capacity), enforced)
    count = recorded_counts(rec.stats)
    meta = {"landing": str(args.landing), "report": str(args.report), "conf": args.conf,
            "backtest_conf": args.backtest_conf, "capacity": dict(args.capacity),
            "limits_lake": str(args.limits_lake) if args.limits_lake else None, "job_seconds": job_seconds,
            "topics": count.get("topic", 0), "groups": count.get("group", 0),
            "config_line": config_line(args.conf, cfg, bcfg)}
    clock = time.monotonic()
    write_report(outcome, report, meta)
    outcome.timings["report_seconds"] = time.monotonic() - clock
    write_json(outcome, report, meta)
    print("\n".join(summary_lines(outcome, meta)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (module docstring)."""
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except (ConfigError, BacktestError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except (RecordingError, JobError, ReplayError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{PROG}: cannot write the report: {exc.strerror or exc} ({exc.filename or args.report})",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
