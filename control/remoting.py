"""RocketMQ's remoting protocol, the small part an admin client needs: frames, JSON and binary headers.

Written from Apache RocketMQ's ``org.apache.rocketmq.remoting.protocol.RemotingCommand`` (``encode``,
``headerEncode``, ``markProtocolType``, ``decode``, ``getHeaderLength``, ``getProtocolType``),
``RemotingSerializable`` (fastjson ``JSON.toJSONString``), ``RocketMQSerializable`` (the binary header),
``SerializeType`` (JSON = 0, ROCKETMQ = 1), ``LanguageCode``, ``MQVersion.Version``,
``RequestCode``/``ResponseCode``/``RemotingSysResponseCode`` and ``NettyDecoder`` (frame limit), branch develop; the
rate-limit codes are Sohu's (sohutv/rocketmq ``RequestCode``, sohutv/mqcloud ``SohuMQAdmin``).

A frame on the wire (all integers big-endian)::

    int32 length            = 4 + header length + body length (the length field itself excluded)
    int32 header length     high byte: serialization type (0 JSON, 1 ROCKETMQ), low 3 bytes: header length
    header                  JSON: UTF-8 {"code", "extFields", "flag", "language", "opaque", "remark",
                                         "serializeTypeCurrentRPC", "version"}, null fields left out
                            ROCKETMQ (``RocketMQSerializable.rocketMQProtocolEncode``): int16 code, int8 language
                                         (``LanguageCode``), int16 version, int32 opaque, int32 flag, int32 remark
                                         length + UTF-8 remark, int32 ext length + per ext field (int16 key length,
                                         key, int32 value length, value)
    body                    the rest (RemotingSerializable JSON for admin bodies)

``flag`` bit 0 marks a response (``RPC_TYPE``), bit 1 a one-way request (``RPC_ONEWAY``). A response carries the
``opaque`` of its request (:class:`control.remoting_client.RemotingClient` matches them) and the server's own
version (``MQVersion.CURRENT_VERSION``, an ordinal of ``MQVersion.Version``; :func:`is_rocketmq5`). ``extFields``
values are strings: Java's ``makeCustomHeaderToNet`` sends ``value.toString()`` of every header field, e.g.
``"40.0"`` for a double. A server started with ``rocketmq.serialize.type=ROCKETMQ`` answers every request with a
binary header whatever the request used (``RemotingCommand.serializeTypeConfigInThisServer``). This module imports
only the standard library (no pyspark).
"""

from __future__ import annotations

import json
import socket
import struct
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "RemotingError", "RemotingProtocolError", "RemotingConnectionClosed", "RemotingTimeout", "RemotingCommand",
    "encode", "decode", "read_frame", "fastjson_loads", "parse_addr", "cluster_masters", "retry_topic",
    "is_rocketmq5", "version_name",
]

# --- codes (RequestCode / ResponseCode / RemotingSysResponseCode) -----------------------------------------------------
SEND_MESSAGE = 10
GET_BROKER_CONFIG = 26
CONSUMER_SEND_MSG_BACK = 36
GET_BROKER_CLUSTER_INFO = 106
SEND_MESSAGE_V2 = 310
#: Apache RocketMQ 5.x and every 5.x Sohu branch (``RequestCode``, develop, 5.1.1-sohu, 5.3.1-sohu-01): a manual
#: commitlog clean-up (``AdminBrokerProcessor.deleteExpiredCommitLog``), answered SUCCESS with an empty body.
DELETE_EXPIRED_COMMITLOG = 329
#: Sohu's rate-limit admin codes (sohutv/rocketmq ``RequestCode`` on 4.9.3-sohu since commit 07863b04c,
#: 2023-05-31, and on every 5.x Sohu branch; MQCloud's ``VIEW_SEND_MESSAGE_RATE_LIMIT_V2`` /
#: ``UPDATE_SEND_MESSAGE_RATE_LIMIT_V2``). 4.9.3-sohu builds before that commit answer 329 / 330 (MQCloud
#: ``isOldReqestCodeBroker``), which a 5.x broker reads as ``DELETE_EXPIRED_COMMITLOG`` / an unknown code.
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
SERIALIZE_NAMES = {SERIALIZE_JSON: "JSON", SERIALIZE_ROCKETMQ: "ROCKETMQ"}
#: ``LanguageCode``: enum name (JSON header) <-> byte (binary header).
LANGUAGE_CODES = {"JAVA": 0, "CPP": 1, "DOTNET": 2, "PYTHON": 3, "DELPHI": 4, "ERLANG": 5, "RUBY": 6, "OTHER": 7,
                  "HTTP": 8, "GO": 9, "PHP": 10, "OMS": 11, "RUST": 12, "NODE_JS": 13}
