"""``gold/limits`` rows (pipelines/decide/records/limit_rows.py): expiry, burst, basis, event-time versions, and the
``gold/limits`` expectations applied row by row."""

from __future__ import annotations

import datetime as dt
import json
import math

from pipelines.config import LimitsConfig
from pipelines.decide.records.resource import Decision
from pipelines.decide.records.limit_rows import check, finish

L = LimitsConfig()
UTC = dt.timezone.utc
W1, W2 = dt.datetime(2022, 2, 8, 7, 1), dt.datetime(2022, 2, 8, 7, 2)


def decision(window_end=W1, qps=79.5, mode="enforce", action="set"):
    return Decision("group", "g", window_end, qps, None, action, "r", 1, mode, {"a": qps})


def test_finish_adds_expiry_burst_and_mode():
    now = dt.datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
    got, = finish([decision(mode="advisory")], L, now, "final")
    assert got["burst"] == 80 and got["mode"] == "advisory" and got["broker_limits"] == {"a": 79.5}
    assert got["expires_at"] - got["decided_at"] == dt.timedelta(seconds=L.ttl_seconds)


def test_versions_come_from_event_time_so_they_grow_across_lakes_and_restarts():
    """The same window decided by two governors (a new lake, another processing time) has the same version; a
    later window has a higher one; a window's final decision outranks its preliminary one."""
    def version(window_end, basis, now):
        return finish([decision(window_end)], L, now, basis)[0]

    first_lake = version(W1, "final", dt.datetime(2026, 11, 22, 10, 0, tzinfo=UTC))
    new_lake = version(W1, "final", dt.datetime(2026, 11, 23, 9, 0, tzinfo=UTC))
    assert first_lake["version"] == new_lake["version"] == int(W1.replace(tzinfo=UTC).timestamp()) * 10 + 5
    assert version(W2, "preliminary", dt.datetime(2026, 11, 22, tzinfo=UTC))["version"] > first_lake["version"]
    prelim = version(W1, "preliminary", dt.datetime(2026, 11, 22, tzinfo=UTC))
    assert prelim["version"] < first_lake["version"]
    assert (prelim["basis"], first_lake["basis"]) == ("preliminary", "final")
    assert prelim["reason"] == "[preliminary] r" and first_lake["reason"] == "[final] r"


def test_a_decision_failing_an_expectation_is_quarantined_with_the_first_failed_one():
    now = dt.datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
    rows = finish([decision(qps=40.0), decision(qps=math.inf), decision(qps=-1.0)], L, now, "final")
    rows[2]["mode"] = "sideways"
    accepted, refused = check(rows, "rate-governor-gold:7", now)
    assert [r["limit_qps"] for r in accepted] == [40.0]
    assert [r["reason"] for r in refused] == ["expectation failed: expect_column_values_to_be_between(limit_qps)"] * 2
    assert refused[0]["source"] == "gold/limits" and refused[0]["origin"] == "rate-governor-gold:7"
    assert json.loads(refused[1]["raw"])["mode"] == "sideways" and refused[1]["raw_bytes"] is None
