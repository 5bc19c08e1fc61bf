"""Closed-loop backtest: the governor's real streaming queries against a simulated cluster whose brokers apply the
limits it publishes.

Usage::

    python -m pipelines.backtest --scenario NAME --lake DIR [--propagation-seconds N] [--conf conf/backtest.toml]
                                 [--seed 7] [--minutes N] [--onset N] [--brokers N] [--topics N] [--groups N]

Scenarios (:data:`pipelines.sim.settings.SCENARIO_SIZES`): ``persisting_storm``, ``storm_fixed``,
``intermittent_storm``, ``spread_storm``, ``flash_sale``, ``noisy_neighbour`` (a busy broker from a surging topic),
``normal_day``, ..., each in its world (:func:`pipelines.sim.settings.scenario_world`: its clients' settings and its
irregularities, e.g. a broker shipping late, a governor killed and restarted). The run
(:func:`pipelines.backtest.loop.run_loop`) steps simulated time with the shipped trigger, each micro-batch's measured
wall time added 1:1; ``DIR`` receives the governor's tables, the landing directory (``backtest/landing``), every
``limits.json`` published (``backtest/published``), and:

* Delta table ``backtest/results`` (:data:`pipelines.schemas.BACKTEST_RESULTS`, governor ``closed-loop``): the
  figures of :mod:`pipelines.sim.figures` and the config they ran with, one commit per run;
* ``backtest/report-<scenario>.md`` and ``backtest/closed-loop-<scenario>.png``.

Exit status: 0 when every check passes, 1 when one fails, 2 for bad input (one line on stderr).
"""

from __future__ import annotations

import datetime as dt
import sys
import uuid
from pathlib import Path
from typing import Any, Sequence

from pipelines.backtest.results import write_results
from pipelines.sim.figures import Figures, compute
from pipelines.backtest.loop import run_loop
from pipelines.sim.report import plot, report, summary_lines
from pipelines.sim.irregular import Irregularity, stats_landings, world_order
from pipelines.sim.settings import (
    SCENARIO_SIZES,
    BacktestConfig,
    BacktestError,
    build_spec,
    governor_config,
    load_backtest_config,
    scenario_world,
)
from pipelines.cli import OneLineParser, fail
from pipelines.config import ConfigError
from pipelines.dataplane.lake import open_lake
from pipelines.sim.cluster import ClosedLoopCluster
from pipelines.sim.spec import ScenarioSpec

PROG = "python -m pipelines.backtest"


def run_backtest(spark, *, lake: Path, bcfg: BacktestConfig, spec: ScenarioSpec,
                 propagation_seconds: float | None = None, progress=None, backlog_minutes: int = 0,
                 irregular: Irregularity | None = None) -> dict[str, Any]:
    """Run one scenario in closed loop (:func:`pipelines.backtest.loop.run_loop`) in the world ``bcfg`` and
    ``irregular`` (a named scenario's: :func:`pipelines.sim.settings.scenario_world`), compute its figures, write the
    table, the report and the picture. Returns ``{"result", "figures", "report", "png", "table", "run_id"}``."""
    lake = Path(lake)
    result = run_loop(spark, spec, bcfg, lake, propagation_seconds, progress=progress, backlog_minutes=backlog_minutes,
                      irregular=irregular)
    baseline = ClosedLoopCluster(spec, bcfg.broker, bcfg.clients)  # the same cluster without any limit
    baseline.advance_to(baseline.end)
    figures: Figures = compute(result, baseline)
    run_id = uuid.uuid4().hex[:12]
    out = lake / "backtest"
    png = plot(result, out / f"closed-loop-{spec.name}.png")
    md = report(result, figures, png, out / f"report-{spec.name}.md", run_id)
    table = write_results(open_lake(spark, lake, governor_config(bcfg, None, None).lake.writer), result, figures,
                          run_id, dt.datetime.now(dt.timezone.utc))
    return {"result": result, "figures": figures, "report": md, "png": png, "table": table, "run_id": run_id}


