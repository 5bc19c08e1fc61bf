"""The irregular world around the Spark-free closed loop (:mod:`pipelines.sim.loop`): shippers that lag, skip,
repeat or stop, brokers that apply a published limit each after its own delay or forget it on a restart, and a
governor restarted mid-run. Production does all of these; the default (:class:`Irregularity` ``()``) does none, and
the loop is then exactly the regular one the named scenarios were recorded on.

Times are event time: a minute index ``m`` is the minute ``[start + m min, start + (m + 1) min)`` of the scenario
(UTC), seconds count from the scenario's start.

* **Shipping** (:func:`stats_landings`): broker ``b``'s stats lines of minute ``m`` land
  ``stats_delay_seconds[b]`` (default ``shipping.stats_seconds``) + a uniform ``[0, stats_jitter_seconds)`` after
  the end of the minute; a minute of ``dropped_minutes`` never lands; one of ``duplicated_minutes`` lands a second
  time, whole, the given seconds after the first (a shipper that re-sent a file after a restart); one of
  ``late_minutes`` lands the given seconds later than the broker's other minutes (a shipper that stalled once); from
  ``stats_stop_minute[b]`` on, broker ``b`` ships nothing (a dead shipper). A shipper stopped for a while and
  restarted (filebeat resumes from its registry offset and ships its backlog at once) is a run of late minutes, each
  landing at the restart (:func:`stopped_shipper`). What Spark does with each (late rows behind the watermark
  dropped, a line shipped twice counted once) is :mod:`pipelines.sim.windows`' business.
* **Failure logs** (:class:`FailureShipping`): a producer's send-failure line is shipped from its client host
  ``shipping.failures_seconds`` after the send failed; its gaps are keyed by the failing send's topic (the record's
  ``topic``; ``%RETRY%<group>`` for a consumer group's send-back or fallback send, whose failures the simulated
  consumer clients never log, :class:`pipelines.sim.cluster.ClosedLoopCluster`) and the minute the send failed
  in: the lines of one of ``failure_dropped_minutes`` never land; of ``failure_late_minutes`` land the given
  seconds later than usual; of ``failure_duplicated_minutes`` land a second time the given seconds after the first (a
  shipper re-reading its file after a restart); and every line of a topic of ``failure_stops`` due while its shipper
  was stopped lands at the restart. A duplicated failure line counts twice downstream, as in the job: the data plane
  keeps no identity of a failure record (``parse_failures.silver_send_failures`` filters, never de-duplicates;
  ``tps.window_metrics`` and ``fast.open_window_sums`` sum failure events with ``F.sum``, where stats lines are a
  ``collect_set``), so only Spark's watermark drops one (:mod:`pipelines.sim.windows`: a failure event at or older than
  it).
* **Applying** (:class:`pipelines.sim.loop.Broker`): broker ``b`` applies a publication ``propagation_seconds`` +
  ``apply_delay_seconds[b]`` after it was published; at each ``(b, second)`` of ``broker_restarts`` its limiter
  forgets every limit until the next publication reaches it (Sohu's limiter keeps its records in memory; the
  applier pushes again only on the next publication).
* **The governor** restarted at ``governor_restart_second``: its decisions' memory is read back from the lake
  (``state/policy`` and ``gold/limits`` rows through their Arrow schemas) and the fast path's open-row memory
  (driver memory, :class:`pipelines.decide.paths.fast.OpenRows`) is lost; Spark's streaming state (the windows) is
  restored from the checkpoint, so the windowed sums go on. Killed ``governor_down_seconds`` before it (SIGKILL,
  no shutdown), it runs no micro-batch in between: the brokers keep the limits last published until they expire,
  and what landed meanwhile is its first micro-batches' backlog.
* **What the governor observes**: ``limiter_view`` False is the file write-back alone, where a limiter's
  rejections show only as the producers' logged failures; True puts the RocketMQ admin sink on, which reads every
  broker's limiters at each publish (:mod:`pipelines.sim.limiter_view`) and gives the final path their moves as
  ``control/limiter_rejections`` rows.
"""

from __future__ import annotations

import zlib

import numpy as np
from pydantic import Field

from pipelines.config import ConfigSection


