"""Small builders shared by the tests."""

from __future__ import annotations

import datetime as dt

from pipelines import schemas

INGESTED = dt.datetime(2022, 2, 9, 0, 0)


def raw_records(spark, source: str, lines: list[str], broker_hint: str | None = "broker-a"):
    """RAW_RECORD rows for ``lines`` as if read from one file in ``<landing>/<source>/<broker_hint>/``."""
    rows = [
        (source, line, line.encode("utf-8"), f"file:///landing/{source}/{broker_hint}/stats.log", broker_hint, INGESTED)
        for line in lines
    ]
    return spark.createDataFrame(rows, schemas.RAW_RECORD)


def stats_line(local_time: str, stat: str, key: str, detail: str, period: str = "In One Minute") -> str:
    """A stats.log line as RocketMQ prints it (``local_time`` in GMT+8)."""
    return f"{local_time} INFO - [{stat}] [{key}] Stats {period}, {detail}"


def ts(text: str) -> dt.datetime:
    """'2022-02-08 07:40' → naive UTC datetime."""
    return dt.datetime.fromisoformat(text)
