"""State size stays bounded by the watermark: the gold query's state rows (window sums + de-duplication keys in
the RocksDB state store) after a short and after a long run of the same steady traffic.

    .venv/bin/python bench/state_size.py [--short 30] [--long 120]

Prints the state rows of each run and their ratio; without eviction by the watermark the long run would hold about
long/short times as many rows.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipelines import governor  # noqa: E402
from pipelines.sim.render import render_landing  # noqa: E402
from pipelines.sim.spec import ScenarioSpec  # noqa: E402
from pipelines.config import load_config  # noqa: E402
from pipelines.dataplane.session import build_session  # noqa: E402


def state_rows(spark, base, minutes: int, work: Path) -> tuple[int, int]:
    spec = ScenarioSpec(name="steady", seed=3, start=dt.datetime(2026, 11, 22, 0, 0, tzinfo=dt.timezone.utc),
                        minutes=minutes, brokers=2, topics=20, groups=8)
    written = render_landing(spec, work / f"landing-{minutes}")
    cfg = base.with_paths(str(work / f"landing-{minutes}"), str(work / f"lake-{minutes}"))
    gov = governor.run(spark, cfg, once=True)
    gold = next(q for q in gov.queries if q.name.endswith("gold"))
    rows = sum(op["numRowsTotal"] for op in gold.lastProgress["stateOperators"])
    return rows, written["stats_lines"] + written["failure_lines"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", type=int, default=30, help="minutes of traffic of the short run")
    parser.add_argument("--long", type=int, default=120, help="minutes of traffic of the long run")
    args = parser.parse_args(argv)
    os.environ.setdefault("RATE_GOVERNOR_SIGNING_KEY", "bench-key")
    base = load_config(Path(__file__).resolve().parent.parent / "conf" / "local.toml")
    base = base.model_copy(update={"quality": base.quality.model_copy(update={"validate_every_n_batches": 0})})
    spark = build_session(base.spark)
    work = Path(tempfile.mkdtemp(prefix="rg-state-"))
    short_rows, short_in = state_rows(spark, base, args.short, work)
    long_rows, long_in = state_rows(spark, base, args.long, work)
    print(f"short run: {args.short} min, {short_in} records -> {short_rows} state rows")
    print(f"long run:  {args.long} min, {long_in} records -> {long_rows} state rows")
    print(f"ratio long/short state rows: {long_rows / max(short_rows, 1):.2f} (input ratio {long_in / short_in:.2f})")
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
