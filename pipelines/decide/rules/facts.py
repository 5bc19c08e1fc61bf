"""Every rule's predicate and every derived quantity the decisions share, each defined once: the final path
(:mod:`pipelines.decide.rules.anomalies`), the fast path (:mod:`pipelines.decide.rules.preliminary`), both gates in
front of the rules, the traffic floor (:func:`pipelines.decide.rules.windows.resource_traffic`), the demand evidence
(:mod:`pipelines.decide.rules.evidence`), the limit policies and the reconciliation call these and write none of them
again. The fast and the final path agree because they compute the same thing with the same function.

Quantities (msg/s; "cluster-wide" is summed over brokers, "per broker" one broker's own):

* :func:`rate`, :func:`per_second`: an amount over its window's seconds;
* :func:`retry_traffic`: a group's retry traffic, the larger of its send-backs and its plain sends to
  ``%RETRY%<group>``; :func:`retry_ratio`: retries ÷ consume;
* :func:`split`, :func:`shares_of`: a cluster-wide limit as per-broker figures, and the shares it is split by.

Predicates (the rules of docs/decisions.md §2 with their ``[detection]`` thresholds):

* :func:`retry_fires` (``RUNAWAY_RETRY``), :func:`surge_fires` (``TRAFFIC_SURGE``), :func:`busy_fires`
  (``BROKER_BUSY``), :func:`spike_fires` (``FAILURE_SPIKE``); :func:`severity`;
* :func:`at_floor`, :func:`retry_may_fire`: a gate's necessary condition, a value at a floor within
  :data:`TOLERANCE`.

The quantities and :func:`at_floor`, :func:`retry_may_fire`, :func:`surge_fires`, :func:`busy_fires`,
:func:`spike_fires` take Python
numbers or polars expressions alike (the same operators; :func:`retry_traffic` and :func:`retry_ratio` dispatch on
the type); :func:`retry_fires` takes numbers (a row at a time: its null cases are not an expression's).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import polars as pl

from pipelines import rocketmq as rmq
from pipelines.config import DetectionConfig
from pipelines.decide.words import Severity

#: The one relative tolerance of the decisions' float comparisons: a sum added in another order (a gate against
#: its rule, the traffic floor against a rule), two splits of the same limit, the fallback sends' share, the first
#: window starting after an instant.
TOLERANCE = 1e-9
#: Key of the per-broker figure of a broker that carried no traffic when the limit was set (docs/contracts.md §3).
ANY_BROKER = "*"

Number = float | int


def _expr(*values) -> bool:
    return any(isinstance(v, pl.Expr) for v in values)


def rate(amount: Number, seconds: Number) -> float:
    """``amount`` (messages, or failures) per second of a window of ``seconds`` (``windows.length_seconds``):
    msg/s, a true IEEE division (the quotient Spark's ``double`` division gives). Raises ZeroDivisionError for
    0 seconds."""
    return amount / seconds


def per_second(amount: pl.Expr) -> pl.Expr:
    """:func:`rate` of a column: ``amount`` per second of its row's window (``window_end - window_start``, of
    ``windows.length_seconds``), as a true division per row. Over a column of two or more rows, polars divides by a
    literal as a multiplication by its reciprocal, one ulp off for about one value in twelve
    (47119 / 60 = 785.3166666666667; × (1/60): 785.3166666666666): dividing by the row's own length is the
    quotient :func:`rate` and Spark give."""
    seconds = (pl.col("window_end") - pl.col("window_start")).dt.total_seconds().cast(pl.Float64)
    return amount.cast(pl.Float64) / seconds


def at_floor(value, floor):
    """``value`` at ``floor`` within :data:`TOLERANCE` (relative): a gate's or the traffic floor's necessary
    condition of a rule whose sums it adds in another order. Numbers → bool; expressions → a boolean expression."""
    return value >= floor * (1.0 - TOLERANCE)


def retry_traffic(sent_back, plain_sends):
    """A consumer group's retry traffic in a window: the larger of its send-backs (``SNDBCK_PUT_NUMS``) and the
    plain sends to ``%RETRY%<group>`` (``TOPIC_PUT_NUMS`` of the retry topic: the sends its client falls back to
    when a broker refuses a send-back; one limiter per broker counts both). Per broker, or of two cluster-wide
    sums (a lower bound of the per-broker sum); amounts or msg/s alike. Numbers → ``max`` (the first of equal
    ones); expressions → ``pl.max_horizontal``."""
    if _expr(sent_back, plain_sends):
        return pl.max_horizontal(sent_back, plain_sends)
    return max(sent_back, plain_sends)


#: The least share of its sends a busy broker is taken to accept: a demand read through it is at most 50x what the
#: broker admitted (:func:`through_busy`).
MIN_ACCEPTANCE = 0.02


def acceptance(puts, busy):
    """The share of the sends a broker accepted in a window (0..1): its puts ÷ (puts + its busy failures), counts
    of the same window (``TOPIC_PUT_NUMS`` summed over its topics; the ``[TIMEOUT_CLEAN_QUEUE]``-class failures its
    producers logged). A busy broker's send queue fast-fails every request that waits too long, a producer's put
    and a consumer's send-back alike (apache/rocketmq ``BrokerFastFailure``), so the share its producers see is the
    share of a consumer's send-backs it took too. At least :data:`MIN_ACCEPTANCE`; 1 without a send. Numbers or
    expressions."""
    if _expr(puts, busy):
        attempts = puts + busy
        return pl.when(attempts > 0).then(pl.max_horizontal(puts / attempts, pl.lit(MIN_ACCEPTANCE))).otherwise(1.0)
    attempts = puts + busy
    return max(puts / attempts, MIN_ACCEPTANCE) if attempts > 0 else 1.0


#: The largest refused share of a group's send-backs read from its fallback sends, by the detection
#: (:func:`least_refused_share`) and by a limit's policy (:func:`most_refused_share`) alike: a demand read through it
#: is at most 20× what the brokers admitted (as :data:`MIN_ACCEPTANCE` bounds the producers' reading).
REFUSED_SHARE_MAX = 0.95
#: Attempts of a consumer client's fallback plain send (:data:`pipelines.rocketmq.PRODUCER_SEND_ATTEMPTS`: it is a
#: producer send), each refused one retried on another broker at most.
FALLBACK_ATTEMPTS = rmq.PRODUCER_SEND_ATTEMPTS


#: Steps of the refused share's bisection (both versions: :func:`_fallback_refused`, :func:`_fallback_refused_one`).
_BISECTIONS = 50


def _attempts(u):
    """u + u² (+ u³ …): the refused attempts per send-back at the refused share u (a float or an array), written in
    Horner form, u·(1 + u·(1 + u …)), with ``+`` and ``*`` only. IEEE 754 rounds each of those once, alike in
    Python floats and in numpy's vector loops, so the two versions of the bisection (:func:`_fallback_refused`,
    :func:`_fallback_refused_one`) rely on bit equality, not on a tolerance; ``**`` calls ``pow``, which numpy's SIMD
    loops (AVX-512) round differently from the C library's."""
    acc = 1.0
    for _ in range(FALLBACK_ATTEMPTS - 1):
        acc = 1.0 + u * acc
    return u * acc


