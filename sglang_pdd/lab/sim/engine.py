"""Discrete-event engine: a clock and a heap of cancellable callbacks."""

from __future__ import annotations

import heapq
import math
from typing import Any, Callable


class Event:
    __slots__ = ("time", "fn", "args", "cancelled")

    def __init__(self, time: float, fn: Callable[..., Any], args: tuple):
        self.time, self.fn, self.args, self.cancelled = time, fn, args, False

    def cancel(self) -> None:
        self.cancelled = True


class EventLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Event]] = []
        self._seq = 0
        self.processed = 0

    def at(self, t: float, fn: Callable[..., Any], *args: Any) -> Event:
        if t < self.now - 1e-9:
            raise ValueError(f"event scheduled in the past: {t} < {self.now}")
        ev = Event(max(t, self.now), fn, args)
        self._seq += 1
        heapq.heappush(self._heap, (ev.time, self._seq, ev))
        return ev

    def after(self, dt: float, fn: Callable[..., Any], *args: Any) -> Event:
        return self.at(self.now + dt, fn, *args)

    def run(self, until: float = math.inf) -> None:
        heap = self._heap
        while heap:
            t, _, ev = heap[0]
            if t > until:
                break
            heapq.heappop(heap)
            if ev.cancelled:
                continue
            self.now = t
            self.processed += 1
            ev.fn(*ev.args)
        if until != math.inf and self.now < until and not heap:
            self.now = until

    @property
    def pending(self) -> int:
        return sum(1 for _, _, e in self._heap if not e.cancelled)
