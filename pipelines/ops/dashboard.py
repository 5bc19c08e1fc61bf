"""The Grafana dashboard's panels drawn without Grafana: each panel's PromQL of ``conf/grafana/rate-governor.json``
asked from a running Prometheus (``/api/v1/query_range``) and drawn with matplotlib, one PNG (docs/metrics.md §5).

The panels, their queries, legends and units are read from the dashboard's JSON, so the picture and the dashboard
cannot drift apart. Grafana's ``$__rate_interval`` is replaced by ``rate_interval``; ``{{label}}`` in a legend by the
series' label; a panel whose unit is a Grafana date unit gets a time axis in UTC.

Usage:
    python -m pipelines.ops.dashboard --prometheus http://127.0.0.1:9090 --minutes 30 --out dashboard.png

Raises (CLI: exit 2 with one line): :class:`DashboardError` when Prometheus cannot be asked or refuses a query.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless

import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

DASHBOARD = Path(__file__).resolve().parents[2] / "conf" / "grafana" / "rate-governor.json"
_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")


class DashboardError(Exception):
    """Prometheus could not be asked, or refused a query (the message says which)."""


@dataclass(frozen=True)
class Panel:
    """One panel of the dashboard: its title, Grafana unit and (PromQL, legend format) targets."""

    title: str
    unit: str
    targets: tuple[tuple[str, str], ...]


def panels(dashboard: Path = DASHBOARD) -> list[Panel]:
    """The dashboard's panels in its order (top to bottom, left to right)."""
    model = json.loads(Path(dashboard).read_text(encoding="utf-8"))
    ordered = sorted(model["panels"], key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"]))
    return [Panel(p["title"], p.get("fieldConfig", {}).get("defaults", {}).get("unit", ""),
                  tuple((t["expr"], t.get("legendFormat", "")) for t in p["targets"])) for p in ordered]


def query_range(prometheus: str, expr: str, start: dt.datetime, end: dt.datetime,
                step_seconds: float) -> list[tuple[dict, list[tuple[float, float]]]]:
    """``/api/v1/query_range`` of ``expr``: (labels, [(Unix seconds, value)]) per series.

    Raises:
        DashboardError: unreachable, or an error answer (a bad expression)."""
    params = urllib.parse.urlencode({"query": expr, "start": start.timestamp(), "end": end.timestamp(),
                                     "step": f"{step_seconds:g}s"})
    try:
        with urllib.request.urlopen(f"{prometheus.rstrip('/')}/api/v1/query_range?{params}", timeout=30) as answer:
            body = json.load(answer)
    except urllib.error.HTTPError as exc:
        raise DashboardError(f"Prometheus refused {expr!r}: {exc.read().decode(errors='replace')[:300]}") from None
    except OSError as exc:
        raise DashboardError(f"cannot ask Prometheus at {prometheus}: {exc}") from None
    return [(r["metric"], [(float(t), float(v)) for t, v in r["values"]]) for r in body["data"]["result"]]


def legend(fmt: str, labels: dict, expr: str) -> str:
    """Grafana's legend format: ``{{label}}`` → the series' value of it (the expression when no format)."""
    return _LEGEND.sub(lambda m: labels.get(m.group(1), ""), fmt) if fmt else expr


def render(prometheus: str, start: dt.datetime, end: dt.datetime, out: Path, *, dashboard: Path = DASHBOARD,
           rate_interval: str = "1m", step_seconds: float | None = None) -> dict[str, int]:
    """Draw every panel of ``dashboard`` from ``prometheus`` between ``start`` and ``end`` (UTC) into the PNG
    ``out``; returns the number of series drawn per panel title (0: the panel had no data)."""
    found = panels(dashboard)
    step = step_seconds or max(1.0, (end - start).total_seconds() / 300)
    cols = 2
    rows = math.ceil(len(found) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(7.5 * cols, 3.2 * rows), squeeze=False)
    drawn: dict[str, int] = {}
    try:
        for ax, panel in zip(axes.flat, found):
            drawn[panel.title] = 0
            for expr, fmt in panel.targets:
                for labels, points in query_range(prometheus, expr.replace("$__rate_interval", rate_interval), start,
                                                  end, step):
                    times = [dt.datetime.fromtimestamp(t, dt.timezone.utc) for t, _ in points]
                    values = [v for _, v in points]
                    if panel.unit.startswith("dateTime"):
                        values = [mdates.date2num(dt.datetime.fromtimestamp(v / 1000, dt.timezone.utc)) for v in values]
                    style = "--" if fmt.endswith("trigger") else "-"
                    width = max(1.0, 2.6 - 0.4 * drawn[panel.title])  # later lines thinner: equal ones stay seen
                    ax.step(times, values, style, where="post", linewidth=width, label=legend(fmt, labels, expr))
                    drawn[panel.title] += 1
            ax.set_title(panel.title, fontsize=10, loc="left")
            unit = panel.unit.removeprefix("suffix: ").replace("short", "").replace("dateTimeAsIso", "")
            ax.set_ylabel(unit, fontsize=8)
            ax.set_xlim(start, end)  # every panel over the same time range, as Grafana draws them
            locator = mdates.AutoDateLocator(tz=dt.timezone.utc)
            ax.xaxis.set_major_locator(locator)
            ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=dt.timezone.utc))
            if panel.unit.startswith("dateTime"):
                ax.yaxis.set_major_formatter(mdates.DateFormatter("%H:%M", tz=dt.timezone.utc))
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
            if drawn[panel.title]:
                ax.legend(fontsize=7, loc="upper left")
            else:
                ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")
        for ax in list(axes.flat)[len(found):]:
            ax.axis("off")
        fig.suptitle(f"rate-governor, {start:%Y-%m-%d %H:%M}-{end:%H:%M} UTC (conf/grafana/rate-governor.json)",
                     fontsize=11)
        fig.tight_layout()
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=110)
    finally:
        plt.close(fig)
    return drawn


def main(argv: list[str] | None = None) -> int:
    from pipelines.cli import OneLineParser, fail

    parser = OneLineParser(prog="python -m pipelines.ops.dashboard",
                           description="Draw the Grafana dashboard's panels from a Prometheus into a PNG.")
    parser.add_argument("--prometheus", required=True, help="Prometheus base URL, e.g. http://127.0.0.1:9090")
    parser.add_argument("--minutes", type=float, default=60.0, help="the last N minutes (default 60)")
    parser.add_argument("--out", required=True, help="PNG to write")
    parser.add_argument("--dashboard", default=str(DASHBOARD), help="Grafana dashboard JSON")
    parser.add_argument("--rate-interval", default="1m", help="what $__rate_interval stands for (default 1m)")
    args = parser.parse_args(argv)
    end = dt.datetime.now(dt.timezone.utc)
    try:
        drawn = render(args.prometheus, end - dt.timedelta(minutes=args.minutes), end, Path(args.out),
                       dashboard=Path(args.dashboard), rate_interval=args.rate_interval)
    except DashboardError as exc:
        return fail(parser.prog, exc)
    print(f"{args.out}: " + ", ".join(f"{title}: {n}" for title, n in drawn.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
