"""An on-call engineer's hand on the wheel: pin a topic or a consumer group at a fixed limit, exempt it from
enforced limits, release either early, or list them, while the governor runs (docs/operators.md §9). Each is a row
of ``<lake>/control/overrides`` (Delta, append-only), which the running governor applies within one fast trigger
(``windows.fast_trigger_seconds``) and publishes through every write-back path (:mod:`pipelines.job.overrides`).

Usage:
    python -m pipelines.ops.override pin topic|group NAME --qps Q --for DURATION --reason TEXT [--author NAME]
    python -m pipelines.ops.override exempt topic|group NAME --for DURATION --reason TEXT [--author NAME]
    python -m pipelines.ops.override release ID [--reason TEXT] [--author NAME]
    python -m pipelines.ops.override list [--all]

Every verb also takes ``--conf FILE`` (default ``conf/local.toml``: the limits and the longest override) and
``--lake DIR`` (default the config's ``lake.path``). ``--qps`` is cluster-wide msg/s (each broker gets its share);
``DURATION`` is e.g. ``90s``, ``30m``, ``2h``, ``1h30m``, ``1d`` (at most ``overrides.max_duration_seconds``);
``--author`` defaults to the OS user. ``list`` shows the overrides in force and those ended in the last 24 hours
(``--all``: every one), which one wins where two name one resource, and the rows the governor ignores.

Exit status: 0 done, 2 bad input or a lake without a governor's tables (one line on stderr).
"""

from __future__ import annotations

import datetime as dt
import getpass
import math
import re
import secrets
import sys
from collections.abc import Sequence

from pipelines import columns, tables
from pipelines.cli import OneLineParser, fail
from pipelines.config import ConfigError, GovernorConfig, load_config
from pipelines.decide.arrow import from_rows
from pipelines.decide.paths.overrides import (
    CREATE, EXEMPT, PIN, RELEASE, RESOURCE_TYPES, Override, in_force, parse, refusal,
)
from pipelines.decide.text import fixed, stamp

PROG = "python -m pipelines.ops.override"
#: ``list`` without ``--all``, and the status page: overrides that ended this long ago at most.
RECENT = dt.timedelta(hours=24)
#: Tables only a governor writes: a lake holding none of them is not a governor's.
GOVERNOR_TABLES = (tables.BRONZE_BROKER_STATS, tables.BRONZE_SEND_FAILURES, tables.GOLD_LIMITS, tables.STATE_POLICY)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([dhms])")
_UNIT = {"d": 86_400, "h": 3_600, "m": 60, "s": 1}


class OverrideError(Exception):
    """Bad input: the message is the one line the command prints."""


def duration(text: str) -> float:
    """``90s``, ``30m``, ``2h``, ``1h30m``, ``1d`` or plain seconds → seconds.

    Raises:
        OverrideError: not a duration, or not more than 0."""
    text = text.strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        seconds = float(text)
    elif text and re.fullmatch(rf"(?:{_DURATION.pattern})+", text):
        seconds = sum(float(n) * _UNIT[u] for n, u in _DURATION.findall(text))
    else:
        raise OverrideError(f"--for {text!r} is not a duration (90s, 30m, 2h, 1h30m, 1d)")
    if not seconds > 0:
        raise OverrideError(f"--for {text!r} must be more than 0 seconds")
    return seconds


def open_governor_lake(root: str):
    """The lake at ``root`` through delta-rs (no Spark session).

    Raises:
        OverrideError: none of the governor's own tables is there (a wrong path, or a governor never ran on it)."""
    from pipelines.dataplane.lake import DeltaRsLake

    lake = DeltaRsLake(None, root)
    if not any(lake.exists(t) for t in GOVERNOR_TABLES):
        raise OverrideError(f"{root}: not a governor's lake (none of {', '.join(GOVERNOR_TABLES)}); give the lake the "
                            "governor runs on (--lake, or lake.path of --conf)")
    return lake


def read(lake, cfg: GovernorConfig) -> tuple[list[Override], list[tuple[dict, str]]]:
    """The overrides of ``control/overrides`` and the rows the governor ignores (with their reason). Read with
    DataFusion (:func:`pipelines.ops.query.run_sql`): a short-lived process that read through pyarrow's dataset
    scanner sometimes aborted at exit (``terminate called without an active exception``, delta-rs issue 2184)."""
    from pipelines.ops.query import run_sql

    if not lake.exists(tables.CONTROL_OVERRIDES):
        return [], []
    return parse(run_sql(lake.root, f"SELECT * FROM {tables.sql_name(tables.CONTROL_OVERRIDES)}").to_pylist(), cfg)


