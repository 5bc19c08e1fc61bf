"""Data quality: GX suites as the one rule set, Spark predicates derived from them, GX validation per micro-batch,
reconciliation (pipelines/dataplane/quality/) and Data Docs built from the stored GX results (pipelines/dataplane/quality/data_docs.py). One
GX context is shared by the whole module."""

from __future__ import annotations

import datetime as dt
import html
import json
import re

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipelines import tables
from pipelines.dataplane.quality import cli, data_docs, gate, rules, suites, validation
from pipelines import columns, governor, schemas
from pipelines.config import GovernorConfig, QualityConfig, parse_config
from pipelines.dataplane.lake import open_lake
from tests.helpers import raw_records, stats_line

INF, NAN = float("inf"), float("nan")


def _unexpected_by_expectation(df, suite):
    """Per expectation name, how many rows fail the derived Spark predicate (each expectation on its own)."""
    aggs = [F.count_if(~rules.row_condition(e)).alias(str(i)) for i, e in enumerate(suite.expectations)]
    row = df.agg(*aggs).first()
    return {rules.expectation_name(e): row[str(i)] for i, e in enumerate(suite.expectations)}


def _gx_unexpected(result):
    return {validation.expectation_name_from_result(r): r.result.get("unexpected_count", 0) for r in result.results}


def test_every_expectation_of_every_suite_has_a_row_predicate(spark):
    for table, factory in suites.SUITES.items():
        suite = factory()
        assert suite.expectations, table
        for expectation in suite.expectations:
            rules.row_condition(expectation)  # raises UnsupportedExpectation otherwise
        names = [rules.expectation_name(e) for e in suite.expectations]
        assert len(names) == len(set(names)), f"{table}: expectation names must be unique (they are the reasons)"


@pytest.mark.parametrize("engine", ["pandas", "spark"])
def test_gold_limits_suite_predicates_agree_with_gx(spark, engine):
    """Both GX engines agree with the Spark predicates, NaN included (Spark's NaN is a value above +inf)."""
    validator = validation.shared_validator(pandas_max_rows=100 if engine == "pandas" else 0)
    t = dt.datetime(2026, 11, 22, 10, 0)
    later, earlier = t + dt.timedelta(minutes=10), t - dt.timedelta(minutes=1)
    rows = [  # decided_at, window_end, type, resource, limit, burst, prev, action, mode, expires_at, reason, version, basis, split
        (t, t, "group", "g-ok", 30.0, 30, None, "set", "enforce", later, "ok", 1, "final", None),
        (t, t, "group", "g-zero", 0.0, 1, None, "set", "enforce", later, "zero", 1, "final", None),
        (t, t, "topic", "t-inf", INF, 1, None, "set", "advisory", later, "inf", 1, "final", None),
        (t, t, "topic", "t-nan", NAN, 1, None, "relax", "enforce", later, "nan", 1, "final", None),
        (t, t, "topic", "t-neg", -1.0, 1, None, "lift", "enforce", later, "neg", 1, "final", None),
        (t, t, "topic", "t-exp", 5.0, 5, None, "set", "enforce", earlier, "expires before decided", 1, "final", None),
        (t, t, "broker", "b", 5.0, 5, None, "set", "enforce", later, "bad resource type", 1, "final", None),
        (t, t, "topic", "t-mode", 5.0, 5, None, "set", "shadow", later, "bad mode", 1, "final", None),
        (t, t, "topic", "t-act", 5.0, 5, None, "tighten", "enforce", later, "bad action", 1, "final", None),
        (t, t, "topic", "t-noexp", 5.0, 5, None, "set", "enforce", None, "no expiry", 1, "final", None),
        (t, t, "topic", "t-basis", 5.0, 5, None, "set", "enforce", later, "bad basis", 1, "tentative", None),
    ]
    df = spark.createDataFrame(rows, schemas.GOLD_LIMITS)
    suite = suites.gold_limits_suite()
    derived = _unexpected_by_expectation(df, suite)
    assert derived["expect_column_values_to_be_between(limit_qps)"] == 4  # 0, inf, NaN, -1
    assert derived["expect_column_pair_values_a_to_be_greater_than_b(expires_at,decided_at)"] == 1
    assert derived["expect_column_values_to_be_in_set(resource_type)"] == 1
    assert derived["expect_column_values_to_be_in_set(mode)"] == 1
    assert derived["expect_column_values_to_be_in_set(action)"] == 1
    assert derived["expect_column_values_to_be_in_set(basis)"] == 1
    assert derived["expect_column_values_to_not_be_null(expires_at)"] == 1
    assert validator.engine(df.count()) == engine
    result = validator.validate(tables.GOLD_LIMITS, df)
    assert not result.success
    assert _gx_unexpected(result) == derived
    # the first failing expectation is the row's reason; the good row has none
    reasons = {r["resource"]: r["reason"] for r in df.select("resource", rules.failed_expectation(suite).alias("reason")).collect()}
    assert reasons["g-ok"] is None
    assert reasons["t-inf"] == "expectation failed: expect_column_values_to_be_between(limit_qps)"
    assert reasons["t-exp"] == "expectation failed: expect_column_pair_values_a_to_be_greater_than_b(expires_at,decided_at)"


