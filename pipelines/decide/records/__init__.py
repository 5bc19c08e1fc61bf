"""Records and state: the typed rows the decision plane reads and writes.

* :mod:`~pipelines.decide.records.resource`: what the per-resource walk reads and writes (observations, candidates,
  decisions, evidence, the ``state/policy`` row :class:`~pipelines.decide.records.resource.ResourceState`, what a
  micro-batch tells a resource's walk :class:`~pipelines.decide.records.resource.Batch`);
* :mod:`~pipelines.decide.records.inputs`: what the two deciding paths read, typed by phase;
* :mod:`~pipelines.decide.records.limit_rows`: ``gold/limits`` rows from decisions, their event-time versions and
  their expectations.

Imports only the plane's words, Arrow schemas and number text: every other subpackage builds on these.
"""
