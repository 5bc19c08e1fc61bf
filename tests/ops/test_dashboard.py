"""The Grafana dashboard (conf/grafana/rate-governor.json) and the alert rules name only metrics the governor
exposes, and the renderer reads the dashboard's panels as Grafana would lay them out. Drawing from a real Prometheus
is in tests/e2e/test_sink_faults.py."""

from __future__ import annotations

import datetime as dt
import re

import pyarrow as pa

from pipelines.config import GovernorConfig, load_config
from pipelines.decide.paths.overrides import parse
from pipelines import tables
from pipelines.ops import dashboard, override_metrics
from pipelines.ops.metrics import GovernorMetrics
from tests.ops.test_alert_rules import RULES

METRIC = re.compile(r"\brate_governor_\w+")


def exposed() -> set[str]:
    """Every sample name a governor's registry gives once each hook has seen something."""
    m = GovernorMetrics()
    now = dt.datetime(2026, 11, 26, 12, tzinfo=dt.timezone.utc)
    m.configure(load_config("conf/local.toml"))
    m.observe_trigger("gold", "10 seconds")
    m.observe_progress("gold", {"batchDuration": 1000, "eventTime": {"watermark": "2026-11-26T11:58:00.000Z"}})
    m.observe_limits([{"resource_type": "group", "resource": "g", "limit_qps": 5.0, "mode": "enforce",
                       "expires_at": "2999-01-01T00:00:00Z", "brokers": {"b": {"limit_qps": 5.0, "burst": 5}}}])
    end = pa.array([now], pa.timestamp("us", tz="UTC"))
    m.observe_outputs({
        tables.GOLD_LIMITS: pa.table({"action": ["set"], "basis": ["final"], "resource_type": ["group"],
                                      "mode": ["enforce"]}),
        tables.GOLD_ANOMALIES: pa.table({"window_end": end, "resource_type": ["group"], "resource": ["g"],
                                         "anomaly": ["RUNAWAY_RETRY"]}),
        tables.STATE_POLICY: pa.table({"resource_type": ["group", "topic"], "resource": ["g", "t"],
                                       "limit_qps": [5.0, 50.0], "limited_since": pa.concat_arrays([end, end]),
                                       "baseline_tps": [40.0, 80.0],
                                       "at_cap_since": pa.concat_arrays([end, pa.nulls(1, end.type)])}),
        tables.QUARANTINE: pa.table({"reason": ["empty line"]}),
        tables.SILVER_BROKER_STATS: pa.table({"broker": ["b"], "event_time": end}),
    })
    m.observe_publish("file", True)
    m.observe_lease(True)
    pin, = parse([{"recorded_at": now, "event": "create", "override_id": "ovr-0000000a", "kind": "pin",
                   "resource_type": "group", "resource": "g", "limit_qps": 5.0, "starts_at": now,
                   "ends_at": now + dt.timedelta(hours=1), "author": "a", "reason": "r"}], GovernorConfig())[0]
    override_metrics.observe([pin], now, m)
    return {s.name for family in m.registry.collect() for s in family.samples}


def test_dashboard_and_rules_name_only_metrics_the_governor_exposes():
    names = exposed()
    used = {name for p in dashboard.panels() for expr, _ in p.targets for name in METRIC.findall(expr)}
    used |= set(METRIC.findall(RULES.read_text(encoding="utf-8")))
    assert len(used) >= 12
    assert used <= names, sorted(used - names)


def test_panels_are_read_in_grafanas_layout_order_with_their_units():
    found = dashboard.panels()
    assert [p.title for p in found][:2] == ["Limits in force (cluster-wide)", "Each broker's share of a limit"]
    assert len(found) == 8 and all(p.targets for p in found)
    durations = next(p for p in found if p.title.startswith("Micro-batch duration"))
    assert durations.unit == "s" and [fmt for _, fmt in durations.targets] == ["{{query}} mean", "{{query}} trigger"]
    assert dashboard.legend("{{resource}} @ {{broker}}", {"resource": "g", "broker": "*"}, "x") == "g @ *"


def test_cli_says_in_one_line_when_prometheus_cannot_be_asked(tmp_path, capsys):
    from tests.kafka_broker import free_port

    code = dashboard.main(["--prometheus", f"http://127.0.0.1:{free_port()}", "--out", str(tmp_path / "d.png")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "cannot ask Prometheus at http://127.0.0.1:" in err and "\n" not in err
    assert not (tmp_path / "d.png").exists()
