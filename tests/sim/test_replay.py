"""The replay of a recording (pipelines/sim/replay*.py), without Spark: small inline recordings for each rule (each
refused message once, demand added back and taken off, hidden demand under an enforced limit, capacities, the
incident), the closed loop of a generated scenario's own demand against the simulator's closed loop of the same
scenario, the report, the command line's one-line errors. The governor's --once run on a rendered landing directory
is tests/e2e/test_replay_e2e.py."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json

import numpy as np
import polars as pl
import pytest

from pipelines import rocketmq as rmq
from pipelines.config import load_config
from pipelines.sim import replay_brokers as rb
from pipelines.sim import replay_demand as rd
from pipelines.sim.admitted import trickle
from pipelines.sim.broker_model import BrokerModelConfig
from pipelines.sim.loop import closed_cluster, simulate
from pipelines.sim.replay import main
from pipelines.sim.replay_enforced import hidden_demand, limits_per_second, minute_caps
from pipelines.sim.replay_figures import all_figures
from pipelines.sim.replay_input import Recording, RecordingError, read_recording
from pipelines.sim.replay_job import job_settings
from pipelines.sim.replay_refused import refused_messages
from pipelines.sim.replay_report import model_check, write_json, write_report
from pipelines.sim.replay_run import replay_recording
from pipelines.sim.settings import build_spec, load_backtest_config

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 1, 5, 10, tzinfo=UTC)
NOW = dt.datetime(2026, 1, 5, 12, tzinfo=UTC)


def at(ms: int) -> dt.datetime:
    return T0 + dt.timedelta(milliseconds=ms)


def lines(rows: list[tuple]) -> pl.DataFrame:
    """Refused-send lines: (ms after T0, broker, topic, client[, message])."""
    return pl.DataFrame({"event_time": [at(r[0]) for r in rows], "broker": [r[1] for r in rows],
                         "topic": [r[2] for r in rows], "producer_group": ["p"] * len(rows),
                         "client": [r[3] for r in rows], "message": [r[4] if len(r) > 4 else "x" for r in rows]},
                        schema_overrides={"event_time": pl.Datetime("us", "UTC")})


def stats(rows: list[tuple]) -> pl.DataFrame:
    """Minute stats: (minute, broker, stat, key, sum)."""
    return pl.DataFrame({"minute_start": [T0 + dt.timedelta(minutes=r[0]) for r in rows],
                         "broker": [r[1] for r in rows], "stat_name": [r[2] for r in rows],
                         "stats_key": [r[3] for r in rows], "sum": [r[4] for r in rows]},
                        schema_overrides={"minute_start": pl.Datetime("us", "UTC"), "sum": pl.Int64})


# --- each refused message once ------------------------------------------------------------------------------------
def test_a_send_retried_on_three_brokers_is_one_message_at_its_first_broker_and_lost():
    out = refused_messages(lines([(100, "a", "t", "c1"), (350, "b", "t", "c1"), (600, "c", "t", "c1")]),
                           {"t": ("a", "b", "c")}, T0, attempts=3, retrying_share=0.6)
    assert out.chains == 1 and out.chains_by_lines == {3: 1}
    assert out.added.to_dicts() == [{"minute": 0, "broker": "a", "topic": "t", "messages": 1.0}]
    assert out.delivered.height == 0  # every attempt refused: nothing was admitted elsewhere


def test_two_refusals_on_one_broker_are_two_messages_and_each_may_have_been_admitted_elsewhere():
    out = refused_messages(lines([(100, "a", "t", "c1"), (150, "a", "t", "c1")]), {"t": ("a", "b")}, T0, 3, 0.6)
    assert out.chains == 2
    assert out.delivered.to_dicts() == [{"minute": 0, "last_broker": "a", "topic": "t", "messages": pytest.approx(1.2)}]


def test_a_chain_of_two_on_a_topic_of_three_brokers_was_admitted_on_its_third_attempt():
    out = refused_messages(lines([(100, "a", "t", "c1"), (300, "b", "t", "c1")]), {"t": ("a", "b", "c")}, T0, 3, 0.6)
    assert out.chains == 1
    assert out.delivered["messages"].to_list() == [1.0] and out.delivered["last_broker"].to_list() == ["b"]


def test_a_topic_on_one_broker_retries_there_and_lines_further_apart_than_the_retry_gap_do_not_chain():
    one = refused_messages(lines([(100, "a", "t", "c1"), (400, "a", "t", "c1")]), {"t": ("a",)}, T0, 3, 0.6)
    far = refused_messages(lines([(100, "a", "t", "c1"), (2500, "b", "t", "c1")]), {"t": ("a", "b")}, T0, 3, 0.6)
    assert one.chains == 1 and far.chains == 2


def test_lines_without_a_client_and_a_whole_send_in_one_line_are_one_message_each():
    out = refused_messages(lines([(100, "a", "t", None), (200, "b", "t", None),
                                  (300, "a", "t", "c1", "Send [3] times, still failed, BrokersSent: [a, b, a]")]),
                           {"t": ("a", "b")}, T0, 3, 0.6)
    assert out.chains == 3
    assert out.delivered["messages"].sum() == pytest.approx(1.2)  # the two client-less lines; the whole send is lost


# --- demand: added back, taken off, created ----------------------------------------------------------------------
def demand_of(recorded: pl.DataFrame, refused) -> pl.DataFrame:
    cfg = BrokerModelConfig()
    offered = rd.recorded_offered(recorded, T0, cfg)
    hosts = {"t": ("a", "b")}
    added, _left = rd.refused_demand(offered, refused, hosts)
    return rd.apply_demand(rd.pair_rows(recorded, T0), offered, added)


def test_refused_messages_raise_their_broker_s_puts_consumption_and_writes_and_deliveries_come_off_the_other():
    recorded = stats([(0, "a", rmq.TOPIC_PUT_NUMS, "t", 600), (0, "b", rmq.TOPIC_PUT_NUMS, "t", 600),
                      (0, "a", rmq.GROUP_GET_NUMS, "t@g", 600), (0, "a", rmq.BROKER_PUT_NUMS, "Cl", 700),
                      (0, "b", rmq.BROKER_PUT_NUMS, "Cl", 600)])
    refused = refused_messages(lines([(1000 + 10 * i, "a", "t", f"c{i}") for i in range(60)]), {"t": ("a", "b")},
                               T0, 3, 0.5)
    out = {(r["broker"], r["stat_name"]): r["sum"] for r in demand_of(recorded, refused).to_dicts()}
    assert out[("a", rmq.TOPIC_PUT_NUMS)] == pytest.approx(660)
    assert out[("a", rmq.GROUP_GET_NUMS)] == pytest.approx(660)
    assert out[("a", rmq.BROKER_PUT_NUMS)] == pytest.approx(760)
    assert out[("b", rmq.TOPIC_PUT_NUMS)] == pytest.approx(570)  # half of 60 retried on b and admitted there
    assert out[("b", rmq.BROKER_PUT_NUMS)] == pytest.approx(570)


def test_a_topic_refused_everything_on_a_broker_gets_a_row_of_its_refused_messages():
    recorded = stats([(0, "b", rmq.TOPIC_PUT_NUMS, "t", 600), (0, "a", rmq.TOPIC_PUT_NUMS, "u", 60)])
    refused = refused_messages(lines([(100 * i, "a", "t", f"c{i}", "BrokersSent: [a]") for i in range(5)]),
                               {"t": ("a", "b")}, T0, 3, 0.0)
    rows = demand_of(recorded, refused).filter((pl.col("broker") == "a") & (pl.col("stats_key") == "t"))
    assert rows["sum"].to_list() == [5.0]


def test_a_group_s_send_backs_scale_with_their_retry_topic_puts_and_writes():
    recorded = stats([(0, "a", rmq.SNDBCK_PUT_NUMS, "t@g", 600), (0, "a", rmq.TOPIC_PUT_NUMS, "%RETRY%g", 600),
                      (0, "a", rmq.BROKER_PUT_NUMS, "Cl", 3000)])
    offered = rd.recorded_offered(recorded, T0, BrokerModelConfig())
    double = pl.DataFrame({"m": [0], "broker": ["a"], "resource_type": ["group"], "resource": ["g"],
                           "requests": [600.0], "demand": [1200.0]})
    out = {r["stat_name"]: r["sum"] for r in rd.apply_demand(rd.pair_rows(recorded, T0), offered, double).to_dicts()}
    assert out[rmq.SNDBCK_PUT_NUMS] == 1200 and out[rmq.TOPIC_PUT_NUMS] == 1200
    assert out[rmq.BROKER_PUT_NUMS] == pytest.approx(6000)  # 5 writes per send-back, as recorded


# --- demand an enforced limit hid ---------------------------------------------------------------------------------
def enforced(rows: list[tuple]) -> pl.DataFrame:
    """gold/limits rows: (decided minute, action, limit_qps, version)."""
    return pl.DataFrame({"decided_at": [T0 + dt.timedelta(minutes=r[0], seconds=30) for r in rows],
                         "resource_type": ["group"] * len(rows), "resource": ["g"] * len(rows),
                         "limit_qps": [r[2] for r in rows], "action": [r[1] for r in rows],
                         "mode": ["enforce"] * len(rows),
                         "expires_at": [T0 + dt.timedelta(minutes=r[0] + 10) for r in rows],
                         "version": [r[3] for r in rows]})


def offered_group(per_minute: list[float]) -> pl.DataFrame:
    return pl.DataFrame({"m": list(range(len(per_minute))), "broker": ["a"] * len(per_minute),
                         "resource_type": ["group"] * len(per_minute), "resource": ["g"] * len(per_minute),
                         "requests": per_minute})


def retry_puts(per_minute: list[float]) -> pl.DataFrame:
    """The group's limiter bucket: its retry topic's puts (send-backs and fallback sends) per minute."""
    return offered_group(per_minute).rename({"requests": "admitted"})


def test_demand_at_an_enforced_cap_is_held_at_its_level_before_the_limit_and_a_refresh_does_not_reset_it():
    per = limits_per_second(enforced([(2, "set", 10.0, 1), (4, "set", 10.0, 2)]), T0, 8, 10.0)
    caps = minute_caps(per[("group", "g")])  # in force from 2:40, the refresh from 4:40: minutes 3-7 wholly limited
    assert np.isnan(caps[:3]).all() and (caps[3:8] == 10.0).all()
    # the reference is minute 1, the last one wholly before 2:40 (minute 2 is partly limited already)
    # at the cap, its send-backs fall under it as its consumers' fallback sends take the same bucket
    hidden = hidden_demand(per, offered_group([3000, 3000, 1500, 200, 198, 160, 100, 200]),
                           retry_puts([3000, 3000, 1500, 600, 598, 560, 100, 600]), bound_share=0.9)
    assert hidden.held == {("group", "g"): [3, 4, 5, 7]}  # minute 6: under the cap (the cause gone)
    assert hidden.demand["demand"].to_list() == [3000.0] * 4


def test_a_lift_ends_the_hold_and_a_limit_in_force_from_the_first_minute_is_reported_under_read():
    per = limits_per_second(enforced([(2, "set", 10.0, 1), (4, "lift", 10.0, 2)]), T0, 8, 10.0)
    assert np.isnan(minute_caps(per[("group", "g")])[5:]).all()
    early = hidden_demand(limits_per_second(enforced([(-1, "set", 10.0, 1)]), T0, 8, 0.0),
                          offered_group([600] * 8), retry_puts([600] * 8), 0.9)
    assert early.unread == [("group", "g")] and early.demand.height == 0


# --- brokers and the incident ------------------------------------------------------------------------------------
def test_capacity_busy_brokers_at_their_highest_writes_others_at_three_times_normal_and_the_flag_wins():
    offered = pl.DataFrame({"m": [0, 1, 2, 0, 1, 2], "broker": ["a"] * 3 + ["b"] * 3, "resource_type": ["topic"] * 6,
                            "resource": ["t"] * 6, "requests": [6000.0, 60000.0, 54000.0, 6000.0, 9000.0, 12000.0],
                            "work_per_request": [1.0] * 6})
    busy = pl.DataFrame({"window_start": [T0 + dt.timedelta(minutes=1)], "window_end": [T0 + dt.timedelta(minutes=2)],
                         "resource_type": ["broker"], "resource": ["a"], "anomaly": ["BROKER_BUSY"],
                         "observed_tps": [30.0]}, schema_overrides={"window_start": pl.Datetime("us", "UTC"),
                                                                   "window_end": pl.Datetime("us", "UTC")})
    cfg = BrokerModelConfig()
    caps = dict(rb.estimate_capacity(offered, busy, ("a", "b"), cfg, {}, T0).select("broker", "capacity_tps").iter_rows())
    assert caps == {"a": 1000.0, "b": 450.0}  # a: 60,000/min; b: 3 x its median 150/s
    given = rb.estimate_capacity(offered, busy, ("a", "b"), cfg, {"a": 700.0}, T0)
    assert given["capacity_tps"][0] == 700.0 and given["rule"][0] == "--capacity"


def anomaly_rows(rows: list[tuple]) -> pl.DataFrame:
    """(type, name, anomaly, first minute, last minute) → one gold/anomalies row per window."""
    out = [(T0 + dt.timedelta(minutes=m), T0 + dt.timedelta(minutes=m + 1), t, r, a, 1.0)
           for t, r, a, lo, hi in rows for m in range(lo, hi + 1)]
    return pl.DataFrame(out, schema={"window_start": pl.Datetime("us", "UTC"), "window_end": pl.Datetime("us", "UTC"),
                                     "resource_type": pl.Utf8, "resource": pl.Utf8, "anomaly": pl.Utf8,
                                     "observed_tps": pl.Float64}, orient="row")


def test_the_incident_merges_a_group_s_windows_and_a_cause_still_on_at_the_judged_edge_lasts_to_the_end():
    anomalies = anomaly_rows([("group", "g", "RUNAWAY_RETRY", 3, 5), ("topic", "%RETRY%g", "TRAFFIC_SURGE", 3, 5),
                              ("topic", "t", "TRAFFIC_SURGE", 8, 9)])
    end = T0 + dt.timedelta(minutes=20)
    inc = rb.recorded_incident(anomalies, {}, T0, end, judged_until=T0 + dt.timedelta(minutes=10))
    causes = {(c.resource_type, c.resource): c for c in inc.causes}
    assert set(causes) == {("group", "g"), ("topic", "t")}  # a retry topic's surge is its group's storm
    assert causes[("group", "g")].active == ((T0 + dt.timedelta(minutes=3), T0 + dt.timedelta(minutes=6)),)
    assert causes[("topic", "t")].active[0][1] == end


# --- the closed loop of a scenario's own demand against the simulator's -------------------------------------------
def recording_of(spec, background) -> Recording:
    """The recording a governor would read of ``spec`` in open loop: its windowed minute rows, its causes flagged."""
    traffic = closed_cluster(spec, load_backtest_config("conf/backtest.toml")).traffic
    minute = traffic[(traffic["period"] == "minute") & traffic["stat_name"].isin(rmq.WINDOWED_STATS)]
    frame = pl.from_pandas(minute[["minute_start", "broker", "stat_name", "stats_key", "sum"]].astype(
        {"broker": str, "stat_name": str, "stats_key": str}))
    frame = frame.with_columns(pl.col("minute_start").cast(pl.Datetime("us", "UTC")), pl.col("sum").cast(pl.Int64))
    inc = traffic.attrs["incident"]
    spans = inc.active or ((inc.onset, spec.end),)
    rows = [("group", inc.culprit_group, "RUNAWAY_RETRY", int((a - spec.start_utc).total_seconds() // 60),
             int((b - spec.start_utc).total_seconds() // 60) - 1) for a, b in spans]
    empty = pl.DataFrame(schema={"event_time": pl.Datetime("us", "UTC"), "broker": pl.Utf8, "topic": pl.Utf8,
                                 "producer_group": pl.Utf8, "client": pl.Utf8, "message": pl.Utf8})
    brokers = tuple(sorted(frame["broker"].unique().to_list()))
    anomalies = anomaly_rows([(t, r, a, lo, hi) for t, r, a, lo, hi in rows])
    anomalies = anomalies.with_columns(pl.col("window_start").dt.offset_by(
        f"{int((spec.start_utc - T0).total_seconds())}s"), pl.col("window_end").dt.offset_by(
        f"{int((spec.start_utc - T0).total_seconds())}s"))
    return Recording(frame, empty, anomalies, pl.DataFrame(schema={"source": pl.Utf8, "reason": pl.Utf8,
                                                                   "records": pl.UInt32}),
                     spec.start_utc, spec.minutes, brokers, 0, background, None)


@functools.lru_cache(maxsize=None)
def closed_loops(name: str):
    """(the simulator's closed loop of named scenario ``name``, the replay of its recording with its capacities)."""
    bcfg = load_backtest_config("conf/backtest.toml")
    cfg = load_config("conf/local.toml")
    spec = build_spec(name, {}, now=NOW)
    cluster = closed_cluster(spec, bcfg)
    sim = simulate(spec, cfg, bcfg, cluster=closed_cluster(spec, bcfg))
    background = pl.from_pandas(trickle(cluster, np.random.default_rng(spec.seed + 1))[
        ["event_time", "broker", "topic", "message", "code"]].astype({"code": float}))
    rec = recording_of(spec, background.with_columns(pl.col("event_time").cast(pl.Datetime("us", "UTC"))))
    capacity = {b: float(c) for b, c in cluster.capacity.items() if b in rec.brokers}
    advisory = cfg.model_copy(update={"limits": cfg.limits.model_copy(update={"mode": "advisory"})})
    return sim, replay_recording(rec, advisory, bcfg, capacity)  # an advisory deployment asks what enforce would do


def test_a_fixed_storm_replayed_from_its_own_demand_agrees_with_the_simulator_s_closed_loop():
    sim, outcome = closed_loops("storm_fixed")
    key = ("group", "get-pugc-to-ai-consumer")
    mine = next(r for r in outcome.figures if (r["resource_type"], r["resource"]) == key)
    theirs = next(r for r in all_figures(sim, outcome.spans) if (r["resource_type"], r["resource"]) == key)
    assert abs((mine["first_in_force"] - theirs["first_in_force"]).total_seconds()) <= 60
    assert abs((mine["lifted_at"] - theirs["lifted_at"]).total_seconds()) <= 120
    a, b = mine["bystander_rejected"]["replayed"], theirs["bystander_rejected"]["replayed"]
    assert b > 1000 and abs(a - b) <= 0.1 * b
    assert mine["bystander_rejected"]["no_governor"] > 5 * a  # the limit saved the other topics' sends
    assert not mine["flag"]


def test_the_report_names_the_resource_and_its_figures_and_flags_a_limit_without_a_recorded_anomaly(tmp_path):
    _sim, outcome = closed_loops("storm_fixed")
    meta = {"landing": "rec", "report": str(tmp_path), "topics": 10, "groups": 6, "job_seconds": 1.0,
            "config_line": "config"}
    page = write_report(outcome, tmp_path, meta).read_text(encoding="utf-8")
    write_json(outcome, tmp_path, meta)
    assert "group `get-pugc-to-ai-consumer`" in page and "none: check before enforcing" not in page
    assert "* Why group `get-pugc-to-ai-consumer`: [preliminary] RUNAWAY_RETRY" in page
    figures = json.loads((tmp_path / "replay.json").read_text(encoding="utf-8"))
    assert figures["resources"][0]["first_limit_qps"] > 0
    assert (tmp_path / "resource-group-get-pugc-to-ai-consumer.png").read_bytes()[:4] == b"\x89PNG"
    unflagged = all_figures(outcome.result, {})  # the same limit, had the recording flagged nothing
    assert [r["flag"] for r in unflagged] == [True]


def test_the_report_lists_what_the_job_quarantined_by_reason(tmp_path):
    _sim, outcome = closed_loops("storm_fixed")
    reasons = pl.DataFrame({"source": ["broker_stats"], "reason": ["unknown broker broker-x (not in [brokers] known)"],
                            "records": [1234]}, schema_overrides={"records": pl.UInt32})
    outcome = dataclasses.replace(outcome, recording=dataclasses.replace(outcome.recording, quarantine=reasons))
    page = write_report(outcome, tmp_path, {"landing": "rec", "report": str(tmp_path), "topics": 1, "groups": 1,
                                            "config_line": ""}).read_text(encoding="utf-8")
    assert "1,234 broker_stats records: unknown broker broker-x (not in [brokers] known)" in page


def test_the_model_check_warns_when_the_model_and_the_recording_disagree_about_the_bystanders():
    row = {"resource_type": "group", "resource": "g",
           "bystander_rejected_per_minute": {"recorded": 100.0, "no_governor": 5000.0, "replayed": 0.0}}
    assert "capacities are lower" in model_check([row])[0]
    row["bystander_rejected_per_minute"]["no_governor"] = 150.0
    assert model_check([row]) == []


# --- the recording's edges and the command line -----------------------------------------------------------------
def write_silver(lake, minutes) -> None:
    """A ``silver/broker_stats`` table of one topic's minute lines: ``minutes`` (a count, or the minutes)."""
    from deltalake import write_deltalake

    minutes = range(minutes) if isinstance(minutes, int) else minutes
    rows = stats([(m, "a", rmq.TOPIC_PUT_NUMS, "t", 60) for m in minutes]).with_columns(
        event_time=pl.col("minute_start") + pl.duration(minutes=1), period=pl.lit("minute")).drop("minute_start")
    write_deltalake(str(lake / "silver" / "broker_stats"), rows.to_arrow())


def test_a_recording_too_short_or_without_stats_is_one_clear_error(tmp_path):
    with pytest.raises(RecordingError, match="^no stats: "):
        read_recording(tmp_path, 7)
    write_silver(tmp_path, 3)
    with pytest.raises(RecordingError, match=r"^too short: 3 minute\(s\) of stats .* needs at least 7$"):
        read_recording(tmp_path, 7)
    assert read_recording(tmp_path, 3).minutes == 3


def test_a_recording_of_a_few_scattered_minutes_is_too_short_and_one_of_a_day_too_long(tmp_path):
    write_silver(tmp_path / "scattered", [0, 4000])  # two minutes, days apart: not 4,001 minutes of recording
    with pytest.raises(RecordingError, match=r"^too short: 2 minute\(s\)"):
        read_recording(tmp_path / "scattered", 7)
    write_silver(tmp_path / "day", range(0, 1440, 60))
    with pytest.raises(RecordingError, match=r"^too long: 1381 minutes"):
        read_recording(tmp_path / "day", 7)


def test_the_job_runs_on_the_operator_s_config_with_every_sink_off_and_in_advisory_mode(tmp_path):
    data = job_settings("conf/cluster.toml", tmp_path / "landing", tmp_path / "lake")
    assert data["source"]["kind"] == "files" and data["lake"]["path"] == str(tmp_path / "lake")
    assert not data["sink"]["kafka"]["enabled"] and not data["sink"]["rocketmq"]["enabled"]
    assert data["limits"]["mode"] == "advisory" and data["metrics"]["port"] == 0


@pytest.mark.parametrize("argv, expected", [
    (["--report", "r"], "the following arguments are required: --landing"),
    (["--landing", "x", "--report", "r", "--capacity", "broker-a=fast"], "expected BROKER=WRITES_PER_S"),
    (["--landing", "x", "--report", "r", "--capacity", "broker-a=-5"], "expected BROKER=WRITES_PER_S"),
])
def test_a_bad_flag_is_one_line_and_exit_2(argv, expected, capsys):
    with pytest.raises(SystemExit) as done:
        main(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2 and expected in err and len(err.strip().splitlines()) == 1


def test_a_landing_directory_without_stats_is_one_line_and_exit_1_before_any_job_runs(tmp_path, capsys):
    (tmp_path / "landing" / "broker_stats").mkdir(parents=True)
    assert main(["--landing", str(tmp_path / "landing"), "--report", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("python -m pipelines.sim.replay: no stats: ") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r" / "lake").exists()