def world_line(result, base: BacktestConfig) -> str:
    """The world a run ran in, one line: the clients' settings that differ from ``base`` (the loaded
    ``conf/backtest.toml``) and the irregularities (:class:`pipelines.sim.irregular.Irregularity` fields off their
    defaults, seconds from the run's start); ``world: regular`` when neither."""
    clients = result.bcfg.clients.model_dump()
    changed = {k: v for k, v in clients.items() if v != getattr(base.clients, k)}
    irr = getattr(result, "irregular", None) or Irregularity()
    fields = {k: v for k, v in irr.model_dump().items() if v != getattr(Irregularity(), k)}
    if not irr.stats_jitter_seconds:
        fields.pop("seed", None)  # the jitter's generator: nothing without jitter
    parts = [f"clients {', '.join(f'{k}={v}' for k, v in sorted(changed.items()))}"] if changed else []
    parts += [f"{k}={v}" for k, v in sorted(fields.items(), key=world_order)]
    return "world: " + ("; ".join(parts) if parts else "regular")


def check_world(spec: ScenarioSpec, bcfg: BacktestConfig, irregular: Irregularity) -> None:
    """Refuse, before Spark starts, a world that names a broker the scenario does not have, or that asks for the
    limiter's own view (``limiter_view``: the RocketMQ admin sink's reads, played by the Spark-free loop only).

    Raises:
        BacktestError: names the brokers, or the setting.
    """
    if irregular.limiter_view:
        raise BacktestError(f"scenario {spec.name}: limiter_view is played by the Spark-free loop only "
                            "(pipelines.sim.limiter_view); the closed loop through Spark observes by the file "
                            "write-back")
    try:
        stats_landings(irregular, spec.broker_names, spec.minutes, bcfg.shipping.stats_seconds)
    except ValueError as exc:
        raise BacktestError(f"scenario {spec.name}: {exc}") from None


def build_parser() -> OneLineParser:
    """The ``python -m pipelines.backtest`` flags."""
    p = OneLineParser(prog=PROG, description="Closed-loop backtest: the governor's real queries against a simulated "
                                             "cluster whose brokers apply its limits.")
    p.add_argument("--scenario", required=True, help=f"one of {', '.join(sorted(SCENARIO_SIZES))}")
    p.add_argument("--lake", required=True, help="a fresh directory for the governor's tables and the results")
    p.add_argument("--conf", default="conf/backtest.toml", help="backtest config (default conf/backtest.toml)")
    p.add_argument("--propagation-seconds", type=float, help="published limits.json -> in force at the brokers, "
                                                            "seconds (default: the config's)")
    for flag in ("seed", "minutes", "onset", "brokers", "topics", "groups"):
        p.add_argument(f"--{flag}", type=int, help=f"scenario {flag} (default per scenario)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 every check passed, 1 a check failed, 2 bad input)."""
    args = build_parser().parse_args(argv)
    try:
        if args.propagation_seconds is not None and args.propagation_seconds < 0:
            raise BacktestError(f"--propagation-seconds must be >= 0, got {args.propagation_seconds:g}")
        base = load_backtest_config(args.conf)
        spec = build_spec(args.scenario, {"seed": args.seed, "minutes": args.minutes, "onset_minute": args.onset,
                                          "brokers": args.brokers, "topics": args.topics, "groups": args.groups})
        bcfg, irregular = scenario_world(args.scenario, base)
        check_world(spec, bcfg, irregular)
        gcfg = governor_config(bcfg, None, None)  # a bad governor config fails before Spark starts
        lake = Path(args.lake)
        if (lake / "_checkpoints").exists() or (lake / "gold").exists():
            raise BacktestError(f"lake {lake} already holds governor tables; use a fresh --lake")
    except (BacktestError, ConfigError, ValueError) as exc:
        return fail(PROG, exc)
    from pipelines.dataplane.session import build_session

    spark = build_session(gcfg.spark)
    try:
        out = run_backtest(spark, lake=lake, bcfg=bcfg, spec=spec, propagation_seconds=args.propagation_seconds,
                           irregular=irregular)
    except BacktestError as exc:
        return fail(PROG, exc)
    for line in summary_lines(out["result"], out["figures"]):
        print(line)
    print(f"  {world_line(out['result'], base)}")
    print(f"  report {out['report']}\n  plot {out['png']}\n  table {out['table']} (run {out['run_id']})")
    return 0 if all(ok for _, ok, _ in out["figures"].checks) else 1


if __name__ == "__main__":
    sys.exit(main())
