"""The remoting codec (control/remoting.py) and client (control/remoting_client.py): golden bytes from
RemotingCommand's JSON and RocketMQSerializable's binary layout, bad frames, ACL signing, and real requests over
loopback sockets: reconnects after a server restart or idle close, renewal of idle connections, binary answers."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import socket
import struct
import threading
import time

import pytest

from control import acl
from control import remoting as rm
from control.remoting_client import RemotingClient
from tests.rocketmq_loopback import RC, LoopbackBroker, LoopbackNameServer

#: A response frame a 4.9.5 name server sent (version 403), as captured in a public CVE-2023-33246 write-up:
#: length 0x63 = 4 + 95, header length 0x5f = 95 with serialization byte 0 (JSON), then fastjson's header.
CAPTURED_RESPONSE = (b"\x00\x00\x00c\x00\x00\x00_"
                     b'{"code":0,"flag":1,"language":"JAVA","opaque":0,"serializeTypeCurrentRPC":"JSON","version":403}')


def test_encode_matches_a_captured_broker_frame_byte_for_byte():
    cmd = rm.RemotingCommand(code=0, opaque=0, flag=1, language="JAVA", version=403)
    assert rm.encode(cmd) == CAPTURED_RESPONSE


def test_golden_request_with_ext_fields_and_body():
    """RemotingCommand.encode: int32 total = 4 + header + body; int32 = (JSON << 24) | header length; header; body.
    Header keys in fastjson's (alphabetical) order, extFields values strings (makeCustomHeaderToNet toString)."""
    cmd = rm.RemotingCommand(code=9003, ext_fields={"topic": "%RETRY%g1", "topicLimitQps": "40.0"}, opaque=7,
                             language="JAVA", version=453, body=b"xy")
    header = (b'{"code":9003,"extFields":{"topic":"%RETRY%g1","topicLimitQps":"40.0"},"flag":0,"language":"JAVA",'
              b'"opaque":7,"serializeTypeCurrentRPC":"JSON","version":453}')
    expected = struct.pack(">i", 4 + len(header) + 2) + bytes([0, 0, 0, len(header)]) + header + b"xy"
    assert rm.encode(cmd) == expected
    back = rm.decode(expected[4:])
    assert (back.code, back.ext_fields, back.opaque, back.body, back.is_response) == (
        9003, {"topic": "%RETRY%g1", "topicLimitQps": "40.0"}, 7, b"xy", False)


def test_decode_of_captured_frame_is_a_response():
    cmd = rm.decode(CAPTURED_RESPONSE[4:])
    assert cmd.is_response and not cmd.is_oneway and (cmd.code, cmd.version, cmd.body) == (0, 403, b"")


def test_remark_is_written_only_when_set():
    assert b"remark" not in rm.header_json(rm.RemotingCommand(code=1))
    assert b'"remark":"busy"' in rm.header_json(rm.RemotingCommand(code=2, remark="busy"))


@pytest.mark.parametrize("frame, message", [
    (b"\x00\x00", "no header length"),
    (b"\x00\x00\x00\x10{}", "exceeds the frame"),
    (b"\x01\x00\x00\x02{}", "fixed fields of 13 bytes runs past the header"),
    (b"\x01\x00\x00\x15" + bytes(13) + b"\x00\x00\x00\x09" + bytes(4), "remark of 9 bytes runs past"),
    (b"\x01\x00\x00\x15" + bytes(13) + bytes(4) + b"\x00\x00\x00\x40", "extFields length 64 exceeds"),
    (b"\x07\x00\x00\x02{}", r"unknown \(7\)"),
    (b"\x00\x00\x00\x04{bad", "not JSON"),
    (b"\x00\x00\x00\x02[]", "integer 'code'"),
    (b'\x00\x00\x00\x1c{"code":1,"extFields":[1,2]}', "'extFields' is not an object"),
])
def test_bad_frames_raise_a_clear_error(frame, message):
    with pytest.raises(rm.RemotingProtocolError, match=message):
        rm.decode(frame)


