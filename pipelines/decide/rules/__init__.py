"""Facts and rules: what a window says, before any limit is chosen.

* :mod:`~pipelines.decide.rules.facts`: every rule predicate and derived quantity, defined once;
* :mod:`~pipelines.decide.rules.anomalies`: the rules over finalized windows → ``gold/anomalies`` rows;
* :mod:`~pipelines.decide.rules.baselines`: a resource's baseline over its previous windows;
* :mod:`~pipelines.decide.rules.crowding`: a surging topic read through the busy brokers it crowds;
* :mod:`~pipelines.decide.rules.windows`: the finalized windowed sums → the gold TPS tables, per-broker traffic;
* :mod:`~pipelines.decide.rules.preliminary`, :mod:`~pipelines.decide.rules.open_retry`: the same rules on open
  windows (the fast path's evidence), with the broker census;
* :mod:`~pipelines.decide.rules.candidates`: limit candidates per rule (what, to what, why);
* :mod:`~pipelines.decide.rules.evidence`: what each broker admitted of a limited resource, as the limit policies'
  observations.

Imports the plane's words and records (:mod:`pipelines.decide.records`), never a limit policy nor a path.
"""
