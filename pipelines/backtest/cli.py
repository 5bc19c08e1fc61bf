"""Backtest: replay traffic through a broker model with and without the governor's limits.

Usage::

    python -m pipelines.backtest --scenario NAME --lake DIR [--conf conf/backtest.toml] [--seed 7] [--minutes N]
                                 [--onset N] [--brokers N] [--topics N] [--groups N] [--strict]
    python -m pipelines.backtest --from-lake SRC --lake DIR [--conf conf/backtest.toml] [--scenario LABEL]

``--scenario``: generate the scenario (:data:`pipelines.sim.scenarios.SCENARIOS`) into
``DIR/backtest/landing-<scenario>``, run the governor's real pipeline on it (:func:`pipelines.governor.run`,
``--once``, tables in ``DIR``), then run the broker model (:mod:`pipelines.sim.broker_model`, one broker per group
on the executors: :mod:`udfs.broker_model`) twice on the scenario's traffic: without limits and with the enforced
limits of ``gold/limits``. ``--from-lake SRC``: replay what a governor
already recorded in ``SRC`` (``silver/broker_stats`` for the traffic, ``gold/limits``, ``gold/anomalies``,
``gold/topic_tps``, ``gold/group_tps``); results go to ``DIR``. Without ground truth, the limited resources are
taken as the incident and the ``BROKER_BUSY`` brokers as its brokers.

Outputs (``DIR/backtest/``):

* Delta table ``results`` (:data:`pipelines.schemas.BACKTEST_RESULTS`, registered in
  :data:`pipelines.io.lake.TABLES`, appended through the lake as one commit per run tagged with a transaction):
  one row per run × governor (with/without/both) × resource class × metric (``run_id``).
* ``report-<scenario>.md``: onset → first enforced limit (windows, seconds), rejected sends per class with and
  without the governor, false limits, limits below the observed peak, limits over time, the done checks.
* ``backtest-<scenario>.png``: per broker and per resource TPS with anomalies and limits, without | with.

A limit reaches the brokers at ``window_end + line_lag + watermark + trigger + propagation`` (``conf/backtest.toml``;
``decided_at`` is the replay's wall clock and is not used) and stays until its next decision arrives, it is lifted,
or it expires (``expires_at − decided_at`` after arrival); see :mod:`pipelines.backtest.inputs`.

Modules: :mod:`~pipelines.backtest.inputs` (config, timing, generated or replayed inputs),
:mod:`~pipelines.backtest.metrics` (model runs, classes, metrics, checks, results table),
:mod:`~pipelines.backtest.report` (Markdown, PNG, summary), this one (command line, :func:`run_backtest`).
"""

from __future__ import annotations

import datetime as dt
import sys
import uuid
from pathlib import Path
from typing import Any, Sequence

from pipelines.backtest.inputs import (
    BacktestConfig,
    BacktestError,
    build_spec,
    generate_inputs,
    governor_config,
    load_backtest_config,
    replay_inputs,
)
from pipelines.backtest.metrics import run_models, write_results
from pipelines.backtest.report import plot, report, summary_lines
from pipelines.cli import OneLineParser, fail
from pipelines.config import ConfigError
from pipelines.io.lake import open_lake
from pipelines.sim.scenarios import SCENARIOS
from pipelines.sim.spec import ScenarioSpec

PROG = "python -m pipelines.backtest"


def run_backtest(spark, *, lake: Path, bcfg: BacktestConfig, spec: ScenarioSpec | None = None,
                 from_lake: Path | None = None, label: str | None = None) -> dict[str, Any]:
    """Generate-or-replay, model both runs, write table + PNG + report. Returns paths, metrics and checks."""
    lake = Path(lake)
    if from_lake is not None:
        inputs = replay_inputs(spark, Path(from_lake), bcfg, label or "replay")
    else:
        assert spec is not None
        inputs = generate_inputs(spark, spec, bcfg, lake)
    outcome = run_models(spark, inputs, bcfg)
    run_id = uuid.uuid4().hex[:12]
    recorded = dt.datetime.now(dt.timezone.utc)
    out_dir = lake / "backtest"
    png = plot(outcome, out_dir / f"backtest-{inputs.scenario}.png")
    md = report(outcome, bcfg, png, out_dir / f"report-{inputs.scenario}.md", run_id)
    table = write_results(open_lake(spark, lake, governor_config(bcfg, None, None).lake.writer), outcome, run_id,
                          recorded)
    return {"outcome": outcome, "png": png, "report": md, "table": table, "run_id": run_id}


def build_parser() -> OneLineParser:
    """The ``python -m pipelines.backtest`` flags."""
    p = OneLineParser(prog=PROG, description="Backtest the governor's limits on replayed traffic (broker model).")
    src = p.add_mutually_exclusive_group(required=False)
    p.add_argument("--scenario", help=f"scenario to generate ({', '.join(sorted(SCENARIOS))}); with "
                                      "--from-lake, only a label")
    src.add_argument("--from-lake", help="replay a lake a governor already wrote (silver + gold tables)")
    p.add_argument("--lake", required=True, help="where the governor tables (generate mode) and results go")
    p.add_argument("--conf", default="conf/backtest.toml", help="backtest config (default conf/backtest.toml)")
    for flag in ("seed", "minutes", "onset", "brokers", "topics", "groups"):
        p.add_argument(f"--{flag}", type=int, help=f"scenario {flag} (default per scenario)")
    p.add_argument("--strict", action="store_true", help="exit 1 when a done check fails")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 done, 1 a done check failed with ``--strict``, 2 bad input)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.from_lake is None and args.scenario is None:
        parser.error("one of --scenario or --from-lake is required")
    if args.from_lake is None and args.scenario not in SCENARIOS:
        parser.error(f"argument --scenario: unknown scenario {args.scenario!r} "
                     f"(known: {', '.join(sorted(SCENARIOS))})")
    try:
        bcfg = load_backtest_config(args.conf)
        spec = None
        if args.from_lake is None:
            spec = build_spec(args.scenario, {"seed": args.seed, "minutes": args.minutes, "onset_minute": args.onset,
                                              "brokers": args.brokers, "topics": args.topics, "groups": args.groups})
        elif not Path(args.from_lake).is_dir():
            raise BacktestError(f"lake directory not found: {args.from_lake}")
        gcfg = governor_config(bcfg, None, None)  # a bad governor config fails before Spark starts
    except (BacktestError, ConfigError, ValueError) as exc:
        return fail(PROG, exc)
    from pipelines.session import build_session

    spark = build_session(gcfg.spark)
    try:
        out = run_backtest(spark, lake=Path(args.lake), bcfg=bcfg, spec=spec,
                           from_lake=Path(args.from_lake) if args.from_lake else None, label=args.scenario)
    except BacktestError as exc:
        return fail(PROG, exc)
    for line in summary_lines(out["outcome"]):
        print(line)
    print(f"  report {out['report']}\n  plot {out['png']}\n  table {out['table']} (run {out['run_id']})")
    if args.strict and not all(ok for _, ok, _ in out["outcome"].checks):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
