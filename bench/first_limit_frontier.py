"""A failing sweep case against constant first limits (issue 49): is the failure the policy's sizing of its first
limit, or beyond what any first limit can do?

    .venv/bin/python bench/first_limit_frontier.py --case 115 --limits 180:340:20 [--shares broker-a=0.414,...]
                                                  [--kind surge|storm] [--workers 2]

The case (:func:`pipelines.sim.sweep.draw_case`) is run once as shipped (the baseline, same session), then once per
forced value X (msg/s, cluster-wide): the first-limit hook of the cause's policy (``--kind``:
:meth:`pipelines.decide.limits.surge.SurgeLimit.first_bound` or :meth:`pipelines.decide.limits.retry_storm.RetryStormLimit.
first_bound`) returns X for every candidate of that kind, so each first limit of that kind is X (a bound above the
policy's target leaves the target, ``LimitPolicy.start``); every later decision is the shipped policy's. With
``--shares``, a first limit whose window's traffic is on exactly the named brokers is split by the given fractions
(they must add up to 1) instead of by the window's traffic (``pipelines.decide.rules.facts.shares_of``, as the policy
splits it); the room each carrier leaves beside its other senders is one such split.

Prints the config, then one line per run: the value, the bystanders' rejected sends after containment (% of
before, the sweep's check), each fix-to-lift figure, and the checks that fail (:func:`pipelines.sim.sweep.verdict`).
Exit status 1 when the shipped policy fails a check and a forced value passes every check (a constant beats the
policy: a sizing flaw to fix), 0 when none does (the failure is beyond the first limit's value) or the shipped
policy passes, 2 for a bad flag.
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

os.environ.setdefault("POLARS_MAX_THREADS", "1")  # one thread per process, as the sweep's workers
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.cli import OneLineParser, fail  # noqa: E402

PROG = "bench/first_limit_frontier.py"
KINDS = ("surge", "storm")


def _values(text: str) -> list[float]:
    """``a:b:step`` (inclusive) or ``x,y,z`` → the forced values (msg/s, each > 0)."""
    if ":" in text:
        lo, hi, step = (float(x) for x in text.split(":"))
        if step <= 0 or hi < lo:
            raise ValueError(f"--limits {text!r}: want low:high:step with high >= low and step > 0")
        out = [lo + i * step for i in range(int((hi - lo) / step + 1e-9) + 1)]
    else:
        out = [float(x) for x in text.split(",") if x.strip()]
    if not out or min(out) <= 0:
        raise ValueError(f"--limits {text!r}: want values > 0")
    return out


def _shares(text: str | None) -> dict[str, float] | None:
    """``broker=fraction,...`` → {broker: fraction}, fractions adding up to 1."""
    if not text:
        return None
    out = {}
    for part in text.split(","):
        broker, _, value = part.partition("=")
        out[broker.strip()] = float(value)
    if abs(sum(out.values()) - 1.0) > 1e-6 or min(out.values()) <= 0:
        raise ValueError(f"--shares {text!r}: want positive fractions adding up to 1")
    return out


def run_one(seed: int, kind: str, forced: float | None, shares: dict[str, float] | None) -> dict:
    """Case ``seed`` run with every first limit of ``kind`` forced to ``forced`` msg/s (None: as shipped) → its
    figures that the report prints."""
    from contextlib import ExitStack
    from unittest import mock

    import pipelines.decide.limits.base as policy
    from pipelines.decide.limits.retry_storm import RetryStormLimit
    from pipelines.decide.limits.surge import SurgeLimit
    from pipelines.sim import sweep

    shipped = policy.shares_of
    with ExitStack() as patched:  # undone after the run: a worker process runs several values in turn
        if forced is not None:
            cls = SurgeLimit if kind == "surge" else RetryStormLimit
            patched.enter_context(mock.patch.object(
                cls, "first_bound", lambda self, cand: (forced, f"forced to {forced:g} msg/s ({PROG})")))
            if shares:
                patched.enter_context(mock.patch.object(policy, "shares_of", lambda tps: dict(shares) if set(
                    k for k, v in tps.items() if v) == set(shares) else shipped(tps)))
        case = sweep.draw_case(seed)
        figures = sweep.run(case)
        bad, _ = sweep.verdict(case, figures)
    v = figures.values
    return {"forced": forced, "failed": [name for name, _ in bad],
            "bystanders_pct": v.get("bystander_after_pct_of_before", (float("nan"),))[0],
            "fix_to_lift": [m for n, _, m in figures.checks if n.startswith("each lift")]}


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", type=int, required=True, help="the sweep case (its seed)")
    parser.add_argument("--limits", required=True, help="forced first limits, msg/s: low:high:step or x,y,z")
    parser.add_argument("--kind", choices=KINDS, default="surge", help="the policy whose first limit is forced")
    parser.add_argument("--shares", help="broker=fraction,...: the split of a first limit on exactly these brokers")
    parser.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    args = parser.parse_args(argv)
    try:
        values, shares = _values(args.limits), _shares(args.shares)
    except ValueError as e:
        return fail(PROG, e)
    if args.workers < 1:
        return fail(PROG, "--workers: want at least 1")
    print(f"config: case {args.case}, kind {args.kind}, forced first limits {values} msg/s, "
          f"split {shares or 'by the window traffic (shipped)'}, workers {args.workers}", flush=True)
    runs = [None] + values
    with ProcessPoolExecutor(args.workers, mp_context=get_context("spawn")) as pool:
        results = list(pool.map(run_one, [args.case] * len(runs), [args.kind] * len(runs), runs,
                                [shares] * len(runs)))
    shipped, beaten = results[0], []
    for r in results:
        label = "shipped" if r["forced"] is None else f"{r['forced']:g} msg/s"
        print(f"{label:>14}: bystanders {r['bystanders_pct']:.2f} % of before; lift: "
              f"{'; '.join(r['fix_to_lift']) or 'n/a'}; failed: {', '.join(r['failed']) or 'none'}")
        if r["forced"] is not None and shipped["failed"] and not r["failed"]:
            beaten.append(r["forced"])
    if beaten:
        print(f"a constant beats the policy: {', '.join(f'{x:g}' for x in beaten)} msg/s pass every check; the "
              f"shipped policy fails {', '.join(shipped['failed'])}")
        return 1
    print("no forced first limit passes every check" if shipped["failed"] else
          "the shipped policy passes every check")
    return 0


if __name__ == "__main__":
    sys.exit(main())
