"""The two deciding paths and their reconciliation, end to end over one micro-batch.

* :mod:`~pipelines.decide.paths.walk`: one resource's windows walked in event-time order by its kind's policy;
* :mod:`~pipelines.decide.paths.fold_all`: that walk for every resource of a micro-batch, ``state/policy`` rows in
  and out;
* :mod:`~pipelines.decide.paths.final`: the final path (finalized windows → anomalies, decisions, ``gold/limits``);
* :mod:`~pipelines.decide.paths.fast`: the fast path (open windows → preliminary limits within a trigger);
* :mod:`~pipelines.decide.paths.open_split`: a preliminary limit's per-broker split while its window is open;
* :mod:`~pipelines.decide.paths.reconcile`: preliminary → final (confirm, correct or reverse; versions);
* :mod:`~pipelines.decide.paths.overrides`: operators' overrides applied to the walk's inputs and outputs.

The top of the plane: imports every other subpackage and the catalogue; nothing in the plane imports it.
"""