_LANGUAGE_NAMES = {v: k for k, v in LANGUAGE_CODES.items()}
#: ``MQVersion.Version`` ordinals (the ``version`` of every response): ``V5_0_0_SNAPSHOT`` is the first 5.x one.
#: The same in Apache develop and in sohutv/rocketmq 4.9.3-sohu (which reports ``V4_9_1``), 5.1.1-sohu(-02/-03)
#: (``V5_1_1``) and 5.3.1-sohu-01 (``V5_3_1``).
V4_9_1, V4_9_3, V5_0_0_SNAPSHOT, V5_1_1, V5_3_1 = 395, 399, 412, 435, 475
_VERSION_NAMES = {V4_9_1: "V4_9_1", V4_9_3: "V4_9_3", V5_0_0_SNAPSHOT: "V5_0_0_SNAPSHOT", V5_1_1: "V5_1_1",
                  V5_3_1: "V5_3_1"}


def is_rocketmq5(version: int) -> bool:
    """Whether a ``MQVersion.Version`` ordinal (a response's ``version``) is RocketMQ 5.x or later."""
    return version >= V5_0_0_SNAPSHOT


def version_name(version: int) -> str:
    """A readable name for a version ordinal: ``V5_3_1`` when known, else ``4.x``/``5.x`` and the ordinal."""
    name = _VERSION_NAMES.get(version)
    return f"{name} ({version})" if name else f"{'5.x' if is_rocketmq5(version) else '4.x or older'} ({version})"


class RemotingError(Exception):
    """A remoting call failed: connection refused or reset, or a bad frame (see the subclasses)."""


class RemotingProtocolError(RemotingError):
    """Bytes that are not a RocketMQ remoting frame: short read, length out of range, unreadable header."""


class RemotingConnectionClosed(RemotingProtocolError):
    """The peer closed the connection before a whole frame arrived (a "short read")."""


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
    #: The header format this command was decoded from, or is encoded with by default (``SERIALIZE_JSON`` or
    #: ``SERIALIZE_ROCKETMQ``).
    serialize_type: int = SERIALIZE_JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & RPC_TYPE_BIT)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & RPC_ONEWAY_BIT)

    def response(self, code: int, remark: str | None = None, body: bytes = b"") -> "RemotingCommand":
        """A response to this request (``createResponseCommand`` + ``setOpaque``)."""
        return RemotingCommand(code, None, self.opaque, RPC_TYPE_BIT, remark, self.language, self.version, body,
                               self.serialize_type)


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


def header_rocketmq(cmd: RemotingCommand) -> bytes:
    """The binary header (``RocketMQSerializable.rocketMQProtocolEncode``, layout in the module docstring): an
    empty remark is written as length 0, an empty ``extFields`` as length 0; ext fields in ``ext_fields`` order.

    Raises:
        RemotingProtocolError: ``code`` or ``version`` outside int16, a language ``LanguageCode`` does not know,
            a key longer than int16.
    """
    if not -32768 <= cmd.code <= 32767 or not -32768 <= cmd.version <= 32767:
        raise RemotingProtocolError(f"code {cmd.code} / version {cmd.version} do not fit the binary header's int16")
    if cmd.language not in LANGUAGE_CODES:
        raise RemotingProtocolError(f"language {cmd.language!r} has no LanguageCode")
    remark = (cmd.remark or "").encode("utf-8")
    ext = bytearray()
    for key, value in (cmd.ext_fields or {}).items():
        k, v = str(key).encode("utf-8"), str(value).encode("utf-8")
        if len(k) > 32767:
            raise RemotingProtocolError(f"ext field name of {len(k)} bytes does not fit int16")
        ext += struct.pack(">h", len(k)) + k + struct.pack(">i", len(v)) + v
    return (struct.pack(">hbhii", cmd.code, LANGUAGE_CODES[cmd.language], cmd.version, cmd.opaque, cmd.flag)
            + struct.pack(">i", len(remark)) + remark + struct.pack(">i", len(ext)) + bytes(ext))


def encode(cmd: RemotingCommand, serialize_type: int | None = None) -> bytes:
    """A whole frame, length field included (``RemotingCommand.encode``), with a JSON or binary header
    (``serialize_type``, default ``cmd.serialize_type``)."""
    kind = cmd.serialize_type if serialize_type is None else serialize_type
    if kind not in _HEADER_CODECS:
        raise RemotingProtocolError(f"serialization type {kind} is neither JSON (0) nor ROCKETMQ (1)")
    header = _HEADER_CODECS[kind][0](cmd)
    if len(header) > 0xFFFFFF:
        raise RemotingProtocolError(f"header of {len(header)} bytes does not fit in 24 bits")
    length = 4 + len(header) + len(cmd.body)
    return struct.pack(">iI", length, (kind << 24) | len(header)) + header + cmd.body


