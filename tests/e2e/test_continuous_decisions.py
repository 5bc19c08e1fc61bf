"""Decisions of the continuous job (processing-time trigger, fast path on as shipped): one run, minute files landed
one at a time, two incidents on a small cluster:

* minute 7: topic ``flash`` jumps from 20 to 200 msg/s on ``broker-a`` while producers get ``[TIMEOUT_CLEAN_QUEUE]
  broker busy`` there: the fast path limits it (TRAFFIC_SURGE on a busy broker, enforced) on the open window,
  before the watermark finalizes it;
* minute 9: ``broker-a``'s lines show group ``storm`` sending back all it consumes (RUNAWAY_RETRY by the census:
  broker-a was the only broker of the newest final window), so the fast path limits it; then ``broker-b`` joins,
  its lines of the same minute show the group consuming 400 msg/s more without retries: the final window's retry
  share is 20 %, it does not confirm the preliminary limit and the final path reverses it (a ``lift`` with its own
  reason).
"""

from __future__ import annotations

import datetime as dt
import json

import pytest
from deltalake import DeltaTable

from pipelines.config import load_config
from tests.e2e.continuous import T0, ContinuousGovernor, busy_failures, stats_minute
from tests.helpers import write_config

pytestmark = pytest.mark.slow

SURGE_MINUTE, STORM_MINUTE = 7, 9


def broker_a(m: int) -> tuple[str, str]:
    flash = 200.0 if m == SURGE_MINUTE else 20.0
    retry = 100.0 if m == STORM_MINUTE else 1.0
    return stats_minute("broker-a", m, {"flash": flash, "orders": 100.0}, {("orders", "storm"): (100.0, retry)})


def broker_b(m: int) -> tuple[str, str]:
    return stats_minute("broker-b", m, {"orders": 400.0}, {("orders", "storm"): (400.0, 0.0)})


def rows(lake, table: str) -> list[dict]:
    path = lake / table
    return DeltaTable(str(path)).to_pyarrow_table().to_pylist() if (path / "_delta_log").is_dir() else []


def published(lake) -> dict[str, dict]:
    path = lake / "control" / "limits.json"
    return {r["resource"]: r for r in json.loads(path.read_text())["records"]} if path.exists() else {}


def window_end(m: int) -> dt.datetime:
    """End of the one-minute window of ``minute`` ``m``, as the tables hold it (UTC)."""
    return (T0 + dt.timedelta(minutes=m + 1)).replace(tzinfo=dt.timezone.utc)


@pytest.fixture(scope="module")
def run(spark, tmp_path_factory):
    """The run, with what was seen at the moments that matter."""
    tmp = tmp_path_factory.mktemp("continuous")
    landing, lake = tmp / "landing", tmp / "lake"
    (landing / "send_failures").mkdir(parents=True)
    conf = write_config(tmp / "continuous.toml", **{"quality.validate_every_n_batches": 0,
                                                     "windows.trigger_seconds": 2, "windows.watermark_seconds": 60})
    cfg = load_config(conf).with_paths(str(landing), str(lake))
    seen: dict = {}
    with ContinuousGovernor(spark, cfg) as gov:
        gov.land(landing, [broker_a(m) for m in range(SURGE_MINUTE)])
        gov.land(landing, [broker_a(SURGE_MINUTE), busy_failures("broker-a", SURGE_MINUTE, "orders", 30)],
                 until=lambda: "flash" in published(lake), what="the surge limit")
        seen["surge_published"] = published(lake)["flash"]
        seen["surge_final_windows"] = {r["window_end"] for r in rows(lake, "gold/topic_tps") if r["topic"] == "flash"}
        gov.land(landing, [broker_a(SURGE_MINUTE + 1)])
        gov.land(landing, [broker_a(STORM_MINUTE)], until=lambda: "storm" in published(lake),
                 what="the storm's preliminary limit")
        seen["storm_published"] = published(lake)["storm"]
        gov.land(landing, [broker_b(STORM_MINUTE)])  # broker-b joins: the same minute, the group consumes more
        for m in range(STORM_MINUTE + 1, STORM_MINUTE + 5):
            if any(r["resource"] == "storm" and r["action"] == "lift" for r in rows(lake, "gold/limits")):
                break
            gov.land(landing, [broker_a(m), broker_b(m)])
        gov.wait(lambda: "storm" not in published(lake), 120, "the reversal")
        assert gov.running()
    seen["limits"] = rows(lake, "gold/limits")
    return seen


def test_surge_on_a_busy_broker_is_limited_on_the_fast_path_before_its_window_is_final(run):
    surge = [r for r in run["limits"] if r["resource"] == "flash"]
    first = min(surge, key=lambda r: r["version"])
    assert (first["basis"], first["action"], first["mode"]) == ("preliminary", "set", "enforce")
    assert first["reason"].startswith("[preliminary] TRAFFIC_SURGE") and "broker-a" in first["reason"]
    assert first["window_end"] == window_end(SURGE_MINUTE)
    assert window_end(SURGE_MINUTE) not in run["surge_final_windows"]  # the final path had not seen it yet
    assert first["limit_qps"] < 200.0 and run["surge_published"]["version"] == first["version"]


def test_unconfirmed_preliminary_limit_is_reversed_by_the_final_path_with_its_own_reason(run):
    storm = sorted((r for r in run["limits"] if r["resource"] == "storm"), key=lambda r: r["version"])
    prelim, *rest = storm
    assert (prelim["basis"], prelim["action"], prelim["window_end"]) == ("preliminary", "set", window_end(STORM_MINUTE))
    assert prelim["reason"].startswith("[preliminary] RUNAWAY_RETRY")
    assert run["storm_published"]["version"] == prelim["version"]
    [reversal] = rest  # nothing else was decided for the group
    assert (reversal["basis"], reversal["action"], reversal["window_end"]) == ("final", "lift", window_end(STORM_MINUTE))
    assert "did not confirm the preliminary limit" in reversal["reason"]
    assert reversal["version"] > prelim["version"]
