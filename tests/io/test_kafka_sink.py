"""Kafka write-back against kafka-python's producer API, with a recording stand-in (the real broker: test_sinks.py)."""

from __future__ import annotations

import json

from pipelines.config import KafkaSinkConfig
from pipelines.writeback.kafka_sink import KafkaLimitsSink, changes


class DoneFuture:
    """kafka-python's FutureRecordMetadata, already acknowledged."""

    def get(self, timeout=None):
        return None


class RecordingAdmin:
    """Stands in for kafka.KafkaAdminClient: records the topics it was asked to create."""

    created: list = []

    last: dict = {}

    def __init__(self, **config):
        self.config = config
        RecordingAdmin.last = config

    def create_topics(self, topics):
        RecordingAdmin.created.extend({"name": name, **spec} for name, spec in topics.items())

    def close(self):
        pass


class RecordingProducer:
    """Stands in for kafka.KafkaProducer: records the config and every (topic, key, value) after serialisation."""

    def __init__(self, **config):
        self.config = config
        self.sent: list[tuple[str, bytes, bytes | None]] = []
        self.flushed = 0

    def send(self, topic, key=None, value=None):
        serialize = {name: self.config[name].serialize for name in ("key_serializer", "value_serializer")}
        self.sent.append((topic, serialize["key_serializer"](topic, None, key), serialize["value_serializer"](topic, None, value)))
        return DoneFuture()

    def flush(self, timeout=None):
        self.flushed += 1

    def close(self):
        pass


def record(resource, version, qps=40.0, rtype="group"):
    return {"resource_type": rtype, "resource": resource, "limit_qps": qps, "version": version, "signature": "ab"}


def sink(**options):
    cfg = KafkaSinkConfig(enabled=True, bootstrap_servers="k1:9093,k2:9093", topic="limits", options=options)
    return KafkaLimitsSink(cfg, producer_factory=RecordingProducer, admin_factory=RecordingAdmin)


def test_changes_sends_new_versions_and_tombstones_only():
    before = [record("g", 1), record("h", 3)]
    after = [record("g", 1), record("x", 1, rtype="topic")]
    assert changes(before, after) == [("group:h", None), ("topic:x", record("x", 1, rtype="topic"))]
    assert changes(after, after) == []


def test_publish_keys_json_values_tombstone_and_flush():
    s = sink()
    assert s.publish([], [record("g", 1)]) == 1
    assert s.publish([record("g", 1)], [record("g", 2, qps=20.0)]) == 1
    assert s.publish([record("g", 2)], []) == 1
    topics, keys, values = zip(*s.producer.sent)
    assert set(topics) == {"limits"} and keys == (b"group:g",) * 3
    assert json.loads(values[0])["limit_qps"] == 40.0 and json.loads(values[1])["version"] == 2
    assert values[2] is None  # tombstone on lift: compaction removes the key
    assert s.producer.flushed == 3
    assert RecordingAdmin.created[-1] == {"name": "limits", "num_partitions": 1, "replication_factor": 1,
                                          "configs": {"cleanup.policy": "compact"}}


def test_republishing_the_same_set_is_idempotent():
    s = sink()
    current = [record("g", 5)]
    assert s.publish(current, current) == 0 and s.producer.sent == []


def test_producer_settings_and_security_passthrough():
    s = sink(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="governor")
    c = s.producer.config
    assert c["bootstrap_servers"] == ["k1:9093", "k2:9093"]
    assert c["acks"] == "all" and c["enable_idempotence"] is True
    assert sink(enable_idempotence=False).producer.config["enable_idempotence"] is False  # options override
    assert (c["security_protocol"], c["sasl_mechanism"], c["sasl_plain_username"]) == ("SASL_SSL", "SCRAM-SHA-512", "governor")


def test_real_kafka_clients_accept_every_setting_the_sink_passes():
    """kafka-python refuses an unknown setting (3.0 renamed ``api_version_auto_timeout_ms`` to
    ``bootstrap_timeout_ms``): every name the sink passes must be one the installed client knows."""
    from kafka import KafkaAdminClient, KafkaProducer

    s = sink(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512", request_timeout_ms=2500)
    unknown = set(s.producer.config) - set(KafkaProducer.DEFAULT_CONFIG)
    assert not unknown, f"settings kafka-python's producer does not know: {sorted(unknown)}"
    s.publish([], [record("g", 1)])
    admin = RecordingAdmin.last
    assert not set(admin) - set(KafkaAdminClient.DEFAULT_CONFIG)
    assert admin["bootstrap_timeout_ms"] == 2000 and admin["request_timeout_ms"] == 2500  # a down cluster: bounded
    assert admin["security_protocol"] == "SASL_SSL" and "acks" not in admin


def test_serializers_are_kafka_python_serializers():
    """A plain callable is deprecated in kafka-python 3 (wrapped with a DeprecationWarning)."""
    from kafka.serializer import Serializer

    config = sink().producer.config
    assert isinstance(config["key_serializer"], Serializer) and isinstance(config["value_serializer"], Serializer)
    assert config["value_serializer"].serialize("t", [], {"b": 1, "a": 2}) == b'{"a": 2, "b": 1}'
    assert config["value_serializer"].serialize("t", [], None) is None
