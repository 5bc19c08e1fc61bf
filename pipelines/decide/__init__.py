"""The decision plane: every rule and decision of the governor as pure functions over Arrow, no Spark.

Spark reduces (the data plane: parsing, the quality gate, the stateful windowed sums per window × broker × topic ×
consumer group × metric); the driver derives and decides, here, on what each deciding micro-batch collected once as
Arrow. One implementation,
three users: the streaming job (:mod:`pipelines.job.flows`), the closed-loop backtest through Spark
(:mod:`pipelines.backtest`) and the Spark-free closed-loop simulator (:mod:`pipelines.sim.loop`).

What it owns, in layers by role, lowest first (docs/architecture.md §3.1 has the picture):

* :mod:`~pipelines.decide.words`, :mod:`~pipelines.decide.arrow`, :mod:`~pipelines.decide.text`: the closed sets of
  values a decision, a limit or a judged window takes (``str`` enums whose values the tables hold), the Arrow
  schemas, and numbers as Spark writes them;
* :mod:`pipelines.decide.records`: the typed records the rest reads and writes (observations, candidates,
  decisions, the ``state/policy`` row, the paths' inputs, ``gold/limits`` rows);
* :mod:`pipelines.decide.rules`: facts and rules (every predicate once, the rules on final and open windows, the
  baselines, limit candidates and the demand evidence);
* :mod:`pipelines.decide.limits`: a limit's whole life, one class per limit kind over one base;
* :mod:`~pipelines.decide.catalogue`: each anomaly kind, what its rule needs, the class that limits it;
* :mod:`pipelines.decide.paths`: the per-resource walk, the final and the fast path, their reconciliation and the
  operators' overrides.

A module imports only its own layer and those below it (``tests/test_layout.py`` checks it, and that no module
imports another in a circle).

May import: pyarrow, polars (the columnar engine: Arrow-native, so the rows Spark collected are used without a copy,
with group-bys, joins and window functions at a per-operation cost of tens of microseconds, which the simulator's
hundreds of closed loops need), the standard library, :mod:`pipelines.columns`, :mod:`pipelines.config`,
:mod:`pipelines.rocketmq`. Never pyspark (``tests/test_layout.py`` checks the import direction).
"""
