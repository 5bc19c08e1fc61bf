"""rate-governor: per-topic rate limits for shared RocketMQ clusters, one folder per plane.

* :mod:`pipelines.dataplane` - Spark: sources, parse, quality gate, windowed sums, the lake (grows with the cluster).
* :mod:`pipelines.decide` - the decision plane: rules, evidence, the fold, reconciliation; pure functions over Arrow.
* :mod:`pipelines.writeback` - publishing the decided limits: ``limits.json``, the Kafka and RocketMQ sinks.
* :mod:`pipelines.job` - the streaming job: its three queries' flows, their lifecycle, the lease, checkpoints.
* :mod:`pipelines.ops` - operations: console, status page, metrics, dashboard, the lake's SQL, the demo.
* :mod:`pipelines.sim` - scenarios, the simulated cluster and the Spark-free closed loop.
* :mod:`pipelines.backtest` - the closed-loop backtest through Spark (imported by nothing else).

Top-level modules hold the facts every plane shares, defined once: :mod:`pipelines.columns` and
:mod:`pipelines.schemas` (table columns), :mod:`pipelines.tables` (table names), :mod:`pipelines.rocketmq` (stat
names and RocketMQ facts), :mod:`pipelines.config` (typed config), :mod:`pipelines.cli`, :mod:`pipelines.faults`;
:mod:`pipelines.governor` is the command line. The import rules are checked by ``tests/test_layout.py``.
"""