def _pair():
    a, b = socket.socketpair()
    a.settimeout(2)
    return a, b


def test_short_read_is_an_error_not_a_hang():
    a, b = _pair()
    b.sendall(b"\x00\x00\x00\x40\x00\x00")  # promises 64 bytes, sends 2, closes
    b.close()
    started = time.monotonic()
    with pytest.raises(rm.RemotingProtocolError, match="short read"):
        rm.read_frame(a)
    assert time.monotonic() - started < 1


@pytest.mark.parametrize("length", [rm.MAX_FRAME_BYTES + 1, 3, -5])
def test_length_out_of_range_is_refused_before_reading_on(length):
    a, b = _pair()
    b.sendall(struct.pack(">i", length))  # nothing follows: waiting would hang until the timeout
    started = time.monotonic()
    with pytest.raises(rm.RemotingProtocolError, match="out of range"):
        rm.read_frame(a)
    assert time.monotonic() - started < 1
    b.close()


def test_silent_peer_times_out():
    a, b = _pair()
    a.settimeout(0.2)
    with pytest.raises(rm.RemotingTimeout):
        rm.read_frame(a)
    b.close()


def test_fastjson_bare_numeric_keys_are_quoted_outside_strings_only():
    text = '{"brokerAddrs":{0:"10.0.0.1:10911", 1 :"10.0.0.2:10911"},"note":"a,{5:b","list":[1,2,{3:4}],"n":-1}'
    assert rm.fastjson_loads(text) == {
        "brokerAddrs": {"0": "10.0.0.1:10911", "1": "10.0.0.2:10911"}, "note": "a,{5:b", "list": [1, 2, {"3": 4}],
        "n": -1}
    with pytest.raises(ValueError):
        rm.fastjson_loads("{oops}")


def test_cluster_masters_from_a_fastjson_cluster_info_over_the_socket():
    brokers = [LoopbackBroker("broker-a"), LoopbackBroker("broker-b")]
    ns = LoopbackNameServer("c1", brokers, slaves={"broker-a": "127.0.0.1:1"})
    client = RemotingClient(timeout_s=2)
    try:
        reply = client.invoke(ns.addr, rm.GET_BROKER_CLUSTER_INFO)
        assert reply.code == rm.SUCCESS and reply.is_response
        info = rm.fastjson_loads(reply.body)
        assert rm.cluster_masters(info, "c1") == {"broker-a": brokers[0].addr, "broker-b": brokers[1].addr}
        assert rm.cluster_masters(info, "other") == {}
        assert rm.cluster_masters(info, "") == rm.cluster_masters(info, "c1")
    finally:
        client.close()
        ns.stop()
        for b in brokers:
            b.stop()


def test_responses_are_matched_by_opaque_and_strays_dropped():
    """A server that first sends a stray response (another opaque), then the real one."""
    listener = socket.create_server(("127.0.0.1", 0))
    addr = f"127.0.0.1:{listener.getsockname()[1]}"

    def serve():
        conn, _ = listener.accept()
        request = rm.read_frame(conn)
        stray = rm.RemotingCommand(0, opaque=request.opaque + 1000, flag=rm.RPC_TYPE_BIT, remark="stray")
        conn.sendall(rm.encode(stray) + rm.encode(request.response(rm.SUCCESS, "mine")))
        time.sleep(0.2)
        conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = RemotingClient(timeout_s=2)
    try:
        assert client.invoke(addr, 9002).remark == "mine"
    finally:
        client.close()
        listener.close()


def test_unreachable_and_stalled_brokers_raise_remoting_errors_within_the_timeout():
    client = RemotingClient(timeout_s=0.3)
    dead = socket.create_server(("127.0.0.1", 0))
    dead_addr = f"127.0.0.1:{dead.getsockname()[1]}"
    dead.close()
    with pytest.raises(rm.RemotingError):
        client.invoke(dead_addr, 9002)
    broker = LoopbackBroker()
    broker.stall = True
    started = time.monotonic()
    try:
        with pytest.raises(rm.RemotingTimeout):
            client.invoke(broker.addr, 9002)
        assert time.monotonic() - started < 1.5
        broker.stall = False
        reply = client.invoke(broker.addr, 9002)  # reconnects after the failure
        assert reply.code == rm.SUCCESS and json.loads(reply.body)["topicRateLimitList"] == []
    finally:
        client.close()
        broker.stop()


