"""The token channel: a ZMQ ROUTER on RelayDecode, DEALER sockets on MainDecode. Never blocks.

Both ends poll from their scheduler loop (`poll()` returns at once). Every frame is HMAC'd
(`FrameAuth`); a frame that fails authentication or decoding is dropped, logged once per reason and
peer class, and counted in `rejected[reason]`. The sender of a well-formed message about something
the receiver cannot serve gets a `Reject` (that decision belongs to the caller).
"""

from __future__ import annotations

import collections
import logging

import zmq

from sglang_pdd.protocol import messages
from sglang_pdd.protocol.auth import FrameAuth
from sglang_pdd.protocol.messages import Message, ProtocolError

logger = logging.getLogger(__name__)


class _Endpoint:
    def __init__(self, secret: bytes, vocab_size: int | None):
        self._auth = FrameAuth(secret)
        self._vocab = vocab_size
        self._ctx = zmq.Context.instance()
        self.rejected: collections.Counter[str] = collections.Counter()

    def _decode(self, frame: bytes, peer: str) -> Message | None:
        try:
            return messages.decode(self._auth.open(frame), vocab_size=self._vocab)
        except ProtocolError as e:
            if not self.rejected[e.reason]:
                logger.warning("token channel: dropped a frame from %s: %s", peer, e)
            self.rejected[e.reason] += 1
            return None

    def _seal(self, msg: Message) -> bytes:
        return self._auth.seal(messages.encode(msg))


class RelayChannel(_Endpoint):
    """RLD side: bound ROUTER. `poll()` -> [(peer_id, message)], `send(peer_id, message)`."""

    def __init__(self, bind: str, secret: bytes, vocab_size: int | None = None):
        super().__init__(secret, vocab_size)
        self.sock = self._ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.bind(bind)
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def poll(self, max_messages: int = 1024) -> list[tuple[bytes, Message]]:
        out = []
        while len(out) < max_messages:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(frames) != 2:
                self.rejected["malformed"] += 1
                continue
            peer, frame = frames
            msg = self._decode(frame, peer.hex())
            if msg is not None:
                out.append((peer, msg))
        return out

    def send(self, peer: bytes, msg: Message) -> bool:
        try:
            self.sock.send_multipart([peer, self._seal(msg)], zmq.NOBLOCK)
            return True
        except (zmq.Again, zmq.ZMQError) as e:  # peer gone (ROUTER_MANDATORY) or queue full
            logger.warning("token channel: cannot send %s for room %s: %s", type(msg).__name__, msg.room, e)
            return False

    def close(self) -> None:
        self.sock.close(0)


class MainChannel(_Endpoint):
    """MD side: one DEALER per relay address. `send(addr, message)`, `poll()` -> [(addr, message)]."""

    def __init__(self, secret: bytes, vocab_size: int | None = None):
        super().__init__(secret, vocab_size)
        self._socks: dict[str, zmq.Socket] = {}
        self._poller = zmq.Poller()

    def _sock(self, addr: str) -> zmq.Socket:
        s = self._socks.get(addr)
        if s is None:
            s = self._ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDHWM, 10000)
            try:
                s.connect(addr)
            except zmq.ZMQError:
                s.close(0)
                raise
            self._socks[addr] = s
            self._poller.register(s, zmq.POLLIN)
        return s

    def sockets(self) -> list[zmq.Socket]:
        """One DEALER per relay reached so far (the scheduler's idle poller waits on them too)."""
        return list(self._socks.values())

    def send(self, addr: str, msg: Message) -> bool:
        try:
            sock = self._sock(addr)
        except zmq.ZMQError as e:  # e.g. a host name that does not resolve: no socket is kept
            logger.warning("token channel: cannot connect to %s (room %s): %s", addr, msg.room, e)
            return False
        try:
            sock.send(self._seal(msg), zmq.NOBLOCK)
            return True
        except zmq.ZMQError as e:  # zmq.Again: the send queue is full
            logger.warning("token channel: cannot send to %s (room %s): %s", addr, msg.room, e)
            return False

    def poll(self, max_messages: int = 1024) -> list[tuple[str, Message]]:
        out = []
        if not self._socks:
            return out
        ready = dict(self._poller.poll(0))
        for addr, s in self._socks.items():
            while s in ready and len(out) < max_messages:
                try:
                    frame = s.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                msg = self._decode(frame, addr)
                if msg is not None:
                    out.append((addr, msg))
        return out

    def close(self) -> None:
        for s in self._socks.values():
            s.close(0)
        self._socks.clear()
