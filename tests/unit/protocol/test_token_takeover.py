"""Who gets a session's replies, over real ZMQ. RLD's ROUTER names each connection itself and hands no
id over (no ROUTER_HANDOVER); it sends a session's replies only to the connection whose latest fresh
frame authenticated. A third party that connects with MD's routing id gets none of them and MD gets
them (the control: a relay that hands ids over, as before, gives the third party MD's reply and MD
nothing); one with any other id, replaying MD's frames, gets nothing either. An MD whose connection is
cut comes back, says Hello, and gets the replies RLD sent while it was away, in order; a third party
that took the dead connection's id meanwhile gets none (the control: without MD's Hello they wait)."""

import time

import pytest
import zmq

from sglang_pdd.protocol import channel as channel_mod
from sglang_pdd.protocol.channel import MainChannel, RelayChannel
from sglang_pdd.protocol.messages import Tokens, Watch
from sglang_pdd.protocol.replay import MAIN_TO_RELAY, SessionGuard

from .tcp_proxy import Proxy
from .test_token_channel import captured, settle, wait_for

SECRET = b"k"


@pytest.fixture
def ends():
    relay = RelayChannel("tcp://127.0.0.1:*", SECRET, vocab_size=100)
    main = MainChannel(SECRET, vocab_size=100)
    socks = []

    def third_party(routing_id: bytes | None = None, address: str = relay.address) -> zmq.Socket:
        """A DEALER that has completed its handshake with the relay (with this routing id, if any)."""
        s = zmq.Context.instance().socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        if routing_id is not None:
            s.setsockopt(zmq.ROUTING_ID, routing_id)
        mon = s.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        s.connect(address)
        assert mon.poll(5000)
        s.disable_monitor()
        mon.close(0)
        socks.append(s)
        time.sleep(0.05)
        return s

    yield relay, main, third_party
    for s in socks:
        s.close(0)
    main.close(), relay.close()


def greet(main: MainChannel, relay: RelayChannel) -> None:
    """A few rounds of both polls: MD's Hello after a handshake reaches the relay."""
    settle(lambda: main.poll() + relay.poll())


@pytest.mark.parametrize("relay_kind", ["no handover", "control: ROUTER_HANDOVER"])
def test_a_third_party_with_mains_routing_id_gets_none_of_its_replies(ends, relay_kind):
    relay, main, third_party = ends
    main.send(relay.address, Watch(room=1))
    ((peer, _),) = wait_for(relay.poll)
    if relay_kind != "no handover":
        relay.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # as before: the newest connection with an id takes it
    thief = third_party(routing_id=peer)  # MD's id, as if it had been seen on the wire
    assert relay.send(peer, Tokens(room=1, ids=[7]))
    if relay_kind != "no handover":
        assert thief.poll(2000) and settle(main.poll) == []  # the thief got MD's tokens, MD nothing
        return
    assert wait_for(main.poll) == [(relay.address, Tokens(room=1, ids=[7]))]
    assert not thief.poll(300)


@pytest.mark.parametrize("routing_id", [None, b"\x00\x00\x00\x00\x01", b"anything"])
def test_a_third_party_replaying_mains_frames_gets_nothing(ends, routing_id):
    relay, main, third_party = ends
    main.send(relay.address, Watch(room=1))
    ((peer, _),) = wait_for(relay.poll)
    frame = captured(main, relay, Watch(room=2))
    assert [m for _, m in wait_for(relay.poll)] == [Watch(room=2)]
    thief = third_party(routing_id=routing_id)
    thief.send(frame)  # a captured frame: refused, so the session stays with MD's connection
    assert settle(relay.poll) == [] and relay.rejected["replay"] == 1
    assert relay.send(peer, Tokens(room=2, ids=[3]))
    assert wait_for(main.poll) == [(relay.address, Tokens(room=2, ids=[3]))]
    assert not thief.poll(300)


@pytest.mark.parametrize("hello", ["sent", "control: none"])
def test_a_cut_connection_comes_back_and_gets_what_was_sent_meanwhile(ends, hello, monkeypatch):
    relay, main, third_party = ends
    proxy = Proxy(int(relay.address.rsplit(":", 1)[1]))
    gone = relay.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    try:
        main.send(proxy.address, Watch(room=1))
        ((peer, _),) = wait_for(relay.poll)
        greet(main, relay)
        if hello != "sent":
            monkeypatch.setattr(channel_mod._Connection, "handshakes", lambda self, addr: 0)
        proxy.drop()  # MD's connection dies (a middlebox, a flap); its DEALER reconnects through the proxy
        assert gone.poll(5000)
        time.sleep(0.1)
        assert relay.send(peer, Tokens(room=1, start=0, ids=[1], final=False, mode="catch-up"))
        assert relay.held.bytes > 0  # the ROUTER could not route it: the connection is gone
        thief = third_party(routing_id=peer)  # takes the dead connection's id
        assert relay.send(peer, Tokens(room=1, start=1, ids=[2], mode="catch-up"))  # held too: no connection
        assert wait_for(lambda: proxy.accepted >= 2)
        got = settle(lambda: main.poll() + relay.poll())
        assert not thief.poll(300)
        if hello != "sent":
            assert got == [] and relay.held.bytes > 0  # the replies wait for MD's next frame
            return
        assert got == [(proxy.address, Tokens(room=1, start=0, ids=[1], final=False, mode="catch-up")),
                       (proxy.address, Tokens(room=1, start=1, ids=[2], mode="catch-up"))]
        assert relay.held.bytes == 0
        assert relay.send(peer, Tokens(room=1, start=2, ids=[3], mode="catch-up"))  # and what follows goes straight
        assert wait_for(main.poll) == [(proxy.address, Tokens(room=1, start=2, ids=[3], mode="catch-up"))]
        assert relay.rejected == {} and main.rejected == {}
    finally:
        relay.sock.disable_monitor()
        gone.close(0)
        proxy.close()


def test_a_late_frame_from_a_connection_that_died_does_not_move_the_session():
    """The ROUTER may hand RLD what a dead connection had queued after MD's Hello on its new one: the
    session stays with the connection of its newest frame (the highest seq)."""
    g = SessionGuard(MAIN_TO_RELAY)
    g.check(MAIN_TO_RELAY, 42, 1, peer=b"old", epoch=1)
    g.check(MAIN_TO_RELAY, 42, 3, peer=b"new", epoch=1)  # the Hello on MD's new connection
    g.check(MAIN_TO_RELAY, 42, 2, peer=b"old", epoch=1)  # fresh (in the window), but older
    assert g.peer_of(42) == b"new"
    g.check(MAIN_TO_RELAY, 42, 4, peer=b"newer", epoch=1)
    assert g.peer_of(42) == b"newer"
