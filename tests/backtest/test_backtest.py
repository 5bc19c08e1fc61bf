"""Backtest (pipelines/backtest/): the scenarios it uses, its config and CLI errors. The done criteria measured on
the governor's real pipeline (slow) are in tests/e2e/test_backtest_e2e.py."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from pipelines import rocketmq as rmq
from pipelines.backtest.inputs import BacktestError, load_backtest_config
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
    cfg = load_backtest_config("conf/backtest.toml")
    assert cfg.shipping_seconds == 5 and cfg.broker.wait_time_ms_in_send_queue == 200.0
    # no backtest-only timing: a [governor] watermark/trigger override is refused
    override = tmp_path / "override.toml"
    override.write_text(Path("conf/backtest.toml").read_text() + "\n[governor]\nwatermark_seconds = 10\n")
    with pytest.raises(BacktestError, match="governor"):
        load_backtest_config(override)
    bad = tmp_path / "bad.toml"
    bad.write_text(Path("conf/backtest.toml").read_text().replace("capacity_factor", "capacity_factr"))
    with pytest.raises(BacktestError, match="broker.capacity_factr"):
        load_backtest_config(bad)


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


# --- results table: through the lake, one transaction per run ---------------------------------------------------------
def test_results_append_through_the_lake_once_per_run(spark, tmp_path):
    from types import SimpleNamespace

    from pipelines import schemas
    from pipelines.backtest.metrics import RESULTS_TABLE, write_results
    from pipelines.io.lake import open_lake

    lake = open_lake(spark, tmp_path / "lake", "delta-rs")
    metrics = pd.DataFrame({"governor": ["with", "both"], "resource_class": ["incident", "bystander"],
                            "metric": ["rejected", "rejected_cut"], "value": [12.0, float("nan")],
                            "unit": ["msgs", "pct"]})
    outcome = SimpleNamespace(metrics=metrics, inputs=SimpleNamespace(scenario="retry_storm", seed=11))
    recorded = dt.datetime(2026, 11, 22, 9, 0, tzinfo=dt.timezone.utc)
    path = write_results(lake, outcome, "run1", recorded)
    write_results(lake, outcome, "run1", recorded)                  # a retried write of the same run adds nothing
    write_results(lake, outcome, "run2", recorded)
    assert path == lake.path(RESULTS_TABLE)
    got = lake.read(RESULTS_TABLE)
    assert got.schema == schemas.BACKTEST_RESULTS
    rows = got.orderBy("run_id", "metric").collect()
    assert [(r.run_id, r.metric, r.value) for r in rows] == [
        ("run1", "rejected", 12.0), ("run1", "rejected_cut", None), ("run2", "rejected", 12.0),
        ("run2", "rejected_cut", None)]
    assert lake.committed_version(RESULTS_TABLE, "backtest-run1") == 0


def test_timing_puts_sets_on_the_fast_path_and_recovery_on_the_final_path():
    """The backtest's timing is the product's: a set is in force one trigger + shipping + micro-batch + propagation
    after its window; recovery waits for the watermark (line lag + watermark) and two triggers as well."""
    from types import SimpleNamespace

    from pipelines.backtest.inputs import Timing

    bcfg = load_backtest_config("conf/backtest.toml")
    timing = Timing.of(SimpleNamespace(trigger_seconds=10, watermark_seconds=120), bcfg)
    assert timing.fast_seconds == 10 + 5 + 5 + 10
    assert timing.final_seconds == 60 + 120 + 2 * 10 + 5 + 5 + 10
    delays = timing.delays(pd.DataFrame({"action": ["set", "relax", "lift"]}))
    assert delays.tolist() == [30.0, 220.0, 220.0]