def test_the_decisions_check_refuses_what_the_gold_limits_suite_refuses(spark, tmp_path):
    """The decision plane applies the gold/limits expectations row by row without GX
    (pipelines/decide/records/limit_rows.py): every row gets the same first failed expectation as the suite's Spark row
    predicate, and the refused decisions become quarantine rows the lake accepts (raw = the decision as JSON,
    raw_bytes null)."""
    from pipelines.decide.arrow import from_rows
    from pipelines.decide.records.limit_rows import check

    t = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.timezone.utc)
    later, earlier = t + dt.timedelta(minutes=10), t - dt.timedelta(minutes=1)
    rows = [(t, t, "group", "g-ok", 30.0, 30, None, "set", "enforce", later, "ok", 1, "final", None),
            (t, t, "topic", "t-inf", INF, 1, None, "set", "advisory", later, "inf", 1, "preliminary", None),
            (t, t, "topic", "t-nan", NAN, 1, None, "relax", "enforce", later, "nan", 1, "final", None),
            (t, t, "topic", "t-exp", 5.0, 5, None, "set", "enforce", earlier, "expires before", 1, "final", None),
            (t, t, "broker", "b", 5.0, 5, None, "set", "enforce", later, "bad resource type", 1, "final", None),
            (t, t, "topic", "t-noexp", 5.0, 5, None, "set", "enforce", None, "no expiry", 1, "final", None),
            (t, t, "topic", "t-basis", 5.0, 5, None, "set", "enforce", later, "bad basis", 1, "tentative", None)]
    names = schemas.GOLD_LIMITS.names
    accepted, refused = check([dict(zip(names, r)) for r in rows], "gold:7", t)
    assert [r["resource"] for r in accepted] == ["g-ok"]
    ours = {json.loads(r["raw"])["resource"]: r["reason"] for r in refused}
    df = spark.createDataFrame([r[:1] + r[1:] for r in rows], schemas.GOLD_LIMITS)
    theirs = {r["resource"]: r["reason"] for r in df.select(
        "resource", rules.failed_expectation(suites.gold_limits_suite()).alias("reason")).collect()}
    assert ours == {k: v for k, v in theirs.items() if v is not None}
    lake = open_lake(spark, str(tmp_path / "lake"), "delta-rs")
    assert lake.append_arrow(from_rows(refused, columns.QUARANTINE), tables.QUARANTINE, app_id="test", version=7) == 6
    row = lake.read(tables.QUARANTINE).where("reason like '%limit_qps%'").first()
    assert (row["source"], row["origin"], row["raw_bytes"]) == (tables.GOLD_LIMITS, "gold:7", None)


def _line(key, detail, stat="TOPIC_PUT_NUMS", at="2022-02-08 18:00:00"):
    return stats_line(at, stat, key, detail)


@pytest.fixture(scope="module")
def ingested(spark, tmp_path_factory):
    """Two ingest micro-batches through IngestFlow.handle (static DataFrames, the streaming handler as is):
    batch 0 good and bad rows, batch 1 late rows and an expectation failure."""
    return _ingest_two_batches(spark, tmp_path_factory.mktemp("quality"), GovernorConfig())


