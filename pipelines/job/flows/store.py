"""The decisions' memory on the driver: the saved policy state per resource (``state/policy``) and the newest
``gold/limits`` row per resource, shared by the two deciding flows, read and moved under their decision lock.

Loaded from the lake on first use (delta-rs reads the tables on the driver, no Spark job), then kept up to date by
each decision, so a decision reads two small dicts instead of the two growing tables: the critical section of the
decision lock is the fold, not I/O. The lake stays the truth: a restart loads it again, and a micro-batch the final
path runs again (a replay after a crash) reads the state of the batches before it from the lake, as it first did.
"""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

from pipelines import columns
from pipelines.decide.arrow import aware, from_rows
from pipelines import tables
from pipelines.dataplane.lake import Lake
from pipelines.columns import Key
from pipelines.schemas import RESOURCE_KEYS


class DecisionStore:
    """Policy state and limits in force of one governor (module docstring).

    Example:
        >>> store = DecisionStore(lake)
        >>> store.state_before(7)          # Arrow state/policy rows (without batch_id) for final batch 7
        >>> store.add_state(out.state)      # the rows batch 7 wrote
        >>> store.add_limits(out.limits)    # every gold/limits row written
    """

    def __init__(self, lake: Lake) -> None:
        self.lake = lake
        self._state: dict[Key, dict] | None = None
        self._limits: dict[Key, dict] | None = None
        self._lifted: dict[Key, dt.datetime] = {}  # key → when a lift this store added was decided (UTC)

    def _load_state(self, below: int | None = None) -> dict[Key, dict]:
        rows = self.lake.latest_rows(tables.STATE_POLICY, list(RESOURCE_KEYS), "batch_id", below=below)
        return {(r["resource_type"], r["resource"]): r for r in rows}

    def state_before(self, batch_id: int | None = None) -> pa.Table:
        """The saved state per resource of the final batches before ``batch_id`` (all of them when None)."""
        if self._state is None:
            self._state = self._load_state()
        newest = max((r.get("batch_id") or 0 for r in self._state.values()), default=-1)
        rows = self._state if batch_id is None or newest < batch_id else self._load_state(below=batch_id)
        return from_rows(list(rows.values()), columns.POLICY_STATE)

    def latest_limits(self) -> pa.Table:
        """The newest ``gold/limits`` row per resource."""
        return from_rows(list(self.latest_by_key().values()), columns.GOLD_LIMITS)

    def latest_by_key(self) -> dict[Key, dict]:
        """The newest ``gold/limits`` row per resource as dicts by key (the rows themselves: read them, never change
        them), without building a table (the override tick reads them every fast trigger)."""
        if self._limits is None:
            self._limits = {(r["resource_type"], r["resource"]): r
                            for r in self.lake.latest_rows(tables.GOLD_LIMITS, list(RESOURCE_KEYS), "version")}
        return dict(self._limits)

    def lifted_at(self) -> dict[Key, dt.datetime]:
        """When each resource's newest ``lift`` was decided (UTC): the newest ``gold/limits`` rows that are lifts and
        the lifts added since (:func:`pipelines.decide.paths.reconcile.read_as_limited`)."""
        out = {k: aware(r["decided_at"]) for k, r in self.latest_by_key().items() if r.get("action") == "lift"}
        for key, at in self._lifted.items():
            if key not in out or at > out[key]:
                out[key] = at
        return out

    def limited_keys(self) -> tuple[str, ...]:
        """``"<resource_type>\\x1f<resource>"`` of every resource with a limit in the saved state (whose traffic the
        final path keeps, :func:`pipelines.decide.rules.windows.resource_traffic`)."""
        if self._state is None:
            self._state = self._load_state()
        return tuple(sorted(f"{t}\x1f{r}" for (t, r), row in self._state.items() if row.get("limit_qps") is not None))

    def probing(self) -> bool:
        """Whether a resource's saved state has a probe in flight (``probe_decided_at`` set)."""
        if self._state is None:
            self._state = self._load_state()
        return any(row.get("probe_decided_at") is not None for row in self._state.values())

    def add_state(self, rows: pa.Table) -> None:
        """``state/policy`` rows a final batch decided (they replace the resources' saved state)."""
        if self._state is None:
            self._state = self._load_state()
        for r in rows.to_pylist():
            self._state[(r["resource_type"], r["resource"])] = r

    def add_limits(self, rows: pa.Table) -> None:
        """``gold/limits`` rows a batch decided (each replaces its resource's newest row when its version is not
        lower)."""
        self.latest_limits()
        for r in rows.to_pylist():
            key = (r["resource_type"], r["resource"])
            if r["action"] == "lift" and (key not in self._lifted or aware(r["decided_at"]) > self._lifted[key]):
                self._lifted[key] = aware(r["decided_at"])
            if key not in self._limits or r["version"] >= self._limits[key]["version"]:
                self._limits[key] = r
