"""The token channel: a ZMQ ROUTER on RelayDecode, DEALER sockets on MainDecode. Never blocks.

Both ends poll from their scheduler loop (`poll()` returns at once). Every frame is HMAC'd
(`FrameAuth`) over a header that binds it to its direction, connection (session) and sequence number
(`protocol.replay`); a frame that fails authentication, decoding or that binding (replayed, reflected,
from another peer) is dropped, logged once per reason, counted in `rejected[reason]` and reported to
the `record(reason)` callback the endpoint was given (the runtimes' /metrics counters). The sender
of a well-formed message about something the receiver cannot serve gets a `Reject` (that decision
belongs to the caller).

Before authentication nothing is trusted: ZMQ drops a connection whose message exceeds `MAX_FRAME`
(MAXMSGSIZE), queues at most `RCV_HWM` messages per peer, and `poll` reads (and MACs) at most
`max_frames` frames and `max_bytes` bytes per call whatever they turn out to be. With CURVE and an
allowlist of MD public keys, a client whose key is not on it fails the handshake and sends nothing
(`protocol.curve_zap`; counted as `curve_unknown_key`). ZMQ heartbeats and
TCP keepalive notice a connection a middlebox dropped while idle.

Which connection gets a session's replies: RLD's ROUTER names each connection itself (a routing id
that never crosses the wire) and has no ROUTER_HANDOVER, so no connection can claim another's id
while it lives. RLD sends a session's replies only to the connection its newest authenticated frame
came from (the highest seq: `SessionGuard.peer_of`): a third party that reaches the port, with or
without an id of its choosing, gets none of them, since it cannot send such a frame without the
secret (a captured one replayed is refused). (Before, MD's DEALER took its session as its routing id,
sent in clear in the ZMTP handshake without CURVE, and the ROUTER handed that id over to the newest
connection that claimed it: whoever had seen it could take MD's replies.) What is left without
CURVE: the ids are libzmq's 32-bit counter from a random start, and an id frees when its connection
dies; a third party that claimed a dead MD connection's id (guessing it: nothing shows it) before RLD
either tried to send there (ROUTER_MANDATORY fails, and RLD stops using it) or heard MD's next frame
would get what RLD sent it meanwhile. CURVE with an allowlist (`protocol.curve`) admits no third
party at all.

Restarts and reconnects: MD watches its DEALERs' handshakes (a ZMQ socket monitor, among `sockets()`
so a reconnection ends an idle wait) and after each one sends `Hello`, an authenticated frame like any
other, so RLD learns the new connection at once. A reply RLD cannot route meanwhile (the old
connection is gone) is held (`protocol.held_replies`) and sent when MD's next frame arrives. A
restarted RLD replies under a later epoch (`protocol.replay`), which MD takes as a new relay process;
a restarted MD has new sessions under later epochs. RLD refuses frames of an earlier epoch than a
session's, and of a session it does not know whose epoch is not newer than every session it forgot
(`SessionGuard.floor`): a replay of a session it forgot gets no further than one of a session it knows.
"""

from __future__ import annotations

import collections
import errno
import logging
from collections.abc import Callable

import zmq
from zmq.utils.monitor import parse_monitor_message

from sglang_pdd.protocol import curve, messages
from sglang_pdd.protocol.curve_zap import ClientAllowlist
from sglang_pdd.protocol.auth import FrameAuth
from sglang_pdd.protocol.held_replies import HeldReplies
from sglang_pdd.protocol.messages import Hello, Message, ProtocolError
from sglang_pdd.protocol.replay import (MAIN_TO_RELAY, RELAY_TO_MAIN, EpochWindow, SessionGuard, new_epoch,
                                        new_session, pack_header, unpack_header)

logger = logging.getLogger(__name__)

MAX_FRAME = 8 << 20  # bytes: a Tokens message of MAX_TOKENS_PER_MESSAGE ids and logprobs fits
RCV_HWM = 64  # messages queued per peer before authentication (each up to MAX_FRAME)
SND_HWM = 10000
HEARTBEAT_IVL_MS, HEARTBEAT_TIMEOUT_MS = 10_000, 30_000
KEEPALIVE_IDLE_S, KEEPALIVE_INTVL_S, KEEPALIVE_CNT = 60, 10, 6
MAX_FRAMES_PER_POLL = 1024
MAX_BYTES_PER_POLL = 32 << 20  # what one poll reads and MACs from the scheduler thread, whatever it is
MAX_PEERS = 4096  # MD connections a relay maps to their sessions (the least recent are forgotten)
MAX_SESSIONS = 4096  # MD sessions a relay keeps replay and reply state for (SessionGuard)


