"""The write-back: the decided limits published where brokers read them.

* :mod:`~pipelines.writeback.publish` - the signed ``control/limits.json`` (one record per limit in force);
* :mod:`~pipelines.writeback.records` - ``gold/limits`` rows to limit records (pure);
* :mod:`~pipelines.writeback.sinks` - the sink chain (what changed since the last publish, retries);
* :mod:`~pipelines.writeback.kafka_sink` - the Kafka topic sink;
* :mod:`~pipelines.writeback.rocketmq_sink`, ``rocketmq_admin``, ``rocketmq_ledger``, ``rocketmq_restore`` - the
  RocketMQ admin sink (the sohutv limiter's remoting requests), its ledger and the restore command.

The brokers' side (the token bucket applier, the record format, the remoting protocol) is :mod:`control`, which
imports nothing from here. May import: :mod:`control`, the top-level modules, :mod:`pipelines.dataplane.lake`
(reading ``gold/limits``), :mod:`pipelines.decide.words` (action names), :mod:`pipelines.ops.metrics`.
"""
