"""MainDecode's landing buffer for packed WAN transfers: regions allocated first-fit, freed or quarantined.

A region is freed at once when its room's transfer succeeded and MD unpacked it (P wrote everything
before it reported success). A region of a room that failed or was aborted is quarantined for
`grace_s` first: P may still be writing a block into it (its worker checks the room's status between
chunks, not during a write), and the bytes must not land in the next room's region.

Plain Python over a byte size; the buffer itself is created by the caller (`torch.empty`, registered
with the transfer engine once).
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from typing import Callable

from sglang_pdd.protocol.landing import align_up

logger = logging.getLogger(__name__)


class LandingArena:
    def __init__(self, nbytes: int, grace_s: float = 120.0, clock: Callable[[], float] = time.monotonic):
        if nbytes <= 0:
            raise ValueError(f"landing arena of {nbytes} bytes")
        self.nbytes = nbytes
        self.grace_s = grace_s
        self._clock = clock
        self._lock = threading.Lock()
        self._free: list[tuple[int, int]] = [(0, nbytes)]  # (offset, size), sorted, coalesced
        self._quarantine: list[tuple[float, int, int]] = []  # (release_at, offset, size)
        self._used = 0

    def alloc(self, size: int) -> int | None:
        """Offset of a new region of `size` bytes (rounded up to 64), or None when none fits."""
        size = align_up(max(size, 1))
        with self._lock:
            self._expire()
            for i, (off, free) in enumerate(self._free):
                if free >= size:
                    if free == size:
                        del self._free[i]
                    else:
                        self._free[i] = (off + size, free - size)
                    self._used += size
                    return off
        return None

    def free(self, off: int, size: int) -> None:
        with self._lock:
            self._release(off, align_up(max(size, 1)))

    def quarantine(self, off: int, size: int) -> None:
        with self._lock:
            self._quarantine.append((self._clock() + self.grace_s, off, align_up(max(size, 1))))

    def used(self) -> int:
        """Bytes in regions, quarantined ones included."""
        with self._lock:
            self._expire()
            return self._used

    def quarantined(self) -> int:
        with self._lock:
            self._expire()
            return len(self._quarantine)

    def _expire(self) -> None:
        """Release every quarantined region whose grace is over. An entry that cannot be released
        (its range is already free: a double free elsewhere) is dropped and logged, so the others are
        still processed and none is released twice."""
        now = self._clock()
        due = [item for item in self._quarantine if item[0] <= now]
        if not due:
            return
        self._quarantine = [item for item in self._quarantine if item[0] > now]
        for _, off, size in due:
            try:
                self._release(off, size)
            except ValueError as e:
                logger.error("landing arena: dropping a quarantined region: %s", e)

    def _release(self, off: int, size: int) -> None:
        i = bisect.bisect_left(self._free, (off, 0))
        if (i < len(self._free) and self._free[i][0] < off + size) or (i > 0 and sum(self._free[i - 1]) > off):
            raise ValueError(f"landing region [{off}, {off + size}) is already free")
        self._used -= size
        self._free.insert(i, (off, size))
        if i + 1 < len(self._free) and off + size == self._free[i + 1][0]:  # merge with the next
            self._free[i] = (off, size + self._free[i + 1][1])
            del self._free[i + 1]
        if i > 0 and sum(self._free[i - 1]) == off:  # merge with the previous
            self._free[i - 1] = (self._free[i - 1][0], self._free[i - 1][1] + self._free[i][1])
            del self._free[i]
