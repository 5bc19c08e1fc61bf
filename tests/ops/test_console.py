"""Quiet by default: the Python loggers, the driver JVM's log4j2 file, and a real pyspark-launched JVM each way."""

from __future__ import annotations

import datetime as dt
import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.ops import console

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, {n: logging.getLogger(n).level for n in
                                               (console.GOVERNOR_LOGGER, *console.CHATTY_LOGGERS)})
    yield
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    for name, level in saved[2].items():
        logging.getLogger(name).setLevel(level)


def test_quiet_shows_governor_lines_and_warnings_only(restore_logging):
    out = io.StringIO()
    console.configure_logging(verbose=False, stream=out)
    logging.getLogger("rate_governor.progress").info("ingest batch 0: 10 rows")
    logging.getLogger("rate_governor").debug("ingest batch 0: rows {...}")
    logging.getLogger("py4j.clientserver").warning("callback server notice")
    gx_base = logging.getLogger("great_expectations.data_context.types.base")
    gx_base.setLevel(logging.INFO)  # as GX does when it is imported, after the CLI configured logging
    gx_base.info("Created temporary directory")
    logging.getLogger("kafka.producer").warning("broker unreachable")
    logging.getLogger("some.library").info("chatter")
    lines = out.getvalue().splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == ["ingest batch 0: 10 rows", "WARNING: broker unreachable"]


def test_verbose_shows_debug_lines_and_library_info(restore_logging):
    out = io.StringIO()
    logging.getLogger("great_expectations.data_context.types.base").setLevel(logging.INFO)  # as GX does on import
    console.configure_logging(verbose=True, stream=out)
    logging.getLogger("rate_governor").debug("ingest batch 0: rows {...}")
    logging.getLogger("great_expectations.data_context.types.base").info("Created temporary directory")
    text = out.getvalue()
    assert "DEBUG rate_governor: ingest batch 0: rows {...}" in text
    assert "Created temporary directory" in text


def test_driver_java_options():
    option = console.driver_java_options(False)
    assert option == f"-Dlog4j2.configurationFile={console.LOG4J2_CONFIG.as_uri()}"
    assert console.LOG4J2_CONFIG.is_file()
    assert console.driver_java_options(False, "-Xss4m") == f"{option} -Xss4m"  # options from the config are kept
    assert console.driver_java_options(True, "-Xss4m") == "-Xss4m"
    assert console.driver_java_options(True) is None
    own = "-Dlog4j2.configurationFile=file:/etc/spark/log4j2.properties"
    assert console.driver_java_options(False, own) == own  # an operator's own log4j2 file wins


SESSION_SCRIPT = """
import sys
from pipelines.config import SparkConfig
from pipelines.dataplane.session import build_session
spark = build_session(SparkConfig(master="local[1]", app_name="console-test", shuffle_partitions=1),
                      verbose=sys.argv[1] == "verbose")
spark.range(3).count()
# a stateful query (Spark 4.1+ warns that it disables AQE) on a trigger shorter than any micro-batch (Spark warns
# that the query is falling behind)
rate = spark.readStream.format("rate").option("rowsPerSecond", 10).load()
query = (rate.groupBy((rate.value % 2).alias("parity")).count().writeStream.format("noop").outputMode("complete")
         .trigger(processingTime="1 millisecond").start())
import time
deadline = time.monotonic() + 120
while len(query.recentProgress) < 3 and time.monotonic() < deadline:   # a few micro-batches, however loaded
    time.sleep(0.5)
query.stop()
spark.stop()
"""


@pytest.mark.slow
def test_pyspark_launched_jvm_is_quiet_unless_verbose(tmp_path):
    """The driver JVM that pyspark launches reads conf/log4j2.properties: Spark's start-up notices are gone."""
    # the two drivers side by side, one per core
    runs = {mode: subprocess.Popen([sys.executable, "-c", SESSION_SCRIPT, mode], cwd=ROOT, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
            for mode in ("verbose", "quiet")}
    out = {}
    try:
        for mode, run in runs.items():
            out[mode] = run.communicate(timeout=300)[1]
            assert run.returncode == 0, out[mode][-2000:]
    finally:
        for run in runs.values():
            if run.poll() is None:
                run.kill()
                run.communicate()
    verbose, quiet = out["verbose"], out["quiet"]
    assert "Using Spark's default log4j profile" in verbose
    assert "NativeCodeLoader" in verbose  # Spark's defaults print it on this platform
    assert "is falling behind" in verbose
    aqe = "Disabling AQE since AQE is not supported in stateful workloads"
    import pyspark
    assert aqe in verbose or pyspark.__version__ < "4.1", "Spark 4.1+ says it disables AQE for a stateful query"
    for notice in ("Using Spark's default log4j profile", "NativeCodeLoader", "resolves to a loopback address",
                   "Setting default log level", "is falling behind", aqe):
        assert notice not in quiet, notice


def test_a_limit_is_summarised_by_what_happened_to_it():
    """Six `set` rows at 30.3 msg/s are one limit set and refreshed 5 times; a final row confirming its preliminary
    row of the same window is no refresh; a change and a lift are told as such."""
    t = lambda minute: dt.datetime(2026, 1, 5, 10, tzinfo=dt.timezone.utc) + dt.timedelta(minutes=minute)  # noqa: E731
    row = lambda r, action, qps, minute, v, basis="final": {  # noqa: E731
        "resource_type": "group", "resource": r, "action": action, "limit_qps": qps, "mode": "enforce",
        "basis": basis, "window_end": t(minute), "version": v}
    rows = [row("g", "set", 30.3, 51, 1, "preliminary"), row("g", "set", 30.3, 51, 2)] + [
        row("g", "set", 30.3, 51 + 5 * i, 2 + i) for i in range(1, 6)] + [
        row("h", "set", 94.0, 40, 1), row("h", "set", 17.1, 43, 2), row("h", "set", 17.1, 48, 3),
        row("h", "lift", 17.1, 55, 4)]
    assert console.limit_stories(rows) == [
        "group g: set at 10:51 to 30.3 msg/s (enforce), refreshed 5 times, still in force",   # to 11:16
        "group h: set at 10:40 to 94.0 msg/s (enforce), lowered to 17.1 msg/s at 10:43, refreshed 1 time, "
        "lifted at 10:55"]
