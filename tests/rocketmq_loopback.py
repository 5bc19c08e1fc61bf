"""A loopback RocketMQ name server and Sohu broker for tests: real TCP servers on 127.0.0.1 speaking the remoting
codec of :mod:`control.remoting`, written from the same sources.

The broker keeps a rate map the way sohutv/rocketmq ``RateLimitHandler`` does: a limiter is created on first
traffic (``computeIfAbsent``) at ``sendMsgRateLimitQps`` (2000) for ``SEND_MESSAGE``/``SEND_MESSAGE_V2`` of a topic,
and at ``sendRetryMsgRateLimitQps`` (100) for ``CONSUMER_SEND_MSG_BACK`` of a group (key ``%RETRY%<group>``);
``UPDATE_SEND_MESSAGE_RATE_LIMIT`` calls ``updateLimitQps``, which changes an existing limiter only (a resource that
has seen no traffic stays absent) and answers SUCCESS either way (``AdminBrokerProcessor``);
``VIEW_SEND_MESSAGE_RATE_LIMIT`` answers a ``BrokerRateLimitData`` body (``topicRateLimitList`` of
``TopicRateLimit``); an unknown code answers ``REQUEST_CODE_NOT_SUPPORTED``. The name server answers
``GET_BROKER_CLUSTER_INFO`` with a ``ClusterInfo`` body written the way fastjson writes it (bare numeric keys).

Faults for tests: ``broker.stall`` (read requests, never answer), ``broker.error_code`` (answer admin requests with
that code), ``broker.garbage`` (answer with bytes that are not a frame).
"""

from __future__ import annotations

import json
import socket
import socketserver
import threading

from control import remoting as rm


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(30)
        while not self.server.closing:
            try:
                request = rm.read_frame(sock)
            except (rm.RemotingError, OSError):
                return
            reply = self.server.owner.answer(request)
            if reply is None:
                continue
            try:
                sock.sendall(reply)
            except OSError:
                return


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Loopback:
    """Start/stop of a threaded TCP server on a free 127.0.0.1 port; subclasses implement :meth:`answer`."""

    def __init__(self) -> None:
        self.server = _Server(("127.0.0.1", 0), _Handler)
        self.server.owner = self
        self.server.closing = False
        self.addr = f"127.0.0.1:{self.server.server_address[1]}"
        self.requests: list[rm.RemotingCommand] = []
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def answer(self, request: rm.RemotingCommand) -> bytes | None:  # pragma: no cover - overridden
        raise NotImplementedError

    def stop(self) -> None:
        self.server.closing = True
        self.server.shutdown()
        self.server.server_close()


class LoopbackBroker(_Loopback):
    """A Sohu broker's rate limiter, as seen through its admin requests."""

    def __init__(self, name: str = "broker-a", old_codes: bool = False, default_qps: float = 2000.0,
                 retry_qps: float = 100.0) -> None:
        self.name = name
        self.update_code, self.view_code = rm.RATE_LIMIT_CODES["330/329" if old_codes else "9003/9002"]
        self.default_qps, self.retry_qps = default_qps, retry_qps
        self.rates: dict[str, float] = {}   # RateLimitHandler.rateLimiterMap: resource -> qps
        self.data_version = 0
        self.lock = threading.Lock()
        self.stall = False
        self.error_code: int | None = None
        self.garbage = False
        super().__init__()

    def traffic(self, resource: str, retry: bool = False) -> None:
        """A request reached ``RateLimitHandler.channelRead0`` for ``resource``: create its limiter if absent."""
        with self.lock:
            self.rates.setdefault(resource, self.retry_qps if retry else self.default_qps)

    def answer(self, request: rm.RemotingCommand) -> bytes | None:
        with self.lock:
            self.requests.append(request)
        if self.stall:
            return None
        if self.garbage:
            return b"\x00\x00\x00\x08\x00\x00\x00\x04{bad"
        ext = request.ext_fields or {}
        if request.code == rm.CONSUMER_SEND_MSG_BACK and "group" in ext:
            self.traffic(rm.retry_topic(ext["group"]), retry=True)
            return rm.encode(request.response(rm.SUCCESS))
        if request.code in (rm.SEND_MESSAGE, rm.SEND_MESSAGE_V2):
            topic = ext.get("b") or ext.get("topic")
            if topic:
                self.traffic(topic)
            return rm.encode(request.response(rm.SUCCESS))
        if request.code not in (self.update_code, self.view_code):
            return rm.encode(request.response(rm.REQUEST_CODE_NOT_SUPPORTED,
                                              f" request type {request.code} not supported"))
        if self.error_code is not None:
            return rm.encode(request.response(self.error_code, "injected error"))
        if request.code == self.update_code:
            topic, qps = ext.get("topic"), float(ext.get("topicLimitQps", "-1"))
            with self.lock:
                if topic is not None and qps > -1 and topic in self.rates:  # updateLimitQps: existing limiters only
                    self.rates[topic] = qps
                    self.data_version += 1
            return rm.encode(request.response(rm.SUCCESS))
        with self.lock:
            body = {
                "dataVersion": {"counter": self.data_version, "stateVersion": 0, "timestamp": 0},
                "topicRateLimitList": [
                    {"lastNeedWaitMicrosecs": 0, "lastRateLimitTimestamp": 0, "limitQps": qps, "topic": topic}
                    for topic, qps in self.rates.items()
                ],
            }
        return rm.encode(request.response(rm.SUCCESS, body=json.dumps(body).encode("utf-8")))


class LoopbackNameServer(_Loopback):
    """Answers ``GET_BROKER_CLUSTER_INFO`` for ``brokers`` (master id 0) plus optional slaves (id 1)."""

    def __init__(self, cluster: str, brokers: list[LoopbackBroker], slaves: dict[str, str] | None = None) -> None:
        self.cluster, self.brokers, self.slaves = cluster, brokers, slaves or {}
        super().__init__()

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

    def answer(self, request: rm.RemotingCommand) -> bytes | None:
        self.requests.append(request)
        if request.code != rm.GET_BROKER_CLUSTER_INFO:
            return rm.encode(request.response(rm.REQUEST_CODE_NOT_SUPPORTED, "not supported"))
        return rm.encode(request.response(rm.SUCCESS, body=self.cluster_info_body()))
