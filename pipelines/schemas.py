"""Named schemas of every DataFrame that crosses a module boundary and of every Delta table (docs/contracts.md §2).

Times are ``TimestampType`` in UTC (the Spark session time zone is UTC). TPS columns are messages per second.

Text: every string column of every table holds valid UTF-8 (Arrow, Parquet readers and pandas refuse anything
else). An input record's exact bytes are kept beside its text in the binary column ``raw_bytes`` (``RAW_RECORD``,
``BRONZE``, ``QUARANTINE``); its ``raw`` is those bytes decoded as UTF-8 with every invalid sequence replaced by
U+FFFD (Spark's ``make_valid_utf8``, the same text as Python's ``raw_bytes.decode("utf-8", "replace")``). A record
whose ``raw`` differs from its bytes is quarantined (``line is not valid UTF-8``), so every other column, derived
from accepted records, holds text that was valid in the input.
"""

from __future__ import annotations

from pyspark.sql import types as T

_S, _L, _D, _I, _TS = T.StringType(), T.LongType(), T.DoubleType(), T.IntegerType(), T.TimestampType()
_B = T.BinaryType()


def _struct(*fields: tuple[str, T.DataType]) -> T.StructType:
    return T.StructType([T.StructField(name, dtype, nullable=True) for name, dtype in fields])


#: What a source yields, whatever the transport: one input record. ``raw_bytes`` is the record's exact bytes (a
#: line of a landing file without its line separator, or a Kafka message value); ``raw`` is the same as valid
#: UTF-8 text, invalid sequences replaced by U+FFFD (module docstring). ``origin`` is the file path or
#: ``kafka:<topic>:<partition>:<offset>``; ``broker_hint`` is the folder name (files) or the Kafka key (as valid
#: UTF-8 text, invalid sequences replaced by U+FFFD; the key's bytes are not kept).
RAW_RECORD = _struct(
    ("source", _S),
    ("raw", _S),
    ("raw_bytes", _B),
    ("origin", _S),
    ("broker_hint", _S),
    ("ingested_at", _TS),
)

#: The JSON envelope log shippers write around a stats.log line (docs/contracts.md §1.1).
STATS_ENVELOPE = _struct(("broker", _S), ("cluster", _S), ("line", _S), ("_corrupt_record", _S))

#: A send-failure JSON line (docs/contracts.md §1.2). ``ts`` is read as text (epoch millis or ISO-8601);
#: a field of the wrong JSON type makes the record corrupt and it is quarantined.
SEND_FAILURE_JSON = _struct(
    ("ts", _S),
    ("topic", _S),
    ("broker", _S),
    ("producer_group", _S),
    ("client", _S),
    ("code", _I),
    ("message", _S),
    ("latency_ms", _D),
    ("_corrupt_record", _S),
)

#: ``bronze/broker_stats`` and ``bronze/send_failures``: every input record as read (:data:`RAW_RECORD` without
#: ``source``); ``raw_bytes`` its exact bytes, ``raw`` their valid-UTF-8 text.
BRONZE = _struct(("raw", _S), ("raw_bytes", _B), ("origin", _S), ("broker_hint", _S), ("ingested_at", _TS))

SILVER_BROKER_STATS = _struct(
    ("event_time", _TS),
    ("broker", _S),
    ("cluster", _S),
    ("stat_name", _S),
    ("period", _S),
    ("stats_key", _S),
    ("topic", _S),
    ("consumer_group", _S),
    ("queue_id", _I),
    ("sum", _L),
    ("tps", _D),
    ("avgpt", _D),
    ("value", _L),
    ("origin", _S),
    ("ingested_at", _TS),
)

SILVER_SEND_FAILURES = _struct(
    ("event_time", _TS),
    ("topic", _S),
    ("broker", _S),
    ("producer_group", _S),
    ("client", _S),
    ("code", _I),
    ("failure_class", _S),
    ("message", _S),
    ("latency_ms", _D),
    ("origin", _S),
    ("ingested_at", _TS),
)