def test_unknown_code_is_answered_request_code_not_supported():
    broker = LoopbackBroker()
    client = RemotingClient(timeout_s=2)
    try:
        assert client.invoke(broker.addr, 12345).code == rm.REQUEST_CODE_NOT_SUPPORTED
        old = LoopbackBroker(line="older", old_codes=True)  # 4.9.3-sohu before 2023-05-31
        try:
            assert client.invoke(old.addr, 9002).code == rm.REQUEST_CODE_NOT_SUPPORTED
            assert client.invoke(old.addr, 329).code == rm.SUCCESS and client.server_version[old.addr] == rm.V4_9_1
        finally:
            old.stop()
        five = client.invoke(broker.addr, rm.DELETE_EXPIRED_COMMITLOG)  # the 5.x meaning of 329
        assert (five.code, five.body, broker.commitlog_cleanups) == (rm.SUCCESS, b"", 1)
        assert rm.is_rocketmq5(client.server_version[broker.addr])
    finally:
        client.close()
        broker.stop()


# --- binary headers (RocketMQSerializable) ----------------------------------------------------------------------------
#: An UPDATE_SEND_MESSAGE_RATE_LIMIT request with a binary header, laid out by hand from
#: RocketMQSerializable.rocketMQProtocolEncode (Apache develop) and RemotingCommand.markProtocolType:
GOLDEN_BINARY_REQUEST = (
    b"\x00\x00\x00\x2a"   # int32 frame length = 4 + header 38 + body 0 = 42
    b"\x01\x00\x00\x26"   # int32: serialize type ROCKETMQ (1) << 24 | header length 38
    b"\x23\x2b"             # int16 code 9003
    b"\x03"                 # int8 LanguageCode.PYTHON
    b"\x00\x00"             # int16 version 0
    b"\x00\x00\x00\x07"     # int32 opaque 7
    b"\x00\x00\x00\x00"     # int32 flag 0: a request
    b"\x00\x00\x00\x00"     # int32 remark length 0: no remark
    b"\x00\x00\x00\x11"     # int32 extFields length 17 = (2 + 5) + (4 + 6)
    b"\x00\x05topic"        # int16 key length 5, key
    b"\x00\x00\x00\x06orders"  # int32 value length 6, value
)


def test_binary_request_encodes_to_the_java_layout_byte_for_byte():
    cmd = rm.RemotingCommand(9003, {"topic": "orders"}, opaque=7, serialize_type=rm.SERIALIZE_ROCKETMQ)
    assert rm.encode(cmd) == GOLDEN_BINARY_REQUEST
    back = rm.decode(GOLDEN_BINARY_REQUEST[4:])
    assert (back.code, back.ext_fields, back.opaque, back.flag, back.remark, back.language, back.serialize_type) == (
        9003, {"topic": "orders"}, 7, 0, None, "PYTHON", rm.SERIALIZE_ROCKETMQ)


def test_binary_response_decodes_from_the_java_layout():
    ext = (b"\x00\x01a" b"\x00\x00\x00\x011"        # key "a" (int16 1), value "1" (int32 1): 8 bytes
           b"\x00\x02bc" b"\x00\x00\x00\x03xyz")    # key "bc" (int16 2), value "xyz" (int32 3): 11 bytes
    header = (b"\x00\x01" b"\x00" b"\x01\xdb" b"\x00\x00\x00\x07" b"\x00\x00\x00\x01"  # code, language, version,
              b"\x00\x00\x00\x02ok"                                                # opaque, flag; remark "ok"
              + struct.pack(">i", len(ext)) + ext)                                   # extFields length 19
    frame = struct.pack(">I", (1 << 24) | len(header)) + header + b'{"x":1}'
    cmd = rm.decode(frame)
    assert cmd.is_response and (cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.remark) == (
        1, "JAVA", rm.V5_3_1, 7, "ok")
    assert cmd.ext_fields == {"a": "1", "bc": "xyz"} and cmd.body == b'{"x":1}'
    assert rm.encode(rm.RemotingCommand(**{**cmd.__dict__}))[4:] == frame  # and back, byte for byte


