"""Fixed cost of one publish: the limits in force read from ``gold/limits`` and turned into control records, by the
Spark path (``current_limits`` → ``control_records``: what ``Publisher.records`` ran before) and by the driver path
(``Lake.latest_rows`` on the delta-rs snapshot → ``current_rows`` → ``records_from_rows``), on the same table.

    .venv/bin/python bench/publish_cost.py [--commits 200] [--rows 20] [--repeat 5]

The table gets ``--commits`` appends (alternately the gold and the fast flow's app id) of ``--rows`` decisions each
over 500 resources, so it looks like ``gold/limits`` after a long run. Checks that both paths give the same records,
then prints the best of ``--repeat`` timings (after one warm-up) and the ratio Spark / driver.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipelines import schemas  # noqa: E402
from pipelines.config import load_config  # noqa: E402
from pipelines.writeback import publish  # noqa: E402
from pipelines import tables
from pipelines.dataplane.lake import DeltaRsLake  # noqa: E402
from pipelines.dataplane.session import build_session  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
NOW = dt.datetime(2026, 11, 22, 12, 0)


def best(repeat: int, action) -> float:
    action()
    times = []
    for _ in range(repeat):
        started = time.monotonic()
        action()
        times.append(time.monotonic() - started)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commits", type=int, default=200)
    ap.add_argument("--rows", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    cfg = load_config(str(REPO / "conf" / "local.toml"))
    spark = build_session(cfg.spark)
    with tempfile.TemporaryDirectory() as tmp:
        lake = DeltaRsLake(spark, tmp)
        version = 0
        for commit in range(args.commits):
            rows = []
            for i in range(args.rows):
                version += 1
                n = (commit * args.rows + i) % 500
                action = "lift" if n % 7 == 0 else "set"
                rows.append((NOW, NOW, "group", f"group-{n}", 10.0 + n, 11 + n, None, action, "enforce",
                             NOW + dt.timedelta(minutes=(n % 20) - 5), "bench", version, "final"))
            app_id = "governor-gold" if commit % 2 else "governor-fast"
            lake.append(spark.createDataFrame(rows, schemas.GOLD_LIMITS), tables.GOLD_LIMITS, app_id=app_id,
                        version=commit)

        def spark_path():
            return publish.control_records(publish.current_limits(lake.read(tables.GOLD_LIMITS), NOW),
                                           cfg.limits, b"k")

        def driver_path():
            latest = lake.latest_rows(tables.GOLD_LIMITS, ["resource_type", "resource"], "version")
            return publish.records_from_rows(publish.current_rows(latest, NOW), cfg.limits, b"k")

        same = spark_path() == driver_path()
        records = len(driver_path())
        before, after = best(args.repeat, spark_path), best(args.repeat, driver_path)
    print(f"gold/limits: {args.commits} commits x {args.rows} rows, {records} limits in force; same records: {same}")
    print(f"before (Spark path: current_limits + control_records) {before:6.3f} s")
    print(f"after  (driver path: Lake.latest_rows + current_rows)  {after:6.3f} s")
    print(f"ratio before/after: {before / after:.1f}x")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
