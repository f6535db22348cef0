"""The relay's replies to an MD session whose connection is gone, held until MD's next frame names its new one.

RelayDecode's ROUTER names each connection itself, so an MD that reconnects comes back under a new
ZMQ peer, and the relay learns it only from MD's next authenticated frame (its `Hello`, sent after
each reconnection: `protocol.channel`). A reply the relay sends in between (the ROUTER cannot route
it: the old peer is gone) waits here, sealed, in order, and goes out when that frame arrives. Bounded:
at most `max_bytes` in all (a reply that does not fit is lost, as it was before), and a session whose
oldest held reply is older than `ttl_s` loses them all (MD has given its requests up by then: its
handoff timeout; an MD that is gone for good never claims them).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

MAX_BYTES = 64 << 20
TTL_S = 60.0


class HeldReplies:
    def __init__(self, max_bytes: int = MAX_BYTES, ttl_s: float = TTL_S, now: Callable[[], float] = time.monotonic):
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.now = now
        self.bytes = 0
        self.expired = 0  # replies dropped for their age
        # session -> (when its first reply was held, its replies in order); the oldest sessions first
        self._held: collections.OrderedDict[int, tuple[float, list[bytes]]] = collections.OrderedDict()

    def __contains__(self, session: int) -> bool:
        return session in self._held

    def hold(self, session: int, frames: list[bytes]) -> bool:
        """Keep `frames` (after any held already) for `session`; False (nothing kept) when they do not fit."""
        self._expire()
        size = sum(len(f) for f in frames)
        if self.bytes + size > self.max_bytes:
            return False
        self._held.setdefault(session, (self.now(), []))[1].extend(frames)
        self.bytes += size
        return True

    def take(self, session: int) -> list[bytes]:
        """The session's held replies, in order, forgotten here."""
        self._expire()
        return self.forget(session)

    def forget(self, session: int) -> list[bytes]:
        _, frames = self._held.pop(session, (0.0, []))
        self.bytes -= sum(len(f) for f in frames)
        return frames

    def _expire(self) -> None:
        deadline = self.now() - self.ttl_s
        while self._held:
            session, (since, frames) = next(iter(self._held.items()))
            if since > deadline:
                return
            self.expired += len(self.forget(session))
