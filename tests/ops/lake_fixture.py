"""A small lake for the status-page tests, written with delta-rs in the governor's own table schemas (no Spark):
one runaway consumer group limited twice, a surging broker flagged, two quarantined records, ``limits.json``."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

from pipelines.writeback import publish
from pipelines.dataplane.lake import TABLES
from pipelines.dataplane.spark_compat import arrow_schema

T0 = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.timezone.utc)
GROUP = "get-pugc-to-ai-consumer"
RETRY_TOPIC = f"%RETRY%{GROUP}"
#: The page's clock in these tests: after the first limit expired, before the second does.
NOW = T0 + dt.timedelta(minutes=50)


def minute(i: int) -> dt.datetime:
    return T0 + dt.timedelta(minutes=i)


def write_rows(lake: Path, table: str, rows: list[dict], mode: str = "error") -> None:
    """Write ``rows`` as ``table`` (a :mod:`pipelines.tables` name; ``mode`` as delta-rs takes it: ``error`` when the
    table is there already, ``overwrite``, ``append``) in its governor schema (missing columns null)."""
    schema = arrow_schema(TABLES[table].schema)
    full = [{f.name: row.get(f.name) for f in schema} for row in rows]
    write_deltalake(str(lake / table), pa.Table.from_pylist(full, schema=schema), mode=mode)


def build_lake(lake: Path) -> Path:
    """Write the tables and ``control/limits.json`` under ``lake``; returns ``lake``."""
    windows = range(40)
    storm = range(20, 40)
    write_rows(lake, "bronze/broker_stats", [{"source": "broker_stats", "raw": "x", "ingested_at": NOW}] * 7)
    write_rows(lake, "gold/topic_tps", [
        {"window_start": minute(i), "window_end": minute(i + 1), "topic": RETRY_TOPIC,
         "put_tps": 800.0 if i in storm else 0.0, "brokers_reporting": 1} for i in windows
    ])
    write_rows(lake, "gold/group_tps", [
        {"window_start": minute(i), "window_end": minute(i + 1), "consumer_group": GROUP, "topic": "orders",
         "consume_tps": 300.0, "retry_tps": 780.0 if i in storm else 0.0} for i in windows
    ])
    write_rows(lake, "gold/broker_tps", [
        {"window_start": minute(i), "window_end": minute(i + 1), "broker": "broker-a",
         "put_tps": 1300.0 if i in storm else 500.0} for i in windows
    ])
    write_rows(lake, "silver/broker_stats", [
        {"event_time": minute(21), "broker": "broker-a", "stat_name": "SNDBCK_PUT_NUMS", "topic": RETRY_TOPIC,
         "consumer_group": GROUP}
    ])
    write_rows(lake, "gold/anomalies", [
        {"window_start": minute(i), "window_end": minute(i + 1), "resource_type": "group", "resource": GROUP,
         "anomaly": "RUNAWAY_RETRY", "observed_tps": 780.0, "baseline_tps": 0.0, "severity": "critical"}
        for i in storm
    ] + [
        {"window_start": minute(i), "window_end": minute(i + 1), "resource_type": "broker", "resource": "broker-a",
         "anomaly": "TRAFFIC_SURGE", "observed_tps": 1300.0, "baseline_tps": 500.0, "severity": "warning"}
        for i in range(20, 30)
    ])
    reason = f"RUNAWAY_RETRY: consumer group {GROUP} sent 780.0 msg/s back; retry ratio 2.60"
    write_rows(lake, "gold/limits", [
        {"decided_at": minute(22), "window_end": minute(21), "resource_type": "group", "resource": GROUP,
         "limit_qps": 30.0, "burst": 30, "action": "set", "mode": "enforce", "expires_at": minute(32),
         "reason": reason, "version": 1},
        {"decided_at": minute(27), "window_end": minute(26), "resource_type": "group", "resource": GROUP,
         "limit_qps": 30.0, "burst": 30, "previous_qps": 30.0, "action": "set", "mode": "enforce",
         "expires_at": minute(57), "reason": "refresh (anomaly persists): " + reason, "version": 2},
    ])
    write_rows(lake, "quarantine", [
        {"source": "broker_stats", "raw": "garbage", "reason": "not a stats.log line", "ingested_at": NOW},
        {"source": "send_failures", "raw": "{", "reason": "not a JSON object", "ingested_at": NOW},
    ])
    records = [
        {"resource_type": "group", "resource": GROUP, "limit_qps": 30.0, "burst": 30, "mode": "enforce",
         "expires_at": minute(57).strftime("%Y-%m-%dT%H:%M:%SZ"), "version": 2, "reason": reason, "signature": "ab",
         "brokers": {"broker-a": {"limit_qps": 30.0, "burst": 30}, "*": {"limit_qps": 30.0, "burst": 30}}},
        {"resource_type": "topic", "resource": "orders", "limit_qps": 120.0, "burst": 120, "mode": "advisory",
         "expires_at": minute(45).strftime("%Y-%m-%dT%H:%M:%SZ"), "version": 3, "reason": "TRAFFIC_SURGE: orders",
         "signature": "cd"},
    ]
    publish.write_limits_file(str(lake), records, NOW)
    return lake
