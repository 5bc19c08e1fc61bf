"""pipelines/job/queries.py: a query stopped while its handler waits on Spark stops cleanly (a real streaming query,
stopped mid micro-batch; Spark's own classifier of the error); a micro-batch during which the lease was lost is
not committed (a real query, a real lease on a moved clock)."""

from __future__ import annotations

import datetime as dt
import re
import threading
import traceback
from types import SimpleNamespace

import pytest

from pipelines.job.queries import StoppedMidBatch, _fenced, stopped_short
from pipelines.dataplane.lake import open_lake
from pipelines.job.lease import GovernorLease

#: Spark's ``StreamExecution.PROXY_ERROR`` (Spark 4.x), in Python's syntax.
PROXY_ERROR = re.compile("py4j.protocol.Py4JJavaError: An error occurred while calling(.*)(" +
                         "|".join(map(re.escape, StoppedMidBatch.INTERRUPTIONS)) + ")", re.S)
#: Where StreamExecution lives: Spark 4.1 moved it to a ``runtime`` package.
STREAM_EXECUTION = ("org.apache.spark.sql.execution.streaming.runtime.StreamExecution",
                    "org.apache.spark.sql.execution.streaming.StreamExecution")


def _stop_mid_batch(spark, tmp_path, handler):
    """Run ``handler`` in a rate-source query's first micro-batch, where it starts a Spark job that runs for
    hours; stop the query while that job runs. Returns (the handler's error, formatted as py4j hands it to the
    JVM; the query's exception after the stop)."""
    running, errors = threading.Event(), []

    def slow(df, batch_id):
        running.set()
        df.sparkSession.range(0, 10**13, numPartitions=2).selectExpr("sum(id % 7)").collect()

    def recorded(df, batch_id):
        try:
            handler(slow)(df, batch_id)
        except Exception:
            errors.append(traceback.format_exc())
            raise

    query = (spark.readStream.format("rate").option("rowsPerSecond", 1).load().writeStream
             .foreachBatch(recorded).option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    try:
        assert running.wait(120), "the first micro-batch never started"
        threading.Event().wait(1.0)  # the job is running
    finally:
        query.stop()
    assert errors, "the handler was not interrupted"
    return errors[0], query.exception()


def _spark_takes_it_for_an_interruption(spark, text: str) -> bool:
    """Spark's own ``StreamExecution.isInterruptionException`` on the Py4JException the JVM builds from ``text``."""
    jvm = spark.sparkContext._jvm
    for name in STREAM_EXECUTION:
        try:
            stream_execution = jvm.java.lang.Class.forName(name)
        except Exception:  # noqa: BLE001 - the other Spark line's package
            continue
        method = next(m for m in stream_execution.getMethods() if m.getName() == "isInterruptionException")
        error = jvm.py4j.Py4JException(text)
        return bool(method.invoke(None, jvm.PythonUtils.toArray([error, spark.sparkContext._jsc.sc()])))
    raise AssertionError("no StreamExecution class found")


def test_a_query_stopped_mid_batch_ends_with_a_short_error_spark_takes_for_the_stop(spark, tmp_path):
    told, exception = _stop_mid_batch(spark, tmp_path, stopped_short)
    assert "StoppedMidBatch" in told and len(told) < 2_000, told[-500:]
    assert PROXY_ERROR.search(told)
    assert exception is None
    assert _spark_takes_it_for_an_interruption(spark, told)


def test_without_it_the_stop_error_is_too_long_for_spark_s_classifier(spark, tmp_path):
    """What the wrapper is for: the bare handler's traceback carries the Java stack, and Spark's expression overflows
    the stack of the thread that matches it (here a py4j thread of the JVM, as the stream thread at a stop)."""
    told, _ = _stop_mid_batch(spark, tmp_path, lambda handler: handler)
    assert "Py4JJavaError" in told and len(told) > 5_000
    with pytest.raises(Exception, match="StackOverflowError"):
        _spark_takes_it_for_an_interruption(spark, told)


def test_other_errors_go_through_unchanged(spark):
    def failing(df, batch_id):
        spark.sql("SELECT no_such_column FROM range(1)").collect()

    with pytest.raises(Exception, match="no_such_column") as raised:
        stopped_short(failing)(None, 0)
    assert not isinstance(raised.value, StoppedMidBatch)


def test_a_micro_batch_during_which_the_lease_expired_fails_and_is_not_committed(spark, tmp_path):
    """The handler 'hangs' past the ttl (the lease's clock moves 61 s) after its work: the batch fails on the
    fence after the handler, so Spark never commits it; the batch before it, without a hang, is committed."""
    now = [dt.datetime(2026, 11, 26, tzinfo=dt.timezone.utc)]
    lease = GovernorLease(str(tmp_path / "lake"), ttl_seconds=60, clock=lambda: now[0])
    lease.acquire()
    lake = open_lake(spark, tmp_path / "lake")
    lake.fence = lease.check
    handled = []

    def hangs_in_batch_1(df, batch_id):
        handled.append(batch_id)
        if batch_id == 1:
            now[0] += dt.timedelta(seconds=61)

    checkpoint = tmp_path / "checkpoint"
    query = (spark.readStream.format("rate").option("rowsPerSecond", 1).load().writeStream
             .foreachBatch(_fenced(hangs_in_batch_1, SimpleNamespace(lake=lake)))
             .option("checkpointLocation", str(checkpoint)).trigger(processingTime="1 second").start())
    try:
        with pytest.raises(Exception, match="LakeHeldError|the lease was taken over"):
            query.awaitTermination(120)
    finally:
        query.stop()
    assert handled == [0, 1] and lease.lost
    assert sorted(p.name for p in (checkpoint / "commits").iterdir() if p.name.isdigit()) == ["0"]