class Irregularity(ConfigSection):
    """What differs from a regular world (module docstring); every field's default is the regular world."""

    stats_delay_seconds: dict[str, float] = Field(default_factory=dict)  # per broker, s after the minute's end
    stats_jitter_seconds: float = Field(default=0.0, ge=0)  # + uniform [0, this) per broker and minute, s
    dropped_minutes: list[tuple[str, int]] = Field(default_factory=list)  # (broker, minute): never shipped
    duplicated_minutes: list[tuple[str, int, float]] = Field(default_factory=list)  # (broker, minute, s later)
    late_minutes: list[tuple[str, int, float]] = Field(default_factory=list)  # (broker, minute, s more than usual)
    stats_stop_minute: dict[str, int] = Field(default_factory=dict)  # broker → first minute it ships nothing
    failure_dropped_minutes: list[tuple[str, int]] = Field(default_factory=list)  # (topic, minute): never shipped
    failure_duplicated_minutes: list[tuple[str, int, float]] = Field(default_factory=list)  # (topic, min, s later)
    failure_late_minutes: list[tuple[str, int, float]] = Field(default_factory=list)  # (topic, min, s more)
    failure_stops: list[tuple[str, float, float]] = Field(default_factory=list)  # (topic, s stopped, s restarted)
    apply_delay_seconds: dict[str, float] = Field(default_factory=dict)  # per broker, s after the propagation
    broker_restarts: list[tuple[str, float]] = Field(default_factory=list)  # (broker, s): its limiter forgets
    governor_restart_second: float | None = Field(default=None, ge=0)  # the governor restarts at this second
    governor_down_seconds: float = Field(default=0.0, ge=0)  # ... after being down (killed) this long before it
    seed: int = 0  # the jitter's generator
    limiter_view: bool = False  # the observation mode: the admin sink's view of the limiters (module docstring)

    @property
    def regular(self) -> bool:
        return self == Irregularity()


def stats_landings(irr: Irregularity, brokers: list[str], minutes: int, default_delay: float,
                   ) -> list[tuple[float, int, str]]:
    """Every landing of a broker's stats file of one minute, ``(second it lands, minute, broker)``, sorted by
    landing time (then minute, broker). Raises ``ValueError`` for a broker that is not in ``brokers``."""
    named = set(irr.stats_delay_seconds) | set(irr.stats_stop_minute) | set(irr.apply_delay_seconds) | {
        b for b, *_ in irr.dropped_minutes} | {b for b, *_ in irr.duplicated_minutes} | {
        b for b, _ in irr.broker_restarts} | {b for b, *_ in irr.late_minutes}
    unknown = sorted(named - set(brokers))
    if unknown:
        raise ValueError(f"irregularity names unknown brokers {unknown} (known: {', '.join(brokers)})")
    rng = np.random.default_rng(irr.seed)
    jitter = rng.uniform(0.0, irr.stats_jitter_seconds, (len(brokers), minutes)) if irr.stats_jitter_seconds else \
        np.zeros((len(brokers), minutes))
    dropped = {(b, int(m)) for b, m in irr.dropped_minutes}
    again: dict = {}
    for b, m, later in irr.duplicated_minutes:
        again.setdefault((b, int(m)), []).append(float(later))
    stalled = {(b, int(m)): float(more) for b, m, more in irr.late_minutes}
    out = []
    for i, b in enumerate(brokers):
        delay = float(irr.stats_delay_seconds.get(b, default_delay))
        stop = irr.stats_stop_minute.get(b, minutes)
        for m in range(min(minutes, stop)):
            if (b, m) in dropped:
                continue
            first = (m + 1) * 60.0 + delay + float(jitter[i, m]) + stalled.get((b, m), 0.0)
            out.append((first, m, b))
            out += [(first + later, m, b) for later in again.get((b, m), ())]
    out.sort()
    return out


