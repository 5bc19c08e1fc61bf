"""Operators' overrides against the continuous governor (processing-time triggers, fast path on, as shipped): the
real command (``python -m pipelines.ops.override`` in a subprocess, as on-call runs it) against a running governor
on one broker, minute files landed one at a time:

* a pin of a quiet group lands in ``limits.json`` within one fast trigger with no input arriving, and is lifted
  within one trigger of its end;
* a consumer group ``storm`` sending back all it consumes is limited by the rules; exempted, its enforced limit is
  lifted within one trigger and the rules go on in advisory records naming the exemption, never enforced; released,
  the advisory record goes at once and the next storm minute is limited again;
* pinned, the storm is held at the pin whatever the rules see; the pin survives a governor restart (the new governor
  writes nothing again) and, released by the new governor, the rules take over;
* bad input (an unknown verb, a non-finite --qps, a duration over the maximum, an unknown id, a protected topic)
  gets one line and exit 2, writes nothing, and the governor runs on.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from pipelines.decide.paths.overrides import tag
from tests.e2e.continuous import ContinuousGovernor, published, rows, setup, stats_minute

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
#: One trigger of the override tick (windows.fast_trigger_seconds as shipped), and on top the tick's own work (read
#: the table, decide under the decision lock, one commit, one publish) on this loaded 2-core machine; each latency is
#: measured from the override's Delta commit to limits.json carrying its effect, and printed when over.
TRIGGER = 2.0
SLACK = 2.0


def minute(m: int, retry: float = 1.0) -> tuple[str, str]:
    return stats_minute("broker-a", m, {"orders": 100.0}, {("orders", "storm"): (100.0, retry)})


def command(conf: Path, lake: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "pipelines.ops.override", *argv, "--conf", str(conf), "--lake",
                           str(lake)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def until(predicate, timeout: float, what: str, since: dt.datetime | None = None) -> float:
    """Seconds from ``since`` (UTC; default now) until ``predicate()`` held (polled every 50 ms)."""
    started = since or dt.datetime.now(dt.timezone.utc)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return (dt.datetime.now(dt.timezone.utc) - started).total_seconds()
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.fixture(scope="module")
def run(spark, tmp_path_factory):
    landing, lake, conf, cfg = setup(tmp_path_factory, "overrides", **{"overrides.max_duration_seconds": 3600})
    seen: dict = {}

    def new(*argv: str) -> str:
        """Run the command; returns the override's id. ``seen["at"]``: when its row was committed (the Delta
        commit's timestamp: from then on a governor can read it), from which each latency below is measured."""
        done = command(conf, lake, *argv)
        assert done.returncode == 0, done.stderr
        last, = DeltaTable(str(lake / "control" / "overrides")).history(1)
        seen["at"] = dt.datetime.fromtimestamp(last["timestamp"] / 1000, dt.timezone.utc)
        return argv[1] if argv[0] == "release" else done.stdout.split(":")[0]

    with ContinuousGovernor(spark, cfg) as gov:
        gov.land(landing, [minute(m) for m in range(6)])
        # a pin with no input arriving: in force within a trigger, lifted within a trigger of its end
        quiet = new("pin", "group", "quiet", "--qps", "40", "--for", "20s", "--reason", "e2e pin")
        seen["pin_latency"] = until(lambda: "quiet" in published(lake), 30, "the pin in limits.json", seen["at"])
        seen["pin_record"] = published(lake)["quiet"]
        ends = next(r["ends_at"] for r in rows(lake, "control/overrides") if r["override_id"] == quiet)
        time.sleep(max(0.0, (ends - dt.datetime.now(dt.timezone.utc)).total_seconds()))
        seen["pin_end_latency"] = until(lambda: "quiet" not in published(lake), 30, "the pin lifted at its end",
                                        ends)
        seen["quiet_id"] = quiet
        # the storm, limited by the rules, then exempted
        gov.land(landing, [minute(6, retry=100.0)], until=lambda: published(lake).get("storm", {}).get("mode")
                 == "enforce", what="the storm's limit")
        exempt = new("exempt", "group", "storm", "--for", "10m", "--reason", "e2e exempt")
        seen["exempt_latency"] = until(lambda: "storm" not in published(lake), 30, "the exempted limit lifted",
                                       seen["at"])
        seen["exempt_at"] = dt.datetime.now(dt.timezone.utc)
        gov.land(landing, [minute(7, retry=100.0)], what="an advisory record of the exempted storm",
                 until=lambda: any(r["resource"] == "storm" and r["mode"] == "advisory" and exempt in r["reason"]
                                   for r in rows(lake, "gold/limits")))
        seen["exempt_published"] = published(lake).get("storm")
        new("release", exempt, "--reason", "e2e done")
        seen["release_latency"] = until(lambda: "storm" not in published(lake), 30, "the advisory record lifted",
                                        seen["at"])
        seen["released_at"] = dt.datetime.now(dt.timezone.utc)
        gov.land(landing, [minute(8, retry=100.0)], what="the storm limited again",
                 until=lambda: published(lake).get("storm", {}).get("mode") == "enforce")
        seen["after_release"] = published(lake)["storm"]
        # pinned while the storm goes on, then the governor restarts
        pin = new("pin", "group", "storm", "--qps", "25", "--for", "30m", "--reason", "e2e hold")
        until(lambda: published(lake).get("storm", {}).get("limit_qps") == 25.0, 30, "the storm pinned")
        gov.land(landing, [minute(9, retry=100.0)])
        seen["pinned_storm"] = published(lake)["storm"]

        def storm_state() -> dict:
            return max((r for r in rows(lake, "state/policy") if r["resource"] == "storm"), key=lambda r: r["batch_id"])

        # the final path folds the pinned window in the gold micro-batch after the one that read it (on a slow
        # machine, after land() returns): wait for its state, and fail if it never comes under the pin
        until(lambda: storm_state()["override_id"] is not None, 120, "the storm's state saved under the pin")
        seen["pinned_state"] = storm_state()
        assert gov.running()
    seen["rows_before_restart"] = len(rows(lake, "gold/limits"))
    with ContinuousGovernor(spark, cfg) as gov:
        time.sleep(3 * TRIGGER)  # a few ticks of the new governor
        seen["rows_after_restart"] = len(rows(lake, "gold/limits"))
        seen["pin_after_restart"] = published(lake)["storm"]
        before = len(rows(lake, "control/overrides"))
        seen["bad"] = [command(conf, lake, *argv) for argv in (
            ["freeze", "group", "storm"], ["pin", "group", "storm", "--qps", "inf", "--for", "1h", "--reason", "x"],
            ["exempt", "topic", "orders", "--for", "2h", "--reason", "x"], ["release", "ovr-00000000"],
            ["pin", "topic", "RMQ_SYS_TRACE_TOPIC", "--qps", "10", "--for", "1h", "--reason", "x"])]
        seen["bad_wrote"] = len(rows(lake, "control/overrides")) - before
        seen["running_after_bad"] = gov.running()
        new("release", pin)
        seen["pin_release_latency"] = until(lambda: "storm" not in published(lake), 30, "the pin released",
                                            seen["at"])
        gov.land(landing, [minute(10, retry=100.0)], what="the rules taking over after the pin",
                 until=lambda: published(lake).get("storm", {}).get("mode") == "enforce")
        seen["after_pin"] = published(lake)["storm"]
        seen["ids"] = {"quiet": quiet, "exempt": exempt, "pin": pin}
    seen["limits"] = rows(lake, "gold/limits")
    return seen


