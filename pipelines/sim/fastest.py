"""The earliest the pipeline can put a limit in force after a cause shows, for the sweep's verdict
(:func:`pipelines.sim.sweep.verdict`) and the overrides' checks (:mod:`pipelines.sim.overrides`): from a cause's
first whole minute (:func:`fastest_in_force`), for a storm under way when the governor starts on a new lake
(:func:`cold_start_target`), and the minutes more a cause's carriers' missing stats cost (:func:`unseen_minutes`,
:func:`episode_fastest`). Each from the shipped settings and the case's world (its shipping and apply delays, its
dropped and late minutes).
"""

from __future__ import annotations

import numpy as np

from pipelines.sim.draws import Case


def fastest_in_force(case: Case, cfg=None, bcfg=None, timing=None, carriers=None) -> float:
    """The earliest a limit can be in force after a cause that shows first in a minute's stats lines (s from the
    cause's first whole minute): the minute's lines land the slowest of its brokers' shipping delays after its end
    (``shipping.stats_seconds``, or the case's world: delay + jitter), the next ingest trigger
    (``windows.trigger_seconds``) writes them ``Timing.ingest_seconds`` later, the next fast trigger
    (``windows.fast_trigger_seconds``) decides, published ``Timing.fast_seconds`` later, in force after the
    propagation delay and the first of its brokers to apply it. 72.5 s + propagation with the shipped
    settings. A limit is in force only at a broker carrying its resource: with ``carriers`` (each required
    cause's brokers, :attr:`pipelines.sim.figures.Figures.carriers`), the first of each cause's carriers to apply
    it, for the slowest cause (``onset_to_limit_in_force`` is the slowest cause's); without, the first broker."""
    from pipelines.sim.settings import governor_config, load_backtest_config
    from pipelines.sim.loop import Timing

    bcfg = bcfg or load_backtest_config("conf/backtest.toml")
    cfg = cfg or governor_config(bcfg, None, None)
    timing = timing or Timing()
    w = cfg.windows
    irr = case.irregular
    delays = irr.get("stats_delay_seconds", {})
    ship = max([bcfg.shipping.stats_seconds] + [delays.get(b, bcfg.shipping.stats_seconds) for b in case.hosts]) \
        + irr.get("stats_jitter_seconds", 0.0)
    delay = irr.get("apply_delay_seconds", {})
    apply = min([delay.get(b, 0.0) for b in case.hosts] or [0.0])
    if carriers:
        apply = max(min(delay.get(b, 0.0) for b in brokers) for brokers in carriers.values() if brokers)
    ingest = -(-(60 + ship) // w.trigger_seconds) * w.trigger_seconds + timing.ingest_seconds
    fast = -(-ingest // w.fast_trigger_seconds) * w.fast_trigger_seconds
    return fast + timing.fast_seconds + case.propagation_seconds + apply


def cold_start_target(case: Case, cfg=None, bcfg=None) -> float:
    """A storm under way when the governor starts on a new lake (kind ``cold_start``): the limit is in force at
    most this many seconds after the governor's start (the run's first second). Why this target: the fast path
    judges a ratio rule on an open window only once it is complete by census against the brokers of the newest
    finalized window, and a new lake has none; the first window (minute 0) is final once the watermark
    (``windows.watermark_seconds``) has passed its end and the next gold trigger ran: 60 s + the watermark + one
    trigger. From there the usual 100 s, and the propagation delay."""
    from pipelines.sim.settings import governor_config, load_backtest_config

    bcfg = bcfg or load_backtest_config("conf/backtest.toml")
    cfg = cfg or governor_config(bcfg, None, None)
    w = cfg.windows
    return 60.0 + w.watermark_seconds + w.trigger_seconds + 100.0 + case.propagation_seconds


def unseen_minutes(case: Case, carriers: dict, clock_s: float) -> float:
    """How many minutes (fractional) after it would usually land the stats the governor reads first hold the minute
    starting ``clock_s`` (s from the run's start; NaN: 0) or a later one from every broker carrying a required cause
    (``carriers``: resource → brokers; none: 0). A minute some carrier's shipper dropped, or shipped more than a
    minute late (Spark counts it late or not at all), does not show, and the next minute stands for it a minute later; a
    minute shipped up to a minute late (a shipper that stalled, or was stopped and restarted with its backlog,
    :func:`pipelines.sim.irregular.stopped_shipper`) shows that many seconds later, the latest of its carriers'. A
    cause cannot show in a minute its carriers did not ship, nor before its lines land. Gaps in the failure logs are
    not counted: whether one hides a busy carrier (``BROKER_BUSY``, which a surge's enforcement waits for) depends on
    how many busy lines the carrier's other topics still ship against ``detection.busy_failures_floor``, which the
    world's parameters alone do not say."""
    if not np.isfinite(clock_s) or not carriers:
        return 0
    brokers = {b for bs in carriers.values() for b in bs}
    gone = {(b, int(m)) for b, m in case.irregular.get("dropped_minutes", [])}
    late = {(b, int(m)): float(more) for b, m, more in case.irregular.get("late_minutes", [])}
    m, count = int(clock_s // 60), 0
    while True:
        if not any((b, m + count) in gone or late.get((b, m + count), 0.0) > 60.0 for b in brokers):
            return count + max(late.get((b, m + count), 0.0) for b in brokers) / 60.0
        count += 1


def episode_fastest(case: Case, figures, key: str, fastest: float) -> float:
    """The fastest possible limit in force (s from its clock) of the episode whose figure is ``key``
    (``onset_to_limit_in_force_episode_<k>``): ``fastest``, a minute more per minute its carriers did not ship at
    its start (:func:`unseen_minutes`); at least the onset target, so an episode within it passes."""
    k = key.rsplit("_", 1)[-1]
    clock = figures.values.get(f"onset_clock_s_episode_{k}", (float("nan"),))[0]
    return max(fastest + 60.0 * unseen_minutes(case, figures.carriers, clock), 100.0)
