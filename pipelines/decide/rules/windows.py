"""The finalized windowed sums → the gold TPS tables and the decisions' per-broker traffic, on the driver.

Spark's stateful aggregation (:func:`pipelines.dataplane.transforms.tps.window_metrics`: watermark, state store, a
stats line shipped twice counted once) reduces the messages to one row per window × broker × topic × consumer group
× metric (:data:`~pipelines.columns.WINDOW_METRIC`). The gold micro-batch collects those rows once as Arrow; this
module derives everything else from them with polars: :func:`reduce_windows`. The same function serves the
streaming job's gold flow (:mod:`pipelines.job.flows.gold`) and the simulator (:mod:`pipelines.sim.windows`).

Why on the driver: what the gold micro-batch collects grows with topics × brokers × groups, never with messages
(``bench/decisions.py`` prints the rows per window at 10,000 topics × 50 brokers and at 100,000 × 200). Built as
four Spark transforms instead (one job of 12 stages per micro-batch), the reduction cost more than the stateful
aggregation it follows: 6.04 s per stats minute for the gold query against 1.44 s on the driver, in the same
session (``bench/batch_profile.py``, docs/performance.md, 2026-11-26 late).

Units: ``*_tps`` columns are messages per second averaged over the window (the window's sum / its length in
seconds), per topic summed over its brokers (cluster-wide), per broker that broker's own. Times are UTC.
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from pipelines import columns, tables
from pipelines.columns import FAILURE_METRIC_PREFIX
from pipelines import rocketmq as rmq
from pipelines.config import DetectionConfig
from pipelines.decide.arrow import to_arrow, to_polars
from pipelines.decide.rules.facts import (
    MIN_ACCEPTANCE, acceptance, at_floor, failure_rate, per_second, retry_may_fire, retry_ratio, retry_traffic,
    sendback_acceptance, through_busy,
)
from pipelines.decide.rules.anomalies import WINDOW_KEYS

RATE_LIMITED_METRIC = FAILURE_METRIC_PREFIX + rmq.RATE_LIMITED
#: ``resource_type`` of a window marker row among the traffic rows (``resource`` ``metrics`` or ``traffic``).
MARKER = "*"
#: Key of the decisions' traffic rows among :func:`reduce_windows`' outputs (not a lake table).
TRAFFIC = "traffic"


def reduce_windows(metrics: pa.Table, detection: DetectionConfig,
                   limited: tuple[str, ...] = ()) -> dict[str, pa.Table]:
    """WINDOW_METRIC rows of finalized windows (each key once) → ``{"gold/topic_tps", "gold/group_tps",
    "gold/broker_tps", "traffic"}``, Arrow tables of :data:`~pipelines.columns.GOLD_TOPIC_TPS`,
    :data:`~pipelines.columns.GOLD_GROUP_TPS`, :data:`~pipelines.columns.GOLD_BROKER_TPS` and
    :data:`~pipelines.columns.WINDOW_TRAFFIC`.

    Rates are per second of each row's own window (``window_end - window_start``). ``detection``: the rules' floors that
    decide which traffic rows are kept; ``limited``: ``"<resource_type>\\x1f<resource>"`` keys of the resources under a
    limit (their rows are always kept: their demand evidence). The rules of each table: :func:`topic_tps`,
    :func:`group_tps`, :func:`broker_tps`, :func:`resource_traffic`.

    Example:
        >>> out = reduce_windows(window_rows, DetectionConfig())
        >>> out["gold/topic_tps"].column("put_tps")
    """
    m = to_polars(metrics, columns.WINDOW_METRIC)
    if m.width == 0:
        m = to_polars(None, columns.WINDOW_METRIC)
    lazy = m.lazy()
    plans = {tables.GOLD_TOPIC_TPS: (topic_tps(lazy), columns.GOLD_TOPIC_TPS),
             tables.GOLD_GROUP_TPS: (group_tps(lazy), columns.GOLD_GROUP_TPS),
             tables.GOLD_BROKER_TPS: (broker_tps(lazy), columns.GOLD_BROKER_TPS),
             TRAFFIC: (resource_traffic(lazy, detection, limited), columns.WINDOW_TRAFFIC)}
    # one polars query for the four (one call instead of about fifty eager steps: 12 ms against 24 ms for a small
    # cluster's window); in memory: polars' streaming engine took 28 ms
    frames = pl.collect_all([plan for plan, _ in plans.values()], engine="in-memory")
    return {name: to_arrow(frame, spec) for (name, (_, spec)), frame in zip(plans.items(), frames)}


def _amount_if(condition: pl.Expr) -> pl.Expr:
    """The row's ``amount`` where ``condition`` holds, else 0 (summed per group by the callers)."""
    return pl.when(condition).then(pl.col("amount")).otherwise(0)