def _decode_json_header(data: bytes) -> dict[str, Any]:
    try:
        header = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise RemotingProtocolError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("code"), int):
        raise RemotingProtocolError("header is not a JSON object with an integer 'code'")
    ext = header.get("extFields")
    if ext is not None and not isinstance(ext, dict):
        raise RemotingProtocolError("header 'extFields' is not an object")
    header["extFields"] = None if ext is None else {str(k): str(v) for k, v in ext.items()}
    return header


def _decode_rocketmq_header(data: bytes) -> dict[str, Any]:
    """``RocketMQSerializable.rocketMQProtocolDecode``: a zero-length remark or ext value reads as null
    (``readStr``)."""
    pos = 0

    def take(n: int, what: str) -> bytes:
        nonlocal pos
        if n < 0 or pos + n > len(data):
            raise RemotingProtocolError(f"binary header: {what} of {n} bytes runs past the header ({len(data)} bytes)")
        pos += n
        return data[pos - n:pos]

    def text(n: int, what: str) -> str:
        try:
            return take(n, what).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RemotingProtocolError(f"binary header: {what} is not UTF-8: {exc}") from None

    code, lang, version, opaque, flag = struct.unpack(">hbhii", take(13, "fixed fields"))
    (remark_len,) = struct.unpack(">i", take(4, "remark length"))
    remark = text(remark_len, "remark") if remark_len else None
    (ext_len,) = struct.unpack(">i", take(4, "extFields length"))
    ext = None
    if ext_len > 0:
        end = pos + ext_len
        if end > len(data):
            raise RemotingProtocolError(f"binary header: extFields length {ext_len} exceeds the header")
        ext = {}
        while pos < end:
            (klen,) = struct.unpack(">h", take(2, "key length"))
            key = text(klen, "key")
            (vlen,) = struct.unpack(">i", take(4, "value length"))
            ext[key] = text(vlen, "value") if vlen else None
    return {"code": code, "language": _LANGUAGE_NAMES.get(lang, "OTHER"), "version": version, "opaque": opaque,
            "flag": flag, "remark": remark, "extFields": ext}


#: Serialization type → (header encoder, header decoder).
_HEADER_CODECS = {SERIALIZE_JSON: (header_json, _decode_json_header),
                  SERIALIZE_ROCKETMQ: (header_rocketmq, _decode_rocketmq_header)}


def decode(frame: bytes) -> RemotingCommand:
    """A frame without its leading length field (what ``NettyDecoder`` hands to ``RemotingCommand.decode``); the
    header may be JSON or ROCKETMQ (binary), told by the high byte of the header length.

    Raises:
        RemotingProtocolError: shorter than 4 bytes, header length beyond the frame, an unknown serialization type,
            a JSON header that is not an object, a binary header cut short, header fields of the wrong type.
    """
    if len(frame) < 4:
        raise RemotingProtocolError(f"frame of {len(frame)} bytes has no header length")
    (ori,) = struct.unpack(">I", frame[:4])
    kind, header_len = ori >> 24, ori & 0xFFFFFF
    if header_len > len(frame) - 4:
        raise RemotingProtocolError(f"header length {header_len} exceeds the frame ({len(frame) - 4} bytes left)")
    if kind not in _HEADER_CODECS:
        raise RemotingProtocolError(f"serialization type unknown ({kind}); JSON (0) and ROCKETMQ (1) are known")
    header = _HEADER_CODECS[kind][1](bytes(frame[4:4 + header_len]))
    try:
        return RemotingCommand(
            code=header["code"],
            ext_fields=header.get("extFields"),
            opaque=int(header.get("opaque", 0)),
            flag=int(header.get("flag", 0)),
            remark=header.get("remark"),
            language=str(header.get("language", "JAVA")),
            version=int(header.get("version", 0)),
            body=bytes(frame[4 + header_len:]),
            serialize_type=kind,
        )
    except (TypeError, ValueError) as exc:
        raise RemotingProtocolError(f"header field of the wrong type: {exc}") from None


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise RemotingConnectionClosed(f"connection closed after {got} of {n} bytes (short read)")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(sock: socket.socket, max_bytes: int = MAX_FRAME_BYTES) -> RemotingCommand:
    """Read one frame from ``sock`` (its timeout applies to every read) and decode it.

    Raises:
        RemotingConnectionClosed: EOF before a whole frame. RemotingProtocolError: a length < 4 or > ``max_bytes``
            (checked before reading the rest, so an oversize length never makes us wait for bytes that will not
            come), or a bad header (:func:`decode`).
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
