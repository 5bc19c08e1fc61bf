"""Write-back: the current limits as control records (docs/contracts.md §3) to ``<lake>/control/limits.json``.

The current set is the latest ``gold/limits`` row per resource (highest ``version``) that is not a ``lift`` and has
not expired. Each record carries the cluster-wide ``limit_qps`` and, when the decision split it, each broker's
share (``brokers``); it is signed (HMAC-SHA256, :mod:`control.record`) when a signing key is configured.
"""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from control import limits_file
from control import record as control_record
from pipelines.faults import crash_point
from pipelines import tables
from pipelines.dataplane.lake import Lake
from pipelines.dataplane.lake.base import newest_per_key
from pipelines.ops import metrics
from pipelines.schemas import RESOURCE_KEYS
from pipelines.config import GovernorConfig, LimitsConfig
from pipelines.decide.words import Action
from pipelines.writeback.records import (  # noqa: F401 (re-exported)
    _record, broker_figures, current_rows, records_from_rows,
)

LIMITS_FILE = "control/limits.json"
#: The name of the ``limits.json`` path in the metrics (``sink`` label; the other sinks have their own names).
FILE_SINK = "file"


def latest_per_resource(limits: DataFrame) -> DataFrame:
    """gold/limits → the latest decision per (resource_type, resource), by ``version``."""
    return newest_per_key(limits, list(RESOURCE_KEYS), "version")


def current_limits(limits: DataFrame, now: dt.datetime) -> DataFrame:
    """gold/limits → the limits in force at ``now`` (UTC): latest per resource, not lifted, not expired. The Spark
    definition of what :class:`Publisher` publishes (for queries and to check :func:`current_rows` against)."""
    latest = latest_per_resource(limits)
    return latest.where((F.col("action") != Action.LIFT.value) & (F.col("expires_at") > F.lit(now)))


def control_records(current: DataFrame, cfg: LimitsConfig, key: bytes | None) -> list[dict[str, Any]]:
    """Rows of :func:`current_limits` → control records (dicts), signed when ``key`` is given: the Spark definition
    of :func:`records_from_rows` (tests check one against the other)."""
    records = []
    rows = current.select(
        "*", F.date_format(F.col("expires_at"), "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("expires_at_text")
    ).orderBy("resource_type", "resource")
    for row in rows.collect():
        record = _record(row, cfg, row["expires_at_text"])
        records.append(control_record.sign(record, key) if key else record)
    return records


def write_limits_file(lake_root: str, records: list[dict[str, Any]], now: dt.datetime) -> Path:
    """Replace ``<lake>/control/limits.json`` atomically with ``records``; returns its path."""
    path = Path(lake_root) / LIMITS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    for leftover in path.parent.glob(f".{path.name}.*.tmp"):  # a write interrupted by a crash
        leftover.unlink(missing_ok=True)
    limits_file.write_limits_file(records, path, generated_at=now,
                                  before_replace=lambda: crash_point("publish:before-replace"))
    return path


def read_published(lake_root: str) -> list[dict[str, Any]]:
    """The records of the current ``limits.json`` (empty when it does not exist yet or cannot be read)."""
    path = Path(lake_root) / LIMITS_FILE
    try:
        return limits_file.read_limits_file(path)
    except (FileNotFoundError, ValueError):
        return []


def signing_key(cfg: GovernorConfig) -> bytes | None:
    """The HMAC key of the control records (``limits.signing_key_env`` or ``limits.signing_key_file``).

    Raises:
        control.record.SigningKeyError: no key in enforce mode (brokers would refuse unsigned records), or the
            named key file is missing.
    """
    key = control_record.load_signing_key(cfg.limits.signing_key_env, cfg.limits.signing_key_file or None)
    if key is None and cfg.limits.mode == "enforce":
        raise control_record.SigningKeyError(
            f"limits.mode = 'enforce' needs a signing key: set the environment variable {cfg.limits.signing_key_env} "
            "or limits.signing_key_file (or run with limits.mode = 'advisory')"
        )
    return key


class Publisher:
    """Publishes the limits in force (from ``gold/limits``) to every write-back path: first the changes to each
    sink of ``[sink]`` (:class:`pipelines.writeback.sinks.SinkSet`), then ``<lake>/control/limits.json``, replaced
    atomically. A crash between the two re-sends the same versions on replay, which brokers accept idempotently.

    Raises (constructor):
        control.record.SigningKeyError: see :func:`signing_key`.
    """

    def __init__(self, cfg: GovernorConfig, lake: Lake) -> None:
        from pipelines.writeback.sinks import SinkSet

        self.cfg = cfg
        self.lake = lake
        self.key = signing_key(cfg)
        self.sinks = SinkSet.from_config(cfg, lake)
        #: One publish at a time: the fast and gold flows and the override tick publish from their own threads, and
        #: each publish replaces limits.json (clearing a crashed write's temporary files) and moves the sinks.
        self._one_at_a_time = threading.Lock()
        metrics.declare_sinks([FILE_SINK, *(sink.name for sink in self.sinks.sinks)])

    def records(self, now: dt.datetime) -> list[dict[str, Any]]:
        """The control records of the limits in force at ``now`` (UTC), signed when a key is configured: the latest
        ``gold/limits`` row per resource from the lake (:meth:`pipelines.dataplane.lake.Lake.latest_rows`: the table's
        current snapshot read each time, so both flows' decisions and a restart are seen), those in force kept
        (:func:`current_rows`)."""
        latest = self.lake.latest_rows(tables.GOLD_LIMITS, list(RESOURCE_KEYS), "version")
        return records_from_rows(current_rows(latest, now), self.cfg.limits, self.key)

    def publish(self, now: dt.datetime, batch_id: int = 0, query: str = "gold") -> Path:
        """Publish the limits in force at ``now`` (micro-batch ``batch_id`` of ``query``); returns the path of
        ``limits.json``. The sinks fail soft (:class:`pipelines.writeback.sinks.SinkSet`): retried, reported in
        ``control/sink_status``, caught up on a later publish; they never stop the file from being written. The
        records published become the metrics' limits in force (:func:`pipelines.ops.metrics.observe_limits`).

        Raises:
            pipelines.job.lease.LakeHeldError: this governor lost the lake's lease (the lake's fence): nothing is
                published."""
        with self._one_at_a_time:
            return self._publish(now, batch_id, query)

    def _publish(self, now: dt.datetime, batch_id: int, query: str) -> Path:
        self.lake.check_fence()
        records = self.records(now)
        self.sinks.publish_all(records, batch_id=batch_id, now=now, query=query)
        try:
            path = write_limits_file(self.lake.root, records, now)
        except Exception:
            metrics.observe_publish(FILE_SINK, ok=False)
            raise
        metrics.observe_publish(FILE_SINK, ok=True)
        metrics.observe_limits(records)  # the limits in force, as every path now has them
        return path
