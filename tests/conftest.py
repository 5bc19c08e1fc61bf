"""One SparkSession for the whole test session (local[2], 2 shuffle partitions, UI off); with pytest-xdist (on
request: `-n 2 --dist loadfile --no-loadscope-reorder`, a test file at a time per worker) one per worker. The
slowest files run first."""

from __future__ import annotations

import os
import sys

import pytest

# A pytest-xdist worker runs as ``python -c``: its ``__main__`` has no ``__file__``, which pyspark.sql.connect
# (imported by great_expectations) takes for a doctest run and answers with sys.exit(0) when Spark Connect's gRPC
# is not installed, instead of the ImportError that great_expectations expects and skips.
if os.environ.get("PYTEST_XDIST_WORKER") and not hasattr(sys.modules["__main__"], "__file__"):
    sys.modules["__main__"].__file__ = "<pytest-xdist worker>"

from tests.kafka_broker import tansu  # noqa: F401  (session fixture: a real Kafka-protocol broker)

os.environ.setdefault("PYSPARK_PYTHON", os.sys.executable)
#: Tests sign control records with this throw-away key (enforce mode needs one).
TEST_SIGNING_KEY = "test-signing-key-not-a-secret"
os.environ["RATE_GOVERNOR_SIGNING_KEY"] = TEST_SIGNING_KEY

#: The slowest test files, slowest first (each 40-250 s on a fresh clone; the other files take seconds). Run first,
#: so that the two workers start on the long ones and share the short ones at the end, instead of one worker
#: finishing alone with the longest file (pyproject addopts: --dist loadfile --no-loadscope-reorder keeps this order).
SLOWEST_FIRST = (
    "tests/e2e/test_closed_loop_e2e.py",
    "tests/e2e/test_faults.py",
    "tests/e2e/test_two_governors.py",
    "tests/e2e/test_sink_faults.py",
    "tests/e2e/test_two_speeds.py",
    "tests/e2e/test_crash.py",
    "tests/e2e/test_spark_upgrade.py",
    "tests/e2e/test_continuous_decisions.py",
    "tests/e2e/test_governor_e2e.py",
    "tests/e2e/test_unknown_brokers.py",
    "tests/e2e/test_bad_input.py",
    "tests/e2e/test_cluster.py",
    "tests/ops/test_console.py",
)


def pytest_addoption(parser):
    """tests/sim/test_sweep.py: how many randomized closed loops, from which case (default its DEFAULT_CASES)."""
    from tests.sim.test_sweep import DEFAULT_CASES

    parser.addoption("--sweep-cases", type=int, default=int(os.environ.get("SWEEP_CASES", DEFAULT_CASES)),
                     help=f"randomized closed loops of tests/sim/test_sweep.py (default $SWEEP_CASES or "
                          f"{DEFAULT_CASES})")
    parser.addoption("--sweep-first", type=int, default=int(os.environ.get("SWEEP_FIRST", 0)),
                     help="the first case of tests/sim/test_sweep.py (default $SWEEP_FIRST or 0)")


def pytest_terminal_summary(terminalreporter):
    """The sweep's n/a outcomes (tests/sim/test_sweep.py): checks no governor can meet in a case, apart from the
    passed ones."""
    lines = [value for report in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", [])
             for name, value in getattr(report, "user_properties", ()) if name == "sweep_na"]
    if lines:
        terminalreporter.write_sep("-", f"randomized closed loops: {len(lines)} check(s) n/a")
        for line in lines:
            terminalreporter.write_line(line)


def pytest_collection_modifyitems(config, items):
    """On pytest-xdist workers: the files of :data:`SLOWEST_FIRST` first, in its order; every other file after
    them, in collection order (a stable sort: the tests of a file keep their order). One process keeps the
    collection order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    rank = {path: i for i, path in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.fixture(scope="session")
def spark():
    from pipelines.config import SparkConfig
    from pipelines.dataplane.session import build_session

    session = build_session(
        SparkConfig(master="local[2]", app_name="rate-governor-tests", shuffle_partitions=2,
                    # the driver heap of the shipped conf/local.toml (Spark's default, 1 GiB, is what a governor
                    # runs out of first; tests/e2e/test_governor_e2e.py checks that a run leaves nothing cached)
                    conf={"spark.ui.enabled": "false", "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
                          "spark.driver.memory": "4g"})
    )
    yield session
    session.stop()