#: ``quarantine``: one row per rejected record. ``source`` is ``broker_stats``, ``send_failures`` (an input record:
#: ``raw_bytes`` its exact bytes, ``raw`` their valid-UTF-8 text) or ``gold/limits`` (a limit decision refused by
#: the ``gold/limits`` suite: ``raw`` the decision as JSON, ``raw_bytes`` null); ``reason`` the first failed check.
QUARANTINE = _struct(
    ("source", _S), ("raw", _S), ("raw_bytes", _B), ("reason", _S), ("origin", _S), ("ingested_at", _TS)
)

#: The unified stream the windows aggregate: one measured amount at one event time.
#: ``metric`` is a stats name of :data:`pipelines.rocketmq.WINDOWED_STATS` or ``failure:<failure_class>``.
METRIC_EVENT = _struct(
    ("event_time", _TS),
    ("broker", _S),
    ("topic", _S),
    ("consumer_group", _S),
    ("metric", _S),
    ("amount", _L),
)

#: Output of the streaming aggregation: sums per window × broker × topic × group × metric.
WINDOW_METRIC = _struct(
    ("window_start", _TS),
    ("window_end", _TS),
    ("broker", _S),
    ("topic", _S),
    ("consumer_group", _S),
    ("metric", _S),
    ("amount", _L),
)

FAILURES_BY_CLASS = T.MapType(_S, _L)
#: Per-broker figures (broker name → msg/s, or a share): ``"*"`` is the figure of a broker not listed.
BROKER_FIGURES = T.MapType(_S, _D)

#: ``gold/topic_tps``: ``failure_rate`` leaves out ``rate_limited`` (the in-broker limiter's own rejections);
#: ``limit_qps`` is the cluster-wide limit in force in the window (null: none), and such windows are kept out of the
#: topic's surge baseline.
GOLD_TOPIC_TPS = _struct(
    ("window_start", _TS),
    ("window_end", _TS),
    ("topic", _S),
    ("put_tps", _D),
    ("brokers_reporting", _I),
    ("failures", _L),
    ("busy_failures", _L),
    ("failures_by_class", FAILURES_BY_CLASS),
    ("failure_rate", _D),
    ("rate_limited", _L),
    ("limit_qps", _D),
)

GOLD_GROUP_TPS = _struct(
    ("window_start", _TS),
    ("window_end", _TS),
    ("consumer_group", _S),
    ("topic", _S),
    ("consume_tps", _D),
    ("retry_tps", _D),
    ("retry_ratio", _D),
)

GOLD_BROKER_TPS = _struct(
    ("window_start", _TS),
    ("window_end", _TS),
    ("broker", _S),
    ("put_tps", _D),
    ("broker_put_tps", _D),
    ("topics", _I),
    ("failures", _L),
    ("busy_failures", _L),
    ("failures_by_class", FAILURES_BY_CLASS),
)

GOLD_ANOMALIES = _struct(
    ("window_start", _TS),
    ("window_end", _TS),
    ("resource_type", _S),
    ("resource", _S),
    ("anomaly", _S),
    ("observed_tps", _D),
    ("baseline_tps", _D),
    ("severity", _S),
    ("detail", _S),
)

#: The key of a limited resource in ``gold/limits`` and ``state/policy``: a topic or a consumer group.
RESOURCE_KEYS = ("resource_type", "resource")

GOLD_LIMITS = _struct(
    ("decided_at", _TS),
    ("window_end", _TS),
    ("resource_type", _S),
    ("resource", _S),
    ("limit_qps", _D),
    ("burst", _L),
    ("previous_qps", _D),
    ("action", _S),
    ("mode", _S),
    ("expires_at", _TS),
    ("reason", _S),
    ("version", _L),
    ("basis", _S),
    ("broker_limits", BROKER_FIGURES),
)

