"""The scenario shapes: functions that edit a :class:`~pipelines.sim.world.World`'s rate arrays (traffic) and
name their :class:`~pipelines.sim.spec.Incident`, plus the :data:`SCENARIOS` registry. Renderers never see them.

The ``retry_storm`` scenario (article 001, ``docs/background.md``)
----------------------------------------------------------------------
Before the onset (default minute ``minutes * 2 // 3``) ``broker-a`` writes about ``culprit_broker_normal_put_per_min``
= 30,000 msgs/min (its topics are scaled to that; ``pugc-content`` is ``culprit_topic_tps`` = 330 msgs/s of it).
From the onset the group stops acknowledging: the consumer runs at its capacity ``culprit_consume_tps`` (790
msgs/s: the original topic at its put rate, the rest of the capacity spent on its own retry topic) and sends back
``storm_sendback_fraction`` of everything it consumes, so ``SNDBCK_PUT_NUMS [pugc-content@get-pugc-to-ai-consumer]``
and ``TOPIC_PUT_NUMS [%RETRY%get-pugc-to-ai-consumer]`` ≈ 785.32 TPS = SUM 47,119/min (the article's line),
``GROUP_GET_NUMS [%RETRY%…@…]`` jumps from ~1 to ~460 msgs/s, and the retry backlog grows (FALL_SIZE).
The article gives broker-a's write volume as 30,000 → 225,400 msgs/min (~7.5x) but attributes only the 47,119 of
the retry topic; RocketMQ's own stats explain no more (a send-back is written to ``SCHEDULE_TOPIC_XXXX`` without a
``BROKER_PUT_NUMS`` increment). The model therefore adds the remainder to broker-a's ``BROKER_PUT_NUMS`` as
*unattributed* writes (no topic line) so that no false culprit topic appears: during the storm broker-a's
``BROKER_PUT_NUMS`` ≈ 225,400/min while the sum of its ``TOPIC_PUT_NUMS`` lines is ≈ 77,000/min. Pull latency on
broker-a rises ``storm_latency_factor``-fold. From onset + 1 minute producers of broker-a's business topics get
``[TIMEOUT_CLEAN_QUEUE]broker busy`` (code 2, ``waitTimeMillsInSendQueue`` = 200 ms, §5) at about
``busy_failures_per_min`` per minute, in Java (``CODE: 2  DESC: … BROKER: ip:port`` + FAQ url, §6) and Go
(``CODE: 2, DESC: …``, §7) text, ``code`` null for ``null_code_share`` of them.
Every scenario also has a trickle of ordinary failures on every broker: ``RemotingTimeoutException: wait response on
the channel <ip:port> timeout, 3000(ms)`` / Go ``request timeout`` (code null) and a few ``TOPIC_NOT_EXIST`` (17).
``steady`` is the same cluster, same seed-drawn traffic and trickle, without the incident.

Send failures of the busy broker: :func:`pipelines.sim.failures.busy_broker_failures`; a scenario's send failures,
the trickle and its own: :func:`build_send_failures`. Add a scenario as a function here and an entry in
:data:`SCENARIOS`; :func:`scenario` looks one up by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from pipelines import rocketmq as rmq
from pipelines.sim.failures import (
    busy_broker_failures, business_topic_rates, empty_failures, finish_failures, trickle_failures,
)
from pipelines.sim.causes import _mix, second_spans, shape_compound, strength, truth_spans
from pipelines.sim.spec import Cause, Incident, ScenarioSpec, rng_streams
from pipelines.sim.world import World


ShapeFn = Callable[[ScenarioSpec, World, np.random.Generator], Incident | None]
FailureFn = Callable[[ScenarioSpec, pd.Series, Incident | None, np.random.Generator], pd.DataFrame]


@dataclass(frozen=True)
class Scenario:
    """A registered scenario.

    ``shape(spec, world, rng)`` edits the World's rate arrays in place and returns its :class:`Incident` (or None).
    ``failures(spec, topic_rates, incident, rng)`` (optional) returns extra send failures beyond the background
    trickle, built with :func:`pipelines.sim.failures.failure_frame`; ``topic_rates`` is the mean TOPIC_PUT_NUMS SUM per
    (broker, business topic). ``rng`` is the scenario's own stream, so extra draws never shift the catalog."""

    description: str
    shape: ShapeFn
    failures: FailureFn | None = None


