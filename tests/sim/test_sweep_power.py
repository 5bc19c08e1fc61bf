"""The sweep's power, guarded (issue 67): every policy mutation of ``mutations/policy.toml`` is run with its patch on
the CI cases recorded as catching it (its ``cases``), and each of those cases must fail a check there. A mutation no
longer caught, or a patch that no longer applies, fails the suite; none is dropped.

How: for each mutation, a copy of the tree with its patch applied (``mutations/policy.py``'s :func:`prepared`:
``mutations/run.py``'s ``copy_tree``, ``apply_patch`` and ``imports_from``), then ONE sweep subprocess in the copy
over its listed cases (``python -m pipelines.sim.sweep --seeds ...``, its failed checks as ``--json``; checks the
sweep excuses as n/a do not count). That every listed case passes without the patch is the CI sweep's own test
(``tests/sim/test_sweep.py``: every case passes but the open ones, and a listed case may not be an open one, checked
here). The mutations run two at a time, each sweep in one process (:data:`PARALLEL` × 1 process: the machine's two
cores), all of them in the module's first guard test.

Re-record the cases after a policy change: ``.venv/bin/python mutations/policy.py --record`` (docs/backtest.md
§6.3).

Measured: 69 s for the 16 mutations (15 with cases, p02 an expected failure) on this machine's two cores, quiet
(2026-12-07).
"""

from __future__ import annotations

import importlib.util
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.sim.test_sweep import DEFAULT_CASES, OPEN

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("policy_mutations", ROOT / "mutations" / "policy.py")
policy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(policy)

ENTRIES = {entry["name"]: entry for entry in policy.load()}
#: Mutations run at once, each sweep in one process.
PARALLEL = 2
#: Seconds one mutation's sweep may take (its 2-3 cases: 2-20 s of CPU each; the rest is the subprocess's imports).
TIMEOUT = 600


#: Mutations fewer than ``policy.MIN_CASES`` CI cases catch at this commit, each with ``short`` in
#: ``mutations/policy.toml`` saying why: the sweep's power falls short there (a finding, never a deletion). The cases
#: that do catch one are guarded as any other's; one that no case catches is an expected failure of the guard below.
#: Once ``--record`` finds enough cases for it, its note must go.
SHORT = {name: entry["short"] for name, entry in ENTRIES.items() if entry.get("short")}


def test_every_mutation_lists_at_least_two_ci_cases_none_of_them_open():
    """Each mutation names >= ``policy.MIN_CASES`` CI cases (0..DEFAULT_CASES-1), none of them on the open list (a
    case failing without the patch catches nothing); a mutation noted ``short`` lists fewer (:data:`SHORT`)."""
    assert ENTRIES
    for name, entry in ENTRIES.items():
        cases = entry.get("cases", [])
        if name in SHORT:
            assert len(set(cases)) < policy.MIN_CASES, (
                f"{name}: caught by {cases} now: take its 'short' note out of mutations/policy.toml")
            continue
        assert len(set(cases)) >= policy.MIN_CASES, (
            f"{name}: {len(set(cases))} case(s) listed in mutations/policy.toml, fewer than {policy.MIN_CASES}: "
            "re-record (mutations/policy.py --record --only " + name.split("-")[0] + ")")
        assert all(0 <= c < DEFAULT_CASES for c in cases), f"{name}: {cases} not all CI cases (0..{DEFAULT_CASES - 1})"
        assert not set(cases) & set(OPEN), f"{name}: {sorted(set(cases) & set(OPEN))} open (tests/sim/sweep_open.toml)"



def test_record_writes_only_the_cases_lines_keeping_comments_and_order():
    """``mutations/policy.py --record``'s writer: a ``cases`` line replaced where there is one, added after the
    entry's last key where there is none; every other line as it was; an unknown name refused."""
    text = ('# head\n\n[[mutation]]\nname = "a-x"\nbreaks = "a = [1]"\ncases = [1, 2]\n\n'
            '# about b\n[[mutation]]\nname = "b-y"\nbreaks = "b"\n')
    out = policy.write_cases(text, {"b-y": [7, 9], "a-x": [3, 4, 5]})
    assert out == ('# head\n\n[[mutation]]\nname = "a-x"\nbreaks = "a = [1]"\ncases = [3, 4, 5]\n\n'
                   '# about b\n[[mutation]]\nname = "b-y"\nbreaks = "b"\ncases = [7, 9]\n')
    assert [e["cases"] for e in tomllib.loads(out)["mutation"]] == [[3, 4, 5], [7, 9]]
    assert policy.write_cases(out, {"a-x": [3, 4, 5]}) == out
    with pytest.raises(ValueError, match="c-z"):
        policy.write_cases(text, {"c-z": [1]})

def guard(name: str) -> tuple[str, str | dict[int, set[str]], float]:
    """Mutation ``name`` on its listed cases: (``stale`` | ``error`` | ``ran``, the reason or {case: failed checks},
    wall seconds)."""
    entry, started = ENTRIES[name], time.monotonic()
    with policy.prepared(entry) as (tree, problem):
        if problem:
            return "stale", problem, time.monotonic() - started
        result = policy.sweep(tree, sorted(set(entry["cases"])), 1, policy.log_of(f"guard-{name}"), TIMEOUT)
    if isinstance(result, str):
        return "error", result, time.monotonic() - started
    return "ran", result[0], time.monotonic() - started


@pytest.fixture(scope="module")
def guarded(request) -> dict[str, tuple]:
    """:func:`guard` of every mutation this session runs a guard test of, :data:`PARALLEL` at a time."""
    names = [item.callspec.params["name"] for item in request.session.items
             if item.module is request.module and hasattr(item, "callspec") and "name" in item.callspec.params
             and ENTRIES[item.callspec.params["name"]].get("cases")]
    with ThreadPoolExecutor(PARALLEL) as pool:
        return dict(zip(names, pool.map(guard, names)))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ENTRIES))
def test_each_listed_case_catches_its_mutation(name, guarded):
    cases = sorted(set(ENTRIES[name].get("cases", [])))
    if name in SHORT and not cases:
        pytest.xfail(f"{name}: caught by no CI case at this commit: {SHORT[name]}")
    if not cases:
        pytest.fail(f"{name}: no cases listed in mutations/policy.toml: re-record (mutations/policy.py --record)",
                    pytrace=False)
    state, result, seconds = guarded[name]
    if state == "stale":
        pytest.fail(f"{name}: its patch must be regenerated against this tree: {result}", pytrace=False)
    if state == "error":
        pytest.fail(f"{name}: the sweep could not run its cases: {result}", pytrace=False)
    missing = [c for c in cases if c not in result]
    passed = [c for c in cases if c in result and not result[c]]
    assert not missing, f"{name}: the sweep judged no case {missing}"
    if passed:
        pytest.fail(f"{name}: case(s) {', '.join(map(str, passed))} pass with its patch: the sweep no longer catches "
                    f"it there (re-record: mutations/policy.py --record --only {name.split('-')[0]})", pytrace=False)
