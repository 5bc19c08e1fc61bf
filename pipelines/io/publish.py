"""Write-back: the current limits as control records (docs/contracts.md §3) to ``<lake>/control/limits.json``.

The current set is the latest ``gold/limits`` row per resource (highest ``version``) that is not a ``lift`` and has
not expired. Each record is signed (HMAC-SHA256, :mod:`pipelines.control_record`) when a signing key is configured.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from control import record as control_record
from pipelines.config import LimitsConfig
from pipelines.transforms.policy import ACTION_LIFT

LIMITS_FILE = "control/limits.json"


def latest_per_resource(limits: DataFrame) -> DataFrame:
    """gold/limits → the latest decision per (resource_type, resource), by ``version``."""
    newest_first = Window.partitionBy("resource_type", "resource").orderBy(F.col("version").desc())
    ranked = limits.select("*", F.row_number().over(newest_first).alias("_rank"))
    return ranked.where(F.col("_rank") == 1).drop("_rank")


def current_limits(limits: DataFrame, now: dt.datetime) -> DataFrame:
    """gold/limits → the limits in force at ``now`` (UTC): latest per resource, not lifted, not expired."""
    latest = latest_per_resource(limits)
    return latest.where((F.col("action") != ACTION_LIFT) & (F.col("expires_at") > F.lit(now)))


def control_records(current: DataFrame, cfg: LimitsConfig, key: bytes | None) -> list[dict[str, Any]]:
    """Rows of :func:`current_limits` → control records (dicts), signed when ``key`` is given."""
    records = []
    rows = current.select(
        "*", F.date_format(F.col("expires_at"), "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("expires_at_text")
    ).orderBy("resource_type", "resource")
    for row in rows.collect():
        record = {
            "resource_type": row["resource_type"],
            "resource": row["resource"],
            "limit_qps": float(row["limit_qps"]),
            "burst": int(row["burst"]),
            "breaker_open_ms": cfg.breaker_open_ms,
            "mode": row["mode"],
            "expires_at": row["expires_at_text"],
            "version": int(row["version"]),
            "reason": row["reason"],
        }
        records.append(control_record.sign(record, key) if key else record)
    return records


def write_limits_file(lake_root: str, records: list[dict[str, Any]], now: dt.datetime) -> Path:
    """Replace ``<lake>/control/limits.json`` atomically with ``records``; returns its path."""
    path = Path(lake_root) / LIMITS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    for leftover in path.parent.glob(f".{path.name}.*.tmp"):  # a write interrupted by a crash
        leftover.unlink(missing_ok=True)
    control_record.write_limits_file(records, path, generated_at=now)
    return path


def read_published(lake_root: str) -> list[dict[str, Any]]:
    """The records of the current ``limits.json`` (empty when it does not exist yet or cannot be read)."""
    path = Path(lake_root) / LIMITS_FILE
    try:
        return control_record.read_limits_file(path)
    except (FileNotFoundError, ValueError):
        return []
