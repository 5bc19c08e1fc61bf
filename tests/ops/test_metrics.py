"""The governor's Prometheus metrics (pipelines/ops/metrics.py): what each hook turns into which series, that label
sets go away with what they describe, and the endpoint on a real socket (scraped over HTTP, a busy port)."""

from __future__ import annotations

import datetime as dt
import logging
import socket
import urllib.request

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipelines.config import ConfigError, MetricsConfig, load_config, parse_config
from pipelines import tables
from pipelines.job.lease import GovernorLease
from pipelines.writeback.sinks import SinkSet
from pipelines.ops import metrics
from pipelines.ops.metric_labels import reason_kind
from pipelines.ops.metrics import GovernorMetrics
from pipelines.dataplane.transforms.known import unknown_broker_reason
from tests.io.test_sinks import RecordingSink

NOW = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.timezone.utc)
W1, W2, W3 = (NOW + dt.timedelta(minutes=m) for m in (1, 2, 3))
UTC_TS = pa.timestamp("us", tz="UTC")


class Clock:
    def __init__(self, at: dt.datetime = NOW) -> None:
        self.at = at.timestamp()

    def __call__(self) -> float:
        return self.at


@pytest.fixture()
def m() -> GovernorMetrics:
    fresh = GovernorMetrics(clock=Clock())
    previous = metrics.install(fresh)
    yield fresh
    metrics.install(previous)


def value(m: GovernorMetrics, name: str, **labels) -> float | None:
    return m.registry.get_sample_value(name, labels)


def series(m: GovernorMetrics, name: str) -> list[dict]:
    return [s.labels for family in m.registry.collect() for s in family.samples if s.name == name]


def storm_record(expires: dt.datetime = NOW + dt.timedelta(minutes=10)) -> dict:
    return {"resource_type": "group", "resource": "storm", "limit_qps": 20.0, "mode": "enforce", "version": 7,
            "expires_at": f"{expires:%Y-%m-%dT%H:%M:%SZ}",
            "brokers": {"broker-a": {"limit_qps": 12.0, "burst": 12}, "broker-b": {"limit_qps": 8.0, "burst": 8},
                        "*": {"limit_qps": 8.0, "burst": 8}}}


def test_limits_in_force_with_each_brokers_share_until_lifted_or_expired(m):
    m.observe_limits([storm_record()])
    assert value(m, "rate_governor_limit_messages_per_second", resource_type="group", resource="storm",
                 anomaly="RUNAWAY_RETRY", mode="enforce") == 20.0
    shares = {s["broker"]: value(m, "rate_governor_limit_broker_messages_per_second", **s)
              for s in series(m, "rate_governor_limit_broker_messages_per_second")}
    assert shares == {"broker-a": 12.0, "broker-b": 8.0, "*": 8.0}
    assert value(m, "rate_governor_limit_expires_timestamp_seconds", resource_type="group",
                 resource="storm") == (NOW + dt.timedelta(minutes=10)).timestamp()
    m.observe_limits([])  # lifted: the next publish no longer has it
    assert series(m, "rate_governor_limit_messages_per_second") == []
    assert series(m, "rate_governor_limit_broker_messages_per_second") == []
    m.observe_limits([storm_record(expires=NOW + dt.timedelta(seconds=30))])
    m.clock.at += 31  # expired without a publish since: fail open, gone from the next scrape
    assert series(m, "rate_governor_limit_messages_per_second") == []


def _limits(*rows) -> pa.Table:
    return pa.table({k: [r[i] for r in rows] for i, k in enumerate(("action", "basis", "resource_type", "mode"))})


def _anomalies(*rows) -> pa.Table:
    return pa.table({"window_end": pa.array([r[0] for r in rows], UTC_TS),
                     "resource_type": [r[1] for r in rows], "resource": [r[2] for r in rows],
                     "anomaly": [r[3] for r in rows]})


def _windows(*ends) -> pa.Table:
    return pa.table({"window_end": pa.array(list(ends), UTC_TS)})