def configure(sock: zmq.Socket) -> None:
    """Bounds and liveness every token-channel socket gets before it binds or connects."""
    for opt, value in ((zmq.LINGER, 0), (zmq.MAXMSGSIZE, MAX_FRAME), (zmq.RCVHWM, RCV_HWM), (zmq.SNDHWM, SND_HWM),
                       (zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS), (zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS),
                       (zmq.HEARTBEAT_TTL, HEARTBEAT_TIMEOUT_MS), (zmq.TCP_KEEPALIVE, 1),
                       (zmq.TCP_KEEPALIVE_IDLE, KEEPALIVE_IDLE_S), (zmq.TCP_KEEPALIVE_INTVL, KEEPALIVE_INTVL_S),
                       (zmq.TCP_KEEPALIVE_CNT, KEEPALIVE_CNT)):
        sock.setsockopt(opt, value)


def _ignore(reason: str) -> None:
    pass


class _Endpoint:
    def __init__(self, secret: bytes, vocab_size: int | None, record: Callable[[str], None] = _ignore):
        self._auth = FrameAuth(secret)
        self._vocab = vocab_size
        self._ctx = zmq.Context.instance()
        self.rejected: collections.Counter[str] = collections.Counter()
        self._record = record

    def _reject(self, e: ProtocolError, peer: str) -> None:
        if not self.rejected[e.reason]:
            logger.warning("token channel: dropped a frame from %s: %s", peer, e)
        self._count(e.reason)

    def _count(self, reason: str) -> None:
        self.rejected[reason] += 1
        self._record(reason)

    def _open(self, frame: bytes) -> tuple[int, int, int, int, bytes]:
        return unpack_header(self._auth.open(frame))

    def _decode(self, payload: bytes) -> Message:
        return messages.decode(payload, vocab_size=self._vocab)

    def _seal(self, direction: int, session: int, seq: int, epoch: int, msg: Message) -> bytes:
        return self._auth.seal(pack_header(direction, session, seq, epoch) + messages.encode(msg))


