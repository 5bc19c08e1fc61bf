"""Where a small micro-batch's time goes: the continuous governor on a time-lapse (one stats minute of a 2-broker,
8-topic, 4-group cluster lands every ``--minute-seconds``), with the flows' steps timed; prints, per query, the
handler's total time and each step's total and share of it, and the median processing time of the micro-batches
that had input rows (Spark's own ``recentProgress``).

    .venv/bin/python bench/batch_profile.py [--minute-seconds 12] [--minutes 12] [--warmup-minutes 3]
                                            [--target-seconds 5] [--floor] [--baseline COMMIT [--runs 3]
                                            [--max-ratio 0.4] [--log FILE]]

The figure of merit is the **processing seconds per stats minute**: the sum of Spark's ``triggerExecution`` over
every micro-batch of the three queries (a ``StreamingQueryListener``'s progress events, input or not) divided by
the stats minutes landed, counted once the ``--warmup-minutes`` minutes have landed and every query has reported a
micro-batch started after the last of them (the first micro-batches of a new JVM and a new lake cost more: counted
from the start, 8 minutes gave 19 s and 12 minutes 15 s on this machine; a cut at a fixed time missed them when
the JVM started slowly). ``--warmup-minutes`` must be at least 2 (the first minute's lines land at the second). The
measured minutes are half quiet, half storm. The check fails (exit 1) above ``--target-seconds``. ``--floor``
measures what the three streaming queries cost with handlers that do nothing but materialize their micro-batch (the
ingest handler also writes the events file, the gold query's source, and the fast query's copy where the tree has
one): Spark's part of the figure (file listing, parsing, the stateful aggregations, state store and checkpoint
commits), which no change to the handlers can remove.

``--baseline COMMIT`` compares: COMMIT is checked out in a worktree under a temporary directory (``bench/ab.py``),
and this script runs as separate processes, ``--runs`` times per variant, interleaved: this tree, the baseline (this
same script with the baseline tree first on ``sys.path`` and its own ``conf/local.toml``), and with ``--floor`` this
tree's floor. It prints each run's figure, the medians, the ratio of this tree's median to the baseline's (exit 1
above ``--max-ratio``, issue 40's 0.4) and to the floor. The step timers patch only the steps the measured tree has.

After the figure it prints how many classes Spark's code generation compiled after the warm-up and about how long
that took (Spark's own ``CodegenMetrics``), with the session's ``spark.sql.codegen.cache.maxEntries``, and each
deciding query's critical sections under the decision lock (the flows' ``locked_seconds``).

The reference is the handler's own total (``<query>.handle``, the ``foreachBatch`` call, warm-up included): shares
say which step to work on. Steps overlap where one calls another (the gold flow's ``reduce + collect`` includes a
``DataFrame.toArrow``; the fast flow's only Spark job is its ``toArrow``; ``decide_final`` / ``decide_fast`` include the store's
``state_before``/``latest_limits`` calls where the flow makes them inside it); the wait for the decision lock the
other deciding flow holds is its own line. Issue 40's flows: Spark reduces (one collect), the driver decides
(``prepare_*`` outside the lock, ``decide_*`` inside it), ``write_arrow`` appends with delta-rs, then
``publish``; the base commit's steps (``gold_outputs``, the policy fold, the fast flow's ``decide``) are timed where
the measured tree has them. Absolute seconds are this machine's, with the three queries sharing its cores.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import functools
import importlib
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ab  # noqa: E402  (bench/ab.py: --baseline, --tree)

TREE = ab.tree_from_argv()  # the tree measured: this checkout, or a baseline's worktree (--tree)
sys.path.insert(0, str(TREE))
import old_layout  # noqa: E402,F401 - a baseline tree may have the module paths before issue 43

from pipelines import governor  # noqa: E402
from pipelines.config import load_config  # noqa: E402
from pipelines.job.flows import base as base_flow, fast as fast_flow, gold as gold_flow, ingest as ingest_flow  # noqa: E402
from pipelines.dataplane import events, lake  # noqa: E402
from pipelines.writeback import publish
from pipelines.dataplane.quality import gate, reconcile  # noqa: E402
from pipelines.dataplane.session import build_session  # noqa: E402
from pipelines.sim.minutes import land, minute_files  # noqa: E402
from pipelines.sim.spec import ScenarioSpec  # noqa: E402
from pipelines.dataplane.transforms import silver  # noqa: E402


def optional_module(name: str):
    """A module of the tree measured, or None where that tree has no such module (a baseline before a change)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


