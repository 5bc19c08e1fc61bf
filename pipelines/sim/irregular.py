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
  ``stats_stop_minute[b]`` on, broker ``b`` ships nothing (a dead shipper). What Spark does with each (late rows
  behind the watermark dropped, a line shipped twice counted once) is :mod:`pipelines.sim.windows`' business.
* **Applying** (:class:`pipelines.sim.loop.Broker`): broker ``b`` applies a publication ``propagation_seconds`` +
  ``apply_delay_seconds[b]`` after it was published; at each ``(b, second)`` of ``broker_restarts`` its limiter
  forgets every limit until the next publication reaches it (Sohu's limiter keeps its records in memory; the
  applier pushes again only on the next publication).
* **The governor** restarted at ``governor_restart_second``: its decisions' memory is read back from the lake
  (``state/policy`` and ``gold/limits`` rows through their Arrow schemas) and the fast path's open-row memory
  (driver memory, :class:`pipelines.decide.fast.OpenRows`) is lost; Spark's streaming state (the windows) is
  restored from the checkpoint, so the windowed sums go on. Killed ``governor_down_seconds`` before it (SIGKILL,
  no shutdown), it runs no micro-batch in between: the brokers keep the limits last published until they expire,
  and what landed meanwhile is its first micro-batches' backlog.
* **What the governor observes** (issue 48): ``limiter_view`` False is the file write-back alone, where a limiter's
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
