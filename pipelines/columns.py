"""Every DataFrame that crosses a module boundary and every Delta table, column by column, defined once and without
Spark (docs/contracts.md §2): :mod:`pipelines.schemas` builds Spark's ``StructType`` from these, the decision plane
(:mod:`pipelines.decide`) Arrow's schemas, both with :func:`pipelines.columns` type names.

A spec is a tuple of ``(column, type)``; types: ``string``, ``long``, ``int``, ``double``, ``boolean``, ``binary``,
``timestamp`` (UTC; microseconds in Arrow), ``map<string,long>``, ``map<string,double>``, ``array<string>``. TPS
columns are messages per second.

Text: every string column holds valid UTF-8 (Arrow, Parquet readers and pandas refuse anything else). A record's
exact bytes are kept in ``raw_bytes`` (``RAW_RECORD``, ``BRONZE``, ``QUARANTINE``); its ``raw`` is them decoded with
every invalid sequence replaced by U+FFFD (Spark's ``make_valid_utf8`` = Python's ``decode("utf-8", "replace")``).
A record whose ``raw`` differs from its bytes is quarantined (``line is not valid UTF-8``), so every other column
holds text that was valid in the input.
"""

from __future__ import annotations

Spec = tuple[tuple[str, str], ...]


#: What a source yields, whatever the transport: one input record. ``raw_bytes`` is the record's exact bytes (a
#: line of a landing file without its line separator, or a Kafka message value); ``raw`` is the same as valid
#: UTF-8 text, invalid sequences replaced by U+FFFD (module docstring). ``origin`` is the file path or
#: ``kafka:<topic>:<partition>:<offset>``; ``broker_hint`` is the folder name (files) or the Kafka key (as valid
#: UTF-8 text, invalid sequences replaced by U+FFFD; the key's bytes are not kept).
RAW_RECORD = (
    ("source", "string"),
    ("raw", "string"),
    ("raw_bytes", "binary"),
    ("origin", "string"),
    ("broker_hint", "string"),
    ("ingested_at", "timestamp"),
)

#: The JSON envelope log shippers write around a stats.log line (docs/contracts.md §1.1).
STATS_ENVELOPE = (("broker", "string"), ("cluster", "string"), ("line", "string"), ("_corrupt_record", "string"))

#: A send-failure JSON line (docs/contracts.md §1.2). ``ts`` is read as text (epoch millis or ISO-8601);
#: a field of the wrong JSON type makes the record corrupt and it is quarantined.
SEND_FAILURE_JSON = (
    ("ts", "string"),
    ("topic", "string"),
    ("broker", "string"),
    ("producer_group", "string"),
    ("client", "string"),
    ("code", "int"),
    ("message", "string"),
    ("latency_ms", "double"),
    ("_corrupt_record", "string"),
)

#: ``bronze/broker_stats`` and ``bronze/send_failures``: every input record as read (:data:`RAW_RECORD` without
#: ``source``); ``raw_bytes`` its exact bytes, ``raw`` their valid-UTF-8 text.
BRONZE = (("raw", "string"), ("raw_bytes", "binary"), ("origin", "string"), ("broker_hint", "string"),
          ("ingested_at", "timestamp"))

SILVER_BROKER_STATS = (
    ("event_time", "timestamp"),
    ("broker", "string"),
    ("cluster", "string"),
    ("stat_name", "string"),
    ("period", "string"),
    ("stats_key", "string"),
    ("topic", "string"),
    ("consumer_group", "string"),
    ("queue_id", "int"),
    ("sum", "long"),
    ("tps", "double"),
    ("avgpt", "double"),
    ("value", "long"),
    ("origin", "string"),
    ("ingested_at", "timestamp"),
)

SILVER_SEND_FAILURES = (
    ("event_time", "timestamp"),
    ("topic", "string"),
    ("broker", "string"),
    ("producer_group", "string"),
    ("client", "string"),
    ("code", "int"),
    ("failure_class", "string"),
    ("message", "string"),
    ("latency_ms", "double"),
    ("origin", "string"),
    ("ingested_at", "timestamp"),
)

#: ``quarantine``: one row per rejected record. ``source`` is ``broker_stats``, ``send_failures`` (an input record:
#: ``raw_bytes`` its exact bytes, ``raw`` their valid-UTF-8 text) or ``gold/limits`` (a limit decision refused by
#: the ``gold/limits`` suite: ``raw`` the decision as JSON, ``raw_bytes`` null); ``reason`` the first failed check.
QUARANTINE = (
    ("source", "string"), ("raw", "string"), ("raw_bytes", "binary"), ("reason", "string"), ("origin", "string"),
    ("ingested_at", "timestamp")
)

