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
from sglang_pdd.protocol.replay import (FRAME_VERSION, RELAY_TO_MAIN, EpochWindow, ReplayWindow, SessionGuard,
                                        pack_header, unpack_header)
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
    conn = main._conn(relay.address)
    sock = conn.sock
    frames = []
    real_send = sock.send
    sock_send = lambda data, flags=0: (frames.append(bytes(data)), real_send(data, flags))[1]  # noqa: E731
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

        def reply(session, seq, direction=RELAY_TO_MAIN, room=5, epoch=100):
            return auth.seal(pack_header(direction, session, seq, epoch) + encode(Tokens(room=room, ids=[1])))

        for frame in (reply(session, 1), reply(session, 1), reply(session ^ 1, 2), reply(session, 2, direction=1),
                      reply(session, 2, epoch=99)):  # an earlier relay process's reply: replayed
            router.send_multipart([peer, frame])
        got = settle(main.poll)
        assert got == [(addr, Tokens(room=5, ids=[1]))]
        assert (main.rejected["replay"], main.rejected["peer"], main.rejected["reflected"]) == (2, 1, 1)
        # a restarted relay (a later epoch) starts its replies at 1 again: taken, and the old epoch is closed
        for frame in (reply(session, 1, room=6, epoch=200), reply(session, 3, room=7, epoch=100)):
            router.send_multipart([peer, frame])
        assert settle(main.poll) == [(addr, Tokens(room=6, ids=[1]))]
        assert main.rejected["replay"] == 3 and main._conns[addr].replies.restarts == 1
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
    time.sleep(0.2)  # RCV_HWM (64) queued at the relay, the rest at the sender
    assert relay.poll(max_frames=50) == []
    assert relay.rejected["bad_mac"] == 50
    settle(relay.poll)
    assert relay.rejected["bad_mac"] == 300


def test_every_socket_has_frame_bounds_heartbeats_and_keepalive(pair):
    relay, main, _ = pair
    main.send(relay.address, Watch(room=1))
    for sock in (relay.sock, *(c.sock for c in main._conns.values())):
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
    fresh = FrameAuth(SECRET).seal(pack_header(1, conn.session, conn.sent + 1, conn.epoch) + encode(Watch(room=2)))
    moved = dealer()
    moved.send(fresh)
    ((new_peer, msg),) = wait_for(relay.poll)
    assert msg == Watch(room=2) and new_peer != old_peer
    assert relay.send(new_peer, Tokens(room=2, ids=[2]))
    assert moved.poll(5000)
    frame = moved.recv()
    _, session, _, seq, _ = unpack_header(FrameAuth(SECRET).open(frame))
    assert (session, seq) == (conn.session, 2)  # the session's reply sequence goes on


def test_epoch_window_takes_a_later_relay_process_and_refuses_an_earlier_one():
    w = EpochWindow()
    w.accept(10, 1), w.accept(10, 2)
    with pytest.raises(ProtocolError, match="seen already"):
        w.accept(10, 2)
    w.accept(11, 1)  # restarted: its sequence starts again
    assert w.restarts == 1
    for epoch, seq in ((10, 3), (11, 1)):
        with pytest.raises(ProtocolError) as e:
            w.accept(epoch, seq)
        assert e.value.reason == "replay"


