"""The write-back sinks besides ``control/limits.json``: one decision stream, one record shape.

Every sink takes the same control records (docs/contracts.md §3) that :mod:`pipelines.io.publish` writes to
``<lake>/control/limits.json`` and pushes the *changes* between two sets of them to its transport.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from pipelines.config import GovernorConfig


class LimitsSink(Protocol):
    """A transport for control records (Kafka topic, RocketMQ admin requests, ...)."""

    #: Short name for logs and status rows, e.g. ``"kafka"``.
    name: str

    def publish(self, previous: list[Mapping[str, Any]], current: list[Mapping[str, Any]]) -> int:
        """Push the changes from ``previous`` to ``current``; returns how many changes were sent."""

    def close(self) -> None:
        """Release connections."""


def build_sinks(cfg: GovernorConfig) -> list[LimitsSink]:
    """The sinks enabled in ``[sink]`` of ``cfg``, in publishing order."""
    sinks: list[LimitsSink] = []
    if cfg.sink.kafka.enabled:
        from pipelines.io.kafka_sink import KafkaLimitsSink

        sinks.append(KafkaLimitsSink(cfg.sink.kafka))
    if cfg.sink.rocketmq.enabled:
        from pipelines.io.rocketmq_sink import RocketMQAdminSink

        sinks.append(RocketMQAdminSink(cfg.sink.rocketmq, cfg.lake.path))
    return sinks