#: ``metric`` of a failed send in :data:`METRIC_EVENT` and :data:`WINDOW_METRIC` rows: ``failure:<failure_class>``.
FAILURE_METRIC_PREFIX = "failure:"

#: The unified stream the windows aggregate: one measured amount at one event time.
#: ``metric`` is a stats name of :data:`pipelines.rocketmq.WINDOWED_STATS` or ``failure:<failure_class>``.
METRIC_EVENT = (
    ("event_time", "timestamp"),
    ("broker", "string"),
    ("topic", "string"),
    ("consumer_group", "string"),
    ("metric", "string"),
    ("amount", "long"),
)

#: What a gold micro-batch hands the decisions of each limitable resource per broker and window, reduced by Spark
#: (:func:`pipelines.decide.rules.windows.resource_traffic`): ``tps`` the limited traffic the broker admitted (msg/s),
#: ``rejected`` its limiter's rejections (failed sends), ``carries`` the broker printed a put line of the topic,
#: ``sendback_tps`` a group's admitted send-backs alone (msg/s; null for a topic: ``tps`` minus it is the consumer
#: client's fallback plain sends, :mod:`pipelines.decide.limits.retry_storm`), ``acceptance`` the share of the sends the
#: broker accepted in the window (:func:`pipelines.decide.rules.facts.acceptance`; 1 when it refused none); window
#: marker rows have ``resource_type`` ``*``.
WINDOW_TRAFFIC = (
    ("window_start", "timestamp"),
    ("window_end", "timestamp"),
    ("resource_type", "string"),
    ("resource", "string"),
    ("broker", "string"),
    ("tps", "double"),
    ("rejected", "long"),
    ("carries", "boolean"),
    ("sendback_tps", "double"),
    ("acceptance", "double"),
)

#: Output of the streaming aggregation: sums per window × broker × topic × group × metric.
WINDOW_METRIC = (
    ("window_start", "timestamp"),
    ("window_end", "timestamp"),
    ("broker", "string"),
    ("topic", "string"),
    ("consumer_group", "string"),
    ("metric", "string"),
    ("amount", "long"),
)

FAILURES_BY_CLASS = "map<string,long>"
#: Per-broker figures (broker name → msg/s, or a share): ``"*"`` is the figure of a broker not listed.
BROKER_FIGURES = "map<string,double>"

#: ``gold/topic_tps``: ``failure_rate`` leaves out ``rate_limited`` (the in-broker limiter's own rejections);
#: ``limit_qps`` is the cluster-wide limit in force in the window (null: none), and such windows are kept out of the
#: topic's surge baseline.
GOLD_TOPIC_TPS = (
    ("window_start", "timestamp"),
    ("window_end", "timestamp"),
    ("topic", "string"),
    ("put_tps", "double"),
    ("brokers_reporting", "int"),
    ("failures", "long"),
    ("busy_failures", "long"),
    ("failures_by_class", FAILURES_BY_CLASS),
    ("failure_rate", "double"),
    ("rate_limited", "long"),
    ("limit_qps", "double"),
)

GOLD_GROUP_TPS = (
    ("window_start", "timestamp"),
    ("window_end", "timestamp"),
    ("consumer_group", "string"),
    ("topic", "string"),
    ("consume_tps", "double"),
    ("retry_tps", "double"),
    ("retry_ratio", "double"),
)

GOLD_BROKER_TPS = (
    ("window_start", "timestamp"),
    ("window_end", "timestamp"),
    ("broker", "string"),
    ("put_tps", "double"),
    ("broker_put_tps", "double"),
    ("topics", "int"),
    ("failures", "long"),
    ("busy_failures", "long"),
    ("failures_by_class", FAILURES_BY_CLASS),
)

GOLD_ANOMALIES = (
    ("window_start", "timestamp"),
    ("window_end", "timestamp"),
    ("resource_type", "string"),
    ("resource", "string"),
    ("anomaly", "string"),
    ("observed_tps", "double"),
    ("baseline_tps", "double"),
    ("severity", "string"),
    ("detail", "string"),
)

#: The key of a limited resource in ``gold/limits`` and ``state/policy``: a topic or a consumer group.
RESOURCE_KEYS = ("resource_type", "resource")
#: A limited resource's key in Python: its :data:`RESOURCE_KEYS` values, ``(resource_type, resource)``, e.g.
#: ``("group", "get-pugc-to-ai-consumer")`` or ``("topic", "pugc-content")``.
Key = tuple[str, str]