def stopped_shipper(broker: str, stopped: float, restarted: float, delay: float, minutes: int,
                    ) -> list[tuple[str, int, float]]:
    """Broker ``broker``'s stats shipper stopped at second ``stopped`` and restarted at ``restarted`` (seconds from
    the run's start), as :attr:`Irregularity.late_minutes` entries ``(broker, minute, s more than usual)``: each of
    the run's ``minutes`` minutes whose file would land in ``[stopped, restarted)`` (``delay``, the broker's
    ``stats_delay_seconds``, after its end) lands at the restart, plus the broker's jitter (filebeat resumes from its
    registry offset and ships the backlog at once). Seconds rounded to 0.1 s."""
    out = []
    for m in range(minutes):
        due = (m + 1) * 60.0 + delay
        if stopped <= due < restarted:
            out.append((broker, m, round(restarted - due, 1)))
    return out


class FailureShipping:
    """When the producers' send-failure lines land (module docstring, **Failure logs**): :meth:`landings` of a line,
    in seconds from the run's start. ``topics``: every topic a failure line of the run may name (the cluster's
    pairs' topics, ``%RETRY%<group>`` for a group, and the background trickle's); ``usual_seconds``:
    ``shipping.failures_seconds``. Raises ``ValueError`` for a gap naming a topic not in ``topics``."""

    def __init__(self, irr: Irregularity, topics, usual_seconds: float) -> None:
        named = {t for t, _ in irr.failure_dropped_minutes} | {t for t, *_ in irr.failure_duplicated_minutes} | {
            t for t, *_ in irr.failure_late_minutes} | {t for t, *_ in irr.failure_stops}
        unknown = sorted(named - set(topics))
        if unknown:
            raise ValueError(f"irregularity names unknown topics {unknown} (known: {', '.join(sorted(topics))})")
        self.usual = float(usual_seconds)
        self.topics = frozenset(named)  # the topics whose lines may land otherwise than usual
        self._dropped = {(t, int(m)) for t, m in irr.failure_dropped_minutes}
        self._late = {(t, int(m)): float(more) for t, m, more in irr.failure_late_minutes}
        self._again: dict = {}
        for t, m, later in irr.failure_duplicated_minutes:
            self._again.setdefault((t, int(m)), []).append(float(later))
        self._stops: dict = {}
        for t, a, b in irr.failure_stops:
            self._stops.setdefault(t, []).append((float(a), float(b)))

    def landings(self, topic: str, failed_at: float) -> tuple[float, ...]:
        """The seconds a line of ``topic`` whose send failed at ``failed_at`` (s from the run's start) lands at: once
        ``usual_seconds`` later, plus its minute's lateness; again the given seconds after that for a duplicated
        minute; moved to the restart when due while its shipper was stopped; ``()`` for a dropped minute."""
        key = (topic, int(failed_at // 60))
        if key in self._dropped:
            return ()
        first = failed_at + self.usual + self._late.get(key, 0.0)
        out = [first] + [first + later for later in self._again.get(key, ())]
        for a, b in self._stops.get(topic, ()):
            out = [b if a <= x < b else x for x in out]
        return tuple(out)

    def last_landing(self, minutes: int) -> float:
        """No line of a send that failed in the run's ``minutes`` minutes lands after this second."""
        later = max((sum(v) for v in self._again.values()), default=0.0)
        return max([minutes * 60.0 + self.usual + max(self._late.values(), default=0.0) + later]
                   + [b for stops in self._stops.values() for _, b in stops])


#: The sweep's share of cases observed through the limiter's own view (:attr:`Irregularity.limiter_view`), drawn
#: from a stream of its own: ``default_rng([seed, LIMITER_VIEW_STREAM])``, so a case's other draws do not move.
LIMITER_VIEW_SHARE = 1 / 3
LIMITER_VIEW_STREAM = zlib.crc32(b"limiter_view")


def observation(seed: int) -> dict[str, bool]:
    """Sweep case ``seed``'s observation mode as :class:`Irregularity` fields: ``{"limiter_view": True}`` for about
    :data:`LIMITER_VIEW_SHARE` of the cases, else ``{}`` (the file write-back alone, the default)."""
    view = np.random.default_rng([seed, LIMITER_VIEW_STREAM]).random() < LIMITER_VIEW_SHARE
    return {"limiter_view": True} if view else {}


def world_order(item: tuple[str, object]) -> tuple[bool, str]:
    """The order a case prints its world's fields in: the observation mode first, then by name."""
    return item[0] != "limiter_view", item[0]
