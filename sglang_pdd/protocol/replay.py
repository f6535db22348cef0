"""Binding of every token-channel frame to its direction, connection and place in that connection.

Each frame starts, under the HMAC, with a header:

    <version u8><direction u8><session u64><seq u64>

* direction: `MAIN_TO_RELAY` or `RELAY_TO_MAIN`; a frame sent back the way it came (reflected) is
  refused.
* session: drawn at random by MainDecode for each connection (one DEALER per relay). RelayDecode sends
  a session's replies to the ZMQ peer of its latest fresh frame (a reconnected DEALER is a new peer;
  only a holder of the secret can make a fresh frame, a replayed one is refused below); the replies
  carry the session, and MD accepts only replies for its own connection's session.
* seq: per session and direction, from 1 up. The receiver keeps the highest seq seen and a window of
  the `WINDOW` below it: a seq seen already, or older than the window, is a replay.

`SessionGuard` is the receiving side's state; `ReplayWindow` one session's window.
"""

from __future__ import annotations

import secrets
import struct
from collections import OrderedDict

from sglang_pdd.protocol.messages import ProtocolError

FRAME_VERSION = 2  # 1: frames without a header
MAIN_TO_RELAY, RELAY_TO_MAIN = 1, 2
HEADER = struct.Struct("<BBQQ")
WINDOW = 1024


def new_session() -> int:
    return secrets.randbits(64) or 1


def pack_header(direction: int, session: int, seq: int) -> bytes:
    return HEADER.pack(FRAME_VERSION, direction, session, seq)


def unpack_header(data: bytes) -> tuple[int, int, int, bytes]:
    """(direction, session, seq, payload) of an authenticated frame's contents."""
    if len(data) < HEADER.size:
        raise ProtocolError("malformed", f"frame of {len(data)} bytes has no header")
    version, direction, session, seq = HEADER.unpack_from(data)
    if version != FRAME_VERSION:
        raise ProtocolError("version", f"frame version {version}, this side speaks {FRAME_VERSION}")
    return direction, session, seq, data[HEADER.size:]


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
