"""Randomized closed loops (pipelines/sim/sweep.py): cases ``0..N-1`` through the Spark-free simulator, each judged
by the closed-loop backtest's own checks. A failing case prints its parameters, its check table and its replay
command (``python -m pipelines.sim.sweep --case N``); the checks no governor can meet (:func:`sweep.verdict`: a
propagation delay that puts the fastest limit past 100 s, bystanders never rejected) are reported apart as n/a in
the terminal summary, not counted as passed checks.

N is :data:`DEFAULT_CASES` (one process on this 2-core machine: see the constant), or ``--sweep-cases N`` /
``SWEEP_CASES=N`` for a longer run (``--sweep-first`` / ``SWEEP_FIRST`` to start elsewhere), e.g.
``pytest -q tests/sim/test_sweep.py --sweep-cases 2000``.
"""

from __future__ import annotations

import pytest

from pipelines.sim import sweep

#: Cases in a default run: the issue's 500, judged over both cores (:func:`sweep.judge_many`: spawned workers,
#: one polars thread each). A case costs about 1 s of CPU (the decision plane's polars work at every 2 s fast
#: trigger and 10 s gold trigger of 10-42 simulated minutes; an intermittent storm, 30-42 minutes, 3 s): in one
#: process cases 0-499 took 519 s wall beside other jobs (load 5-7), so one process fits about 280 in 5 minutes.
#: ``--sweep-cases N`` (or ``SWEEP_CASES``) for a longer run.
DEFAULT_CASES = 500


def pytest_generate_tests(metafunc):
    if "seed" in metafunc.fixturenames:
        first, count = metafunc.config.getoption("sweep_first"), metafunc.config.getoption("sweep_cases")
        metafunc.parametrize("seed", range(first, first + count))


@pytest.fixture(scope="module")
def judged(request):
    """Every case of this run judged once, over the CPUs (the first case's test waits for all)."""
    first, count = request.config.getoption("sweep_first"), request.config.getoption("sweep_cases")
    return sweep.judge_many(range(first, first + count))


def test_sweep_case(seed, judged, record_property):
    result = judged[seed]
    for name, why in result.excused:
        record_property("sweep_na", f"case {seed} {result.kind}: n/a {name}: {why}")
    if result.failed:  # the replay command first: the one line pytest's short summary keeps
        pytest.fail(f"replay: {result.replay}\n{result.report}", pytrace=False)


def test_a_case_is_judged_the_same_in_a_worker_and_in_this_process():
    """The pool changes where a case runs, not its verdict: case 209 (a storm whose busy broker turned its
    send-backs into plain sends) and case 61 (a fixed storm with a legitimate retry level) in two spawned workers
    and here."""
    here = {seed: sweep.judge(seed) for seed in (61, 209)}
    assert sweep.judge_many([61, 209], workers=2) == here
    assert not here[209].failed and not here[61].failed
