"""End to end: the streaming governor (--once) on a small generated landing directory, and the CLIs."""

from __future__ import annotations

import datetime as dt
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from pipelines import governor
from pipelines.sim.render import render_landing
from pipelines.sim.spec import ScenarioSpec
from pipelines.config import DECISION_QUERY_CONF, load_config
from pipelines.dataplane.lake import TABLES, open_lake
from tests.landing_time import line_time as _line_time
from tests.helpers import lean_config_file, write_config

pytestmark = pytest.mark.slow

CULPRIT = "get-pugc-to-ai-consumer"
#: The governor's clock in the shared run (``decided_at``, ``expires_at``), as bench/same_decisions.py pins it.
PINNED = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
SPEC = ScenarioSpec(
    seed=11, start=dt.datetime(2026, 11, 22, 8, 0, tzinfo=dt.timezone.utc), minutes=24, brokers=2, topics=6,
    groups=4, onset_minute=14,
)


@pytest.fixture(scope="module")
def run(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    landing, lake = root / "landing", root / "lake"
    written = render_landing(SPEC, landing)
    conf = lean_config_file(root / "lean.toml")
    cfg = load_config(conf).with_paths(str(landing), str(lake))
    spark.catalog.clearCache()
    session_before = {key: spark.conf.get(key) for key in DECISION_QUERY_CONF}
    gov = governor.run(spark, cfg, once=True, clock=lambda: PINNED)
    cached = not spark._jsparkSession.sharedState().cacheManager().isEmpty()
    counts = {t: open_lake(spark, str(lake)).read(t).count() for t in TABLES}
    # the settings each query's last micro-batch ran with (the session Spark cloned for the query)
    sessions = {q.name: q._jsq.streamingQuery().lastExecution().sparkSession() for q in gov.queries}
    query_conf = {name: {key: session.conf().get(key) for key in DECISION_QUERY_CONF}
                  for name, session in sessions.items()}
    return {"cfg": cfg, "lake": lake, "landing": landing, "written": written, "gov": gov, "counts": counts,
            "left_cached": cached, "session_before": session_before, "query_conf": query_conf,
            "session_after": {key: spark.conf.get(key) for key in DECISION_QUERY_CONF}}


def test_gold_runs_with_the_decision_settings_and_ingest_and_the_session_keep_their_own(run):
    assert run["cfg"].spark.decision_conf == DECISION_QUERY_CONF
    assert run["query_conf"]["rate-governor-gold"] == DECISION_QUERY_CONF
    assert run["query_conf"]["rate-governor-ingest"] == run["session_before"] != DECISION_QUERY_CONF
    assert run["session_after"] == run["session_before"]


def test_a_run_leaves_nothing_cached(run):
    # every micro-batch unpersists what it cached: a continuous job would otherwise keep each batch's cached plans
    # registered on the driver until its heap runs out (the test session's 1 GiB did, running the whole suite)
    assert run["left_cached"] is False


def test_every_input_line_is_in_bronze_and_silver_or_quarantine(run):
    c, w = run["counts"], run["written"]
    assert c["bronze/broker_stats"] == w["stats_lines"]
    assert c["bronze/send_failures"] == w["failure_lines"]
    assert c["silver/broker_stats"] + c["silver/send_failures"] + c["quarantine"] == w["stats_lines"] + w["failure_lines"]


def test_runaway_retry_found_for_the_culprit_group(spark, run):
    anomalies = open_lake(spark, str(run["lake"])).read("gold/anomalies")
    retry = anomalies.where(F.col("anomaly") == "RUNAWAY_RETRY").select("resource").distinct().collect()
    assert [r["resource"] for r in retry] == [CULPRIT]
    busy = anomalies.where(F.col("anomaly") == "BROKER_BUSY").select("resource").distinct().collect()
    assert [r["resource"] for r in busy] == ["broker-a"]


def test_culprit_limited_well_below_storm_rate_and_steady_topics_untouched(spark, run):
    limits = open_lake(spark, str(run["lake"])).read("gold/limits").collect()
    assert {(r["resource_type"], r["resource"]) for r in limits} == {("group", CULPRIT)}
    storm_tps = 785.0
    assert all(0 < r["limit_qps"] < storm_tps / 4 for r in limits)
    published = json.loads((run["lake"] / "control" / "limits.json").read_text())["records"]
    assert [(r["resource_type"], r["resource"], r["mode"]) for r in published] == [("group", CULPRIT, "enforce")]


def test_gold_topic_tps_sums_brokers(spark, run):
    topic = open_lake(spark, str(run["lake"])).read("gold/topic_tps")
    assert topic.where(F.col("brokers_reporting") == 2).count() > 0
    assert topic.where(F.col("put_tps").isNull() | F.isnan("put_tps")).count() == 0


def test_rerun_once_adds_nothing(spark, run):
    governor.run(spark, run["cfg"], once=True)
    again = {t: open_lake(spark, str(run["lake"])).read(t).count() for t in TABLES}
    assert again == run["counts"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "args, message",
    [
        (("pipelines.governor", "--conf", "missing.toml"), "rate-governor: config file not found: missing.toml"),
        (("pipelines.governor", "--conf", "conf/local.toml", "--landing", "/no/such/dir"),
         "rate-governor: landing directory not found: /no/such/dir"),
        (("pipelines.governor", "--conf", "conf/local.toml", "--bogus"), "error: unrecognized arguments: --bogus"),
        (("pipelines.ops.demo", "--seed", "x"), "argument --seed: invalid int value: 'x'"),
    ],
)
def test_cli_errors_are_one_line_and_nonzero(args, message):
    done = _cli(*args)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_bad_config_value_is_named(tmp_path):
    bad = tmp_path / "bad.toml"
    write_config(bad, **{"windows.length_seconds": -5})
    done = _cli("pipelines.governor", "--conf", str(bad), "--landing", str(tmp_path))
    assert done.returncode == 2 and "windows.length_seconds" in done.stderr


def test_published_records_are_signed_and_verify_with_the_reference_applier(run):
    from tests.conftest import TEST_SIGNING_KEY
    from control.applier import LimitApplier

    applier = LimitApplier(key=TEST_SIGNING_KEY.encode())
    result = applier.load_file(run["lake"] / "control" / "limits.json")
    assert result.applied == 1 and not applier.refused
    forged = LimitApplier(key=b"another-key")
    assert forged.load_file(run["lake"] / "control" / "limits.json").applied == 0 and forged.refused


def _split_landing(src: Path, dst_a: Path, dst_b: Path, cut: dt.datetime) -> None:
    """Copy every landing file: lines before ``cut`` to dst_a, the rest to dst_b (same relative path), as if the
    job had been stopped at ``cut`` and the rest landed afterwards."""
    for f in src.rglob("*"):
        if f.is_file():
            lines = f.read_text().splitlines(keepends=True)
            early = [line for line in lines if _line_time(line) < cut]
            late = [line for line in lines if _line_time(line) >= cut]
            for dst, part in ((dst_a, early), (dst_b, late)):
                target = dst / f.relative_to(src)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text("".join(part))


DECISION_COLUMNS = ["window_end", "resource_type", "resource", "limit_qps", "previous_qps", "action", "mode", "version", "reason"]


def test_restart_mid_incident_makes_the_same_decisions(spark, run, tmp_path):
    landing, rest = tmp_path / "landing", tmp_path / "rest"
    _split_landing(run["landing"], landing, rest, SPEC.start + dt.timedelta(minutes=SPEC.onset_minute + 4))
    cfg = run["cfg"].with_paths(str(landing), str(tmp_path / "lake"))
    governor.run(spark, cfg, once=True)                      # stopped mid-incident ...
    for f in rest.rglob("*"):                                # ... more data lands, the job is restarted
        if f.is_file():
            target = landing / f.relative_to(rest)
            target.with_name(target.name + ".part2").write_text(f.read_text())
    governor.run(spark, cfg, once=True)
    resumed, whole = open_lake(spark, str(tmp_path / "lake")), open_lake(spark, str(run["lake"]))
    for table, columns in (("gold/limits", DECISION_COLUMNS), ("gold/anomalies", None), ("gold/topic_tps", None)):
        a, b = resumed.read(table), whole.read(table)
        if columns:
            a, b = a.select(*columns), b.select(*columns)
        a, b = a.drop("failures_by_class"), b.drop("failures_by_class")
        assert a.count() == b.count() and a.exceptAll(b).count() == 0, table


def test_a_governor_killed_before_its_first_micro_batches_restarts_and_decides_the_same(spark, run, tmp_path, caplog):
    """A governor killed while Spark wrote the first offset-log entry of its queries left only that entry's
    temporary file (tests/io/test_checkpoint.py shows Spark then refuses every restart); the next start repairs the
    checkpoints, says so, and makes the decisions of an uninterrupted run."""
    from pipelines.job.checkpoint import check_checkpoint
    from tests.helpers import leave_unplanned_batch_zero

    cfg = run["cfg"].with_paths(str(run["landing"]), str(tmp_path / "lake"))
    check_checkpoint(cfg)                                    # the killed governor had started ...
    for query in ("ingest", "gold"):                         # ... and was killed inside its queries' first batch
        leave_unplanned_batch_zero(Path(cfg.checkpoint_root) / query)
    with caplog.at_level(logging.WARNING, logger="rate_governor"):
        governor.run(spark, cfg, once=True)
    assert caplog.text.count("before it planned its first micro-batch") == 2
    restarted, whole = open_lake(spark, str(tmp_path / "lake")), open_lake(spark, str(run["lake"]))
    a, b = restarted.read("gold/limits").select(*DECISION_COLUMNS), whole.read("gold/limits").select(*DECISION_COLUMNS)
    assert a.count() == b.count() > 0 and a.exceptAll(b).count() == 0


def test_enforce_mode_without_signing_key_is_a_start_up_error(tmp_path):
    import os

    env = {k: v for k, v in os.environ.items() if k != "RATE_GOVERNOR_SIGNING_KEY"}
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.governor", "--conf", "conf/local.toml", "--landing", str(tmp_path)],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert done.returncode == 2 and "needs a signing key" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_once_stops_the_other_query_and_raises_when_one_fails(spark, run, tmp_path, monkeypatch):
    """--once with the fast path on (``windows.fast_path = "always"``) runs the ingest query first, then the gold
    and fast queries side by side on its events; when gold fails while a fast micro-batch is still running, the
    fast query is stopped and the failure is raised. (Fast and gold read the events ingest writes, so with --once
    neither starts before ingest has finished: it is the fast query that can be caught running.)"""
    import threading
    import time

    from pyspark.errors import StreamingQueryException

    from pipelines.job.flows.fast import FastFlow
    from pipelines.job.flows.gold import GoldFlow

    fast_running = threading.Event()

    def broken_gold_batch(self, metrics, batch_id):
        assert fast_running.wait(60), "the fast query never started a micro-batch"
        raise RuntimeError("gold batch broken on purpose")

    def slow_fast_batch(self, open_windows, batch_id):
        open_windows.count()  # the micro-batch reads its input (Spark 4 refuses to commit an unread state store)
        fast_running.set()
        time.sleep(10)  # still running when the gold query fails

    monkeypatch.setattr(GoldFlow, "handle", broken_gold_batch)
    monkeypatch.setattr(FastFlow, "handle", slow_fast_batch)
    cfg = run["cfg"].with_paths(str(run["landing"]), str(tmp_path / "lake"))
    cfg = cfg.model_copy(update={"windows": cfg.windows.model_copy(update={"fast_path": "always"})})
    with pytest.raises(StreamingQueryException, match="gold batch broken on purpose"):
        governor.run(spark, cfg, once=True)
    assert fast_running.is_set()
    assert not spark.streams.active