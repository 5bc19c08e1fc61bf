"""The write-back sinks besides ``control/limits.json``: one decision stream, one record shape, failing soft.

Every sink takes the same control records (docs/contracts.md §3) that :mod:`pipelines.writeback.publish` writes to
``<lake>/control/limits.json`` and pushes the *changes* between two sets of them to its transport.

A sink that is down must not stop the governor (limits would then expire and the control plane be gone until a
person restarts it). :class:`SinkSet` is what the gold micro-batch calls: per sink it

* diffs the current records against the set that sink last *delivered* (``<lake>/control/sinks/<name>.json``,
  replaced atomically), not against limits.json, so a change missed during an outage is sent on the next
  micro-batch that publishes, also after a restart;
* retries with back-off (tenacity; up to :data:`ATTEMPTS` tries, waits 0.2 s then 0.4 s, no new try after
  :data:`GIVE_UP_SECONDS`), then gives up for this micro-batch: it never raises;
* reports every outcome as a row of ``control/sink_status`` (:data:`pipelines.schemas.SINK_STATUS`), a log line
  (WARNING when failing, INFO when it catches up) and in the metrics (:func:`pipelines.ops.metrics.observe_publish`).

Example:
    >>> sinks = SinkSet.from_config(cfg, lake)
    >>> sinks.publish_all(records, batch_id=7, now=now)  # one status row per sink; never raises
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import tenacity

from pipelines import schemas
from pipelines import tables
from pipelines.config import GovernorConfig
from pipelines.ops import metrics

if TYPE_CHECKING:
    from pipelines.dataplane.lake import Lake

log = logging.getLogger("rate_governor")

SINKS_APP_ID = "rate-governor-sinks"
#: Tries per sink per micro-batch, the exponential back-off between them (s), and the time after which no new try
#: starts: a sink that is down holds a micro-batch at most GIVE_UP_SECONDS + one try (a try is bounded by the
#: sink's own timeouts: about 2-4 s for Kafka, pipelines/writeback/kafka_sink.py PRODUCER_TIMEOUTS).
ATTEMPTS = 3
BACKOFF = (0.2, 1.0)
GIVE_UP_SECONDS = 5.0


class LimitsSink(Protocol):
    """A transport for control records (Kafka topic, RocketMQ admin requests, ...)."""

    #: Short name for logs and status rows, e.g. ``"kafka"``.
    name: str
    #: After :meth:`publish`: endpoint (e.g. a broker address) → the error that left it behind, for a sink that
    #: retries per endpoint itself (the RocketMQ admin sink); empty when every endpoint was brought in line (always,
    #: for a sink whose failures raise). A non-empty status makes the publish count as failed.
    status: Mapping[str, str]

    def publish(self, previous: list[Mapping[str, Any]], current: list[Mapping[str, Any]]) -> int:
        """Push the changes from ``previous`` to ``current``; returns how many changes were sent. Raises when the
        transport refuses or is unreachable (:class:`SinkSet` retries and reports)."""

    def close(self) -> None:
        """Release connections."""


@runtime_checkable
class ReadsLimiters(Protocol):
    """A sink that reads its limiters back (the RocketMQ admin sink): ``last_rejections`` is ``(broker, limiter
    key)`` → the limiter's last rejection, epoch milliseconds (UTC), -1 = never."""

    last_rejections: Mapping[tuple[str, str], int]


def build_sinks(cfg: GovernorConfig) -> list[LimitsSink]:
    """The sinks enabled in ``[sink]`` of ``cfg``, in publishing order. Connecting is left to the first publish,
    so an unreachable transport does not stop the governor from starting."""
    sinks: list[LimitsSink] = []
    if cfg.sink.kafka.enabled:
        from pipelines.writeback.kafka_sink import KafkaLimitsSink

        sinks.append(KafkaLimitsSink(cfg.sink.kafka))
    if cfg.sink.rocketmq.enabled:
        from pipelines.writeback.rocketmq_sink import RocketMQAdminSink

        sinks.append(RocketMQAdminSink(cfg.sink.rocketmq, cfg.lake.path))
    return sinks


def delivered_path(lake_root: str, sink: str) -> Path:
    return Path(lake_root.removeprefix("file://")) / "control" / "sinks" / f"{sink}.json"


def read_delivered(lake_root: str, sink: str) -> list[dict[str, Any]]:
    """The records ``sink`` last acknowledged ([] before its first delivery: everything in force is sent)."""
    try:
        records = json.loads(delivered_path(lake_root, sink).read_text())["records"]
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return []
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        return []  # damaged: resend everything in force (brokers accept a known version again)
    return records


def write_delivered(lake_root: str, sink: str, records: list[Mapping[str, Any]], now: dt.datetime) -> None:
    """Replace the delivered set of ``sink`` atomically (temporary file + ``os.replace``)."""
    path = delivered_path(lake_root, sink)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"delivered_at": now.isoformat(), "records": list(records)}, sort_keys=True) + "\n")
    os.replace(tmp, path)