#: Saved policy state per resource (``state/policy``): the latest row per resource with ``batch_id`` below the
#: current micro-batch is the state the policy starts from (:class:`pipelines.transforms.fold.ResourceState`).
POLICY_STATE = _struct(
    ("resource_type", _S),
    ("resource", _S),
    ("limit_qps", _D),
    ("version", _L),
    ("last_candidate_end", _TS),
    ("last_decision_end", _TS),
    ("last_change_end", _TS),
    ("lift_at_qps", _D),
    ("mode", _S),
    ("target_qps", _D),
    ("limited_since", _TS),
    ("broker_shares", BROKER_FIGURES),
    ("last_distress_end", _TS),
    ("last_lift_end", _TS),
    ("lifted_target_qps", _D),
    ("recurrences", _L),
    ("batch_id", _L),
    ("baseline_tps", _D),
    ("busy_load", BROKER_FIGURES),
    ("probe_from_qps", _D),
    ("probe_ceiling_qps", _D),
    ("probe_hold_until", _TS),
    ("probe_backoff", _L),
    ("cause_changes", _L),
)

#: Rows into and out of the per-resource policy fold (:mod:`pipelines.transforms.policy_fold`): ``row_kind`` is
#: ``state``, ``candidate``, ``observation`` (in) or ``decision``, ``state``, ``evidence`` (out). ``target_qps`` is a
#: candidate's target, or a state's frozen target; ``broker_tps`` a candidate's traffic per broker,
#: ``broker_shares`` a state's frozen shares, ``broker_limits`` a decision's per-broker figures; ``baseline_tps`` a
#: candidate's rule baseline or a state's frozen one; ``consume_tps``, ``carrier_load`` (broker → writes, msg/s) and
#: ``busy_brokers`` an observation's (:class:`pipelines.transforms.fold.Observation`).
POLICY_FOLD = _struct(
    ("row_kind", _S),
    ("resource_type", _S),
    ("resource", _S),
    ("window_end", _TS),
    ("target_qps", _D),
    ("floor_qps", _D),
    ("observed_tps", _D),
    ("critical", T.BooleanType()),
    ("limit_qps", _D),
    ("previous_qps", _D),
    ("action", _S),
    ("mode", _S),
    ("reason", _S),
    ("version", _L),
    ("last_candidate_end", _TS),
    ("last_decision_end", _TS),
    ("last_change_end", _TS),
    ("lift_at_qps", _D),
    ("rejected", _L),
    ("healthy", T.BooleanType()),
    ("broker_tps", BROKER_FIGURES),
    ("broker_shares", BROKER_FIGURES),
    ("broker_limits", BROKER_FIGURES),
    ("limited_since", _TS),
    ("last_distress_end", _TS),
    ("last_lift_end", _TS),
    ("lifted_target_qps", _D),
    ("recurrences", _L),
    ("status", _S),
    ("rule_fired", T.BooleanType()),
    ("baseline_tps", _D),
    ("consume_tps", _D),
    ("carrier_load", BROKER_FIGURES),
    ("busy_brokers", T.ArrayType(_S)),
    ("busy_load", BROKER_FIGURES),
    ("probe_from_qps", _D),
    ("probe_ceiling_qps", _D),
    ("probe_hold_until", _TS),
    ("probe_backoff", _L),
    ("cause_changes", _L),
)

#: ``quality/validation_results``: one row per expectation per GX validation of a micro-batch
#: (:mod:`pipelines.quality`); ``suite`` is the validated table, ``observed_value`` JSON text when GX reports one.
QUALITY_VALIDATION_RESULTS = _struct(
    ("batch_id", _L),
    ("suite", _S),
    ("expectation", _S),
    ("success", T.BooleanType()),
    ("element_count", _L),
    ("unexpected_count", _L),
    ("observed_value", _S),
    ("validated_at", _TS),
)

#: ``quality/validation_runs``: GX's own result of each suite validation of a micro-batch (:mod:`pipelines.quality`,
#: rendered by :mod:`pipelines.quality.data_docs`); ``suite`` is the validated table (as in ``quality/validation_results``),
#: ``result_json`` is ``ExpectationSuiteValidationResult.to_json_dict()`` as JSON, run name ``batch-<batch_id>``.
QUALITY_VALIDATION_RUNS = _struct(
    ("batch_id", _L),
    ("suite", _S),
    ("success", T.BooleanType()),
    ("validated_at", _TS),
    ("result_json", _S),
)