def _failure_counts(metrics: pl.LazyFrame, key: str) -> pl.LazyFrame:
    """Failures per window × ``key``: ``failures``, ``busy_failures``, ``rate_limited`` (rejections by the in-broker
    limiter: the governor's own limits at work, not a fault of the broker or the topic) and ``failures_by_class``
    (a map as a list of {key, value}, entries in class order, so the same counts give the same map whatever order
    the rows came in)."""
    per_class = (
        metrics.filter(pl.col("metric").str.starts_with(FAILURE_METRIC_PREFIX))
        .with_columns(pl.col("metric").str.split(":").list.last().alias("failure_class"))
        .group_by([*WINDOW_KEYS, key, "failure_class"]).agg(pl.col("amount").sum().alias("n"))
        .sort([*WINDOW_KEYS, key, "failure_class", "n"], nulls_last=False)
    )
    busy = pl.col("failure_class").is_in(list(rmq.BUSY_FAILURE_CLASSES))
    return per_class.group_by([*WINDOW_KEYS, key], maintain_order=True).agg(
        pl.col("n").sum().alias("failures"),
        pl.col("n").filter(busy).sum().alias("busy_failures"),
        pl.col("n").filter(pl.col("failure_class") == rmq.RATE_LIMITED).sum().alias("rate_limited"),
        pl.struct(pl.col("failure_class").alias("key"), pl.col("n").alias("value")).alias("failures_by_class"),
    )


def topic_tps(metrics: pl.LazyFrame) -> pl.LazyFrame:
    """``gold/topic_tps`` rows: ``put_tps`` is TOPIC_PUT_NUMS summed over brokers per second;
    ``brokers_reporting`` counts brokers with a put line for the topic in the window; ``failures`` are the topic's
    failed send attempts (one per failure line: a producer retrying on another broker leaves one per attempt) by
    class; ``rate_limited`` those rejected by the in-broker limiter (``RATE_LIMITED``); ``failure_rate`` = other
    failures / (other failures + messages put), 0 when both are 0: a limited topic's own rejections are its demand
    at the cap, never a failure spike. ``limit_qps`` (the cluster-wide limit in force in the window) is filled by the
    final path (:func:`pipelines.decide.paths.final.with_limit_in_force`); null here."""
    puts = (metrics.filter(pl.col("metric") == rmq.TOPIC_PUT_NUMS)
            .group_by([*WINDOW_KEYS, "topic"])
            .agg(pl.col("amount").sum().alias("puts"), pl.col("broker").drop_nulls().n_unique().alias("brokers")))
    failures = _failure_counts(metrics.filter(pl.col("topic").is_not_null()), "topic")
    joined = puts.join(failures, on=[*WINDOW_KEYS, "topic"], how="full", coalesce=True)
    puts_n = pl.col("puts").fill_null(0)
    failures_n = pl.col("failures").fill_null(0)
    limited_n = pl.col("rate_limited").fill_null(0)
    return joined.select(
        *WINDOW_KEYS, "topic",
        per_second(puts_n).alias("put_tps"),
        pl.col("brokers").fill_null(0).cast(pl.Int32).alias("brokers_reporting"),
        failures_n.alias("failures"),
        pl.col("busy_failures").fill_null(0),
        "failures_by_class",
        failure_rate(puts_n, failures_n, limited_n).alias("failure_rate"),
        limited_n.alias("rate_limited"),
    )


