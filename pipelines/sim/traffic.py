"""Layer 3 of the model: a :class:`~pipelines.sim.world.World` (after its scenario) → the model frame of every
stats line (:func:`build_traffic`), and the hour/day lines derived from it (:func:`build_period_rows`).

3. **Realisation** into the model frame of :func:`build_traffic`, one row per
   (minute, broker, stat_name, stats_key) — the numbers RocketMQ would print (``docs/rocketmq-formats.md`` §2-3):

   * ``TOPIC_PUT_NUMS`` / ``TOPIC_PUT_SIZE`` per hosted topic (AVGPT 1.00 msgs per put; SIZE: SUM = bytes,
     TPS = bytes/s, AVGPT = bytes per put).
   * ``GROUP_GET_NUMS`` / ``GROUP_GET_SIZE`` per ``topic@group``: the group keeps up with the put rate
     (``1 ± get_noise``); AVGPT = msgs (bytes) per pull, a pull returning at most ``max_msgs_per_pull`` (32).
   * ``SNDBCK_PUT_NUMS`` per ``topic@group``: a fraction in [0, ``normal_retry_fraction_max``] (0-1 %) of the
     consumed messages for ``retrying_subscription_share`` of the subscriptions. The key keeps the *original*
     topic even for retries of retries (``PROPERTY_RETRY_TOPIC``, §3). Every sent-back message is re-put into
     ``%RETRY%<group>`` on the same broker when its delay level expires (ScheduleMessageService increments
     ``TOPIC_PUT_NUMS`` and ``BROKER_PUT_NUMS`` for that re-put), and the group consumes it again
     (``GROUP_GET_NUMS [%RETRY%g@g]``). Delay levels (10 s … 2 h) are ignored: the re-put lands in the same minute.
   * ``GROUP_GET_LATENCY`` per ``queueId@topic@group`` (``queues_per_topic`` = 4 queues, 1 for retry topics):
     ``TIMES: n AVGRT: x`` on brokers >= 4.9.3 (odd broker indexes: ``broker-b``, ``broker-d`` …) and
     ``SUM/TPS/AVGPT`` (SUM = total ms, AVGPT = ms per pull) on <= 4.9.2 brokers (even indexes: ``broker-a`` …) (§2).
   * ``GROUP_GET_FALL_SIZE`` ``Stats Every 5 Minutes, Value: n`` per ``queueId@topic@group`` at stamps whose minute
     is a multiple of 5: bytes behind (a random lag for ``lagging_queue_share`` of the queues; the real retry
     backlog for retry topics). The model row of a 5-minute line has ``minute_start`` = stamp − 1 min.
   * ``BROKER_PUT_NUMS`` / ``BROKER_GET_NUMS`` keyed by the cluster name (``brokerClusterName``, not the broker),
     AVGPT 0.00 (value only, times never incremented); SUM = the broker's topic puts / gets ± ``broker_stat_jitter``
     (different item, different sampling instants: real logs show 1290 vs 1291), plus any unattributed writes.

   Items are created lazily (§2): a series prints from the first minute it has traffic, then every minute (SUM 0
   when idle). The first minute of every broker is its start: every minute line prints
   ``SUM: 0 TPS: NaN AVGPT: 0.00`` (``TIMES: 0 AVGRT: 0.00``), as seen in real logs (§2, §8).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pandas as pd

from pipelines import rocketmq as rmq
from pipelines.sim.scenarios import scenario
from pipelines.sim.spec import (
    MINUTE,
    PERIOD_TEXT,
    STYLE_SUM,
    STYLE_TIMES,
    STYLE_VALUE,
    ScenarioSpec,
    rng_streams,
)
from pipelines.sim.world import World, build_world, latency_style

#: Columns of the model frame returned by :func:`build_traffic`.
TRAFFIC_COLUMNS: tuple[str, ...] = (
    "minute_start", "broker", "stat_name", "stats_key", "period", "style", "sum", "tps", "avgpt", "times",
)


def _count(x: np.ndarray) -> np.ndarray:
    """Non-negative integer counts (NaN → 0)."""
    return np.rint(np.clip(np.nan_to_num(x, nan=0.0), 0.0, None)).astype(np.int64)


def _expand(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For series with ``counts[j]`` sub-items: (series index, sub-item index 0..counts[j]-1) per sub-item."""
    j = np.repeat(np.arange(counts.size), counts)
    q = np.arange(j.size) - np.repeat(np.cumsum(counts) - counts, counts)
    return j, q


