"""The gold query's handler (pipelines/job/flows/gold.py GoldFlow.handle) on a static micro-batch."""

from __future__ import annotations

import uuid

from pipelines import schemas
from pipelines.config import load_config
from pipelines.job.flows.assembly import build_governor


def test_the_handler_first_job_runs_in_the_micro_batch_partitions(spark, tmp_path):
    """The gold micro-batch is reduced by one Spark job, and its first stage runs in the partitions Spark emits the
    micro-batch in: coalescing to one partition ran the whole stateful aggregation in one task (a backlog's first
    gold micro-batch took longer, docs/performance.md); the TPS aggregations then run in one partition."""
    cfg = load_config("conf/local.toml").with_paths(str(tmp_path / "landing"), str(tmp_path / "lake"))
    governor = build_governor(spark, cfg)
    micro_batch = spark.createDataFrame([], schemas.WINDOW_METRIC).repartition(3)  # no finalized window yet
    context = spark.sparkContext
    group = f"gold-flow-{uuid.uuid4()}"
    context.setJobGroup(group, "gold handler")
    try:
        governor.gold.handle(micro_batch, 0)
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    tracker = context.statusTracker()
    jobs = tracker.getJobIdsForGroup(group)
    assert len(jobs) == 1, jobs
    tasks = [tracker.getStageInfo(s).numTasks for s in sorted(tracker.getJobInfo(jobs[0]).stageIds)]
    assert 3 in tasks, tasks