class RelayChannel(_Endpoint):
    """RLD side: bound ROUTER. `poll()` -> [(peer_id, message)], `send(peer_id, message)`."""

    def __init__(self, bind: str, secret: bytes, vocab_size: int | None = None, curve_key: bytes | None = None,
                 record: Callable[[str], None] = _ignore, curve_clients: frozenset[bytes] | None = None):
        super().__init__(secret, vocab_size, record)
        self.epoch = new_epoch()  # this process's channel: a restarted one has a later epoch
        self._allowlist: ClientAllowlist | None = None
        if curve_key is not None and curve_clients is not None:  # only these MD keys pass the handshake
            self._ctx = zmq.Context()  # the ZAP handler serves one context: this socket's alone
            self._allowlist = ClientAllowlist(self._ctx, curve_clients)
        self._refusals_seen = 0
        self.sock = self._ctx.socket(zmq.ROUTER)
        configure(self.sock)
        if curve_key is not None:  # the relay's CURVE secret key (protocol.curve)
            curve.serve(self.sock, curve_key)
        self.encrypted = curve_key is not None
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a reply to a connection that is gone fails (and is held)
        try:
            self.sock.bind(bind)
        except zmq.ZMQError:
            self.close()  # and the allowlist's thread and context
            raise
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._guard = SessionGuard(MAIN_TO_RELAY, MAX_SESSIONS, on_forget=self._forget)
        self._session_of: collections.OrderedDict[bytes, int] = collections.OrderedDict()  # peer -> session
        self._sent: dict[int, int] = {}  # session -> seq of the last reply
        self.held = HeldReplies()  # replies waiting for a session's new connection

    def poll(self, max_frames: int = MAX_FRAMES_PER_POLL, max_bytes: int = MAX_BYTES_PER_POLL
             ) -> list[tuple[bytes, Message]]:
        if self._allowlist is not None and self._allowlist.refused != self._refusals_seen:
            for _ in range(self._allowlist.refused - self._refusals_seen):  # counted on this thread
                self._count("curve_unknown_key")
            self._refusals_seen = self._allowlist.refused
        out = []
        nbytes = 0
        for _ in range(max_frames):
            if nbytes >= max_bytes:
                break
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            nbytes += sum(len(f) for f in frames)
            if len(frames) != 2:
                self._count("malformed")
                continue
            peer, frame = frames
            try:
                direction, session, epoch, seq, payload = self._open(frame)
                msg = self._decode(payload)
                self._guard.check(direction, session, seq, peer, epoch)
            except ProtocolError as e:
                self._reject(e, peer.hex())
                continue
            self._session_of[peer] = session
            self._session_of.move_to_end(peer)
            while len(self._session_of) > MAX_PEERS:
                self._session_of.popitem(last=False)
            if session in self.held and self._guard.peer_of(session) is not None:  # what waited goes now
                waiting = self.held.take(session)
                n = self._deliver(session, waiting)
                if n < len(waiting) and not self.held.hold(session, waiting[n:]):
                    logger.warning("token channel: %d replies of session %#x lost", len(waiting) - n, session)
            if not isinstance(msg, Hello):  # a Hello only names MD's connection (above)
                out.append((peer, msg))
        return out

    def _forget(self, session: int) -> None:
        self._sent.pop(session, None)
        self.held.forget(session)

    def send(self, peer: bytes, msg: Message) -> bool:
        """Send to `peer`'s session: to the connection its latest fresh frame came from, or, while it has
        none (MD reconnecting), held for the next. False when the reply is lost (logged)."""
        session = self._session_of.get(peer)
        if session is None or not self._guard.knows(session):
            logger.warning("token channel: no connection from peer %s (room %s)", peer.hex(), msg.room)
            return False
        seq = self._sent.get(session, 0) + 1
        frame = self._seal(RELAY_TO_MAIN, session, seq, self.epoch, msg)
        if session in self.held:  # after the replies held before it
            ok = self.held.hold(session, [frame])
        else:
            ok = self._deliver(session, [frame]) == 1
        if not ok:  # MD's queue is full (zmq.Again), or its connection is gone and the hold is full
            logger.warning("token channel: cannot send %s for room %s (%d bytes held for reconnections)",
                           type(msg).__name__, msg.room, self.held.bytes)
            return False
        self._sent[session] = seq
        return True

    def _deliver(self, session: int, frames: list[bytes]) -> int:
        """Send `frames` in order to the session's connection; from the first it cannot route (the
        connection is gone: the session has none until MD's next fresh frame) they are held. How many
        were sent or held: fewer when MD's queue is full or the hold is."""
        peer = self._guard.peer_of(session)
        for i, frame in enumerate(frames):
            if peer is not None:
                try:
                    self.sock.send_multipart([peer, frame], zmq.NOBLOCK)
                    continue
                except zmq.ZMQError as e:
                    if e.errno != errno.EHOSTUNREACH:  # zmq.Again: MD's queue is full
                        return i
                logger.info("token channel: the connection of session %#x is gone; its replies wait for the next",
                            session)
                self._guard.unpin(session)
                peer = None
            return len(frames) if self.held.hold(session, frames[i:]) else i
        return len(frames)

    def close(self) -> None:
        self.sock.close(0)
        if self._allowlist is not None:
            self._allowlist.stop()
            self._ctx.term()


class _Connection:
    """One DEALER to one relay: its session and epoch, the seq it last sent, the window of the relay's
    replies, and the monitor that reports its handshakes (each one is followed by a Hello, each one the
    relay refuses is logged)."""

    def __init__(self, sock: zmq.Socket):
        self.sock = sock
        self.session = new_session()
        self.epoch = new_epoch()  # a connection opened later has a later one (the relay's floor: replay)
        self.sent = 0
        self.replies = EpochWindow()  # the relay's epoch and the window of its replies in it
        self.monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        self.refusals = 0  # handshakes the relay refused (CURVE: this MD's key is not on its allowlist)

    def handshakes(self, addr: str) -> int:
        """Handshakes completed since the last call (the first connection, then each reconnection)."""
        n = 0
        while True:
            try:
                event = parse_monitor_message(self.monitor.recv_multipart(zmq.NOBLOCK))["event"]
            except zmq.Again:
                return n
            if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self.refusals += 1
                if self.refusals & (self.refusals - 1) == 0:  # the 1st, 2nd, 4th...: ZMQ retries every reconnect
                    logger.warning("token channel: the relay at %s refused this MD's handshake (%d times): is its "
                                   "CURVE public key on the relay's allowlist?", addr, self.refusals)
            n += event == zmq.EVENT_HANDSHAKE_SUCCEEDED

    def close(self) -> None:
        self.sock.disable_monitor()
        self.monitor.close(0)
        self.sock.close(0)


