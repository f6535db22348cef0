"""The token channel over real ZMQ sockets against an attacker who can capture and send frames but
does not hold the secret: a captured frame replayed from another DEALER, reflected back, or replayed
to MD is a counted rejection; an oversized unauthenticated frame and a flood of bad frames are bounded;
every socket has heartbeats and TCP keepalive."""

import time

import pytest
import zmq

from sglang_pdd.protocol import channel as channel_mod
from sglang_pdd.protocol.auth import FrameAuth
from sglang_pdd.protocol.channel import MAX_FRAME, MainChannel, RelayChannel
from sglang_pdd.protocol.messages import MAX_TOKENS_PER_MESSAGE, Ready, Tokens, Watch, encode
from sglang_pdd.protocol.replay import RELAY_TO_MAIN, ReplayWindow, SessionGuard, pack_header, unpack_header
from sglang_pdd.protocol.messages import ProtocolError

SECRET = b"k"


def wait_for(fn, timeout=5.0):
    """fn() until it returns something truthy (or the deadline: then its last answer)."""
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.01)


def settle(fn, rounds=20):
    """Everything fn() returns over a few idle rounds (frames still in flight arrive)."""
    out = []
    for _ in range(rounds):
        out += fn()
        time.sleep(0.01)
    return out


@pytest.fixture
def pair():
    relay = RelayChannel("tcp://127.0.0.1:*", SECRET, vocab_size=100)
    main = MainChannel(SECRET, vocab_size=100)
    ctx = zmq.Context.instance()
    socks = []

    def dealer():
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(relay.address)
        socks.append(s)
        return s

    yield relay, main, dealer
    for s in socks:
        s.close(0)
    relay.close(), main.close()


def captured(main, relay, msg):
    """Send `msg` from MD and return the frame as it crossed the wire (what a sniffer has)."""
    (sock,) = main.sockets() or [main._conn(relay.address).sock]
    frames = []
    real_send = sock.send
    sock_send = lambda data, flags=0: (frames.append(bytes(data)), real_send(data, flags))[1]  # noqa: E731
    conn = main._conns[relay.address]
    conn.sock = type("Tap", (), {"send": staticmethod(sock_send)})()
    try:
        assert main.send(relay.address, msg)
    finally:
        conn.sock = sock
    return frames[0]


def test_a_captured_watch_or_ready_replayed_from_another_dealer_is_a_counted_rejection(pair):
    relay, main, dealer = pair
    main.send(relay.address, Watch(room=1))  # MD's connection exists and the relay knows it
    ((md_peer, _),) = wait_for(relay.poll)
    for msg in (Watch(room=7), Ready(room=7)):
        frame = captured(main, relay, msg)
        assert [m for _, m in wait_for(relay.poll)] == [msg]  # the original arrives
        dealer().send(frame)  # the attacker's replay, from its own connection
        assert settle(relay.poll) == []
    assert relay.rejected["replay"] == 2
    assert relay.send(md_peer, Tokens(room=7, ids=[1]))  # the real MD still gets the tokens
    assert wait_for(main.poll) == [(relay.address, Tokens(room=7, ids=[1]))]


def test_a_relay_frame_reflected_back_to_the_relay_is_rejected(pair):
    relay, main, dealer = pair
    main.send(relay.address, Ready(room=3))
    ((peer, _),) = wait_for(relay.poll)
    frames = []
    real = relay.sock.send_multipart
    relay.sock.send_multipart = lambda parts, flags=0: (frames.append(parts[1]), real(parts, flags))[1]
    try:
        assert relay.send(peer, Tokens(room=3, ids=[4, 5]))
    finally:
        relay.sock.send_multipart = real
    dealer().send(frames[0])
    assert settle(relay.poll) == [] and relay.rejected["reflected"] == 1


def test_a_reply_replayed_or_meant_for_another_connection_is_rejected_by_main():
    """A fake relay (a raw ROUTER with the secret) sends MD crafted replies."""
    ctx, auth = zmq.Context.instance(), FrameAuth(SECRET)
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind("tcp://127.0.0.1:*")
    addr = router.getsockopt_string(zmq.LAST_ENDPOINT)
    main = MainChannel(SECRET, vocab_size=100)
    try:
        main.send(addr, Watch(room=5))
        peer, _ = router.recv_multipart()
        session = main._conns[addr].session

        def reply(session, seq, direction=RELAY_TO_MAIN, room=5):
            return auth.seal(pack_header(direction, session, seq) + encode(Tokens(room=room, ids=[1])))

        for frame in (reply(session, 1), reply(session, 1), reply(session ^ 1, 2), reply(session, 2, direction=1)):
            router.send_multipart([peer, frame])
        got = settle(main.poll)
        assert got == [(addr, Tokens(room=5, ids=[1]))]
        assert (main.rejected["replay"], main.rejected["peer"], main.rejected["reflected"]) == (1, 1, 1)
    finally:
        main.close(), router.close(0)


