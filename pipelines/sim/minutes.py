"""A scenario cut into the files that land minute by minute, as a live cluster delivers them (for the latency
benchmark and the tests that feed the governor incrementally)."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import pandas as pd

from pipelines.sim.failures import FAILURE_COLUMNS
from pipelines.sim.scenarios import build_send_failures
from pipelines.sim.render import render_stats_lines
from pipelines.sim.spec import ScenarioSpec
from pipelines.sim.traffic import build_traffic

def minute_files(spec: ScenarioSpec) -> list[list[tuple[str, str]]]:
    """Per simulated minute ``m``: (relative path, text) of the files that land at that minute: each broker's
    stats lines printed at the end of minute ``m`` (stamped in GMT+8, docs/rocketmq-formats.md §1), and the send
    failures of minute ``m - 1`` (shipped within the next minute)."""
    traffic = build_traffic(spec)
    failures = build_send_failures(spec, traffic)
    per_minute = {m + 1: files for m, files in stats_files(spec, traffic).items()}
    failures = failures.assign(minute=((failures["event_time"] - spec.start_utc).dt.total_seconds() // 60).astype(int))
    for m, block in failures.groupby("minute"):
        per_minute.setdefault(int(m) + 1, []).append((f"send_failures/m{m:04d}.jsonl", failure_text(block)))
    return [per_minute.get(m, []) for m in range(max(per_minute) + 1)]


def stats_files(spec: ScenarioSpec, traffic: pd.DataFrame, minutes: set[int] | None = None
                ) -> dict[int, list[tuple[str, str]]]:
    """Per index ``m`` of the minute the lines cover (only ``minutes`` when given): (relative path, text) of each
    broker's stats.log lines printed at its end (:func:`pipelines.sim.render.render_stats_lines`, stamped in GMT+8,
    docs/rocketmq-formats.md §1), in ``broker_stats/<broker>/m<stamp index>.log``."""
    lines = render_stats_lines(spec, traffic)
    per_minute: dict[int, list[tuple[str, str]]] = {}
    for broker, group in lines.groupby("broker", observed=True):
        stamps = group["line"].str.slice(0, 16)
        for stamp, block in group.groupby(stamps):
            local = dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M").replace(tzinfo=dt.timezone.utc)
            printed = int((local - dt.timedelta(hours=spec.gmt_offset_hours) - spec.start_utc).total_seconds() // 60)
            if minutes is None or printed - 1 in minutes:
                per_minute.setdefault(printed - 1, []).append((f"broker_stats/{broker}/m{printed:04d}.log",
                                                               "\n".join(block["line"]) + "\n"))
    return per_minute


def failure_text(failures: pd.DataFrame) -> str:
    """Send failures (:data:`pipelines.sim.failures.FAILURE_COLUMNS`) as JSON lines (docs/contracts.md §1.2)."""
    return "".join(json.dumps({k: (None if v != v else v) for k, v in row.items()}) + "\n"
                   for row in failures[list(FAILURE_COLUMNS)].to_dict("records"))


def land(root: Path, files: list[tuple[str, str]]) -> None:
    """Write ``files`` under the landing directory ``root`` as a shipper does: to a dot file (ignored by Spark's
    file source), then renamed into place."""
    for rel, text in files:
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        hidden = target.with_name("." + target.name)
        hidden.write_text(text)
        os.replace(hidden, target)