def group_tps(metrics: pl.LazyFrame) -> pl.LazyFrame:
    """``gold/group_tps`` rows, per consumer group × topic × window: ``consume_tps`` from GROUP_GET_NUMS,
    ``retry_tps`` from SNDBCK_PUT_NUMS (messages the group sent back to its retry topic ``%RETRY%group``), both
    summed over brokers; ``retry_ratio`` = retry / consume, null when nothing was consumed."""
    got = _amount_if(pl.col("metric") == rmq.GROUP_GET_NUMS)
    sent = _amount_if(pl.col("metric") == rmq.SNDBCK_PUT_NUMS)
    sums = (metrics.filter(pl.col("metric").is_in([rmq.GROUP_GET_NUMS, rmq.SNDBCK_PUT_NUMS])
                           & pl.col("consumer_group").is_not_null())
            .group_by([*WINDOW_KEYS, "consumer_group", "topic"])
            .agg(got.sum().alias("got"), sent.sum().alias("sent_back")))
    return sums.select(
        *WINDOW_KEYS, "consumer_group", "topic",
        per_second(pl.col("got")).alias("consume_tps"),
        per_second(pl.col("sent_back")).alias("retry_tps"),
        retry_ratio(pl.col("sent_back").cast(pl.Float64), pl.col("got").cast(pl.Float64)).alias("retry_ratio"),
    )


def broker_tps(metrics: pl.LazyFrame) -> pl.LazyFrame:
    """``gold/broker_tps`` rows, per broker × window: ``put_tps`` sums the broker's TOPIC_PUT_NUMS (retry topics
    included); ``broker_put_tps`` is its own BROKER_PUT_NUMS line (null when the broker printed none); ``topics``
    counts topics with a put line; ``failures`` by class, ``busy_failures`` the fast-failure / flow-control
    rejections (docs/rocketmq-formats.md §5) of sends to the broker."""
    on_broker = metrics.filter(pl.col("broker").is_not_null())
    is_put = pl.col("metric") == rmq.TOPIC_PUT_NUMS
    is_broker_put = pl.col("metric") == rmq.BROKER_PUT_NUMS
    puts = (on_broker.filter(is_put | is_broker_put)
            .group_by([*WINDOW_KEYS, "broker"])
            .agg(_amount_if(is_put).sum().alias("puts"),
                 pl.col("amount").filter(is_broker_put).sum().alias("broker_puts"),
                 is_broker_put.any().alias("has_broker_put"),
                 pl.col("topic").filter(is_put).drop_nulls().n_unique().alias("topics")))
    failures = _failure_counts(on_broker, "broker")
    joined = puts.join(failures, on=[*WINDOW_KEYS, "broker"], how="full", coalesce=True)
    return joined.select(
        *WINDOW_KEYS, "broker",
        per_second(pl.col("puts").fill_null(0)).alias("put_tps"),
        pl.when(pl.col("has_broker_put")).then(per_second(pl.col("broker_puts"))).alias("broker_put_tps"),
        pl.col("topics").fill_null(0).cast(pl.Int32).alias("topics"),
        pl.col("failures").fill_null(0),
        pl.col("busy_failures").fill_null(0),
        "failures_by_class",
    )