def state(o: Override, overrides: Sequence[Override], now: dt.datetime) -> str:
    """What ``o`` is at ``now``: in force, outranked by a newer override of its resource, ended or released."""
    if o.in_force(now):
        winner = in_force(overrides, now)[o.key]
        return "in force" if winner.override_id == o.override_id else (
            f"not applied: {winner.override_id} is newer and wins")
    if o.released_at is not None and o.released_at < o.ends_at and o.released_at <= now:
        return f"released by {o.released_by} at {stamp(o.released_at)}"
    return f"ended at {stamp(o.ends_at)}"


def describe(overrides: Sequence[Override], now: dt.datetime, everything: bool = False) -> list[dict[str, str]]:
    """The overrides in force and those ended within :data:`RECENT` (``everything``: all), newest first, as text
    by column: ``id``, ``kind``, ``resource``, ``limit`` (msg/s), ``from``, ``until`` (UTC), ``author``, ``state``,
    ``reason``."""
    shown = [o for o in overrides if everything or o.until > now - RECENT]
    return [{"id": o.override_id, "kind": o.kind, "resource": f"{o.resource_type} {o.resource}",
             "limit": fixed(o.limit_qps, 1) if o.kind == PIN else "-", "from": stamp(o.starts_at),
             "until": stamp(o.until), "author": o.author, "state": state(o, overrides, now), "reason": o.reason}
            for o in sorted(shown, key=Override.newness, reverse=True)]


def _author(given: str | None) -> str:
    if given and given.strip():
        return given.strip()
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no OS user name in this environment
        raise OverrideError("no OS user name to record as the author: give --author") from None


def create(lake, cfg: GovernorConfig, kind: str, resource_type: str, resource: str, seconds: float, reason: str,
           author: str | None, qps: float | None, now: dt.datetime) -> tuple[Override, list[Override]]:
    """Append a ``create`` row; returns the new override and the others in force on the resource (it wins over
    them: the newest wins).

    Raises:
        OverrideError: the override would be refused (:func:`pipelines.decide.paths.overrides.refusal`)."""
    if qps is not None and (not math.isfinite(qps) or qps <= 0):
        raise OverrideError(f"--qps {qps:g} must be a finite number of msg/s above 0")
    limit = cfg.overrides.max_duration_seconds
    if seconds > limit:
        raise OverrideError(f"--for {seconds:g} s is over overrides.max_duration_seconds = {limit} (none lasts "
                            "forever: set a new one when it ends)")
    existing, _ = read(lake, cfg)
    taken = {o.override_id for o in existing}
    oid = next(i for i in (f"ovr-{secrets.token_hex(4)}" for _ in range(100)) if i not in taken)
    row = {"recorded_at": now, "event": CREATE, "override_id": oid, "kind": kind, "resource_type": resource_type,
           "resource": resource, "limit_qps": qps, "starts_at": now,
           "ends_at": now + dt.timedelta(seconds=seconds), "author": _author(author), "reason": (reason or "").strip()}
    why = refusal(row, cfg)
    if why is not None:
        raise OverrideError(f"{kind} {resource_type} {resource} refused: {why}")
    lake.append_arrow(from_rows([row], columns.OVERRIDES), tables.CONTROL_OVERRIDES, app_id=f"override-{oid}",
                      version=0)
    made, _ = parse([row], cfg)
    others = [o for o in existing if o.key == (resource_type, resource) and o.in_force(now)]
    return made[0], others


