"""The reference applier's Kafka mode against a real Kafka-protocol broker (Tansu), fed by the governor's Kafka sink;
and control/ never importing pyspark."""

from __future__ import annotations

import datetime as dt
import json
import pkgutil
import subprocess
import sys
import time
import uuid

from kafka import KafkaProducer

import control
from control.applier import LimitApplier
from control.kafka_applier import KafkaLimitsConsumer
from control.record import sign
from pipelines.config import KafkaSinkConfig
from pipelines.writeback.kafka_sink import KafkaLimitsSink
from tests.conftest import TEST_SIGNING_KEY

KEY = TEST_SIGNING_KEY.encode()
NOW = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.timezone.utc)
CLOCK = NOW.timestamp


def signed(resource, version, qps=40.0, rtype="group", key=KEY):
    return sign({"resource_type": rtype, "resource": resource, "limit_qps": qps, "burst": int(qps),
                 "breaker_open_ms": 1000, "mode": "enforce", "expires_at": "2026-11-22T10:10:00Z",
                 "version": version, "reason": "test"}, key)


def publish_with_the_sink(bootstrap, topic, *steps, previous=()):
    """Publish each set of ``steps`` in turn, as the governor does (``previous`` = the set already published)."""
    sink = KafkaLimitsSink(KafkaSinkConfig(enabled=True, bootstrap_servers=bootstrap, topic=topic))
    previous = list(previous)
    for current in steps:
        sink.publish(previous, current)
        previous = current
    sink.close()


def drain(consumer, expected, timeout_s=15.0):
    deadline = time.monotonic() + timeout_s
    while consumer.applied + consumer.refused < expected and time.monotonic() < deadline:
        consumer.poll_once(200)


def test_applier_replays_the_compacted_topic_without_a_group(tansu):
    topic = f"limits-{uuid.uuid4().hex[:8]}"
    first = [signed("g1", 1), signed("orders", 1, 500.0, "topic")]
    publish_with_the_sink(tansu, topic, first, [signed("g1", 2, 20.0), first[1]], [signed("g1", 2, 20.0)])
    forged = KafkaProducer(bootstrap_servers=tansu, acks="all")
    forged.send(topic, key=b"group:g2", value=b"{not json")
    forged.send(topic, key=b"group:g3", value=json.dumps(signed("g3", 1, key=b"wrong-key")).encode())
    forged.flush()
    forged.close()

    applier = LimitApplier(KEY, default_qps_by_type={"group": 100.0}, clock=CLOCK)
    consumer = KafkaLimitsConsumer(applier, tansu, topic)
    try:
        drain(consumer, expected=6)
    finally:
        consumer.close()
    assert (consumer.applied, consumer.refused) == (4, 2)  # g1 v1, orders, g1 v2, orders tombstone | 2 forged
    assert applier.current_record("group", "g1", int(NOW.timestamp() * 1000))["limit_qps"] == 20.0
    assert applier.current_record("topic", "orders", int(NOW.timestamp() * 1000)) is None  # lifted by tombstone
    reasons = dict(applier.refused)
    assert reasons["group:g2"].startswith("malformed JSON") and reasons["group:g3"] == "bad signature"
    assert applier.decide("group", "g1", int(NOW.timestamp() * 1000)).limit_qps == 20.0


def test_applier_with_a_group_commits_and_resumes(tansu):
    topic = f"limits-{uuid.uuid4().hex[:8]}"
    group = f"applier-{uuid.uuid4().hex[:6]}"
    publish_with_the_sink(tansu, topic, [signed("g1", 1)])
    applier = LimitApplier(KEY, clock=CLOCK)
    # Tansu completes a group's first join only after half the session timeout: kafka-python 3's default of 45 s
    # (KIP-735) would outlast drain(); 10 s was kafka-python 2's default.
    consumer = KafkaLimitsConsumer(applier, tansu, topic, group_id=group, session_timeout_ms=10000)
    try:
        drain(consumer, expected=1)
        assert consumer.applied == 1
        consumer.consumer.commit()
    finally:
        consumer.close()
    publish_with_the_sink(tansu, topic, [], previous=[signed("g1", 1)])  # lift: a tombstone
    again = KafkaLimitsConsumer(applier, tansu, topic, group_id=group, session_timeout_ms=10000)
    try:
        drain(again, expected=1)
    finally:
        again.close()
    assert (again.applied, again.refused) == (1, 0)  # only the tombstone: the group resumed after v1
    assert applier.current_record("group", "g1", int(NOW.timestamp() * 1000)) is None


def test_control_modules_never_import_pyspark_nor_the_governor():
    """control/ runs next to a broker: neither pyspark nor the governor's own package (pipelines) may load."""
    names = [f"control.{m.name}" for m in pkgutil.iter_modules(control.__path__)]
    assert {"control.record", "control.applier", "control.remoting", "control.kafka_applier"} <= set(names)
    code = ("import importlib, sys\n"
            f"for name in {names!r}: importlib.import_module(name)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'pipelines'))[:3])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_kafka_applier_cli_fails_with_one_line():
    run = [sys.executable, "-m", "control.kafka_applier", "--bootstrap-servers", "127.0.0.1:1"]
    no_key = subprocess.run(run + ["--key-env", "RATE_GOVERNOR_TEST_UNSET"], capture_output=True, text=True, timeout=60)
    assert no_key.returncode == 2 and no_key.stderr.strip() == (
        "python -m control.kafka_applier: no signing key (set $RATE_GOVERNOR_TEST_UNSET or --key-file)")
    started = time.monotonic()
    no_broker = subprocess.run(run + ["--bootstrap-timeout-ms", "2000"], capture_output=True, text=True, timeout=60)
    assert no_broker.returncode == 1 and time.monotonic() - started < 20  # the timeout is passed on (default 30 s)
    # kafka-python 3 gives up on the first connection with KafkaTimeoutError (2.x: NoBrokersAvailable)
    assert no_broker.stderr.strip() == (
        "python -m control.kafka_applier: KafkaTimeoutError: Unable to bootstrap from ['127.0.0.1:1']")
