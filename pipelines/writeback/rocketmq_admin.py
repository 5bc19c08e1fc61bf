"""Facts about Sohu RocketMQ brokers and the admin requests that read and set their rate limiter.

Two lines of sohutv/rocketmq carry the limiter (``broker/…/netty/RateLimitHandler``: one
``TokenBucketRateLimiter`` per topic and per ``%RETRY%<group>``, created on first traffic at the default rate;
``updateLimitQps`` changes an existing limiter only):

* **current line**, branches 5.1.1-sohu-02, 5.1.1-sohu-03, 5.3.1-sohu-01 (since 2024-08): defaults from
  ``BrokerConfig.sendMsgRateLimitQps`` = **10000** and ``sendRetryMsgRateLimitQps`` = **1000**;
  ``RateLimitConfigManager`` persists every limiter whose rate is not a default, so a rate set there survives a
  restart (and a "default" pushed with the wrong number becomes a permanent throttle). View body
  (``BrokerRateLimitData``): ``{dataVersion, topicRateLimitList}``.
* **older line**, branches 4.9.3-sohu and 5.1.1-sohu: ``BrokerConfig`` defaults **2000** / **100**, handed to the
  ``RateLimitHandler`` at start, nothing persisted. View body ``{disabled, defaultLimitQps, sendMsgBackLimitQps,
  topicRateLimitList}``: the limiter's own defaults of the moment.

Both answer ``GET_BROKER_CONFIG`` (26) with the broker's configuration as ``key=value`` lines
(``Configuration.getAllConfigsFormatString``); the defaults are read from there (older line: from the view body,
which also sees a default changed through the limiter), re-read every ``defaults_refresh_seconds``. The configured
``default_topic_qps`` / ``default_retry_qps`` are only a fallback for a broker that cannot be read; a difference is
logged once per broker.

Request codes (``[sink.rocketmq] request_codes``): ``9003/9002`` on every branch above (4.9.3-sohu since commit
07863b04c, 2023-05-31); ``330/329`` only on 4.9.3-sohu builds before it. On RocketMQ 5.x (Apache and every Sohu
5.x branch) 329 is ``DELETE_EXPIRED_COMMITLOG``: a manual commitlog clean-up answered SUCCESS with an empty body. So
the broker's version (the ``version`` of its responses, ``MQVersion``) is checked before every view, and ``330/329``
is refused on a 5.x broker; an empty or unreadable view body is an error for that broker, never "no limiters".
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field

from control import acl
from control import remoting as rm
from control.remoting_client import RemotingClient
from pipelines.config import ConfigError, RocketMQSinkConfig

log = logging.getLogger("rate_governor.sink.rocketmq")

#: ``BrokerConfig`` keys of the limiter's defaults (every sohutv/rocketmq branch above).
TOPIC_DEFAULT_KEY = "sendMsgRateLimitQps"
RETRY_DEFAULT_KEY = "sendRetryMsgRateLimitQps"
#: Rates closer than this (qps) are equal: the broker stores a double and echoes it back.
RATE_TOLERANCE = 1e-6


def admin_client(cfg: RocketMQSinkConfig) -> RemotingClient:
    """A remoting client with ``cfg``'s request timeout, idle timeout and ACL account (the sink's and the known
    brokers' reads of the name servers, :mod:`pipelines.dataplane.known_brokers`).

    Raises:
        ConfigError: ACL keys configured but unusable (:func:`control.acl.load_credentials`).
    """
    try:
        credentials = acl.load_credentials(cfg.acl_access_key_env, cfg.acl_secret_key_env, cfg.acl_key_file)
    except acl.AclKeyError as exc:
        raise ConfigError(f"[sink.rocketmq] {exc}") from None
    return RemotingClient(timeout_s=cfg.timeout_ms / 1000.0, idle_timeout_s=cfg.idle_timeout_seconds,
                          credentials=credentials)


class BrokerRefused(rm.RemotingError):
    """A broker or name server answered with a response code other than SUCCESS."""


class UnsafeRequestCode(rm.RemotingError):
    """The configured request codes mean something else on this broker (330/329 on RocketMQ 5.x)."""


class DeadlineExceeded(rm.RemotingTimeout):
    """The publish deadline passed before this request could be sent."""


@dataclass(frozen=True)
class Defaults:
    """A master's default rates (qps, per broker) and where they were read: ``GET_BROKER_CONFIG``, ``view`` (older
    line) or ``config`` (the configured fallback)."""

    topic_qps: float
    retry_qps: float
    source: str

    def for_resource(self, resource: str) -> float:
        """Retry topics: ``sendRetryMsgRateLimitQps``; other topics: ``sendMsgRateLimitQps``."""
        return self.retry_qps if resource.startswith(rm.RETRY_GROUP_TOPIC_PREFIX) else self.topic_qps


@dataclass
class RateView:
    """One VIEW answer: ``rates`` {resource: limitQps}; ``last_rejections`` {resource: lastRateLimitTimestamp}
    (epoch ms of the limiter's last rejected request, -1 = none since it was created); the fork ``line`` told by
    the body (``current``, ``older`` or ``unknown``); the older line's own ``defaults`` and ``disabled`` flag."""

    rates: dict[str, float]
    last_rejections: dict[str, int] = field(default_factory=dict)
    line: str = "unknown"
    defaults: Defaults | None = None
    disabled: bool = False


def parse_properties(body: bytes) -> dict[str, str]:
    """``MixAll.properties2String`` output (``key=value`` lines) → dict."""
    out = {}
    for line in body.decode("utf-8", errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and not key.lstrip().startswith("#"):
            out[key.strip()] = value.strip()
    return out


def parse_view(body: bytes) -> RateView:
    """A ``BrokerRateLimitData`` body (either line) → :class:`RateView`.

    Raises:
        rm.RemotingProtocolError: empty body, not JSON, no ``topicRateLimitList`` list, entries without a topic or
            a numeric ``limitQps``.
    """
    if not body:
        raise rm.RemotingProtocolError("view rates: empty body (not a BrokerRateLimitData; does the request code "
                                       "mean something else on this broker?)")
    try:
        data = rm.fastjson_loads(body)
        items = data["topicRateLimitList"]
        if not isinstance(items, list):
            raise TypeError("topicRateLimitList is not a list")
        rates, stamps = {}, {}
        for t in items:
            rates[str(t["topic"])] = float(t["limitQps"])
            stamps[str(t["topic"])] = int(t.get("lastRateLimitTimestamp", -1))
        view = RateView(rates, stamps)
        if "dataVersion" in data:
            view.line = "current"
        elif "defaultLimitQps" in data:
            view.line = "older"
            view.defaults = Defaults(float(data["defaultLimitQps"]), float(data["sendMsgBackLimitQps"]), "view")
            view.disabled = bool(data.get("disabled", False))
        return view
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise rm.RemotingProtocolError(f"view rates: unreadable BrokerRateLimitData: {exc}") from None


class BrokerAdmin:
    """The admin requests of one sink (name server, GET_BROKER_CONFIG, VIEW, UPDATE) with per-master facts: the
    defaults (cached, re-read every ``defaults_refresh_seconds``) and the version check. Thread-safe: the sink calls
    it for several masters at once. Every call takes a ``deadline`` (``time.monotonic()``); a request gets
    ``timeout_ms`` or what is left before the deadline, whichever is less."""

    def __init__(self, cfg: RocketMQSinkConfig, client: RemotingClient) -> None:
        self.cfg = cfg
        self.client = client
        self.update_code, self.view_code = rm.RATE_LIMIT_CODES[cfg.request_codes]
        self.fallback = Defaults(cfg.default_topic_qps, cfg.default_retry_qps, "config")
        self._defaults: dict[str, tuple[Defaults, float]] = {}
        self._logged: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def _timeout(self, deadline: float) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded(f"publish deadline of {self.cfg.publish_deadline_ms} ms passed")
        return min(self.cfg.timeout_ms / 1000.0, left)

    def _once(self, broker: str, what: str, level: int, msg: str, *args) -> None:
        with self._lock:
            if (broker, what) in self._logged:
                return
            self._logged.add((broker, what))
        log.log(level, msg, *args)

    def masters(self, deadline: float) -> dict[str, str]:
        """``{brokerName: address}`` of the cluster's masters, from the first name server that answers.

        Raises:
            rm.RemotingError: no name server answered with a cluster info.
        """
        errors = []
        for addr in self.cfg.namesrv_addr:
            try:
                reply = self.client.invoke(addr, rm.GET_BROKER_CLUSTER_INFO, timeout_s=self._timeout(deadline))
                if reply.code != rm.SUCCESS:
                    raise BrokerRefused(f"code {reply.code}: {reply.remark}")
                return rm.cluster_masters(rm.fastjson_loads(reply.body), self.cfg.cluster)
            except (rm.RemotingError, ValueError) as exc:
                errors.append(f"{addr}: {exc}")
        raise rm.RemotingError("no name server answered: " + "; ".join(errors or ["none configured"]))

    def read_config(self, broker: str, addr: str, deadline: float) -> Defaults:
        """The master's defaults from ``GET_BROKER_CONFIG``; a refusal or missing keys give the configured fallback
        (logged once per broker). Transport errors are raised."""
        reply = self.client.invoke(addr, rm.GET_BROKER_CONFIG, timeout_s=self._timeout(deadline))
        try:
            if reply.code != rm.SUCCESS:
                raise BrokerRefused(f"code {reply.code}: {reply.remark}")
            props = parse_properties(reply.body)
            found = Defaults(float(props[TOPIC_DEFAULT_KEY]), float(props[RETRY_DEFAULT_KEY]), "GET_BROKER_CONFIG")
            if not all(math.isfinite(q) and q > 0 for q in (found.topic_qps, found.retry_qps)):
                raise ValueError(f"non-positive default {found}")
        except (BrokerRefused, KeyError, ValueError) as exc:
            self._once(broker, "fallback", logging.WARNING,
                       "rocketmq sink: %s (%s): cannot read its default rates with GET_BROKER_CONFIG (%s); using the "
                       "configured fallback %s / %s qps", broker, addr, exc, self.fallback.topic_qps,
                       self.fallback.retry_qps)
            return self.fallback
        if (found.topic_qps, found.retry_qps) != (self.fallback.topic_qps, self.fallback.retry_qps):
            self._once(broker, "mismatch", logging.WARNING,
                       "rocketmq sink: %s (%s) defaults to %s=%s / %s=%s; [sink.rocketmq] default_topic_qps / "
                       "default_retry_qps say %s / %s (used only when a broker cannot be read): using the broker's",
                       broker, addr, TOPIC_DEFAULT_KEY, found.topic_qps, RETRY_DEFAULT_KEY, found.retry_qps,
                       self.fallback.topic_qps, self.fallback.retry_qps)
        return found

    def defaults(self, broker: str, addr: str, deadline: float) -> Defaults:
        """The master's defaults from ``GET_BROKER_CONFIG``, cached for ``defaults_refresh_seconds`` (an older-line
        view carries the limiter's own: :attr:`RateView.defaults`, which callers prefer)."""
        with self._lock:
            cached = self._defaults.get(broker)
        if cached is not None and time.monotonic() - cached[1] < self.cfg.defaults_refresh_seconds:
            return cached[0]
        found = self.read_config(broker, addr, deadline)
        with self._lock:
            self._defaults[broker] = (found, time.monotonic())
        return found

    def check_codes(self, broker: str, addr: str) -> None:
        """Refuse ``330/329`` on a RocketMQ 5.x broker (version from its last response).

        Raises:
            UnsafeRequestCode: one line naming the broker, its version and the setting to change.
        """
        version = self.client.server_version.get(addr)
        if self.view_code == rm.VIEW_SEND_MESSAGE_RATE_LIMIT_OLD and (version is None or rm.is_rocketmq5(version)):
            seen = "an unknown version" if version is None else f"RocketMQ {rm.version_name(version)}"
            raise UnsafeRequestCode(
                f"{broker} ({addr}) runs {seen}: request code 329 is DELETE_EXPIRED_COMMITLOG there (a commitlog "
                f"clean-up), not a rate-limit view; not sent. Set [sink.rocketmq] request_codes = \"9003/9002\"")

    def view(self, broker: str, addr: str, deadline: float) -> RateView:
        """The master's limiters (VIEW_SEND_MESSAGE_RATE_LIMIT), after :meth:`check_codes`. With ``330/329`` the
        version is asked afresh right before (``GET_BROKER_CONFIG``; a broker restarted since may be another
        version)."""
        if self.view_code == rm.VIEW_SEND_MESSAGE_RATE_LIMIT_OLD:
            self.client.invoke(addr, rm.GET_BROKER_CONFIG, timeout_s=self._timeout(deadline))
        self.check_codes(broker, addr)
        reply = self.client.invoke(addr, self.view_code, timeout_s=self._timeout(deadline))
        if reply.code != rm.SUCCESS:
            raise BrokerRefused(f"view rates: code {reply.code}: {reply.remark}")
        view = parse_view(reply.body)
        if view.disabled:
            self._once(broker, "disabled", logging.WARNING,
                       "rocketmq sink: %s (%s) has its rate limiter disabled; rates are set but not enforced",
                       broker, addr)
        return view

    def read_master(self, broker: str, addr: str, deadline: float) -> tuple[RateView, Defaults]:
        """One master's rates and defaults: ``GET_BROKER_CONFIG`` when due (before the first view: it tells the
        version the request codes are checked against), then VIEW. The defaults: an older-line view's own when it
        carries them, else the broker configuration's (:meth:`defaults`)."""
        configured = self.defaults(broker, addr, deadline)
        view = self.view(broker, addr, deadline)
        return view, view.defaults or configured

    def update(self, broker: str, addr: str, resource: str, qps: float, deadline: float) -> None:
        """Set one rate (UPDATE_SEND_MESSAGE_RATE_LIMIT, ext fields ``topic`` and ``topicLimitQps``)."""
        if not (math.isfinite(qps) and qps > 0):
            raise ValueError(f"rate for {resource} must be a finite number > 0, got {qps!r}")
        self.check_codes(broker, addr)
        reply = self.client.invoke(addr, self.update_code, {"topic": resource, "topicLimitQps": repr(float(qps))},
                                   timeout_s=self._timeout(deadline))
        if reply.code != rm.SUCCESS:
            raise BrokerRefused(f"update {resource}: code {reply.code}: {reply.remark}")
