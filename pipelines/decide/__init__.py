"""The decision plane: every rule and decision of the governor as pure functions over Arrow, no Spark.

Spark reduces (the data plane: parsing, the quality gate, the stateful windowed sums per window × broker × topic ×
consumer group × metric); the driver derives and decides, here, on what each deciding micro-batch collected once as
Arrow. One implementation,
three users: the streaming job (:mod:`pipelines.job.flows`), the closed-loop backtest through Spark
(:mod:`pipelines.backtest`) and the Spark-free closed-loop simulator (:mod:`pipelines.sim.loop`).

What it owns, one module per concern:

* :mod:`~pipelines.decide.windows`: the finalized windowed sums → the gold TPS tables and the per-broker traffic;
* :mod:`~pipelines.decide.catalogue`: the rule catalogue (each anomaly kind, its evidence, what it limits);
* :mod:`~pipelines.decide.rules`: the rules over windows (final detection) and their baselines;
* :mod:`~pipelines.decide.preliminary`: the same rules on open windows, with the broker census (fast path);
* :mod:`~pipelines.decide.evidence`: demand evidence of limited resources, observations, the lift veto's evidence;
* :mod:`~pipelines.decide.candidates`: limit candidates per rule;
* :mod:`~pipelines.decide.fold_types`, :mod:`~pipelines.decide.fold`, :mod:`~pipelines.decide.limit_policy`: the
  per-resource policy fold and the per-rule limit policies (plain Python over frozen dataclasses);
* :mod:`~pipelines.decide.folding`: the fold run per resource over Arrow rows;
* :mod:`~pipelines.decide.reconcile`: preliminary → final (versions, the fast path's starting state, confirm, correct
  or reverse);
* :mod:`~pipelines.decide.limits`: ``gold/limits`` rows and their expectations;
* :mod:`~pipelines.decide.final`, :mod:`~pipelines.decide.fast`: the final and the fast path, end to end;
* :mod:`~pipelines.decide.arrow`, :mod:`~pipelines.decide.text`: Arrow schemas and Java-compatible number text.

May import: pyarrow, polars (the columnar engine: Arrow-native, so the rows Spark collected are used without a copy,
with group-bys, joins and window functions at a per-operation cost of tens of microseconds, which the simulator's
hundreds of closed loops need), the standard library, :mod:`pipelines.columns`, :mod:`pipelines.config`,
:mod:`pipelines.rocketmq`. Never pyspark (``tests/test_layout.py`` checks the import direction).
"""
