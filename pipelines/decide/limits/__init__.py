"""A limit's whole life, one class per limit kind over one small interface.

* :mod:`~pipelines.decide.limits.base`: :class:`~pipelines.decide.limits.base.LimitPolicy`, the steps every kind
  shares (judge a window, set, hold, refresh, probe, undo, lift, veto, recurrence);
* :mod:`~pipelines.decide.limits.open_windows`: what the fast path's open windows let a limit decide before they
  are final (its mixin);
* :mod:`~pipelines.decide.limits.steps`: the frozen parameters, the outcome of a step and its arithmetic;
* :mod:`~pipelines.decide.limits.retry_storm`: ``RUNAWAY_RETRY``'s limit (a consumer group's retry traffic);
* :mod:`~pipelines.decide.limits.surge`: ``TRAFFIC_SURGE``'s limit (a topic's puts beside a busy broker).

Imports facts (:mod:`pipelines.decide.rules.facts`) and records; the catalogue
(:mod:`pipelines.decide.catalogue`) maps each anomaly kind to its class.
"""
