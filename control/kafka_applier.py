"""Kafka mode of the reference applier: a kafka-python consumer of the compacted control topic feeding a
:class:`control.applier.LimitApplier`.

The topic is what :mod:`pipelines.writeback.kafka_sink` writes (docs/contracts.md §3): key
``<resource_type>:<resource>``, value the signed record as JSON, tombstone (null value) on lift. Every message goes
through ``LimitApplier.apply((key, value))``, so forged, tampered, expired, stale or malformed records are refused
there and a tombstone lifts the limit back to the default.

Two ways to read:

- without a group (``group_id=None``, the default): every partition is assigned and read from the beginning, so
  each start replays the compacted log, i.e. the whole current set; nothing is committed. This is what a broker
  wants: its limits come back after a restart.
- with a group: ``subscribe`` with ``auto_offset_reset="earliest"`` and committed offsets, for appliers that keep
  their own state across restarts.

No pyspark here (this runs next to a broker).
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from control.applier import LimitApplier
from control.record import SigningKeyError, load_signing_key

__all__ = ["KafkaLimitsConsumer", "main"]

log = logging.getLogger("rate_governor.applier.kafka")


class KafkaLimitsConsumer:
    """Reads the control topic and applies every message to ``applier``.

    ``options`` are passed to kafka-python's ``KafkaConsumer`` (security settings, timeouts). Counters:
    ``applied`` (records applied or tombstones lifted) and ``refused`` (see ``applier.refused`` for reasons).
    """

    def __init__(self, applier: LimitApplier, bootstrap_servers: str, topic: str, group_id: str | None = None,
                 consumer_factory: Callable[..., Any] | None = None, **options: Any) -> None:
        if consumer_factory is None:
            from kafka import KafkaConsumer

            consumer_factory = KafkaConsumer
        self.applier = applier
        self.topic = topic
        self.group_id = group_id
        self.applied = 0
        self.refused = 0
        settings = {"bootstrap_servers": bootstrap_servers.split(","), "group_id": group_id,
                    "enable_auto_commit": group_id is not None, "auto_offset_reset": "earliest", **options}
        self.consumer = consumer_factory(**settings)
        if group_id is not None:
            self.consumer.subscribe([topic])
        else:
            self._assign_all()

    def _assign_all(self, wait_s: float = 10.0) -> None:
        from kafka import TopicPartition

        deadline = time.monotonic() + wait_s
        partitions = self.consumer.partitions_for_topic(self.topic)
        while not partitions and time.monotonic() < deadline:
            time.sleep(0.1)
            partitions = self.consumer.partitions_for_topic(self.topic)
        if not partitions:
            raise LookupError(f"control topic {self.topic!r} not found (no partitions)")
        assigned = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        self.consumer.assign(assigned)
        self.consumer.seek_to_beginning(*assigned)

    def poll_once(self, timeout_ms: int = 1000) -> int:
        """Apply whatever arrives within ``timeout_ms``; returns the number of messages handled."""
        handled = 0
        for messages in self.consumer.poll(timeout_ms=timeout_ms).values():
            for message in messages:
                if self.applier.apply((message.key, message.value)):
                    self.applied += 1
                else:
                    self.refused += 1
                handled += 1
        return handled

    def run(self, stop: threading.Event, timeout_ms: int = 1000) -> None:
        """Poll until ``stop`` is set."""
        while not stop.is_set():
            self.poll_once(timeout_ms)

    def close(self) -> None:
        self.consumer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m control.kafka_applier",
                                     description="Reference applier fed from the compacted control topic.")
    parser.add_argument("--bootstrap-servers", required=True, help="host:port[,host:port...]")
    parser.add_argument("--topic", default="rate-governor-limits")
    parser.add_argument("--group", help="consumer group (default: none; replay the compacted topic on start)")
    parser.add_argument("--key-env", default="RATE_GOVERNOR_SIGNING_KEY", help="environment variable with the key")
    parser.add_argument("--key-file", help="file with the signing key (when the variable is unset)")
    parser.add_argument("--default-qps", type=float, help="limit of resources without a record (default: none)")
    parser.add_argument("--bootstrap-timeout-ms", type=int,
                        help="how long to try the first connection before giving up (default: kafka-python's, 30 s "
                             "in kafka-python 3)")
    parser.add_argument("--broker", help="this broker's name (brokerName): apply its own share of a limit that "
                                         "carries per-broker figures (default: the cluster-wide limit)")
    args = parser.parse_args(argv)
    try:
        key = load_signing_key(args.key_env, args.key_file)
    except SigningKeyError as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 2
    if not key:
        print(f"{parser.prog}: no signing key (set ${args.key_env} or --key-file)", file=sys.stderr)
        return 2
    try:
        options = {} if args.bootstrap_timeout_ms is None else {"bootstrap_timeout_ms": args.bootstrap_timeout_ms}
        consumer = KafkaLimitsConsumer(LimitApplier(key, args.default_qps, broker=args.broker),
                                       args.bootstrap_servers, args.topic, args.group, **options)
    # kafka-python's KafkaTimeoutError (3.x; NoBrokersAvailable in 2.x), LookupError: one line, exit != 0
    except Exception as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 1
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    try:
        consumer.run(stop)
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
