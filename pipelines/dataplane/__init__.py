"""The Spark data plane: what grows with the cluster, Spark-native (built-in Column functions, state store,
watermarks).

* :mod:`~pipelines.dataplane.sources` - the raw records (landed files or Kafka topics);
* :mod:`~pipelines.dataplane.transforms` - parse (stats lines, send failures), silver rows, the windowed TPS sums
  (final windows behind the watermark, open windows for the fast path), checks, the known-broker filter;
* :mod:`~pipelines.dataplane.quality` - the quality gate (Great Expectations suites, quarantine, reconciliation);
* :mod:`~pipelines.dataplane.events` - the metric events the ingest query writes once for the deciding queries;
* :mod:`~pipelines.dataplane.lake` - the Delta tables (delta-rs or delta-spark);
* :mod:`~pipelines.dataplane.known_brokers` - which broker names are trusted;
* :mod:`~pipelines.dataplane.session`, :mod:`~pipelines.dataplane.spark_compat` - the Spark session and Spark-line
  differences.

May import: pyspark, the top-level modules, :mod:`control` (the name server client), :mod:`pipelines.ops` (console
and metrics) and :mod:`pipelines.writeback.rocketmq_admin` (the broker list). Never :mod:`pipelines.decide`: Spark
reduces, the driver decides.
"""