def test_binary_header_round_trip_with_unicode_and_empty_remark():
    cmd = rm.RemotingCommand(9002, {"topic": "订单", "k": ""}, opaque=2**31 - 1, flag=1, remark="",
                             version=-3, body=b"\x00\xff", serialize_type=rm.SERIALIZE_ROCKETMQ)
    back = rm.decode(rm.encode(cmd)[4:])
    assert back.ext_fields == {"topic": "订单", "k": None}  # readStr: a zero length reads as null
    assert (back.remark, back.version, back.opaque, back.body) == (None, -3, 2**31 - 1, b"\x00\xff")
    with pytest.raises(rm.RemotingProtocolError, match="int16"):
        rm.encode(rm.RemotingCommand(40000, serialize_type=rm.SERIALIZE_ROCKETMQ))


# --- ACL signing (AclClientRPCHook) -----------------------------------------------------------------------------------
def test_acl_signature_is_hmac_sha1_over_the_sorted_values_and_the_body():
    creds = acl.SessionCredentials("rocketmq2", "12345678")
    signed = acl.sign({"topicLimitQps": "40.0", "topic": "orders"}, b"xy", creds)
    # TreeMap order of the names: "AccessKey" < "topic" < "topicLimitQps"; values concatenated, then the body
    content = b"rocketmq2" + b"orders" + b"40.0" + b"xy"
    expected = base64.b64encode(hmac.new(b"12345678", content, hashlib.sha1).digest()).decode()
    assert signed == {"topicLimitQps": "40.0", "topic": "orders", "AccessKey": "rocketmq2", "Signature": expected}
    token = acl.sign(None, b"", acl.SessionCredentials("ak", "sk", "tok"))
    assert token["SecurityToken"] == "tok"
    assert token["Signature"] == base64.b64encode(hmac.new(b"sk", b"aktok", hashlib.sha1).digest()).decode()
    assert "12345678" not in repr(creds)


def test_acl_broker_refuses_unsigned_and_accepts_signed_requests():
    broker = LoopbackBroker(acl={"rocketmq2": "12345678"})
    plain = RemotingClient(timeout_s=2)
    signed = RemotingClient(timeout_s=2, credentials=acl.SessionCredentials("rocketmq2", "12345678"))
    forged = RemotingClient(timeout_s=2, credentials=acl.SessionCredentials("rocketmq2", "guess"))
    try:
        refused = plain.invoke(broker.addr, rm.VIEW_SEND_MESSAGE_RATE_LIMIT)
        assert refused.code == rm.SYSTEM_ERROR and "No accessKey is configured" in refused.remark
        assert "Check signature failed" in forged.invoke(broker.addr, rm.VIEW_SEND_MESSAGE_RATE_LIMIT).remark
        assert signed.invoke(broker.addr, rm.VIEW_SEND_MESSAGE_RATE_LIMIT).code == rm.SUCCESS
        update = signed.invoke(broker.addr, rm.UPDATE_SEND_MESSAGE_RATE_LIMIT, {"topic": "t", "topicLimitQps": "1.0"})
        assert update.code == rm.SUCCESS and broker.requests[-1].ext_fields["AccessKey"] == "rocketmq2"
    finally:
        for c in (plain, signed, forged):
            c.close()
        broker.stop()


# --- connections that survive -----------------------------------------------------------------------------------------
def test_a_restarted_server_gets_the_next_request():
    broker = LoopbackBroker()
    client = RemotingClient(timeout_s=2)
    try:
        assert client.invoke(broker.addr, rm.VIEW_SEND_MESSAGE_RATE_LIMIT).code == rm.SUCCESS
        broker.restart()  # same port, every old connection closed
        assert client.invoke(broker.addr, rm.VIEW_SEND_MESSAGE_RATE_LIMIT).code == rm.SUCCESS
        assert client.connects[broker.addr] == 2
        broker.restart()  # the closed connection is seen before sending: even a request not to repeat gets through
        assert client.invoke(broker.addr, rm.VIEW_SEND_MESSAGE_RATE_LIMIT, idempotent=False).code == rm.SUCCESS
    finally:
        client.close()
        broker.stop()


