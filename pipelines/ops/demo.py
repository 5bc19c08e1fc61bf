"""The main job on the embedded default: generate the article-001 scenario (unless a landing directory is given),
run the governor once (``--once``) and print a summary an SRE or analyst can act on.

Usage:
    python -m pipelines.ops.demo [--conf conf/local.toml] [--landing DIR] [--lake DIR] [--seed 7] [--minutes 90]
        [--verbose]

Without ``--landing``, a fresh run directory ``scratch/run-<UTC time>/`` holds the generated landing directory and
the lake (so re-running never mixes two scenarios); with ``--landing``, the lake defaults to ``<landing>/../lake``.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import time
from pathlib import Path

from pipelines import governor
from pipelines.ops import query
from pipelines.sim.render import render_landing
from pipelines.sim.spec import ScenarioSpec
from pipelines.cli import OneLineParser, fail
from pipelines.config import ConfigError, load_config, throwaway_signing_key
from pipelines import tables
from pipelines.tables import sql_name
from pipelines.ops import console, status

#: The embedded default configuration of this checkout.
DEFAULT_CONF = Path(__file__).resolve().parents[2] / "conf" / "local.toml"
EXAMPLE_SQL = (
    "SELECT resource_type, resource, action, round(limit_qps, 1) AS limit_qps, mode, window_end, reason "
    f"FROM {sql_name(tables.GOLD_LIMITS)} ORDER BY version"
)


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="./run.sh", description=__doc__.splitlines()[0])
    parser.add_argument("--conf", default=str(DEFAULT_CONF), help="config file (default: conf/local.toml)")
    parser.add_argument("--landing", help="existing landing directory (default: generate the article-001 scenario)")
    parser.add_argument("--lake", help="lake directory (default: next to the landing directory)")
    parser.add_argument("--seed", type=int, default=7, help="scenario seed (default: 7)")
    parser.add_argument("--minutes", type=int, default=90, help="scenario length in minutes (default: 90)")
    parser.add_argument("--verbose", action="store_true", help="show Spark's own log lines (hidden by default)")
    return parser


def _rows(lake: str, sql: str) -> list[dict]:
    """Rows of ``sql`` over the lake; none when a table it reads was never written (nothing of that kind happened)."""
    try:
        return query.run_sql(lake, sql).to_pylist()
    except ValueError:
        return []


def _count(lake: str, sql: str) -> int:
    rows = _rows(lake, sql)
    return int(next(iter(rows[0].values()))) if rows else 0


def summary(lake: str, elapsed_s: float) -> str:
    """A short report of what the governor found and decided, read back from the Delta tables."""
    lines_in = sum(_count(lake, f"SELECT count(*) FROM {sql_name(t)}")
                   for t in (tables.BRONZE_BROKER_STATS, tables.BRONZE_SEND_FAILURES))
    quarantined = _count(lake, f"SELECT count(*) FROM {sql_name(tables.QUARANTINE)}")
    out = [
        f"rate-governor: processed {lines_in} input lines in {elapsed_s:.0f} s "
        f"({quarantined} quarantined with a reason)",
    ]
    anomalies = _rows(
        lake,
        "SELECT anomaly, resource_type, resource, count(*) AS windows, round(max(observed_tps), 1) AS peak_tps "
        f"FROM {sql_name(tables.GOLD_ANOMALIES)} GROUP BY anomaly, resource_type, resource ORDER BY anomaly, resource",
    )
    out.append(f"anomalies: {len(anomalies)} resources flagged")
    out += [
        f"  {a['anomaly']:<14} {a['resource_type']:<6} {a['resource']:<34} {a['windows']:>3} windows, "
        f"peak {a['peak_tps']} /s"
        for a in anomalies
    ]
    limits = _rows(
        lake,
        "SELECT resource_type, resource, action, limit_qps, mode, basis, window_end, version, reason "
        f"FROM {sql_name(tables.GOLD_LIMITS)} ORDER BY resource_type, resource, version",
    )
    stories = console.limit_stories(limits)
    out.append(f"limits: {len(stories)} resources ({len(limits)} decision rows; times are window ends, UTC)")
    out += [f"  {story}" for story in stories]
    out += [
        f"Delta tables: {lake}/{{bronze,silver,gold}}/…, quarantine; current limits: {lake}/control/limits.json",
        "Example query (paste it):",
        f'  .venv/bin/python -m pipelines.ops.query --lake {lake} "{EXAMPLE_SQL}"',
    ]
    return "\n".join(out)


def _demo_signing_key(conf: str, lake: Path) -> str | None:
    """The demo signs its records with a throw-away key when none is configured
    (:func:`pipelines.config.throwaway_signing_key`, written beside the lake as ``signing.key``) and exports it for
    this process only. Production keys come from the environment or a key file named in the config."""
    try:
        limits = load_config(conf).limits
    except ConfigError:
        return None  # reported by the governor's own config loading
    key_file = throwaway_signing_key(limits, lake.parent / "signing.key")
    if key_file is None:
        return None
    os.environ[limits.signing_key_env] = key_file.read_text(encoding="utf-8")
    return f"signed with a demo key generated for this run: {key_file} (set {limits.signing_key_env} for a real one)"


#: The status page's note on ``./run.sh``'s input (a recording replayed as landed files).
REPLAY_NOTE = (
    "a recording, replayed. The scenario ({scenario}, seed {seed}) was generated as landed stats.log and send-failure "
    "files before the run, so the brokers in it never obeyed the limits this governor published: under a limit the "
    "TPS drawn below is what the recording offered, not what a limited broker admits. The last figure runs the same "
    "scenario in closed loop (the Spark-free simulator, the same decision code, brokers applying every published "
    "limit)."
)


def replay_and_closed_loop(spec: ScenarioSpec, cfg, out_dir: Path) -> tuple[str, status.Figure | None]:
    """The status page's note for a replayed recording and the same ``spec`` in closed loop
    (:func:`pipelines.sim.report.closed_loop`, its picture also written as ``out_dir/closed-loop.png``); prints one
    summary line. The figure is None (and one line says why) when the simulation fails: the page is still written."""
    from pipelines.sim.report import closed_loop

    note = REPLAY_NOTE.format(scenario=spec.name, seed=spec.seed)
    try:
        figures, png = closed_loop(spec, cfg, out=out_dir / "closed-loop.png")
    except Exception as exc:  # noqa: BLE001 - the replay's page matters more than the picture beside it
        print(f"closed loop (simulator): not drawn: {exc}")
        return note, None
    v = figures.value
    line = (f"closed loop (simulator, same scenario, brokers applying the limits): limit in force "
            f"{v('onset_to_limit_in_force'):.0f} s after the storm began, brokers admitted "
            f"{v('culprit_admitted_over_target'):.2f}x the decided target, bystanders' rejected sends "
            f"{v('bystander_rejected_per_minute_before'):,.0f} -> {v('bystander_rejected_per_minute_after'):,.0f} "
            f"per storm minute")
    print(line)
    return note, status.Figure("The same scenario in closed loop (simulator)", png, line)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console.configure_logging(args.verbose)
    if args.landing:
        landing = Path(args.landing)
        lake = Path(args.lake) if args.lake else landing.resolve().parent / "lake"
    else:
        run_dir = Path("scratch") / f"run-{dt.datetime.now(dt.timezone.utc):%Y%m%d-%H%M%S}"
        landing, lake = run_dir / "landing", Path(args.lake) if args.lake else run_dir / "lake"
        spec = ScenarioSpec(seed=args.seed, minutes=args.minutes)
        written = render_landing(spec, landing)
        print(
            f"generated scenario retry_storm (seed {args.seed}): {written['stats_lines']} stats lines, "
            f"{written['failure_lines']} send failures in {landing}; incident: {written['culprit_group']} "
            f"stops acknowledging at {written['onset']:%H:%M} UTC"
        )
    key_note = _demo_signing_key(args.conf, lake)
    gov_args = ["--conf", args.conf, "--landing", str(landing), "--lake", str(lake), "--once"]
    started = time.monotonic()
    try:
        cfg = governor.load_run_config(governor.build_parser().parse_args(gov_args))
    except governor.STARTUP_ERRORS as exc:
        return fail("rate-governor", exc)
    from pipelines.dataplane.session import build_session

    spark = build_session(cfg.spark, verbose=args.verbose)
    governor.run(spark, cfg, once=True)
    spark.stop()
    print(summary(str(lake), time.monotonic() - started))
    note, loop = "", None
    if not args.landing:  # a generated recording: say so, and show the same scenario in closed loop beside it
        note, loop = replay_and_closed_loop(spec, cfg, lake.parent)
    print(f"status page: {status.write_page(str(lake), input_note=note, closed_loop=loop).resolve().as_uri()}")
    if key_note:
        print(key_note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
