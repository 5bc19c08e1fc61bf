"""RocketMQ's remoting protocol, the small part an admin client needs: frames, JSON headers, request/response.

Written from Apache RocketMQ's ``org.apache.rocketmq.remoting.protocol.RemotingCommand`` (``encode``,
``headerEncode``, ``markProtocolType``, ``decode``, ``getHeaderLength``, ``getProtocolType``),
``RemotingSerializable`` (fastjson ``JSON.toJSONString``), ``SerializeType`` (JSON = 0, ROCKETMQ = 1),
``LanguageCode``, ``RequestCode``/``ResponseCode``/``RemotingSysResponseCode`` and ``NettyDecoder`` (frame limit);
the rate-limit codes are Sohu's (sohutv/rocketmq ``RequestCode``, sohutv/mqcloud ``SohuMQAdmin``).

A frame on the wire (all integers big-endian)::

    int32 length            = 4 + header length + body length (the length field itself excluded)
    int32 header length     high byte: serialization type (0 JSON), low 3 bytes: header length
    header                  UTF-8 JSON {"code", "extFields", "flag", "language", "opaque", "remark",
                                        "serializeTypeCurrentRPC", "version"}, null fields left out
    body                    the rest (RemotingSerializable JSON for admin bodies)

``flag`` bit 0 marks a response (``RPC_TYPE``), bit 1 a one-way request (``RPC_ONEWAY``). A response carries the
``opaque`` of its request; :class:`RemotingClient` matches them. ``extFields`` values are strings: Java's
``makeCustomHeaderToNet`` sends ``value.toString()`` of every header field, e.g. ``"40.0"`` for a double.

Only JSON headers are implemented; a ROCKETMQ (binary, ``RocketMQSerializable``) header is refused with a clear
error. This module imports only the standard library (no pyspark).
"""

from __future__ import annotations

import itertools
import json
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "RemotingError", "RemotingProtocolError", "RemotingTimeout", "RemotingCommand", "RemotingClient",
    "encode", "decode", "read_frame", "fastjson_loads", "parse_addr", "cluster_masters", "retry_topic",
]

# --- codes (RequestCode / ResponseCode / RemotingSysResponseCode) -----------------------------------------------------
SEND_MESSAGE = 10
CONSUMER_SEND_MSG_BACK = 36
GET_BROKER_CLUSTER_INFO = 106
SEND_MESSAGE_V2 = 310
#: Sohu's rate-limit admin codes, MQCloud numbering (``VIEW_SEND_MESSAGE_RATE_LIMIT_V2`` /
#: ``UPDATE_SEND_MESSAGE_RATE_LIMIT_V2``); older Sohu brokers answer 329 / 330 (MQCloud ``isOldReqestCodeBroker``).
VIEW_SEND_MESSAGE_RATE_LIMIT = 9002
UPDATE_SEND_MESSAGE_RATE_LIMIT = 9003
VIEW_SEND_MESSAGE_RATE_LIMIT_OLD = 329
UPDATE_SEND_MESSAGE_RATE_LIMIT_OLD = 330
#: (update, view) request codes per broker generation, as named in ``[sink.rocketmq] request_codes``.
RATE_LIMIT_CODES: dict[str, tuple[int, int]] = {
    "9003/9002": (UPDATE_SEND_MESSAGE_RATE_LIMIT, VIEW_SEND_MESSAGE_RATE_LIMIT),
    "330/329": (UPDATE_SEND_MESSAGE_RATE_LIMIT_OLD, VIEW_SEND_MESSAGE_RATE_LIMIT_OLD),
}
SUCCESS = 0
SYSTEM_ERROR = 1
SYSTEM_BUSY = 2
REQUEST_CODE_NOT_SUPPORTED = 3

RPC_TYPE_BIT = 1 << 0
RPC_ONEWAY_BIT = 1 << 1
SERIALIZE_JSON = 0
SERIALIZE_ROCKETMQ = 1
#: ``NettyDecoder`` FRAME_MAX_LENGTH default (``com.rocketmq.remoting.frameMaxLength``): 16 MiB.
MAX_FRAME_BYTES = 16_777_216
#: ``MixAll.RETRY_GROUP_TOPIC_PREFIX``; ``MixAll.MASTER_ID`` is broker id 0.
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
MASTER_ID = "0"
_SERIALIZE_NAMES = {SERIALIZE_JSON: "JSON", SERIALIZE_ROCKETMQ: "ROCKETMQ"}


class RemotingError(Exception):
    """A remoting call failed: connection refused or reset, or a bad frame (see the subclasses)."""


class RemotingProtocolError(RemotingError):
    """Bytes that are not a RocketMQ remoting frame: short read, length out of range, non-JSON header."""


class RemotingTimeout(RemotingError):
    """No (matching) response within the timeout."""


