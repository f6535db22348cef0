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

Restarts and reconnects: MD's DEALER takes its session as its ZMQ routing id and RLD's ROUTER hands a
reconnecting identity over to the new connection, so RLD's replies reach an MD whose connection came
back (a reply to a vanished identity would be lost). A restarted RLD replies under a later epoch
(`protocol.replay`), which MD takes as a new relay process; a restarted MD has a new session.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable

import zmq

from sglang_pdd.protocol import curve, messages
from sglang_pdd.protocol.curve_zap import ClientAllowlist
from sglang_pdd.protocol.auth import FrameAuth
from sglang_pdd.protocol.messages import Message, ProtocolError
from sglang_pdd.protocol.replay import (MAIN_TO_RELAY, RELAY_TO_MAIN, EpochWindow, SessionGuard, new_epoch,
                                        new_session, pack_header, session_id, unpack_header)

logger = logging.getLogger(__name__)

MAX_FRAME = 8 << 20  # bytes: a Tokens message of MAX_TOKENS_PER_MESSAGE ids and logprobs fits
RCV_HWM = 64  # messages queued per peer before authentication (each up to MAX_FRAME)
SND_HWM = 10000
HEARTBEAT_IVL_MS, HEARTBEAT_TIMEOUT_MS = 10_000, 30_000
KEEPALIVE_IDLE_S, KEEPALIVE_INTVL_S, KEEPALIVE_CNT = 60, 10, 6
MAX_FRAMES_PER_POLL = 1024
MAX_BYTES_PER_POLL = 32 << 20  # what one poll reads and MACs from the scheduler thread, whatever it is
MAX_PEERS = 4096  # MD connections a relay keeps reply state for (the least recent are forgotten)


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
        self.epoch = new_epoch()  # this process's channel: a restarted one has a later epoch
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

    def _seal(self, direction: int, session: int, seq: int, msg: Message) -> bytes:
        return self._auth.seal(pack_header(direction, session, seq, self.epoch) + messages.encode(msg))


class RelayChannel(_Endpoint):
    """RLD side: bound ROUTER. `poll()` -> [(peer_id, message)], `send(peer_id, message)`."""

    def __init__(self, bind: str, secret: bytes, vocab_size: int | None = None, curve_key: bytes | None = None,
                 record: Callable[[str], None] = _ignore, curve_clients: frozenset[bytes] | None = None):
        super().__init__(secret, vocab_size, record)
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
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting MD keeps its identity (its session)
        try:
            self.sock.bind(bind)
        except zmq.ZMQError:
            self.close()  # and the allowlist's thread and context
            raise
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._guard = SessionGuard(MAIN_TO_RELAY)
        self._session_of: collections.OrderedDict[bytes, int] = collections.OrderedDict()  # peer -> session
        self._sent: dict[int, int] = {}  # session -> seq of the last reply

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
                direction, session, _epoch, seq, payload = self._open(frame)
                msg = self._decode(payload)
                self._guard.check(direction, session, seq, peer)
            except ProtocolError as e:
                self._reject(e, peer.hex())
                continue
            self._session_of[peer] = session
            self._session_of.move_to_end(peer)
            while len(self._session_of) > MAX_PEERS:
                _, gone = self._session_of.popitem(last=False)
                if gone not in self._session_of.values():  # the session lives on under a newer peer
                    self._sent.pop(gone, None)
            out.append((peer, msg))
        return out

    def send(self, peer: bytes, msg: Message) -> bool:
        """Send to the connection `peer` came from: its session's latest peer (a reconnection)."""
        session = self._session_of.get(peer)
        if session is None:
            logger.warning("token channel: no connection from peer %s (room %s)", peer.hex(), msg.room)
            return False
        peer = self._guard.peer_of(session) or peer
        seq = self._sent.get(session, 0) + 1
        try:
            self.sock.send_multipart([peer, self._seal(RELAY_TO_MAIN, session, seq, msg)], zmq.NOBLOCK)
            self._sent[session] = seq
            return True
        except (zmq.Again, zmq.ZMQError) as e:  # peer gone (ROUTER_MANDATORY) or queue full
            logger.warning("token channel: cannot send %s for room %s: %s", type(msg).__name__, msg.room, e)
            return False

    def close(self) -> None:
        self.sock.close(0)
        if self._allowlist is not None:
            self._allowlist.stop()
            self._ctx.term()


class _Connection:
    """One DEALER to one relay: its session, the seq it last sent, the window of the relay's replies."""

    def __init__(self, sock: zmq.Socket):
        self.sock = sock
        self.session = new_session()
        self.sent = 0
        self.replies = EpochWindow()  # the relay's epoch and the window of its replies in it


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
            s = self._ctx.socket(zmq.DEALER)
            configure(s)
            c = _Connection(s)
            s.setsockopt(zmq.ROUTING_ID, session_id(c.session))  # kept across reconnects (ROUTER_HANDOVER)
            if self._curve_key is not None:
                curve.connect_to(s, self._curve_key, self._curve_client_key)
            try:
                s.connect(addr)
            except zmq.ZMQError:
                s.close(0)
                raise
            self._conns[addr] = c
            self._poller.register(s, zmq.POLLIN)
        return c

    def sockets(self) -> list[zmq.Socket]:
        """One DEALER per relay reached so far (the scheduler's idle poller waits on them too)."""
        return [c.sock for c in self._conns.values()]

    def send(self, addr: str, msg: Message) -> bool:
        try:
            c = self._conn(addr)
        except zmq.ZMQError as e:  # e.g. an address zmq cannot parse: no socket is kept
            logger.warning("token channel: cannot connect to %s (room %s): %s", addr, msg.room, e)
            return False
        try:
            c.sock.send(self._seal(MAIN_TO_RELAY, c.session, c.sent + 1, msg), zmq.NOBLOCK)
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
            c.sock.close(0)
        self._conns.clear()
