import time

import msgspec
import pytest

from sglang_pdd.protocol import PROTOCOL_VERSION, messages, request
from sglang_pdd.protocol.auth import FrameAuth
from sglang_pdd.protocol.channel import MainChannel, RelayChannel
from sglang_pdd.protocol.messages import Finished, Hello, ProtocolError, Ready, Reject, Tokens, Watch


@pytest.mark.parametrize("msg", [Hello(), Watch(room=1), Ready(room=2**63 - 1), Tokens(room=3, start=0, ids=[1, 2, 3]),
                                 Finished(room=4, reason="length", n_tokens=9), Reject(room=5, reason="unknown room")])
def test_messages_round_trip_by_name(msg):
    assert messages.decode(messages.encode(msg)) == msg


def test_unknown_version_is_rejected_naming_both_versions():
    data = msgspec.msgpack.encode({"type": "ready", "room": 1, "v": PROTOCOL_VERSION + 1})
    with pytest.raises(ProtocolError, match="version") as e:
        messages.decode(data)
    assert e.value.reason == "version"


@pytest.mark.parametrize("data", [
    b"\xff\x00garbage",
    msgspec.msgpack.encode({"type": "teleport", "room": 1, "v": 1}),
    msgspec.msgpack.encode({"type": "ready", "v": 1}),
    msgspec.msgpack.encode({"type": "ready", "room": "one", "v": 1}),
    msgspec.msgpack.encode({"type": "tokens", "room": 1, "v": 1, "ids": [1], "colour": 3}),
    msgspec.msgpack.encode({"type": "tokens", "room": 1, "v": 1, "ids": [1], "start": -1}),
    msgspec.msgpack.encode({"type": "tokens", "room": 1, "v": 1, "ids": [1], "mode": "adaptive"}),
    msgspec.msgpack.encode({"type": "ready", "room": 1, "v": 1, "mode": "teleport"}),
    msgspec.msgpack.encode({"type": "ready", "room": 1, "v": 1, "mode": "catch-up", "chunk": 0}),
    msgspec.msgpack.encode({"type": "ready", "room": 1, "v": 1, "have": -1}),
    msgspec.msgpack.encode({"type": "ready", "room": 1, "v": 1, "mode": "adaptive", "chunk": 8, "gap": -2}),
])
def test_malformed_messages_are_rejected(data):
    with pytest.raises(ProtocolError) as e:
        messages.decode(data)
    assert e.value.reason == "malformed"


def test_out_of_vocab_token_ids_are_rejected():
    data = messages.encode(Tokens(room=1, ids=[5, 4096]))
    assert messages.decode(data).ids == [5, 4096]
    with pytest.raises(ProtocolError, match="out_of_vocab"):
        messages.decode(data, vocab_size=4096)


def test_mac_detects_wrong_secret_and_tampering():
    a, b = FrameAuth(b"s3cret"), FrameAuth(b"other")
    frame = a.seal(b"payload")
    assert a.open(frame) == b"payload"
    with pytest.raises(ProtocolError, match="bad_mac"):
        b.open(frame)
    with pytest.raises(ProtocolError, match="bad_mac"):
        a.open(frame[:-1] + b"X")
    with pytest.raises(ProtocolError, match="bad_mac"):
        a.open(b"short")


def test_request_params_round_trip_through_custom_params():
    p = request.RequestParams(v=1, relay_room=7, relay="tcp://10.0.0.1:18500")
    assert request.parse(p.to_custom_params()) == p
    assert request.parse({"other": 1}) is None and request.parse(None) is None
    here = request.RequestParams(v=1, relay_here=True)  # to a prefill that relays (--pdd-relay local)
    assert request.parse(here.to_custom_params()) == here


@pytest.mark.parametrize("raw, match", [
    ({"v": 2}, "unsupported protocol version 2"),
    ({"v": 1, "main_room": -4}, "not a bootstrap room"),
    ({"v": 1, "relay_room": 3}, "go together"),
    ({"v": 1, "relay_room": 3, "relay": "http://x:1"}, "tcp://host:port"),
    ({"v": 1, "bogus": 1}, "bogus"),
    ({"v": 1, "relay_here": True, "main_room": 4}, "relay_here and main_room exclude each other"),
    ({"v": 1, "relay_here": "yes"}, "relay_here"),
    ("nope", "pdd"),
])
def test_malformed_request_params_are_clear_errors(raw, match):
    with pytest.raises(request.RequestParamsError, match=match):
        request.parse({"pdd": raw})


def wait_for(fn, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.01)
    return []


def test_channel_round_trip_and_forged_frames_are_dropped_and_counted():
    relay = RelayChannel("tcp://127.0.0.1:*", b"k", vocab_size=100)
    main = MainChannel(b"k", vocab_size=100)
    forger = MainChannel(b"wrong")
    try:
        assert main.send(relay.address, Ready(room=11))
        assert forger.send(relay.address, Ready(room=12))
        got = wait_for(relay.poll)
        assert [m for _, m in got] == [Ready(room=11)]
        time.sleep(0.1)
        relay.poll()
        assert relay.rejected["bad_mac"] == 1
        peer = got[0][0]
        assert relay.send(peer, Tokens(room=11, ids=[1, 2, 3]))
        assert relay.send(peer, Tokens(room=11, ids=[1, 200]))  # out of vocab for MD
        back = wait_for(main.poll)
        time.sleep(0.1)
        back += main.poll()
        assert back == [(relay.address, Tokens(room=11, ids=[1, 2, 3]))]
        assert main.rejected["out_of_vocab"] == 1
        assert not relay.send(b"no-such-peer", Finished(room=11))  # a vanished peer is not fatal
    finally:
        relay.close(), main.close(), forger.close()


@pytest.mark.parametrize("extra, match", [({"handoff": "sometimes"}, "handoff"), ({"chunk": 0}, "chunk")])
def test_request_params_reject_bad_handoff_choices(extra, match):
    raw = {"pdd": {"v": 1, "relay_room": 7, "relay": "tcp://h:1", **extra}}
    with pytest.raises(request.RequestParamsError, match=match):
        request.parse(raw)