def _fallback_refused(fallback: np.ndarray, sent_back: np.ndarray) -> np.ndarray:
    """The least refused share u of a group's send-backs its fallback sends ``fallback`` beside its send-backs
    ``sent_back`` (arrays, same unit) can mean: each refused send-back is sent again as a plain send, and each
    refused attempt of it again, up to :data:`FALLBACK_ATTEMPTS` attempts, all refused at the same share u, so
    fallback ÷ send-backs = u + u² (+ u³ …) at most: the root u of that sum at the ratio, at most
    :data:`REFUSED_SHARE_MAX`. NaN where the ratio is beyond the sum at u = 1 (the fallbacks were admitted by
    brokers that refused fewer than the send-backs': no share of the send-backs follows) or nothing shows."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(sent_back > 0, fallback / np.where(sent_back > 0, sent_back, 1.0), np.inf)
    lo, hi = np.zeros_like(ratio), np.ones_like(ratio)
    for _ in range(_BISECTIONS):  # bisection: the sum rises with u
        mid = (lo + hi) / 2.0
        below = _attempts(mid) < ratio
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return np.where((fallback > 0) & (ratio <= FALLBACK_ATTEMPTS), np.minimum(hi, REFUSED_SHARE_MAX), np.nan)


def _fallback_refused_one(fallback: float, sent_back: float) -> float:
    """:func:`_fallback_refused` of one window, in plain floats: the same bisection step by step (the same IEEE
    operations, so the same bits; ``tests/decide/test_facts.py`` compares them), without numpy's cost per call on
    one-element arrays (the fast path asks it for every group and window of every micro-batch)."""
    ratio = fallback / sent_back if sent_back > 0 else math.inf
    lo, hi = 0.0, 1.0
    for _ in range(_BISECTIONS):
        mid = (lo + hi) / 2.0
        if _attempts(mid) < ratio:
            lo = mid
        else:
            hi = mid
    return min(hi, REFUSED_SHARE_MAX) if fallback > 0 and ratio <= FALLBACK_ATTEMPTS else math.nan


def least_refused_share(fallback: float, sent_back: float) -> float:
    """The least refused share of a group's send-backs its fallback sends can mean (0..1, at most
    :data:`REFUSED_SHARE_MAX`): every refused attempt retried, the detection's reading (:func:`_fallback_refused_one`;
    NaN where nothing follows). ``fallback``, ``sent_back``: the same unit (msg/s or counts)."""
    return _fallback_refused_one(fallback, sent_back)


def most_refused_share(admitted: float, sent_back: float | None) -> float | None:
    """The most a group's fallback sends can mean of its refused send-backs (0..1, at most
    :data:`REFUSED_SHARE_MAX`): fallback ÷ send-backs, the fallback sends being the retry topic's admitted puts
    beyond the send-backs (``admitted − sent_back``, msg/s); with send-backs admitted at a rate a ≤ 1 and the
    fallbacks at the same rate, fallbacks ÷ send-backs ≈ 1 − a, so the demand is at least the admitted traffic
    ÷ (1 − share). A limit's policy reads it (:meth:`pipelines.decide.limits.retry_storm.RetryStormLimit.visible`),
    the detection the least (:func:`least_refused_share`). None when the window shows no fallback sends (within
    :data:`TOLERANCE` of the admitted traffic) or no send-back count."""
    if sent_back is None or admitted - sent_back <= TOLERANCE * max(admitted, 1.0):
        return None
    return min(fallback_ratio(admitted - sent_back, sent_back), REFUSED_SHARE_MAX) if sent_back > 0 \
        else REFUSED_SHARE_MAX


def fallback_ratio(fallback, sent_back):
    """A group's fallback sends ÷ its send-backs (both msg/s or both counts; numbers or expressions; ``sent_back``
    > 0): the most its fallback sends can mean of its refused send-backs, uncapped. :func:`most_refused_share` caps
    it at :data:`REFUSED_SHARE_MAX`; :func:`sendback_acceptance` keeps its send-backs' acceptance at or above
    1 − this ratio."""
    return fallback / sent_back


def sendback_acceptance(accepted, admitted, sent_back):
    """The share of a consumer group's send-backs its brokers accepted in a window: the share of sends a broker
    accepted (:func:`acceptance` of its producers' logged busy failures) or, when smaller, 1 − the refused share its
    **fallback sends** reveal. A consumer client whose send-back a broker refuses sends the message to
    ``%RETRY%<group>`` as a plain send through its own producer (apache/rocketmq
    ``DefaultMQPushConsumerImpl.sendMessageBack`` → ``sendMessageBackAsNormalMessage``), retried like any send;
    the brokers print those as the retry topic's puts beyond the send-backs, ``admitted − sent_back`` (its
    :func:`retry_traffic` and send-backs summed over the group's brokers, msg/s or counts alike: the client's
    producer sends the fallback to any broker of ``%RETRY%<group>``, not to the one that refused the send-back).
    Read as the least refused share they can mean (:func:`_fallback_refused`: every refused attempt retried), so the
    demand read through it is a floor, never a healthy group's inflated retries. The producers' lines under-count a
    busy broker's refusals as far as they are sampled or throttled; the fallback sends need no log.
    (Under a limit the policy reads them as fallback ÷ send-backs, the most they can mean:
    :func:`most_refused_share`.)

    Where the window shows fallback sends, the share is never below 1 − fallback ÷ send-backs: every refused
    send-back is sent again as a fallback, so the fallback sends the brokers admitted are at least the refused share
    of the send-backs where both meet the same acceptance. The producers' acceptance is no reading of a group whose
    send-backs the brokers refuse less than the producers' sends (producers sending in pulses are refused most in
    each pulse, a group's steady send-backs far less). Numbers or expressions."""
    fallback = admitted - sent_back
    if _expr(accepted, admitted, sent_back):
        refused = pl.struct(fallback=fallback, sent_back=sent_back).map_batches(
            lambda s: pl.Series(_fallback_refused(s.struct.field("fallback").to_numpy().astype(float),
                                                  s.struct.field("sent_back").to_numpy().astype(float))),
            return_dtype=pl.Float64)
        most = pl.when((fallback > 0) & (sent_back > 0)).then(fallback_ratio(fallback, sent_back)).otherwise(None)
        read = pl.min_horizontal(accepted, 1.0 - refused.fill_nan(0.0).fill_null(0.0))
        return pl.max_horizontal(read, (1.0 - most).fill_null(0.0))
    refused = least_refused_share(float(fallback), float(sent_back))
    read = min(accepted, 1.0 - (0.0 if math.isnan(refused) else refused))
    return max(read, 1.0 - fallback_ratio(fallback, sent_back)) if fallback > 0 and sent_back > 0 else read