def test_decisions_anomalies_and_quarantine_are_counted_by_kind(m):
    # every known label set exists from 0 (rate() and increase() need a sample before the first decision)
    assert value(m, "rate_governor_decisions_total", action="relax", basis="final", anomaly="TRAFFIC_SURGE",
                 mode="advisory") == 0
    assert value(m, "rate_governor_anomalies_total", anomaly="BROKER_BUSY", resource_type="broker") == 0
    m.observe_outputs({
        tables.GOLD_LIMITS: _limits(("set", "preliminary", "group", "enforce"), ("set", "final", "topic", "advisory"),
                                    ("lift", "final", "group", "enforce")),
        tables.QUARANTINE: pa.table({"reason": ["unknown stat name: FOO", "unknown stat name: BAR",
                                                "expectation failed: expect_column_values_to_be_between(limit_qps)",
                                                "key 'a@b@c' has 3 '@'-separated parts, not a shape of TOPIC_PUT_NUMS"]}),
    })
    m.observe_outputs({tables.GOLD_LIMITS: _limits(("set", "preliminary", "group", "enforce"))})
    assert value(m, "rate_governor_decisions_total", action="set", basis="preliminary", anomaly="RUNAWAY_RETRY",
                 mode="enforce") == 2
    assert value(m, "rate_governor_decisions_total", action="set", basis="final", anomaly="TRAFFIC_SURGE",
                 mode="advisory") == 1
    assert value(m, "rate_governor_decisions_total", action="lift", basis="final", anomaly="RUNAWAY_RETRY",
                 mode="enforce") == 1
    reasons = {s["reason"]: value(m, "rate_governor_quarantined_records_total", **s)
               for s in series(m, "rate_governor_quarantined_records_total")}
    assert reasons == {"unknown stat name": 2, "expectation failed: expect_column_values_to_be_between(limit_qps)": 1,
                       "key '…' has 3 '…'-separated parts, not a shape of TOPIC_PUT_NUMS": 1}


def test_quarantine_reason_labels_are_bounded():
    assert reason_kind("invalid topic name: a b c") == "invalid topic name"
    assert reason_kind(unknown_broker_reason("b-7", "[brokers] known")) == "unknown broker (not in [brokers] known)"
    assert reason_kind(None) == "unknown"
    m = GovernorMetrics()
    m.observe_outputs({tables.QUARANTINE: pa.table({"reason": [f"kind {i}" for i in range(metrics.MAX_REASONS + 5)]})})
    labels = {s["reason"] for s in series(m, "rate_governor_quarantined_records_total")}
    assert len(labels) == metrics.MAX_REASONS + 1 and "other" in labels
    assert value(m, "rate_governor_quarantined_records_total", reason="other") == 5


def test_active_anomalies_are_those_of_the_newest_final_window_and_go_away(m):
    m.observe_outputs({tables.GOLD_BROKER_TPS: _windows(W1, W2),
                       tables.GOLD_ANOMALIES: _anomalies((W1, "topic", "flash", "TRAFFIC_SURGE"),
                                                         (W2, "group", "storm", "RUNAWAY_RETRY"),
                                                         (W2, "broker", "broker-a", "BROKER_BUSY"))})
    assert value(m, "rate_governor_anomalies_total", anomaly="TRAFFIC_SURGE", resource_type="topic") == 1
    assert {(s["resource"], s["anomaly"]) for s in series(m, "rate_governor_anomaly_active")} == {
        ("storm", "RUNAWAY_RETRY"), ("broker-a", "BROKER_BUSY")}
    m.observe_outputs({tables.GOLD_LIMITS: _limits(("set", "preliminary", "group", "enforce"))})  # the fast path
    assert len(series(m, "rate_governor_anomaly_active")) == 2  # says nothing about final windows
    m.observe_outputs({tables.GOLD_BROKER_TPS: _windows(W3)})  # a final window without anomalies
    assert series(m, "rate_governor_anomaly_active") == []


