"""Operators' overrides in closed loop (pipelines/sim/overrides.py through pipelines/sim/loop.py): the named
persisting storm (a consumer group sending back more than it consumes from minute 6 to the end) against the decision
plane, with a pin or an exemption of the culprit group applied by both paths and the override tick, judged per
second from what the brokers enforced; and the sweep's ``overridden_storm`` cases, which draw them."""

from __future__ import annotations

import datetime as dt
import functools

import numpy as np
import pandas as pd

from pipelines.decide.paths.overrides import tag
from pipelines.sim import overrides as so
from pipelines.sim import sweep
from pipelines.sim.loop import closed_cluster, simulate
from pipelines.sim.settings import build_spec, governor_config, load_backtest_config

NOW = dt.datetime(2026, 1, 5, 12, tzinfo=dt.timezone.utc)
PIN_ID, EXEMPT_ID = "ovr-000000a1", "ovr-000000b2"


@functools.lru_cache(maxsize=None)
def run(kind: str, start_minutes: float, minutes: float, qps: float | None = None, release_after: float | None = None):
    """(the persisting storm with one override of its culprit, ``start_minutes`` after the storm's onset for
    ``minutes``; released ``release_after`` minutes after its start when given; the result, the overrides)."""
    bcfg = load_backtest_config("conf/backtest.toml")
    cfg = governor_config(bcfg, None, None)
    spec = build_spec("persisting_storm", {}, now=NOW)
    cluster = closed_cluster(spec, bcfg)
    start = cluster.incident.onset + dt.timedelta(minutes=start_minutes)
    rows = [{"recorded_at": start, "event": "create", "override_id": PIN_ID if kind == "pin" else EXEMPT_ID,
             "kind": kind, "resource_type": "group", "resource": None, "limit_qps": qps, "starts_at": start,
             "ends_at": start + dt.timedelta(minutes=minutes), "author": "oncall", "reason": "sale"}]
    if release_after is not None:
        rows.append({**rows[0], "event": "release", "recorded_at": start + dt.timedelta(minutes=release_after),
                     "author": "lead"})
    overrides = tuple(so.for_cluster(rows, cluster, cfg))
    return simulate(spec, cfg, bcfg, cluster=cluster, overrides=overrides), overrides, cfg


def culprit_rows(result) -> pd.DataFrame:
    group = result.cluster.incident.culprit_group
    rows = result.limits[result.limits["resource"] == group]
    return rows.sort_values(["decided_at", "version"], kind="stable")


def window(result, o, lag: float) -> tuple[int, int]:
    start = (pd.Timestamp(o.starts_at) - result.cluster.start).total_seconds()
    return int(np.ceil(start + lag)), int(np.floor((pd.Timestamp(o.until) - result.cluster.start).total_seconds()))


def test_an_exempted_storm_is_never_enforced_and_is_limited_at_once_when_the_exemption_ends():
    result, overrides, cfg = run("exempt", 3.0, 3.0)
    (exempt,) = overrides
    checks = so.checks(result, overrides, cfg)
    assert [ok for _, ok, _ in checks] == [True, True], checks
    rules, pinned = so.in_force(result)
    a, b = window(result, exempt, cfg.windows.fast_trigger_seconds + result.propagation_seconds + 1)
    assert not np.isnan(rules[a - 90]), "the rules had limited the storm before the exemption"
    assert np.isnan(rules[a:b]).all() and np.isnan(pinned).all()
    rows = culprit_rows(result)
    under = rows[(rows["decided_at"] >= exempt.starts_at) & (rows["decided_at"] < exempt.until)]
    assert (under["mode"] == "advisory").sum() >= 1 and not ((under["mode"] == "enforce")
                                                              & (under["action"] != "lift")).any()
    assert all(tag(r) == EXEMPT_ID for r in under["reason"])
    first = rows[(rows["decided_at"] >= exempt.until) & (rows["mode"] == "enforce") & (rows["action"] == "set")].iloc[0]
    assert (first["decided_at"] - exempt.until).total_seconds() <= 30, first  # the next fast trigger with evidence
    assert f"after override {EXEMPT_ID} ended at " in first["reason"]


