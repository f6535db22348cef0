"""Binding of every token-channel frame to its direction, connection, sender process and place.

Each frame starts, under the HMAC, with a header:

    <version u8><direction u8><session u64><epoch u64><seq u64>

* direction: `MAIN_TO_RELAY` or `RELAY_TO_MAIN`; a frame sent back the way it came (reflected) is
  refused.
* session: drawn at random by MainDecode for each connection (one DEALER per relay). RelayDecode sends
  a session's replies to the ZMQ peer that its newest frame came from (the ROUTER names each
  connection itself, and MD says `Hello` after each reconnection: `protocol.channel`); the replies
  carry the session, and MD accepts only replies for its own connection's session.
* epoch: when the sender's side of the connection started (`new_epoch`, nanoseconds since the epoch):
  the relay's channel (once per process), MD's connection (once per DEALER, so once per relay and
  process). MD keeps the relay's epoch per connection: a reply from a later epoch is a restarted relay,
  whose sequence starts again at 1 (MD takes it and starts a new window); a reply from an earlier
  epoch is an old frame replayed, refused. The relay keeps MD's epoch per session the same way.
* seq: per session, epoch and direction, from 1 up. The receiver keeps the highest seq seen and a
  window of the `WINDOW` below it: a seq seen already, or older than the window, is a replay.

The relay keeps a bounded number of sessions (`SessionGuard`, the least recent forgotten): a frame of
a forgotten session would open it again with an empty window, so a captured frame of it could be
replayed. The relay therefore remembers the newest epoch among the sessions it forgot (`floor`) and
refuses a session it does not know whose epoch is not newer (`replay`): every forgotten session is
at or below the floor, so none of its frames gets through again, while a session MD opens now carries
an epoch drawn now, newer than any session the relay has forgotten. A legitimate MD is refused only
(1) if the relay forgot its session while it lived, which takes `max_sessions` other sessions heard
from since its last frame (far more MD connections than one relay serves: an active MD sends a frame
per request), and which broke that session before too (the relay's replies started again at 1);
(2) if its clock is behind the host of a forgotten session by more than the time between that
session's start and its own (keep the MD hosts' clocks synchronised). A restarted relay knows no
session and has no floor: every MD connection comes back.

`SessionGuard` is the relay's receiving state; `ReplayWindow` one session's window; `EpochWindow` one
peer's epoch and the window within it (MD's over a relay's replies across its restarts, the relay's
over one MD session's frames).
"""

from __future__ import annotations

import secrets
import struct
import time
from collections import OrderedDict
from collections.abc import Callable

from sglang_pdd.protocol.messages import ProtocolError

FRAME_VERSION = 4  # 1: no header; 2: no epoch; 3: MD's session was its DEALER's routing id (no Hello)
MAIN_TO_RELAY, RELAY_TO_MAIN = 1, 2
HEADER = struct.Struct("<BBQQQ")
WINDOW = 1024


def new_session() -> int:
    return secrets.randbits(64) or 1


def new_epoch() -> int:
    """An epoch: now (ns). The relay draws one per process, MD one per connection: a restarted
    process, a new connection, has a later one."""
    return time.time_ns()


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
    """One peer's epoch and the replay window within it: a later epoch (the peer restarted) starts a new
    window, an earlier one is refused."""

    def __init__(self):
        self.epoch: int | None = None
        self.window = ReplayWindow()
        self.restarts = 0  # later epochs taken

    def accept(self, epoch: int, seq: int) -> None:
        """Raise ProtocolError('replay') unless (epoch, seq) is fresh; a later epoch starts a new window."""
        if self.epoch is not None and epoch < self.epoch:
            raise ProtocolError("replay", f"frame {seq} of an earlier process (epoch {epoch} < {self.epoch})")
        if self.epoch is not None and epoch > self.epoch:
            self.restarts += 1
        if epoch != self.epoch:
            self.epoch, self.window = epoch, ReplayWindow()
        if not self.window.accept(seq):
            raise ProtocolError("replay", f"frame {seq} seen already or too old")


class SessionGuard:
    """The receiving side of a channel: accepts each frame once, per session and epoch; `peer_of(session)`
    is where the session's newest frame (the highest seq) came from. It keeps at most `max_sessions`
    (the least recent forgotten, `on_forget(session)` told), and refuses a session it does not know
    whose epoch is not newer than every forgotten one (`floor`): its frames may be a forgotten one's."""

    def __init__(self, direction: int, max_sessions: int = 4096, on_forget: Callable[[int], None] | None = None):
        self.direction = direction
        self._sessions: OrderedDict[int, list] = OrderedDict()  # session -> [peer, EpochWindow]
        self._max = max_sessions
        self._on_forget = on_forget
        self.floor: int | None = None  # the newest epoch among the sessions forgotten

    def check(self, direction: int, session: int, seq: int, peer: object = None, epoch: int = 0) -> None:
        """Raise ProtocolError ('reflected', 'replay') unless the frame is fresh and goes this way."""
        if direction != self.direction:
            raise ProtocolError("reflected", f"a frame of direction {direction} arrived on the {self.direction} side")
        entry = self._sessions.get(session)
        if entry is None:
            if self.floor is not None and epoch <= self.floor:
                raise ProtocolError("replay", f"session {session:#x} is unknown and its epoch {epoch} is not "
                                    f"newer than a forgotten session's ({self.floor})")
            entry = [None, EpochWindow()]
        window = entry[1]
        top = window.window.top if window.epoch == epoch else -1
        try:
            window.accept(epoch, seq)
        except ProtocolError as e:
            raise ProtocolError("replay", f"session {session:#x}: {e.detail}") from None
        if seq > top:  # the newest frame: a late one from a connection that since died moves nothing
            entry[0] = peer
        self._sessions[session] = entry  # only authenticated, fresh frames open sessions
        self._sessions.move_to_end(session)
        while len(self._sessions) > self._max:
            gone, (_, window) = self._sessions.popitem(last=False)
            self.floor = max(self.floor or 0, window.epoch)
            if self._on_forget is not None:
                self._on_forget(gone)

    def knows(self, session: int) -> bool:
        return session in self._sessions

    def peer_of(self, session: int) -> object:
        entry = self._sessions.get(session)
        return None if entry is None else entry[0]

    def unpin(self, session: int) -> None:
        """The session's connection is gone: no peer until its next fresh frame."""
        entry = self._sessions.get(session)
        if entry is not None:
            entry[0] = None
