"""Facts about RocketMQ that the parsers rely on, each with its source (see docs/rocketmq-formats.md).

Nothing here is tunable: these are the broker's and clients' own formats and names. Tunable thresholds live in
``conf/`` (:mod:`pipelines.config`).
"""

from __future__ import annotations

# --- stats.log (docs/rocketmq-formats.md §2, StatsItem / RTStatsItem / MomentStatsItem) ------------------------------

#: ``Stats In One Minute`` etc. → the ``period`` column of silver/broker_stats.
PERIODS: dict[str, str] = {
    "In One Minute": "minute",
    "In One Hour": "hour",
    "In One Day": "day",
    "Every 5 Minutes": "5min",
}

#: Key shapes (docs/rocketmq-formats.md §3, ``BrokerStatsManager.buildStatsKey`` with "@" as separator). Each shape
#: names the parts of the key in order. ``cluster`` keys hold ``brokerClusterName``; ``event`` keys hold a channel
#: event.
KEY_SHAPES: dict[str, tuple[str, ...]] = {
    "topic": ("topic",),
    "topic@group": ("topic", "group"),
    "queueId@topic@group": ("queue", "topic", "group"),
    "topic@queueId": ("topic", "queue"),
    "topic@queueId@group": ("topic", "queue", "group"),
    "queueId@topic": ("queue", "topic"),
    "cluster": ("cluster",),
    "event": ("event",),
}

#: Stats name → accepted key shapes. ``GROUP_GET_LATENCY`` is ``queueId@topic@group`` unless
#: ``enableDetailStat`` is false on ≥ 4.9.3 (then ``topic@group``). Client-side names (ConsumerStatsManager) are
#: accepted too, since hand-shipped client logs use the same line format.
STAT_KEY_SHAPES: dict[str, tuple[str, ...]] = {
    "TOPIC_PUT_NUMS": ("topic",),
    "TOPIC_PUT_SIZE": ("topic",),
    "GROUP_GET_NUMS": ("topic@group",),
    "GROUP_GET_SIZE": ("topic@group",),
    "GROUP_GET_LATENCY": ("queueId@topic@group", "topic@group"),
    "SNDBCK_PUT_NUMS": ("topic@group",),
    "BROKER_PUT_NUMS": ("cluster",),
    "BROKER_GET_NUMS": ("cluster",),
    "GROUP_GET_FALL_SIZE": ("queueId@topic@group",),
    "GROUP_GET_FALL_TIME": ("queueId@topic@group",),
    "GROUP_GET_FROM_DISK_NUMS": ("queueId@topic@group",),
    "GROUP_GET_FROM_DISK_SIZE": ("queueId@topic@group",),
    "BROKER_GET_FROM_DISK_NUMS": ("cluster",),
    "BROKER_GET_FROM_DISK_SIZE": ("cluster",),
    "QUEUE_PUT_NUMS": ("topic@queueId",),
    "QUEUE_PUT_SIZE": ("topic@queueId",),
    "QUEUE_GET_NUMS": ("topic@queueId@group",),
    "QUEUE_GET_SIZE": ("topic@queueId@group",),
    "TOPIC_PUT_LATENCY": ("queueId@topic",),
    "GROUP_ACK_NUMS": ("topic@group",),
    "GROUP_CK_NUMS": ("topic@group",),
    "BROKER_ACK_NUMS": ("cluster",),
    "BROKER_CK_NUMS": ("cluster",),
    "DLQ_PUT_NUMS": ("topic",),
    "BROKER_PUT_NUMS_WITHOUT_SYSTEM_TOPIC": ("cluster",),
    "BROKER_GET_NUMS_WITHOUT_SYSTEM_TOPIC": ("cluster",),
    "CONSUMER_REGISTER_TIME": ("cluster",),
    "PRODUCER_REGISTER_TIME": ("cluster",),
    "CHANNEL_ACTIVITY": ("event",),
    "CONSUME_OK_TPS": ("topic@group",),
    "CONSUME_FAILED_TPS": ("topic@group",),
    "CONSUME_RT": ("topic@group",),
    "PULL_TPS": ("topic@group",),
    "PULL_RT": ("topic@group",),
}

#: The minute stats that feed the TPS windows (docs/contracts.md §1.1), and what each one measures.
TOPIC_PUT_NUMS = "TOPIC_PUT_NUMS"
GROUP_GET_NUMS = "GROUP_GET_NUMS"
SNDBCK_PUT_NUMS = "SNDBCK_PUT_NUMS"
BROKER_PUT_NUMS = "BROKER_PUT_NUMS"
WINDOWED_STATS: tuple[str, ...] = (TOPIC_PUT_NUMS, GROUP_GET_NUMS, SNDBCK_PUT_NUMS, BROKER_PUT_NUMS)
#: Further stats a broker prints (the simulator writes them; docs/rocketmq-formats.md §2-3): bytes put per topic,
#: bytes pulled and pull latency per subscription, bytes behind per queue (``Stats Every 5 Minutes``), and the
#: broker's total gets (keyed by the cluster name, like ``BROKER_PUT_NUMS``).
TOPIC_PUT_SIZE = "TOPIC_PUT_SIZE"
GROUP_GET_SIZE = "GROUP_GET_SIZE"
GROUP_GET_LATENCY = "GROUP_GET_LATENCY"
GROUP_GET_FALL_SIZE = "GROUP_GET_FALL_SIZE"
BROKER_GET_NUMS = "BROKER_GET_NUMS"

