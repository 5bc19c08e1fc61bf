"""The landing directory's text (``docs/rocketmq-formats.md`` §1-2, §8): stats.log lines, their log-shipper JSON
envelopes, and the send-failure JSON lines; :func:`render_landing` generates a scenario and writes it.

``%d{yyy-MM-dd HH:mm:ss,GMT+8} %p - %m%n``: the stamp is UTC + ``gmt_offset_hours`` (8), second precision.
A minute line stamped T covers the minute [T − 60 s, T), i.e. ``stamp = minute_start + 1 min``. Formats are
``String.format("SUM: %d TPS: %.2f AVGPT: %.2f")`` with TPS = SUM / 60 s (Java rounds half-up; values are nudged by
1e-12 relative so that exact binary ties round like Java), ``TIMES: %d AVGRT: %.2f`` and ``Value: %d``.
At each hour boundary ``Stats In One Hour,`` lines for ``TOPIC_PUT_NUMS`` (window: the last 60 minutes the broker
has been up; TPS: NaN when it has been up < 10 minutes, the hour list then holding one snapshot); at midnight GMT+8
``Stats In One Day,`` lines (NaN when up < 60 minutes). Lines of one stamp are shuffled (hash-map order, hour/day
lines interleaved with that minute's lines); stamps are in time order.

Layout (``docs/contracts.md`` §1)::

    DIR/broker_stats/<broker>/stats.log          raw stats.log lines (the folder names the broker)
    DIR/broker_stats/shipper/<broker>.jsonl      the same lines in log-shipper JSON envelopes, for a share of brokers
    DIR/send_failures/failures-<broker>.jsonl    one failed send per JSON line (§1.2 fields)
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

from pipelines.sim.failures import FAILURE_COLUMNS
from pipelines.sim.scenarios import build_send_failures
from pipelines.sim.spec import MINUTE, PERIOD_TEXT, STYLE_SUM, STYLE_TIMES, Incident, ScenarioSpec, rng_streams
from pipelines.sim.traffic import as_object, build_period_rows, build_traffic, minute_index

_JAVA_HALF_UP = 1.0 + 1e-12  # relative nudge so that exact binary ties round half-up like java.util.Formatter


def _fmt2(values: np.ndarray) -> list[str]:
    """Java ``%.2f`` (half-up; NaN → ``NaN``)."""
    return ["NaN" if v != v else "%.2f" % v for v in (values * _JAVA_HALF_UP).tolist()]


def _line_table(spec: ScenarioSpec, traffic: pd.DataFrame) -> dict[str, np.ndarray]:
    """Model rows plus hour/day rows as arrays in file order: broker, stamp, then shuffled (hash-map order)."""
    periods = build_period_rows(spec, traffic)
    parts = [traffic] + ([periods] if len(periods) else [])
    broker_order = {b: i for i, b in enumerate(spec.broker_names)}
    cols: dict[str, np.ndarray] = {}
    for name, get in (
        ("m", lambda f: minute_index(spec, f["minute_start"])),
        ("broker", lambda f: as_object(f["broker"])),
        ("stat", lambda f: as_object(f["stat_name"])),
        ("key", lambda f: as_object(f["stats_key"])),
        ("period", lambda f: as_object(f["period"].map(PERIOD_TEXT))),
        ("style", lambda f: as_object(f["style"])),
        ("sum", lambda f: f["sum"].to_numpy(dtype=np.int64)),
        ("times", lambda f: f["times"].to_numpy(dtype=np.int64)),
        ("tps", lambda f: f["tps"].to_numpy(dtype=float)),
        ("avgpt", lambda f: f["avgpt"].to_numpy(dtype=float)),
    ):
        cols[name] = np.concatenate([get(f) for f in parts])
    b_code = pd.Series(cols["broker"]).map(broker_order).to_numpy(dtype=np.int64)
    shuffle = rng_streams(spec.seed)["render"].random(cols["m"].size)
    order = np.lexsort((shuffle, cols["m"], b_code))
    return {k: v[order] for k, v in cols.items()}


def _format_lines(spec: ScenarioSpec, table: Mapping[str, np.ndarray], lo: int, hi: int) -> list[str]:
    """stats.log text of rows ``lo:hi`` of a line table (docs/rocketmq-formats.md §1-2)."""
    stamp_text = np.array((pd.date_range(spec.start_utc, periods=spec.minutes, freq="min") + MINUTE
                           + pd.Timedelta(hours=spec.gmt_offset_hours)).strftime("%Y-%m-%d %H:%M:%S"), dtype=object)
    sl = slice(lo, hi)
    stamp = stamp_text[table["m"][sl]]
    tps, avg = _fmt2(table["tps"][sl]), _fmt2(table["avgpt"][sl])
    sums, times = table["sum"][sl].tolist(), table["times"][sl].tolist()
    return [
        f"{st} INFO - [{sn}] [{k}] {p}, " + (
            f"SUM: {s} TPS: {t} AVGPT: {a}" if sy == STYLE_SUM else
            f"TIMES: {n} AVGRT: {a}" if sy == STYLE_TIMES else f"Value: {s}")
        for st, sn, k, p, sy, s, t, a, n in zip(stamp, table["stat"][sl], table["key"][sl], table["period"][sl],
                                                table["style"][sl], sums, tps, avg, times)
    ]


def iter_broker_lines(spec: ScenarioSpec, traffic: pd.DataFrame) -> Iterator[tuple[str, list[str]]]:
    """(broker, its stats.log lines in file order), one broker at a time (bounded memory for big clusters)."""
    table = _line_table(spec, traffic)
    brokers = table["broker"]
    bounds = (np.flatnonzero(brokers[1:] != brokers[:-1]) + 1).tolist()
    for lo, hi in zip([0] + bounds, bounds + [brokers.size]):
        if hi > lo:
            yield str(brokers[lo]), _format_lines(spec, table, lo, hi)


def render_stats_lines(spec: ScenarioSpec, traffic: pd.DataFrame) -> pd.DataFrame:
    """Every stats.log line, columns ``broker`` and ``line``, ordered by broker, then stamp; lines of one stamp
    shuffled (hash-map order), hour/day lines (:func:`build_period_rows`) interleaved with that minute's lines."""
    brokers: list[str] = []
    lines: list[str] = []
    for broker, chunk in iter_broker_lines(spec, traffic):
        brokers.extend([broker] * len(chunk))
        lines.extend(chunk)
    return pd.DataFrame({"broker": brokers, "line": lines})


