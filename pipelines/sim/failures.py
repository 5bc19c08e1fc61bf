"""Producer send failures (``docs/contracts.md`` §1.2): a background trickle on every broker in every scenario
(client timeouts, ``TOPIC_NOT_EXIST``) and, for scenarios that make a broker busy, ``[TIMEOUT_CLEAN_QUEUE]broker
busy`` (code 2) for the other topics of that broker (:func:`busy_broker_failures`). A scenario's send failures, both
together: :func:`pipelines.sim.scenarios.build_send_failures`.

Texts: Java ``CODE: 2  DESC: … BROKER: ip:port`` + FAQ url (``docs/rocketmq-formats.md`` §6) and Go
``CODE: 2, DESC: …`` (§7); ``code`` is null for ``null_code_share`` of them and ``ts`` an ISO-8601 string for
``iso_ts_share`` of them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipelines import rocketmq as rmq
from pipelines.sim.spec import Incident, ScenarioSpec
from pipelines.sim.world import broker_address

#: Columns of the send-failure frame: docs/contracts.md §1.2, then two helpers that are not written to the landing.
FAILURE_COLUMNS: tuple[str, ...] = (
    "ts", "topic", "broker", "producer_group", "client", "code", "message", "latency_ms",
)
FAILURE_EXTRA_COLUMNS: tuple[str, ...] = ("event_time", "expected_class")


def empty_failures() -> pd.DataFrame:
    """No failures: the columns of :data:`FAILURE_COLUMNS` + :data:`FAILURE_EXTRA_COLUMNS`, zero rows."""
    return pd.DataFrame({c: pd.Series(dtype="object") for c in FAILURE_COLUMNS + FAILURE_EXTRA_COLUMNS})


def choose_topics(topic_rates: pd.Series, broker: str, n: int, rng: np.random.Generator,
                  catalog: pd.Series | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``n`` topics of ``broker`` drawn in proportion to their put rate, with their index among all topics of
    ``catalog`` (default ``topic_rates``): a stable id for the producer's client address."""
    all_topics = (topic_rates if catalog is None else catalog).index.get_level_values(1).unique().sort_values()
    on_broker = topic_rates.loc[broker]
    weights = on_broker.to_numpy(dtype=float) + 1e-9
    pick = rng.choice(on_broker.size, size=n, p=weights / weights.sum())
    names = on_broker.index.to_numpy()[pick]
    return names, all_topics.get_indexer(names)


