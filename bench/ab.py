"""A/B runs of a benchmark against a baseline commit: the commit checked out in a git worktree under a temporary
directory, the same benchmark script (this tree's) run there with the baseline tree first on ``sys.path``, the
variants interleaved run by run, medians of the runs.

A benchmark script that supports ``--baseline COMMIT`` does, before importing ``pipelines``::

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import ab
    TREE = ab.tree_from_argv()          # ``--tree DIR`` (the tree measured), default this checkout
    sys.path.insert(0, str(TREE))

and, given ``--baseline``, calls :func:`interleave` with its own arguments (less ``--baseline``). Each run is a
subprocess of the current interpreter (this tree's venv: the baseline's dependencies are a subset) with
``PYTHONPATH`` set to the tree measured (Spark's Python workers import from it too) and ``--json FILE``, where the
single run writes its figures; ``interleave`` returns them per variant. Absolute seconds are those of the machine
the runs share; only the ratios of interleaved runs compare.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def tree_from_argv(argv: Sequence[str] | None = None) -> Path:
    """The tree a single run measures: ``--tree DIR`` in ``argv`` (default ``sys.argv``), else this checkout."""
    argv = list(sys.argv if argv is None else argv)
    for i, arg in enumerate(argv):
        if arg == "--tree" and i + 1 < len(argv):
            return Path(argv[i + 1]).resolve()
        if arg.startswith("--tree="):
            return Path(arg.split("=", 1)[1]).resolve()
    return REPO


def without(argv: Sequence[str], option: str, takes_value: bool = True) -> list[str]:
    """``argv`` less ``option`` (and its value)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == option:
            skip = takes_value
            continue
        if arg.startswith(option + "="):
            continue
        out.append(arg)
    return out


@contextlib.contextmanager
def worktree(commit: str) -> Iterator[Path]:
    """``commit`` checked out (detached) in a new worktree under a temporary directory, removed afterwards."""
    parent = Path(tempfile.mkdtemp(prefix="rg-baseline-"))
    path = parent / commit.replace("/", "_")
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(path), commit],
                   check=True)
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)], check=False)
        shutil.rmtree(parent, ignore_errors=True)


def commit_of(tree: Path) -> str:
    done = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return done.stdout.strip() + ("+changes" if dirty else "")


def run_once(script: Path, tree: Path, args: Sequence[str], log: Path | None = None,
             env: dict[str, str] | None = None) -> tuple[int, dict, float]:
    """One run of ``script`` measuring ``tree``: (exit status, the figures it wrote with ``--json``, seconds)."""
    out = Path(tempfile.mkstemp(prefix="rg-ab-", suffix=".json")[1])
    environment = {**os.environ, **(env or {}), "PYTHONPATH": str(tree)}
    started = time.monotonic()
    with open(log, "a") if log else contextlib.nullcontext() as sink:
        done = subprocess.run([sys.executable, str(script), *args, "--tree", str(tree), "--json", str(out)],
                              cwd=tree, env=environment, stdout=sink or None, stderr=subprocess.STDOUT if sink else None)
    seconds = time.monotonic() - started
    try:
        figures = json.loads(out.read_text() or "{}")
    except (OSError, json.JSONDecodeError):
        figures = {}
    out.unlink(missing_ok=True)
    return done.returncode, figures, seconds


def interleave(script: Path, variants: Sequence[tuple[str, Path, Sequence[str]]], runs: int = 3,
               log: Path | None = None, before=None) -> dict[str, list[dict]]:
    """Run each variant ``(label, tree, args)`` ``runs`` times, interleaved (A, B, C, A, B, C, ...); returns each
    variant's figures per run (``{"exit": status}`` added). ``args`` may be a function of the run's index (0-based).
    ``before(i, label)``: called before each run (e.g. to
    remove the previous run's lake). Prints one line per run as it ends."""
    results: dict[str, list[dict]] = {label: [] for label, _, _ in variants}
    for i in range(runs):
        for label, tree, args in variants:
            if before is not None:
                before(i, label)
            status, figures, seconds = run_once(script, tree, args(i) if callable(args) else args, log)
            figures["exit"] = status
            results[label].append(figures)
            print(f"[ab] run {i + 1}/{runs} {label} ({commit_of(tree)}): exit {status}, {seconds:.0f} s wall, "
                  f"{time.strftime('%H:%M:%S')}, load average {os.getloadavg()[0]:.1f}", flush=True)
    return results


def against_baseline(script: Path, baseline: str, args: Sequence[str], runs: int, log: Path | None = None,
                     before=None) -> dict[str, list[dict]]:
    """:func:`interleave` of this tree and ``baseline`` (a :func:`worktree`), both run with ``args`` on one landing,
    labelled ``this tree`` and ``baseline <commit>``; prints the A/B line first."""
    with worktree(baseline) as base_tree:
        print(f"A/B: {commit_of(REPO)} against {baseline}, {runs} runs each, interleaved, one landing; "
              f"{os.cpu_count()} cores (seconds are this machine's)", flush=True)
        return interleave(script, [("this tree", REPO, args), (f"baseline {baseline}", base_tree, args)], runs, log,
                          before=before)


def median(results: list[dict], key: str) -> float | None:
    """The median of ``key`` over the runs that reported it (None when none did)."""
    values = [r[key] for r in results if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else None


def write_json(path: str | None, figures: dict) -> None:
    if path:
        Path(path).write_text(json.dumps(figures, indent=1, default=str))
