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

#: Cases in a default run: as many as fit in 5 minutes in one process on this 2-core machine shared with other jobs.
#: 500 do not: a case costs about 1 s of CPU (the decision plane's polars work at every 2 s fast trigger and 10 s
#: gold trigger of 10-42 simulated minutes; an intermittent storm, 30-42 minutes, 3 s); cases 0-499 took 519 s
#: wall (482 s CPU) beside other jobs (load 5-7). 280 take about 290 s. ``--sweep-cases 500`` (or more) for the
#: longer run; pytest-xdist (a test dependency) would spread the cases over workers with ``-n 2 --dist load``, but
#: one process is this project's default (pyproject.toml).
DEFAULT_CASES = 280


def pytest_generate_tests(metafunc):
    if "seed" in metafunc.fixturenames:
        first, count = metafunc.config.getoption("sweep_first"), metafunc.config.getoption("sweep_cases")
        metafunc.parametrize("seed", range(first, first + count))


@pytest.fixture(scope="module")
def world():
    """The shipped governor config and backtest world, and the clusters :func:`sweep.draw` built for a premise."""
    from pipelines.sim.settings import governor_config, load_backtest_config

    bcfg = load_backtest_config("conf/backtest.toml")
    return governor_config(bcfg, None, None), bcfg, {}


def test_sweep_case(seed, world, record_property):
    cfg, bcfg, clusters = world
    case = sweep.draw(seed, bcfg, clusters)
    figures = sweep.run(case, cfg, bcfg, clusters.pop(seed, None))
    failed, excused = sweep.verdict(case, figures, cfg, bcfg)
    for name, why in excused:
        record_property("sweep_na", f"case {seed} {case.kind}: n/a {name}: {why}")
    if failed:  # the replay command first: the one line pytest's short summary keeps
        pytest.fail(f"replay: {case.replay()}\n{sweep.report(case, figures)}", pytrace=False)