def test_an_oversized_unauthenticated_frame_is_dropped_before_it_is_read(pair):
    relay, main, dealer = pair
    dealer().send(b"\0" * (MAX_FRAME + 1))
    assert settle(relay.poll) == [] and sum(relay.rejected.values()) == 0  # never reached the MAC
    main.send(relay.address, Ready(room=9))
    assert [m for _, m in wait_for(relay.poll)] == [Ready(room=9)]


def test_the_largest_tokens_message_fits_under_the_frame_limit(pair):
    relay, main, _ = pair
    main.send(relay.address, Watch(room=1))
    ((peer, _),) = wait_for(relay.poll)
    relay._vocab = main._vocab = None
    big = Tokens(room=1, ids=[2**31 - 1] * MAX_TOKENS_PER_MESSAGE, logprobs=[-1.5] * MAX_TOKENS_PER_MESSAGE)
    assert relay.send(peer, big)
    assert wait_for(main.poll) == [(relay.address, big)]


def test_a_flood_of_bad_frames_costs_one_poll_at_most_its_frame_budget(pair):
    relay, main, dealer = pair
    attacker = dealer()
    for _ in range(300):
        attacker.send(b"x" * 64)
    wait_for(lambda: relay.sock.poll(0))
    time.sleep(0.2)  # all 300 queued at the relay
    assert relay.poll(max_frames=100) == []
    assert relay.rejected["bad_mac"] == 100
    settle(relay.poll)
    assert relay.rejected["bad_mac"] == 300


def test_every_socket_has_frame_bounds_heartbeats_and_keepalive(pair):
    relay, main, _ = pair
    main.send(relay.address, Watch(room=1))
    for sock in (relay.sock, *main.sockets()):
        assert sock.getsockopt(zmq.MAXMSGSIZE) == MAX_FRAME
        assert sock.getsockopt(zmq.RCVHWM) == channel_mod.RCV_HWM
        assert sock.getsockopt(zmq.HEARTBEAT_IVL) > 0 and sock.getsockopt(zmq.HEARTBEAT_TIMEOUT) > 0
        assert sock.getsockopt(zmq.TCP_KEEPALIVE) == 1


def test_replay_window_accepts_each_seq_once_within_the_window():
    w = ReplayWindow(size=8)
    assert [w.accept(s) for s in (1, 3, 2, 3, 1, 0)] == [True, True, True, False, False, False]
    assert w.accept(20) and not w.accept(12) and w.accept(13) and not w.accept(13)  # 12: older than the window


def test_session_guard_follows_fresh_frames_only():
    g = SessionGuard(direction=1)
    g.check(1, session=42, seq=1, peer=b"a")
    with pytest.raises(ProtocolError) as e:  # a replay from elsewhere does not move the session
        g.check(1, session=42, seq=1, peer=b"b")
    assert e.value.reason == "replay" and g.peer_of(42) == b"a"
    g.check(1, session=42, seq=2, peer=b"b")  # a fresh frame (the secret's holder) from a reconnection
    assert g.peer_of(42) == b"b"
    with pytest.raises(ProtocolError) as e:
        g.check(2, session=42, seq=3, peer=b"b")
    assert e.value.reason == "reflected"


def test_a_main_that_reconnects_keeps_its_session_and_gets_its_replies(pair):
    relay, main, dealer = pair
    main.send(relay.address, Watch(room=1))
    ((old_peer, _),) = wait_for(relay.poll)
    assert relay.send(old_peer, Tokens(room=1, ids=[1]))
    assert wait_for(main.poll) == [(relay.address, Tokens(room=1, ids=[1]))]
    conn = main._conns[relay.address]
    # the same session over a new connection (a new ZMQ peer), as after a reconnect
    fresh = FrameAuth(SECRET).seal(pack_header(1, conn.session, conn.sent + 1) + encode(Watch(room=2)))
    moved = dealer()
    moved.send(fresh)
    ((new_peer, msg),) = wait_for(relay.poll)
    assert msg == Watch(room=2) and new_peer != old_peer
    assert relay.send(new_peer, Tokens(room=2, ids=[2]))
    assert moved.poll(5000)
    frame = moved.recv()
    _, session, seq, _ = unpack_header(FrameAuth(SECRET).open(frame))
    assert (session, seq) == (conn.session, 2)  # the session's reply sequence goes on
