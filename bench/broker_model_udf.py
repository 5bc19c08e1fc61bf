"""The backtest's broker model on the driver against the grouped pandas UDF (``udfs/broker_model.py``), on the same
offered traffic of a large_mix cluster, without limits and with one enforced limit on the storm's group.

    .venv/bin/python bench/broker_model_udf.py [--brokers 50] [--topics 2000] [--groups 400] [--minutes 30]

Prints the seconds of each run (best of ``--repeat``) and checks that both give the same rejected sends: the driver
(:func:`pipelines.sim.broker_model.simulate`, all brokers in one vectorised tick loop), the executors with one
group per broker, and the executors with brokers hashed into one bucket per core
(:func:`udfs.broker_model.model_on_executors`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pandas as pd  # noqa: E402

from pipelines import schemas  # noqa: E402
from pipelines.config import SparkConfig  # noqa: E402
from pipelines.dataplane.session import build_session  # noqa: E402
from pipelines.sim import broker_model as bm  # noqa: E402
from pipelines.sim.spec import ScenarioSpec  # noqa: E402
from pipelines.sim.traffic import build_traffic  # noqa: E402
from udfs.broker_model import model_on_executors, simulate_per_broker  # noqa: E402


def per_broker_groups(spark, offered, schedule, cfg, capacity) -> pd.DataFrame:
    minutes = pd.date_range(offered["minute_start"].min(), offered["minute_start"].max(), freq="min")
    df = spark.createDataFrame(offered[list(bm.OFFERED_COLUMNS)], schema=schemas.BROKER_MODEL_OFFERED)
    rows = df.groupBy("broker").applyInPandas(simulate_per_broker(schedule, cfg, capacity, minutes),
                                              schema=schemas.BROKER_MODEL_RESULT).toPandas()
    return rows[rows["row_kind"] == "resource"]


def best(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--brokers", type=int, default=50)
    p.add_argument("--topics", type=int, default=2000)
    p.add_argument("--groups", type=int, default=400)
    p.add_argument("--minutes", type=int, default=30)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--master", default="local[2]")
    args = p.parse_args(argv)
    spec = ScenarioSpec(name="large_mix", seed=3, start=dt.datetime(2026, 11, 22, 8, 0, tzinfo=dt.timezone.utc),
                        minutes=args.minutes, onset_minute=args.minutes // 2, brokers=args.brokers,
                        topics=args.topics, groups=args.groups)
    traffic = build_traffic(spec)
    stats = traffic[traffic["period"] == "minute"]
    cfg = bm.BrokerModelConfig()
    offered = bm.offered_from_stats(stats, cfg)
    capacity = bm.broker_capacity(offered, cfg)
    onset = pd.Timestamp(spec.onset)
    schedule = pd.DataFrame([("group", spec.culprit_group, onset + pd.Timedelta(minutes=2),
                              onset + pd.Timedelta(minutes=args.minutes), 50.0, 50.0, 1, onset)],
                            columns=list(bm.SCHEDULE_COLUMNS))
    spark = build_session(SparkConfig(master=args.master, app_name="bench-broker-model", shuffle_partitions=2,
                                      conf={"spark.ui.enabled": "false"}))
    print(f"large_mix: {args.brokers} brokers, {args.topics} topics, {args.minutes} min, {len(offered)} offered rows, "
          f"{spark.sparkContext.defaultParallelism} cores ({args.master})")
    for label, sched in (("without limits", None), ("with one limit", schedule)):
        t_drv, drv = best(lambda: bm.simulate(offered, sched, cfg, capacity), args.repeat)
        t_bkt, bkt = best(lambda: model_on_executors(spark, offered, sched, cfg, capacity), args.repeat)
        t_one, one = best(lambda: per_broker_groups(spark, offered, sched, cfg, capacity), args.repeat)
        rej = [float((r["busy_rejected"] + r["limited_rejected"]).sum()) for r in (drv.resources, bkt.resources, one)]
        same = max(rej) - min(rej) <= 1e-6 * max(1.0, max(rej))
        print(f"{label}: driver {t_drv:.1f} s, executors (bucket per core) {t_bkt:.1f} s, executors (group per "
              f"broker) {t_one:.1f} s; rejected sends {rej[0]:,.0f} / {rej[1]:,.0f} / {rej[2]:,.0f} "
              f"({'same' if same else 'DIFFERENT'})")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