def _prepare_article_cluster(spec: ScenarioSpec, world: World) -> None:
    """Size the culprit broker as in article 001: ``pugc-content`` at ``culprit_topic_tps`` and the other topics
    on that broker scaled so that its writes total ``culprit_broker_normal_put_per_min`` (best effort: no topic
    goes below ``base_tps_min``, so with thousands of topics the broker ends up larger)."""
    cb = spec.culprit_broker_index
    expected = world.topic_base_tps[world.pl_topic] * world.pl_share
    p0 = world.placement(0, cb)
    world.put_rate[p0] *= spec.culprit_topic_tps / expected[p0]
    others = np.flatnonzero((world.pl_broker == cb) & (world.pl_topic != 0))
    if others.size:
        budget = spec.culprit_broker_normal_put_per_min / 60.0 - spec.culprit_topic_tps
        target = np.maximum(expected[others] * budget / expected[others].sum(), spec.base_tps_min)
        world.put_rate[others] *= (target / expected[others])[:, None]
    world.sp_retry_fraction[world.subscription(0, p0)] = spec.culprit_normal_retry_fraction


def _shape_steady(spec: ScenarioSpec, world: World, rng: np.random.Generator) -> Incident | None:
    """The article-001 cluster on a quiet day: no incident."""
    _prepare_article_cluster(spec, world)
    return None


def _shape_retry_storm(spec: ScenarioSpec, world: World, rng: np.random.Generator) -> Incident:
    """Article 001: from the onset the culprit group sends back everything it consumes (see the module docstring)."""
    _prepare_article_cluster(spec, world)
    cb, o, T = spec.culprit_broker_index, spec.onset_index, spec.minutes
    n = T - o
    p0 = world.placement(0, cb)
    sp0, gb0 = world.subscription(0, p0), world.retry_topic(0, cb)
    consume = spec.culprit_consume_tps * (1.0 + rng.uniform(-spec.storm_noise, spec.storm_noise, n))
    world.sp_sendback_rate[sp0, o:] = consume * spec.storm_sendback_fraction
    world.gb_retry_get_rate[gb0, o:] = np.maximum(consume - world.put_rate[p0, o:], 0.0)
    unattributed = (spec.culprit_broker_storm_put_per_min - spec.culprit_broker_normal_put_per_min) / 60.0 \
        - spec.culprit_consume_tps * spec.storm_sendback_fraction
    noise = 1.0 + rng.uniform(-spec.storm_noise, spec.storm_noise, n)
    world.broker_unattributed_put_rate[cb, o:] = max(unattributed, 0.0) * noise
    world.broker_latency_factor[cb, o:] = spec.storm_latency_factor
    retry_tps = spec.culprit_consume_tps * spec.storm_sendback_fraction
    return Incident(
        kind="retry_storm", onset=spec.onset, culprit_group=spec.culprit_group, culprit_topic=spec.culprit_topic,
        culprit_broker=world.brokers[cb],
        detail=(f"{spec.culprit_group} stops acknowledging: ~{retry_tps:.0f} msgs/s sent back to "
                f"{rmq.RETRY_TOPIC_PREFIX}{spec.culprit_group} on {world.brokers[cb]}, broker writes "
                f"{spec.culprit_broker_normal_put_per_min}/min -> {spec.culprit_broker_storm_put_per_min}/min"),
    )


#: Broken-consumer scenarios fixed once (``storm_fix_minute``) and broken on and off.
FIXED_ONCE = {"storm_fixed", "storm_fixed_legit_retry", "storm_irregular_evidence"}
ON_AND_OFF = {"intermittent_storm", "intermittent_short", "intermittent_no_fallback"}
#: The persisting storm's shape under other names: the same storm in another world (pipelines.sim.settings
#: SCENARIO_WORLDS: consumer clients without the fallback send, a late shipper, a governor killed and restarted).
PERSISTING = {"persisting_storm", "spread_storm", "persisting_no_fallback", "storm_late_broker",
              "storm_governor_killed"}
#: Scenarios without a cause: the right answer is no limit.
NO_CAUSE = frozenset({"flash_sale", "legit_retry", "normal_day", "steady"})
#: Every scenario whose culprit is one broken consumer group's retry traffic (article 001's storm included).
STORM_SCENARIOS = frozenset(FIXED_ONCE | ON_AND_OFF | PERSISTING | {"retry_storm", "large_mix"})