def test_an_exemption_from_before_the_onset_keeps_the_storm_unlimited_until_it_ends():
    result, overrides, cfg = run("exempt", -1.0, 3.5)
    checks = so.checks(result, overrides, cfg)
    assert [ok for _, ok, _ in checks] == [True, True], checks
    rules, _ = so.in_force(result)
    onset = int((pd.Timestamp(result.cluster.incident.onset) - result.cluster.start).total_seconds())
    assert np.isnan(rules[onset:onset + 150]).all(), "limited during the exemption"


def test_a_pinned_storm_is_held_at_the_pin_and_the_rules_take_over_after_it():
    result, overrides, cfg = run("pin", 3.0, 3.0, qps=40.0)
    (pin,) = overrides
    checks = so.checks(result, overrides, cfg)
    assert [ok for _, ok, _ in checks] == [True, True], checks
    rows = culprit_rows(result)
    under = rows[(rows["decided_at"] >= pin.starts_at) & (rows["decided_at"] < pin.until)]
    assert set(under["basis"]) == {"override"} and set(under["limit_qps"]) == {40.0}
    after = rows[rows["decided_at"] >= pin.until]
    assert after.iloc[0]["action"] == "lift" and after.iloc[0]["basis"] == "override"
    assert (after["mode"] == "enforce").all() and (after.iloc[1:]["limit_qps"] < 40.0).all()  # the rules' own
    # each broker got its share of the pin: the figures in force add up to it
    for _at, snapshot in result.in_force:
        mine = [(qps, rec) for (_b, _t, r), (qps, rec) in snapshot.items() if r == pin.resource]
        if mine and mine[0][1]["reason"].startswith("[override]"):
            assert sum(qps for qps, _ in mine) <= 40.0 + 1e-6


def test_a_released_pin_ends_at_its_release():
    result, overrides, cfg = run("pin", 3.0, 10.0, qps=40.0, release_after=2.0)
    (pin,) = overrides
    assert pin.until == pin.starts_at + dt.timedelta(minutes=2)
    assert [ok for _, ok, _ in so.checks(result, overrides, cfg)] == [True, True]
    lift = culprit_rows(result).query("basis == 'override' and action == 'lift'").iloc[0]
    assert "released by lead at" in lift["reason"]
    assert (lift["decided_at"] - pin.until).total_seconds() <= cfg.windows.fast_trigger_seconds


def test_the_sweep_draws_overridden_storms_as_their_own_cases_and_judges_them_by_their_checks():
    """``overridden_storm`` is not among the sweep's kinds (case k is drawn as before overrides existed): its cases
    are its own (``--kind overridden_storm``), a persisting storm with a pin or an exemption of its culprit."""
    assert so.KIND not in sweep.KINDS
    bcfg = load_backtest_config("conf/backtest.toml")
    drawn = {}
    for seed in range(20):
        case = sweep.draw_case(seed, bcfg, kind=so.KIND)
        assert case == sweep.draw_case(seed, bcfg, kind=so.KIND) and case.kind == so.KIND
        assert case.scenario == "persisting_storm" and case.replay().endswith(f"--kind {so.KIND} --case {seed}")
        drawn.setdefault(case.overrides[0]["kind"], case)
        if len(drawn) == 2:
            break
    assert set(drawn) == {"pin", "exempt"}
    for kind, case in drawn.items():
        assert case.overrides[0]["resource"]  # the culprit group, named when drawn
        figures = sweep.run(case, bcfg=bcfg)
        names = [name for name, _, _ in figures.checks]
        assert names[0].startswith(f"{kind} ovr-") and names[-1].startswith("0 enforced limits "), names
        assert sweep.failed(figures, case) == [], sweep.report(case, figures)