def failure_frame(spec: ScenarioSpec, rng: np.random.Generator, minute: np.ndarray, topics: np.ndarray,
                  topic_ids: np.ndarray, broker: str | np.ndarray, code: np.ndarray, message: list[str],
                  latency: np.ndarray, expected_class: str) -> pd.DataFrame:
    """Assemble failures: time uniform within the minute (ms), client ``ip@pid`` of one of two producer
    instances per topic, ``code`` −1 meaning null."""
    n = minute.size
    offset_ms = rng.integers(0, 60_000, n)
    instance = rng.integers(0, 2, n)
    base_ms = int(pd.Timestamp(spec.start_utc).value // 1_000_000)
    epoch_ms = base_ms + minute.astype(np.int64) * 60_000 + offset_ms
    client = client_address(topic_ids, instance)
    return pd.DataFrame({
        "ts": epoch_ms,
        "topic": topics,
        "broker": broker,
        "producer_group": [f"{t}-producer" for t in topics],
        "client": client,
        "code": pd.array(np.where(code < 0, pd.NA, code).tolist(), dtype="Int64"),
        "message": message,
        "latency_ms": latency.astype(np.int64),
        "event_time": pd.to_datetime(epoch_ms, unit="ms", utc=True),
        "expected_class": expected_class,
    })


#: ``ResponseCode.SYSTEM_BUSY``: the broker's fast failure and Sohu's limiter both answer with it.
SYSTEM_BUSY = 2
#: ``MixAll.CLIENT_INNER_PRODUCER_GROUP``: the producer group of a consumer's own producer, which sends a message
#: whose send-back failed to ``%RETRY%<group>`` (apache/rocketmq
#: ``DefaultMQPushConsumerImpl.sendMessageBackAsNormalMessage``).
CLIENT_INNER_PRODUCER = "CLIENT_INNER_PRODUCER"


def busy_remark(period_ms: int, queue_size: int) -> str:
    """The broker's fast-failure remark (``BrokerFastFailure.cleanExpiredRequestInQueue``,
    docs/rocketmq-formats.md §5)."""
    return (f"[TIMEOUT_CLEAN_QUEUE]broker busy, start flow control for a while, period in queue: {period_ms}ms, "
            f"size of queue: {queue_size}")


def rate_limit_remark(resource: str, need_wait_us: int) -> str:
    """Sohu's limiter remark (sohutv/rocketmq 5.3.1-sohu-01 ``RateLimitHandler``: ``SYSTEM_BUSY`` with
    ``"[RateLimit] for " + resource + " need wait:" + lastNeedWaitMicrosecs + "microsecs"``); ``resource`` is the
    topic, or ``%RETRY%<group>`` for a consumer's send-back and for a plain send to its retry topic."""
    return f"[RateLimit] for {resource} need wait:{need_wait_us}microsecs"


def client_messages(spec: ScenarioSpec, code: int, remarks: list[str], addrs: list[str],
                    go: np.ndarray) -> list[str]:
    """What the client logs for a broker's error answer: the Java ``MQBrokerException`` text (``CODE: 2  DESC: …
    BROKER: ip:port`` + the FAQ line, docs/rocketmq-formats.md §6) or, where ``go``, the Go client's
    (``CODE: 2, DESC: …``, §7)."""
    return [f"CODE: {code}, DESC: {d}" if g else
            f"CODE: {code}  DESC: {d} BROKER: {a}\nFor more information, please visit the url, {spec.faq_url}"
            for d, a, g in zip(remarks, addrs, go.tolist())]


def client_address(topic_ids: np.ndarray, instance: np.ndarray) -> list[str]:
    """``ip@pid`` of one of two producer instances per topic (``topic_ids``: a stable number per topic)."""
    host = 2 * np.asarray(topic_ids, dtype=np.int64) + np.asarray(instance, dtype=np.int64)
    return [f"10.1.{h // 250}.{h % 250 + 1}@{30000 + h}" for h in host.tolist()]


def trickle_failures(spec: ScenarioSpec, topic_rates: pd.Series, rng: np.random.Generator) -> pd.DataFrame:
    """Background failures on every broker, whole range: client timeouts (code null) and TOPIC_NOT_EXIST (17)."""
    frames: list[pd.DataFrame] = []
    hosted = set(topic_rates.index.get_level_values(0))
    for b, broker in enumerate(spec.broker_names):
        if broker not in hosted:
            continue
        addr = broker_address(spec, b)
        # client timeouts
        minute = np.repeat(np.arange(spec.minutes), rng.poisson(spec.trickle_timeouts_per_broker_min, spec.minutes))
        topics, ids = choose_topics(topic_rates, broker, minute.size, rng)
        go = rng.random(minute.size) < spec.go_client_share
        message = ["request timeout" if g else
                   f"RemotingTimeoutException: wait response on the channel <{addr}> timeout, "
                   f"{spec.send_timeout_ms}(ms)"
                   for g in go.tolist()]
        latency = spec.send_timeout_ms + rng.integers(0, 20, minute.size)
        frames.append(failure_frame(spec, rng, minute, topics, ids, broker, np.full(minute.size, -1), message,
                                    latency, "CLIENT_TIMEOUT"))
        # a producer sending to a topic that was never created
        minute = np.repeat(np.arange(spec.minutes),
                           rng.poisson(spec.trickle_topic_not_exist_per_broker_min, spec.minutes))
        topics, ids = choose_topics(topic_rates, broker, minute.size, rng)
        missing = np.array([f"{t}-v2" for t in topics], dtype=object)
        go = rng.random(minute.size) < spec.go_client_share
        desc = [f"topic[{t}] not exist, apply first please!" for t in missing]
        message = [f"CODE: 17, DESC: {d}" if g else
                   f"CODE: 17  DESC: {d} BROKER: {addr}\nFor more information, please visit the url, {spec.faq_url}"
                   for d, g in zip(desc, go.tolist())]
        code = np.where(rng.random(minute.size) < spec.null_code_share, -1, 17)
        latency = rng.integers(1, 15, minute.size)
        frames.append(failure_frame(spec, rng, minute, missing, ids, broker, code, message, latency, "OTHER"))
    return pd.concat(frames, ignore_index=True) if frames else empty_failures()


def busy_broker_failures(spec: ScenarioSpec, topic_rates: pd.Series, incident: Incident | None,
                         rng: np.random.Generator) -> pd.DataFrame:
    """``[TIMEOUT_CLEAN_QUEUE]`` (code 2) for the *other* business topics of the busy broker (not the culprit's
    own topic: the brief's reading of article 001, "every topic on that broker failed"), onset + 1 min → end."""
    if incident is None or incident.culprit_broker is None:
        return empty_failures()
    first = spec.onset_index + 1
    minutes = np.arange(first, spec.minutes)
    victims = topic_rates.drop(index=[(incident.culprit_broker, incident.culprit_topic)], errors="ignore")
    if minutes.size == 0 or incident.culprit_broker not in victims.index.get_level_values(0):
        return empty_failures()
    lam = spec.busy_failures_per_min * (1.0 + rng.uniform(-spec.busy_failures_spread, spec.busy_failures_spread,
                                                          minutes.size))
    counts = rng.poisson(lam)
    minute = np.repeat(minutes, counts)
    n = minute.size
    broker_index = spec.broker_names.index(incident.culprit_broker)
    topics, topic_ids = choose_topics(victims, incident.culprit_broker, n, rng, topic_rates)
    period = rng.integers(spec.busy_period_ms_min, spec.busy_period_ms_max, n)
    queue = rng.integers(spec.busy_queue_size_min, spec.busy_queue_size_max, n)
    go = rng.random(n) < spec.go_client_share
    addr = broker_address(spec, broker_index)
    desc = [busy_remark(p, q) for p, q in zip(period.tolist(), queue.tolist())]
    message = client_messages(spec, SYSTEM_BUSY, desc, [addr] * n, go)
    code = np.where(rng.random(n) < spec.null_code_share, -1, 2)
    latency = period + rng.integers(1, 30, n)
    return failure_frame(spec, rng, minute, topics, topic_ids, incident.culprit_broker, code, message, latency,
                         "TIMEOUT_CLEAN_QUEUE")


def business_topic_rates(traffic: pd.DataFrame) -> pd.Series:
    """Mean TOPIC_PUT_NUMS SUM per (broker, topic) over business topics (not %RETRY%/%DLQ%)."""
    tp = traffic[(traffic["stat_name"] == rmq.TOPIC_PUT_NUMS) & (traffic["period"] == "minute")
                 & ~traffic["stats_key"].str.startswith("%")]
    keys = pd.DataFrame({"broker": tp["broker"].astype(str).to_numpy(dtype=object),
                         "stats_key": tp["stats_key"].astype(str).to_numpy(dtype=object),
                         "sum": tp["sum"].to_numpy()})
    return keys.groupby(["broker", "stats_key"], sort=True)["sum"].mean()


def finish_failures(spec: ScenarioSpec, out: pd.DataFrame, rng: np.random.Generator) -> pd.DataFrame:
    """Failure rows with ``ts`` in epoch millis → sorted by time, ``ts`` an ISO-8601 string for ``iso_ts_share``
    of them, columns :data:`FAILURE_COLUMNS` + :data:`FAILURE_EXTRA_COLUMNS`."""
    out = out.sort_values(["event_time", "broker", "topic"], kind="mergesort").reset_index(drop=True)
    iso = rng.random(len(out)) < spec.iso_ts_share
    millis = out["ts"].astype(np.int64)
    iso_text = out["event_time"].dt.strftime("%Y-%m-%dT%H:%M:%S.") + (millis % 1000).map("{:03d}".format) + "Z"
    out["ts"] = pd.Series(np.where(iso, iso_text.to_numpy(dtype=object), millis.to_numpy(dtype=object)),
                          dtype="object")
    return out[list(FAILURE_COLUMNS + FAILURE_EXTRA_COLUMNS)]
