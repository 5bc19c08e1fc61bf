"""A loopback RocketMQ name server and Sohu brokers for tests: real TCP servers on 127.0.0.1 speaking the remoting
protocol, written from the sources named below. They carry their own frame codec (tests/rocketmq_wire.py: JSON and
``RocketMQSerializable`` binary headers), request codes and ACL check, and do not import the code under test, so a
codec or signing bug in :mod:`control` cannot hide behind the same bug here, and the tests also run against older
versions of the sink.

Broker (``LoopbackBroker``), per fork line of sohutv/rocketmq:

* ``line="current"`` (5.1.1-sohu-02/-03, 5.3.1-sohu-01; reports ``V5_3_1``): ``BrokerConfig`` defaults
  ``sendMsgRateLimitQps`` 10000 / ``sendRetryMsgRateLimitQps`` 1000; ``RateLimitConfigManager`` persists every
  limiter whose rate is not a default (``encode``: skipped when a retry limiter is at the retry default or any
  limiter at the topic default) and recreates them on start (:meth:`LoopbackBroker.restart`); view body
  ``{dataVersion, topicRateLimitList}``.
* ``line="older"`` (4.9.3-sohu, reports ``V4_9_1``; 5.1.1-sohu with ``version=V5_1_1``): defaults 2000 / 100, held by
  the ``RateLimitHandler``, nothing persisted; view body ``{defaultLimitQps, disabled, sendMsgBackLimitQps,
  topicRateLimitList}``. ``old_codes=True``: a 4.9.3-sohu build before 2023-05-31, rate-limit codes 330 / 329.

Both: a limiter is created on first traffic (``RateLimitHandler.channelRead0``, ``computeIfAbsent``) for
``SEND_MESSAGE``/``SEND_MESSAGE_V2`` of a topic and ``CONSUMER_SEND_MSG_BACK`` of a group (``%RETRY%<group>``), and
rejects sends over its rate in a second with ``SYSTEM_BUSY`` (a per-second window, simpler than
``TokenBucketRateLimiter``), stamping ``lastRateLimitTimestamp`` (-1 until then); UPDATE changes an existing limiter
only and answers SUCCESS either way (``AdminBrokerProcessor.updateSendMessageRateLimit``); ``GET_BROKER_CONFIG``
answers ``key=value`` lines (``Configuration.getAllConfigsFormatString``); :meth:`update_broker_config` is
``UPDATE_BROKER_CONFIG`` of the rate keys (current line: ``setDefaultLimitQps`` / ``setSendMsgBackLimitQps`` reset
every limiter of that kind); on the older line UPDATE's ``defaultLimitQps`` / ``sendMsgBackLimitQps`` change the
limiter's defaults only, which its view reports and GET_BROKER_CONFIG does not. On a 5.x version 329 is ``DELETE_EXPIRED_COMMITLOG``: counted in ``commitlog_cleanups``, answered SUCCESS
with an empty body. Other codes: ``REQUEST_CODE_NOT_SUPPORTED``. Every response carries the broker's ``version``.

Both servers: ``serialize="ROCKETMQ"`` answers binary headers (``rocketmq.serialize.type``); ``idle_close_s`` closes
a connection idle that long (``IdleStateHandler``, ``serverChannelMaxIdleTimeSeconds``); :meth:`restart` stops (every
open connection closed, as when the process dies) and listens again on the same port; ``acl={access: secret}``
verifies every request as ``PlainAccessResource.parse`` + ``PlainPermissionManager.validate`` do (own code here,
not :mod:`control.acl`) and refuses with ``SYSTEM_ERROR`` and the ``AclException`` text.

Faults: ``stall`` (read requests, never answer), ``error_code`` (answer admin requests with it), ``garbage`` (bytes
that are not a frame), ``empty_view`` (VIEW answered SUCCESS with an empty body).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import socket
import socketserver
import struct
import threading
import time

from tests.rocketmq_wire import RC, Frame, is_rocketmq5, read_frame, retry_topic, write_frame


ACL_EXCEPTION = "org.apache.rocketmq.acl.common.AclException"
UNIQUE_MSG_QUERY_FLAG = "_UNIQUE_KEY_QUERY"  # MixAll; skipped by PlainAccessResource.parse for versions <= V4_9_3
LINES = {
    "current": {"defaults": (10000.0, 1000.0), "persist": True, "version": RC.V5_3_1},
    "older": {"defaults": (2000.0, 100.0), "persist": False, "version": RC.V4_9_1},
}


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        owner, sock = self.server.owner, self.request
        owner._opened(sock)
        sock.settimeout(owner.idle_close_s or 120.0)
        try:
            while not self.server.closing:
                try:
                    request = read_frame(sock)
                except socket.timeout:
                    owner.idle_closed += 1  # IdleStateHandler ALL_IDLE: RemotingHelper.closeChannel
                    return
                except (OSError, ValueError, KeyError, struct.error, UnicodeDecodeError):
                    return
                reply = owner.answer(request)
                if reply is None:
                    continue
                try:
                    sock.sendall(reply)
                except OSError:
                    return
        finally:
            owner._closed(sock)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Loopback:
    """A threaded TCP server on 127.0.0.1 (a free port, kept across :meth:`restart`); subclasses implement
    :meth:`answer`."""

    def __init__(self, version: int, serialize: str = "JSON", idle_close_s: float | None = None,
                 acl: dict[str, str] | None = None) -> None:
        self.version = version
        self.serialize_type = {"JSON": RC.JSON, "ROCKETMQ": RC.ROCKETMQ}[serialize]
        self.idle_close_s = idle_close_s
        self.acl = acl
        self.requests: list[Frame] = []
        self.connections = 0  # accepted, over the server's life
        self.idle_closed = 0
        self.lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self._start(0)

    def _start(self, port: int) -> None:
        self.server = _Server(("127.0.0.1", port), _Handler)
        self.server.owner = self
        self.server.closing = False
        self.addr = f"127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def _opened(self, sock: socket.socket) -> None:
        with self.lock:
            self._socks.add(sock)
            self.connections += 1

    def _closed(self, sock: socket.socket) -> None:
        with self.lock:
            self._socks.discard(sock)

    def stop(self) -> None:
        """Stop listening and close every open connection (what the client sees when the process dies)."""
        self.server.closing = True
        self.server.shutdown()
        self.server.server_close()
        with self.lock:
            socks = list(self._socks)
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def restart(self) -> None:
        """Stop, then listen again on the same port (a broker or name server restarted in place)."""
        port = self.server.server_address[1]
        self.stop()
        self._on_restart()
        self._start(port)

    def _on_restart(self) -> None:
        pass

    def reply(self, request: Frame, code: int, remark: str | None = None, body: bytes = b"",
              ext: dict[str, str] | None = None) -> bytes:
        """A response frame (flag bit 0, ``RPC_TYPE``) in this server's header format, carrying its version."""
        return write_frame(Frame(code, ext, request.opaque, 1, remark, "JAVA", self.version, body, self.serialize_type))

    def acl_refusal(self, request: Frame) -> bytes | None:
        """``PlainAccessResource.parse`` + ``PlainPermissionManager.validate`` (sohutv/rocketmq 5.3.1-sohu-01): the
        content is the values of the ext fields sorted by name (``TreeMap``), ``Signature`` left out, then the
        body; the signature Base64(HmacSHA1(secret, content)). None when accepted (or ACL off)."""
        if self.acl is None:
            return None
        ext = request.ext_fields or {}
        access = ext.get("AccessKey")
        if access is None:
            why = "No accessKey is configured"
        elif access not in self.acl:
            why = f"No acl config for {access}"
        else:
            content = "".join(ext[k] for k in sorted(ext) if k != "Signature"
                              and not (request.version <= RC.V4_9_3 and k == UNIQUE_MSG_QUERY_FLAG))
            mac = hmac.new(self.acl[access].encode("utf-8"), content.encode("utf-8") + request.body, hashlib.sha1)
            if base64.b64encode(mac.digest()).decode("ascii") == ext.get("Signature"):
                return None
            why = f"Check signature failed for accessKey={access}"
        return self.reply(request, RC.SYSTEM_ERROR, f"{ACL_EXCEPTION}: {why}")

    def answer(self, request: Frame) -> bytes | None:  # pragma: no cover - overridden
        raise NotImplementedError


