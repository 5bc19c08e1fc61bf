"""``python -m pipelines.sim``: write a scenario's landing directory (:func:`pipelines.sim.render.render_landing`).

Usage::

    python -m pipelines.sim --out DIR [--scenario retry_storm] [--seed 7] [--minutes 90]
                                 [--start 2022-02-08T06:39:00Z] [--brokers 3] [--topics 30] [--groups 20]
                                 [--envelope-share 0.3]

A bad flag or value prints one line on stderr and exits 2; a landing directory that cannot be written exits 1.
"""

from __future__ import annotations

import sys
from dataclasses import fields
from datetime import datetime
from typing import Sequence

import pandas as pd

from pipelines.cli import OneLineParser
from pipelines.sim.render import render_landing
from pipelines.sim.scenarios import SCENARIOS
from pipelines.sim.spec import ScenarioSpec

PROG = "python -m pipelines.sim"


def parse_start(text: str) -> datetime:
    """ISO-8601 start, UTC when no zone is given (``2022-02-08T06:39:00Z``, ``2022-02-08 06:39``)."""
    stamp = pd.Timestamp(text.strip())
    if stamp is pd.NaT:
        raise ValueError(f"not a time: {text!r}")
    stamp = stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")
    return stamp.to_pydatetime()


def build_parser() -> OneLineParser:
    """The ``python -m pipelines.sim`` flags; defaults come from :class:`ScenarioSpec`."""
    defaults = {f.name: f.default for f in fields(ScenarioSpec)}
    p = OneLineParser(prog=PROG,
                      description="Write a synthetic RocketMQ landing directory (broker stats + send failures).")
    p.add_argument("--out", required=True, help="landing directory to write into")
    p.add_argument("--scenario", default=defaults["name"], choices=sorted(SCENARIOS), help="scenario to generate")
    p.add_argument("--seed", type=int, default=defaults["seed"], help="random seed (numpy default_rng)")
    p.add_argument("--minutes", type=int, default=defaults["minutes"], help="minutes of traffic")
    p.add_argument("--start", default=None,
                   help="UTC start of the first minute, ISO-8601, truncated to the minute "
                        "(default: the current UTC minute minus --minutes)")
    p.add_argument("--brokers", type=int, default=defaults["brokers"], help="number of brokers")
    p.add_argument("--topics", type=int, default=defaults["topics"], help="number of business topics")
    p.add_argument("--groups", type=int, default=defaults["groups"], help="number of consumer groups")
    p.add_argument("--envelope-share", type=float, default=defaults["envelope_share"],
                   help="share of brokers shipping JSON envelopes instead of raw stats.log")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 written, 1 cannot write, 2 bad flag or spec)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    prog = parser.prog
    try:
        start = parse_start(args.start) if args.start is not None else None
    except (ValueError, TypeError) as exc:
        parser.error(f"argument --start: {exc}")
    try:
        spec = ScenarioSpec(name=args.scenario, seed=args.seed, start=start, minutes=args.minutes,
                            brokers=args.brokers, topics=args.topics, groups=args.groups,
                            envelope_share=args.envelope_share)
    except ValueError as exc:
        sys.stderr.write(f"{prog}: error: {exc}\n")
        return 2
    try:
        result = render_landing(spec, args.out)
    except OSError as exc:
        sys.stderr.write(f"{prog}: error: cannot write landing directory {args.out}: "
                         f"{exc.strerror or exc} ({getattr(exc, 'filename', '') or args.out})\n")
        return 1
    onset = result["onset"]
    incident = (f"incident onset {onset:%Y-%m-%dT%H:%M:%SZ} UTC, culprit group {result['culprit_group']}"
                if isinstance(onset, datetime) else "no incident")
    print(f"simulate {spec.name} seed={spec.seed} start={spec.start_utc:%Y-%m-%dT%H:%M:%SZ} minutes={spec.minutes}: "
          f"{result['files']} files, {result['stats_lines']} stats lines, {result['failure_lines']} failure lines "
          f"in {args.out}; {incident}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
