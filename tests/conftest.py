"""One SparkSession for the whole test session (local[2], 2 shuffle partitions, UI off)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("PYSPARK_PYTHON", os.sys.executable)


@pytest.fixture(scope="session")
def spark():
    from pipelines.config import SparkConfig
    from pipelines.session import build_session

    session = build_session(
        SparkConfig(master="local[2]", app_name="rate-governor-tests", shuffle_partitions=2,
                    conf={"spark.ui.enabled": "false", "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true"})
    )
    yield session
    session.stop()