class LoopbackBroker(_Loopback):
    """A Sohu broker's rate limiter, as seen through its admin requests (module docstring)."""

    def __init__(self, name: str = "broker-a", line: str = "current", *, version: int | None = None,
                 old_codes: bool = False, serialize: str = "JSON", idle_close_s: float | None = None,
                 acl: dict[str, str] | None = None, default_qps: float | None = None,
                 retry_qps: float | None = None) -> None:
        spec = LINES[line]
        self.name, self.line, self.persists = name, line, spec["persist"]
        version = spec["version"] if version is None else version
        if old_codes and (line != "older" or is_rocketmq5(version)):
            raise ValueError("codes 330/329 existed only on 4.9.3-sohu (older line, 4.x)")
        self.update_code, self.view_code = (RC.UPDATE_OLD, RC.VIEW_OLD) if old_codes else (RC.UPDATE, RC.VIEW)
        self.default_qps = spec["defaults"][0] if default_qps is None else default_qps  # the limiter's defaults
        self.retry_qps = spec["defaults"][1] if retry_qps is None else retry_qps
        self.config_qps = (self.default_qps, self.retry_qps)  # BrokerConfig, what GET_BROKER_CONFIG reports
        self.rates: dict[str, float] = {}   # RateLimitHandler.rateLimiterMap: resource -> qps
        self.stamps: dict[str, int] = {}    # resource -> lastRateLimitTimestamp (ms, -1 = never)
        self._window: dict[str, tuple[int, int]] = {}  # resource -> (second, permits used)
        self.persisted: dict[str, float] = {}  # the RateLimitConfigManager file (current line)
        self.data_version = 0
        self.commitlog_cleanups = 0
        self.stall = False
        self.error_code: int | None = None
        self.garbage = False
        self.empty_view = False
        self.disabled = False  # older line: RateLimitHandler.disabled (UPDATE's "disabled")
        super().__init__(version, serialize, idle_close_s, acl)

    # --- RateLimitHandler -----------------------------------------------------------------------------------------
    def _is_retry(self, resource: str) -> bool:
        return resource.startswith("%RETRY%")

    def traffic(self, resource: str, retry: bool | None = None) -> bool:
        """A request reached ``RateLimitHandler.channelRead0`` for ``resource``: create its limiter if absent,
        then acquire a permit; False (and ``lastRateLimitTimestamp`` stamped) when the limiter rejects it."""
        retry = self._is_retry(resource) if retry is None else retry
        with self.lock:
            qps = self.rates.setdefault(resource, self.retry_qps if retry else self.default_qps)
            self.stamps.setdefault(resource, -1)
            second = int(time.time())
            start, used = self._window.get(resource, (second, 0))
            used = used if start == second else 0
            if used + 1 > max(1.0, qps):
                self.stamps[resource] = int(time.time() * 1000)
                return False
            self._window[resource] = (second, used + 1)
            return True

    def _persist(self) -> None:
        """``RateLimitConfigManager.encode``: only limiters not at a default are written."""
        if self.persists:
            self.persisted = {k: v for k, v in self.rates.items()
                              if not ((self._is_retry(k) and v == self.retry_qps) or v == self.default_qps)}

    def _set_defaults(self, topic_qps: float | None, retry_qps: float | None) -> None:
        """``RateLimitHandler.setDefaultLimitQps`` / ``setSendMsgBackLimitQps``: every limiter of that kind is set to
        the new default (both lines). Caller holds the lock."""
        if topic_qps is not None:
            self.default_qps = topic_qps
            self.rates.update({k: topic_qps for k in self.rates if not self._is_retry(k)})
        if retry_qps is not None:
            self.retry_qps = retry_qps
            self.rates.update({k: retry_qps for k in self.rates if self._is_retry(k)})
        self.data_version += 1

    def update_broker_config(self, topic_qps: float | None = None, retry_qps: float | None = None) -> None:
        """``UPDATE_BROKER_CONFIG`` with the rate keys: the ``BrokerConfig`` values; on the current line
        (``AdminBrokerProcessor.updateBrokerConfig``, 5.3.1-sohu-01) also the limiter's defaults and limiters. The
        older line's limiter takes them at the next start only (4.9.3-sohu ``BrokerController``)."""
        with self.lock:
            self.config_qps = (self.config_qps[0] if topic_qps is None else topic_qps,
                               self.config_qps[1] if retry_qps is None else retry_qps)
            if self.line == "current":
                self._set_defaults(topic_qps, retry_qps)
                self._persist()

    def _on_restart(self) -> None:
        with self.lock:  # RateLimitConfigManager.load(): the persisted limiters come back, nothing else
            self.default_qps, self.retry_qps = self.config_qps
            self.rates = dict(self.persisted) if self.persists else {}
            self.stamps = {k: -1 for k in self.rates}
            self._window = {}

    # --- requests -------------------------------------------------------------------------------------------------
    def config_body(self) -> bytes:
        props = {"brokerName": self.name, "brokerClusterName": "c1", "brokerId": "0", "listenPort":
                 self.addr.rsplit(":", 1)[1], "sendMsgRateLimitQps": repr(self.config_qps[0]),
                 "sendRetryMsgRateLimitQps": repr(self.config_qps[1]), "enableRateLimit": "true"}
        return "".join(f"{k}={v}\n" for k, v in props.items()).encode("utf-8")

    def view_body(self) -> bytes:
        with self.lock:
            items = [{"lastNeedWaitMicrosecs": -1, "lastRateLimitTimestamp": self.stamps.get(topic, -1),
                      "limitQps": qps, "topic": topic} for topic, qps in self.rates.items()]
            if self.line == "current":
                body = {"dataVersion": {"counter": self.data_version, "stateVersion": 0, "timestamp": 0},
                        "topicRateLimitList": items}
            else:
                body = {"defaultLimitQps": self.default_qps, "disabled": self.disabled,
                        "sendMsgBackLimitQps": self.retry_qps, "topicRateLimitList": items}
        return json.dumps(body, sort_keys=True).encode("utf-8")

    def answer(self, request: Frame) -> bytes | None:
        with self.lock:
            self.requests.append(request)
        if self.stall:
            return None
        if self.garbage:
            return b"\x00\x00\x00\x08\x00\x00\x00\x04{bad"
        refused = self.acl_refusal(request)
        if refused is not None:
            return refused
        ext = request.ext_fields or {}
        if request.code == RC.CONSUMER_SEND_MSG_BACK and "group" in ext:
            ok = self.traffic(retry_topic(ext["group"]), retry=True)
            return self.reply(request, RC.SUCCESS if ok else RC.SYSTEM_BUSY)
        if request.code in (RC.SEND_MESSAGE, RC.SEND_MESSAGE_V2):
            topic = ext.get("b") or ext.get("topic")
            ok = self.traffic(topic) if topic else True
            return self.reply(request, RC.SUCCESS if ok else RC.SYSTEM_BUSY,
                              None if ok else f"[RateLimit] for {topic} need wait:1000000microsecs")
        if request.code == RC.GET_BROKER_CONFIG:
            return self.reply(request, RC.SUCCESS, body=self.config_body(),
                              ext={"version": json.dumps({"counter": self.data_version, "timestamp": 0})})
        if request.code in (self.update_code, self.view_code):
            if self.error_code is not None:
                return self.reply(request, self.error_code, "injected error")
            if request.code == self.view_code:
                return self.reply(request, RC.SUCCESS, body=b"" if self.empty_view else self.view_body())
            topic, qps = ext.get("topic"), float(ext.get("topicLimitQps", "-1"))
            with self.lock:
                if self.line == "older":  # 4.9.3-sohu UpdateSendMsgRateLimitRequestHeader: the limiter's defaults
                    topic_default = float(ext.get("defaultLimitQps", "-1"))
                    retry_default = float(ext.get("sendMsgBackLimitQps", "-1"))
                    if topic_default > -1 or retry_default > -1:
                        self._set_defaults(topic_default if topic_default > -1 else None,
                                           retry_default if retry_default > -1 else None)
                if topic is not None and qps > -1 and topic in self.rates:  # updateLimitQps: existing limiters only
                    self.rates[topic] = qps
                    self.data_version += 1
                    self._persist()
            return self.reply(request, RC.SUCCESS)
        if request.code == RC.DELETE_EXPIRED_COMMITLOG and is_rocketmq5(self.version):
            with self.lock:
                self.commitlog_cleanups += 1  # messageStore.executeDeleteFilesManually()
            return self.reply(request, RC.SUCCESS)
        return self.reply(request, RC.REQUEST_CODE_NOT_SUPPORTED, f" request type {request.code} not supported")