def test_an_override_lands_within_one_trigger_and_ends_on_time_without_input(run, record_property):
    for name in ("pin_latency", "pin_end_latency", "exempt_latency", "release_latency", "pin_release_latency"):
        record_property(name, f"{run[name]:.2f} s")
    assert run["pin_latency"] <= TRIGGER + SLACK, run["pin_latency"]
    record = run["pin_record"]
    assert (record["limit_qps"], record["mode"]) == (40.0, "enforce")
    assert record["reason"].startswith(f"[override] override {run['ids']['quiet']} (pin at 40.0 msg/s by ")
    assert run["pin_end_latency"] <= TRIGGER + SLACK, run["pin_end_latency"]
    lift, = [r for r in run["limits"] if r["resource"] == "quiet" and r["action"] == "lift"]
    assert lift["basis"] == "override" and "ended at" in lift["reason"]


def test_an_exemption_lifts_the_limit_at_once_and_the_rules_go_on_in_advisory_records(run):
    exempt = run["ids"]["exempt"]
    assert run["exempt_latency"] <= TRIGGER + SLACK, run["exempt_latency"]
    storm = [r for r in run["limits"] if r["resource"] == "storm"]
    lift = min((r for r in storm if r["basis"] == "override" and exempt in r["reason"]), key=lambda r: r["version"])
    assert lift["action"] == "lift" and "the enforce limit of" in lift["reason"]
    during = [r for r in storm if lift["decided_at"] <= r["decided_at"] < run["released_at"]]
    assert during and all(r["mode"] == "advisory" or r["action"] == "lift" for r in during), during
    assert any(r["mode"] == "advisory" and "advisory only; the rules' decision: RUNAWAY_RETRY" in r["reason"]
               for r in during), during
    assert run["exempt_published"] is None or run["exempt_published"]["mode"] == "advisory"
    assert run["release_latency"] <= TRIGGER + SLACK, run["release_latency"]
    # from a fresh state: the rules' first cut (at most limits.max_cut_pct below the observed 100 msg/s), or their
    # target of 10 msg/s once the storm outlived it
    assert run["after_release"]["mode"] == "enforce" and run["after_release"]["limit_qps"] <= 50.0