#: ``quality/reconciliation``: per ingest micro-batch and input, ``records_read = silver_rows + late_rows +
#: quarantine_rows`` (``balanced``). Late rows (behind the gold watermark) are written to silver too; ``silver_rows``
#: counts the others. ``expectation_rows`` is the part of ``quarantine_rows`` rejected by an expectation.
QUALITY_RECONCILIATION = _struct(
    ("batch_id", _L),
    ("source", _S),
    ("records_read", _L),
    ("silver_rows", _L),
    ("late_rows", _L),
    ("quarantine_rows", _L),
    ("expectation_rows", _L),
    ("watermark", _TS),
    ("max_event_time", _TS),
    ("balanced", T.BooleanType()),
    ("recorded_at", _TS),
)

#: ``backtest/results`` (:mod:`pipelines.backtest`): one row per backtest run × governor on/off × resource class ×
#: metric. ``governor`` is ``with`` | ``without`` | ``both`` (run-level metrics); ``resource_class`` is ``incident``,
#: ``bystander``, ``other`` or ``all``; ``unit`` names the unit of ``value`` (msgs, s, windows, count, pct, qps).
BACKTEST_RESULTS = _struct(
    ("recorded_at", _TS),
    ("run_id", _S),
    ("scenario", _S),
    ("seed", _L),
    ("governor", _S),
    ("resource_class", _S),
    ("metric", _S),
    ("value", _D),
    ("unit", _S),
)

#: Input of the broker model UDF (:mod:`udfs.broker_model`): :data:`pipelines.sim.broker_model.OFFERED_COLUMNS`, one
#: row per (UTC minute, broker, resource); ``requests_tps`` msgs/s the limiter sees, ``work_per_request`` write units.
BROKER_MODEL_OFFERED = _struct(
    ("minute_start", _TS),
    ("broker", _S),
    ("resource_type", _S),
    ("resource", _S),
    ("requests_tps", _D),
    ("work_per_request", _D),
)

#: Output of the broker model UDF: both frames of :class:`pipelines.sim.broker_model.ModelResult` in one.
#: ``row_kind`` = ``resource`` (per minute, broker, resource: ``offered`` … ``limit_qps``, msgs; limit msgs/s, null
#: when none) or ``broker`` (per minute, broker: ``offered_work`` … ``served_work`` and ``capacity_tps`` units/s,
#: ``reject_share`` 0-1, ``max_wait_ms``); the other kind's columns are null.
BROKER_MODEL_RESULT = _struct(
    ("row_kind", _S),
    ("minute_start", _TS),
    ("broker", _S),
    ("resource_type", _S),
    ("resource", _S),
    ("offered", _D),
    ("limited_rejected", _D),
    ("busy_rejected", _D),
    ("admitted", _D),
    ("limit_qps", _D),
    ("offered_work", _D),
    ("admitted_work", _D),
    ("served_work", _D),
    ("capacity_tps", _D),
    ("reject_share", _D),
    ("max_wait_ms", _D),
)

#: ``control/sink_status`` (:class:`pipelines.io.sinks.SinkSet`): one row per write-back sink per gold micro-batch
#: that published: ``ok`` whether the sink now holds the current limits, ``sent`` the messages it accepted, ``attempts``
#: the tries (1 = first time right), ``error`` the last error (null when ok), ``at`` UTC.
SINK_STATUS = _struct(
    ("batch_id", _L),
    ("sink", _S),
    ("ok", T.BooleanType()),
    ("sent", _I),
    ("attempts", _I),
    ("error", _S),
    ("at", _TS),
)

#: ``control/limiter_rejections`` (:class:`pipelines.io.sinks.SinkSet`): one row each time a write-back sink sees an
#: in-broker limiter's last rejection move (the RocketMQ admin sink's VIEW, ``TopicRateLimit.lastRateLimitTimestamp``
#: of sohutv/rocketmq 5.3.1-sohu-01): ``broker`` (brokerName), ``resource`` the limiter's key (a topic, or
#: ``%RETRY%<group>``), ``last_rejected_at`` when it last rejected a send (UTC), ``seen_at`` when the sink read it
#: (UTC), ``batch_id`` of the micro-batch that published.
LIMITER_REJECTIONS = _struct(
    ("seen_at", _TS),
    ("sink", _S),
    ("broker", _S),
    ("resource", _S),
    ("last_rejected_at", _TS),
    ("batch_id", _L),
)
