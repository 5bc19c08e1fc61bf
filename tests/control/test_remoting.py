"""The remoting codec (control/remoting.py): golden bytes from RemotingCommand's encoding, bad frames, and a real
request/response over a loopback socket."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time

import pytest

from control import remoting as rm
from tests.rocketmq_loopback import LoopbackBroker, LoopbackNameServer

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
    (b"\x01\x00\x00\x02{}", "ROCKETMQ is not supported"),
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
    client = rm.RemotingClient(timeout_s=2)
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
    client = rm.RemotingClient(timeout_s=2)
    try:
        assert client.invoke(addr, 9002).remark == "mine"
    finally:
        client.close()
        listener.close()


def test_unreachable_and_stalled_brokers_raise_remoting_errors_within_the_timeout():
    client = rm.RemotingClient(timeout_s=0.3)
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
    client = rm.RemotingClient(timeout_s=2)
    try:
        assert client.invoke(broker.addr, 12345).code == rm.REQUEST_CODE_NOT_SUPPORTED
        old = LoopbackBroker(old_codes=True)
        try:
            assert client.invoke(old.addr, 9002).code == rm.REQUEST_CODE_NOT_SUPPORTED
            assert client.invoke(old.addr, 329).code == rm.SUCCESS
        finally:
            old.stop()
    finally:
        client.close()
        broker.stop()
