"""One SparkSession for the whole test session (local[2], 2 shuffle partitions, UI off)."""

from __future__ import annotations

import os

import pytest

from tests.kafka_broker import tansu  # noqa: F401  (session fixture: a real Kafka-protocol broker)

os.environ.setdefault("PYSPARK_PYTHON", os.sys.executable)
#: Tests sign control records with this throw-away key (enforce mode needs one).
TEST_SIGNING_KEY = "test-signing-key-not-a-secret"
os.environ["RATE_GOVERNOR_SIGNING_KEY"] = TEST_SIGNING_KEY


@pytest.fixture(scope="session")
def spark():
    from pipelines.config import SparkConfig
    from pipelines.session import build_session

    session = build_session(
        SparkConfig(master="local[2]", app_name="rate-governor-tests", shuffle_partitions=2,
                    # the driver heap of the shipped conf/local.toml (Spark's default, 1 GiB, is what a governor
                    # runs out of first; tests/e2e/test_governor_e2e.py checks that a run leaves nothing cached)
                    conf={"spark.ui.enabled": "false", "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
                          "spark.driver.memory": "4g"})
    )
    yield session
    session.stop()