@dataclass
class _Block:
    stat: str
    period: str
    style: np.ndarray  # (n,) per series
    broker: np.ndarray  # (n,) broker index
    key: np.ndarray  # (n,) stats key
    sums: np.ndarray  # (n, T) int64
    times: np.ndarray  # (n, T) int64
    emit: np.ndarray  # (n, T) bool


def _lazy(active: np.ndarray) -> np.ndarray:
    """Items are created on first increment and print every minute afterwards (docs/rocketmq-formats.md §2)."""
    return np.logical_or.accumulate(active, axis=1)


def _noisy(rng: np.random.Generator, amp: float, shape: tuple[int, ...]) -> np.ndarray:
    """Multiplicative noise, uniform in ``1 ± amp``."""
    return 1.0 + rng.uniform(-amp, amp, shape)


class _Flows(NamedTuple):
    """Messages per minute, (series, T) int64: puts per placement (``put``), consumption (``get``) and send-backs
    (``sndbck``) per subscription, retry-topic re-puts (``retry_put``) and their consumption (``retry_get``) per
    group × broker."""

    put: np.ndarray
    get: np.ndarray
    sndbck: np.ndarray
    retry_put: np.ndarray
    retry_get: np.ndarray


class _Gets(NamedTuple):
    """The consumption series (subscriptions, then retry topics): broker index, ``topic@group`` key, queues, bytes
    per message, msgs per minute (``sums``), pulls per minute and the index of the first retry series (``n_sp``)."""

    broker: np.ndarray
    key: np.ndarray
    queues: np.ndarray
    bytes: np.ndarray
    sums: np.ndarray
    pulls: np.ndarray
    n_sp: int


def _realise(world: World, rng: np.random.Generator) -> list[_Block]:
    """The World's rates → the blocks of every stats line series (module docstring, **Realisation**), drawing the
    noise from ``rng`` in a fixed order: consumption, send-backs, retry consumption, sizes, pull latency, lag, the
    broker totals."""
    flows = _flows(world, rng)
    topic_blocks, tp_broker, tp_sum = _topic_blocks(world, flows, rng)
    gets = _gets(world, flows)
    get_blocks = _get_blocks(world, gets, rng)
    sp_broker = world.pl_broker[world.sp_place]
    sndbck = _Block(rmq.SNDBCK_PUT_NUMS, "minute", _sum_style(gets.n_sp), sp_broker, gets.key[:gets.n_sp],
                    flows.sndbck, flows.sndbck, _lazy(flows.sndbck > 0))
    queue_blocks = _queue_blocks(world, flows, gets, rng)
    broker_blocks = _broker_blocks(world, tp_broker, tp_sum, gets, rng)
    return topic_blocks + get_blocks + [sndbck] + queue_blocks + broker_blocks


def _sum_style(n: int) -> np.ndarray:
    return np.full(n, STYLE_SUM, dtype=object)


def _flows(world: World, rng: np.random.Generator) -> _Flows:
    """Puts of business topics, consumption (keeping up, ``1 ± get_noise``), send-backs (steady or the scenario's),
    retry re-puts and retry consumption."""
    s, T = world.spec, world.T
    put = _count(world.put_rate * 60.0)  # (P, T)
    get = _count(put[world.sp_place] * _noisy(rng, s.get_noise, (world.sp_place.size, T)))
    steady_sb = get * world.sp_retry_fraction[:, None] * _noisy(rng, s.put_noise, get.shape)
    sndbck = np.where(np.isnan(world.sp_sendback_rate), _count(steady_sb), _count(world.sp_sendback_rate * 60.0))
    retry_put = np.zeros((world.gb_group.size, T), dtype=np.int64)
    np.add.at(retry_put, world.sp_gb, sndbck)
    keep_up = _count(retry_put * _noisy(rng, s.get_noise, retry_put.shape))
    retry_get = np.where(np.isnan(world.gb_retry_get_rate), keep_up, _count(world.gb_retry_get_rate * 60.0))
    return _Flows(put, get, sndbck, retry_put, retry_get)


def _retry_topics(world: World) -> np.ndarray:
    return np.array([rmq.RETRY_TOPIC_PREFIX + g for g in world.group[world.gb_group]], dtype=object)


