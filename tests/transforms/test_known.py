"""The unknown-broker check (pipelines/dataplane/transforms/known.py) against its Python twin (KnownBrokers.admits) over many
name variants, through both parses; the known set's sources, census and per-batch record
(pipelines/dataplane/known_brokers.py) against a loopback name server. docs/contracts.md §1."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from pipelines.config import GovernorConfig, parse_config
from pipelines.dataplane import known_brokers as kb
from pipelines.dataplane.known_brokers import BatchRecords, KnownBrokers, KnownBrokerSource, expected_brokers
from pipelines.dataplane.transforms import known, silver
from pipelines.config import ConfigError
from tests.helpers import raw_records, stats_line
from tests.rocketmq_loopback import LoopbackBroker, LoopbackNameServer

CONFIGURED = KnownBrokers.of(["broker-a", "broker-b", "rmq-?", "prod-*-x", "a%b*", "c_d?", "back\\slash*"])
#: Case, spacing, look-alikes, LIKE's own special characters, addresses, line breaks, empty, unicode.
NAMES = [
    "broker-a", "broker-b", "Broker-A", "BROKER-A", "broker-A", " broker-a", "broker-a ", "broker-a\n", "broker-ab",
    "broker-", "broker-c", "broker-a\u200b", "rmq-1", "rmq-12", "rmq-", "rmq-\n", "prod--x", "prod-eu-west-x",
    "prod-x", "prod-eu-west-X", "a%b", "a%bzz", "aXb", "a%", "c_d1", "cXd1", "c_d", "back\\slash", "back\\slashes",
    "backslash", "back\\\\slash", "10.0.0.1:10911", "broker-a:10911", "host.example:9876", "[::1]:10911",
    "bk-nobody", "", "brökér-a", "%", "_", "*", "?",
]


def reasons_of(spark, names, known_set):
    df = spark.createDataFrame([(n,) for n in names], StructType([StructField("broker", StringType())]))
    rows = df.select("broker", known.unknown_broker(F.col("broker"), known_set).alias("reason")).collect()
    return {r["broker"]: r["reason"] for r in rows}


def test_the_column_predicate_judges_every_name_as_its_python_twin(spark):
    got = reasons_of(spark, NAMES + [None], CONFIGURED)
    want = {n: None if CONFIGURED.admits(n) else known.unknown_broker_reason(n, "[brokers] known") for n in NAMES}
    for address in ("10.0.0.1:10911", "broker-a:10911", "host.example:9876", "[::1]:10911"):
        want[address] = known.unknown_broker_reason(address, "[brokers] addresses")
    assert got == {**want, None: None}
    accepted = sorted(n for n, reason in got.items() if n is not None and reason is None)
    assert accepted == ["a%b", "a%bzz", "back\\slash", "back\\slashes", "broker-a", "broker-b", "c_d1", "prod--x",
                        "prod-eu-west-x", "rmq-\n", "rmq-1"]


def test_an_exact_set_from_the_name_server_and_trust_all(spark):
    from_ns = KnownBrokers(("broker-a", "broker-b"), (), kb.name_server_source("c1"))
    got = reasons_of(spark, ["broker-a", "Broker-A", "bk-nobody", "10.0.0.9:10911"], from_ns)
    assert got == {"broker-a": None, "Broker-A": "unknown broker Broker-A (not in the name server's cluster c1)",
                   "bk-nobody": "unknown broker bk-nobody (not in the name server's cluster c1)",
                   "10.0.0.9:10911": "unknown broker 10.0.0.9:10911 (not in [brokers] addresses)"}
    assert set(reasons_of(spark, ["bk-nobody", "10.0.0.9:10911"], None).values()) == {None}


def test_both_parses_quarantine_unknown_brokers_after_their_own_checks(spark):
    cfg = parse_config({"brokers": {"addresses": {"10.0.0.1:10911": "broker-a"}}})
    line = stats_line("2022-02-08 15:40:00", "TOPIC_PUT_NUMS", "orders", "SUM: 600 TPS: 10.00 AVGPT: 1.00")
    known_set = KnownBrokers.of(["broker-a"])
    stats = raw_records(spark, "broker_stats", [line, "junk"], "bk-nobody").unionByName(
        raw_records(spark, "broker_stats", [line], "broker-a"))
    parsed = stats.transform(silver.parsed_stats(cfg, known=known_set))
    assert sorted((r["broker"], r["reject_reason"]) for r in parsed.collect()) == [
        ("bk-nobody", "not a stats.log line"),  # the parse's own reason first: one reason per record
        ("bk-nobody", "unknown broker bk-nobody (not in [brokers] known)"),
        ("broker-a", None)]
    failure = '{"ts": 1644305000000, "topic": "orders", "broker": "%s", "message": "[TIMEOUT_CLEAN_QUEUE]"}'
    failures = raw_records(spark, "send_failures", [failure % b for b in ("10.0.0.1:10911", "10.0.0.2:10911",
                                                                          "Broker-A")]
                           + ['{"ts": 1644305000000, "topic": "orders"}'], None)
    got = failures.transform(silver.parsed_failures(cfg, known=known_set)).select("broker", "reject_reason")
    want = spark.createDataFrame([("broker-a", None), ("10.0.0.2:10911",
                                                       "unknown broker 10.0.0.2:10911 (not in [brokers] addresses)"),
                                  ("Broker-A", "unknown broker Broker-A (not in [brokers] known)"), (None, None)],
                                 "broker string, reject_reason string")
    assert_df_equality(got, want, ignore_row_order=True, ignore_nullable=True)


def test_docs_contracts_state_the_reason_and_sources_the_code_writes():
    contracts = Path("docs/contracts.md").read_text(encoding="utf-8")
    assert known.UNKNOWN_BROKER.format(broker="<name>", source="<source>") in contracts
    for source in (kb.CONFIGURED, kb.ADDRESSES, kb.name_server_source("<cluster>"), kb.name_server_source("")):
        assert f"`{source}`" in contracts, source


def test_the_reason_text_and_like_translation():
    assert known.unknown_broker_reason("bk-nobody", "[brokers] known") == \
        "unknown broker bk-nobody (not in [brokers] known)"
    assert known.like_pattern("a%b_c\\d*e?") == "a\\%b\\_c\\\\d%e_"


@pytest.mark.parametrize("entry", ["broker-[ab]", "", "broker a", "broker-]"])
def test_known_entries_that_are_not_names_or_plain_patterns_are_refused(entry):
    with pytest.raises(ConfigError, match="brokers.known"):
        parse_config({"brokers": {"known": [entry]}})


def test_expected_brokers_drops_a_broker_that_left_and_keeps_all_when_trusted():
    now = KnownBrokers(("broker-a", "broker-c"), (), kb.name_server_source("c1"))
    assert expected_brokers(["broker-a", "broker-b", "broker-c"], now) == ["broker-a", "broker-c"]
    assert expected_brokers(["broker-a", "broker-b"], None) == ["broker-a", "broker-b"]


def _ns_config(ns_addr, known_entries=(), cluster="c1"):
    return parse_config({"brokers": {"known": list(known_entries), "refresh_seconds": 0.05},
                         "sink": {"rocketmq": {"enabled": True, "namesrv_addr": [ns_addr], "cluster": cluster,
                                               "timeout_ms": 300}}})


def test_the_name_servers_set_its_refresh_and_an_outage(caplog):
    a, b = LoopbackBroker("broker-a"), LoopbackBroker("broker-b")
    ns = LoopbackNameServer("c1", [a])
    try:
        source = KnownBrokerSource(_ns_config(ns.addr, ["ignored-*"]))
        with caplog.at_level(logging.INFO, logger="rate_governor"):
            assert source.current() == KnownBrokers(("broker-a",), (), "the name server's cluster c1")
            ns.brokers.append(b)                                   # a broker joins
            assert source.refresh().names == ("broker-a", "broker-b")
            ns.stop()                                              # no answer: the set read before stays
            assert source.refresh().names == source.refresh().names == ("broker-a", "broker-b")
        assert "joined: broker-b" in caplog.text
        assert caplog.text.count("no name server answered") == 1   # once per outage
    finally:
        ns.stop()
        a.stop()
        b.stop()


def test_no_name_server_at_start_gives_the_list_or_trust_with_one_warning(caplog):
    ns = LoopbackNameServer("c1", [])
    ns.stop()                                                      # a port nothing listens on
    with caplog.at_level(logging.WARNING, logger="rate_governor"):
        assert KnownBrokerSource(_ns_config(ns.addr, ["broker-*"])).current() == KnownBrokers((), ("broker-*",))
        trusting = KnownBrokerSource(_ns_config(ns.addr))
        assert trusting.current() is None and trusting.current() is None
        assert KnownBrokerSource(GovernorConfig()).current() is None
    assert caplog.text.count("every broker name is trusted") == 2  # once per governor, at its first read
    assert "no name server answered at start" in caplog.text and "the RocketMQ sink is off" in caplog.text


class Changing:
    """A source whose set changes between two reads."""

    def __init__(self, *sets):
        self.sets = list(sets)

    def current(self):
        return self.sets.pop(0)


def test_a_replayed_batch_is_judged_with_the_set_its_first_run_recorded(tmp_path):
    first, later = KnownBrokers.of(["broker-a"]), KnownBrokers.of(["broker-a", "bk-new"])
    records = BatchRecords(tmp_path, Changing(first, later, None))
    assert records.for_batch(7) == first
    assert BatchRecords(tmp_path, Changing(later)).for_batch(7) == first  # a restarted governor replays batch 7
    assert records.for_batch(8) == later
    assert records.for_batch(9) is None and records.for_batch(9) is None   # "every broker trusted" is recorded too
    assert json.loads(records.path(9).read_text()) == {"batch_id": 9, "trusted": "all"}
    records.path(10).write_text("{cut")                                    # unreadable: judged with the current set
    assert BatchRecords(tmp_path, Changing(first)).for_batch(10) == first


def test_records_older_than_the_retained_batches_are_removed(tmp_path):
    records = BatchRecords(tmp_path, Changing(*[None] * 3))
    for batch in (0, 1, kb.RETAINED_BATCHES + 1):
        records.for_batch(batch)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["batch-000000001.json", "batch-000000101.json"]
