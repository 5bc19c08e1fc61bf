"""Event time of a landing line, for tests and fixture scripts that cut a landing directory by time (stdlib only:
tests/fixtures/spark40_checkpoint/split_landing.py runs it in another line's throw-away venv)."""

from __future__ import annotations

import datetime as dt
import json


def line_time(line: str) -> dt.datetime:
    """Event time (UTC) of a landing line: a stats line (raw or in an envelope, GMT+8) or a send failure."""
    if line.startswith("{"):
        record = json.loads(line)
        if "line" in record:
            line = record["line"]
        else:
            ts = record["ts"]
            if isinstance(ts, (int, float)):
                return dt.datetime.fromtimestamp(ts / 1000, dt.timezone.utc)
            return dt.datetime.fromisoformat(ts.replace("Z", "+00:00"))
    local = dt.datetime.strptime(line[:19], "%Y-%m-%d %H:%M:%S")
    return (local - dt.timedelta(hours=8)).replace(tzinfo=dt.timezone.utc)
