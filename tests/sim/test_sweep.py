"""Randomized closed loops (pipelines/sim/sweep.py): cases ``0..N-1`` through the Spark-free simulator, each judged
by the closed-loop backtest's own checks. A failing case prints its parameters, its check table and its replay
command (``python -m pipelines.sim.sweep --case N``); the checks no governor can meet (:func:`sweep.verdict`: a
propagation delay that puts the fastest limit past 100 s, bystanders never rejected) are reported apart as n/a in
the terminal summary, not counted as passed checks.

A case listed in ``tests/sim/sweep_open.toml`` (:data:`OPEN`: a case that still fails, with the checks it fails and
its diagnosis) is an expected failure while it fails exactly those checks; fixed, or failing another check, it
fails the suite.

N is :data:`DEFAULT_CASES` (over both cores of this 2-core machine: see the constant), or ``--sweep-cases N`` /
``SWEEP_CASES=N`` for a longer run (``--sweep-first`` / ``SWEEP_FIRST`` to start elsewhere), e.g.
``pytest -q tests/sim/test_sweep.py --sweep-cases 2000``.
"""

from __future__ import annotations

import math

import tomllib
from pathlib import Path

import pytest

from pipelines.sim import sweep
from pipelines.sim.figures import check_figure

#: Cases in a default run, judged over both cores (:func:`sweep.judge_many`: spawned workers, one polars thread
#: each). Issue 49's world (irregular shippers and brokers, compound incidents, recurrences of 3-4 episodes with
#: 7-12 quiet minutes: runs of 10-60 simulated minutes) costs about 1.3 s of CPU per case: cases 0-299 took 190 s of
#: wall time over both cores (2026-11-28, load average 3-9 from other work), so 200 take about 130 s, and the
#: machine's 2x swing leaves them within issue 40's 5 minutes. ``--sweep-cases N`` (or ``SWEEP_CASES``) for a
#: longer run.
DEFAULT_CASES = 200

#: Cases that still fail, each with the checks it fails and its diagnosis (issue 49's target not met for them).
OPEN = {entry["case"]: entry for entry in
        tomllib.loads((Path(__file__).with_name("sweep_open.toml")).read_text(encoding="utf-8"))["case"]}


def open_verdict(seed: int, failed: list[tuple[str, str]], figures: dict[str, float]) -> str | None:
    """What a listed case's run says against its entry in :data:`OPEN`: None when it fails exactly its listed
    checks, each by no more than its listed figure (``figures``: the failed checks' figures,
    :data:`pipelines.sim.figures.CHECK_FIGURES`; an expected failure), else why the suite must fail (fixed: take it
    off the list; a check not listed failing: a regression the list would hide; a figure past its listed one: the
    case got worse)."""
    entry = OPEN[seed]
    listed = entry["checks"]
    names = {next((c for c in listed if name.startswith(c)), name) for name, _ in failed}
    if not failed:
        return f"case {seed} passes now: take it off tests/sim/sweep_open.toml"
    if names != set(listed):
        return (f"case {seed} fails {sorted(names)}, listed as failing {sorted(listed)} in "
                "tests/sim/sweep_open.toml")
    for name, _ in failed:
        key, worse = check_figure(name) or (None, "max")
        bound = entry.get("figures", {}).get(key)
        if bound is not None and math.isnan(bound):  # listed with no figure (never limited, no minute qualifying)
            continue
        if bound is None:
            return f"case {seed}: its failed check {name!r} has no figure ({key}) listed in tests/sim/sweep_open.toml"
        value = figures.get(key, float("nan"))
        if not (value <= bound if worse == "max" else value >= bound):
            return f"case {seed}: {key} is {value:.4g}, past its listed {bound:.4g} (tests/sim/sweep_open.toml)"
    return None


