"""Lines from brokers the cluster does not have are never grounds for a limit (issue 42, docs/contracts.md §1),
through the streaming governor.

* ``--once`` on a quiet 2-broker cluster with issue 42's forged folder ``broker_stats/bk-nobody/`` (a retry storm,
  a consume trickle and a put surge of the real brokers' resources) and forged ``[TIMEOUT_CLEAN_QUEUE]`` failures
  naming ``bk-nobody``, plus single forged failure lines naming a real broker in another case and an address
  ``[brokers] addresses`` does not map. The name server does not answer at start, so ``[brokers] known`` is the set.
  Without the check the forged lines limited ``cg-orders-a`` (RUNAWAY_RETRY) and ``orders-a`` (TRAFFIC_SURGE on
  the "busy" ``bk-nobody``).
* The continuous job with the name server down at start and no list (every broker trusted, said once), then up
  listing ``broker-a`` (``broker-b``'s lines quarantined), then listing ``broker-b`` too (accepted from the next
  refresh; its earlier lines stay in quarantine), then without ``broker-a`` (its lines quarantined from then on).
"""

from __future__ import annotations

import datetime as dt
import json
import logging

import pytest
from deltalake import DeltaTable

from pipelines import governor
from pipelines.config import load_config
from tests.e2e.continuous import GMT8, T0, ContinuousGovernor, busy_failures, stats_minute
from tests.helpers import lean_config_file, stats_line, write_config
from tests.rocketmq_loopback import LoopbackBroker, LoopbackNameServer

pytestmark = pytest.mark.slow

TOPIC, GROUP, BROKERS = "orders-a", "cg-orders-a", ("broker-a", "broker-b")
FORGED_MINUTES, QUIET_MINUTES = (6, 7), 11
NOT_KNOWN = "unknown broker {} (not in [brokers] known)"


def forged_minute(minute: int) -> str:
    """Issue 42's three forged lines of one minute, as ``bk-nobody`` would print them."""
    stamp = f"{T0 + dt.timedelta(minutes=minute + 1) + GMT8:%Y-%m-%d %H:%M:%S}"
    return "".join(stats_line(stamp, stat, key, f"SUM: {round(tps * 60)} TPS: {tps:.2f} AVGPT: 1.00") + "\n"
                   for stat, key, tps in (("SNDBCK_PUT_NUMS", f"{TOPIC}@{GROUP}", 900.0),
                                          ("GROUP_GET_NUMS", f"{TOPIC}@{GROUP}", 10.0),
                                          ("TOPIC_PUT_NUMS", TOPIC, 5000.0)))


def failure_line(broker: str, minute: int) -> str:
    return busy_failures(broker, minute, TOPIC, 1)[1]


def table(lake, name: str) -> list[dict]:
    path = lake / name
    return DeltaTable(str(path)).to_pyarrow_table().to_pylist() if (path / "_delta_log").is_dir() else []


def with_known(cfg, known: list[str], refresh_seconds: float, ns_addr: str):
    """``cfg`` with ``[brokers] known`` and ``refresh_seconds`` and the RocketMQ sink on, reading ``ns_addr``."""
    brokers = cfg.brokers.model_copy(update={"known": tuple(known), "refresh_seconds": refresh_seconds})
    rocketmq = cfg.sink.rocketmq.model_copy(update={
        "enabled": True, "namesrv_addr": (ns_addr,), "cluster": "c1", "timeout_ms": 300, "publish_deadline_ms": 500})
    return cfg.model_copy(update={"brokers": brokers, "sink": cfg.sink.model_copy(update={"rocketmq": rocketmq})})


