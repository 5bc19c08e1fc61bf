"""The governor's side of operators' overrides (pipelines/job/overrides.py) on a delta-rs lake, no Spark session: the
override tick applies a pin and its end with no micro-batch and publishes them, writes nothing when nothing is
due; the source reads control/overrides once per Delta version, ignores a bad row (logged once) and keeps what it
read when the table cannot be read."""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading

import pytest

from pipelines import columns, tables
from pipelines.config import GovernorConfig
from pipelines.dataplane.lake import DeltaRsLake
from pipelines.decide.arrow import from_rows
from pipelines.job.flows.store import DecisionStore
from pipelines.job.overrides import OverrideSource, OverrideTick
from pipelines.writeback.publish import Publisher

NOW = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.timezone.utc)
CFG = GovernorConfig()


def create(oid="ovr-0000000a", resource="g", qps=30.0, minutes=10, **change) -> dict:
    return {"recorded_at": NOW, "event": "create", "override_id": oid, "kind": "pin", "resource_type": "group",
            "resource": resource, "limit_qps": qps, "starts_at": NOW, "ends_at": NOW + dt.timedelta(minutes=minutes),
            "author": "alice", "reason": "sale", **change}


def append(lake, *rows, version: int) -> None:
    lake.append_arrow(from_rows(list(rows), columns.OVERRIDES), tables.CONTROL_OVERRIDES, app_id="test",
                      version=version)


class Clock:
    def __init__(self) -> None:
        self.at = NOW + dt.timedelta(seconds=1)

    def __call__(self) -> dt.datetime:
        return self.at


@pytest.fixture()
def governor(tmp_path):
    lake = DeltaRsLake(None, str(tmp_path / "lake"))
    cfg = CFG.with_paths(lake=str(tmp_path / "lake"))
    clock = Clock()
    tick = OverrideTick(cfg, lake, OverrideSource(lake, cfg), DecisionStore(lake), Publisher(cfg, lake),
                        threading.Lock(), clock)
    return lake, tick, clock


def published(lake) -> dict:
    path = f"{lake.root}/control/limits.json"
    return {r["resource"]: r for r in json.loads(open(path).read())["records"]}


def test_a_pin_and_its_end_are_applied_and_published_without_a_micro_batch(governor):
    lake, tick, clock = governor
    assert tick.tick() == 0  # no table yet: nothing to do
    append(lake, create(), version=1)
    assert tick.tick() == 1
    record = published(lake)["g"]
    assert (record["limit_qps"], record["mode"]) == (30.0, "enforce")
    assert record["reason"].startswith("[override] override ovr-0000000a (pin at 30.0 msg/s by alice until ")
    clock.at += dt.timedelta(seconds=2)
    assert tick.tick() == 0  # nothing due: nothing written again
    clock.at = NOW + dt.timedelta(minutes=10, seconds=1)  # past its end
    assert tick.tick() == 1 and published(lake) == {}
    rows = lake.read_arrow(tables.GOLD_LIMITS).to_pylist()
    assert [(r["action"], r["basis"]) for r in sorted(rows, key=lambda r: r["version"])] == [
        ("set", "override"), ("lift", "override")]
    assert tick.tick() == 0 and tick.written == [1, 1]


def test_the_source_reads_once_per_version_ignores_a_bad_row_and_keeps_its_set_when_unreadable(governor, caplog,
                                                                                               monkeypatch):
    lake, tick, _ = governor
    source = tick.source
    append(lake, create(), create(oid="ovr-0000000b", resource="TBW102", resource_type="topic"), version=1)
    reads = []
    original = lake.read_arrow
    monkeypatch.setattr(lake, "read_arrow", lambda *a, **k: reads.append(a) or original(*a, **k))
    with caplog.at_level(logging.WARNING, logger="rate_governor"):
        first, again = source.current(), source.current()
    assert [o.override_id for o in first] == ["ovr-0000000a"] and again == first and len(reads) == 1
    warned = [r.getMessage() for r in caplog.records if r.name.startswith("rate_governor")]  # not a Kafka client
    assert len(warned) == 1 and "ovr-0000000b" in warned[0] and "TBW102 is on limits.protected" in warned[0]
    append(lake, create(oid="ovr-0000000c", resource="h"), version=2)
    assert [o.override_id for o in source.current()] == ["ovr-0000000a", "ovr-0000000c"] and len(reads) == 2
    monkeypatch.setattr(lake, "version", lambda table: (_ for _ in ()).throw(OSError("the lake's disk is gone")))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rate_governor"):
        kept = [source.current(), source.current()]
    assert all([o.override_id for o in k] == ["ovr-0000000a", "ovr-0000000c"] for k in kept)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("rate_governor")] == [
        "control/overrides not read (OSError: the lake's disk is gone); the 2 overrides read before stay in force"]