GOLD_LIMITS = (
    ("decided_at", "timestamp"),
    ("window_end", "timestamp"),
    ("resource_type", "string"),
    ("resource", "string"),
    ("limit_qps", "double"),
    ("burst", "long"),
    ("previous_qps", "double"),
    ("action", "string"),
    ("mode", "string"),
    ("expires_at", "timestamp"),
    ("reason", "string"),
    ("version", "long"),
    ("basis", "string"),
    ("broker_limits", BROKER_FIGURES),
)

#: Saved policy state per resource (``state/policy``): the latest row per resource with ``batch_id`` below the
#: current micro-batch is the state the policy starts from (:class:`pipelines.decide.records.resource.ResourceState`).
POLICY_STATE = (
    ("resource_type", "string"),
    ("resource", "string"),
    ("limit_qps", "double"),
    ("version", "long"),
    ("last_candidate_end", "timestamp"),
    ("last_decision_end", "timestamp"),
    ("last_change_end", "timestamp"),
    ("lift_at_qps", "double"),
    ("mode", "string"),
    ("target_qps", "double"),
    ("limited_since", "timestamp"),
    ("broker_shares", BROKER_FIGURES),
    ("last_distress_end", "timestamp"),
    ("last_lift_end", "timestamp"),
    ("lifted_target_qps", "double"),
    ("recurrences", "long"),
    ("batch_id", "long"),
    ("baseline_tps", "double"),
    ("busy_load", BROKER_FIGURES),
    ("probe_from_qps", "double"),
    ("probe_ceiling_qps", "double"),
    ("probe_hold_until", "timestamp"),
    ("probe_backoff", "long"),
    ("cause_changes", "long"),
    ("last_capped_end", "timestamp"),
    ("probe_effective_end", "timestamp"),
    ("change_effective_end", "timestamp"),
    ("override_id", "string"),
    ("probe_decided_at", "timestamp"),
    ("window_decisions", "long"),
    ("probe_excess_messages", "double"),
    ("previous_limit_qps", "double"),
    ("at_cap_since", "timestamp"),
)

#: The column of ``state/policy`` naming the operator's override (``control/overrides``) the state was saved under
#: (null: the rules alone); not a field of the policy's state (:mod:`pipelines.decide.paths.overrides` owns it).
OVERRIDE_ID = "override_id"

#: ``quality/validation_results``: one row per expectation per GX validation of a micro-batch
#: (:mod:`pipelines.dataplane.quality`); ``suite`` is the validated table, ``observed_value`` JSON text when GX reports
#: one.
QUALITY_VALIDATION_RESULTS = (
    ("batch_id", "long"),
    ("suite", "string"),
    ("expectation", "string"),
    ("success", "boolean"),
    ("element_count", "long"),
    ("unexpected_count", "long"),
    ("observed_value", "string"),
    ("validated_at", "timestamp"),
)

#: ``quality/validation_runs``: GX's own result of each suite validation of a micro-batch
#: (:mod:`pipelines.dataplane.quality`, rendered by :mod:`pipelines.dataplane.quality.data_docs`); ``suite`` is the
#: validated table (as in ``quality/validation_results``), ``result_json`` is
#: ``ExpectationSuiteValidationResult.to_json_dict()`` as JSON, run name ``batch-<batch_id>``.
QUALITY_VALIDATION_RUNS = (
    ("batch_id", "long"),
    ("suite", "string"),
    ("success", "boolean"),
    ("validated_at", "timestamp"),
    ("result_json", "string"),
)

#: ``quality/reconciliation``: per ingest micro-batch and input, ``records_read = silver_rows + late_rows +
#: quarantine_rows`` (``balanced``). Late rows (behind the gold watermark) are written to silver too; ``silver_rows``
#: counts the others. ``expectation_rows`` is the part of ``quarantine_rows`` rejected by an expectation.
QUALITY_RECONCILIATION = (
    ("batch_id", "long"),
    ("source", "string"),
    ("records_read", "long"),
    ("silver_rows", "long"),
    ("late_rows", "long"),
    ("quarantine_rows", "long"),
    ("expectation_rows", "long"),
    ("watermark", "timestamp"),
    ("max_event_time", "timestamp"),
    ("balanced", "boolean"),
    ("recorded_at", "timestamp"),
)