class Logged(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def forged(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("unknown-brokers")
    landing, lake = root / "landing", root / "lake"
    files = [stats_minute(b, m, {TOPIC: 100.0}, {(TOPIC, GROUP): (100.0, 1.0)})
             for m in range(QUIET_MINUTES) for b in BROKERS]
    files += [(f"broker_stats/bk-nobody/m{m:04d}.log", forged_minute(m)) for m in FORGED_MINUTES]
    files += [(f"send_failures/bk-nobody-m{m:04d}.jsonl", busy_failures("bk-nobody", m, TOPIC, 30)[1])
              for m in FORGED_MINUTES]
    files += [("send_failures/one-case.jsonl", failure_line("Broker-A", 6)),
              ("send_failures/one-address.jsonl", failure_line("10.0.0.9:10911", 6))]
    for name, text in files:
        (landing / name).parent.mkdir(parents=True, exist_ok=True)
        (landing / name).write_text(text)
    down = LoopbackNameServer("c1", [])
    down.stop()                                  # nothing listens on its port: unreachable at start
    cfg = with_known(load_config(lean_config_file(root / "lean.toml")).with_paths(str(landing), str(lake)),
                     ["broker-?"], 30.0, down.addr)
    logged = Logged()
    logging.getLogger("rate_governor").addHandler(logged)
    try:
        governor.run(spark, cfg, once=True)
    finally:
        logging.getLogger("rate_governor").removeHandler(logged)
    return {"lake": lake, "cfg": cfg, "log": logged.lines}


def test_the_forged_folder_sets_no_limit_and_raises_no_anomaly(forged):
    assert table(forged["lake"], "gold/limits") == []
    assert table(forged["lake"], "gold/anomalies") == []
    published = forged["lake"] / "control" / "limits.json"
    assert not published.exists() or json.loads(published.read_text())["records"] == []


def test_the_forged_lines_are_quarantined_with_their_reason_and_counted_nowhere(forged):
    lake = forged["lake"]
    rows = [r for r in table(lake, "quarantine") if "bk-nobody" in r["origin"]]
    assert len(rows) == 3 * len(FORGED_MINUTES) + 30 * len(FORGED_MINUTES)
    assert {r["reason"] for r in rows} == {NOT_KNOWN.format("bk-nobody")}
    assert not [r for r in table(lake, "silver/broker_stats") + table(lake, "silver/send_failures")
                if r["broker"] == "bk-nobody"]
    assert {r["broker"] for r in table(lake, "gold/broker_tps")} == set(BROKERS)
    topic = [r for r in table(lake, "gold/topic_tps") if r["topic"] == TOPIC]
    assert len(topic) >= QUIET_MINUTES - 3 and {(r["put_tps"], r["busy_failures"]) for r in topic} == {(200.0, 0)}
    groups = [r for r in table(lake, "gold/group_tps") if r["consumer_group"] == GROUP]
    assert {(r["consume_tps"], r["retry_tps"]) for r in groups} == {(200.0, 2.0)}


def test_the_reconciliation_counts_the_forged_lines_and_balances(forged):
    rows = table(forged["lake"], "quality/reconciliation")
    assert rows and all(r["balanced"] for r in rows)
    quarantined = {s: sum(r["quarantine_rows"] for r in rows if r["source"] == s) for s in ("broker_stats",
                                                                                           "send_failures")}
    assert quarantined == {"broker_stats": 3 * len(FORGED_MINUTES), "send_failures": 30 * len(FORGED_MINUTES) + 2}


def test_a_forged_failure_line_naming_a_broker_in_another_case_or_an_unmapped_address_is_quarantined(forged):
    reasons = {r["origin"].rsplit("/", 1)[-1]: r["reason"] for r in table(forged["lake"], "quarantine")
               if "one-" in r["origin"]}
    assert reasons == {"one-case.jsonl": NOT_KNOWN.format("Broker-A"),
                       "one-address.jsonl": "unknown broker 10.0.0.9:10911 (not in [brokers] addresses)"}


def test_an_unreachable_name_server_at_start_gives_the_configured_list_recorded_for_each_batch(forged):
    assert any("known brokers: broker-? from [brokers] known (no name server answered at start" in line
               for line in forged["log"])
    records = sorted((forged["lake"] / "_checkpoints" / "known_brokers").glob("batch-*.json"))
    assert records and all(json.loads(r.read_text())["known"] == {"names": [], "patterns": ["broker-?"],
                                                                  "source": "[brokers] known"} for r in records)


def test_brokers_joining_and_leaving_the_name_servers_list_mid_run(spark, tmp_path, caplog):
    brokers = {name: LoopbackBroker(name) for name in BROKERS}
    ns = LoopbackNameServer("c1", [brokers["broker-a"]])
    ns.stop()                                    # down at start, no [brokers] known: every broker trusted
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    (landing / "send_failures").mkdir(parents=True)
    conf = write_config(tmp_path / "c.toml", **{"quality.validate_every_n_batches": 0, "windows.trigger_seconds": 1,
                                                 "windows.fast_path": "never"})
    cfg = with_known(load_config(conf).with_paths(str(landing), str(lake)), [], 0.2, ns.addr)

    def landed(name: str, where: str) -> list[dict]:
        return [r for r in table(lake, where) if r["origin"].endswith(name)]

    def land(gov, broker: str, minute: int, where: str) -> list[dict]:
        name, text = stats_minute(broker, minute, {TOPIC: 100.0})
        gov.land(landing, [(name, text)], until=lambda: landed(name, where), what=f"{name} in {where}")
        return landed(name, where)

    def refreshed(gov, words: str) -> None:
        gov.wait(lambda: any(words in r.getMessage() for r in caplog.records), 30, f"a refresh: {words}")

    try:
        with caplog.at_level(logging.INFO, logger="rate_governor"), ContinuousGovernor(spark, cfg, queries=2) as gov:
            assert land(gov, "bk-nobody", 0, "silver/broker_stats")           # today's behaviour ...
            assert sum("every broker name is trusted" in r.getMessage() for r in caplog.records) == 1  # ... said

            ns.restart()                                                       # up, listing broker-a only
            refreshed(gov, "known brokers: broker-a from the name server's cluster c1")
            unknown_b = land(gov, "broker-b", 1, "quarantine")
            assert {r["reason"] for r in unknown_b} == {"unknown broker broker-b (not in the name server's cluster c1)"}

            ns.brokers.append(brokers["broker-b"])                             # broker-b joins
            refreshed(gov, "joined: broker-b")
            assert land(gov, "broker-b", 2, "silver/broker_stats")
            assert landed("broker-b/m0001.log", "quarantine") == unknown_b     # quarantined before: stays there
            assert not landed("broker-b/m0001.log", "silver/broker_stats")

            ns.brokers.remove(brokers["broker-a"])                             # broker-a leaves
            refreshed(gov, "left: broker-a")
            gone = land(gov, "broker-a", 3, "quarantine")
            assert {r["reason"] for r in gone} == {"unknown broker broker-a (not in the name server's cluster c1)"}
            assert gov.running()
        assert all(r["balanced"] for r in table(lake, "quality/reconciliation"))
    finally:
        ns.stop()
        for b in brokers.values():
            b.stop()
