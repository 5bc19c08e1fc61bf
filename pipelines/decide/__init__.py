"""The decision plane: every rule and decision of the governor as pure functions over Arrow, no Spark.

Spark reduces (the data plane: parsing, the quality gate, the stateful windowed sums per window × broker × topic ×
consumer group × metric); the driver derives and decides, here, on what each deciding micro-batch collected once as
Arrow. One implementation,
three users: the streaming job (:mod:`pipelines.job.flows`), the closed-loop backtest through Spark
(:mod:`pipelines.backtest`) and the Spark-free closed-loop simulator (:mod:`pipelines.sim.loop`).

What it owns, one module per concern:

* :mod:`~pipelines.decide.words`: the closed sets of values (anomaly kind, action, mode, basis, severity, a
  window's status) as ``str`` enums, their values what the tables hold;
* :mod:`~pipelines.decide.facts`: every rule predicate and derived quantity, once (both paths, both gates, the
  traffic floor, the evidence and the policies call them);
* :mod:`~pipelines.decide.windows`: the finalized windowed sums → the gold TPS tables and the per-broker traffic;
* :mod:`~pipelines.decide.catalogue`: the rule catalogue (each anomaly kind, its evidence, what it limits) and the
  registry of the limit policies (:func:`~pipelines.decide.catalogue.policy_for`);
* :mod:`~pipelines.decide.rules`, :mod:`~pipelines.decide.baselines`: the rules over windows (final detection) and
  their baselines;
* :mod:`~pipelines.decide.preliminary`: the same rules on open windows, with the broker census (fast path);
  :mod:`~pipelines.decide.open_retry`: a consumer group's retry traffic on open windows;
* :mod:`~pipelines.decide.evidence`: demand evidence of limited resources, observations, the lift veto's evidence;
* :mod:`~pipelines.decide.candidates`: limit candidates per rule;
* :mod:`~pipelines.decide.policy`, :mod:`~pipelines.decide.retry_limit`, :mod:`~pipelines.decide.surge_limit`: a
  limit's whole life (judge, set, hold, refresh, probe, lift, veto, recurrence), one class per limiting rule over
  the shared steps of :mod:`~pipelines.decide.steps` and the vocabulary of :mod:`~pipelines.decide.fold_types`;
* :mod:`~pipelines.decide.fold`, :mod:`~pipelines.decide.folding`: the walk over one resource's windows, and the
  fold of every resource of a micro-batch (:func:`~pipelines.decide.folding.fold_all`) with the ``state/policy``
  rows in and out;
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
