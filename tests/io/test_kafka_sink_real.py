"""The Kafka sink against a real Kafka-protocol broker (Tansu, tests/kafka_broker.py) over sockets."""

from __future__ import annotations

import datetime as dt
import json
import uuid

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType

from control.record import sign, verify
from pipelines.config import KafkaSinkConfig
from pipelines.writeback.kafka_sink import KafkaLimitsSink
from tests.conftest import TEST_SIGNING_KEY

KEY = TEST_SIGNING_KEY.encode()
NOW = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.timezone.utc)


def signed(resource, version, qps=40.0, rtype="group"):
    return sign({"resource_type": rtype, "resource": resource, "limit_qps": qps, "burst": int(qps),
                 "breaker_open_ms": 1000, "mode": "enforce", "expires_at": "2026-11-22T10:10:00Z",
                 "version": version, "reason": "test"}, KEY)


def read_all(bootstrap, topic):
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=2000)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    messages = [(m.key.decode(), None if m.value is None else json.loads(m.value)) for m in consumer]
    consumer.close()
    return messages


def test_kafka_sink_on_a_real_broker(tansu):
    topic = f"limits-{uuid.uuid4().hex[:8]}"
    cfg = KafkaSinkConfig(enabled=True, bootstrap_servers=tansu, topic=topic)  # the shipped producer settings
    sink = KafkaLimitsSink(cfg)
    try:
        first = [signed("g1", 1), signed("orders", 1, 500.0, "topic")]
        assert sink.publish([], first) == 2
        second = [signed("g1", 2, 20.0), signed("orders", 1, 500.0, "topic")]
        assert sink.publish(first, second) == 1  # only the changed version
        assert sink.publish(second, second[:1]) == 1  # orders lifted: tombstone
        # the shipped setting ran: the producer is idempotent (kafka-python 3 got a producer id from the broker)
        assert sink.producer.config["enable_idempotence"] is True
        assert sink.producer._transaction_manager.producer_id_and_epoch.producer_id >= 0
    finally:
        sink.close()

    admin = KafkaAdminClient(bootstrap_servers=tansu)
    described = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all")
    admin.close()
    # kafka-python 3: {resource type: {resource name: {config name: {value, ...}}}}
    [entries] = [configs for by_name in described.values() for name, configs in by_name.items() if name == topic]
    assert entries["cleanup.policy"]["value"] == "compact"

    messages = read_all(tansu, topic)
    assert [k for k, _ in messages] == ["group:g1", "topic:orders", "group:g1", "topic:orders"]
    assert messages[-1][1] is None  # tombstone
    latest = {}
    for key, value in messages:
        latest[key] = value
    assert set(k for k, v in latest.items() if v is not None) == {"group:g1"}  # what compaction keeps
    assert latest["group:g1"]["version"] == 2 and latest["group:g1"]["limit_qps"] == 20.0
    for key, value in messages:
        if value is not None:
            assert verify(value, KEY, NOW).ok
            assert key == f"{value['resource_type']}:{value['resource']}"
    tampered = dict(messages[0][1], limit_qps=1e6)
    assert verify(tampered, KEY, NOW).reason == "bad signature"


def test_second_sink_finds_the_topic_existing(tansu):
    topic = f"limits-{uuid.uuid4().hex[:8]}"
    cfg = KafkaSinkConfig(enabled=True, bootstrap_servers=tansu, topic=topic)
    for version in (1, 2):  # a restarted governor: create_topics answers TopicAlreadyExists, which is fine
        sink = KafkaLimitsSink(cfg)
        assert sink.publish([], [signed("g1", version)]) == 1
        sink.close()
    assert [v["version"] for _, v in read_all(tansu, topic)] == [1, 2]