@pytest.mark.parametrize("epochs", ["per process", "one for all (control)"])
def test_a_restarted_relay_is_served_by_the_same_main_and_its_predecessors_frames_stay_refused(epochs, monkeypatch):
    """RLD restarts on the same address with the same secret (issue 31): MD's DEALER reconnects, MD's
    next Watch reaches the new process and its reply (sequence 1 again, a later epoch) is taken; a reply
    of the old process replayed afterwards is refused. The control gives the new process the old one's
    epoch (as before epochs existed): MD drops its reply as a replay ("reply 1 seen already")."""
    relay = RelayChannel("tcp://127.0.0.1:*", SECRET, vocab_size=100)
    address = relay.address
    main = MainChannel(SECRET, vocab_size=100)
    try:
        main.send(address, Watch(room=1))
        ((peer, _),) = wait_for(relay.poll)
        assert relay.send(peer, Tokens(room=1, ids=[1]))
        assert wait_for(main.poll) == [(address, Tokens(room=1, ids=[1]))]
        old = relay._seal(RELAY_TO_MAIN, main._conns[address].session, 1, relay.epoch, Tokens(room=1, ids=[1]))
        if epochs != "per process":
            monkeypatch.setattr(channel_mod, "new_epoch", lambda e=relay.epoch: e)
        relay.close()
        relay = None
        for _ in range(200):  # ZMQ releases the port from its I/O thread
            try:
                relay = RelayChannel(address, SECRET, vocab_size=100)  # restarted: same command line
                break
            except zmq.ZMQError:
                time.sleep(0.02)
        assert relay is not None
        got = []

        def watch_and_poll():
            main.send(address, Watch(room=2))
            time.sleep(0.05)
            got.extend(relay.poll())
            return got

        assert wait_for(watch_and_poll)
        peer2 = got[0][0]
        assert relay.send(peer2, Tokens(room=2, ids=[2]))
        if epochs != "per process":
            assert settle(main.poll) == [] and main.rejected["replay"] == 1
            return
        assert wait_for(main.poll) == [(address, Tokens(room=2, ids=[2]))]
        assert main._conns[address].replies.restarts == 1
        relay.sock.send_multipart([peer2, old])  # the old process's frame, replayed to MD now
        assert settle(main.poll) == [] and main.rejected["replay"] == 1
    finally:
        main.close()
        if relay is not None:
            relay.close()


def test_forgetting_an_old_peer_keeps_a_live_sessions_reply_sequence(pair, monkeypatch):
    relay, main, dealer = pair
    monkeypatch.setattr(channel_mod, "MAX_PEERS", 1)
    main.send(relay.address, Watch(room=1))
    ((peer, _),) = wait_for(relay.poll)
    assert relay.send(peer, Tokens(room=1, ids=[1]))
    assert wait_for(main.poll)
    conn = main._conns[relay.address]
    moved = dealer()  # the same session from another peer: the old peer is forgotten (MAX_PEERS 1)
    moved.send(FrameAuth(SECRET).seal(pack_header(1, conn.session, conn.sent + 1, conn.epoch) + encode(Watch(room=2))))
    ((new_peer, _),) = wait_for(relay.poll)
    assert relay.send(new_peer, Tokens(room=2, ids=[2]))
    assert moved.poll(5000)
    _, _, _, seq, _ = unpack_header(FrameAuth(SECRET).open(moved.recv()))
    assert seq == 2  # not 1 again: MD would drop it as a replay


def test_one_poll_reads_at_most_its_byte_budget(pair):
    relay, _, dealer = pair
    attacker = dealer()
    for _ in range(20):
        attacker.send(b"x" * (1 << 20))
    wait_for(lambda: relay.sock.poll(0))
    time.sleep(0.3)
    assert relay.poll(max_bytes=4 << 20) == []
    assert relay.rejected["bad_mac"] <= 5
    settle(relay.poll)
    assert relay.rejected["bad_mac"] == 20


def test_a_frame_of_the_previous_version_is_refused_naming_both(pair):
    """Version 3 frames came from MDs that took their session as their routing id and never said Hello:
    a relay of this version would send their replies nowhere after a reconnection, so it refuses them."""
    relay, _, dealer = pair
    assert FRAME_VERSION == 4
    old = bytes([3]) + pack_header(1, 42, 1, 7)[1:]
    dealer().send(FrameAuth(SECRET).seal(old + encode(Watch(room=1))))
    assert settle(relay.poll) == [] and relay.rejected["version"] == 1
    with pytest.raises(ProtocolError, match="frame version 3, this side speaks 4"):
        unpack_header(old)