#: ``backtest/results`` (:mod:`pipelines.backtest`): one row per backtest run × governor on/off × resource class ×
#: metric. ``governor`` is ``with`` | ``without`` | ``both`` (run-level metrics); ``resource_class`` is ``incident``,
#: ``bystander``, ``other`` or ``all``; ``unit`` names the unit of ``value`` (msgs, s, windows, count, pct, qps).
BACKTEST_RESULTS = (
    ("recorded_at", "timestamp"),
    ("run_id", "string"),
    ("scenario", "string"),
    ("seed", "long"),
    ("governor", "string"),
    ("resource_class", "string"),
    ("metric", "string"),
    ("value", "double"),
    ("unit", "string"),
)

#: Input of the broker model UDF (:mod:`udfs.broker_model`): :data:`pipelines.sim.broker_model.OFFERED_COLUMNS`, one
#: row per (UTC minute, broker, resource); ``requests_tps`` msgs/s the limiter sees, ``work_per_request`` write units.
BROKER_MODEL_OFFERED = (
    ("minute_start", "timestamp"),
    ("broker", "string"),
    ("resource_type", "string"),
    ("resource", "string"),
    ("requests_tps", "double"),
    ("work_per_request", "double"),
)

#: Output of the broker model UDF: both frames of :class:`pipelines.sim.broker_model.ModelResult` in one.
#: ``row_kind`` = ``resource`` (per minute, broker, resource: ``offered`` … ``limit_qps``, msgs; limit msgs/s, null
#: when none) or ``broker`` (per minute, broker: ``offered_work`` … ``served_work`` and ``capacity_tps`` units/s,
#: ``reject_share`` 0-1, ``max_wait_ms``); the other kind's columns are null.
BROKER_MODEL_RESULT = (
    ("row_kind", "string"),
    ("minute_start", "timestamp"),
    ("broker", "string"),
    ("resource_type", "string"),
    ("resource", "string"),
    ("offered", "double"),
    ("limited_rejected", "double"),
    ("busy_rejected", "double"),
    ("admitted", "double"),
    ("limit_qps", "double"),
    ("offered_work", "double"),
    ("admitted_work", "double"),
    ("served_work", "double"),
    ("capacity_tps", "double"),
    ("reject_share", "double"),
    ("max_wait_ms", "double"),
)

#: ``control/sink_status`` (:class:`pipelines.writeback.sinks.SinkSet`): one row per write-back sink per gold
#: micro-batch that published: ``ok`` whether the sink now holds the current limits, ``sent`` the messages it accepted,
#: ``attempts`` the tries (1 = first time right), ``error`` the last error (null when ok), ``at`` UTC.
SINK_STATUS = (
    ("batch_id", "long"),
    ("sink", "string"),
    ("ok", "boolean"),
    ("sent", "int"),
    ("attempts", "int"),
    ("error", "string"),
    ("at", "timestamp"),
)

#: ``control/limiter_rejections`` (:class:`pipelines.writeback.sinks.SinkSet`): one row each time a write-back sink sees
#: an in-broker limiter's last rejection move (the RocketMQ admin sink's VIEW, ``TopicRateLimit.lastRateLimitTimestamp``
#: of sohutv/rocketmq 5.3.1-sohu-01): ``broker`` (brokerName), ``resource`` the limiter's key (a topic, or
#: ``%RETRY%<group>``), ``last_rejected_at`` when it last rejected a send (UTC), ``seen_at`` when the sink read it
#: (UTC), ``batch_id`` of the micro-batch that published.
LIMITER_REJECTIONS = (
    ("seen_at", "timestamp"),
    ("sink", "string"),
    ("broker", "string"),
    ("resource", "string"),
    ("last_rejected_at", "timestamp"),
    ("batch_id", "long"),
)

#: ``control/overrides`` (:mod:`pipelines.decide.paths.overrides`): operators' overrides, append-only. A ``create`` row
#: starts one: ``override_id`` (``ovr-`` and hex), ``kind`` (``pin``: held at ``limit_qps``, cluster-wide msg/s;
#: ``exempt``: no enforced limit, ``limit_qps`` null), ``resource_type`` (``topic`` or ``group``), ``resource``,
#: ``starts_at`` and ``ends_at`` (UTC), ``author``, ``reason``. A ``release`` row ends the override of its
#: ``override_id`` at its ``recorded_at``; ``author`` who released it, ``reason`` why (the other columns copied from
#: the override, ``limit_qps`` null). ``recorded_at``: when the row was written (UTC).
OVERRIDES = (
    ("recorded_at", "timestamp"),
    ("event", "string"),
    ("override_id", "string"),
    ("kind", "string"),
    ("resource_type", "string"),
    ("resource", "string"),
    ("limit_qps", "double"),
    ("starts_at", "timestamp"),
    ("ends_at", "timestamp"),
    ("author", "string"),
    ("reason", "string"),
)