class MainChannel(_Endpoint):
    """MD side: one DEALER per relay address. `send(addr, message)`, `poll()` -> [(addr, message)]."""

    def __init__(self, secret: bytes, vocab_size: int | None = None, curve_key: bytes | None = None,
                 record: Callable[[str], None] = _ignore, curve_client_key: bytes | None = None):
        super().__init__(secret, vocab_size, record)
        self._curve_key = curve_key  # the relays' CURVE public key (protocol.curve)
        self._curve_client_key = curve_client_key  # this MD's CURVE secret key (None: one drawn per connection)
        self.encrypted = curve_key is not None
        self._conns: dict[str, _Connection] = {}
        self._poller = zmq.Poller()

    def _conn(self, addr: str) -> _Connection:
        c = self._conns.get(addr)
        if c is None:
            s = self._ctx.socket(zmq.DEALER)  # no routing id: the relay's ROUTER names the connection
            configure(s)
            if self._curve_key is not None:
                curve.connect_to(s, self._curve_key, self._curve_client_key)
            c = _Connection(s)
            try:
                s.connect(addr)
            except zmq.ZMQError:
                c.close()
                raise
            self._conns[addr] = c
            self._poller.register(s, zmq.POLLIN)
            self._poller.register(c.monitor, zmq.POLLIN)
        return c

    def sockets(self) -> list[zmq.Socket]:
        """Per relay reached so far, its DEALER and that DEALER's monitor (the scheduler's idle poller waits
        on them too: a reply, or a reconnection to greet, ends an idle wait)."""
        return [s for c in self._conns.values() for s in (c.sock, c.monitor)]

    def send(self, addr: str, msg: Message) -> bool:
        try:
            c = self._conn(addr)
        except zmq.ZMQError as e:  # e.g. an address zmq cannot parse: no socket is kept
            logger.warning("token channel: cannot connect to %s (room %s): %s", addr, msg.room, e)
            return False
        return self._send(c, addr, msg)

    def _send(self, c: _Connection, addr: str, msg: Message) -> bool:
        try:
            c.sock.send(self._seal(MAIN_TO_RELAY, c.session, c.sent + 1, c.epoch, msg), zmq.NOBLOCK)
            c.sent += 1
            return True
        except zmq.ZMQError as e:  # zmq.Again: the send queue is full
            logger.warning("token channel: cannot send to %s (room %s): %s", addr, msg.room, e)
            return False

    def poll(self, max_frames: int = MAX_FRAMES_PER_POLL) -> list[tuple[str, Message]]:
        out: list[tuple[str, Message]] = []
        if not self._conns:
            return out
        ready = dict(self._poller.poll(0))
        budget = max_frames
        for addr, c in self._conns.items():
            if c.monitor in ready and c.handshakes(addr):  # (re)connected: tell the relay where MD is now
                self._send(c, addr, Hello())
            while c.sock in ready and budget > 0:
                try:
                    frame = c.sock.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                budget -= 1
                try:
                    direction, session, epoch, seq, payload = self._open(frame)
                    msg = self._decode(payload)
                    self._check(c, direction, session, epoch, seq)
                except ProtocolError as e:
                    self._reject(e, addr)
                    continue
                out.append((addr, msg))
        return out

    @staticmethod
    def _check(c: _Connection, direction: int, session: int, epoch: int, seq: int) -> None:
        if direction != RELAY_TO_MAIN:
            raise ProtocolError("reflected", f"a frame of direction {direction} arrived on the main side")
        if session != c.session:
            raise ProtocolError("peer", f"a reply for session {session:#x}, this connection is {c.session:#x}")
        restarts = c.replies.restarts
        c.replies.accept(epoch, seq)
        if c.replies.restarts != restarts:
            logger.info("token channel: the relay restarted (a later epoch); its replies start a new window")

    def close(self) -> None:
        for c in self._conns.values():
            c.close()
        self._conns.clear()
