"""A scenario cut into the files that land minute by minute, as a live cluster delivers them (for the latency
benchmark and the tests that feed the governor incrementally)."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

from pipelines.sim.failures import build_send_failures
from pipelines.sim.render import render_stats_lines
from pipelines.sim.spec import ScenarioSpec
from pipelines.sim.traffic import build_traffic

FAILURE_FIELDS = ("ts", "topic", "broker", "producer_group", "client", "code", "message", "latency_ms")


def minute_files(spec: ScenarioSpec) -> list[list[tuple[str, str]]]:
    """Per simulated minute ``m``: (relative path, text) of the files that land at that minute: each broker's
    stats lines printed at the end of minute ``m`` (stamped in GMT+8, docs/rocketmq-formats.md §1), and the send
    failures of minute ``m - 1`` (shipped within the next minute)."""
    traffic = build_traffic(spec)
    lines = render_stats_lines(spec, traffic)
    failures = build_send_failures(spec, traffic)
    per_minute: dict[int, list[tuple[str, str]]] = {}
    for broker, group in lines.groupby("broker", observed=True):
        stamps = group["line"].str.slice(0, 16)
        for stamp, block in group.groupby(stamps):
            local = dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M").replace(tzinfo=dt.timezone.utc)
            m = int((local - dt.timedelta(hours=spec.gmt_offset_hours) - spec.start_utc).total_seconds() // 60)
            per_minute.setdefault(m, []).append((f"broker_stats/{broker}/m{m:04d}.log", "\n".join(block["line"]) + "\n"))
    failures = failures.assign(minute=((failures["event_time"] - spec.start_utc).dt.total_seconds() // 60).astype(int))
    for m, block in failures.groupby("minute"):
        text = "".join(json.dumps({k: (None if v != v else v) for k, v in row.items()}) + "\n"
                       for row in block[list(FAILURE_FIELDS)].to_dict("records"))
        per_minute.setdefault(int(m) + 1, []).append((f"send_failures/m{m:04d}.jsonl", text))
    return [per_minute.get(m, []) for m in range(max(per_minute) + 1)]


def land(root: Path, files: list[tuple[str, str]]) -> None:
    """Write ``files`` under the landing directory ``root`` as a shipper does: to a dot file (ignored by Spark's
    file source), then renamed into place."""
    for rel, text in files:
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        hidden = target.with_name("." + target.name)
        hidden.write_text(text)
        os.replace(hidden, target)