def _topic_blocks(world: World, flows: _Flows, rng: np.random.Generator,
                  ) -> tuple[list[_Block], np.ndarray, np.ndarray]:
    """TOPIC_PUT_NUMS / TOPIC_PUT_SIZE of business and retry topics; → (the blocks, their broker index, their
    msgs per minute)."""
    s, topic = world.spec, world.topic
    tp_sum = np.vstack([flows.put, flows.retry_put])
    tp_broker = np.concatenate([world.pl_broker, world.gb_broker])
    tp_key = np.concatenate([topic[world.pl_topic], _retry_topics(world)])
    tp_bytes = np.concatenate([world.topic_bytes[world.pl_topic], world.gb_bytes])
    tp_size = _count(tp_sum * tp_bytes[:, None] * _noisy(rng, s.size_noise, tp_sum.shape))
    tp_emit = _lazy(tp_sum > 0)
    return [_Block(rmq.TOPIC_PUT_NUMS, "minute", _sum_style(tp_key.size), tp_broker, tp_key, tp_sum, tp_sum, tp_emit),
            _Block(rmq.TOPIC_PUT_SIZE, "minute", _sum_style(tp_key.size), tp_broker, tp_key, tp_size, tp_sum,
                   tp_emit)], tp_broker, tp_sum


def _gets(world: World, flows: _Flows) -> _Gets:
    """The consumption series and their pulls: a pull returns at most ``max_msgs_per_pull``, a busy queue pulled
    ``max_pulls_per_queue_per_s`` times a second."""
    s = world.spec
    gg_sum = np.vstack([flows.get, flows.retry_get])
    gg_broker = np.concatenate([world.pl_broker[world.sp_place], world.gb_broker])
    gg_group = np.concatenate([world.group[world.sp_group], world.group[world.gb_group]])
    gg_topic = np.concatenate([world.topic[world.pl_topic[world.sp_place]], _retry_topics(world)])
    gg_key = np.array([f"{t}@{g}" for t, g in zip(gg_topic, gg_group)], dtype=object)
    gg_queues = np.concatenate([np.full(world.sp_place.size, s.queues_per_topic),
                                np.full(world.gb_group.size, s.retry_queues)]).astype(np.int64)
    gg_bytes = np.concatenate([world.topic_bytes[world.pl_topic[world.sp_place]], world.gb_bytes])
    batch = np.clip(gg_sum / 60.0 / (gg_queues[:, None] * s.max_pulls_per_queue_per_s), 1.0, s.max_msgs_per_pull)
    pulls = np.where(gg_sum > 0, np.ceil(gg_sum / batch), 0).astype(np.int64)
    return _Gets(gg_broker, gg_key, gg_queues, gg_bytes, gg_sum, pulls, world.sp_place.size)


def _get_blocks(world: World, g: _Gets, rng: np.random.Generator) -> list[_Block]:
    """GROUP_GET_NUMS / GROUP_GET_SIZE (pulls = "times")."""
    size = _count(g.sums * g.bytes[:, None] * _noisy(rng, world.spec.size_noise, g.sums.shape))
    emit = _lazy(g.sums > 0)
    return [_Block(rmq.GROUP_GET_NUMS, "minute", _sum_style(g.key.size), g.broker, g.key, g.sums, g.pulls, emit),
            _Block(rmq.GROUP_GET_SIZE, "minute", _sum_style(g.key.size), g.broker, g.key, size, g.pulls, emit)]