class LoopbackNameServer(_Loopback):
    """Answers ``GET_BROKER_CLUSTER_INFO`` for ``brokers`` (master id 0) plus optional slaves (id 1)."""

    def __init__(self, cluster: str, brokers: list[LoopbackBroker], slaves: dict[str, str] | None = None, *,
                 version: int = RC.V5_3_1, serialize: str = "JSON", idle_close_s: float | None = None,
                 acl: dict[str, str] | None = None) -> None:
        self.cluster, self.brokers, self.slaves = cluster, brokers, slaves or {}
        super().__init__(version, serialize, idle_close_s, acl)

    def cluster_info_body(self) -> bytes:
        """``ClusterInfo`` as fastjson writes it: ``brokerAddrs`` is a ``HashMap<Long, String>``, keys bare."""
        tables = []
        for b in self.brokers:
            addrs = f'0:"{b.addr}"' + (f',1:"{self.slaves[b.name]}"' if b.name in self.slaves else "")
            tables.append(f'"{b.name}":{{"brokerAddrs":{{{addrs}}},"brokerName":"{b.name}",'
                          f'"cluster":"{self.cluster}","enableActingMaster":false}}')
        names = ",".join(f'"{b.name}"' for b in self.brokers)
        return (f'{{"brokerAddrTable":{{{",".join(tables)}}},'
                f'"clusterAddrTable":{{"{self.cluster}":[{names}]}}}}').encode("utf-8")

    def answer(self, request: Frame) -> bytes | None:
        with self.lock:
            self.requests.append(request)
        refused = self.acl_refusal(request)
        if refused is not None:
            return refused
        if request.code != RC.GET_BROKER_CLUSTER_INFO:
            return self.reply(request, RC.REQUEST_CODE_NOT_SUPPORTED, "not supported")
        return self.reply(request, RC.SUCCESS, body=self.cluster_info_body())
