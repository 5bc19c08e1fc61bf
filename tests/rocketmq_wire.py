"""The loopback RocketMQ servers' own wire codec (tests/rocketmq_loopback.py): frames with JSON or binary headers,
request codes and version ordinals, written from Apache RocketMQ (develop) ``RemotingCommand``,
``RocketMQSerializable``, ``RemotingSerializable`` (fastjson), ``LanguageCode``, ``RequestCode``, ``MQVersion`` and
sohutv/rocketmq ``RequestCode`` (5.3.1-sohu-01, 4.9.3-sohu). It deliberately shares no code with
:mod:`control.remoting`: the sink is tested against an independent implementation, and these servers also run
against older versions of the sink.
"""

from __future__ import annotations

import json
import socket
import struct
from dataclasses import dataclass, field


class RC:
    """``RequestCode`` / ``ResponseCode`` / ``MQVersion.Version`` ordinals / ``SerializeType`` (Apache develop;
    sohutv/rocketmq 5.3.1-sohu-01 and 4.9.3-sohu for the rate-limit codes)."""

    SEND_MESSAGE, GET_BROKER_CONFIG, CONSUMER_SEND_MSG_BACK, GET_BROKER_CLUSTER_INFO = 10, 26, 36, 106
    SEND_MESSAGE_V2, DELETE_EXPIRED_COMMITLOG = 310, 329
    VIEW, UPDATE, VIEW_OLD, UPDATE_OLD = 9002, 9003, 329, 330
    SUCCESS, SYSTEM_ERROR, SYSTEM_BUSY, REQUEST_CODE_NOT_SUPPORTED = 0, 1, 2, 3
    V4_9_1, V4_9_3, V5_0_0_SNAPSHOT, V5_1_1, V5_3_1 = 395, 399, 412, 435, 475
    JSON, ROCKETMQ = 0, 1


LANGUAGES = ["JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY", "OTHER", "HTTP", "GO", "PHP", "OMS",
             "RUST", "NODE_JS"]  # LanguageCode, by code


@dataclass
class Frame:
    """One ``RemotingCommand`` as the loopback reads or writes it."""

    code: int
    ext_fields: dict[str, str] | None = None
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    language: str = "JAVA"
    version: int = 0
    body: bytes = field(default=b"", repr=False)
    serialize_type: int = RC.JSON


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def read_frame(sock: socket.socket) -> Frame:
    """``NettyDecoder`` + ``RemotingCommand.decode``: int32 length, int32 (type << 24 | header length), header,
    body. Raises ``socket.timeout`` when idle, ``ConnectionError``/``ValueError`` for a closed peer or bad bytes."""
    (length,) = struct.unpack(">i", _recv(sock, 4))
    if not 4 <= length <= 16_777_216:
        raise ValueError(f"frame length {length}")
    data = _recv(sock, length)
    (ori,) = struct.unpack(">I", data[:4])
    kind, size = ori >> 24, ori & 0xFFFFFF
    header, body = data[4:4 + size], data[4 + size:]
    if kind == RC.JSON:
        h = json.loads(header)
        return Frame(h["code"], h.get("extFields"), h.get("opaque", 0), h.get("flag", 0), h.get("remark"),
                     h.get("language", "JAVA"), h.get("version", 0), body, kind)
    # RocketMQSerializable.rocketMQProtocolDecode
    code, lang, version, opaque, flag = struct.unpack_from(">hbhii", header, 0)
    pos = 13
    (n,) = struct.unpack_from(">i", header, pos)
    remark = header[pos + 4:pos + 4 + n].decode("utf-8") if n else None
    pos += 4 + n
    (n,) = struct.unpack_from(">i", header, pos)
    pos += 4
    ext, end = ({} if n > 0 else None), pos + n
    while pos < end:
        (k,) = struct.unpack_from(">h", header, pos)
        key = header[pos + 2:pos + 2 + k].decode("utf-8")
        pos += 2 + k
        (v,) = struct.unpack_from(">i", header, pos)
        ext[key] = header[pos + 4:pos + 4 + v].decode("utf-8")
        pos += 4 + v
    return Frame(code, ext, opaque, flag, remark, LANGUAGES[lang], version, body, kind)


def write_frame(f: Frame) -> bytes:
    """``RemotingCommand.encode`` with a JSON header (fastjson: alphabetical, nulls left out) or a binary one
    (``RocketMQSerializable.rocketMQProtocolEncode``)."""
    if f.serialize_type == RC.JSON:
        h = {"code": f.code, "extFields": f.ext_fields, "flag": f.flag, "language": f.language, "opaque": f.opaque,
             "remark": f.remark, "serializeTypeCurrentRPC": "JSON", "version": f.version}
        header = json.dumps({k: v for k, v in h.items() if v is not None}, separators=(",", ":")).encode("utf-8")
    else:
        remark = (f.remark or "").encode("utf-8")
        ext = b"".join(struct.pack(">h", len(k.encode())) + k.encode() + struct.pack(">i", len(v.encode()))
                       + v.encode() for k, v in (f.ext_fields or {}).items())
        header = (struct.pack(">hbhii", f.code, LANGUAGES.index(f.language), f.version, f.opaque, f.flag)
                  + struct.pack(">i", len(remark)) + remark + struct.pack(">i", len(ext)) + ext)
    return struct.pack(">ii", 4 + len(header) + len(f.body), (f.serialize_type << 24) | len(header)) + header + f.body


def retry_topic(group: str) -> str:
    return "%RETRY%" + group


def is_rocketmq5(version: int) -> bool:
    return version >= RC.V5_0_0_SNAPSHOT