def _ingest_two_batches(spark, root, cfg: GovernorConfig) -> dict:
    cfg = cfg.with_paths(str(root / "landing"), str(root / "lake"))
    gov = governor.build_governor(spark, cfg)
    batch0 = [
        _line("orders", "SUM: 600 TPS: 10.00 AVGPT: 1.00"),
        _line("orders", "SUM: 600 TPS: 10.00 AVGPT: 1.00", at="2022-02-08 18:05:00"),
        _line("orders", "SUM: 600 TPS: 10.00 AVGPT: -1.00"),  # parse accepts, expectation rejects
        _line("orders@-1", "SUM: 60 TPS: 1.00 AVGPT: 1.00", stat="QUEUE_PUT_NUMS"),  # negative queue id
        _line("orders", "SUM: -5 TPS: 0.02 AVGPT: 1.00"),  # parse rejects
        "junk",
    ]
    failures0 = ['{"ts": "2022-02-08T10:04:00Z", "topic": "orders", "code": 2, "message": "[OVERLOAD]system busy"}',
                 '{"ts": "2022-02-08T10:04:00Z", "topic": "orders", "latency_ms": -3}']
    raw0 = raw_records(spark, "broker_stats", batch0).unionByName(
        raw_records(spark, "send_failures", failures0, broker_hint=None))
    batch1 = [
        _line("orders", "SUM: 60 TPS: 1.00 AVGPT: 1.00", at="2022-02-08 17:30:00"),  # late: watermark 10:02 UTC
        _line("orders", "SUM: 60 TPS: 1.00 AVGPT: 1.00", at="2022-02-08 18:06:00"),
        _line("orders", "SUM: 60 TPS: 1.00 AVGPT: 1e20"),  # avgpt above the suite's max
    ]
    gov.ingest.handle(raw0, 0)
    gov.ingest.handle(raw_records(spark, "broker_stats", batch1), 1)
    return {"gov": gov, "lake": gov.lake, "root": root}


@pytest.mark.slow
def test_expectation_failures_go_to_quarantine_with_the_expectation_name(ingested):
    reasons = sorted(r["reason"] for r in ingested["lake"].read("quarantine").collect())
    assert "expectation failed: expect_column_values_to_be_between(avgpt)" in reasons
    assert "expectation failed: expect_column_values_to_be_between(queue_id)" in reasons
    assert "negative SUM, TPS or value" in reasons
    # parse rejects negative latency first: the parse reason wins, never both
    assert "negative latency_ms" in reasons
    assert reasons.count("expectation failed: expect_column_values_to_be_between(avgpt)") == 2


@pytest.mark.slow
def test_gx_results_per_batch_match_the_row_level_enforcement(ingested):
    results = ingested["lake"].read(tables.QUALITY_VALIDATION_RESULTS)
    rows = {(r["batch_id"], r["suite"], r["expectation"]): r for r in results.collect()}
    avgpt0 = rows[(0, "silver/broker_stats", "expect_column_values_to_be_between(avgpt)")]
    assert (avgpt0["success"], avgpt0["unexpected_count"]) == (False, 1)
    queue0 = rows[(0, "silver/broker_stats", "expect_column_values_to_be_between(queue_id)")]
    assert (queue0["success"], queue0["unexpected_count"]) == (False, 1)
    assert rows[(0, "silver/send_failures", "expect_column_values_to_not_be_null(topic)")]["success"]
    assert rows[(1, "silver/broker_stats", "expect_column_values_to_be_between(avgpt)")]["unexpected_count"] == 1
    # quarantined by an expectation in the reconciliation == GX's unexpected counts of that batch
    rec = {(r["batch_id"], r["source"]): r for r in ingested["lake"].read(tables.QUALITY_RECONCILIATION).collect()}
    assert rec[(0, "broker_stats")]["expectation_rows"] == 2