#: The ``overridden_storm`` cases of a default run (issue 51: a persisting storm with a drawn pin or exemption of its
#: culprit, :func:`pipelines.sim.overrides.draw_overridden`), apart from the sweep's: drawn from their own seeds,
#: so that cases 0..N-1 above keep their worlds. About 0.8 s of CPU each.
OVERRIDDEN_CASES = 8


def pytest_generate_tests(metafunc):
    if "seed" in metafunc.fixturenames:
        first, count = metafunc.config.getoption("sweep_first"), metafunc.config.getoption("sweep_cases")
        metafunc.parametrize("seed", range(first, first + count))
    if "overridden_seed" in metafunc.fixturenames:
        metafunc.parametrize("overridden_seed", range(OVERRIDDEN_CASES))


@pytest.fixture(scope="module")
def judged(request):
    """Every case of this run judged once, over the CPUs (the first case's test waits for all)."""
    first, count = request.config.getoption("sweep_first"), request.config.getoption("sweep_cases")
    return sweep.judge_many(range(first, first + count))


def test_sweep_case(seed, judged, record_property):
    result = judged[seed]
    for name, why in result.excused:
        record_property("sweep_na", f"case {seed} {result.kind}: n/a {name}: {why}")
    if seed in OPEN:
        wrong = open_verdict(seed, list(result.failed), dict(result.figures))
        if wrong is not None:
            pytest.fail(f"replay: {result.replay}\n{wrong}\n{result.report}", pytrace=False)
        pytest.xfail(f"open: {OPEN[seed]['why']}")
    if result.failed:  # the replay command first: the one line pytest's short summary keeps
        pytest.fail(f"replay: {result.replay}\n{result.report}", pytrace=False)


@pytest.fixture(scope="module")
def overridden_judged():
    """Every ``overridden_storm`` case judged once, over the CPUs."""
    return sweep.judge_many(range(OVERRIDDEN_CASES), kind=sweep.OVERRIDDEN)


def test_overridden_storm_case(overridden_seed, overridden_judged):
    result = overridden_judged[overridden_seed]
    assert result.kind == sweep.OVERRIDDEN
    if result.failed:
        pytest.fail(f"replay: {result.replay}\n{result.report}", pytrace=False)


def test_an_open_case_passes_the_suite_only_while_it_fails_exactly_its_listed_checks_within_their_figures():
    """The ratchet: a listed case fixed, failing a check it is not listed for, or failing a listed one by more than
    its listed figure (for an onset, a longer delay) fails the suite."""
    seed = next(iter(OPEN))
    listed = [(check + " (measured)", "x") for check in OPEN[seed]["checks"]]
    figures = dict(OPEN[seed]["figures"])
    assert open_verdict(seed, listed, figures) is None
    assert "passes now" in open_verdict(seed, [], figures)
    assert "listed as failing" in open_verdict(seed, [*listed, ("0 enforced limits on a resource", "1")], figures)
    worse = {key: value + 1.0 for key, value in figures.items()}
    assert "past its listed" in open_verdict(seed, listed, worse)
    assert all(entry["why"] and entry["checks"] and entry["figures"] for entry in OPEN.values())
    for entry in OPEN.values():  # every listed check names the figure it is held to
        assert {check_figure(c)[0] for c in entry["checks"]} == set(entry["figures"]), entry["case"]


def test_a_case_is_judged_the_same_in_a_worker_and_in_this_process():
    """The pool changes where a case runs, not its verdict: case 16 (a storm and a surge, broker-c's minutes 166 s
    late) and case 18 (a flash sale, broker-a's minutes 209 s late) in two spawned workers and here."""
    here = {seed: sweep.judge(seed) for seed in (16, 18)}
    assert sweep.judge_many([16, 18], workers=2) == here
    assert not here[16].failed and not here[18].failed


def test_a_case_draws_the_same_world_every_time():
    """A case is its seed: drawn twice, the same kind, spec, clients, brokers and irregular world."""
    assert sweep.draw(85) == sweep.draw(85)
    assert sweep.draw(85).irregular["stats_delay_seconds"]["broker-e"] == 50.7