@dataclass
class RemotingCommand:
    """One request or response (``RemotingCommand``): ``ext_fields`` are the string header fields."""

    code: int
    ext_fields: dict[str, str] | None = None
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    language: str = "PYTHON"
    version: int = 0
    body: bytes = field(default=b"", repr=False)

    @property
    def is_response(self) -> bool:
        return bool(self.flag & RPC_TYPE_BIT)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & RPC_ONEWAY_BIT)

    def response(self, code: int, remark: str | None = None, body: bytes = b"") -> "RemotingCommand":
        """A response to this request (``createResponseCommand`` + ``setOpaque``)."""
        return RemotingCommand(code, None, self.opaque, RPC_TYPE_BIT, remark, self.language, self.version, body)


def header_json(cmd: RemotingCommand) -> bytes:
    """The JSON header as fastjson writes it: getter names in alphabetical order, null fields left out."""
    header: dict[str, Any] = {"code": cmd.code}
    if cmd.ext_fields is not None:
        header["extFields"] = {str(k): str(v) for k, v in cmd.ext_fields.items()}
    header.update({"flag": cmd.flag, "language": cmd.language, "opaque": cmd.opaque})
    if cmd.remark is not None:
        header["remark"] = cmd.remark
    header.update({"serializeTypeCurrentRPC": "JSON", "version": cmd.version})
    return json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def encode(cmd: RemotingCommand) -> bytes:
    """A whole frame, length field included (``RemotingCommand.encode``)."""
    header = header_json(cmd)
    if len(header) > 0xFFFFFF:
        raise RemotingProtocolError(f"header of {len(header)} bytes does not fit in 24 bits")
    length = 4 + len(header) + len(cmd.body)
    return struct.pack(">iI", length, (SERIALIZE_JSON << 24) | len(header)) + header + cmd.body


def decode(frame: bytes) -> RemotingCommand:
    """A frame without its leading length field (what ``NettyDecoder`` hands to ``RemotingCommand.decode``).

    Raises:
        RemotingProtocolError: shorter than 4 bytes, header length beyond the frame, a ROCKETMQ (binary) or unknown
            serialization type, a header that is not a JSON object, or header fields of the wrong type.
    """
    if len(frame) < 4:
        raise RemotingProtocolError(f"frame of {len(frame)} bytes has no header length")
    (ori,) = struct.unpack(">I", frame[:4])
    kind, header_len = ori >> 24, ori & 0xFFFFFF
    if header_len > len(frame) - 4:
        raise RemotingProtocolError(f"header length {header_len} exceeds the frame ({len(frame) - 4} bytes left)")
    if kind != SERIALIZE_JSON:
        name = _SERIALIZE_NAMES.get(kind, f"unknown ({kind})")
        raise RemotingProtocolError(f"serialization type {name} is not supported; only JSON headers")
    try:
        header = json.loads(frame[4:4 + header_len].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise RemotingProtocolError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("code"), int):
        raise RemotingProtocolError("header is not a JSON object with an integer 'code'")
    ext = header.get("extFields")
    if ext is not None and not isinstance(ext, dict):
        raise RemotingProtocolError("header 'extFields' is not an object")
    try:
        return RemotingCommand(
            code=header["code"],
            ext_fields=None if ext is None else {str(k): str(v) for k, v in ext.items()},
            opaque=int(header.get("opaque", 0)),
            flag=int(header.get("flag", 0)),
            remark=header.get("remark"),
            language=str(header.get("language", "JAVA")),
            version=int(header.get("version", 0)),
            body=bytes(frame[4 + header_len:]),
        )
    except (TypeError, ValueError) as exc:
        raise RemotingProtocolError(f"header field of the wrong type: {exc}") from None


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise RemotingProtocolError(f"connection closed after {got} of {n} bytes (short read)")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(sock: socket.socket, max_bytes: int = MAX_FRAME_BYTES) -> RemotingCommand:
    """Read one frame from ``sock`` (its timeout applies to every read) and decode it.

    Raises:
        RemotingProtocolError: EOF mid-frame, a length < 4 or > ``max_bytes`` (checked before reading the rest, so an
            oversize length never makes us wait for bytes that will not come), or a bad header (:func:`decode`).
        RemotingTimeout: the socket timed out.
    """
    try:
        (length,) = struct.unpack(">i", _recv_exactly(sock, 4))
        if length < 4 or length > max_bytes:
            raise RemotingProtocolError(f"frame length {length} out of range [4, {max_bytes}]")
        return decode(_recv_exactly(sock, length))
    except socket.timeout:
        raise RemotingTimeout("timed out reading a frame") from None


