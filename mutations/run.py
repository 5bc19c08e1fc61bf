"""Re-apply the mutations of docs/mutations.md, one at a time, and check that their tests catch them.

For each mutation of ``mutations/mutations.toml``: copy the repository's files (tracked and untracked, not ignored:
the working tree as it is, never touched) to a temporary directory, apply ``mutations/<name>.patch`` there, run the
mutation's tests there (``pytest -x``, one process, its own imports checked to come from the copy), and print one
line: ``caught`` (a test failed or errored), ``missed`` (every test passed), ``skipped`` (a test skipped: no
verdict), ``stale`` (the patch no longer applies), ``error`` (pytest could not run them) or ``timeout``. Exit status
0 only when every selected mutation was caught. Each run's pytest output: ``scratch/mutations/<name>.log``.

Run with the project's Python (``.venv/bin/python``, or ``$RG_VENV/bin/python``)::

    .venv/bin/python mutations/run.py                  # all, in order (about an hour on 2 cores)
    .venv/bin/python mutations/run.py --only 07 12     # some (a name or its number)
    .venv/bin/python mutations/run.py --list
    .venv/bin/python mutations/run.py --baseline       # the same tests without the patches: each must pass
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CATALOGUE = HERE / "mutations.toml"
LOGS = ROOT / "scratch" / "mutations"


def load() -> list[dict]:
    """The mutations of :data:`CATALOGUE`, in order, each with its ``patch`` path."""
    entries = tomllib.loads(CATALOGUE.read_text(encoding="utf-8"))["mutation"]
    for entry in entries:
        entry["patch"] = HERE / f"{entry['name']}.patch"
    return entries


def select(entries: list[dict], names: list[str] | None) -> list[dict]:
    if not names:
        return entries
    chosen = []
    for name in names:
        found = [e for e in entries if e["name"] == name or e["name"].split("-", 1)[0] == name.zfill(2)]
        if len(found) != 1:
            raise SystemExit(f"no mutation named {name!r}; see --list")
        chosen.append(found[0])
    return chosen


def copy_tree(dest: Path) -> None:
    """The repository's files as they are in the working tree (tracked and untracked-but-not-ignored) into ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is listed too
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def apply_patch(patch: Path, tree: Path) -> str | None:
    """Apply ``patch`` to ``tree`` (not a git repository: git apply works like patch there); None, or why not."""
    for check in (["--check"], []):
        done = subprocess.run(["git", "apply", *check, str(patch)], cwd=tree, capture_output=True, text=True)
        if done.returncode != 0:
            return " ".join(done.stderr.split())[:300] or f"git apply exited {done.returncode}"
    return None