def per_broker_traffic(metrics: pl.LazyFrame) -> pl.LazyFrame:
    """One row per window × limitable resource × broker (:data:`~pipelines.columns.WINDOW_TRAFFIC`): ``tps`` the
    limited traffic the broker admitted (msg/s), ``rejected`` its limiter's rejections of the resource (failed sends
    in the window) and ``carries`` (the broker printed a put line of the topic: a topic's carriers).

    * a topic (``TRAFFIC_SURGE`` limits its puts): its ``TOPIC_PUT_NUMS``; rejections its ``RATE_LIMITED`` failures;
    * a consumer group (``RUNAWAY_RETRY`` limits its retry traffic, one limiter per broker keyed ``%RETRY%<group>``,
      sohutv/rocketmq 5.3.1-sohu-01 ``RateLimitHandler``): the larger of its send-backs (``SNDBCK_PUT_NUMS``) and
      the plain sends to ``%RETRY%<group>`` a consumer falls back to (``TOPIC_PUT_NUMS`` of the retry topic, which
      also carry the re-puts of admitted send-backs); rejections the ``RATE_LIMITED`` failures of ``%RETRY%<group>``;
      ``sendback_tps`` the send-backs alone (what ``tps`` has beyond them is the consumer client's fallback plain
      sends: send-backs a broker refused).
    """
    on_broker = metrics.filter(pl.col("broker").is_not_null())
    metric, topic = pl.col("metric"), pl.col("topic")
    is_put = metric == rmq.TOPIC_PUT_NUMS
    is_limited = metric == RATE_LIMITED_METRIC
    is_sent_back = metric == rmq.SNDBCK_PUT_NUMS
    topic_rows = (
        on_broker.filter((is_put | is_limited) & topic.is_not_null())
        .group_by([*WINDOW_KEYS, "topic", "broker"])
        .agg(_amount_if(is_put).sum().alias("puts"), _amount_if(is_limited).sum().alias("rejected"),
             is_put.any().alias("carries"))
        .select(*WINDOW_KEYS, pl.lit("topic").alias("resource_type"), pl.col("topic").alias("resource"), "broker",
                per_second(pl.col("puts")).alias("tps"), "rejected", "carries",
                pl.lit(None, pl.Float64).alias("sendback_tps"))
    )
    is_retry_topic = topic.str.starts_with(rmq.RETRY_TOPIC_PREFIX).fill_null(False)
    owner = (pl.when(is_sent_back).then(pl.col("consumer_group"))
             .when(is_retry_topic).then(topic.str.slice(len(rmq.RETRY_TOPIC_PREFIX))))
    group_rows = (
        on_broker.filter(is_sent_back | (is_retry_topic & (is_put | is_limited)))
        .with_columns(owner.alias("resource")).filter(pl.col("resource").is_not_null())
        .group_by([*WINDOW_KEYS, "resource", "broker"])
        .agg(_amount_if(is_sent_back).sum().alias("sent_back"), _amount_if(is_put).sum().alias("retry_puts"),
             _amount_if(is_limited).sum().alias("rejected"))
        .select(*WINDOW_KEYS, pl.lit("group").alias("resource_type"), "resource", "broker",
                retry_traffic(per_second(pl.col("sent_back")), per_second(pl.col("retry_puts"))).alias("tps"),
                "rejected", pl.lit(False).alias("carries"), per_second(pl.col("sent_back")).alias("sendback_tps"))
    )
    return pl.concat([topic_rows, group_rows], how="vertical_relaxed").with_columns(
        pl.col("rejected").cast(pl.Int64))


def broker_acceptance(metrics: pl.LazyFrame) -> pl.LazyFrame:
    """Per window × broker: ``acceptance``, the share of the sends it accepted (:func:`pipelines.decide.rules.facts.
    acceptance` of its ``TOPIC_PUT_NUMS`` and its busy failures, counts of the window). The puts of the retry
    topics (``%RETRY%<group>``: consumers' send-backs and their clients' fallback plain sends) are left out: their
    refusals leave no line, so beside the producers' logged failures they would read the share too high."""
    is_put = (pl.col("metric") == rmq.TOPIC_PUT_NUMS) & ~pl.col("topic").str.starts_with(
        rmq.RETRY_TOPIC_PREFIX).fill_null(False)
    is_busy = pl.col("metric").is_in([FAILURE_METRIC_PREFIX + c for c in rmq.BUSY_FAILURE_CLASSES])
    sums = (metrics.filter(pl.col("broker").is_not_null() & (is_put | is_busy))
            .group_by([*WINDOW_KEYS, "broker"])
            .agg(_amount_if(is_put).sum().cast(pl.Float64).alias("_puts"),
                 _amount_if(is_busy).sum().cast(pl.Float64).alias("_busy")))
    return sums.select(*WINDOW_KEYS, "broker", acceptance(pl.col("_puts"), pl.col("_busy")).alias("acceptance"))