@pytest.mark.slow
def test_gx_spark_engine_in_the_gate_gives_the_pandas_engines_results(spark, ingested, tmp_path):
    """Micro-batches over ``quality.pandas_max_rows`` are validated by GX's Spark engine on the executors (the
    large-batch path): the same two batches through a gate that always uses it give the same results per
    expectation as the pandas engine above (GX 1.x's Spark engine on this pyspark line)."""
    cfg = GovernorConfig(quality=QualityConfig(pandas_max_rows=0))
    spark_engine = _ingest_two_batches(spark, tmp_path, cfg)
    assert spark_engine["gov"].ingest.gate.validator.engine(1) == "spark"

    def results(lake):
        return sorted((r["batch_id"], r["suite"], r["expectation"], r["success"], r["element_count"],
                       r["unexpected_count"]) for r in lake.read(tables.QUALITY_VALIDATION_RESULTS).collect())

    got, want = results(spark_engine["lake"]), results(ingested["lake"])
    assert len(got) > 20 and any(not success for _, _, _, success, _, _ in got)
    assert got == want


@pytest.mark.slow
def test_reconciliation_balances_and_counts_late_rows(ingested):
    rec = {(r["batch_id"], r["source"]): r for r in ingested["lake"].read(tables.QUALITY_RECONCILIATION).collect()}
    b0, f0, b1 = rec[(0, "broker_stats")], rec[(0, "send_failures")], rec[(1, "broker_stats")]
    assert (b0["records_read"], b0["silver_rows"], b0["late_rows"], b0["quarantine_rows"]) == (6, 2, 0, 4)
    assert (f0["records_read"], f0["silver_rows"], f0["quarantine_rows"]) == (2, 1, 1)
    assert b0["watermark"] is None  # nothing seen before the first batch
    # watermark = min over inputs of their newest event time (failures: 10:04 UTC) minus 120 s
    assert b1["watermark"] == dt.datetime(2022, 2, 8, 10, 2)
    assert (b1["records_read"], b1["silver_rows"], b1["late_rows"], b1["quarantine_rows"]) == (3, 1, 1, 1)
    assert all(r["balanced"] for r in rec.values())
    # late rows stay in silver (history), they are only not counted as on-time
    assert ingested["lake"].read("silver/broker_stats").count() == 2 + 2


@pytest.mark.slow
def test_restarted_gate_restores_the_watermark_from_the_lake(ingested):
    restarted = gate.QualityGate(ingested["gov"].cfg, ingested["lake"])
    assert restarted.watermark(2) == dt.datetime(2022, 2, 8, 10, 2)


def _page_text(path) -> str:
    """The visible text of an HTML page, whitespace collapsed."""
    text = re.sub(r"<(script|style)\b.*?</\1>", " ", path.read_text(encoding="utf-8"), flags=re.DOTALL)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", text)).split())


def _stored_runs(lake_dir) -> pa.Table:
    """``quality/validation_runs`` read with delta-rs."""
    return DeltaTable(str(lake_dir / tables.QUALITY_VALIDATION_RUNS)).to_pyarrow_table()


@pytest.mark.slow
def test_validation_runs_hold_gx_results_one_per_suite_per_validated_batch(ingested):
    runs = _stored_runs(ingested["root"] / "lake").to_pylist()
    keys = sorted((r["batch_id"], r["suite"]) for r in runs)
    # batch 1 has no send failures: nothing to validate for that suite
    assert keys == [(0, "silver/broker_stats"), (0, "silver/send_failures"), (1, "silver/broker_stats")]
    per_expectation = ingested["lake"].read(tables.QUALITY_VALIDATION_RESULTS).collect()
    assert sorted({(r["batch_id"], r["suite"]) for r in per_expectation}) == keys
    for run in runs:
        result = data_docs.load_result(run["result_json"])  # GX's own result, rebuilt
        assert result.suite_name == data_docs.gx_suite_name(run["suite"])
        assert result.meta["run_id"]["run_name"] == f"batch-{run['batch_id']}"
        assert result.success == run["success"]
        # the same numbers as the flattened per-expectation rows of that batch
        unexpected = {validation.expectation_name_from_result(r): r.result.get("unexpected_count") for r in result.results}
        flat = {r["expectation"]: r["unexpected_count"] for r in per_expectation
                if (r["batch_id"], r["suite"]) == (run["batch_id"], run["suite"])}
        assert unexpected == flat
    stats0 = next(r for r in runs if (r["batch_id"], r["suite"]) == (0, "silver/broker_stats"))
    assert not stats0["success"]