def _queue_blocks(world: World, flows: _Flows, g: _Gets, rng: np.random.Generator) -> list[_Block]:
    """GROUP_GET_LATENCY and GROUP_GET_FALL_SIZE per ``queueId@topic@group``: a queue's share of the pulls at the
    subscription's latency (× its broker's factor, ``1 ± pull_rt_noise``); bytes behind every
    ``fall_print_every_minutes``: a random lag for lagging queues, the retry backlog for retry queues."""
    s, T = world.spec, world.T
    j, q = _expand(g.queues)
    q_pulls = g.pulls[j] // g.queues[j, None] + (q[:, None] < g.pulls[j] % g.queues[j, None])
    rt_base = np.concatenate([world.sp_rt_ms, world.gb_rt_ms])[j]
    rt = rt_base[:, None] * world.broker_latency_factor[g.broker[j]] * _noisy(rng, s.pull_rt_noise, q_pulls.shape)
    lat_ms = _count(q_pulls * rt)
    q_key = np.array([f"{qq}@{k}" for qq, k in zip(q.tolist(), g.key[j])], dtype=object)
    lat_style = np.array([latency_style(b) for b in g.broker[j].tolist()], dtype=object)

    lag_draw = rng.uniform(0.0, s.lag_seconds_max, q_pulls.shape)
    n_sp = g.n_sp
    lagging = np.concatenate([world.sp_lagging, np.zeros(world.gb_group.size, dtype=bool)])[j]
    per_queue_rate = g.sums[j] / 60.0 / g.queues[j, None]
    fall = np.where(lagging[:, None], per_queue_rate * lag_draw * g.bytes[j, None], 0.0)
    backlog = np.zeros((world.gb_group.size, T))
    level = np.zeros(world.gb_group.size)
    for m in range(T):  # retry backlog: what was re-put and not consumed yet (O(T) vector steps)
        level = np.maximum(level + flows.retry_put[:, m] - flows.retry_get[:, m], 0.0)
        backlog[:, m] = level
    is_retry_queue = j >= n_sp
    fall[is_retry_queue] = backlog[j[is_retry_queue] - n_sp] * world.gb_bytes[j[is_retry_queue] - n_sp, None]
    stamps = world.minute_starts + MINUTE
    tick = np.asarray(stamps.minute % s.fall_print_every_minutes == 0)
    fall_sum = _count(fall) * tick[None, :]
    fall_sum[:, 0] = 0  # nothing measured yet at broker start
    fall_emit = _lazy(fall_sum > 0) & tick[None, :]
    return [_Block(rmq.GROUP_GET_LATENCY, "minute", lat_style, g.broker[j], q_key, lat_ms, q_pulls, _lazy(q_pulls > 0)),
            _Block(rmq.GROUP_GET_FALL_SIZE, "5min", np.full(q_key.size, STYLE_VALUE, dtype=object), g.broker[j],
                   q_key, fall_sum, np.zeros_like(fall_sum), fall_emit)]


def _broker_blocks(world: World, tp_broker: np.ndarray, tp_sum: np.ndarray, g: _Gets,
                   rng: np.random.Generator) -> list[_Block]:
    """BROKER_PUT_NUMS / BROKER_GET_NUMS (cluster key, AVGPT 0.00): a broker's topic puts (plus its unattributed
    writes) and gets, ``1 ± broker_stat_jitter``."""
    s, T, B = world.spec, world.T, len(world.brokers)
    b_put = np.zeros((B, T))
    np.add.at(b_put, tp_broker, tp_sum)
    b_put += world.broker_unattributed_put_rate * 60.0
    b_get = np.zeros((B, T))
    np.add.at(b_get, g.broker, g.sums)
    b_put = _count(b_put * _noisy(rng, s.broker_stat_jitter, b_put.shape))
    b_get = _count(b_get * _noisy(rng, s.broker_stat_jitter, b_get.shape))
    b_idx = np.arange(B)
    b_key = np.full(B, s.cluster, dtype=object)
    always = np.ones((B, T), dtype=bool)
    return [_Block(rmq.BROKER_PUT_NUMS, "minute", _sum_style(B), b_idx, b_key, b_put, np.zeros_like(b_put), always),
            _Block(rmq.BROKER_GET_NUMS, "minute", _sum_style(B), b_idx, b_key, b_get, np.zeros_like(b_get), always)]


_STYLES: tuple[str, ...] = (STYLE_SUM, STYLE_TIMES, STYLE_VALUE)
_PERIODS: tuple[str, ...] = tuple(PERIOD_TEXT)


