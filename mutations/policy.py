"""The sweep's power (issue 49): apply each policy mutation of ``mutations/policy.toml`` in a copy of the tree, run
the CI sweep there (cases ``--first`` .. ``--first + --cases - 1``, default those of ``tests/sim/test_sweep.py``)
and print ``caught`` with the cases that caught it, or ``missed``.

A case catches a mutation when a check fails on it with the patch and passed without it: the same cases are run on
an unpatched copy first (the baseline), so a check that already fails at this commit (a policy flaw still open)
catches nothing. Exit status 0 only when every selected mutation was caught; 2 for a bad flag.

Run with the project's Python (``.venv/bin/python`` or ``$RG_VENV/bin/python``)::

    .venv/bin/python mutations/policy.py                     # every mutation, the CI sweep (about 13 sweeps)
    .venv/bin/python mutations/policy.py --only p05 p06 --cases 60
    .venv/bin/python mutations/policy.py --list

Each sweep's output: ``scratch/mutations/policy-<name>.log``. The copy, the patch and the import check are those of
``mutations/run.py``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run as runner  # noqa: E402  (mutations/run.py: copy_tree, apply_patch, environment, imports_from)

sys.path.insert(0, str(HERE.parent))
from pipelines.cli import OneLineParser  # noqa: E402

CATALOGUE = HERE / "policy.toml"
PATCHES = HERE / "policy"


def load() -> list[dict]:
    """The mutations of :data:`CATALOGUE`, in order, each with its ``patch`` path."""
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


def sweep(tree: Path, first: int, cases: int, workers: int, log: Path, timeout: float) -> dict[int, set[str]] | str:
    """The sweep's failed checks per case in ``tree`` ({case: {check}}), or why it could not run."""
    out = tree / "scratch" / "policy-sweep.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pipelines.sim.sweep", "--cases", str(cases), "--first", str(first),
               "--workers", str(workers), "--json", str(out)]
    with log.open("w") as stream:
        stream.write(f"$ {' '.join(command)}  (in {tree})\n")
        stream.flush()
        try:
            done = subprocess.run(command, cwd=tree, env=runner.environment(tree), stdout=stream,
                                  stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"timeout after {timeout:.0f} s"
    if done.returncode not in (0, 1) or not out.exists():
        return f"the sweep exited {done.returncode} (see {log})"
    return {int(k): set(v) for k, v in json.loads(out.read_text(encoding="utf-8")).items()}


def one(entry: dict | None, first: int, cases: int, workers: int, timeout: float,
        ) -> tuple[dict[int, set[str]] | str, float]:
    """Copy the tree, apply ``entry``'s patch (None: the baseline), run the sweep there."""
    started = time.monotonic()
    name = entry["name"] if entry else "baseline"
    tree = Path(tempfile.mkdtemp(prefix=f"rg-policy-{name[:3]}-"))
    try:
        runner.copy_tree(tree)
        problem = runner.apply_patch(entry["patch"], tree) if entry else None
        problem = problem or runner.imports_from(tree)
        if problem:
            return f"stale or broken: {problem}", time.monotonic() - started
        runner.LOGS.mkdir(parents=True, exist_ok=True)
        return sweep(tree, first, cases, workers, runner.LOGS / f"policy-{name}.log", timeout), \
            time.monotonic() - started
    finally:
        shutil.rmtree(tree, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="mutations/policy.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="+", metavar="NAME", help="these mutations (a name, or its prefix: p05)")
    p.add_argument("--list", action="store_true", help="list the mutations and what each breaks, run nothing")
    p.add_argument("--cases", type=int, default=None, help="cases of the sweep (default: the CI sweep's)")
    p.add_argument("--first", type=int, default=0, help="first case (default 0)")
    p.add_argument("--workers", type=int, default=2, help="processes per sweep (default 2)")
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
        return 0
    cases = args.cases if args.cases is not None else ci_cases()
    if cases < 1 or args.workers < 1:
        p.error("--cases and --workers must be >= 1")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE.parent, capture_output=True,
                            text=True).stdout.strip()
    print(f"commit {commit}: cases {args.first}..{args.first + cases - 1}, {args.workers} workers", flush=True)
    total = time.monotonic()
    base, seconds = one(None, args.first, cases, args.workers, args.timeout)
    if isinstance(base, str):
        print(f"baseline: {base}")
        return 1
    print(f"baseline (no patch): {sum(1 for v in base.values() if not v)} of {len(base)} cases pass; "
          f"{seconds:.0f} s", flush=True)
    width = max(len(e["name"]) for e in entries)
    missed = 0
    for entry in entries:
        result, seconds = one(entry, args.first, cases, args.workers, args.timeout)
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
