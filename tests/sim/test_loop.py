"""Named closed-loop behaviours through the Spark-free simulator (pipelines/sim/loop.py): the closed-loop backtest's
named scenarios (pipelines/sim/settings.py SCENARIO_SIZES) run against the decision plane, judged per second
from what the brokers enforced (``SimResult.in_force``) and from the decided ``gold/limits`` rows.

What each test holds to (the figures are those of pipelines/sim/figures.py):

* a flash sale (a healthy surge under its brokers' capacity) is never limited: advisory records at most, no
  enforced limit in force at any broker, no send rejected by a limiter;
* a normal day changes nothing: no record at all;
* a persisting storm is limited within its first 2 minutes and held to the end: no second without the limit, no
  advisory record or lift of its resource once enforced;
* a fixed consumer (and one left with a legitimate 5-6 % retry level) is held until its fix and lifted within 8
  minutes of it, and not limited again;
* an intermittent storm is held across its quiet spells (2 and 4 minutes) and lifted once, after the last episode;
* a noisy neighbour (a surge that overloads its broker) is limited within 100 s, its limit's value changes at most
  3 times while the surge lasts, and no advisory record replaces the enforced limit mid-surge.
"""

from __future__ import annotations

import datetime as dt
import functools

import numpy as np
import pandas as pd
import pytest

from pipelines.sim.figures import compute, targets_in_force, truth
from pipelines.sim.settings import build_spec, governor_config, load_backtest_config
from pipelines.sim.loop import simulate

#: A fixed clock: every run of a scenario has the same start (bench/sim_speed.py's).
NOW = dt.datetime(2026, 1, 5, 12, tzinfo=dt.timezone.utc)


@functools.lru_cache(maxsize=None)
def run(name: str, **overrides):
    """(the simulated closed loop of named scenario ``name`` with ``overrides``, its figures)."""
    bcfg = load_backtest_config("conf/backtest.toml")
    result = simulate(build_spec(name, overrides, now=NOW), governor_config(bcfg, None, None), bcfg)
    return result, compute(result)


def second_of(result, t) -> int:
    return int(np.ceil((pd.Timestamp(t) - result.cluster.start).total_seconds()))


def culprit_in_force(result) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """(per second of the run: an enforced limit on the culprit is in force at some broker, the cause's spans as
    seconds [a, b))."""
    culprits, spans = truth(result)
    target, _ = targets_in_force(result, culprits)
    return ~np.isnan(target), [(second_of(result, a), min(second_of(result, b), len(target))) for a, b in spans]


def culprit_rows(result) -> pd.DataFrame:
    """The culprit's decided ``gold/limits`` rows (both paths), in decision order."""
    (rtype, resource), = truth(result)[0]
    rows = result.limits
    return rows[(rows["resource_type"] == rtype) & (rows["resource"] == resource)].sort_values("decided_at",
                                                                                               kind="stable")


def published_after(rows: pd.DataFrame, at) -> pd.DataFrame:
    """Rows decided after the first enforced one (``at``: its decided_at) that the brokers could take in force."""
    return rows[rows["decided_at"] > at]


def assert_held(result, first: int, last: int) -> None:
    """An enforced limit on the culprit in force at every second of [first, last)."""
    limited, _ = culprit_in_force(result)
    gaps = np.flatnonzero(~limited[first:last])
    assert gaps.size == 0, (f"no limit in force for {gaps.size} s between seconds {first} and {last} "
                            f"(first gap at second {first + int(gaps[0])})")


def test_a_flash_sale_on_healthy_brokers_is_never_limited():
    result, figures = run("flash_sale")
    inc = result.cluster.incident
    assert inc.kind == "flash_sale"
    surge = result.limits[result.limits["resource"] == inc.culprit_topic]
    assert len(surge) > 0, "the surge is seen (advised), else this proves nothing"
    assert set(result.limits["mode"]) == {"advisory"}, result.limits[["decided_at", "resource", "mode"]]
    assert all(snapshot == {} for _at, snapshot in result.in_force), "an enforced limit was in force"
    assert int(result.cluster.limited_seconds.sum()) == 0
    assert figures.value("false_limits") == 0


def test_a_normal_day_changes_nothing():
    result, figures = run("normal_day")
    assert len(result.limits) == 0, result.limits[["decided_at", "resource", "action", "mode"]]
    assert all(snapshot == {} for _at, snapshot in result.in_force)
    assert figures.value("false_limits") == 0 and figures.value("enforced_limit_resources") == 0


def test_a_persisting_storm_is_limited_within_2_minutes_and_held():
    result, figures = run("persisting_storm")
    onset = figures.value("onset_to_limit_in_force")
    assert onset <= 120.0, f"limit in force {onset:.0f} s after the onset"
    limited, [(a, b)] = culprit_in_force(result)
    assert_held(result, a + int(np.ceil(onset)), len(limited))
    rows = culprit_rows(result)
    first = rows[rows["mode"] == "enforce"]["decided_at"].min()
    later = published_after(rows, first)
    assert (later["mode"] == "enforce").all(), "an advisory record replaced the enforced limit"
    assert (later["action"] != "lift").all(), "lifted while the storm persists"
    assert figures.value("limit_changes_while_cause_persists") <= 1
    assert 0.75 <= figures.value("culprit_admitted_over_target") <= 1.25