def newest_carriers(windows, before) -> frozenset:
    """The brokers that carried a resource in the newest of ``windows`` (a mapping window → the brokers with its
    traffic there) earlier than ``before`` and with a carrier; empty when none is. The fast path acts on an open
    window not complete by census for a resource all of whose carriers there have reported: a topic's put rate
    (:func:`pipelines.decide.paths.open_split.topics_heard`), a consumer group's fallback sends
    (:func:`pipelines.decide.rules.open_retry.groups_heard`)."""
    earlier = [w for w, brokers in windows.items() if w < before and brokers]
    return frozenset(windows[max(earlier)]) if earlier else frozenset()


def through_busy(admitted, accepted):
    """What was sent to a broker, from what it ``admitted`` (msg/s, or a count) and the share it accepted
    (:func:`acceptance`): a consumer group's retry traffic behind its busy broker, whose refused send-backs leave no
    line anywhere (a storm behind a busy broker can be admitted at a twentieth of what it sends). At most 1 ÷
    :data:`MIN_ACCEPTANCE` times what it admitted. Numbers or expressions."""
    return admitted / accepted


def crowded_acceptance(broker_puts, broker_normal, topic_puts, topic_normal):
    """The share of its other senders' writes a busy broker still takes while one topic crowds them out (0..1): the
    broker's puts besides the topic's (msg/s, ``broker_puts`` - ``topic_puts``) ÷ what they were before (its
    surge baseline ``broker_normal`` less the topic's own share of it, ``topic_normal``). A busy broker writes its
    capacity and fast-fails each request that waits too long, whoever sent it (apache/rocketmq
    ``BrokerFastFailure``), so every sender keeps about the same share of what it sends: a topic whose own puts
    grew while the rest of its broker shrank to this share sent about its puts ÷ this share. The producers' busy
    failure lines cannot tell it (a client's log throttle keeps a few hundred a minute of each). A broker
    busy with another resource's load (a retry storm's re-puts) has its other writes at or above their normal:
    1, nothing read through. At least :data:`MIN_ACCEPTANCE`; 1 where the rest had no normal writes. Numbers or
    expressions."""
    others_normal = broker_normal - topic_normal
    others = broker_puts - topic_puts
    if _expr(broker_puts, broker_normal, topic_puts, topic_normal):
        return pl.when(others_normal > 0).then((others / others_normal).clip(MIN_ACCEPTANCE, 1.0)).otherwise(1.0)
    return min(max(others / others_normal, MIN_ACCEPTANCE), 1.0) if others_normal > 0 else 1.0