class SinkSet:
    """The write-back sinks of one governor, failing soft (module docstring).

    Args:
        sinks: the transports (:func:`build_sinks`).
        lake: the lake holding ``control/sink_status``, ``control/limiter_rejections`` and ``control/sinks/``;
            None = no status table (the log lines only) and ``lake_root`` for the delivered sets.
        sleep: tenacity's sleep between attempts (tests pass a no-op).
    """

    def __init__(self, sinks: list[LimitsSink], lake: Lake | None = None, *, lake_root: str | None = None,
                 sleep: Callable[[float], None] = tenacity.nap.sleep) -> None:
        self.sinks = sinks
        self.lake = lake
        self.root = lake.root if lake is not None else str(lake_root)
        self.sleep = sleep
        #: sink name → False while its last publish failed (it has changes to catch up on).
        self.healthy: dict[str, bool] = {s.name: True for s in sinks}
        #: (sink, broker, limiter key) → the last rejection time already recorded (epoch ms).
        self._rejections_recorded: dict[tuple[str, str, str], int] = {}

    @classmethod
    def from_config(cls, cfg: GovernorConfig, lake: Lake | None) -> "SinkSet":
        return cls(build_sinks(cfg), lake)

    @property
    def behind(self) -> bool:
        """True when a sink failed its last publish: call :meth:`publish_all` even on a micro-batch without new
        decisions, so it catches up as soon as it is back."""
        return not all(self.healthy.values())

    def publish_all(self, records: list[Mapping[str, Any]], *, batch_id: int, now: dt.datetime,
                    query: str = "gold") -> list[dict]:
        """Bring every sink to ``records`` (the control records in force at ``now``, UTC) for micro-batch
        ``batch_id`` of ``query`` (``gold`` or ``fast``: each has its own batch ids). Never raises.

        Returns the status rows (``SINK_STATUS`` columns as a dict), also appended to ``control/sink_status``.
        """
        rows = [self._publish_one(sink, records, batch_id, now) for sink in self.sinks]
        if rows and self.lake is not None:
            self._record(rows, batch_id, query)
            self._record_rejections(batch_id, now, query)
        return rows

    def rejection_rows(self, batch_id: int, now: dt.datetime) -> list[tuple]:
        """:data:`~pipelines.schemas.LIMITER_REJECTIONS` rows of the limiters whose last rejection moved since the
        last call (the sinks that read their limiters, :class:`ReadsLimiters`)."""
        seen_at = now.astimezone(dt.timezone.utc).replace(tzinfo=None) if now.tzinfo else now
        rows = []
        for sink in self.sinks:
            if not isinstance(sink, ReadsLimiters):
                continue
            for (broker, key), at_ms in sorted((sink.last_rejections or {}).items()):
                mark = (sink.name, broker, key)
                if at_ms is None or at_ms <= 0 or self._rejections_recorded.get(mark) == at_ms:
                    continue
                self._rejections_recorded[mark] = at_ms
                at = dt.datetime.fromtimestamp(at_ms / 1000.0, dt.timezone.utc).replace(tzinfo=None)
                rows.append((seen_at, sink.name, broker, key, at, batch_id))
        return rows

    def _record_rejections(self, batch_id: int, now: dt.datetime, query: str) -> None:
        rows = self.rejection_rows(batch_id, now)
        if not rows:
            return
        try:
            self.lake.append_rows(rows, tables.CONTROL_LIMITER_REJECTIONS,
                                  app_id=f"{SINKS_APP_ID}-rejections-{query}", version=batch_id)
        except Exception as exc:  # noqa: BLE001 - evidence lost for one window must not stop the batch
            log.warning("limiter rejections of batch %d not recorded: %s", batch_id, exc)

    def _publish_one(self, sink: LimitsSink, records: list[Mapping[str, Any]], batch_id: int,
                     now: dt.datetime) -> dict:
        attempts = 0
        delivered = read_delivered(self.root, sink.name)
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(ATTEMPTS) | tenacity.stop_after_delay(GIVE_UP_SECONDS),
            wait=tenacity.wait_exponential(multiplier=BACKOFF[0], max=BACKOFF[1]),
            sleep=self.sleep,
            reraise=True,
        )
        sent, error = 0, None
        try:
            for attempt in retrying:
                with attempt:
                    attempts += 1
                    sent = sink.publish(delivered, records)
            # a sink that retries per endpoint itself (the RocketMQ admin sink) reports the endpoints still failing
            problems = sink.status
            if problems:
                error = "; ".join(f"{where}: {why}" for where, why in sorted(problems.items()))[:1000]
            else:
                write_delivered(self.root, sink.name, records, now)
        except Exception as exc:  # noqa: BLE001 - any transport error: the governor goes on, the status says why
            error = _one_line(exc)
        ok = error is None
        if not ok:
            log.warning("sink %s: publish failed after %d attempts (batch %d), will catch up next batch: %s",
                        sink.name, attempts, batch_id, error)
        elif not self.healthy.get(sink.name, True):
            log.info("sink %s: back, caught up with %d changes (batch %d)", sink.name, sent, batch_id)
        else:
            log.info("sink %s: %d changes sent (batch %d, attempts %d)", sink.name, sent, batch_id, attempts)
        self.healthy[sink.name] = ok
        metrics.observe_publish(sink.name, ok)
        at = now.astimezone(dt.timezone.utc).replace(tzinfo=None) if now.tzinfo else now
        return {"batch_id": batch_id, "sink": sink.name, "ok": ok, "sent": sent if ok else 0,
                "attempts": attempts, "error": error, "at": at}

    def _record(self, rows: list[dict], batch_id: int, query: str) -> None:
        fields = [f.name for f in schemas.SINK_STATUS.fields]
        try:
            self.lake.append_rows([tuple(r[f] for f in fields) for r in rows], tables.CONTROL_SINK_STATUS,
                                  app_id=f"{SINKS_APP_ID}-{query}", version=batch_id)
        except Exception as exc:  # noqa: BLE001 - the status row is a report; losing it must not stop the batch
            log.warning("sink status of batch %d not recorded: %s", batch_id, exc)

    def close(self) -> None:
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as exc:  # noqa: BLE001
                log.warning("sink %s: close failed: %s", sink.name, exc)


def _one_line(exc: BaseException) -> str:
    """``<error class>: <message>`` (at most 1,000 characters); kafka-python 3's errors already start their message
    with their class name, which is not repeated."""
    text, name = str(exc), type(exc).__name__
    return (text if text.startswith(name) else f"{name}: {text}")[:1000]
