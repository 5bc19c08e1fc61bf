"""Kafka write-back of the control records (production transport), a thin layer over the records the file sink
writes (:mod:`pipelines.io.publish`).

Compacted topic, key ``<resource_type>:<resource>`` (UTF-8), value the control record as JSON (docs/contracts.md §3), a
tombstone (null value) when a limit leaves the current set (lifted or expired). Only records whose version changed
since the previous set are sent, so republishing the same set sends nothing; a replay after a crash re-sends the
same versions, which brokers accept idempotently (same version, same record). The producer uses ``acks="all"`` and
kafka-python's idempotent producer; security settings (SASL/SSL) come from ``[sink.kafka] options``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from pipelines.config import KafkaSinkConfig
from control.record import record_key

ProducerFactory = Callable[..., Any]


def changes(previous: list[Mapping[str, Any]], current: list[Mapping[str, Any]]) -> list[tuple[str, dict | None]]:
    """(key, record or None for a tombstone) for every record new or changed in ``current`` (by version) and every
    key of ``previous`` missing from ``current``; sorted by key."""
    before = {record_key(r): r.get("version") for r in previous}
    now = {record_key(r): dict(r) for r in current}
    sends: list[tuple[str, dict | None]] = [(k, r) for k, r in now.items() if before.get(k) != r.get("version")]
    sends += [(k, None) for k in before if k not in now]
    return sorted(sends, key=lambda kv: kv[0])


class KafkaLimitsSink:
    """Publishes control-record changes to a compacted Kafka topic with kafka-python's ``KafkaProducer``."""

    name = "kafka"

    def __init__(self, cfg: KafkaSinkConfig, producer_factory: ProducerFactory | None = None) -> None:
        if producer_factory is None:
            from kafka import KafkaProducer

            producer_factory = KafkaProducer
        self.topic = cfg.topic
        self.producer = producer_factory(
            bootstrap_servers=cfg.bootstrap_servers.split(","),
            acks="all",
            enable_idempotence=True,
            key_serializer=lambda key: key.encode("utf-8"),
            value_serializer=lambda value: None if value is None else json.dumps(value, sort_keys=True).encode("utf-8"),
            **dict(cfg.options),
        )

    def publish(self, previous: list[Mapping[str, Any]], current: list[Mapping[str, Any]]) -> int:
        """Send the changes from ``previous`` to ``current`` and wait for the broker's acknowledgement.

        Returns the number of messages sent. Raises kafka-python's errors when the cluster refuses them.
        """
        sent = 0
        for key, record in changes(previous, current):
            self.producer.send(self.topic, key=key, value=record)
            sent += 1
        self.producer.flush()
        return sent

    def close(self) -> None:
        self.producer.close()
