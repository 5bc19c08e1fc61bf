"""The session settings the governor depends on (pipelines/session.py)."""

from __future__ import annotations

from pipelines.session import AUTH_SOCKET_TIMEOUT_SECONDS, CODEGEN_CACHE_ENTRIES


def test_the_session_keeps_generated_classes_and_waits_for_a_loaded_driver(spark):
    jvm = spark.sparkContext._jvm
    compiled = jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
    assert spark.conf.get("spark.sql.codegen.cache.maxEntries") == str(CODEGEN_CACHE_ENTRIES)
    assert spark.conf.get("spark.python.authenticate.socketTimeout") == f"{AUTH_SOCKET_TIMEOUT_SECONDS}s"
    query = lambda: spark.range(5).selectExpr("id * 7 + 3 AS v").where("v % 2 = 1").collect()  # noqa: E731
    query()
    before = compiled.getCount()
    assert query() == [(3,), (17,), (31,)] and compiled.getCount() == before  # the same plan reuses its classes
