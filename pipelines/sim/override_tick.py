"""The override tick of the continuous job (:class:`pipelines.job.overrides.OverrideTick`) in the Spark-free closed
loop: :func:`pipelines.sim.loop.simulate` calls :func:`tick` at every fast trigger while operators' overrides are
given (``overrides=``); their checks and the sweep's kind that draws them: :mod:`pipelines.sim.overrides`."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from pipelines import columns
from pipelines.config import GovernorConfig
from pipelines.decide.arrow import from_rows
from pipelines.decide.paths.overrides import Applied, Override, frontier


def tick(overrides: Sequence[Override], store, now: dt.datetime, cfg: GovernorConfig) -> list[dict]:
    """The override rows due at ``now`` (simulated UTC) from the limits in force of ``store``
    (:class:`pipelines.sim.loop.Store`), added to it; [] when none."""
    rows = Applied(overrides, now, {}, store.limits, cfg).standing(frontier(store.limits))
    if rows:
        store.add(from_rows(rows, columns.GOLD_LIMITS))
    return rows