def retry_ratio(retry, consume):
    """Retries ÷ consume (both msg/s, or both counts of one window); None (null) when nothing is consumed
    (``consume`` ≤ 0). Numbers → float or None; expressions → a Float64 expression."""
    if _expr(retry, consume):
        return pl.when(consume > 0).then(retry / consume).otherwise(None)
    return retry / consume if consume > 0 else None


def retry_fires(retry: float | None, consume: float | None, cfg: DetectionConfig, *, floor: bool = True) -> bool:
    """``RUNAWAY_RETRY`` on a group's retry traffic and its consume rate (msg/s, the same window): the
    :func:`retry_ratio` at ``retry_ratio_threshold`` and the retries at ``retry_floor_tps``; with nothing consumed,
    the retries at the floor. ``floor=False`` (a window under the group's own limit, whose cap holds the retries
    far under the floor): a group that consumes fires on its ratio alone. False when either rate is None (no
    evidence)."""
    if retry is None or consume is None:
        return False
    ratio = retry_ratio(retry, consume)
    if ratio is None:
        return retry >= cfg.retry_floor_tps
    return ratio >= cfg.retry_ratio_threshold and (not floor or retry >= cfg.retry_floor_tps)


def retry_may_fire(retry, cfg: DetectionConfig):
    """A necessary condition of :func:`retry_fires` on a group's retry traffic however its sums were added (msg/s;
    a partial window's so far, or the larger of two cluster-wide sums): :func:`at_floor` of ``retry_floor_tps``.
    The gates in front of the rules and the traffic floor ask it."""
    return at_floor(retry, cfg.retry_floor_tps)


