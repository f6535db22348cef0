"""The relay's use of MD's epochs (`SessionGuard`): a frame of an earlier epoch than its session's is a
replay; once the relay has forgotten sessions (its bound: the least recent go), a session it does not
know whose epoch is not newer than every forgotten one is refused, so a forgotten session's captured
frame gets no further than a known one's (the control: the same frame passes a relay that forgot
nothing). A long-lived MD whose session the relay still knows keeps working whatever the floor, and
so does one whose connection is cut and comes back, an MD process older than the forgotten sessions
opening its first connection now (its connection's epoch is drawn then), and a restarted MD."""

import pytest
import zmq

from sglang_pdd.protocol import channel as channel_mod
from sglang_pdd.protocol.channel import MainChannel, RelayChannel
from sglang_pdd.protocol.messages import ProtocolError, Ready, Tokens, Watch
from sglang_pdd.protocol.replay import MAIN_TO_RELAY, SessionGuard

from .tcp_proxy import Proxy
from .test_token_channel import captured, settle, wait_for
from .test_token_takeover import greet

SECRET = b"k"


def refused(guard: SessionGuard, *args, **kw) -> str:
    with pytest.raises(ProtocolError) as e:
        guard.check(MAIN_TO_RELAY, *args, **kw)
    return e.value.reason


def test_a_frame_of_an_earlier_epoch_than_its_sessions_is_a_replay():
    g = SessionGuard(MAIN_TO_RELAY)
    g.check(MAIN_TO_RELAY, 42, 1, peer=b"a", epoch=10)
    assert refused(g, 42, 2, peer=b"b", epoch=9) == "replay" and g.peer_of(42) == b"a"
    g.check(MAIN_TO_RELAY, 42, 2, peer=b"b", epoch=10)
    assert g.peer_of(42) == b"b"


def test_a_forgotten_sessions_frames_are_refused_and_known_and_newer_sessions_pass():
    forgotten = []
    g = SessionGuard(MAIN_TO_RELAY, max_sessions=2, on_forget=forgotten.append)
    g.check(MAIN_TO_RELAY, 1, 1, epoch=5)  # a long-lived MD
    g.check(MAIN_TO_RELAY, 2, 1, epoch=10)
    g.check(MAIN_TO_RELAY, 1, 2, epoch=5)  # it stays recent
    assert g.floor is None
    g.check(MAIN_TO_RELAY, 3, 1, epoch=20)  # session 2 is the least recent: forgotten
    assert forgotten == [2] and g.floor == 10 and not g.knows(2)
    assert refused(g, 2, 1, epoch=10) == "replay"  # its frame replayed: an empty window would have taken it
    assert refused(g, 2, 9, epoch=10) == "replay"
    assert refused(g, 99, 1, epoch=7) == "replay"  # any unknown session no newer than the floor
    g.check(MAIN_TO_RELAY, 1, 3, epoch=5)  # the long-lived MD, known, older than the floor: served
    g.check(MAIN_TO_RELAY, 4, 1, epoch=30)  # a new connection: a later epoch (session 3 forgotten)
    assert g.floor == 20


@pytest.fixture
def small_relay(monkeypatch):
    monkeypatch.setattr(channel_mod, "MAX_SESSIONS", 1)  # each new session makes the relay forget the last
    relay = RelayChannel("tcp://127.0.0.1:*", SECRET, vocab_size=100)
    mains, socks = [], []

    def main() -> MainChannel:
        m = MainChannel(SECRET, vocab_size=100)
        mains.append(m)
        return m

    def dealer(address: str = relay.address) -> zmq.Socket:
        s = zmq.Context.instance().socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(address)
        socks.append(s)
        return s

    yield relay, main, dealer
    for s in socks:
        s.close(0)
    for m in mains:
        m.close()
    relay.close()


def served(relay: RelayChannel, md: MainChannel, address: str, room: int) -> bool:
    """MD's Watch reaches the relay and the relay's reply reaches MD (and MD's Hello after its first
    handshake reaches the relay before another MD says anything)."""
    md.send(address, Watch(room=room))
    got = wait_for(relay.poll)
    if [m for _, m in got] != [Watch(room=room)]:
        return False
    assert relay.send(got[0][0], Tokens(room=room, ids=[room]))
    ok = wait_for(md.poll) == [(address, Tokens(room=room, ids=[room]))]
    greet(md, relay)
    return ok


def test_a_replay_of_a_session_the_relay_forgot_is_refused(small_relay):
    relay, main, dealer = small_relay
    old_process = main()  # an MD that started before the others and reaches this relay last
    md1 = main()
    assert served(relay, md1, relay.address, 1)
    frame = captured(md1, relay, Ready(room=1))  # what a sniffer of md1's link has
    assert [m for _, m in wait_for(relay.poll)] == [Ready(room=1)]
    md2 = main()
    assert served(relay, md2, relay.address, 2)  # md1's session is forgotten
    assert relay._guard.floor is not None and not relay._guard.knows(md1._conns[relay.address].session)
    dealer().send(frame)
    assert settle(relay.poll) == [] and relay.rejected["replay"] == 1
    # the control: the frame itself is good, a relay that has forgotten nothing takes it
    fresh = RelayChannel("tcp://127.0.0.1:*", SECRET, vocab_size=100)
    try:
        dealer(fresh.address).send(frame)
        assert [m for _, m in wait_for(fresh.poll)] == [Ready(room=1)]
    finally:
        fresh.close()
    # an MD process older than every forgotten session, on its first connection to this relay
    assert served(relay, old_process, relay.address, 3)
    # a restarted MD: a new session, a later epoch
    md1.close()
    assert served(relay, main(), relay.address, 4)
    assert relay.rejected["replay"] == 1


def test_a_known_main_that_reconnects_keeps_working_after_the_relay_forgot_others(small_relay):
    relay, main, _ = small_relay
    assert served(relay, main(), relay.address, 1)
    md = main()
    proxy = Proxy(int(relay.address.rsplit(":", 1)[1]))
    try:
        assert served(relay, md, proxy.address, 2)  # the first session is forgotten: a floor
        assert relay._guard.floor is not None
        proxy.drop()
        assert wait_for(lambda: proxy.accepted >= 2)  # its DEALER came back through the proxy
        greet(md, relay)  # its Hello: the same session, a new connection
        assert served(relay, md, proxy.address, 3)
        assert relay.rejected == {}
    finally:
        proxy.close()