def resource_traffic(metrics: pl.LazyFrame, detection: DetectionConfig,
                     limited: tuple[str, ...] = ()) -> pl.LazyFrame:
    """:func:`per_broker_traffic` rows reduced to what the decisions need, plus window markers.

    Kept: the rows of a resource whose cluster-wide traffic in the window reaches its rule's floor (a topic at
    ``surge_floor_tps``, a group's retry traffic at :func:`~pipelines.decide.rules.facts.retry_may_fire`, read through
    its busy brokers (``acceptance``, :func:`broker_acceptance`, or what its fallback sends reveal when smaller,
    except under a limit: :func:`~pipelines.decide.rules.facts.sendback_acceptance`,
    :func:`~pipelines.decide.rules.facts.through_busy`), both within
    :data:`~pipelines.decide.rules.facts.TOLERANCE`: only those can be candidates), whose limiter rejected
    sends, or that is under a limit (``limited``: ``"<resource_type>\\x1f<resource>"`` keys; its windows are its
    demand evidence). What the decisions read per window grows with the resources near a rule, not with the
    cluster. Markers (``resource_type`` :data:`MARKER`, other columns null): ``metrics`` for every window of the
    micro-batch, ``traffic`` for every window with any resource traffic (the decisions' observation grid)."""
    rows = per_broker_traffic(metrics).join(broker_acceptance(metrics), on=[*WINDOW_KEYS, "broker"], how="left")
    key = [*WINDOW_KEYS, "resource_type", "resource"]
    # a group's send-backs through the smaller of its broker's acceptance and what its fallback sends reveal; a
    # group under a limit through its broker's acceptance alone (its fallback sends count the limiter's refusals:
    # the policy reads them, RetryStormLimit.refused_share), as the fast path reads it (open_retry.open_retry_traffic)
    over_brokers = lambda c: pl.col(c).fill_null(0.0).sum().over(key)  # noqa: E731
    under_limit = (pl.concat_str([pl.col("resource_type"), pl.col("resource")], separator="\x1f").is_in(
        list(limited)) if limited else pl.lit(False))
    rows = rows.with_columns(pl.when((pl.col("resource_type") == "group") & ~under_limit).then(sendback_acceptance(
        pl.col("acceptance").fill_null(1.0), over_brokers("tps"), over_brokers("sendback_tps")))
        .otherwise(pl.col("acceptance").fill_null(1.0)).alias("acceptance"))
    total = pl.col("total")
    at_its_floor = (pl.when(pl.col("resource_type") == "topic").then(at_floor(total, detection.surge_floor_tps))
                    .otherwise(retry_may_fire(total, detection)))
    # a group's floor on what it sent through its busy brokers (their refused send-backs leave no line)
    sent = pl.when(pl.col("resource_type") == "group").then(through_busy(pl.col("tps"), pl.col("acceptance"))) \
        .otherwise(pl.col("tps"))
    # a topic on a broker that refused sends as busy may be read through the writes it crowds out, up to its puts ÷
    # MIN_ACCEPTANCE (pipelines.decide.rules.crowding.crowded_reach): kept where that reaches the floor
    crowded = (pl.col("resource_type") == "topic") & (pl.col("acceptance").fill_null(1.0) < 1.0)
    totals = rows.group_by(key).agg(sent.sum().alias("total"), pl.col("rejected").sum().alias("refused"),
                                    at_floor(pl.col("tps").filter(crowded).sum() / MIN_ACCEPTANCE,
                                             detection.surge_floor_tps).alias("crowded"))
    keep = at_its_floor | (pl.col("refused") > 0) | pl.col("crowded")
    if limited:
        keep = keep | pl.concat_str([pl.col("resource_type"), pl.col("resource")], separator="\x1f").is_in(
            list(limited))
    kept = rows.join(totals.filter(keep).select(key), on=key, how="semi")
    marks = [df.select(*WINDOW_KEYS).unique().sort(list(WINDOW_KEYS)).with_columns(
        pl.lit(MARKER).alias("resource_type"), pl.lit(name).alias("resource"))
        for df, name in ((metrics, "metrics"), (rows, "traffic"))]
    return pl.concat([kept, *marks], how="diagonal_relaxed")
