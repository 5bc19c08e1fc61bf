"""The one place a SparkSession is built, for the jobs and the tests.

The session time zone is UTC: every timestamp column of rate-governor is UTC (stats.log's GMT+8 is converted at
parse time). When the Delta jars are on the classpath (a cluster with delta-spark installed), the Delta SQL
extension and catalog are enabled; otherwise Delta tables are written with delta-rs (see
:mod:`pipelines.dataplane.lake`).
"""

from __future__ import annotations

import glob
import os
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import pyspark
from pyspark.sql import SparkSession

from pipelines.config import SparkConfig
from pipelines.ops import console

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
DELTA_PROBE_CLASS = "org.apache.spark.sql.delta.DeltaLog"


#: How long the driver's JVM and Python wait for each other when a collect hands rows over (Spark's default: 15 s).
AUTH_SOCKET_TIMEOUT_SECONDS = 120
#: Generated classes Spark keeps compiled (``spark.sql.codegen.cache.maxEntries``, a static setting; Spark's default:
#: 100). A governor's three queries generate several hundred distinct classes per stats minute; with 100 entries
#: the cache evicted them between micro-batches and Spark compiled 574 classes per stats minute (5.5 s of
#: compiling), with 1,000 it compiled 170 (2.6 s): ``bench/batch_profile.py``, docs/performance.md.
CODEGEN_CACHE_ENTRIES = 1000


def build_session(
    cfg: SparkConfig, *, master: str | None = None, delta_spark: bool | None = None, verbose: bool = False
) -> SparkSession:
    """Get or create the SparkSession for rate-governor.

    Args:
        cfg: the ``[spark]`` section; ``cfg.conf`` entries are applied last and win.
        master: overrides ``cfg.master`` (spark-submit passes its own ``--master``; pass None to keep it).
        delta_spark: enable the Delta SQL extension; None = only when the Delta jars are on the classpath.
        verbose: keep Spark's own log4j2 defaults; otherwise the driver JVM (when pyspark launches it) logs with
            ``conf/log4j2.properties``, which hides Spark's start-up notices (:mod:`pipelines.ops.console`).
    """
    _python_clock_in_utc()
    # the Python side of the same hand-over (connect and authenticate), read by pyspark at each collect
    os.environ.setdefault("SPARK_AUTH_SOCKET_TIMEOUT", str(AUTH_SOCKET_TIMEOUT_SECONDS))
    builder = (
        SparkSession.builder.appName(cfg.app_name)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(cfg.shuffle_partitions))
        .config("spark.sql.adaptive.enabled", str(cfg.adaptive_execution).lower())
        .config("spark.ui.showConsoleProgress", "false")
        # PySpark's DataFrame debugging records the Python call site of every Column function over py4j (an
        # active-session look-up, a conf read and two JVM calls per F.col/cast/alias): 18 % of the micro-batch
        # handlers' time in the closed-loop test (py-spy, docs/performance.md). Errors still carry Spark's own plan
        # context; only the Python line of a failing Column expression is left out of their query context.
        .config("spark.python.sql.dataFrameDebugging.enabled", "false")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "true")
        # Parquet written by Spark (the delta-rs lake's large appends, pipelines/dataplane/lake/delta_rs.py) stores
        # timestamps as microseconds adjusted to UTC, Delta's timestamp type, instead of Spark's legacy INT96.
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        # Every collect hands its rows to Python over a local socket the JVM serves for
        # spark.python.authenticate.socketTimeout (15 s by default): on a loaded driver host the Python side came later
        # than that once, and the micro-batch failed (`_load_from_socket`, docs/performance.md). Waiting longer costs
        # nothing when the host is not loaded.
        .config("spark.python.authenticate.socketTimeout", f"{AUTH_SOCKET_TIMEOUT_SECONDS}s")
        .config("spark.sql.codegen.cache.maxEntries", str(CODEGEN_CACHE_ENTRIES))
    )
    if master or not _submitted():
        builder = builder.master(master or cfg.master)
    if delta_spark is None:
        delta_spark = _delta_jars_on_classpath()
    if delta_spark:
        builder = builder.config("spark.sql.extensions", DELTA_EXTENSION).config(
            "spark.sql.catalog.spark_catalog", DELTA_CATALOG
        )
    conf = dict(cfg.conf)
    java_options = console.driver_java_options(verbose, conf.pop(console.DRIVER_JAVA_OPTIONS, None))
    if java_options:
        builder = builder.config(console.DRIVER_JAVA_OPTIONS, java_options)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


@contextmanager
def session_conf(spark: SparkSession, settings: Mapping[str, str]) -> Iterator[None]:
    """Runtime SQL ``settings`` on ``spark`` inside the block, the previous values (or none) restored after it.

    A streaming query started inside the block keeps them for its whole life: Spark clones the session a query
    runs its micro-batches with when the query is created (``StreamExecution.sparkSessionForStream``, Spark 3.x and
    4.x), so the settings reach that query and not the ones started outside the block.

    Raises:
        pyspark.errors.AnalysisException: a static setting (``CANNOT_MODIFY_CONFIG``) or a bad value.
    """
    previous = {key: spark.conf.get(key, None) for key in settings}
    try:
        for key, value in settings.items():
            spark.conf.set(key, value)
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def _python_clock_in_utc() -> None:
    """Make the driver's Python process run in UTC too: PySpark converts naive datetimes with the process's
    local zone, and every rate-governor time is UTC."""
    os.environ["TZ"] = "UTC"
    time.tzset()
    # Python workers of a local session run the driver's interpreter (the project's environment) unless told
    # otherwise (spark-submit.sh / cluster settings set PYSPARK_PYTHON themselves).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def _submitted() -> bool:
    """True when running under spark-submit (which sets the master itself)."""
    return "SPARK_SUBMIT_OPTS" in os.environ or os.environ.get("PYSPARK_SUBMITTED") == "1"


def _delta_jars_on_classpath() -> bool:
    """Whether delta-spark's JVM classes can be loaded, without starting a session: look at the jar list."""
    jar_dirs = [os.path.join(os.path.dirname(pyspark.__file__), "jars")]
    if os.environ.get("SPARK_HOME"):
        jar_dirs.append(os.path.join(os.environ["SPARK_HOME"], "jars"))
    extra = os.environ.get("PYSPARK_SUBMIT_ARGS", "") + " " + os.environ.get("SPARK_CLASSPATH", "")
    return any(glob.glob(os.path.join(d, "delta-spark_*.jar")) for d in jar_dirs) or "delta-spark" in extra


def delta_spark_available(spark: SparkSession) -> bool:
    """Whether this running session can load delta-spark's classes (checked through the JVM)."""
    try:
        spark.sparkContext._jvm.java.lang.Class.forName(  # type: ignore[union-attr]
            DELTA_PROBE_CLASS, False,
            spark.sparkContext._jvm.Thread.currentThread().getContextClassLoader()  # type: ignore[union-attr]
        )
        return True
    except Exception:  # noqa: BLE001 - py4j raises a generic Py4JJavaError for ClassNotFoundException
        return False