def test_held_seconds_run_in_event_time_and_end_with_the_limit(m):
    state = pa.table({"resource_type": ["group", "topic"], "resource": ["storm", "flash"], "limit_qps": [20.0, None],
                      "limited_since": pa.array([W1 - dt.timedelta(hours=2), None], UTC_TS)})
    m.configure(load_config("conf/local.toml"))
    m.observe_outputs({tables.GOLD_BROKER_TPS: _windows(W1), tables.STATE_POLICY: state})
    assert value(m, "rate_governor_limit_held_seconds", resource_type="group", resource="storm") == 7200
    assert value(m, "rate_governor_limit_max_held_seconds") == 3600  # the alert compares the two
    assert series(m, "rate_governor_limit_held_seconds") == [{"resource_type": "group", "resource": "storm"}]
    lifted = state.set_column(2, "limit_qps", pa.array([None, None], pa.float64()))
    m.observe_outputs({tables.GOLD_BROKER_TPS: _windows(W2), tables.STATE_POLICY: lifted})
    assert series(m, "rate_governor_limit_held_seconds") == []


def test_a_limit_s_normal_floor_is_shown_only_where_its_rule_s_baseline_is_the_resource_s_own(m):
    """A topic's surge limit carries the lowest limit its normal traffic passes under, limits.surge_squeeze_headroom
    x the topic's baseline (RateGovernorLimitUnderNormal compares the limit with it; the running config's headroom);
    a retry storm's frozen baseline is its group's consume rate, no normal of its retry traffic: no series."""
    cfg = load_config("conf/local.toml")
    m.configure(cfg.model_copy(update={"limits": cfg.limits.model_copy(update={"surge_squeeze_headroom": 2.0})}))
    since = pa.array([W1 - dt.timedelta(minutes=20)] * 3, UTC_TS)
    state = pa.table({"resource_type": ["topic", "group", "topic"], "resource": ["pugc-content", "storm", "flash"],
                      "limit_qps": [211.0, 20.0, 300.0], "limited_since": since, "baseline_tps": [223.7, 200.0, None]})
    m.observe_outputs({tables.GOLD_BROKER_TPS: _windows(W1), tables.STATE_POLICY: state})
    assert series(m, "rate_governor_limit_normal_floor_messages_per_second") == [
        {"resource_type": "topic", "resource": "pugc-content"}]
    assert value(m, "rate_governor_limit_normal_floor_messages_per_second", resource_type="topic",
                 resource="pugc-content") == 447.4
    lifted = state.set_column(2, "limit_qps", pa.array([None, 20.0, 300.0], pa.float64()))
    m.observe_outputs({tables.GOLD_BROKER_TPS: _windows(W2), tables.STATE_POLICY: lifted})
    assert series(m, "rate_governor_limit_normal_floor_messages_per_second") == []


def test_a_probes_stated_cost_is_shown_while_its_limit_is_in_force(m):
    """A storm limit whose last probe was undone after admitting 468 messages beyond the level before it shows the
    figure (from any path's state/policy rows: the probe tick's undo writes no final window) while the limit is in
    force; once lifted, no series."""
    m.configure(load_config("conf/local.toml"))
    state = pa.table({"resource_type": ["group", "group"], "resource": ["storm", "calm"], "limit_qps": [40.0, 30.0],
                      "limited_since": pa.array([W1, W1], UTC_TS), "probe_excess_messages": [468.0, None]})
    m.observe_outputs({tables.STATE_POLICY: state})
    m.observe_limits([{"resource_type": "group", "resource": r, "limit_qps": q, "mode": "enforce",
                       "expires_at": "2099-01-01T00:00:00Z"} for r, q in (("storm", 40.0), ("calm", 30.0))])
    assert series(m, "rate_governor_probe_excess_messages") == [{"resource_type": "group", "resource": "storm"}]
    assert value(m, "rate_governor_probe_excess_messages", resource_type="group", resource="storm") == 468.0
    lifted = state.set_column(2, "limit_qps", pa.array([None, 30.0], pa.float64()))
    m.observe_outputs({tables.STATE_POLICY: lifted})
    assert series(m, "rate_governor_probe_excess_messages") == []


