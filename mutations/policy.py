"""The sweep's power (issue 49): apply each policy mutation of ``mutations/policy.toml`` in a copy of the tree, run
the CI sweep there (cases ``--first`` .. ``--first + --cases - 1``, default those of ``tests/sim/test_sweep.py``)
and print ``caught`` with the cases that caught it, or ``missed``. With ``--record`` (issue 67): find, for each
mutation, a few cheap CI cases that catch it and write them to its ``cases`` in ``mutations/policy.toml``, the cases
``tests/sim/test_sweep_power.py`` runs with its patch in every CI run.

A case catches a mutation when a check fails on it with the patch and passed without it: the same cases are run on
an unpatched copy first (the baseline), so a check that already fails at this commit (a policy flaw still open)
catches nothing. Checks the sweep excuses as n/a (:func:`pipelines.sim.sweep.verdict`) never count. Exit status 0
only when every selected mutation was caught (with ``--record``: by at least :data:`MIN_CASES` cases); 2 for a bad
flag.

``--record`` is far cheaper than a sweep per mutation: the baseline runs once over the CI cases (and measures each
case's CPU seconds); then each mutation's patched copy runs the cases that pass there, cheapest first, in chunks of
``--chunk`` (default 20) over ``--workers`` processes, and stops at the first chunk that brings its catching cases
to :data:`WANT_CASES`; it records the cheapest of them. A mutation caught by fewer than :data:`MIN_CASES` of all the
CI cases is said so in one line, its cases written as found (never dropped), and the exit status is 1.

Run with the project's Python (``.venv/bin/python`` or ``$RG_VENV/bin/python``)::

    .venv/bin/python mutations/policy.py                     # every mutation, the CI sweep (about 17 sweeps)
    .venv/bin/python mutations/policy.py --only p05 p06 --cases 60
    .venv/bin/python mutations/policy.py --record            # re-record every mutation's catching cases
    .venv/bin/python mutations/policy.py --record --only p14 p16
    .venv/bin/python mutations/policy.py --list

Each sweep's output: ``scratch/mutations/policy-<name>.log``. The copy, the patch and the import check are those of
``mutations/run.py``.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Iterator, Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run as runner  # noqa: E402  (mutations/run.py: copy_tree, apply_patch, environment, imports_from)

sys.path.insert(0, str(HERE.parent))
from pipelines.cli import OneLineParser  # noqa: E402

CATALOGUE = HERE / "policy.toml"
PATCHES = HERE / "policy"
#: Cases ``--record`` looks for per mutation, and the fewest that still count as caught (issue 67: every mutation
#: caught by at least two CI cases).
WANT_CASES, MIN_CASES = 3, 2


def load() -> list[dict]:
    """The mutations of :data:`CATALOGUE`, in order, each with its ``patch`` path (and ``cases``, once recorded)."""
    entries = tomllib.loads(CATALOGUE.read_text(encoding="utf-8"))["mutation"]
    for entry in entries:
        entry["patch"] = PATCHES / f"{entry['name']}.patch"
    return entries


def ci_cases() -> int:
    """The CI sweep's case count (``tests/sim/test_sweep.py``'s ``DEFAULT_CASES``)."""
    text = (HERE.parent / "tests" / "sim" / "test_sweep.py").read_text(encoding="utf-8")
    for line in text.splitlines():
        if line.startswith("DEFAULT_CASES = "):
            return int(line.split("=", 1)[1].split("#")[0])
    raise SystemExit("tests/sim/test_sweep.py has no DEFAULT_CASES")


def sweep(tree: Path, seeds: Sequence[int], workers: int, log: Path, timeout: float,
          ) -> tuple[dict[int, set[str]], dict[int, float]] | str:
    """The sweep over ``seeds`` in ``tree`` (``python -m pipelines.sim.sweep --seeds ...``): ({case: {failed
    check}}, {case: CPU seconds}), or why it could not run. Excused (n/a) checks are not failed ones."""
    out, times = tree / "scratch" / "policy-sweep.json", tree / "scratch" / "policy-times.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in (out, times):
        stale.unlink(missing_ok=True)
    command = [sys.executable, "-m", "pipelines.sim.sweep", "--seeds", *map(str, seeds), "--workers", str(workers),
               "--json", str(out), "--times", str(times)]
    with log.open("a") as stream:
        stream.write(f"$ {' '.join(command)}  (in {tree})\n")
        stream.flush()
        try:
            done = subprocess.run(command, cwd=tree, env=runner.environment(tree), stdout=stream,
                                  stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"timeout after {timeout:.0f} s (see {log})"
    if done.returncode not in (0, 1) or not out.exists():
        return f"the sweep exited {done.returncode} (see {log})"
    failed = {int(k): set(v) for k, v in json.loads(out.read_text(encoding="utf-8")).items()}
    seconds = {int(k): float(v) for k, v in json.loads(times.read_text(encoding="utf-8")).items()}
    return failed, seconds


@contextlib.contextmanager
def prepared(entry: dict | None) -> Iterator[tuple[Path, str | None]]:
    """A copy of the tree (``mutations/run.py``'s :func:`copy_tree`) with ``entry``'s patch applied (None: the
    baseline): (the copy, None), or (the copy, why it cannot run: the patch no longer applies, or the imports do not
    come from the copy). Removed afterwards."""
    name = entry["name"] if entry else "baseline"
    tree = Path(tempfile.mkdtemp(prefix=f"rg-policy-{name[:3]}-"))
    try:
        runner.copy_tree(tree)
        problem = None
        if entry:
            problem = runner.apply_patch(entry["patch"], tree)
            problem = problem and f"{entry['patch'].relative_to(HERE.parent)} no longer applies: {problem}"
        yield tree, problem or runner.imports_from(tree)
    finally:
        shutil.rmtree(tree, ignore_errors=True)


def log_of(name: str) -> Path:
    """``scratch/mutations/policy-<name>.log``, emptied."""
    runner.LOGS.mkdir(parents=True, exist_ok=True)
    log = runner.LOGS / f"policy-{name}.log"
    log.write_text("")
    return log


def one(entry: dict | None, seeds: Sequence[int], workers: int, timeout: float,
        ) -> tuple[dict[int, set[str]] | str, float]:
    """Copy the tree, apply ``entry``'s patch (None: the baseline), run the sweep over ``seeds`` there."""
    started = time.monotonic()
    with prepared(entry) as (tree, problem):
        if problem:
            return f"stale or broken: {problem}", time.monotonic() - started
        result = sweep(tree, seeds, workers, log_of(entry["name"] if entry else "baseline"), timeout)
    return (result if isinstance(result, str) else result[0]), time.monotonic() - started


def write_cases(text: str, cases: dict[str, list[int]]) -> str:
    """``text`` (:data:`CATALOGUE`'s) with each named mutation's ``cases = [..]`` line set to ``cases[name]``: replaced
    where its entry has one, else added after the entry's last key line. Comments, order and every other line are
    kept. Raises ValueError for a name not in ``text``."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.strip() == "[[mutation]]"] + [len(lines)]
    for name, found in cases.items():
        value = f"cases = [{', '.join(str(c) for c in found)}]\n"
        for a, b in zip(starts, starts[1:]):
            block = range(a + 1, b)
            if not any(re.fullmatch(rf'name = "{re.escape(name)}"\s*', lines[i]) for i in block):
                continue
            have = [i for i in block if re.match(r"cases\s*=", lines[i])]
            if have:
                lines[have[0]] = value
            else:
                last = max(i for i in block if re.match(r"\w+\s*=", lines[i]))
                lines.insert(last + 1, value)
                starts = [s + (s > last) for s in starts]
            break
        else:
            raise ValueError(f"no [[mutation]] named {name!r} in {CATALOGUE.name}")
    return "".join(lines)


def record(entries: list[dict], seeds: Sequence[int], workers: int, chunk: int, timeout: float) -> int:
    """``--record`` (module docstring): find each mutation's catching cases among ``seeds`` and write them to
    :data:`CATALOGUE`. 0 when each is caught by at least :data:`MIN_CASES`, else 1."""
    total = time.monotonic()
    with prepared(None) as (tree, problem):
        if problem:
            print(f"baseline: {problem}")
            return 1
        base = sweep(tree, seeds, workers, log_of("baseline"), timeout)
    if isinstance(base, str):
        print(f"baseline: {base}")
        return 1
    failing, cost = base
    passing = sorted((s for s in seeds if not failing.get(s)), key=lambda s: (cost[s], s))
    print(f"baseline (no patch): {len(passing)} of {len(seeds)} cases pass (failing, so catching nothing: "
          f"{', '.join(str(s) for s in sorted(seeds) if failing.get(s)) or 'none'}); "
          f"{time.monotonic() - total:.0f} s", flush=True)
    width = max(len(e["name"]) for e in entries)
    recorded: dict[str, list[int]] = {}
    short = 0
    for entry in entries:
        started = time.monotonic()
        caught: dict[int, set[str]] = {}
        searched, problem = 0, None
        with prepared(entry) as (tree, problem):
            log = log_of(entry["name"])
            while not problem and searched < len(passing) and len(caught) < WANT_CASES:
                batch = passing[searched:searched + chunk]
                result = sweep(tree, batch, workers, log, timeout)
                if isinstance(result, str):
                    problem = result
                    break
                searched += len(batch)
                caught.update({s: result[0][s] for s in batch if result[0].get(s)})
        seconds = time.monotonic() - started
        chosen = sorted(sorted(caught, key=lambda s: (cost[s], s))[:WANT_CASES])
        if problem:  # the entry keeps the cases it had: a stale patch is the lead's to regenerate, not a lost case
            short += 1
            print(f"{entry['name']:<{width}}  ERROR  {seconds:5.0f} s  {problem}", flush=True)
            continue
        recorded[entry["name"]] = chosen
        checks = sorted({c.split(":")[0][:48] for s in chosen for c in caught[s]})
        listed = ", ".join(f"{s} ({cost[s]:.1f} s)" for s in chosen)
        if len(chosen) < MIN_CASES:
            short += 1
            print(f"{entry['name']:<{width}}  NOT CAUGHT  {seconds:5.0f} s  caught by {len(chosen)} of the "
                  f"{len(passing)} passing CI cases ({listed or 'none'}), fewer than {MIN_CASES}: the sweep no longer "
                  "catches it; kept in the catalogue", flush=True)
        else:
            print(f"{entry['name']:<{width}}  recorded  {seconds:5.0f} s  cases {listed} (searched {searched} of "
                  f"{len(passing)}); failing: {'; '.join(checks)}", flush=True)
    if recorded:
        CATALOGUE.write_text(write_cases(CATALOGUE.read_text(encoding="utf-8"), recorded), encoding="utf-8")
        written = {e["name"]: e.get("cases") for e in load()}
        assert all(written[name] == cases for name, cases in recorded.items()), "policy.toml written wrong"
    print(f"{len(entries)} policy mutations: {len(entries) - short} recorded with >= {MIN_CASES} cases, {short} "
          f"short or in error; written to {CATALOGUE.relative_to(HERE.parent)}; {time.monotonic() - total:.0f} s",
          flush=True)
    return 0 if short == 0 else 1


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="mutations/policy.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="+", metavar="NAME", help="these mutations (a name, or its prefix: p05)")
    p.add_argument("--list", action="store_true", help="list the mutations, what each breaks and its cases")
    p.add_argument("--record", action="store_true",
                   help="find each mutation's cheapest catching CI cases and write them to mutations/policy.toml")
    p.add_argument("--cases", type=int, default=None, help="cases of the sweep (default: the CI sweep's)")
    p.add_argument("--first", type=int, default=0, help="first case (default 0)")
    p.add_argument("--workers", type=int, default=2, help="processes per sweep (default 2)")
    p.add_argument("--chunk", type=int, default=20, help="with --record: cases per patched run (default 20)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per sweep (default 3600)")
    args = p.parse_args(argv)
    entries = load()
    if args.only:
        chosen = []
        for name in args.only:
            found = [e for e in entries if e["name"] == name or e["name"].split("-", 1)[0] == name]
            if len(found) != 1:
                p.error(f"no policy mutation named {name!r}; see --list")
            chosen += found
        entries = chosen
    if args.list:
        for entry in entries:
            print(f"{entry['name']}: {entry['breaks']}")
            print(f"    cases: {', '.join(map(str, entry.get('cases', []))) or 'none recorded'}")
        return 0
    ci = ci_cases()
    cases = args.cases if args.cases is not None else ci - args.first
    if cases < 1 or args.workers < 1 or args.chunk < 1 or args.first < 0:
        p.error("--cases, --workers and --chunk must be >= 1, --first >= 0")
    if args.record and args.first + cases > ci:
        p.error(f"--record writes CI cases only: --first + --cases must be <= {ci} (tests/sim/test_sweep.py)")
    seeds = range(args.first, args.first + cases)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE.parent, capture_output=True,
                            text=True).stdout.strip()
    print(f"commit {commit}: cases {seeds[0]}..{seeds[-1]}, {args.workers} workers"
          + (f", --record in chunks of {args.chunk}" if args.record else ""), flush=True)
    if args.record:
        return record(entries, seeds, args.workers, args.chunk, args.timeout)
    total = time.monotonic()
    base, seconds = one(None, seeds, args.workers, args.timeout)
    if isinstance(base, str):
        print(f"baseline: {base}")
        return 1
    print(f"baseline (no patch): {sum(1 for v in base.values() if not v)} of {len(base)} cases pass; "
          f"{seconds:.0f} s", flush=True)
    width = max(len(e["name"]) for e in entries)
    missed = 0
    for entry in entries:
        result, seconds = one(entry, seeds, args.workers, args.timeout)
        if isinstance(result, str):
            missed += 1
            print(f"{entry['name']:<{width}}  error    {seconds:5.0f} s  {result}", flush=True)
            continue
        caught = {k: sorted(v - base.get(k, set())) for k, v in result.items() if v - base.get(k, set())}
        if not caught:
            missed += 1
        checks: dict[str, int] = {}
        for v in caught.values():
            for check in v:
                checks[check[:40]] = checks.get(check[:40], 0) + 1
        listed = ", ".join(str(k) for k in sorted(caught)[:20]) + (f" … (+{len(caught) - 20})" if len(caught) > 20 else "")
        why = "; ".join(f"{c}… ({n})" for c, n in sorted(checks.items(), key=lambda kv: -kv[1]))
        print(f"{entry['name']:<{width}}  {'caught' if caught else 'missed':<7}  {seconds:5.0f} s  "
              f"{len(caught)} cases" + (f": {listed}; failing checks: {why}" if caught else ""), flush=True)
    print(f"{len(entries)} policy mutations: {len(entries) - missed} caught, {missed} missed or in error; "
          f"{time.monotonic() - total:.0f} s", flush=True)
    return 0 if missed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
