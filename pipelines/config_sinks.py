"""Settings of the write-back sinks besides ``control/limits.json`` (``[sink]``, :mod:`pipelines.writeback.sinks`); part
of :class:`pipelines.config.GovernorConfig`, importable from :mod:`pipelines.config` too."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pipelines.config_base import ConfigSection as _Section


class KafkaSinkConfig(_Section):
    """Kafka write-back (kafka-python): a compacted topic, key ``<resource_type>:<resource>``, JSON value,
    tombstone on lift."""

    enabled: bool = Field(False, description="Whether the Kafka sink publishes (production write-back).")
    bootstrap_servers: str = Field("", description="Kafka bootstrap servers, comma-separated ``host:port``.")
    topic: str = Field("rate-governor-limits", description=(
        "Compacted topic of the control records (one partition); the name is this project's convention."))
    replication_factor: int = Field(default=1, ge=1, description=(
        "Replication factor when the sink creates the (compacted, one-partition) topic: 1 suits one local broker; "
        "set the cluster's own (e.g. 3) in production."))
    options: dict[str, str | int | bool] = Field(default_factory=dict, description=(
        "Passed to kafka-python's ``KafkaProducer`` (they override ``acks = \"all\"``, "
        "``enable_idempotence = true``), e.g. ``security_protocol``, ``sasl_mechanism``."))


#: ``BrokerConfig`` ``sendMsgRateLimitQps`` / ``sendRetryMsgRateLimitQps`` of the current sohutv/rocketmq line
#: (5.1.1-sohu-02/-03, 5.3.1-sohu-01), the sink's fallback defaults.
CURRENT_FORK_DEFAULT_QPS = (10000.0, 1000.0)


class RocketMQSinkConfig(_Section):
    """RocketMQ admin write-back (pipelines/writeback/rocketmq_sink.py): limits pushed to the master brokers of a Sohu
    RocketMQ cluster with MQCloud's rate-limit requests. ACL keys (``AclClientRPCHook`` signing) come from the two
    environment variables, else from ``acl_key_file``; neither: requests go unsigned."""

    enabled: bool = Field(False, description="Whether the RocketMQ admin sink publishes.")
    namesrv_addr: tuple[str, ...] = Field((), description=(
        "Name servers, ``host:port`` (``GET_BROKER_CLUSTER_INFO`` finds the master brokers, broker id 0); at "
        "least one when enabled."))
    cluster: str = Field("", description=(
        "Cluster name in the name server's ``clusterAddrTable``; \"\" = every cluster the name server knows."))
    request_codes: Literal["9003/9002", "330/329"] = Field("9003/9002", description=(
        "UPDATE/VIEW rate-limit request codes: ``9003/9002`` on every 5.x Sohu branch and 4.9.3-sohu since commit "
        "07863b04c (2023-05-31; sohutv/rocketmq ``RequestCode``), ``330/329`` for 4.9.3-sohu builds before it. On "
        "5.x, 329 is ``DELETE_EXPIRED_COMMITLOG``: ``330/329`` with the current line's fallback defaults is "
        "refused here, and per broker at run time when its version is 5.x."))
    timeout_ms: int = Field(default=3000, gt=0, description=(
        "One request (connecting included), milliseconds: 3 s, a RocketMQ producer's default send timeout "
        "(``DefaultMQProducer.sendMsgTimeout``)."))
    publish_deadline_ms: int = Field(default=5000, gt=0, description=(
        "One whole publish, milliseconds: masters not done by then are retried on the next publish, so "
        "unreachable masters cannot hold the deciding queries longer."))
    max_parallel_brokers: int = Field(default=16, gt=0, le=256, description=(
        "Masters served at once by one publish (threads)."))
    idle_timeout_seconds: float = Field(default=120.0, gt=0, description=(
        "Seconds: the servers' ``serverChannelMaxIdleTimeSeconds`` (RocketMQ ``NettyServerConfig``, 120); "
        "connections idle for 90 % of it are renewed before use."))
    defaults_refresh_seconds: float = Field(default=300.0, ge=0, description=(
        "Seconds between two reads of each master's default rates (``GET_BROKER_CONFIG``; an operator may change "
        "them)."))
    default_topic_qps: float = Field(default=CURRENT_FORK_DEFAULT_QPS[0], gt=0, description=(
        "Fallback only, msg/s, for a broker whose defaults cannot be read: ``BrokerConfig.sendMsgRateLimitQps`` "
        "of the current sohutv/rocketmq line (5.1.1-sohu-02/-03, 5.3.1-sohu-01: 10000; 2000 on 4.9.3-sohu and "
        "5.1.1-sohu)."))
    default_retry_qps: float = Field(default=CURRENT_FORK_DEFAULT_QPS[1], gt=0, description=(
        "Fallback only, msg/s: ``BrokerConfig.sendRetryMsgRateLimitQps`` of the current line (1000; 100 on the "
        "older one)."))
    acl_access_key_env: str = Field("RATE_GOVERNOR_ROCKETMQ_ACCESS_KEY", description=(
        "Environment variable holding the ACL access key (clusters with ``aclEnable=true``)."))
    acl_secret_key_env: str = Field("RATE_GOVERNOR_ROCKETMQ_SECRET_KEY", description=(
        "Environment variable holding the ACL secret key."))
    acl_key_file: str = Field("", description=(
        "File with ``AccessKey=`` / ``SecretKey=`` lines, read when the variables are unset; \"\" = none."))
    ledger_file: str = Field("", description=(
        "Per master, the resources this sink changed and the rate each had before (restored on lift, expiry and "
        "by ``restore``); \"\" = ``<lake>/control/rocketmq_owned.json``."))

    @model_validator(mode="after")
    def _namesrv_when_enabled(self) -> "RocketMQSinkConfig":
        if self.enabled and not self.namesrv_addr:
            raise ValueError("sink.rocketmq.namesrv_addr must list at least one name server when enabled")
        if self.request_codes == "330/329" and (self.default_topic_qps,
                                                self.default_retry_qps) == CURRENT_FORK_DEFAULT_QPS:
            raise ValueError(
                'sink.rocketmq.request_codes = "330/329" is for 4.9.3-sohu builds before 2023-05 (defaults 2000 / '
                "100); default_topic_qps / default_retry_qps 10000 / 1000 are the current 5.x line, where 329 is "
                'DELETE_EXPIRED_COMMITLOG: use "9003/9002", or set the older line\'s defaults')
        return self


class SinkConfig(_Section):
    """The write-back sinks besides ``control/limits.json`` (:mod:`pipelines.writeback.sinks`)."""

    kafka: KafkaSinkConfig = Field(KafkaSinkConfig(), description="Kafka write-back (``[sink.kafka]``).")
    rocketmq: RocketMQSinkConfig = Field(RocketMQSinkConfig(), description=(
        "RocketMQ admin write-back (``[sink.rocketmq]``)."))