def surge_factor(cfg: DetectionConfig, busy=False):
    """The factor ``TRAFFIC_SURGE`` applies to a resource's baseline: ``busy_surge_factor`` where ``busy`` (a topic
    whose own sends were refused as busy in the window), else ``surge_factor``. A bool → a number; a boolean
    expression → a float expression."""
    if isinstance(busy, pl.Expr):
        return pl.when(busy.fill_null(False)).then(pl.lit(cfg.busy_surge_factor)).otherwise(pl.lit(cfg.surge_factor))
    return cfg.busy_surge_factor if busy else cfg.surge_factor


def failure_rate(puts, failures, rate_limited=0):
    """``FAILURE_SPIKE``'s failure rate of a topic's sends in a window (0..1): its failures other than the
    limiter's rejections (``rate_limited``, ``RATE_LIMITED``: the governor's own limit, no fault) ÷ its attempts
    (puts + those failures); 0 without an attempt. Counts as expressions → a float expression."""
    faults = failures - rate_limited
    attempts = puts + faults
    return pl.when(attempts > 0).then(faults.cast(pl.Float64) / attempts.cast(pl.Float64)).otherwise(0.0)


def normal_floor(baseline_tps: float, headroom: float) -> float:
    """The lowest limit a topic's normal traffic passes under (msg/s cluster-wide): ``headroom``
    (``limits.surge_squeeze_headroom``, 1.5) × its baseline puts (msg/s): a topic back at its normal, a median,
    reaches the cap's ``bound_share`` under less. A surge's first limit and its squeeze stop there, and an operator
    is told of a topic limit under it (:func:`pipelines.decide.catalogue.normal_floor`)."""
    return headroom * float(baseline_tps)


