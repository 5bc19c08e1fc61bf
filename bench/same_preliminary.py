"""The same preliminary decisions before and after a change: the fast path's micro-batches of closed loops, each one's
inputs recorded and replayed through this tree's fast path and a baseline commit's (checked out in a worktree).

    .venv/bin/python bench/same_preliminary.py --baseline COMMIT [--scenarios a,b] [--dir DIR]

The fast path's decisions depend on how input falls into micro-batches, so its inputs are recorded: each micro-batch
of the Spark-free closed loop (:func:`pipelines.sim.loop.simulate`, the named scenarios of ``bench/closed_loop.py``)
is written with what the fast path read — its open-window rows, the rows it remembered, the finalized history, the
policy state and the limits in force, the clock — and what this tree decided. The baseline's fast path
(``FastFlow.decide`` with a lake that serves the recorded tables) decides on each again; decisions, versions and
reasons must be equal exactly, numbers to a relative 1e-9. Prints one line per scenario; exit 1 on a difference.
The micro-batches are cut by the simulator's timing, not by a Spark run of the baseline.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

#: Run by the baseline's interpreter in the baseline's tree: each recorded micro-batch through its FastFlow.decide.
REPLAY = r"""
import datetime as dt, pickle, sys
sys.path.insert(0, sys.argv[1])
import old_layout  # a baseline tree may have the module paths before issue 43
import pyarrow as pa
from pyspark.sql import functions as F
from pipelines.config import load_config
from pipelines.dataplane.session import build_session
from pipelines import schemas
from pipelines import tables
from pipelines.job.flows.fast import FastFlow
from pipelines.dataplane.quality.gate import QualityGate

cfg = load_config(sys.argv[1] + "/conf/local.toml")
spark = build_session(cfg.spark)
SCHEMA = {tables.GOLD_TOPIC_TPS: schemas.GOLD_TOPIC_TPS, tables.GOLD_BROKER_TPS: schemas.GOLD_BROKER_TPS,
          tables.STATE_POLICY: schemas.POLICY_STATE, tables.GOLD_LIMITS: schemas.GOLD_LIMITS}


class Lake:
    def __init__(self, data):
        self.data = data
    def _df(self, table):
        return spark.createDataFrame(self.data[table], schema=SCHEMA[table])
    def read(self, table, since=None, before=None):
        df = self._df(table)
        if since is not None:
            df = df.where(F.col("window_start") >= F.lit(since))
        return df
    def latest(self, table, keys, order, rank, below=None):
        return rank(self._df(table))


out = []
batches = pickle.load(open(sys.argv[2], "rb"))
for i, b in enumerate(batches):
    lake = Lake({tables.GOLD_TOPIC_TPS: b["topic_history"], tables.GOLD_BROKER_TPS: b["broker_history"],
                 tables.STATE_POLICY: b["state"], tables.GOLD_LIMITS: b["limits"]})
    flow = FastFlow(cfg, lake, QualityGate(cfg, lake), None)
    flow.open_rows.rows = b["remembered"]
    rows = b["rows"]
    frame = spark.createDataFrame(rows)
    decided = flow.decide(frame, i, b["now"], rows)
    limits = decided.get(tables.GOLD_LIMITS)
    out.append(limits.toArrow() if limits is not None else None)
pickle.dump(out, open(sys.argv[3], "wb"))
spark.stop()
"""


def record(scenarios: list[str], out: Path) -> dict[str, list]:
    """Each scenario's fast micro-batches: (inputs, this tree's decisions), pickled to ``out/<scenario>.pkl``."""
    from pipelines.sim.settings import build_spec, governor_config, load_backtest_config
    from pipelines.sim.loop import simulate

    bcfg = load_backtest_config(str(REPO / "conf" / "backtest.toml"))
    cfg = governor_config(bcfg, None, None)
    recorded = {}
    for name in scenarios:
        batches: list = []

        def keep(kind, inputs, accepted):
            if kind == "fast":
                batches.append((inputs, accepted))

        simulate(build_spec(name, {}, now=dt.datetime(2026, 1, 5, 12, tzinfo=dt.timezone.utc)), cfg, bcfg,
                 record=keep)
        recorded[name] = batches
    return recorded


def rows(table) -> list[dict]:
    if table is None or table.num_rows == 0:
        return []
    out = []
    for r in table.to_pylist():
        r.pop("decided_at", None), r.pop("expires_at", None)  # processing times: the clock is the recorded one
        if r.get("broker_limits") is not None:
            r["broker_limits"] = sorted(r["broker_limits"])
        out.append(r)
    return sorted(out, key=lambda r: json.dumps(r, sort_keys=True, default=str))


def main(argv: list[str] | None = None) -> int:
    from bench.same_decisions import same

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True)
    ap.add_argument("--scenarios", default="persisting_storm,storm_fixed,intermittent_storm,noisy_neighbour,"
                                         "flash_sale,spread_storm")
    ap.add_argument("--dir", default="")
    args = ap.parse_args(argv)
    work = Path(args.dir or tempfile.mkdtemp(prefix="rg-same-prelim-"))
    work.mkdir(parents=True, exist_ok=True)
    tree = work / "baseline"
    if not tree.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), args.baseline], cwd=REPO, check=True,
                       capture_output=True)
    failed = 0
    for name, batches in record(args.scenarios.split(","), work).items():
        inputs = [b for b, _ in batches]
        path, answer = work / f"{name}.pkl", work / f"{name}-baseline.pkl"
        path.write_bytes(pickle.dumps(inputs))
        script = work / ".replay.py"
        script.write_text(REPLAY)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(Path(__file__).resolve().parent)])}
        done = subprocess.run([sys.executable, str(script), str(tree), str(path), str(answer)], cwd=tree, env=env,
                              capture_output=True, text=True)
        if done.returncode:
            print(f"{name}: the baseline's replay failed:\n{done.stderr[-3000:]}")
            return 2
        theirs = pickle.loads(answer.read_bytes())
        differ = [i for i, ((_, ours), base) in enumerate(zip(batches, theirs)) if not same(rows(ours), rows(base))]
        decided = sum(1 for _, ours in batches if ours is not None and ours.num_rows)
        failed += bool(differ)
        print(f"{name}: {len(batches)} fast micro-batches, {decided} with decisions; "
              + ("the same decisions" if not differ else f"DIFFERENT in {len(differ)}: first {differ[:5]}"))
        for i in differ[:2]:
            print("   here:", rows(batches[i][1]))
            print("   base:", rows(theirs[i]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
