"""The running governor's side of operators' overrides (:mod:`pipelines.decide.paths.overrides`, docs/operators.md §9).

* :class:`OverrideSource`: ``control/overrides`` read from the lake for both deciding flows and the tick, cached by
  the table's Delta version (one log listing per call; the rows are read again only after a commit). A bad row is
  logged once (WARNING, with its reason) and ignored; an unreadable table is logged once per error and the
  overrides read before stay in force: the job never stops for them.
* :class:`OverrideTick`: every ``windows.fast_trigger_seconds`` (2 s, the fast path's trigger) in the continuous
  job, whether or not input arrives: the override rows the overrides call for now (a pin set or refreshed, an
  exempted limit lifted, an ended override's limit lifted; :meth:`pipelines.decide.paths.overrides.Applied.standing`),
  decided under the decision lock from the limits in force, appended to ``gold/limits`` and published through
  every write-back path at once; the override metrics refreshed (:mod:`pipelines.ops.override_metrics`).
"""

from __future__ import annotations

import logging
import threading

from pipelines import columns, tables
from pipelines.config import GovernorConfig
from pipelines.dataplane.lake import Lake
from pipelines.decide.arrow import from_rows, rows_of
from pipelines.decide.records.limit_rows import check
from pipelines.decide.paths.overrides import Applied, Override, frontier, parse
from pipelines.job.flows.base import Clock, utc_now, write_arrow
from pipelines.job.flows.store import DecisionStore
from pipelines.job.lease import LakeHeldError
from pipelines.ops import override_metrics
from pipelines.writeback.publish import Publisher

log = logging.getLogger("rate_governor")

#: Delta transaction app id of the tick's ``gold/limits`` appends (version: milliseconds since the epoch).
OVERRIDES_APP_ID = "rate-governor-overrides"
QUERY = "overrides"


class OverrideSource:
    """The overrides of ``control/overrides`` (module docstring); thread-safe.

    Example:
        >>> source = OverrideSource(lake, cfg)
        >>> source.current()          # tuple of pipelines.decide.paths.overrides.Override, () without a table
    """

    def __init__(self, lake: Lake, cfg: GovernorConfig) -> None:
        self.lake, self.cfg = lake, cfg
        self._lock = threading.Lock()
        self._version: int | None = None
        self._overrides: tuple[Override, ...] = ()
        self._logged: set[str] = set()

    def current(self) -> tuple[Override, ...]:
        """The overrides as the table holds them now (releases folded in), or as last read when it cannot be read."""
        with self._lock:
            try:
                version = self.lake.version(tables.CONTROL_OVERRIDES)
                if version is not None and version != self._version:
                    overrides, refused = parse(rows_of(self.lake.read_arrow(tables.CONTROL_OVERRIDES)), self.cfg)
                    for row, why in refused:
                        self._once(f"control/overrides: row {row.get('event')} {row.get('override_id')!r} of "
                                   f"{row.get('recorded_at')} ignored: {why}")
                    self._overrides, self._version = tuple(overrides), version
            except Exception as exc:  # noqa: BLE001 - a storage error never stops the job
                self._once(f"control/overrides not read ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                           f"the {len(self._overrides)} overrides read before stay in force")
            return self._overrides

    def _once(self, message: str) -> None:
        if message not in self._logged:
            self._logged.add(message)
            log.warning(message)


class OverrideTick:
    """Applies the overrides between micro-batches (module docstring); :meth:`start` runs :meth:`tick` on a daemon
    thread every ``windows.fast_trigger_seconds`` until :meth:`stop`."""

    def __init__(self, cfg: GovernorConfig, lake: Lake, source: OverrideSource, store: DecisionStore,
                 publisher: Publisher, decision_lock: threading.Lock, clock: Clock = utc_now) -> None:
        self.cfg, self.lake, self.source, self.store = cfg, lake, source, store
        self.publisher, self.lock, self.clock = publisher, decision_lock, clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._version = 0
        #: Rows each tick wrote (tests and logs).
        self.written: list[int] = []
        #: More steps run on the same thread every tick, after the overrides (the gold flow's probe tick).
        self.also: list = []

    def tick(self) -> int:
        """One application of the overrides; returns the ``gold/limits`` rows written (0: nothing to do).

        Raises:
            pipelines.job.lease.LakeHeldError: this governor lost the lake (nothing written)."""
        overrides = self.source.current()
        with self.lock:
            now = self.clock()
            latest = self.store.latest_by_key()
            rows = Applied(overrides, now, {}, latest, self.cfg).standing(frontier(latest))
            version = self._version = max(self._version + 1, int(now.timestamp() * 1000))
            accepted, refused = check(rows, f"{OVERRIDES_APP_ID}:{version}", now) if rows else ([], [])
            decided = from_rows(accepted, columns.GOLD_LIMITS)
            self.store.add_limits(decided)
        override_metrics.observe(overrides, now)
        if not rows:
            return 0
        write_arrow(self.lake, QUERY, OVERRIDES_APP_ID, version,
                    {tables.GOLD_LIMITS: decided, tables.QUARANTINE: from_rows(refused, columns.QUARANTINE)})
        for row in accepted:
            log.info("%s %s: %s", row["resource_type"], row["resource"], row["reason"])
        if accepted:
            self.publisher.publish(now, version, QUERY)
        self.written.append(len(accepted))
        return len(accepted)

    def start(self) -> None:
        """Tick now, then every ``windows.fast_trigger_seconds`` on a daemon thread."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="overrides", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        failed: set[str] = set()
        while True:
            try:
                self.tick()
                for step in self.also:
                    step()
            except LakeHeldError:
                return  # the run stops its queries and says so
            except Exception as exc:  # noqa: BLE001 - the next tick tries again; the job goes on
                if type(exc).__name__ not in failed:
                    failed.add(type(exc).__name__)
                    log.exception("overrides: a tick failed; the next one tries again")
            if self._stop.wait(self.cfg.windows.fast_trigger_seconds):
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