def surge_fires(put, baseline, cfg: DetectionConfig, busy=False):
    """``TRAFFIC_SURGE`` on a resource's put rate against its baseline (msg/s): at ``surge_floor_tps`` and at
    ``surge_factor`` × the baseline, or ``busy_surge_factor`` × it where ``busy`` (a topic whose own sends were
    refused as busy in the window: its busy broker admitted only part of its demand). Numbers → bool; expressions
    (``busy`` a bool or a boolean expression) → a boolean expression (a null baseline: null)."""
    return (put >= cfg.surge_floor_tps) & (put >= surge_factor(cfg, busy) * baseline)


def busy_fires(busy_failures, cfg: DetectionConfig):
    """``BROKER_BUSY`` on a broker's busy failures in a window (count): at ``busy_failures_floor``."""
    return busy_failures >= cfg.busy_failures_floor


def refused_demand(put, busy_failures, seconds):
    """A topic's demand with the sends its busy brokers refused (msg/s, cluster-wide): its puts (msg/s) plus its
    refused-as-busy failure lines in a window (count) ÷ (:data:`pipelines.rocketmq.PRODUCER_SEND_ATTEMPTS` × the
    window's ``seconds``): each refused message left at most that many lines, so the refused messages are at least
    that share of them. Numbers or polars expressions."""
    return put + busy_failures / (rmq.PRODUCER_SEND_ATTEMPTS * seconds)


def spike_fires(failure_rate, failures, cfg: DetectionConfig):
    """``FAILURE_SPIKE`` on a topic's failure rate (failures ÷ attempts, ``RATE_LIMITED`` left out) and its
    failures in a window (count): the rate at ``failure_rate_threshold`` and the count at ``failure_floor``."""
    return (failure_rate >= cfg.failure_rate_threshold) & (failures >= cfg.failure_floor)


def severity(observed: float, floor: float, cfg: DetectionConfig) -> Severity:
    """``critical`` when ``observed`` is at least ``critical_factor`` × the rule's ``floor`` (same unit), else
    ``warning``."""
    return Severity.CRITICAL if observed >= floor * cfg.critical_factor else Severity.WARNING


def close(a: float, b: float) -> bool:
    """``a`` within :data:`TOLERANCE` of ``b`` (relative to ``b``): the same figure computed twice."""
    return abs(a - b) <= TOLERANCE * abs(b)


def shares_of(broker_tps: Mapping[str, float]) -> dict[str, float]:
    """A resource's traffic per broker (msg/s) → each broker's share (fractions summing to 1, sorted by broker);
    brokers without traffic (0, None, NaN, ±inf) are left out; empty when there is no traffic."""
    live = {b: float(v) for b, v in broker_tps.items() if b and v is not None and v > 0 and math.isfinite(v)}
    total = sum(live.values())
    return {b: v / total for b, v in sorted(live.items())} if total > 0 else {}


def shares_from_figures(figures: Mapping[str, float], limit_qps: float) -> dict[str, float]:
    """A limit's per-broker figures (``broker_limits``, msg/s each) → each listed broker's share of the cluster-wide
    ``limit_qps`` (msg/s > 0): its figure ÷ the limit; the :data:`ANY_BROKER` entry (what an unlisted broker applies)
    left out. The inverse of :func:`split` on the brokers it lists; empty when it lists none."""
    return {b: q / limit_qps for b, q in figures.items() if b != ANY_BROKER}


def split(limit_qps: float, shares: Mapping[str, float]) -> dict[str, float]:
    """A cluster-wide limit (msg/s) split by the frozen shares: ``{broker: limit × share}`` plus :data:`ANY_BROKER`
    at the smallest share's figure (a broker that carries the resource only after the limit was set is held no
    looser than the least-loaded carrier). The listed brokers' figures add up to ``limit_qps``; the cluster-wide
    floor (``min_limit_qps``) is the floor of ``limit_qps``, not of each share. Empty without shares (every broker
    then applies the cluster-wide figure; docs/contracts.md §3)."""
    if not shares:
        return {}
    out = {b: limit_qps * s for b, s in shares.items()}
    out[ANY_BROKER] = min(out.values())
    return out