def test_how_long_a_limit_has_been_at_its_cap_is_a_gauge_beside_its_maximum(m):
    """A group at its cap since 20 minutes before the newest final window (W2) shows 1200 s beside
    limits.max_at_cap_seconds (1800); a limit not at its cap has no series, nor one lifted."""
    m.configure(load_config("conf/local.toml"))
    state = pa.table({"resource_type": ["group", "group"], "resource": ["storm", "calm"], "limit_qps": [40.0, 30.0],
                      "limited_since": pa.array([W1, W1], UTC_TS),
                      "at_cap_since": pa.array([W2 - dt.timedelta(minutes=20), None], UTC_TS)})
    m.observe_outputs({tables.GOLD_BROKER_TPS: _windows(W2), tables.STATE_POLICY: state})
    assert series(m, "rate_governor_limit_at_cap_seconds") == [{"resource_type": "group", "resource": "storm"}]
    assert value(m, "rate_governor_limit_at_cap_seconds", resource_type="group", resource="storm") == 1200.0
    assert value(m, "rate_governor_limit_max_at_cap_seconds") == 1800.0
    lifted = state.set_column(2, "limit_qps", pa.array([None, 30.0], pa.float64()))
    m.observe_outputs({tables.STATE_POLICY: lifted})
    assert series(m, "rate_governor_limit_at_cap_seconds") == []


def test_each_brokers_newest_stats_minute_never_goes_back(m):
    stats = pa.table({"broker": ["broker-a", "broker-a", "broker-b"], "event_time": pa.array([W1, W2, W1], UTC_TS)})
    m.observe_outputs({tables.SILVER_BROKER_STATS: stats})
    m.observe_outputs({tables.SILVER_BROKER_STATS: pa.table({"broker": ["broker-a"],
                                                             "event_time": pa.array([W1], UTC_TS)})})  # a late line
    assert value(m, "rate_governor_broker_last_report_timestamp_seconds", broker="broker-a") == W2.timestamp()
    assert value(m, "rate_governor_broker_last_report_timestamp_seconds", broker="broker-b") == W1.timestamp()


def test_progress_gives_durations_lag_behind_the_trigger_and_watermark_delay(m):
    m.observe_trigger("gold", "10 seconds")  # as governor.start_queries starts them
    m.observe_trigger("ingest", "10 seconds")
    m.observe_trigger("fast", "500 milliseconds")
    for seconds in (4.0, 13.5):
        m.observe_progress("gold", {"batchDuration": int(seconds * 1000),
                                    "eventTime": {"watermark": f"{NOW - dt.timedelta(minutes=3):%Y-%m-%dT%H:%M:%S}.000Z"}})
    m.observe_progress("ingest", {"batchDuration": 2000, "eventTime": {}})
    assert value(m, "rate_governor_micro_batch_duration_seconds_count", query="gold") == 2
    assert value(m, "rate_governor_micro_batch_duration_seconds_sum", query="gold") == 17.5
    assert value(m, "rate_governor_micro_batch_duration_seconds_bucket", query="gold", le="10.0") == 1
    assert value(m, "rate_governor_query_behind_trigger_seconds", query="gold") == 3.5
    assert value(m, "rate_governor_query_behind_trigger_seconds", query="ingest") == 0
    assert value(m, "rate_governor_trigger_seconds", query="gold") == 10
    assert value(m, "rate_governor_trigger_seconds", query="fast") == 0.5
    m.observe_progress("fast", {"batchDuration": 800})
    assert value(m, "rate_governor_query_behind_trigger_seconds", query="fast") == pytest.approx(0.3)
    assert value(m, "rate_governor_watermark_delay_seconds", query="gold") == 180
    assert value(m, "rate_governor_watermark_delay_seconds", query="ingest") is None  # no watermark


def test_sink_outcomes_and_the_lease_come_from_their_hooks(m, tmp_path):
    sinks = SinkSet([RecordingSink(failures=3)], lake_root=str(tmp_path), sleep=lambda s: None)
    metrics.declare_sinks(["recording"])  # what the publisher does for its paths: counters from 0
    assert value(m, "rate_governor_sink_publishes_total", sink="recording", outcome="failed") == 0
    sinks.publish_all([], batch_id=0, now=NOW)  # three attempts fail: one failed publish
    assert value(m, "rate_governor_sink_publishes_total", sink="recording", outcome="failed") == 1
    assert value(m, "rate_governor_sink_failing", sink="recording") == 1
    assert value(m, "rate_governor_sink_last_success_timestamp_seconds", sink="recording") is None
    m.clock.at += 60
    sinks.publish_all([], batch_id=1, now=NOW)
    assert value(m, "rate_governor_sink_failing", sink="recording") == 0
    assert value(m, "rate_governor_sink_last_success_timestamp_seconds", sink="recording") == NOW.timestamp() + 60
    lease = GovernorLease(str(tmp_path / "lake"), ttl_seconds=60)
    lease.acquire()
    assert value(m, "rate_governor_lease_held") == 1
    lease.release()
    assert value(m, "rate_governor_lease_held") == 0