def envelope_brokers(spec: ScenarioSpec) -> list[str]:
    """The brokers whose lines ship in JSON envelopes: the last round(share × brokers) ones (broker-c of 3)."""
    n = int(math.floor(spec.envelope_share * spec.brokers + 0.5))
    return spec.broker_names[spec.brokers - n:] if n else []


def _failure_json(row: tuple) -> str:
    ts, topic, broker, group, client, code, message, latency = row
    return json.dumps({
        "ts": ts, "topic": topic, "broker": broker, "producer_group": group, "client": client,
        "code": None if code is pd.NA or code is None else int(code), "message": message,
        "latency_ms": None if latency is None else int(latency),
    })


def _write_atomic(path: Path, lines: Sequence[str]) -> None:
    """Write the whole file under a hidden temporary name (ignored by Spark's file source), then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
        if lines:
            fh.write("\n".join(lines))
            fh.write("\n")
    os.replace(tmp, path)


def render_landing(spec: ScenarioSpec, out_dir: str | os.PathLike[str]) -> dict[str, object]:
    """Generate the scenario and write it under ``out_dir`` (docs/contracts.md §1). Returns ``{"stats_lines",
    "failure_lines", "files", "onset" (UTC datetime or None), "culprit_group" (str or None), "paths" (list of written
    files)}``."""
    out = Path(out_dir)
    traffic = build_traffic(spec)
    failures = build_send_failures(spec, traffic)
    enveloped = set(envelope_brokers(spec))
    paths: list[Path] = []
    stats_lines = 0
    cluster = json.dumps(spec.cluster)
    for broker, chunk in iter_broker_lines(spec, traffic):
        stats_lines += len(chunk)
        if broker in enveloped:
            path = out / "broker_stats" / "shipper" / f"{broker}.jsonl"
            head = f'{{"broker": {json.dumps(broker)}, "cluster": {cluster}, "line": '
            chunk = [f"{head}{json.dumps(x)}}}" for x in chunk]
        else:
            path = out / "broker_stats" / broker / "stats.log"
        _write_atomic(path, chunk)
        paths.append(path)
    for broker in spec.broker_names:
        sel = failures[failures["broker"] == broker]
        path = out / "send_failures" / f"failures-{broker}.jsonl"
        _write_atomic(path, [_failure_json(r) for r in sel[list(FAILURE_COLUMNS)].itertuples(index=False)])
        paths.append(path)
    incident: Incident | None = traffic.attrs.get("incident")
    return {
        "stats_lines": stats_lines,
        "failure_lines": len(failures),
        "files": len(paths),
        "onset": incident.onset if incident else None,
        "culprit_group": incident.culprit_group if incident else None,
        "paths": [str(p) for p in paths],
    }
