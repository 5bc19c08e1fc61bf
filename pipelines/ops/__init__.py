"""Operations: what an SRE reads and runs beside the job.

* :mod:`~pipelines.ops.console`, :mod:`~pipelines.ops.progress` - the console lines and per-micro-batch progress;
* :mod:`~pipelines.ops.metrics`, :mod:`~pipelines.ops.metric_labels`, :mod:`~pipelines.ops.dashboard` - the
  Prometheus metrics and the Grafana dashboard;
* :mod:`~pipelines.ops.status`, :mod:`~pipelines.ops.plots` - the status page;
* :mod:`~pipelines.ops.query` - the lake's tables through SQL without Spark;
* :mod:`~pipelines.ops.demo` - ``./run.sh``.

May import: every plane but :mod:`pipelines.backtest`.
"""