def release(lake, cfg: GovernorConfig, oid: str, reason: str | None, author: str | None,
            now: dt.datetime) -> Override:
    """Append a ``release`` row ending ``oid`` now; returns the override as it was.

    Raises:
        OverrideError: no such override, or it is no longer in force."""
    overrides, _ = read(lake, cfg)
    found = next((o for o in overrides if o.override_id == oid), None)
    if found is None:
        raise OverrideError(f"no override {oid} in {lake.path(tables.CONTROL_OVERRIDES)} ({PROG} list shows them)")
    if not found.in_force(now):
        raise OverrideError(f"{oid} is no longer in force: {state(found, overrides, now)}")
    row = {"recorded_at": now, "event": RELEASE, "override_id": oid, "kind": found.kind,
           "resource_type": found.resource_type, "resource": found.resource, "limit_qps": None, "starts_at": None,
           "ends_at": None, "author": _author(author), "reason": (reason or "released early").strip()}
    lake.append_arrow(from_rows([row], columns.OVERRIDES), tables.CONTROL_OVERRIDES, app_id=f"override-{oid}",
                      version=1)
    return found


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    common = OneLineParser(add_help=False)
    common.add_argument("--conf", default="conf/local.toml", help="config file (default conf/local.toml)")
    common.add_argument("--lake", help="lake directory (default: lake.path of --conf)")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="{pin,exempt,release,list}")
    for kind, text in ((PIN, "hold a resource at a fixed limit"), (EXEMPT, "keep enforced limits off a resource")):
        sub = verbs.add_parser(kind, parents=[common], help=text)
        sub.add_argument("resource_type", choices=RESOURCE_TYPES, help="topic or group")
        sub.add_argument("resource", help="topic or consumer group name")
        if kind == PIN:
            sub.add_argument("--qps", type=float, required=True, help="the limit, cluster-wide msg/s")
        sub.add_argument("--for", dest="duration", required=True, help="how long: 90s, 30m, 2h, 1h30m, 1d")
        sub.add_argument("--reason", required=True, help="why (recorded and named in every decision it shapes)")
        sub.add_argument("--author", help="who (default: the OS user)")
    sub = verbs.add_parser(RELEASE, parents=[common], help="end an override now")
    sub.add_argument("override_id", help="its id (ovr-...)")
    sub.add_argument("--reason", help="why (default: released early)")
    sub.add_argument("--author", help="who (default: the OS user)")
    sub = verbs.add_parser("list", parents=[common], help="overrides in force and recent")
    sub.add_argument("--all", action="store_true", help="every override, not only the last 24 hours")
    return parser


def _print_list(overrides: list[Override], ignored: list[tuple[dict, str]], now: dt.datetime, everything: bool) -> None:
    rows = describe(overrides, now, everything)
    if not rows:
        print("no override in force" + ("" if everything else " or ended in the last 24 hours"))
    heads = ["id", "kind", "resource", "limit", "from", "until", "author", "state", "reason"]
    widths = {h: max([len(h)] + [len(r[h]) for r in rows]) for h in heads[:-1]}
    for r in ([dict(zip(heads, [h.upper() for h in heads]))] + rows) if rows else []:
        print("  ".join(r[h].ljust(widths[h]) for h in heads[:-1]) + "  " + r["reason"])
    for row, why in ignored:
        print(f"ignored by the governor: {row.get('event')} {row.get('override_id')} of {row.get('recorded_at')}: "
              f"{why}")


def main(argv: Sequence[str] | None = None, now: dt.datetime | None = None) -> int:
    args = build_parser().parse_args(argv)
    now = now or dt.datetime.now(dt.timezone.utc)
    try:
        cfg = load_config(args.conf)
        lake = open_governor_lake(args.lake or cfg.lake.path)
        if args.verb == "list":
            _print_list(*read(lake, cfg), now, args.all)
        elif args.verb == RELEASE:
            gone = release(lake, cfg, args.override_id, args.reason, args.author, now)
            print(f"released {gone.override_id} ({gone.kind} {gone.resource_type} {gone.resource}); the governor lets "
                  f"the rules take over within {cfg.windows.fast_trigger_seconds} s")
        else:
            made, others = create(lake, cfg, args.verb, args.resource_type, args.resource, duration(args.duration),
                                  args.reason, args.author, getattr(args, "qps", None), now)
            what = (f"pinned at {fixed(made.limit_qps, 1)} msg/s" if made.kind == PIN
                    else "exempted from enforced limits")
            print(f"{made.override_id}: {made.resource_type} {made.resource} {what} until {stamp(made.until)} "
                  f"(by {made.author}); the governor applies it within {cfg.windows.fast_trigger_seconds} s"
                  + "".join(f"; newer than {o.override_id}, which it replaces" for o in others)
                  + ("; limits.mode is advisory here: published as advisory" if cfg.limits.mode == "advisory"
                     and made.kind == PIN else ""))
    except (OverrideError, ConfigError) as exc:
        return fail("rate-governor override", exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
