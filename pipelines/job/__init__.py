"""The streaming job: three queries (ingest, fast, gold) started, fenced and stopped.

* :mod:`~pipelines.job.flows` - each query's ``foreachBatch`` flow: the Spark reduction, one collect, the decision
  plane, the lake writes and the publish;
* :mod:`~pipelines.job.queries` - starting the queries on their triggers and checkpoints, the lease fence in front
  of every handler, stopping them;
* :mod:`~pipelines.job.run` - one governor run (lease, checks, metrics endpoint);
* :mod:`~pipelines.job.lease`, :mod:`~pipelines.job.checkpoint` - the lake's single-writer lease and the checkpoint
  checks.

May import: every plane but :mod:`pipelines.sim` and :mod:`pipelines.backtest`.
"""