def _flatten(world: World, blocks: list[_Block]) -> pd.DataFrame:
    """Blocks → long model frame (string columns as categoricals: millions of rows share a few thousand keys),
    with the broker-start rule (minute 0: SUM 0, TPS NaN, AVGPT 0) applied."""
    key_codes, key_cats = pd.factorize(np.concatenate([blk.key for blk in blocks]))
    style_index = {st: i for i, st in enumerate(_STYLES)}
    parts: dict[str, list[np.ndarray]] = {c: [] for c in ("m", "broker", "stat", "key", "period", "style", "sum",
                                                          "times")}
    offset = 0
    for bi, blk in enumerate(blocks):
        series_key = key_codes[offset:offset + blk.key.size]
        offset += blk.key.size
        series_style = np.array([style_index[x] for x in blk.style.tolist()], dtype=np.int8)
        ii, mm = np.nonzero(blk.emit)
        parts["m"].append(mm)
        parts["broker"].append(blk.broker[ii].astype(np.int32))
        parts["stat"].append(np.full(ii.size, bi, dtype=np.int8))
        parts["key"].append(series_key[ii].astype(np.int32))
        parts["period"].append(np.full(ii.size, _PERIODS.index(blk.period), dtype=np.int8))
        parts["style"].append(series_style[ii])
        parts["sum"].append(blk.sums[ii, mm])
        parts["times"].append(blk.times[ii, mm])
    col = {k: np.concatenate(v) for k, v in parts.items()}
    order = np.lexsort((np.arange(col["m"].size), col["broker"], col["m"]))
    col = {k: v[order] for k, v in col.items()}
    m, style = col["m"], col["style"]
    sums, times = col["sum"].astype(np.int64), col["times"].astype(np.int64)
    start_minute = (m == 0) & (col["period"] == _PERIODS.index("minute"))
    sums[start_minute] = 0
    times[start_minute] = 0
    is_value = style == style_index[STYLE_VALUE]
    avgpt = np.where(times > 0, sums / np.maximum(times, 1), 0.0)
    avgpt[is_value] = np.nan
    tps = sums / 60.0
    tps[start_minute | is_value | (style == style_index[STYLE_TIMES])] = np.nan
    return pd.DataFrame({
        "minute_start": world.minute_starts[m],
        "broker": pd.Categorical.from_codes(col["broker"], categories=world.brokers),
        "stat_name": pd.Categorical.from_codes(col["stat"], categories=[blk.stat for blk in blocks]),
        "stats_key": pd.Categorical.from_codes(col["key"], categories=pd.Index(key_cats, dtype=object)),
        "period": pd.Categorical.from_codes(col["period"], categories=list(_PERIODS)),
        "style": pd.Categorical.from_codes(style, categories=list(_STYLES)),
        "sum": sums,
        "tps": tps,
        "avgpt": avgpt,
        "times": times,
    })


def build_traffic(spec: ScenarioSpec) -> pd.DataFrame:
    """The traffic *model*: one row per (minute_start UTC, broker, stat_name, stats_key), columns
    :data:`TRAFFIC_COLUMNS`: ``sum`` (int: msgs, bytes, total ms or the 5-minute value), ``tps`` (SUM/60, NaN at
    broker start and for TIMES/VALUE rows), ``avgpt`` (SUM/times), ``times`` (increments: puts, pulls), ``style``
    (SUM | TIMES | VALUE) and ``period`` (minute | 5min). ``frame.attrs["incident"]`` holds the scenario's
    :class:`Incident` or None. Hour and day lines are derived by :func:`build_period_rows`."""
    rngs = rng_streams(spec.seed)
    world = build_world(spec, rngs)
    incident = scenario(spec.name).shape(spec, world, rngs["scenario"])
    frame = _flatten(world, _realise(world, rngs["realise"]))
    if world.broker_restart is not None and world.broker_restart.any():
        frame = _apply_restarts(world, frame)
    frame.attrs["incident"] = incident
    return frame


def _apply_restarts(world: World, frame: pd.DataFrame) -> pd.DataFrame:
    """The broker-start rule at a restart: every minute line of a restarting broker in its restart minute prints
    ``SUM: 0 TPS: NaN AVGPT: 0.00`` (``TIMES: 0``), like minute 0 (docs/rocketmq-formats.md §2, §8)."""
    restart = world.broker_restart
    assert restart is not None
    b = frame["broker"].cat.codes.to_numpy()
    m = minute_index(world.spec, frame["minute_start"])
    hit = restart[b, m] & (frame["period"] == "minute").to_numpy()
    if hit.any():
        frame = frame.copy()
        frame.loc[hit, "sum"] = 0
        frame.loc[hit, "times"] = 0
        frame.loc[hit, "tps"] = np.nan
        frame.loc[hit, "avgpt"] = 0.0
    return frame