SECONDS: dict[str, dict[str, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
#: query → Spark jobs run by each of its handler calls (micro-batches), counted through a job group per call
JOBS: dict[str, list[int]] = collections.defaultdict(list)
#: query → (stages, tasks) of those jobs per handler call: counts that do not depend on the machine's load (a stage
#: is a shuffle boundary, scheduled and run on its own, each costing tens of ms at these sizes)
STAGES: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
_current = threading.local()
#: the longest wait for the queries to process the warm-up minutes (a new JVM's first micro-batches)
WARMUP_TIMEOUT_S = 300.0


def counted_jobs(handle):
    """Wrap a flow's ``handle(df, batch_id)``: its Spark jobs run in the job group ``<query>:<batch id>`` (the
    calling thread's), counted with the status tracker once the call returns, into ``JOBS[query]``."""

    @functools.wraps(handle)
    def wrapper(self, df, batch_id):
        context = df.sparkSession.sparkContext
        group = f"{_current.query}:{batch_id}:{id(self)}"
        context.setJobGroup(group, f"{_current.query} batch {batch_id}")
        try:
            return handle(self, df, batch_id)
        finally:
            tracker = context.statusTracker()
            jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(group)]
            stages = [tracker.getStageInfo(s) for job in jobs if job for s in job.stageIds]
            JOBS[_current.query].append(len(jobs))
            STAGES[_current.query].append((sum(1 for s in stages if s), sum(s.numTasks for s in stages if s)))
            context.setLocalProperty("spark.jobGroup.id", None)

    return wrapper


def timed(owner, name: str, label: str, handler: str | None = None) -> bool:
    """Replace ``owner.name`` with a wrapper adding its wall time to ``SECONDS[query][label]``; nothing (False) when
    ``owner`` is None or has no ``name`` (a step of the other tree's flows)."""
    inner = getattr(owner, name, None) if owner is not None else None
    if inner is None:
        return False

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        if handler:
            _current.query = handler
        started = time.monotonic()
        try:
            return inner(*args, **kwargs)
        finally:
            SECONDS[getattr(_current, "query", "?")][label] += time.monotonic() - started

    setattr(owner, name, wrapper)
    return True


class TimedLock:
    """The decision lock, adding the time spent waiting for it to ``SECONDS[query]["wait for the decision lock"]``."""

    def __init__(self, lock) -> None:
        self.lock = lock

    def __enter__(self):
        started = time.monotonic()
        self.lock.acquire()
        SECONDS[getattr(_current, "query", "?")]["wait for the decision lock"] += time.monotonic() - started
        return self

    def __exit__(self, *exc) -> None:
        self.lock.release()


class ProgressTotals:
    """A ``StreamingQueryListener`` (Spark's own progress events): seconds of ``triggerExecution`` and micro-batches
    per query name, every micro-batch counted (``recentProgress`` keeps only the last 100)."""

    def __init__(self) -> None:
        from pyspark.sql.streaming import StreamingQueryListener

        totals = self.seconds = collections.defaultdict(float)
        batches = self.batches = collections.Counter()
        started = self.started = {}  # query name -> start (UTC) of its newest reported micro-batch

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event) -> None: ...

            def onQueryProgress(self, event) -> None:
                progress = event.progress
                totals[progress.name] += progress.durationMs.get("triggerExecution", 0) / 1000
                batches[progress.name] += 1
                started[progress.name] = dt.datetime.fromisoformat(progress.timestamp.replace("Z", "+00:00"))

            def onQueryIdle(self, event) -> None: ...

            def onQueryTerminated(self, event) -> None: ...

        self.listener = Listener()

    def wait_for_micro_batches_after(self, spark, moment: dt.datetime, timeout_s: float) -> bool:
        """Wait until each active streaming query of ``spark`` (those the governor started: the fast query only when
        the config runs it) has reported a micro-batch started after ``moment`` (UTC): everything landed before it
        has been processed. False when ``timeout_s`` passed first."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            names = {query.name for query in spark.streams.active}
            started = dict(self.started)
            if names and all(name in started and started[name] > moment for name in names):
                return True
            time.sleep(0.2)
        return False


def codegen_totals(spark) -> tuple[int, float]:
    """(classes compiled, approximate seconds compiling) since the JVM started: Spark's own ``CodegenMetrics``
    (the compile-time histogram keeps a sample, so the seconds are its mean times the exact count)."""
    histogram = spark.sparkContext._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
    count = histogram.getCount()
    return count, count * histogram.getSnapshot().getMean() / 1000


def floor_handlers() -> None:
    """``--floor``: each flow's handler only materializes its micro-batch (one Spark job); ingest also writes the
    events file that the gold query reads (and the fast query's copy, where the tree's fast query reads it)."""

    def ingest(self, raw, batch_id):
        stats, failures = self.parse(raw)
        also = getattr(self, "fast_events_dir", None)
        extra = (also,) if also is not None else ()
        events.write_batch(silver.metric_events(stats, failures), self.events_dir, batch_id, *extra)

    def collect_only(self, df, batch_id):
        df.toArrow()

    ingest_flow.IngestFlow.handle = ingest
    gold_flow.GoldFlow.handle = fast_flow.FastFlow.handle = collect_only


#: The deciding flows built in this process (their ``locked_seconds``: the decision lock's critical sections).
FLOWS: list = []


def instrument() -> None:
    """Time the flows' steps (those the tree measured has; a baseline's steps before issue 40 included)."""
    init = base_flow.DecisionFlow.__init__

    @functools.wraps(init)
    def timed_lock_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.decision_lock = TimedLock(self.decision_lock)
        FLOWS.append(self)

    base_flow.DecisionFlow.__init__ = timed_lock_init
    for flow, query in ((ingest_flow.IngestFlow, "ingest"), (gold_flow.GoldFlow, "gold"), (fast_flow.FastFlow, "fast")):
        flow.handle = counted_jobs(flow.handle)
        timed(flow, "handle", f"{query}.handle", handler=query)
    # issue 40's flows: Spark reduces (one collect), the driver decides (prepare outside the lock, decide_* 
    # inside it), delta-rs appends the Arrow tables, the publisher publishes
    timed(gold_flow.GoldFlow, "reduce", "reduce: collect the windows (one Spark job), reduce on the driver")
    timed(gold_flow, "collect_tables", "collect_tables (pack, union, toArrow, split)")  # aecabbc-33d0c65
    timed(gold_flow, "reduce_windows", "reduce_windows (the gold tables on the driver)")
    classic = optional_module("pyspark.sql.classic.dataframe")  # Spark 4's DataFrame class (its own toArrow)
    timed(classic.DataFrame if classic else optional_module("pyspark.sql").DataFrame, "toArrow",
          "DataFrame.toArrow (a Spark job; fast: its stateful aggregation)")
    timed(base_flow.DecisionFlow, "history", "history (delta-rs reads)")
    timed(gold_flow, "prepare_final", "decide: prepare_final (outside the lock)")
    timed(gold_flow, "decide_final", "decide: decide_final (under the lock)")
    timed(fast_flow, "prepare_fast", "decide: prepare_fast (outside the lock)")
    timed(fast_flow, "decide_fast", "decide: decide_fast (under the lock)")
    # a baseline tree from before the paths' distinct names (branch one-place)
    timed(gold_flow, "decide_prepared", "decide: decide_prepared (under the lock)")
    timed(fast_flow, "prepare_preliminary", "decide: prepare_preliminary (outside the lock)")
    timed(fast_flow, "decide_prepared", "decide: decide_prepared (under the lock)")
    timed(gold_flow, "open_evidence", "open evidence (under the lock)")
    store = optional_module("pipelines.job.flows.store")
    if store is not None:
        timed(store.DecisionStore, "state_before", "store: state_before (under the lock)")
        timed(store.DecisionStore, "latest_limits", "store: latest_limits (under the lock)")
        timed(store.DecisionStore, "add_state", "store: add_state (under the lock)")
        timed(store.DecisionStore, "add_limits", "store: add_limits (under the lock)")
        timed(store.DecisionStore, "limited_keys", "store: limited_keys")
    timed(gold_flow, "write_arrow", "write_arrow (delta-rs appends)")
    timed(fast_flow, "write_arrow", "write_arrow (delta-rs appends)")
    timed(base_flow.DecisionFlow, "publish", "publish")
    # the base commit's flows (Spark decisions): their steps, where the tree has them
    timed(fast_flow.FastFlow, "decide", "decide, under the lock (the rest: first job)")
    timed(optional_module("pipelines.dataplane.transforms.gold"), "window_bounds", "window bounds (first job: stateful windows)")
    timed(optional_module("pipelines.dataplane.transforms.gold"), "gold_outputs", "gold outputs (incl. the fold)")
    timed(optional_module("pipelines.dataplane.transforms.policy_fold"), "decide", "policy fold")
    # both
    timed(lake.DeltaRsLake, "collect", "collect a batch's tables (one Spark job)")
    timed(lake.DeltaRsLake, "_append", "lake appends (Spark collect + delta-rs)")
    timed(lake.DeltaRsLake, "_append_arrow", "lake appends of collected rows (delta-rs)")
    timed(lake.DeltaRsLake, "_append_rows", "lake appends of driver rows")
    timed(lake.DeltaRsLake, "_read", "lake reads (Spark)")
    timed(lake.DeltaRsLake, "read_arrow", "lake reads (delta-rs)")
    timed(lake.DeltaRsLake, "latest", "lake latest rows")
    timed(gate.QualityGate, "measure", "counts per source (first job: read, parse)")
    timed(gate.QualityGate, "validate_batch", "GX validation")
    timed(reconcile.Reconciler, "reconcile", "reconciliation")
    timed(events, "write_batch", "events file")
    timed(publish.Publisher, "publish", "publisher.publish")


def locked_summary() -> dict[str, dict]:
    """Per deciding query: micro-batches that took the decision lock, seconds holding it (sum, median, max)."""
    out = {}
    for flow in FLOWS:
        held = list(getattr(flow, "locked_seconds", []) or [])
        if held:
            query = "gold" if isinstance(flow, gold_flow.GoldFlow) else "fast"
            out[query] = {"batches": len(held), "sum": sum(held), "median": statistics.median(held),
                          "max": max(held)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minute-seconds", type=float, default=12.0)
    parser.add_argument("--minutes", type=int, default=12, help="stats minutes measured")
    parser.add_argument("--warmup-minutes", type=int, default=3, help="stats minutes landed first, not counted")
    parser.add_argument("--target-seconds", type=float, default=5.0,
                        help="the most processing seconds (three queries) per stats minute that passes")
    parser.add_argument("--floor", action="store_true",
                        help="handlers that only materialize each micro-batch: Spark's own share of the figure")
    parser.add_argument("--conf", default=str(TREE / "conf" / "local.toml"),
                        help="the governor's config (default: the measured tree's conf/local.toml as shipped)")
    parser.add_argument("--baseline", metavar="COMMIT",
                        help="A/B: this tree against COMMIT (a worktree under a temporary directory), interleaved, "
                             "--runs runs each (with --floor: this tree's floor as a third variant); medians")
    parser.add_argument("--runs", type=int, default=3, help="runs per variant with --baseline (default 3)")
    parser.add_argument("--max-ratio", type=float, default=0.4,
                        help="with --baseline: the largest median ratio this tree / baseline that passes (issue 40)")
    parser.add_argument("--log", help="with --baseline: the single runs' output appended to this file")
    parser.add_argument("--tree", help=argparse.SUPPRESS)  # the tree measured (bench/ab.py), read before imports
    parser.add_argument("--json", help=argparse.SUPPRESS)  # write the figures here (bench/ab.py)
    args = parser.parse_args(argv)
    if args.baseline:
        return compare(args, sys.argv[1:] if argv is None else list(argv))
    if args.floor:
        floor_handlers()
    instrument()

    landed = args.warmup_minutes + args.minutes
    start = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=landed + 5)).replace(second=0, microsecond=0)
    spec = ScenarioSpec(seed=7, start=start, minutes=landed, brokers=2, topics=8, groups=4,
                        onset_minute=args.warmup_minutes + args.minutes // 2)
    work = Path(tempfile.mkdtemp(prefix="rg-profile-"))
    landing, lake_dir = work / "landing", work / "lake"
    for name in ("broker_stats", "send_failures"):
        (landing / name).mkdir(parents=True)
    os.environ.setdefault("RATE_GOVERNOR_SIGNING_KEY", "bench-key")
    cfg = load_config(Path(args.conf)).with_paths(
        str(landing), str(lake_dir))
    spark = build_session(cfg.spark)
    totals = ProgressTotals()
    spark.streams.addListener(totals.listener)
    threading.Thread(target=lambda: governor.run(spark, cfg, once=False), daemon=True).start()
    time.sleep(3)
    warmup: dict[str, float] = {}
    codegen_warm = codegen_totals(spark)
    landed_at = dt.datetime.now(dt.timezone.utc)
    for minute, files in enumerate(minute_files(spec)):
        if minute == args.warmup_minutes:  # count from here, once the warm-up minutes are processed
            if not totals.wait_for_micro_batches_after(spark, landed_at, timeout_s=WARMUP_TIMEOUT_S):
                print(f"the queries did not process the warm-up minutes within {WARMUP_TIMEOUT_S:.0f} s",
                      file=sys.stderr)
                return 2
            warmup = dict(totals.seconds)
            codegen_warm = codegen_totals(spark)
        landed_at = dt.datetime.now(dt.timezone.utc)
        land(landing, files)
        time.sleep(args.minute_seconds)
    time.sleep(2 * cfg.windows.trigger_seconds)
    progress = {q.name: list(q.recentProgress) for q in spark.streams.active}
    codegen_end = codegen_totals(spark)
    for query in spark.streams.active:
        query.stop()

    print(f"one stats minute every {args.minute_seconds} s, trigger {cfg.windows.trigger_seconds} s, "
          f"{os.cpu_count()} cores (seconds are this machine's)")
    for name, batches in sorted(progress.items()):
        with_input = [p["durationMs"].get("triggerExecution", 0) / 1000 for p in batches if p.get("numInputRows")]
        if with_input:
            print(f"{name}: {len(with_input)} micro-batches with input, processing time median "
                  f"{statistics.median(with_input):.2f} s")
    for query, steps in sorted(SECONDS.items()):
        total = steps.get(f"{query}.handle", 0.0)
        counts = collections.Counter(JOBS.get(query, []))
        shown = ", ".join(f"{n} jobs x{times}" for n, times in sorted(counts.items()))
        print(f"{query}: handler total {total:.1f} s; Spark jobs per micro-batch: {shown}")
        with_stages = [st for st in STAGES.get(query, []) if st[0]]
        if with_stages:
            print(f"   stages per micro-batch with a job: median {statistics.median(s for s, _ in with_stages):g}, "
                  f"max {max(s for s, _ in with_stages)}; tasks: median {statistics.median(t for _, t in with_stages):g}")
        for label, seconds in sorted(steps.items(), key=lambda kv: -kv[1]):
            if label != f"{query}.handle":
                print(f"   {label:45s} {seconds:7.2f} s  {seconds / total:6.1%}" if total else f"   {label} {seconds:.2f} s")
    time.sleep(1)  # the listener's last events
    measured = {name: seconds - warmup.get(name, 0.0) for name, seconds in totals.seconds.items()}
    per_minute = sum(measured.values()) / args.minutes
    for name in sorted(measured):
        print(f"{name}: {totals.batches[name]} micro-batches, {totals.seconds[name]:.1f} s processing in all, "
              f"{measured[name]:.1f} s after the warm-up: {measured[name] / args.minutes:.2f} s per stats minute")
    compiled, compiling = codegen_end[0] - codegen_warm[0], codegen_end[1] - codegen_warm[1]
    print(f"Spark codegen after the warm-up: {compiled} classes compiled ({compiled / args.minutes:.0f} per stats "
          f"minute), about {compiling:.1f} s compiling ({compiling / args.minutes:.2f} s per stats minute, estimated "
          f"from Spark's sample of compile times: a few classes can show a small negative figure; "
          f"spark.sql.codegen.cache.maxEntries = {spark.conf.get('spark.sql.codegen.cache.maxEntries')})")
    locked = locked_summary()
    for query, held in sorted(locked.items()):
        print(f"{query}: decision lock held in {held['batches']} micro-batches, {held['sum']:.2f} s in all, median "
              f"{held['median']:.3f} s, max {held['max']:.3f} s (locked_seconds: the critical section)")
    passed = per_minute <= args.target_seconds
    ab.write_json(args.json, {
        "per_minute": per_minute, "floor": args.floor, "tree": str(TREE),
        "queries": {name: measured[name] / args.minutes for name in measured},
        "steps": {query: dict(steps) for query, steps in SECONDS.items()},
        "jobs": {query: dict(collections.Counter(n)) for query, n in JOBS.items()},
        "locked": locked, "codegen_classes": compiled})
    print(f"processing seconds per stats minute (three queries): {per_minute:.2f} s; target <= "
          f"{args.target_seconds} s: {'PASS' if passed else 'FAIL'} (config: {args.conf}, "
          f"{args.minutes} minutes after {args.warmup_minutes} of warm-up, one every {args.minute_seconds} s"
          f"{', handlers: --floor' if args.floor else ''})")
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    return 0 if passed else 1


def compare(args, argv: list[str]) -> int:
    """``--baseline COMMIT``: this tree and the baseline (and, with ``--floor``, this tree's floor) run
    ``--runs`` times each, interleaved, as separate processes; prints each run's figure, the medians per query and
    the ratios of the medians (this tree / baseline, this tree / floor, baseline / floor)."""
    args_of = ab.without(ab.without(ab.without(ab.without(argv, "--baseline"), "--runs"), "--floor", False), "--log")
    args_of = ab.without(ab.without(args_of, "--max-ratio"), "--conf")  # each tree its own shipped config
    script = Path(__file__).resolve()
    log = Path(args.log) if args.log else None
    with ab.worktree(args.baseline) as base_tree:
        variants = [("this tree", ab.REPO, args_of), (f"baseline {args.baseline}", base_tree, args_of)]
        if args.floor:
            variants.append(("this tree --floor", ab.REPO, [*args_of, "--floor"]))
        print(f"A/B: {ab.commit_of(ab.REPO)} against {args.baseline} ({ab.commit_of(base_tree)}), {args.runs} runs each, "
              f"interleaved; {args.minutes} stats minutes after {args.warmup_minutes} of warm-up, one every "
              f"{args.minute_seconds} s; {os.cpu_count()} cores (seconds are this machine's)", flush=True)
        results = ab.interleave(script, variants, args.runs, log)
    medians = {}
    for label, runs in results.items():
        figures = [r.get("per_minute") for r in runs]
        medians[label] = ab.median(runs, "per_minute")
        queries = sorted({q for r in runs for q in r.get("queries", {})})
        per_query = ", ".join(
            f"{q} {statistics.median(r['queries'][q] for r in runs if q in r.get('queries', {})):.2f}" for q in queries)
        shown = ", ".join(f"{f:.2f}" if f is not None else "failed" for f in figures)
        print(f"{label}: processing s per stats minute {shown}; median {medians[label] or float('nan'):.2f} s "
              f"({per_query})")
        for query in ("gold", "fast"):
            held = [r["locked"][query]["median"] for r in runs if query in r.get("locked", {})]
            if held:
                print(f"   {query}: decision lock's critical section, median of the runs' medians "
                      f"{statistics.median(held):.3f} s (max {max(r['locked'][query]['max'] for r in runs if query in r.get('locked', {})):.3f} s)")
    new, base = medians["this tree"], medians[f"baseline {args.baseline}"]
    floor = medians.get("this tree --floor")
    if new is None or base is None:
        print("a variant reported no figure: see the runs' output", file=sys.stderr)
        return 2
    ratio = new / base
    print(f"this tree / baseline {args.baseline}: {new:.2f} / {base:.2f} = {ratio:.2f}x (target <= {args.max_ratio}x: "
          f"{'PASS' if ratio <= args.max_ratio else 'FAIL'})")
    if floor:
        print(f"this tree / its floor: {new:.2f} / {floor:.2f} = {new / floor:.2f}x; baseline / this tree's floor: "
              f"{base / floor:.2f}x")
    return 0 if ratio <= args.max_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