#: Prefixes of the per-group system topics (RocketMQ ``MixAll.RETRY_GROUP_TOPIC_PREFIX`` / ``DLQ_GROUP_TOPIC_PREFIX``).
#: The same prefix is written again in control/remoting.py: the broker side never imports the governor's package,
#: and the governor's executors receive pipelines/ and udfs/ only (spark-submit.sh).
RETRY_TOPIC_PREFIX = "%RETRY%"
DLQ_TOPIC_PREFIX = "%DLQ%"

#: Topic and group name rules (RocketMQ ``TopicValidator`` / ``Validators``): characters ``%|a-zA-Z0-9_-``,
#: topic length ≤ 127, group length ≤ 255.
NAME_PATTERN = r"^[%|a-zA-Z0-9_-]+$"
TOPIC_MAX_LENGTH = 127
GROUP_MAX_LENGTH = 255

# --- send failures (docs/rocketmq-formats.md §4-7) -------------------------------------------------------------------

#: Attempts of one producer send at most: 1 + ``DefaultMQProducer.retryTimesWhenSendFailed`` (2 by default;
#: apache/rocketmq develop, ``DefaultMQProducerImpl.sendDefaultImpl``), each failed attempt one failure line. So a
#: window's refused-send lines of a topic are at least this many times the messages they refused.
PRODUCER_SEND_ATTEMPTS = 3

#: Failure classes in match order: the first pattern found in the message decides (docs/contracts.md §1.2).
#: Patterns are Java regular expressions, matched case-sensitively against the client's message text.
FAILURE_PATTERNS: tuple[tuple[str, str], ...] = (
    ("TIMEOUT_CLEAN_QUEUE", r"\[TIMEOUT_CLEAN_QUEUE\]"),
    ("PCBUSY_CLEAN_QUEUE", r"\[PCBUSY_CLEAN_QUEUE\]"),
    ("REJECTREQUEST", r"\[REJECTREQUEST\]"),
    ("OVERLOAD", r"\[OVERLOAD\]"),
    ("PC_SYNCHRONIZED", r"\[PC_SYNCHRONIZED\]"),
    # Sohu's RateLimitHandler (sohutv/rocketmq 5.3.1-sohu-01, 5.1.1-sohu-02/-03): SYSTEM_BUSY with the remark
    # "[RateLimit] for <resource> need wait:<n>microsecs"; article 000's limiter: SYSTEM_BUSY "rateLimit".
    ("RATE_LIMITED", r"\[RateLimit\] for |\brateLimit\b"),
    ("CLIENT_TIMEOUT", r"RemotingTimeoutException|RemotingTooMuchRequestException|request timeout"),
    ("SERVICE_NOT_AVAILABLE", r"service not available now"),
)
#: Response code 14 (``SERVICE_NOT_AVAILABLE``) classifies even without the text.
SERVICE_NOT_AVAILABLE_CODE = 14
OTHER_FAILURE = "OTHER"
FAILURE_CLASSES: tuple[str, ...] = tuple(name for name, _ in FAILURE_PATTERNS) + (OTHER_FAILURE,)

#: A rejection by the in-broker rate limiter (the governor's own limits): demand of the resource it names, never a
#: busy broker and never a failure spike of the topic it limits (docs/contracts.md §1.2).
RATE_LIMITED = "RATE_LIMITED"

#: Classes that mean "the broker is busy" (fast failure and flow control, docs/rocketmq-formats.md §5).
BUSY_FAILURE_CLASSES: tuple[str, ...] = (
    "TIMEOUT_CLEAN_QUEUE",
    "PCBUSY_CLEAN_QUEUE",
    "REJECTREQUEST",
    "OVERLOAD",
    "PC_SYNCHRONIZED",
)

_COMPILED_PATTERNS: tuple | None = None


def classify_failure_text(message: str | None, code: int | None = None) -> str:
    """``failure_class`` of a failed send, in plain Python: the first pattern of :data:`FAILURE_PATTERNS` found in
    ``message`` (``re.search``: the patterns are written in the part of Java's regex syntax that Python reads the
    same), else ``SERVICE_NOT_AVAILABLE`` for ``code`` 14, else ``OTHER``. The same table and order as the data
    plane's Spark expression (:func:`pipelines.dataplane.transforms.parse_failures.classify_failure`); the
    Spark-free simulator classifies its clients' lines with it (:mod:`pipelines.sim.loop`)."""
    global _COMPILED_PATTERNS
    if _COMPILED_PATTERNS is None:
        import re

        _COMPILED_PATTERNS = tuple((name, re.compile(pattern)) for name, pattern in FAILURE_PATTERNS)
    text = message or ""
    for name, pattern in _COMPILED_PATTERNS:
        if pattern.search(text):
            return name
    return "SERVICE_NOT_AVAILABLE" if code == SERVICE_NOT_AVAILABLE_CODE else OTHER_FAILURE


#: The response code inside a client message: Java ``CODE: 2  DESC:`` (two spaces), Go ``CODE: 2, DESC:``.
CODE_IN_MESSAGE = r"CODE:\s*(-?\d+)"