def broken_minutes(spec: ScenarioSpec) -> np.ndarray:
    """Per minute of the run: whether the culprit group is broken (``persisting_storm`` from the onset to the end,
    ``storm_fixed`` and ``storm_fixed_legit_retry`` until ``storm_fix_minute``, ``intermittent_storm`` and
    ``intermittent_short`` ``storm_on_minutes`` on and ``storm_off_minutes`` off from the onset, ``storm_episodes``
    times; ``spread_storm`` like ``persisting_storm``)."""
    T, o = spec.minutes, spec.onset_index
    on = np.zeros(T, dtype=bool)
    on[o:] = True
    if spec.name in FIXED_ONCE:
        fix = spec.storm_fix_minute if spec.storm_fix_minute is not None else o + (T - o) // 2
        on[fix:] = False
    elif spec.name in ON_AND_OFF:
        period = spec.storm_on_minutes + spec.storm_off_minutes
        k = np.arange(T - o)
        on[o:] = (k % period) < spec.storm_on_minutes
        if spec.storm_episodes is not None:
            on[o:] &= k < spec.storm_episodes * period
    return on


def _spans(spec: ScenarioSpec, on: np.ndarray) -> tuple:
    """[start, end) UTC spans of the True runs of a per-minute mask."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], on.astype(np.int8), [0]])))
    start = pd.Timestamp(spec.start_utc)
    return tuple((start + pd.Timedelta(minutes=int(a)), start + pd.Timedelta(minutes=int(b)))
                 for a, b in zip(edges[0::2], edges[1::2]))


def _shape_broken_consumer(spec: ScenarioSpec, world: World, rng: np.random.Generator) -> Incident:
    """The culprit group consumes ``culprit_topic`` (``storm_consume_tps``, on ``culprit_topic_brokers`` brokers)
    and, while broken (:func:`broken_minutes`, each span from ``onset_second`` into its minute, ramped over
    ``ramp_minutes``, its fix at ``fix_second`` rolled out over ``rollout_minutes``: :func:`strength`), sends back
    ``storm_sendback_tps`` (1.5x what it consumes) to the broker each message came from; every send-back costs
    ``storm_write_amplification`` further broker writes (unattributed, as in article 001). This is the *demand*:
    what the brokers admit of it is the closed-loop cluster's business (:mod:`pipelines.sim.cluster`); a broken
    consumer keeps sending back whatever the limit (its rejected send-backs are re-consumed locally and sent back
    again)."""
    if spec.name == "spread_storm" and spec.culprit_topic_brokers < 3:
        raise ValueError(f"spread_storm needs culprit_topic_brokers >= 3, got {spec.culprit_topic_brokers}")
    spans = second_spans(spec, broken_minutes(spec), spec.name in FIXED_ONCE)
    level = strength(spec, spans)
    on = level > 0
    places = np.flatnonzero(world.pl_topic == 0)
    world.put_rate[places] *= spec.storm_consume_tps / world.put_rate[places].sum(axis=0).mean()
    n = int(on.sum())
    fine = np.zeros(spec.minutes, dtype=bool)
    fine[spec.onset_index:] = ~on[spec.onset_index:]
    for p in places.tolist():
        b = int(world.pl_broker[p])
        sendback = spec.storm_sendback_tps * world.pl_share[p] * (1.0 + rng.uniform(-spec.storm_noise,
                                                                                  spec.storm_noise, n))
        legit = spec.fixed_retry_share * world.put_rate[p, on]
        world.sp_sendback_rate[world.subscription(0, p), on] = _mix(sendback, legit, level[on])
        world.broker_unattributed_put_rate[b, on] += spec.storm_write_amplification * _mix(
            sendback, np.zeros(n), level[on])
        if spec.fixed_retry_share > 0:  # fixed, it still retries a legitimate few percent of what it consumes
            world.sp_sendback_rate[world.subscription(0, p), fine] = spec.fixed_retry_share * world.put_rate[p, fine]
    hosts = sorted(world.brokers[int(b)] for b in world.pl_broker[places])
    active = truth_spans(spec, spans)
    when = ", ".join(f"{a:%H:%M:%S}-{b:%H:%M:%S}" for a, b in active)
    cause = Cause("group", spec.culprit_group, "storm", active, spec.ramp_minutes * 60.0, True, tuple(hosts))
    return Incident(
        kind=spec.name, onset=spec.onset, culprit_group=spec.culprit_group, culprit_topic=spec.culprit_topic,
        culprit_broker=world.brokers[spec.culprit_broker_index], active=active, causes=(cause,),
        detail=(f"{spec.culprit_group} consumes {spec.storm_consume_tps:.0f} msgs/s of {spec.culprit_topic} on "
                f"{', '.join(hosts)} and sends back {spec.storm_sendback_tps:.0f} msgs/s while broken ({when} UTC)"),
    )


def _shape_legit_retry(spec: ScenarioSpec, world: World, rng: np.random.Generator) -> Incident:
    """The culprit group consumes ``culprit_topic`` (``storm_consume_tps``) and retries ``fixed_retry_share`` of
    what it consumes, from the start and throughout: legitimate retries (transient errors) under the rule's ratio,
    no cause: a correct governor never limits it."""
    places = np.flatnonzero(world.pl_topic == 0)
    world.put_rate[places] *= spec.storm_consume_tps / world.put_rate[places].sum(axis=0).mean()
    for p in places.tolist():
        world.sp_sendback_rate[world.subscription(0, p), :] = spec.fixed_retry_share * world.put_rate[p, :]
    return Incident(kind=spec.name, onset=spec.onset, culprit_group=spec.culprit_group,
                    culprit_topic=spec.culprit_topic, culprit_broker=world.brokers[spec.culprit_broker_index],
                    detail=f"{spec.culprit_group} retries {spec.fixed_retry_share:.0%} of what it consumes, "
                           "legitimately (no cause)")


def _flash_topic(spec: ScenarioSpec, world: World) -> int:
    """Index of the flash-sale topic (never the culprit topic 0 when there is another one)."""
    n = world.topic.size
    return min(max(spec.flash_topic_index, 1 if n > 1 else 0), n - 1)


def _apply_flash(spec: ScenarioSpec, world: World, t: int) -> None:
    """Scale topic ``t`` to ``flash_base_tps`` and ramp it linearly to ``flash_factor``× over ``flash_ramp_minutes``
    from the onset, then hold. Consumers keep up (GROUP_GET follows the put rate in :mod:`pipelines.sim.traffic`)."""
    rows = np.flatnonzero(world.pl_topic == t)
    current = world.put_rate[rows].sum(axis=0).mean()  # after any earlier rescaling (article cluster sizing)
    world.put_rate[rows] *= spec.flash_base_tps / current
    o, T = spec.onset_index, spec.minutes
    ramp = np.ones(T)
    k = np.arange(T - o)
    ramp[o:] = 1.0 + (spec.flash_factor - 1.0) * np.minimum((k + 1) / max(spec.flash_ramp_minutes, 1), 1.0)
    world.put_rate[rows] *= ramp[None, :]


def _shape_flash_sale(spec: ScenarioSpec, world: World, rng: np.random.Generator) -> Incident:
    """A business topic ramps to ``flash_factor``× (5x) over ``flash_ramp_minutes`` (10) on healthy brokers; its
    consumers keep up; no broker is busy. The right answer is *no* limit below the peak."""
    _prepare_article_cluster(spec, world)
    t = _flash_topic(spec, world)
    _apply_flash(spec, world, t)
    hosts = sorted({world.brokers[b] for b in world.pl_broker[world.pl_topic == t]})
    return Incident(kind="flash_sale", onset=spec.onset, culprit_group=None, culprit_topic=str(world.topic[t]),
                    culprit_broker=None,
                    detail=(f"{world.topic[t]} ramps {spec.flash_base_tps:.0f} -> "
                            f"{spec.flash_base_tps * spec.flash_factor:.0f} msgs/s over {spec.flash_ramp_minutes} "
                            f"minutes on {', '.join(hosts)} (healthy, consumers keep up)"))


def _noisy_topic(spec: ScenarioSpec, world: World) -> int:
    """A business topic hosted by the culprit broker alone, other than the culprit topic when possible."""
    cb = spec.culprit_broker_index
    counts = np.bincount(world.pl_topic, minlength=world.topic.size)
    for t in world.pl_topic[world.pl_broker == cb].tolist():
        if t != 0 and counts[t] == 1:
            return int(t)
    return 0


def _shape_noisy_neighbour(spec: ScenarioSpec, world: World, rng: np.random.Generator) -> Incident:
    """One topic on ``broker-a`` jumps from ``noisy_base_tps`` to ``noisy_put_tps`` at the onset and saturates the
    broker it shares with the others (its producers hit ``[TIMEOUT_CLEAN_QUEUE]``, see :func:`busy_broker_failures`)."""
    _prepare_article_cluster(spec, world)
    cb, o, T = spec.culprit_broker_index, spec.onset_index, spec.minutes
    t = _noisy_topic(spec, world)
    p = world.placement(t, cb)
    world.put_rate[p] *= spec.noisy_base_tps / world.put_rate[p].mean()
    e = T if spec.noisy_minutes is None else min(T, o + spec.noisy_minutes)
    minutes = np.zeros(T, dtype=bool)
    minutes[o:e] = True
    spans = second_spans(spec, minutes, fixed_once=True)
    level = strength(spec, spans)
    on = level > 0
    full = spec.noisy_put_tps * (1.0 + rng.uniform(-spec.storm_noise, spec.storm_noise, int(on.sum())))
    world.put_rate[p, on] = _mix(full, world.put_rate[p, on], level[on])
    active = truth_spans(spec, spans)
    cause = Cause("topic", str(world.topic[t]), "surge", active, spec.ramp_minutes * 60.0, True, (world.brokers[cb],))
    return Incident(kind="noisy_neighbour", onset=spec.onset, culprit_group=None, culprit_topic=str(world.topic[t]),
                    culprit_broker=world.brokers[cb], active=active, causes=(cause,),
                    detail=(f"{world.topic[t]} jumps {spec.noisy_base_tps:.0f} -> {spec.noisy_put_tps:.0f} msgs/s on "
                            f"{world.brokers[cb]}, which it shares with {int((world.pl_broker == cb).sum()) - 1} "
                            "other topics"))


def _diurnal(spec: ScenarioSpec, T: int) -> np.ndarray:
    day = spec.day_minutes or T
    return 1.0 + spec.diurnal_amplitude * np.sin(2 * np.pi * (np.arange(T) / day - 0.25))


def _shape_normal_day(spec: ScenarioSpec, world: World, rng: np.random.Generator) -> None:
    """A diurnal curve (``diurnal_amplitude``, trough at the start, peak mid-run) with the usual noise, and one
    broker restart at ``restart_minute``: its first minute after the restart prints ``SUM: 0 TPS: NaN``.
    No incident: the right answer is no limit at all."""
    _prepare_article_cluster(spec, world)
    world.put_rate *= _diurnal(spec, spec.minutes)[None, :]
    b = min(spec.restart_broker_index, spec.brokers - 1)
    r = spec.restart_minute if spec.restart_minute is not None else spec.minutes // 2
    restart = np.zeros((spec.brokers, spec.minutes), dtype=bool)
    if 0 < r < spec.minutes:
        restart[b, r] = True
    world.broker_restart = restart
    return None


def _shape_large_mix(spec: ScenarioSpec, world: World, rng: np.random.Generator) -> Incident:
    """A large cluster (use with ~10,000 topics, 50 brokers): a diurnal curve everywhere, the article-001 retry
    storm on ``broker-a`` and a flash sale of ``flash_topic_index`` (moved off ``broker-a`` when it is there)."""
    world.put_rate *= _diurnal(spec, spec.minutes)[None, :]
    incident = _shape_retry_storm(spec, world, rng)
    t = _flash_topic(spec, world)
    if t != 0:
        _apply_flash(spec, world, t)
    return Incident(kind="large_mix", onset=incident.onset, culprit_group=incident.culprit_group,
                    culprit_topic=incident.culprit_topic, culprit_broker=incident.culprit_broker,
                    detail=f"{incident.detail}; flash sale of {world.topic[t]} at the same onset")


#: Registered scenarios. Add new ones as functions here.
SCENARIOS: dict[str, Scenario] = {
    "retry_storm": Scenario("article 001: a consumer group that never acks floods its broker with retries",
                            _shape_retry_storm, busy_broker_failures),
    "steady": Scenario("the same cluster and traffic without an incident", _shape_steady, None),
    "flash_sale": Scenario("a topic ramps 5x over 10 minutes on healthy brokers, consumers keep up",
                           _shape_flash_sale, None),
    "noisy_neighbour": Scenario("one topic saturates the broker it shares with others", _shape_noisy_neighbour,
                                busy_broker_failures),
    "normal_day": Scenario("diurnal traffic with noise and one broker restart (NaN first minute), no incident",
                           _shape_normal_day, None),
    "persisting_storm": Scenario("a consumer group sends back 1.5x what it consumes from the onset to the end "
                                 "(its retry topic on culprit_topic_brokers brokers)", _shape_broken_consumer, None),
    "storm_fixed": Scenario("the persisting storm, fixed at storm_fix_minute", _shape_broken_consumer, None),
    "storm_fixed_legit_retry": Scenario("the persisting storm, fixed at storm_fix_minute, after which the group "
                                        "still retries fixed_retry_share of what it consumes",
                                        _shape_broken_consumer, None),
    "intermittent_storm": Scenario("the persisting storm on and off (storm_on_minutes / storm_off_minutes)",
                                   _shape_broken_consumer, None),
    "intermittent_short": Scenario("the persisting storm on and off, its quiet spells shorter than a lift takes",
                                   _shape_broken_consumer, None),
    "noisy_neighbour_long": Scenario("one topic saturates the broker it shares with others for noisy_minutes",
                                     _shape_noisy_neighbour, busy_broker_failures),
    "spread_storm": Scenario("the persisting storm on a topic spread over culprit_topic_brokers (>= 3) brokers",
                             _shape_broken_consumer, None),
    "persisting_no_fallback": Scenario("the persisting storm of consumer clients without the fallback send",
                                       _shape_broken_consumer, None),
    "storm_late_broker": Scenario("the persisting storm beside a broker that carries none of it and ships late",
                                  _shape_broken_consumer, None),
    "storm_governor_killed": Scenario("the persisting storm, the governor killed mid-storm and restarted later",
                                      _shape_broken_consumer, None),
    "intermittent_no_fallback": Scenario("the storm on and off with quiet spells shorter than a lift takes, consumer "
                                         "clients without the fallback send", _shape_broken_consumer, None),
    "storm_irregular_evidence": Scenario("a storm fixed to a legitimate retry level, its evidence late, missing and "
                                         "doubled on its own carriers", _shape_broken_consumer, None),
    "legit_retry": Scenario("a consumer group retrying fixed_retry_share of what it consumes throughout, under "
                            "the rule's ratio (no cause)", _shape_legit_retry, None),
    "compound": Scenario("several causes at once (spec.causes): storms of consumer groups and surges of topics",
                         shape_compound, None),
    "large_mix": Scenario("a large cluster (10,000 topics, 50 brokers): diurnal traffic, a retry storm and a flash "
                          "sale", _shape_large_mix, busy_broker_failures),
}


def scenario(name: str) -> Scenario:
    """The registered scenario ``name`` (:data:`SCENARIOS`).

    Raises:
        ValueError: unknown scenario (the message lists the known ones)."""
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r} (known: {', '.join(sorted(SCENARIOS))})")
    return SCENARIOS[name]


def build_send_failures(spec: ScenarioSpec, traffic: pd.DataFrame) -> pd.DataFrame:
    """Send failures (docs/contracts.md §1.2 columns :data:`FAILURE_COLUMNS`, then ``event_time`` (UTC) and
    ``expected_class`` (ground truth, not written)). ``ts`` is epoch millis (int) or, for ``iso_ts_share`` of
    rows, an ISO-8601 string ending in ``Z``; ``code`` is nullable. Sorted by time."""
    rng = rng_streams(spec.seed)["failures"]
    rates = business_topic_rates(traffic)
    incident = traffic.attrs.get("incident")
    frames = [trickle_failures(spec, rates, rng)]
    extra = scenario(spec.name).failures
    if extra is not None:
        frames.append(extra(spec, rates, incident, rng))
    frames = [f for f in frames if len(f)]
    if not frames:
        return empty_failures()
    return finish_failures(spec, pd.concat(frames, ignore_index=True), rng)