def test_a_failing_hook_is_logged_once_and_never_raises(m, caplog):
    broken = {tables.GOLD_LIMITS: pa.table({"action": ["set"]})}  # columns missing
    with caplog.at_level(logging.WARNING, logger="rate_governor"):
        for _ in range(3):
            metrics.observe_outputs(broken, {tables.GOLD_LIMITS: 1})
    assert [r.message for r in caplog.records if "metrics: outputs not recorded" in r.message] and len(
        [r for r in caplog.records if "metrics: outputs" in r.message]) == 1


def test_tables_written_without_arrow_are_read_for_the_metrics_only_while_serving(m, spark):
    df = spark.createDataFrame([("broker_stats", "unknown stat name: X", "o")], "source string, reason string, o string")
    metrics.observe_outputs({}, {tables.QUARANTINE: 1}, others={tables.QUARANTINE: df})
    assert series(m, "rate_governor_quarantined_records_total") == []  # not serving: no Spark job for nobody
    m.serving = True
    metrics.observe_outputs({}, {tables.QUARANTINE: 1}, others={tables.QUARANTINE: df})
    metrics.observe_outputs({}, {tables.QUARANTINE: 0}, others={tables.QUARANTINE: df})  # a replay appends nothing
    assert value(m, "rate_governor_quarantined_records_total", reason="unknown stat name") == 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_endpoint_serves_the_registry_over_http_and_frees_its_port(m):
    m.observe_limits([storm_record()])
    port = free_port()
    endpoint = metrics.serve(MetricsConfig(port=port, address="127.0.0.1"))
    try:
        text = urllib.request.urlopen(endpoint.url, timeout=5).read().decode()
    finally:
        endpoint.close()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    [sample] = families["rate_governor_limit_messages_per_second"].samples
    assert (sample.labels["resource"], sample.value) == ("storm", 20.0)
    assert "process_start_time_seconds" in text and not m.serving
    again = metrics.serve(MetricsConfig(port=port, address="127.0.0.1"))  # closed: the next run gets the port
    assert again is not None
    again.close()


def test_a_busy_port_is_one_error_line_and_no_endpoint(m, caplog):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with caplog.at_level(logging.INFO, logger="rate_governor"):
            assert metrics.serve(MetricsConfig(port=port, address="127.0.0.1")) is None
    lines = [r for r in caplog.records if "metrics" in r.message]
    assert [(r.levelname, r.message.split(";")[0]) for r in lines] == [
        ("ERROR", f"metrics endpoint not started: cannot listen on 127.0.0.1:{port} (Address already in use)")]
    assert metrics.serve(MetricsConfig(port=0)) is None  # off


def test_a_bad_port_setting_names_the_setting():
    with pytest.raises(ConfigError, match="metrics.port"):
        parse_config({"metrics": {"port": 70000}})


def test_each_run_starts_fresh_metrics_as_a_new_process_would_and_keeps_the_lease(m):
    m.observe_publish("recording", False)  # an earlier run in this process (the tests run many)
    m.observe_lease(True)
    m.observe_trigger("gold", "10 seconds")
    metrics.configure(load_config("conf/local.toml"))
    run = metrics.current()
    assert run is not m and value(run, "rate_governor_sink_publishes_total", sink="recording", outcome="failed") is None
    assert value(run, "rate_governor_lease_held") == 1 and value(run, "rate_governor_limit_max_held_seconds") == 3600
    assert value(run, "rate_governor_trigger_seconds", query="gold") is None  # the queries' triggers come as they start
