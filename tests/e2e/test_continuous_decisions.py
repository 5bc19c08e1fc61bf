"""Decisions of the continuous job (processing-time trigger, fast path on as shipped): one run, minute files landed
one at a time, three incidents on a small cluster:

* minute 7: topic ``flash`` jumps from 20 to 200 msg/s on ``broker-a`` while producers get ``[TIMEOUT_CLEAN_QUEUE]
  broker busy`` there: the fast path limits it (TRAFFIC_SURGE on a busy broker, enforced) on the open window,
  before the watermark finalizes it;
* minute 9: ``broker-a``'s lines show group ``storm`` sending back all it consumes (RUNAWAY_RETRY by the census:
  broker-a was the only broker of the newest final window), so the fast path limits it; then ``broker-b`` joins,
  its lines of the same minute show the group consuming 400 msg/s more without retries: the final window's retry
  share is 20 %, it does not confirm the preliminary limit and the final path reverses it (a ``lift`` with its own
  reason);
* then group ``split`` (served by ``broker-a`` only) sends back all it consumes: broker-a's lines of the minute come
  in one fast micro-batch, broker-b's (nothing of the group) in a later one and complete the window's census; the
  fast path limits the group then, on the open window.
"""

from __future__ import annotations

import datetime as dt

import pytest

from tests.e2e.continuous import T0, ContinuousGovernor, busy_failures, published, rows, setup, stats_minute

pytestmark = pytest.mark.slow

SURGE_MINUTE, STORM_MINUTE = 7, 9


def broker_a(m: int) -> tuple[str, str]:
    flash = 200.0 if m == SURGE_MINUTE else 20.0
    retry = 100.0 if m == STORM_MINUTE else 1.0
    return stats_minute("broker-a", m, {"flash": flash, "orders": 100.0}, {("orders", "storm"): (100.0, retry)})


def broker_b(m: int) -> tuple[str, str]:
    return stats_minute("broker-b", m, {"orders": 400.0}, {("orders", "storm"): (400.0, 0.0)})


def split_storm_a(m: int) -> tuple[str, str]:
    """broker-a's lines of minute ``m`` with group ``split`` sending back all it consumes (only broker-a serves it)."""
    return stats_minute("broker-a", m, {"flash": 20.0, "orders": 100.0},
                        {("orders", "storm"): (100.0, 1.0), ("orders", "split"): (100.0, 100.0)})


def window_end(m: int) -> dt.datetime:
    """End of the one-minute window of ``minute`` ``m``, as the tables hold it (UTC)."""
    return (T0 + dt.timedelta(minutes=m + 1)).replace(tzinfo=dt.timezone.utc)


@pytest.fixture(scope="module")
def run(spark, tmp_path_factory):
    """The run, with what was seen at the moments that matter."""
    landing, lake, _conf, cfg = setup(tmp_path_factory, "continuous")
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
        split = STORM_MINUTE + 1
        for m in range(STORM_MINUTE + 1, STORM_MINUTE + 5):
            if any(r["resource"] == "storm" and r["action"] == "lift" for r in rows(lake, "gold/limits")):
                break
            gov.land(landing, [broker_a(m), broker_b(m)])
            split = m + 1
        gov.wait(lambda: "storm" not in published(lake), 120, "the reversal")
        # the split storm: broker-a's lines of the minute (all of group split's) in one fast micro-batch, broker-b's
        # (nothing of the group) in a later one, completing the window's census
        fast_batch = gov.active()["fast"].lastProgress["batchId"]
        gov.land(landing, [split_storm_a(split)], what="a fast micro-batch of broker-a's lines alone",
                 until=lambda: any(p["batchId"] > fast_batch and p["numInputRows"] > 0
                                   for p in gov.active()["fast"].recentProgress))
        seen["split_before_broker_b"] = published(lake).get("split")
        gov.land(landing, [broker_b(split)], until=lambda: "split" in published(lake), timeout=60,
                 what="the split storm's limit once broker-b's lines completed the window")
        seen["split_published"] = published(lake)["split"]
        seen["split_minute"] = split
        seen["split_final_windows"] = {r["window_end"] for r in rows(lake, "gold/group_tps")
                                       if r["consumer_group"] == "split"}
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


def test_a_window_completed_by_a_later_micro_batch_is_judged_on_every_resource_of_it(run):
    """Spark emits only the rows a micro-batch touched: broker-b's lines complete the census of the split storm's
    window without touching group split. The fast path still limits it on that open window (the flow remembers the
    group's row), before the final path has the window: whichever micro-batches the brokers' files fell into."""
    assert run["split_before_broker_b"] is None  # broker-a's lines alone: broker-b might still add consumption
    limit = run["split_published"]
    assert limit["reason"].startswith("[preliminary] RUNAWAY_RETRY")
    assert "2 of 2 expected brokers reported" in limit["reason"]
    assert window_end(run["split_minute"]) not in run["split_final_windows"]