def test_a_connection_the_server_closed_as_idle_is_replaced():
    broker = LoopbackBroker(idle_close_s=0.2)  # IdleStateHandler after serverChannelMaxIdleTimeSeconds
    client = RemotingClient(timeout_s=2)
    try:
        client.invoke(broker.addr, rm.VIEW_SEND_MESSAGE_RATE_LIMIT)
        time.sleep(0.4)
        assert broker.idle_closed == 1
        assert client.invoke(broker.addr, rm.VIEW_SEND_MESSAGE_RATE_LIMIT).code == rm.SUCCESS
    finally:
        client.close()
        broker.stop()


def test_an_idle_connection_is_renewed_before_the_server_would_close_it():
    broker = LoopbackBroker()
    client = RemotingClient(timeout_s=2, idle_timeout_s=0.3)  # renewed after 0.27 s idle
    try:
        client.invoke(broker.addr, rm.VIEW_SEND_MESSAGE_RATE_LIMIT)
        client.invoke(broker.addr, rm.VIEW_SEND_MESSAGE_RATE_LIMIT)
        assert broker.connections == 1
        time.sleep(0.35)
        client.invoke(broker.addr, rm.VIEW_SEND_MESSAGE_RATE_LIMIT)
        assert broker.connections == 2 and client.connects[broker.addr] == 2
    finally:
        client.close()
        broker.stop()


def _closing_server(answer_first: int):
    """A server whose first connection answers ``answer_first`` requests, then closes when the next one arrives
    (unanswered); later connections answer everything."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen = []

    def serve():
        first = True
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            answered = 0
            while True:
                try:
                    request = rm.read_frame(conn)
                except rm.RemotingError:
                    break
                seen.append(request.code)
                if first and answered == answer_first:
                    conn.close()  # closes as the request arrives: the client learns it only by reading
                    break
                conn.sendall(rm.encode(request.response(rm.SUCCESS)))
                answered += 1
            first = False

    threading.Thread(target=serve, daemon=True).start()
    return listener, f"127.0.0.1:{listener.getsockname()[1]}", seen


def test_a_request_that_meets_a_closed_connection_is_sent_once_more():
    listener, addr, seen = _closing_server(answer_first=1)
    client = RemotingClient(timeout_s=2)
    try:
        client.invoke(addr, 9002)
        assert client.invoke(addr, 9002).code == rm.SUCCESS  # retried on a new connection
        assert seen == [9002, 9002, 9002] and client.connects[addr] == 2
    finally:
        client.close()
        listener.close()
    listener, addr, seen = _closing_server(answer_first=1)
    client = RemotingClient(timeout_s=2)
    try:
        client.invoke(addr, 10)
        with pytest.raises(rm.RemotingConnectionClosed):
            client.invoke(addr, 10, idempotent=False)  # not sent twice
        assert seen == [10, 10]
    finally:
        client.close()
        listener.close()


def test_the_client_answers_a_binary_server_in_kind():
    broker = LoopbackBroker(serialize="ROCKETMQ")
    client = RemotingClient(timeout_s=2)
    try:
        reply = client.invoke(broker.addr, rm.VIEW_SEND_MESSAGE_RATE_LIMIT)
        assert reply.serialize_type == rm.SERIALIZE_ROCKETMQ and reply.version == rm.V5_3_1
        assert broker.requests[-1].serialize_type == RC.JSON  # the first request: JSON
        client.invoke(broker.addr, rm.VIEW_SEND_MESSAGE_RATE_LIMIT)
        assert broker.requests[-1].serialize_type == RC.ROCKETMQ  # then what the server answers in
    finally:
        client.close()
        broker.stop()
