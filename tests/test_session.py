"""The session settings the governor depends on (pipelines/dataplane/session.py)."""

from __future__ import annotations

import pytest

from pipelines.dataplane.session import AUTH_SOCKET_TIMEOUT_SECONDS, CODEGEN_CACHE_ENTRIES, session_conf


def test_the_session_keeps_generated_classes_and_waits_for_a_loaded_driver(spark):
    jvm = spark.sparkContext._jvm
    compiled = jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
    assert spark.conf.get("spark.sql.codegen.cache.maxEntries") == str(CODEGEN_CACHE_ENTRIES)
    assert spark.conf.get("spark.python.authenticate.socketTimeout") == f"{AUTH_SOCKET_TIMEOUT_SECONDS}s"
    query = lambda: spark.range(5).selectExpr("id * 7 + 3 AS v").where("v % 2 = 1").collect()  # noqa: E731
    query()
    before = compiled.getCount()
    assert query() == [(3,), (17,), (31,)] and compiled.getCount() == before  # the same plan reuses its classes


def test_session_conf_sets_inside_the_block_and_restores_after_it_even_on_error(spark):
    unset, preset = "spark.rate_governor.test.unset", "spark.sql.codegen.wholeStage"
    before = spark.conf.get(preset)
    with pytest.raises(RuntimeError, match="inside"):
        with session_conf(spark, {unset: "x", preset: "false"}):
            assert (spark.conf.get(unset), spark.conf.get(preset)) == ("x", "false")
            raise RuntimeError("inside")
    assert spark.conf.get(unset, None) is None and spark.conf.get(preset) == before