def environment(tree: Path) -> dict[str, str]:
    """The test environment of scripts/env.sh, importing the copy (also in subprocesses and Spark's workers)
    rather than the project the environment's editable install points to."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RATE_GOVERNOR_", "PYTEST_"))}
    env.update(PYTHONPATH=str(tree), PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               PYTHONDONTWRITEBYTECODE="1")
    return env


def imports_from(tree: Path) -> str | None:
    """None when ``pipelines`` and ``control`` import from ``tree``; else where they come from."""
    code = "import control, pipelines; print(pipelines.__file__); print(control.__file__)"
    done = subprocess.run([sys.executable, "-c", code], cwd=tree, env=environment(tree), capture_output=True,
                          text=True)
    paths = done.stdout.split()
    if done.returncode != 0 or len(paths) != 2 or not all(Path(p).is_relative_to(tree) for p in paths):
        return f"imports do not come from the copy: {paths or done.stderr.strip()[-300:]}"
    return None


def outcomes(junit: Path) -> list[tuple[str, str]]:
    """(test id, outcome) of each test case in a pytest JUnit XML report: ``passed``, ``skipped``, or ``failed`` /
    ``error`` with the first line of its message."""
    if not junit.exists():
        return []
    found = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        test = case.get("classname", "").replace(".", "/") + ".py::" + case.get("name", "")
        marks = [child for child in case if child.tag in ("failure", "error", "skipped")]
        if not marks:
            found.append((test, "passed"))
        elif marks[0].tag == "skipped":
            found.append((test, "skipped"))
        else:
            message = " ".join((marks[0].get("message") or "").split())
            found.append((test, f"{'failed' if marks[0].tag == 'failure' else 'error'}: {message[:160]}"))
    return found


def run_tests(tests: list[str], tree: Path, log: Path, timeout: float) -> tuple[int | None, list[tuple[str, str]]]:
    """pytest -x on ``tests`` in ``tree``; (exit status or None on timeout, the outcome of each test run)."""
    junit = tree / "scratch" / "mutation-junit.xml"
    junit.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pytest", "-x", "-p", "no:cacheprovider", f"--junitxml={junit}", *tests]
    with log.open("w") as out:
        out.write(f"$ {' '.join(command)}  (in {tree})\n")
        out.flush()
        proc = subprocess.Popen(command, cwd=tree, env=environment(tree), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            status = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the pytest we started and its governors, brokers and JVMs
            proc.wait()
            status = None
    return status, outcomes(junit)


def verdict(status: int | None, results: list[tuple[str, str]], baseline: bool) -> tuple[str, str]:
    """(verdict, the test or reason that goes with it)."""
    bad = [(t, k) for t, k in results if k.startswith(("failed", "error"))]
    skipped = [t for t, k in results if k == "skipped"]
    if status is None:
        return "timeout", bad[0][0] if bad else ""
    if baseline:
        if status == 0 and not skipped and results:
            return "passes", ""
        return "FAILS", ", ".join(f"{t} ({k})" for t, k in bad) or f"pytest exited {status}, skipped {skipped}"
    if bad and status == 1:
        return "caught", f"{bad[0][0]} ({bad[0][1]})"
    if status == 0 and skipped:
        return "skipped", ", ".join(skipped)
    if status == 0 and results:
        return "missed", f"{len(results)} passed"
    return "error", f"pytest exited {status}" + (f", {bad[0][0]} ({bad[0][1]})" if bad else "")


def run_one(entry: dict, *, baseline: bool, timeout: float, keep: bool) -> tuple[str, str, float]:
    started = time.monotonic()
    tree = Path(tempfile.mkdtemp(prefix=f"rg-{entry['name'][:2]}-"))
    try:
        copy_tree(tree)
        problem = None if baseline else apply_patch(entry["patch"], tree)
        if problem:
            return "stale", f"{entry['patch'].name} no longer applies: {problem}", time.monotonic() - started
        problem = imports_from(tree)
        if problem:
            return "error", problem, time.monotonic() - started
        LOGS.mkdir(parents=True, exist_ok=True)
        log = LOGS / f"{entry['name']}{'.baseline' if baseline else ''}.log"
        status, results = run_tests(entry["tests"], tree, log, timeout)
        return (*verdict(status, results, baseline), time.monotonic() - started)
    finally:
        if keep:
            print(f"  (copy kept: {tree})", flush=True)
        else:
            shutil.rmtree(tree, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these mutations (a name, or its number: 07)")
    parser.add_argument("--list", action="store_true", help="list the mutations and their tests, run nothing")
    parser.add_argument("--baseline", action="store_true",
                        help="run the tests without the patches (each must pass): the check of the check")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per mutation (default 1800)")
    parser.add_argument("--keep", action="store_true", help="keep each temporary copy (its path is printed)")
    args = parser.parse_args(argv)
    entries = select(load(), args.only)
    if args.list:
        for entry in entries:
            print(f"{entry['name']}: {entry['breaks']}")
            for test in entry["tests"]:
                print(f"    {test}")
        return 0
    java = Path(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else shutil.which("java")
    if not java:  # every Spark test would fail, and each mutation look caught
        print("mutations: no java found (PySpark needs Java 17+; see scripts/env.sh)", file=sys.stderr)
        return 3
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    print(f"{dt.date.today()} commit {commit}{' + uncommitted changes' if dirty else ''}, "
          f"{'baseline (no patch)' if args.baseline else 'mutations'}, pytest -x, one at a time", flush=True)
    width = max(len(e["name"]) for e in entries)
    counts: dict[str, int] = {}
    total = time.monotonic()
    for entry in entries:
        result, detail, seconds = run_one(entry, baseline=args.baseline, timeout=args.timeout, keep=args.keep)
        counts[result] = counts.get(result, 0) + 1
        print(f"{entry['name']:<{width}}  {result:<7}  {seconds:6.0f} s  {detail}", flush=True)
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    print(f"{len(entries)} {'baseline runs' if args.baseline else 'mutations'}: {summary}; "
          f"{time.monotonic() - total:.0f} s", flush=True)
    good = "passes" if args.baseline else "caught"
    return 0 if counts.get(good, 0) == len(entries) else 1


if __name__ == "__main__":
    sys.exit(main())