def minute_index(spec: ScenarioSpec, minute_start: pd.Series) -> np.ndarray:
    """Index of each ``minute_start`` (UTC) from the spec's first minute (0, 1, …)."""
    delta = minute_start - pd.Timestamp(spec.start_utc)
    return (delta // MINUTE).to_numpy(dtype=np.int64)


def build_period_rows(spec: ScenarioSpec, traffic: pd.DataFrame) -> pd.DataFrame:
    """``Stats In One Hour`` / ``Stats In One Day`` rows for TOPIC_PUT_NUMS, derived from the minute rows: at each
    hour boundary (stamp minute 0) the last 60 minutes, at midnight GMT+8 the last 24 h, limited to the time the
    broker has been up; TPS NaN (SUM 0) while the hour list (10-min snapshots) or day list (1-h snapshots) holds a
    single snapshot. Same columns as :func:`build_traffic`; ``minute_start`` = stamp − 1 min."""
    tp = traffic[(traffic["stat_name"] == rmq.TOPIC_PUT_NUMS) & (traffic["period"] == "minute")]
    T = spec.minutes
    stamps = pd.date_range(spec.start_utc, periods=T, freq="min") + MINUTE
    local = stamps + pd.Timedelta(hours=spec.gmt_offset_hours)
    hour_ticks = np.flatnonzero(np.asarray(local.minute == 0))
    day_ticks = np.flatnonzero(np.asarray((local.minute == 0) & (local.hour == 0)))
    if tp.empty or (hour_ticks.size == 0 and day_ticks.size == 0):
        return pd.DataFrame({c: pd.Series(dtype=traffic[c].dtype) for c in TRAFFIC_COLUMNS})
    codes = tp.groupby(["broker", "stats_key"], sort=False, observed=True).ngroup().to_numpy()
    n = int(codes.max()) + 1
    m = minute_index(spec, tp["minute_start"])
    sums = np.zeros((n, T), dtype=np.int64)
    times = np.zeros((n, T), dtype=np.int64)
    present = np.zeros((n, T), dtype=bool)
    sums[codes, m] = tp["sum"].to_numpy()
    times[codes, m] = tp["times"].to_numpy()
    present[codes, m] = True
    first = pd.Series(np.arange(len(tp))).groupby(codes).first().to_numpy()
    brokers = tp["broker"].to_numpy()[first]
    keys = tp["stats_key"].to_numpy()[first]
    csum = np.concatenate([np.zeros((n, 1), np.int64), np.cumsum(sums, axis=1)], axis=1)
    ctimes = np.concatenate([np.zeros((n, 1), np.int64), np.cumsum(times, axis=1)], axis=1)
    rows: list[pd.DataFrame] = []
    for period, ticks, window, min_up in (("hour", hour_ticks, 60, 10), ("day", day_ticks, 1440, 60)):
        for t in ticks.tolist():
            lo = max(0, t - window + 1)
            up = t + 1  # minutes the broker has been up at this stamp
            idx = np.flatnonzero(present[:, t])
            if up < min_up:
                s_ = np.zeros(idx.size, np.int64)
                tm = np.zeros(idx.size, np.int64)
                tps = np.full(idx.size, np.nan)
            else:
                s_ = csum[idx, t + 1] - csum[idx, lo]
                tm = ctimes[idx, t + 1] - ctimes[idx, lo]
                tps = s_ / ((t + 1 - lo) * 60.0)
            rows.append(pd.DataFrame({
                "minute_start": pd.DatetimeIndex([stamps[t] - MINUTE] * idx.size),
                "broker": brokers[idx], "stat_name": rmq.TOPIC_PUT_NUMS, "stats_key": keys[idx], "period": period,
                "style": STYLE_SUM, "sum": s_, "tps": tps,
                "avgpt": np.where(tm > 0, s_ / np.maximum(tm, 1), 0.0), "times": tm,
            }))
    if not rows:
        return pd.DataFrame({c: pd.Series(dtype=traffic[c].dtype) for c in TRAFFIC_COLUMNS})
    return pd.concat(rows, ignore_index=True)


def as_object(column: pd.Series) -> np.ndarray:
    """Values of a (possibly categorical) column as an object array, without per-row Python work."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        return np.asarray(column.cat.categories, dtype=object)[column.cat.codes.to_numpy()]
    return column.to_numpy(dtype=object)
