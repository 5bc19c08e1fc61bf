"""Backtest (pipelines/backtest.py): new scenarios, config, CLI errors, and the issue's done criteria measured on
the governor's real pipeline (slow: one governor run per scenario, small clusters)."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipelines.backtest import run as bt
from pipelines import rocketmq as rmq
from pipelines.sim.scenarios import SCENARIOS
from pipelines.sim.spec import ScenarioSpec
from pipelines.sim.traffic import build_traffic

START = dt.datetime(2026, 11, 22, 8, 0, tzinfo=dt.timezone.utc)
SMALL = {"brokers": 2, "topics": 4, "groups": 3, "seed": 11, "start": START}


def _puts(traffic: pd.DataFrame, key: str) -> pd.Series:
    tp = traffic[(traffic["stat_name"] == rmq.TOPIC_PUT_NUMS) & (traffic["period"] == "minute")
                 & (traffic["stats_key"] == key)]
    return tp.groupby("minute_start", observed=True)["sum"].sum() / 60.0


# --- scenarios ------------------------------------------------------------------------------------------------------
def test_existing_scenarios_kept_and_new_ones_registered():
    assert {"retry_storm", "steady", "flash_sale", "noisy_neighbour", "normal_day", "large_mix"} <= set(SCENARIOS)


def test_flash_sale_ramps_5x_over_10_minutes_and_consumers_keep_up():
    spec = ScenarioSpec(name="flash_sale", minutes=30, onset_minute=10, **SMALL)
    traffic = build_traffic(spec)
    inc = traffic.attrs["incident"]
    put = _puts(traffic, inc.culprit_topic).to_numpy()
    assert put[5:10].mean() == pytest.approx(spec.flash_base_tps, rel=0.1)
    assert put[20:].mean() == pytest.approx(5 * spec.flash_base_tps, rel=0.1)
    assert 1.2 < put[11] / put[9] < 2.0                       # a ramp, not a step
    gets = traffic[(traffic["stat_name"] == rmq.GROUP_GET_NUMS) & traffic["stats_key"].astype(str)
                   .str.startswith(inc.culprit_topic + "@")]
    assert gets.empty or gets.groupby("minute_start", observed=True)["sum"].sum().iloc[-1] / 60 > 0.9 * put[-1]


def test_noisy_neighbour_saturates_one_broker():
    spec = ScenarioSpec(name="noisy_neighbour", minutes=20, onset_minute=10, **SMALL)
    traffic = build_traffic(spec)
    inc = traffic.attrs["incident"]
    put = _puts(traffic, inc.culprit_topic).to_numpy()
    assert put[12] > 50 * put[5] and inc.culprit_broker == "broker-a"


def test_normal_day_is_diurnal_with_one_restart_minute():
    spec = ScenarioSpec(name="normal_day", minutes=40, **SMALL)
    traffic = build_traffic(spec)
    assert traffic.attrs["incident"] is None
    minute = traffic[traffic["period"] == "minute"]
    nan_minutes = minute[minute["tps"].isna() & (minute["style"] == "SUM")].groupby(
        ["broker", "minute_start"], observed=True).size()
    restarted = {(b, m) for b, m in nan_minutes.index if m != pd.Timestamp(START)}
    assert restarted == {("broker-b", pd.Timestamp(START) + pd.Timedelta(minutes=20))}
    bp = minute[minute["stat_name"] == rmq.BROKER_PUT_NUMS].groupby("minute_start", observed=True)["sum"].sum()
    assert bp.iloc[18:22].max() > 1.6 * bp.iloc[1:4].mean()   # peak mid-run, trough at the start


def test_large_mix_small_size_has_storm_and_flash():
    spec = ScenarioSpec(name="large_mix", minutes=12, onset_minute=6, brokers=5, topics=200, groups=40, seed=3,
                            start=START)
    traffic = build_traffic(spec)
    inc = traffic.attrs["incident"]
    assert inc.kind == "large_mix" and "flash sale" in inc.detail
    retry = _puts(traffic, rmq.RETRY_TOPIC_PREFIX + spec.culprit_group)
    assert retry.iloc[-1] > 700


# --- config and CLI ---------------------------------------------------------------------------------------------------
def test_backtest_config_loads_and_names_bad_keys(tmp_path):
    cfg = bt.load_backtest_config("conf/backtest.toml")
    assert cfg.watermark_seconds == 10 and cfg.broker.wait_time_ms_in_send_queue == 200.0
    bad = tmp_path / "bad.toml"
    bad.write_text(Path("conf/backtest.toml").read_text().replace("capacity_factor", "capacity_factr"))
    with pytest.raises(bt.BacktestError, match="broker.capacity_factr"):
        bt.load_backtest_config(bad)


@pytest.mark.parametrize("args, message", [
    (["--scenario", "nope", "--lake", "x"], "unknown scenario 'nope'"),
    (["--lake", "x"], "one of --scenario or --from-lake is required"),
    (["--from-lake", "/no/such/lake", "--lake", "x"], "lake directory not found: /no/such/lake"),
    (["--scenario", "retry_storm", "--lake", "x", "--conf", "missing.toml"], "config file not found: missing.toml"),
    (["--scenario", "retry_storm"], "the following arguments are required: --lake"),
])
def test_cli_errors_are_one_line_and_nonzero(args, message):
    done = subprocess.run([sys.executable, "-m", "pipelines.backtest", *args], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr


# --- the done criteria on the governor's real pipeline (slow) --------------------------------------------------------
def _run(spark, tmp_path_factory, name: str, **sizes):
    lake = tmp_path_factory.mktemp(f"bt-{name}") / "lake"
    spec = ScenarioSpec(name=name, **{**SMALL, **sizes})
    return bt.run_backtest(spark, lake=lake, bcfg=bt.load_backtest_config("conf/backtest.toml"), spec=spec)


def _metric(outcome, governor: str, cls: str, metric: str) -> float:
    m = outcome.metrics
    return float(m[(m.governor == governor) & (m.resource_class == cls) & (m.metric == metric)]["value"].iloc[0])


@pytest.fixture(scope="module")
def storm(spark, tmp_path_factory):
    # 60 storm minutes: the limit is in force 150 s after the onset (window + line lag + 10 s watermark + trigger +
    # propagation), so the bystanders' rejections are cut by ~96 %; a shorter storm cannot reach 95 % honestly.
    return _run(spark, tmp_path_factory, "retry_storm", minutes=70, onset_minute=10)


@pytest.mark.slow
def test_retry_storm_done_criteria(storm):
    o = storm["outcome"]
    assert _metric(o, "with", "incident", "onset_to_first_limit_window") <= 2
    assert _metric(o, "both", "bystander", "rejected_cut") >= 95.0
    assert _metric(o, "without", "bystander", "busy_rejected") > 0          # the storm hurts the bystanders
    assert _metric(o, "with", "all", "false_limits") == 0
    assert all(ok for _, ok, _ in o.checks), o.checks


@pytest.mark.slow
def test_retry_storm_outputs_and_replay_from_lake(storm, tmp_path, capsys):
    from deltalake import DeltaTable

    report = Path(storm["report"]).read_text()
    assert "![TPS per resource" in report and Path(storm["png"]).stat().st_size > 10_000
    results = DeltaTable(storm["table"]).to_pandas()
    assert set(results["governor"]) == {"with", "without", "both"} and results["run_id"].nunique() == 1
    lake = Path(storm["table"]).parent.parent
    out = tmp_path / "replay"
    assert bt.main(["--from-lake", str(lake), "--lake", str(out), "--scenario", "retry_storm"]) == 0
    printed = capsys.readouterr().out
    assert "bystander rejected sends" in printed and (out / "backtest" / "report-retry_storm.md").is_file()
    replay = DeltaTable(str(out / "backtest" / "results")).to_pandas()
    cut = replay[(replay.metric == "rejected_cut")]["value"].iloc[0]
    assert cut == pytest.approx(_metric(storm["outcome"], "both", "bystander", "rejected_cut"), abs=1.0)


@pytest.mark.slow
def test_flash_sale_no_enforced_limit_below_the_peak(spark, tmp_path_factory):
    out = _run(spark, tmp_path_factory, "flash_sale", minutes=30, onset_minute=10)
    o = out["outcome"]
    assert _metric(o, "with", "all", "limits_below_observed_peak_unwarranted") == 0
    assert all(ok for _, ok, _ in o.checks), o.checks
    assert _metric(o, "without", "incident", "busy_rejected") == 0           # healthy brokers


@pytest.mark.slow
def test_normal_day_no_enforced_limit(spark, tmp_path_factory):
    out = _run(spark, tmp_path_factory, "normal_day", minutes=30)
    o = out["outcome"]
    assert _metric(o, "with", "all", "enforced_limit_resources") == 0
    assert np.isclose(_metric(o, "without", "other", "busy_rejected"), 0.0)