@pytest.mark.slow
def test_data_docs_list_the_stored_runs_and_show_failed_expectations(ingested, tmp_path, capsys):
    index = data_docs.build_docs(ingested["root"] / "lake", tmp_path / "docs")
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1] == f"Data Docs: {index}"
    assert len(printed) == 1 + 3  # one line per stored run
    assert "FAILED 2/13: expect_column_values_to_be_between(avgpt), expect_column_values_to_be_between(queue_id)" in printed[0]
    gx_index = index.read_text(encoding="utf-8")
    # GX's index table data (drawn by bootstrap-table) lists every run; the offline list links each page
    assert gx_index.count("'run_name': 'batch-0'") == 2 and gx_index.count("'run_name': 'batch-1'") == 1
    offline = _page_text(index)
    assert "silver/broker_stats 1 batch-1" in offline and "silver/send_failures 0 batch-0" in offline
    pages = sorted((tmp_path / "docs" / "validations").rglob("*.html"))
    assert [p.name for p in pages] == [
        "silver_broker_stats-batch-0.html", "silver_broker_stats-batch-1.html", "silver_send_failures-batch-0.html"]
    page = _page_text(pages[0])  # silver/broker_stats, batch 0: avgpt -1.0 and queue id -1 failed
    assert "Run Name batch-0" in page and "Status: Failed" in page
    assert "Unsuccessful Expectations 2" in page
    avgpt = page[page.index("avgpt Status"):page.index("broker Status")]
    assert "1 unexpected values found" in avgpt and "-1.0" in avgpt
    # --last 1: only the newest micro-batch
    data_docs.build_docs(ingested["root"] / "lake", tmp_path / "last", last=1)
    assert [line.split()[1] for line in capsys.readouterr().out.splitlines()[:-1]] == ["1"]


@pytest.mark.slow
def test_data_docs_render_the_stored_results_without_validating_again(ingested, tmp_path, monkeypatch, capsys):
    """A lake holding only quality/validation_runs (no silver data to validate), one stored result edited: the
    page shows the edited value, so the docs render what is stored. Spark and GX validation are off limits."""
    stored = _stored_runs(ingested["root"] / "lake")
    runs = stored.to_pylist()
    for run in runs:
        if (run["batch_id"], run["suite"]) == (1, "silver/broker_stats"):
            result = json.loads(run["result_json"])
            for r in result["results"]:
                if r["expectation_config"]["kwargs"].get("column") == "avgpt":
                    assert r["result"]["partial_unexpected_list"] == [1e20]
                    r["result"]["partial_unexpected_list"] = [4242.4242]
                    r["result"]["partial_unexpected_counts"] = [{"value": 4242.4242, "count": 1}]
            run["result_json"] = json.dumps(result)
    lake = tmp_path / "lake"
    write_deltalake(str(lake / tables.QUALITY_VALIDATION_RUNS), pa.Table.from_pylist(runs, schema=stored.schema))

    def forbidden(*args, **kwargs):
        raise AssertionError("building Data Docs must not start Spark or validate")

    monkeypatch.setattr(SparkSession.Builder, "getOrCreate", forbidden)
    monkeypatch.setattr(validation.Validator, "validate", forbidden)
    assert cli.main(["docs", "--lake", str(lake)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"Data Docs: {lake / 'quality' / 'data_docs' / 'index.html'}"
    page = next((lake / "quality" / "data_docs" / "validations").rglob("silver_broker_stats-batch-1.html"))
    assert "4242.4242" in _page_text(page)


def test_docs_command_without_stored_results_is_one_line_on_stderr(tmp_path, capsys):
    assert cli.main(["docs", "--lake", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "lake directory not found" in err
    assert cli.main(["docs", "--lake", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no stored validation results" in err


def test_quality_config_section():
    assert GovernorConfig().quality == QualityConfig(enforce=True, validate_every_n_batches=1)
    cfg = parse_config({"quality": {"validate_every_n_batches": 10, "enforce": False}})
    assert cfg.quality.validate_every_n_batches == 10 and not cfg.quality.enforce
    with pytest.raises(Exception, match="quality"):
        parse_config({"quality": {"validate_every_n_batches": -1}})
