"""The continuous governor (processing-time trigger, not ``--once``) driven from a test: ``governor.run(once=False)``
in a thread of the test session's Spark, minute files landed one at a time, waits on the queries' own progress.

Also small builders of stats minutes and send failures with exact numbers, for scenarios the generator does not
make (a broker that joins mid-incident, a storm that stops)."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from pathlib import Path

from deltalake import DeltaTable

from pipelines import governor
from pipelines.config import GovernorConfig, load_config
from pipelines.sim.minutes import land
from tests.helpers import stats_line, write_config

#: First minute of the hand-made scenarios (UTC); RocketMQ stamps its lines in GMT+8.
T0 = dt.datetime(2026, 11, 22, 8, 0)
GMT8 = dt.timedelta(hours=8)


def setup(tmp_path_factory, name: str, **settings) -> tuple[Path, Path, Path, GovernorConfig]:
    """A fresh landing zone and lake under a temporary directory ``name``, and the continuous governor's config as
    these tests run it (no data-quality validation, a 2 s trigger, a 60 s watermark, then ``settings``, dotted keys):
    (landing, lake, the config file, the config with those paths)."""
    tmp = tmp_path_factory.mktemp(name)
    landing, lake = tmp / "landing", tmp / "lake"
    (landing / "send_failures").mkdir(parents=True)
    conf = write_config(tmp / f"{name}.toml", **{"quality.validate_every_n_batches": 0, "windows.trigger_seconds": 2,
                                                 "windows.watermark_seconds": 60, **settings})
    return landing, lake, conf, load_config(conf).with_paths(str(landing), str(lake))


def published(lake: Path) -> dict[str, dict]:
    """``control/limits.json``'s records by resource (empty before the first publish)."""
    path = lake / "control" / "limits.json"
    return {r["resource"]: r for r in json.loads(path.read_text())["records"]} if path.exists() else {}


def rows(lake: Path, table: str) -> list[dict]:
    """A Delta table of the lake as rows (empty before its first commit)."""
    path = lake / table
    return DeltaTable(str(path)).to_pyarrow_table().to_pylist() if (path / "_delta_log").is_dir() else []


def stats_minute(broker: str, minute: int, puts: dict[str, float] | None = None,
                 groups: dict[tuple[str, str], tuple[float, float]] | None = None) -> tuple[str, str]:
    """The stats.log lines a broker prints at the end of ``minute`` (index from :data:`T0`), as one landing file:
    ``puts`` topic → put TPS; ``groups`` (topic, group) → (consume TPS, retry TPS). SUM = TPS × 60."""
    stamp = f"{T0 + dt.timedelta(minutes=minute + 1) + GMT8:%Y-%m-%d %H:%M:%S}"

    def line(stat: str, key: str, tps: float) -> str:
        return stats_line(stamp, stat, key, f"SUM: {round(tps * 60)} TPS: {tps:.2f} AVGPT: 1.00")

    lines = [line("TOPIC_PUT_NUMS", topic, tps) for topic, tps in (puts or {}).items()]
    for (topic, group), (consume, retry) in (groups or {}).items():
        lines.append(line("GROUP_GET_NUMS", f"{topic}@{group}", consume))
        lines.append(line("SNDBCK_PUT_NUMS", f"{topic}@{group}", retry))
        lines.append(line("TOPIC_PUT_NUMS", f"%RETRY%{group}", retry))
    return f"broker_stats/{broker}/m{minute:04d}.log", "\n".join(lines) + "\n"


def busy_failures(broker: str, minute: int, topic: str, count: int) -> tuple[str, str]:
    """``count`` producer send failures ``[TIMEOUT_CLEAN_QUEUE]broker busy`` (code 2) of ``topic`` on ``broker`` in
    ``minute``, as one send_failures file."""
    at_ms = int((T0 + dt.timedelta(minutes=minute, seconds=1)).replace(tzinfo=dt.timezone.utc).timestamp() * 1000)
    rows = [{"ts": at_ms + 40 * i, "topic": topic,
             "broker": broker, "producer_group": "p", "client": "10.0.0.9@1", "code": 2, "latency_ms": 210,
             "message": "CODE: 2, DESC: [TIMEOUT_CLEAN_QUEUE]broker busy, start flow control for a while, period in "
                        "queue: 205ms, size of queue: 120"} for i in range(count)]
    return f"send_failures/{broker}-m{minute:04d}.jsonl", "".join(json.dumps(r) + "\n" for r in rows)


class ContinuousGovernor:
    """``governor.run(spark, cfg, once=False)`` in a daemon thread; a context manager that stops every query on
    exit and re-raises what the run raised."""

    def __init__(self, spark, cfg, *, queries: int = 3) -> None:
        self.spark, self.cfg, self.expected = spark, cfg, queries
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "ContinuousGovernor":
        self.spark.streams.resetTerminated()  # awaitAnyTermination would return at once after an earlier run

        def target() -> None:
            try:
                governor.run(self.spark, self.cfg, once=False)
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                self.error = exc

        self._thread = threading.Thread(target=target, name="continuous-governor", daemon=True)
        self._thread.start()
        self.wait(lambda: len(self.active()) == self.expected, 120, "the queries to start")
        return self

    def __exit__(self, *exc) -> None:
        for query in self.spark.streams.active:
            query.stop()
        self._thread.join(timeout=60)
        if self.error is not None and exc[0] is None:
            raise self.error

    def active(self) -> dict[str, object]:
        return {q.name.removeprefix("rate-governor-"): q for q in self.spark.streams.active}

    def running(self) -> bool:
        """Every query still active, the run still going."""
        return self._thread.is_alive() and len(self.active()) == self.expected and self.error is None

    def wait(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            if self.error is not None:
                raise AssertionError(f"the governor stopped before {what}: {self.error}") from self.error
            time.sleep(0.2)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")

    def batches_with_input(self, query: str) -> int:
        """Micro-batches of ``query`` with input rows so far (Spark's progress of the query)."""
        q = self.active().get(query)
        return 0 if q is None else sum(1 for p in q.recentProgress if p.get("numInputRows", 0) > 0)

    def land(self, landing: Path, files: list[tuple[str, str]], until=None, what: str = "a gold micro-batch",
             timeout: float = 240) -> None:
        """Land ``files``, then wait until ``until()`` is true (default: the gold query finished a micro-batch with
        input; the windows it finalizes are emitted by the micro-batch after it)."""
        before = self.batches_with_input("gold")
        land(landing, files)
        self.wait(until or (lambda: self.batches_with_input("gold") > before), timeout, what)