def fastjson_loads(data: bytes | str) -> Any:
    """Parse a RocketMQ JSON body. fastjson writes maps with non-string keys bare (``BrokerData.brokerAddrs``, a
    ``HashMap<Long, String>``, comes out as ``{0:"10.0.0.1:10911"}``); such numeric keys are quoted first (outside
    strings only), then ``json.loads`` parses. Raises ``ValueError`` for anything else that is not JSON."""
    text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    out: list[str] = []
    i, n, in_string, expect_key = 0, len(text), False, False
    while i < n:
        ch = text[i]
        if in_string:
            out.append(ch)
            if ch == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 1
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string, expect_key = True, False
            out.append(ch)
        elif ch in "{,":
            expect_key = True
            out.append(ch)
        elif expect_key and (ch.isdigit() or ch == "-"):
            j = i + 1
            while j < n and text[j].isdigit():
                j += 1
            k = j
            while k < n and text[k] in " \t\r\n":
                k += 1
            if k < n and text[k] == ":":
                out.append(f'"{text[i:j]}"')
            else:
                out.append(text[i:j])
            expect_key = False
            i = j
            continue
        else:
            if not ch.isspace():
                expect_key = False
            out.append(ch)
        i += 1
    return json.loads("".join(out))


def parse_addr(addr: str) -> tuple[str, int]:
    """``"host:port"`` → ``(host, port)``; ``ValueError`` when malformed."""
    host, sep, port = addr.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"address {addr!r} is not host:port")
    return host, int(port)


def retry_topic(group: str) -> str:
    """``MixAll.getRetryTopic``: the retry topic of a consumer group, the key ``RateLimitHandler`` limits
    ``CONSUMER_SEND_MSG_BACK`` under."""
    return RETRY_GROUP_TOPIC_PREFIX + group


def cluster_masters(cluster_info: dict, cluster: str | None = None) -> dict[str, str]:
    """A ``ClusterInfo`` body (``brokerAddrTable`` of ``BrokerData``, ``clusterAddrTable``) → ``{brokerName: master
    address}`` for ``cluster`` (None or "": every cluster). Broker names without a master (id 0) are left out."""
    table = cluster_info.get("brokerAddrTable") or {}
    if cluster:
        names = (cluster_info.get("clusterAddrTable") or {}).get(cluster) or []
    else:
        names = list(table)
    masters = {}
    for name in sorted(names):
        addrs = (table.get(name) or {}).get("brokerAddrs") or {}
        master = addrs.get(MASTER_ID)
        if master:
            masters[name] = master
    return masters


class RemotingClient:
    """Synchronous request/response over one TCP connection per address (``NettyRemotingClient.invokeSync``).

    A response is matched to its request by ``opaque``; frames with another opaque (a late answer to a request that
    timed out) are dropped. Any failure closes that address's connection, so the next call reconnects. Thread-safe.
    """

    def __init__(self, timeout_s: float = 3.0, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self.timeout_s = timeout_s
        self.max_frame_bytes = max_frame_bytes
        self._socks: dict[str, socket.socket] = {}
        self._lock = threading.Lock()
        self._opaque = itertools.count(1)

    def _connect(self, addr: str, deadline: float) -> socket.socket:
        sock = self._socks.get(addr)
        if sock is None:
            host, port = parse_addr(addr)
            sock = socket.create_connection((host, port), timeout=max(0.001, deadline - time.monotonic()))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._socks[addr] = sock
        return sock

    def invoke(self, addr: str, code: int, ext_fields: dict[str, str] | None = None, body: bytes = b"",
               timeout_s: float | None = None) -> RemotingCommand:
        """Send request ``code`` to ``addr`` and return its response (any response code; callers check it).

        Raises:
            RemotingTimeout: no matching response in time. RemotingProtocolError: a bad frame. RemotingError:
            connection refused/reset (wrapping the ``OSError``); ``ValueError`` for a malformed ``addr``.
        """
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        with self._lock:
            request = RemotingCommand(code, ext_fields, next(self._opaque) & 0x7FFFFFFF, body=body)
            try:
                sock = self._connect(addr, deadline)
                sock.settimeout(max(0.001, deadline - time.monotonic()))
                sock.sendall(encode(request))
                while True:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise RemotingTimeout(f"no response from {addr} to code {code}")
                    sock.settimeout(remaining)
                    reply = read_frame(sock, self.max_frame_bytes)
                    if reply.is_response and reply.opaque == request.opaque:
                        return reply
            except RemotingError:
                self._drop(addr)
                raise
            except socket.timeout:
                self._drop(addr)
                raise RemotingTimeout(f"timed out talking to {addr} (code {code})") from None
            except OSError as exc:
                self._drop(addr)
                raise RemotingError(f"{addr}: {exc}") from exc

    def _drop(self, addr: str) -> None:
        sock = self._socks.pop(addr, None)
        if sock is not None:
            sock.close()

    def close(self) -> None:
        with self._lock:
            for addr in list(self._socks):
                self._drop(addr)
