"""Kafka write-back of the control records (production transport), a thin layer over the records the file sink
writes (:mod:`pipelines.writeback.publish`).

Compacted topic, key ``<resource_type>:<resource>`` (UTF-8), value the control record as JSON (docs/contracts.md §3), a
tombstone (null value) when a limit leaves the current set (lifted or expired). Only records whose version changed
since the previous set are sent, so republishing the same set sends nothing; a replay after a crash re-sends the
same versions, which brokers accept idempotently (same version, same record). The producer uses ``acks="all"`` and
kafka-python's idempotent producer (no duplicate of a record its own retries re-sent; tested against Tansu, whose
``InitProducerId`` kafka-python 3 uses); ``[sink.kafka] options`` override these and add security settings
(SASL/SSL). A cluster that refuses the idempotent producer (a broker before 0.11, or an ACL without
``IdempotentWrite`` on brokers before 2.8) fails every publish with its error in ``control/sink_status``: set
``options = {enable_idempotence = false}`` there.
Before the first send the topic is created compacted (``cleanup.policy=compact``) if it does not exist.

kafka-python 3 (the supported line, ``pyproject.toml``): serializers are :class:`kafka.serializer.Serializer`
objects (a plain callable is deprecated there), ``create_topics`` takes ``{name: {...}}`` (``NewTopic`` is
deprecated), and the first-connection timeout is ``bootstrap_timeout_ms`` (2.x's ``api_version_auto_timeout_ms`` is
refused as an unknown setting).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from kafka.serializer import Serializer

from pipelines.config import KafkaSinkConfig
from control.record import record_key

ProducerFactory = Callable[..., Any]
#: Producer settings the sink starts from; ``[sink.kafka] options`` override them.
PRODUCER_DEFAULTS: dict[str, Any] = {"acks": "all", "enable_idempotence": True}


def changes(previous: list[Mapping[str, Any]], current: list[Mapping[str, Any]]) -> list[tuple[str, dict | None]]:
    """(key, record or None for a tombstone) for every record new or changed in ``current`` (by version) and every
    key of ``previous`` missing from ``current``; sorted by key."""
    before = {record_key(r): r.get("version") for r in previous}
    now = {record_key(r): dict(r) for r in current}
    sends: list[tuple[str, dict | None]] = [(k, r) for k, r in now.items() if before.get(k) != r.get("version")]
    sends += [(k, None) for k in before if k not in now]
    return sorted(sends, key=lambda kv: kv[0])


#: Producer timeouts (ms) that bound how long one publish attempt can block when the cluster is down (kafka-python's
#: defaults would block a micro-batch for up to 60 s in ``send``, 120 s for delivery and 30 s for the first
#: connection); ``[sink.kafka] options`` override them.
PRODUCER_TIMEOUTS: dict[str, int] = {
    "max_block_ms": 2000,
    "request_timeout_ms": 2000,
    "delivery_timeout_ms": 3000,
    "bootstrap_timeout_ms": 2000,
    "reconnect_backoff_max_ms": 1000,
}
#: Settings the topic-creating admin client takes from the producer's (after ``[sink.kafka] options``): the same
#: bounds on a down cluster, the same security settings.
ADMIN_SETTINGS = ("request_timeout_ms", "bootstrap_timeout_ms")
ADMIN_SETTING_PREFIXES = ("security_", "sasl_", "ssl_")


class KeySerializer(Serializer):
    """The record key ``<resource_type>:<resource>`` as UTF-8."""

    def serialize(self, topic, headers, data):
        return data.encode("utf-8")


class RecordSerializer(Serializer):
    """The control record as JSON (keys sorted), or None (a tombstone) for a lifted limit."""

    def serialize(self, topic, headers, data):
        return None if data is None else json.dumps(data, sort_keys=True).encode("utf-8")


class KafkaLimitsSink:
    """Publishes control-record changes to a compacted Kafka topic with kafka-python's ``KafkaProducer``.

    The producer is created on the first publish (and again after a failed one), so the governor starts while the
    cluster is unreachable; :class:`pipelines.writeback.sinks.SinkSet` retries, reports and catches up.
    """

    name = "kafka"

    def __init__(self, cfg: KafkaSinkConfig, producer_factory: ProducerFactory | None = None,
                 admin_factory: ProducerFactory | None = None) -> None:
        if producer_factory is None:
            from kafka import KafkaProducer

            producer_factory = KafkaProducer
        self.topic = cfg.topic
        self.cfg = cfg
        self.admin_factory = admin_factory
        self.topic_ready = False
        self._factory = producer_factory
        self._config = {
            "bootstrap_servers": cfg.bootstrap_servers.split(","),
            "key_serializer": KeySerializer(),
            "value_serializer": RecordSerializer(),
            **PRODUCER_DEFAULTS,
            **PRODUCER_TIMEOUTS,
            **dict(cfg.options),
        }
        self._producer: Any = None
        #: :class:`pipelines.writeback.sinks.LimitsSink` ``status``: always empty, a failed publish raises.
        self.status: dict[str, str] = {}

    @property
    def producer(self) -> Any:
        """The connected producer (connects on first use; raises kafka-python's KafkaTimeoutError when the cluster is
        down)."""
        if self._producer is None:
            self._producer = self._factory(**self._config)
        return self._producer

    def ensure_topic(self) -> None:
        """Create the topic compacted, one partition (one ordered log of decisions), unless it exists. Uses
        ``create_topics`` only: kafka-python's ``list_topics`` is not needed (and fails on some brokers)."""
        from kafka.errors import TopicAlreadyExistsError

        if self.admin_factory is None:
            from kafka import KafkaAdminClient

            admin_factory = KafkaAdminClient
        else:
            admin_factory = self.admin_factory
        options = {k: v for k, v in self._config.items()
                   if k in ADMIN_SETTINGS or k.startswith(ADMIN_SETTING_PREFIXES)}
        admin = admin_factory(bootstrap_servers=self.cfg.bootstrap_servers.split(","), **options)
        try:
            admin.create_topics({self.topic: {"num_partitions": 1, "replication_factor": self.cfg.replication_factor,
                                              "configs": {"cleanup.policy": "compact"}}})
        except TopicAlreadyExistsError:
            pass
        finally:
            admin.close()
        self.topic_ready = True

    def publish(self, previous: list[Mapping[str, Any]], current: list[Mapping[str, Any]]) -> int:
        """Send the changes from ``previous`` to ``current`` and wait for the broker's acknowledgement of each.

        Returns the number of messages sent. Raises kafka-python's errors (KafkaTimeoutError,
        a broker's refusal) when the cluster is unreachable or refuses one; the producer is then dropped (and the
        topic checked again) and the next call connects anew.
        """
        sends = changes(previous, current)
        if not sends:
            return 0
        timeout = self._config["delivery_timeout_ms"] / 1000 + 1
        try:
            if not self.topic_ready:
                self.ensure_topic()
            producer = self.producer
            futures = [producer.send(self.topic, key=key, value=record) for key, record in sends]
            producer.flush(timeout=timeout)
            for future in futures:
                if future is not None:  # a recording stand-in returns None
                    future.get(timeout=timeout)
        except Exception:
            self._drop()
            self.topic_ready = False
            raise
        return len(sends)

    def _drop(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.close(timeout=0)
            except Exception:  # noqa: BLE001 - a half-open producer may fail to close; it is dropped either way
                pass

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
            self._producer = None