def test_a_pin_holds_the_storm_survives_a_restart_and_its_release_hands_back_to_the_rules(run):
    assert (run["pinned_storm"]["limit_qps"], run["pinned_storm"]["mode"]) == (25.0, "enforce")
    assert run["pinned_storm"]["reason"].startswith(f"[override] override {run['ids']['pin']} (pin at 25.0")
    assert run["rows_after_restart"] == run["rows_before_restart"]  # nothing decided again on restart
    assert run["pin_after_restart"]["version"] == run["pinned_storm"]["version"]
    pin = run["ids"]["pin"]
    storm = [r for r in run["limits"] if r["resource"] == "storm"]
    assert {r["basis"] for r in storm if tag(r["reason"]) == pin and r["action"] == "set"} == {"override"}
    # the final path saved the storm's state under the pin (a state of another regime is never folded again)
    assert (run["pinned_state"]["override_id"], run["pinned_state"]["limit_qps"]) == (pin, 25.0)
    released = max((r for r in storm if r["basis"] == "override" and r["action"] == "lift" and tag(r["reason"]) == pin),
                   key=lambda r: r["version"])
    assert "released by" in released["reason"]
    after = [r for r in storm if r["version"] > released["version"]]  # the rules, from a fresh state
    assert after and all(r["basis"] in ("preliminary", "final") for r in after)
    assert any(r["mode"] == "enforce" and r["action"] == "set" for r in after)
    assert run["pin_release_latency"] <= TRIGGER + SLACK, run["pin_release_latency"]
    assert run["after_pin"]["mode"] == "enforce" and run["after_pin"]["limit_qps"] <= 50.0  # the rules' own


def test_bad_input_is_refused_with_one_line_and_the_governor_runs_on(run):
    for done in run["bad"]:
        assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1, done
    assert "invalid choice: 'freeze'" in run["bad"][0].stderr
    assert "--qps inf must be a finite number" in run["bad"][1].stderr
    assert "over overrides.max_duration_seconds = 3600" in run["bad"][2].stderr
    assert "no override ovr-00000000" in run["bad"][3].stderr
    assert "RMQ_SYS_TRACE_TOPIC is on limits.protected" in run["bad"][4].stderr
    assert run["bad_wrote"] == 0 and run["running_after_bad"]
