"""Binding of every token-channel frame to its direction, connection, sender process and place.

Each frame starts, under the HMAC, with a header:

    <version u8><direction u8><session u64><epoch u64><seq u64>

* direction: `MAIN_TO_RELAY` or `RELAY_TO_MAIN`; a frame sent back the way it came (reflected) is
  refused.
* session: drawn at random by MainDecode for each connection (one DEALER per relay), and that
  DEALER's ZMQ routing id, so a DEALER that reconnects keeps its identity at the relay (the ROUTER
  hands it over) and the relay's replies reach it. RelayDecode sends a session's replies to the ZMQ
  peer of its latest fresh frame; the replies carry the session, and MD accepts only replies for its
  own connection's session.
* epoch: the sending process's start (`new_epoch`, nanoseconds since the epoch, drawn once per
  channel). MD keeps the relay's epoch per connection: a reply from a later epoch is a restarted relay,
  whose sequence starts again at 1 (MD takes it and starts a new window); a reply from an earlier
  epoch is an old frame replayed, refused. MD's own frames carry its epoch too (its session already
  changes with each process).
* seq: per session, epoch and direction, from 1 up. The receiver keeps the highest seq seen and a
  window of the `WINDOW` below it: a seq seen already, or older than the window, is a replay.

`SessionGuard` is the relay's receiving state; `ReplayWindow` one session's window; `EpochWindow`
MD's window over one relay's replies across that relay's restarts.
"""

from __future__ import annotations

import secrets
import struct
import time
from collections import OrderedDict

from sglang_pdd.protocol.messages import ProtocolError

FRAME_VERSION = 3  # 1: frames without a header; 2: without the sender's epoch
MAIN_TO_RELAY, RELAY_TO_MAIN = 1, 2
HEADER = struct.Struct("<BBQQQ")
WINDOW = 1024


def new_session() -> int:
    return secrets.randbits(64) or 1


def new_epoch() -> int:
    """A process's epoch: when its channel started (ns). A restarted process has a later one."""
    return time.time_ns()


def session_id(session: int) -> bytes:
    """The ZMQ routing id of MD's DEALER for `session` (never starts with a zero byte: ZMQ reserves those)."""
    return b"\x01" + session.to_bytes(8, "big")


def pack_header(direction: int, session: int, seq: int, epoch: int = 0) -> bytes:
    return HEADER.pack(FRAME_VERSION, direction, session, epoch, seq)


def unpack_header(data: bytes) -> tuple[int, int, int, int, bytes]:
    """(direction, session, epoch, seq, payload) of an authenticated frame's contents."""
    if len(data) < HEADER.size:
        raise ProtocolError("malformed", f"frame of {len(data)} bytes has no header")
    version, direction, session, epoch, seq = HEADER.unpack_from(data)
    if version != FRAME_VERSION:
        raise ProtocolError("version", f"frame version {version}, this side speaks {FRAME_VERSION}")
    return direction, session, epoch, seq, data[HEADER.size:]


class ReplayWindow:
    def __init__(self, size: int = WINDOW):
        self.size = size
        self.top = 0  # highest seq accepted
        self.seen = 0  # bit i: top - i was accepted

    def accept(self, seq: int) -> bool:
        """True (and remembered) when `seq` is new and inside the window."""
        if seq <= 0:
            return False
        if seq > self.top:
            shift = seq - self.top
            self.seen = ((self.seen << shift) | 1) & ((1 << self.size) - 1) if shift < self.size else 1
            self.top = seq
            return True
        back = self.top - seq
        if back >= self.size or self.seen >> back & 1:
            return False
        self.seen |= 1 << back
        return True


class EpochWindow:
    """MD's replay state over one relay's replies: the relay's epoch and a window within it."""

    def __init__(self):
        self.epoch: int | None = None
        self.window = ReplayWindow()
        self.restarts = 0  # later epochs taken (the relay restarted)

    def accept(self, epoch: int, seq: int) -> None:
        """Raise ProtocolError('replay') unless (epoch, seq) is fresh; a later epoch starts a new window."""
        if self.epoch is not None and epoch < self.epoch:
            raise ProtocolError("replay", f"reply {seq} of an earlier relay process (epoch {epoch} < {self.epoch})")
        if self.epoch is not None and epoch > self.epoch:
            self.restarts += 1
        if epoch != self.epoch:
            self.epoch, self.window = epoch, ReplayWindow()
        if not self.window.accept(seq):
            raise ProtocolError("replay", f"reply {seq} seen already or too old")


class SessionGuard:
    """The receiving side of a channel: accepts each frame once; `peer_of(session)` is where the
    session's latest fresh frame came from."""

    def __init__(self, direction: int, max_sessions: int = 4096):
        self.direction = direction
        self._sessions: OrderedDict[int, tuple[object, ReplayWindow]] = OrderedDict()
        self._max = max_sessions

    def check(self, direction: int, session: int, seq: int, peer: object = None) -> None:
        """Raise ProtocolError ('reflected', 'replay') unless the frame is fresh and goes this way."""
        if direction != self.direction:
            raise ProtocolError("reflected", f"a frame of direction {direction} arrived on the {self.direction} side")
        entry = self._sessions.get(session)
        if entry is None:
            entry = self._sessions[session] = [peer, ReplayWindow()]
            while len(self._sessions) > self._max:  # only authenticated frames open sessions
                self._sessions.popitem(last=False)
        if not entry[1].accept(seq):
            raise ProtocolError("replay", f"session {session:#x}: frame {seq} seen already or too old")
        entry[0] = peer
        self._sessions.move_to_end(session)

    def peer_of(self, session: int) -> object:
        entry = self._sessions.get(session)
        return None if entry is None else entry[0]
