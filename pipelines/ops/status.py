"""The status page: what the governor thinks now, as one self-contained HTML file with PNG plots.

Reads the lake with delta-rs (no Spark, :func:`pipelines.ops.query.run_sql`) and ``<lake>/control/limits.json``, and
writes ``<out>/index.html`` (default ``<lake>/status/index.html``) with the plots embedded as ``data:`` PNGs, so
the file can be mailed or attached to a ticket as it is:

* limits in force (``limits.json``): resource, limit (cluster-wide msg/s, and each broker's share), mode, version,
  held since (the window that started it; marked when held longer than ``limits.max_held_seconds``, for a person to
  look at, or enforced under its topic's normal floor), expiry (UTC, marked when past) and the reason sentence;
* a timeline of anomalies (one bar per flagged window, colour = kind) and limit decisions (triangles);
* the TPS of every limited or flagged resource and of the brokers that carry it, around its anomalies and
  decisions (``gold/topic_tps.put_tps``; ``gold/group_tps`` consume and retry TPS summed over the group's topics;
  ``gold/broker_tps.put_tps``), with the anomaly windows shaded and the limit drawn;
* operators' overrides (``control/overrides``) in force and ended in the last 24 hours: who pinned or exempted
  what, why, until when, and which wins where two name one resource (:mod:`pipelines.ops.override`);
* the quarantine by reason and input;
* a link to the Data Docs (``<lake>/quality/data_docs/index.html``) or the command that builds them.

Usage:
    python -m pipelines.ops.status --lake LAKE [--out DIR] [--margin-minutes 30] [--max-resources 24]
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from pipelines.ops import override, query
from pipelines.cli import OneLineParser, fail
from pipelines.config import GovernorConfig, LimitsConfig
from pipelines.decide.catalogue import normal_floor
from pipelines.writeback import publish
from pipelines import tables
from pipelines.tables import sql_name
from pipelines.ops import plots
from pipelines.dataplane.quality.data_docs import DOCS_SUBDIR
from pipelines.rocketmq import RETRY_TOPIC_PREFIX

STATUS_SUBDIR = "status"
#: Marks every <img> with its ``naturalWidth`` once the page has loaded (0 = the image did not decode); the
#: browser test and anyone debugging a broken page read it from the DOM.
IMAGE_CHECK_SCRIPT = (
    "<script>window.addEventListener('load',function(){document.querySelectorAll('img').forEach(function(i)"
    "{i.setAttribute('data-natural-width',String(i.naturalWidth));});"
    "document.body.setAttribute('data-images-checked','1');});</script>"
)
STYLE = """body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:1200px}
table{border-collapse:collapse;font-size:0.85em;margin:0.5em 0}td,th{border:1px solid #ccc;padding:3px 6px;
text-align:left;vertical-align:top}th{background:#f3f3f3}.expired{color:#999}.reason{max-width:640px}
img{max-width:100%;display:block;margin:0.4em 0 1.2em}h2{border-bottom:1px solid #ddd;padding-bottom:2px}
.muted{color:#777}.held-long{background:#fff3cd}.under-normal{background:#fff3cd}.at-cap{background:#fff3cd}
.note{background:#eef4fb;border-left:4px solid #5b8bd0;padding:6px 10px}"""


class StatusError(Exception):
    """The lake has no governor tables to show (wrong path, or the governor never ran on it)."""


@dataclass
class Figure:
    title: str
    png: bytes
    caption: str = ""


@dataclass
class Status:
    """What the page shows, read from the lake (pandas frames, UTC times)."""

    lake: str
    now: dt.datetime
    limits_in_force: list[dict]
    anomalies: pd.DataFrame
    decisions: pd.DataFrame
    quarantine: pd.DataFrame
    input_rows: int
    latest_window: pd.Timestamp | None
    figures: list[Figure] = field(default_factory=list)
    omitted: list[str] = field(default_factory=list)
    max_held_seconds: int = LimitsConfig().max_held_seconds
    #: What the input was, shown at the top when set (``./run.sh``: a recording replayed, which never obeyed the
    #: limits; a production lake's input is the brokers' own and needs no note).
    input_note: str = ""
    #: The same scenario in closed loop (``./run.sh``: the Spark-free simulator, brokers applying the published
    #: limits), drawn below the replay's figures when set.
    closed_loop: Figure | None = None
    #: Operators' overrides in force and recent (:func:`pipelines.ops.override.describe`).
    overrides: list[dict] = field(default_factory=list)
    #: (resource_type, resource) → the baseline frozen with its limit, msg/s (newest ``state/policy`` row, none under
    #: an override); a topic's normal floor is it × ``limits.surge_squeeze_headroom`` (``catalogue.normal_floor``).
    baselines: dict[tuple[str, str], float] = field(default_factory=dict)
    normal_headroom: float = LimitsConfig().surge_squeeze_headroom
    #: (resource_type, resource) → what its last undone probe admitted beyond the level before it, messages
    #: cluster-wide (newest ``state/policy`` row; the probe's cost, stated in its undo's reason too).
    probe_excess: dict[tuple[str, str], float] = field(default_factory=dict)
    #: (resource_type, resource) → the end of the first window at the cap of its current spell there (newest
    #: ``state/policy`` row, none under an override); held there ``max_at_cap_seconds`` or more, it is named for a
    #: person.
    at_cap_since: dict[tuple[str, str], pd.Timestamp] = field(default_factory=dict)
    max_at_cap_seconds: int = LimitsConfig().max_at_cap_seconds

    def held_since(self, resource_type: str, resource: str) -> pd.Timestamp | None:
        """The window end of the decision that started the resource's current limit: the first decision after its
        last lift (None when it has no decision)."""
        mine = self.decisions[(self.decisions["resource_type"] == resource_type)
                              & (self.decisions["resource"] == resource)].sort_values(["window_end", "version"])
        mine = mine.reset_index(drop=True)
        lifts = mine.index[mine["action"] == "lift"]
        after = mine.iloc[lifts[-1] + 1:] if len(lifts) else mine
        return pd.Timestamp(after["window_end"].iloc[0]) if len(after) else None

    def at_cap_for(self, key: tuple[str, str]) -> float | None:
        """Seconds of event time the resource has been held at its cap (to the newest window), when that
        is ``max_at_cap_seconds`` or more; None otherwise."""
        since = self.at_cap_since.get(key)
        if since is None or self.latest_window is None:
            return None
        seconds = (pd.Timestamp(self.latest_window) - since).total_seconds()
        return seconds if seconds >= self.max_at_cap_seconds else None

    def held_too_long(self, since: pd.Timestamp | None) -> bool:
        """Whether a limit held since ``since`` has been held longer than ``max_held_seconds`` of event time (up to
        the newest window)."""
        if since is None or self.latest_window is None:
            return False
        return (pd.Timestamp(self.latest_window) - since).total_seconds() > self.max_held_seconds


def _frame(lake: str, sql: str, columns: list[str]) -> pd.DataFrame:
    """``sql`` over the lake as pandas; an empty frame with ``columns`` when a table it reads does not exist."""
    try:
        return query.run_sql(lake, sql).to_pandas()
    except ValueError:
        return pd.DataFrame({c: [] for c in columns})


def _quoted(names) -> str:
    return ", ".join("'" + str(n).replace("'", "''") + "'" for n in sorted(set(names))) or "''"


def _count(lake: str, table: str) -> int:
    """Rows of ``table`` (a :mod:`pipelines.tables` name); 0 when it does not exist yet."""
    frame = _frame(lake, f"SELECT count(*) AS n FROM {sql_name(table)}", ["n"])
    return int(frame["n"].iloc[0]) if len(frame) else 0


def read_status(lake: str, now: dt.datetime | None = None) -> Status:
    """Read what the page needs from ``lake``.

    Raises:
        StatusError: no governor table exists under ``lake``.
    """
    if not Path(lake, "bronze").is_dir() and not Path(lake, "gold").is_dir():
        raise StatusError(f"no governor tables under {lake} (expected bronze/ and gold/; run the governor first)")
    now = now or dt.datetime.now(dt.timezone.utc)
    anomalies = _frame(
        lake,
        "SELECT window_start, window_end, resource_type, resource, anomaly, observed_tps, baseline_tps, severity "
        f"FROM {sql_name(tables.GOLD_ANOMALIES)} ORDER BY window_start",
        ["window_start", "window_end", "resource_type", "resource", "anomaly", "observed_tps", "baseline_tps",
         "severity"],
    )
    decisions = _frame(
        lake,
        "SELECT decided_at, window_end, resource_type, resource, limit_qps, action, mode, version, reason "
        f"FROM {sql_name(tables.GOLD_LIMITS)} ORDER BY window_end, version",
        ["decided_at", "window_end", "resource_type", "resource", "limit_qps", "action", "mode", "version", "reason"],
    )
    latest = _frame(lake, f"SELECT max(window_end) AS t FROM {sql_name(tables.GOLD_TOPIC_TPS)}", ["t"])
    cols = ["resource_type", "resource", "baseline_tps", "override_id", "probe_excess_messages", "at_cap_since"]
    newest_state = ("SELECT {} FROM (SELECT *, row_number() OVER (PARTITION BY resource_type, resource ORDER BY "
                    f"batch_id DESC) AS n FROM {sql_name(tables.STATE_POLICY)}) WHERE n = 1")
    try:
        state = _frame(lake, newest_state.format(", ".join(cols)), cols)
    except ValueError:  # a lake whose state/policy rows predate the probe's figure and the time at the cap
        cols = cols[:-2]
        state = _frame(lake, newest_state.format(", ".join(cols)), cols).assign(
            probe_excess_messages=float("nan"), at_cap_since=pd.NaT)
    newest = {(r.resource_type, r.resource): r for r in state.itertuples()}  # one row each: the newest
    try:
        overrides = query.run_sql(lake, f"SELECT * FROM {sql_name(tables.CONTROL_OVERRIDES)}").to_pylist()
    except ValueError:  # no override ever
        overrides = []
    return Status(
        lake=lake,
        now=now,
        limits_in_force=publish.read_published(lake),
        anomalies=anomalies,
        decisions=decisions,
        quarantine=_frame(
            lake, f"SELECT source, reason, count(*) AS n FROM {sql_name(tables.QUARANTINE)} "
            "GROUP BY source, reason ORDER BY n DESC",
            ["source", "reason", "n"],
        ),
        input_rows=_count(lake, tables.BRONZE_BROKER_STATS) + _count(lake, tables.BRONZE_SEND_FAILURES),
        latest_window=latest["t"].iloc[0] if len(latest) and pd.notna(latest["t"].iloc[0]) else None,
        overrides=override.describe(override.parse(overrides, GovernorConfig())[0], now),
        baselines={k: float(r.baseline_tps) for k, r in newest.items()
                   if not pd.isna(r.baseline_tps) and pd.isna(r.override_id)},  # an override is a person's decision
        probe_excess={k: float(r.probe_excess_messages) for k, r in newest.items()
                      if not pd.isna(r.probe_excess_messages)},
        at_cap_since={k: pd.Timestamp(r.at_cap_since) for k, r in newest.items()
                      if not pd.isna(r.at_cap_since) and pd.isna(r.override_id)},
    )


def _series(lake: str, resource_type: str, resource: str) -> dict[str, pd.DataFrame]:
    """TPS series of one resource: label -> frame(window_start, tps)."""
    name = _quoted([resource])
    cols = ["window_start", "tps"]
    if resource_type == "topic":
        return {"put TPS": _frame(lake, f"SELECT window_start, put_tps AS tps FROM {sql_name(tables.GOLD_TOPIC_TPS)} "
                                         f"WHERE topic = {name} ORDER BY window_start", cols)}
    if resource_type == "group":
        base = (f"FROM {sql_name(tables.GOLD_GROUP_TPS)} WHERE consumer_group = {name} "
                "GROUP BY window_start ORDER BY window_start")
        return {
            "consume TPS": _frame(lake, f"SELECT window_start, sum(consume_tps) AS tps {base}", cols),
            "retry TPS (sent back)": _frame(lake, f"SELECT window_start, sum(retry_tps) AS tps {base}", cols),
        }
    return {"broker put TPS": _frame(lake, f"SELECT window_start, put_tps AS tps FROM "
                                           f"{sql_name(tables.GOLD_BROKER_TPS)} WHERE broker = {name} "
                                           "ORDER BY window_start", cols)}


def _brokers_of(lake: str, topics: set[str], groups: set[str]) -> list[str]:
    """Brokers whose stats.log mentions one of the topics or consumer groups (``silver/broker_stats``)."""
    if not topics and not groups:
        return []
    frame = _frame(
        lake,
        f"SELECT DISTINCT broker FROM {sql_name(tables.SILVER_BROKER_STATS)} WHERE broker IS NOT NULL AND "
        f"(topic IN ({_quoted(topics)}) OR consumer_group IN ({_quoted(groups)})) ORDER BY broker",
        ["broker"],
    )
    return [str(b) for b in frame["broker"]]


def _around(frame: pd.DataFrame, lo, hi) -> pd.DataFrame:
    return frame[(frame["window_start"] >= lo) & (frame["window_start"] <= hi)] if len(frame) else frame


def add_figures(status: Status, margin_minutes: int = 30, max_resources: int = 24) -> Status:
    """Render the timeline, one TPS plot per limited or flagged resource (limited first, then by flagged
    windows) and per broker carrying one, and the quarantine plot; at most ``max_resources`` TPS plots (the
    others are listed in ``status.omitted``)."""
    anomalies, decisions, lake = status.anomalies, status.decisions, status.lake
    if len(anomalies) or len(decisions):
        status.figures.append(Figure("Timeline", plots.timeline(anomalies, decisions)))
    keys = pd.concat([anomalies[["resource_type", "resource"]], decisions[["resource_type", "resource"]]])
    limited = set(zip(decisions["resource_type"], decisions["resource"]))
    flagged_windows = anomalies.groupby(["resource_type", "resource"]).size().to_dict()
    resources = sorted(set(zip(keys["resource_type"], keys["resource"])),
                       key=lambda k: (k not in limited, -flagged_windows.get(k, 0), k))
    topics = {r for t, r in resources if t == "topic"} | {RETRY_TOPIC_PREFIX + r for t, r in resources if t == "group"}
    brokers = _brokers_of(lake, topics, {r for t, r in resources if t == "group"})
    resources += [("broker", b) for b in brokers if ("broker", b) not in resources]
    margin = pd.Timedelta(minutes=margin_minutes)
    for rtype, resource in resources:
        if len([f for f in status.figures if f.title.startswith("TPS")]) >= max_resources:
            status.omitted.append(f"{rtype} {resource}")
            continue
        mine_a = anomalies[(anomalies["resource_type"] == rtype) & (anomalies["resource"] == resource)]
        mine_d = decisions[(decisions["resource_type"] == rtype) & (decisions["resource"] == resource)]
        if rtype == "broker" and not len(mine_a):  # a carrying broker: show the decisions of what it carries
            mine_d = decisions.iloc[0:0]
        times = pd.concat([mine_a["window_start"], mine_a["window_end"], mine_d["window_end"]])
        if not len(times):
            times = pd.concat([anomalies["window_start"], decisions["window_end"]])
        lo, hi = times.min() - margin, times.max() + margin
        series = {label: _around(frame, lo, hi) for label, frame in _series(lake, rtype, resource).items()}
        why = ", ".join(sorted(set(mine_a["anomaly"]))) or "carries a flagged resource"
        limit_note = f"; {len(mine_d)} limit decisions" if len(mine_d) else ""
        status.figures.append(
            Figure(f"TPS {rtype} {resource}",
                   plots.tps(f"{rtype} {resource}: {why}{limit_note}", series, mine_a, mine_d),
                   f"{lo:%H:%M}–{hi:%H:%M} UTC, {margin_minutes} min either side of its anomalies and decisions")
        )
    if len(status.quarantine):
        status.figures.append(Figure("Quarantine", plots.quarantine(status.quarantine)))
    return status


def _img(figure: Figure) -> str:
    data = base64.b64encode(figure.png).decode("ascii")
    caption = f'<div class="muted">{html.escape(figure.caption)}</div>' if figure.caption else ""
    return f'{caption}<img alt="{html.escape(figure.title)}" src="data:image/png;base64,{data}">'


def _limits_table(status: Status) -> str:
    if not status.limits_in_force:
        return "<p>No limits in force (<code>control/limits.json</code> is empty or missing).</p>"
    rows = []
    for rec in sorted(status.limits_in_force, key=lambda r: (r.get("resource_type", ""), r.get("resource", ""))):
        expires = pd.Timestamp(rec.get("expires_at")) if rec.get("expires_at") else None
        expired = expires is not None and expires < pd.Timestamp(status.now)
        since = status.held_since(rec.get("resource_type"), rec.get("resource"))
        too_long = status.held_too_long(since)
        held = "" if since is None else f"{since:%Y-%m-%d %H:%M}"
        if too_long:
            held += f" (held over {status.max_held_seconds // 60} min: look at it)"
        floor = normal_floor(rec.get("resource_type"), status.baselines.get(
            (rec.get("resource_type"), rec.get("resource"))), status.normal_headroom)
        under = rec.get("mode") == "enforce" and floor is not None and float(rec.get("limit_qps", 0)) < floor
        if under:
            held += f" (under its normal floor, {floor:.1f} msg/s: no probe lifts it; exempt it once it is fixed)"
        key = (rec.get("resource_type"), rec.get("resource"))
        at_cap = status.at_cap_for(key)
        if at_cap is not None:
            held += (f" (at its cap for {at_cap / 60:.0f} min: a cause still on, or legitimate demand above the cap; "
                     "ask its owner)")
        excess = status.probe_excess.get((rec.get("resource_type"), rec.get("resource")))
        if excess is not None:
            held += f" (its last probe admitted {excess:,.0f} messages beyond the level before it)"
        shares = rec.get("brokers") or {}
        split = ", ".join(f"{b} {float(v['limit_qps']):.1f}" for b, v in sorted(shares.items()) if b != "*")
        cells = [rec.get("resource_type"), rec.get("resource"), f"{float(rec.get('limit_qps', 0)):.1f}", split,
                 rec.get("burst"), rec.get("mode"), rec.get("version"), held,
                 f"{rec.get('expires_at')}{' (expired: brokers fell back to their default)' if expired else ''}"]
        tds = "".join(f"<td>{html.escape(str(c))}</td>" for c in cells)
        css = " ".join(c for c, on in (("expired", expired), ("held-long", too_long), ("under-normal", under),
                                       ("at-cap", at_cap is not None)) if on)
        rows.append(f'<tr class="{css}">{tds}'
                    f'<td class="reason">{html.escape(str(rec.get("reason", "")))}</td></tr>')
    head = "".join(f"<th>{h}</th>" for h in ("type", "resource", "limit msg/s (cluster)", "per broker msg/s",
                                             "burst", "mode", "version", "held since (UTC)", "expires (UTC)",
                                             "reason"))
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _overrides_table(status: Status) -> str:
    if not status.overrides:
        return ("<p>None in force or ended in the last 24 hours (<code>python -m pipelines.ops.override list</code>, "
                "docs/operators.md §9).</p>")
    heads = list(status.overrides[0])
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(r[h])}</td>" for h in heads) + "</tr>" for r in status.overrides)
    return f"<table><tr>{''.join(f'<th>{h}</th>' for h in heads)}</tr>{rows}</table>"


def _data_docs(lake: str) -> str:
    index = Path(lake, DOCS_SUBDIR, "index.html")
    if index.is_file():
        return f'<p><a href="{index.resolve().as_uri()}">Data Docs</a> (GX validation results per micro-batch).</p>'
    return ("<p>Data Docs not built yet: <code>python -m pipelines.dataplane.quality docs --lake "
            f"{html.escape(lake)}</code> writes them to <code>{html.escape(str(Path(lake, DOCS_SUBDIR)))}</code>.</p>")


def render(status: Status) -> str:
    """The HTML page of ``status`` (figures already added)."""
    by_title = {f.title: f for f in status.figures}
    tps_figures = [f for f in status.figures if f.title.startswith("TPS")]
    latest = f"{status.latest_window:%Y-%m-%d %H:%M} UTC" if status.latest_window is not None else "none yet"
    quarantined = int(status.quarantine["n"].sum()) if len(status.quarantine) else 0
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>rate-governor status</title>"
        f"<style>{STYLE}</style></head><body>",
        "<h1>rate-governor status</h1>",
        f"<p class='muted'>Lake <code>{html.escape(status.lake)}</code>, page written "
        f"{status.now:%Y-%m-%d %H:%M:%S} UTC. Input records: {status.input_rows:,}; newest window: {latest}; "
        f"anomaly windows: {len(status.anomalies):,}; limit decisions: {len(status.decisions):,}; "
        f"quarantined: {quarantined:,}.</p>",
        f"<p class='note'><b>Input.</b> {html.escape(status.input_note)}</p>" if status.input_note else "",
        "<h2>Limits in force</h2>",
        _limits_table(status),
        "<h2>Operators' overrides</h2>",
        _overrides_table(status),
        "<h2>Anomalies and decisions over time</h2>",
        _img(by_title["Timeline"]) if "Timeline" in by_title else "<p>No anomaly and no decision so far.</p>",
        "<h2>TPS of limited and flagged resources</h2>",
        "".join(_img(f) for f in tps_figures) or "<p>No resource limited or flagged.</p>",
    ]
    if status.omitted:
        parts.append(f"<p class='muted'>Not drawn (over the plot limit): {html.escape(', '.join(status.omitted))}</p>")
    if status.closed_loop is not None:
        parts += [f"<h2>{html.escape(status.closed_loop.title)}</h2>", _img(status.closed_loop)]
    parts += [
        "<h2>Quarantine</h2>",
        _img(by_title["Quarantine"]) if "Quarantine" in by_title else "<p>No record quarantined.</p>",
        "<h2>Data quality</h2>",
        _data_docs(status.lake),
        IMAGE_CHECK_SCRIPT,
        "</body></html>",
    ]
    return "\n".join(parts)


def write_page(lake: str, out: str | Path | None = None, *, now: dt.datetime | None = None,
               margin_minutes: int = 30, max_resources: int = 24,
               max_held_seconds: int = LimitsConfig().max_held_seconds, input_note: str = "",
               closed_loop: Figure | None = None,
               normal_headroom: float = LimitsConfig().surge_squeeze_headroom) -> Path:
    """Read ``lake``, render the page and write ``<out>/index.html`` (default ``<lake>/status``); returns its path.
    ``input_note``: what the input was, at the top of the page; ``closed_loop``: a figure of the same input in
    closed loop, drawn after the lake's TPS figures; ``normal_headroom``: ``limits.surge_squeeze_headroom``.

    Raises:
        StatusError: nothing to show under ``lake``.
    """
    status = read_status(lake, now)
    status.max_held_seconds, status.normal_headroom = max_held_seconds, normal_headroom
    status.input_note, status.closed_loop = input_note, closed_loop
    status = add_figures(status, margin_minutes, max_resources)
    out_dir = Path(out) if out else Path(lake) / STATUS_SUBDIR
    out_dir.mkdir(parents=True, exist_ok=True)
    page = out_dir / "index.html"
    page.write_text(render(status), encoding="utf-8")
    return page


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m pipelines.ops.status", description=__doc__.splitlines()[0])
    parser.add_argument("--lake", required=True, help="lake directory the governor writes")
    parser.add_argument("--out", help="output directory (default: <lake>/status)")
    parser.add_argument("--max-held-seconds", type=int, default=LimitsConfig().max_held_seconds,
                        help="flag limits held longer than this (event time; limits.max_held_seconds)")
    parser.add_argument("--normal-headroom", type=float, default=LimitsConfig().surge_squeeze_headroom,
                        help="flag enforced topic limits under this x their baseline (limits.surge_squeeze_headroom)")
    parser.add_argument("--margin-minutes", type=int, default=30, help="TPS plots: minutes around events (30)")
    parser.add_argument("--max-resources", type=int, default=24, help="TPS plots: at most this many (24)")
    args = parser.parse_args(argv)
    if args.normal_headroom < 1:
        return fail("rate-governor status", f"--normal-headroom {args.normal_headroom:g}: want at least 1")
    try:
        page = write_page(args.lake, args.out, margin_minutes=args.margin_minutes, max_resources=args.max_resources,
                          max_held_seconds=args.max_held_seconds, normal_headroom=args.normal_headroom)
    except StatusError as exc:
        return fail("rate-governor status", exc)
    print(f"status page: {page.resolve().as_uri()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