@pytest.mark.parametrize("name, overrides", [
    ("storm_fixed", {}),
    ("storm_fixed_legit_retry", {}),  # 6 % of what it consumes retried after the fix
    ("storm_fixed_legit_retry", {"fixed_retry_share": 0.05}),
])
def test_a_fixed_consumer_is_lifted_within_8_minutes_of_its_fix(name, overrides):
    result, figures = run(name, **overrides)
    limited, [(a, fix)] = culprit_in_force(result)
    assert_held(result, a + int(np.ceil(figures.value("onset_to_limit_in_force"))), fix)  # not lifted before
    lift = figures.value("fix_to_lift_minutes")
    assert lift <= 8.0, f"lifted {lift:.1f} min after the fix"
    free = fix + int(round(lift * 60))
    assert not limited[free:].any(), "limited again after the lift"
    rows = culprit_rows(result)
    assert list(rows["action"]).count("lift") == 1
    assert figures.value("limit_changes_while_cause_persists") <= 1


def test_a_fixed_consumer_retrying_a_third_of_what_it_consumes_is_held_at_its_cap_and_named_for_a_person():
    """Fixed after 8 minutes, the group keeps retrying 33 % of the 400 msg/s it consumes: 132 msg/s against its cap
    of 40 (10 %), under the rule's ratio (0.5) but over every probe's raise, so it cannot be told from the storm
    and is never lifted (each probe it tries is taken and undone). Its limit is held at its cap from its first window, and ``RateGovernorLimitAtCap`` names it 30 minutes (and the
    alert's ``for``) later: the lift check passes as named for a person. With the alert's threshold at 2 hours
    nothing names it and the check fails."""
    result, figures = run("storm_fixed_legit_retry", fixed_retry_share=0.33, minutes=50)
    lift = next((ok, measured) for name, ok, measured in figures.checks if name.startswith("each lift <="))
    assert lift[0] and "named for a person (RateGovernorLimitAtCap at" in lift[1], lift
    rows = culprit_rows(result)
    assert "lift" not in set(rows["action"])
    since = {r["at_cap_since"] for _now, r in result.states if r["resource_type"] == "group" and r["limit_qps"]}
    assert len(since - {None}) == 1, since   # one spell at the cap, from the limit's first window to the end
    bcfg = load_backtest_config("conf/backtest.toml")
    cfg = governor_config(bcfg, None, None)
    cfg = cfg.model_copy(update={"limits": cfg.limits.model_copy(update={"max_at_cap_seconds": 7200})})
    late = compute(simulate(build_spec("storm_fixed_legit_retry", {"fixed_retry_share": 0.33, "minutes": 50},
                                       now=NOW), cfg, bcfg))
    assert not next(ok for name, ok, _ in late.checks if name.startswith("each lift <="))


@pytest.mark.parametrize("name,held_from", [("intermittent_short", 0), ("intermittent_storm", 1)])
def test_an_intermittent_storm_is_held_across_its_quiet_spells(name, held_from):
    """Quiet spells of 2 and 4 minutes. The first limit is lifted after 3 clear windows and one more a carrier
    reported in: a 2-minute spell holds it, a 4-minute one does not (the lift is decided 21 s into the next
    episode, which no line can show yet: limited again on that episode's first window, at the remembered target).
    From the first recurrence on, its lift needs 6 clear windows (flap damping): the limit is held through every
    quiet spell after it and lifted once, after the last fix, within 20 minutes of it."""
    result, figures = run(name)
    limited, spans = culprit_in_force(result)
    assert len(spans) == 3
    first = spans[held_from][0] + int(np.ceil(figures.value(
        "onset_to_limit_in_force" if held_from == 0 else f"onset_to_limit_in_force_episode_{held_from + 1}")))
    last = spans[-1][1]
    assert_held(result, first, last)
    rows = culprit_rows(result)
    lifts = rows[rows["action"] == "lift"]
    assert len(lifts) == 1 + held_from and second_of(result, lifts["decided_at"].iloc[-1]) >= last
    assert figures.value("fix_to_lift_minutes_last") <= 20.0
    assert figures.value("limit_changes_all_episodes") <= 1
    checks = {n: ok for n, ok, _ in figures.checks}
    assert all(checks.values()), [n for n, ok in checks.items() if not ok]


@pytest.mark.parametrize("name", ["noisy_neighbour", "noisy_neighbour_long"])
def test_a_noisy_neighbour_is_limited_and_held_through_its_surge(name):
    result, figures = run(name)
    onset = figures.value("onset_to_limit_in_force")
    assert onset <= 100.0, f"limit in force {onset:.0f} s after the onset"
    limited, [(a, b)] = culprit_in_force(result)
    assert_held(result, a + int(np.ceil(onset)), b)
    changes = figures.value("limit_changes_while_cause_persists")
    assert changes <= 3, f"{changes:.0f} value changes while the surge lasts"
    rows = culprit_rows(result)
    first = rows[rows["mode"] == "enforce"]["decided_at"].min()
    surge_end = result.cluster.start + pd.Timedelta(seconds=b)
    mid = published_after(rows, first)
    mid = mid[mid["decided_at"] < surge_end]
    assert (mid["mode"] == "enforce").all(), "an advisory record replaced the enforced limit mid-surge"
    assert (mid["action"] != "lift").all(), "lifted mid-surge"
