"""The inter-datacenter link: bandwidth shared by concurrent transfers, RTT, jitter.

* Sharing: processor sharing (TCP fairness): n active transfers each get capacity / n, capped
  by an optional per-flow limit (window / RTT).
* Jitter: the capacity is piecewise constant over `jitter_period_s` windows, multiplied by
  max(0.1, 1 + jitter * N(0, 1)) drawn per window from a seeded generator.
* Latency: a transfer completes one RTT after its last byte (request, last ack), so an
  uncontended transfer of b bytes takes b / bandwidth + RTT: what the router predicts.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from sglang_pdd.lab.sim.engine import Event, EventLoop

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WanSpec:
    bandwidth_gbps: float = 25.0  # link capacity, Gbit/s
    rtt_s: float = 0.03  # round trip, s (~1000 km of fibre plus switching)
    jitter: float = 0.15  # relative std of capacity per window
    jitter_period_s: float = 1.0
    per_flow_gbps: Optional[float] = None  # cap per transfer (None: a flow may fill the link)
    seed: int = 0

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_gbps * 1e9 / 8


class Transfer:
    __slots__ = ("tid", "nbytes", "remaining", "start", "on_done", "done", "cancelled")

    def __init__(self, tid: int, nbytes: float, start: float, on_done: Callable[["Transfer"], None]):
        self.tid, self.nbytes, self.remaining, self.start = tid, float(nbytes), float(nbytes), start
        self.on_done, self.done, self.cancelled = on_done, False, False


class WanLink:
    def __init__(self, loop: EventLoop, spec: WanSpec):
        self.loop, self.spec = loop, spec
        self._active: dict[int, Transfer] = {}
        self._next_id = 0
        self._last = 0.0
        self._rate = 0.0  # bytes/s per active transfer
        self._event: Event | None = None
        self._factors: dict[int, float] = {}
        self.bytes_sent = 0.0  # bytes that crossed the link (cancelled transfers: the part sent)
        self.busy_s = 0.0

    def capacity(self, t: float) -> float:
        s = self.spec
        if s.jitter <= 0:
            return s.bytes_per_s
        w = int(t // s.jitter_period_s)
        f = self._factors.get(w)
        if f is None:
            g = np.random.default_rng([s.seed, w])
            f = self._factors[w] = max(0.1, 1.0 + s.jitter * float(g.standard_normal()))
        return s.bytes_per_s * f

    @property
    def active(self) -> int:
        return len(self._active)

    def queued_bytes(self) -> list[float]:
        """Bytes still to send, per active transfer: the sender's lane state."""
        self._advance()  # the rate is unchanged, so the pending tick stays exact
        return [tr.remaining for tr in self._active.values()]

    def start(self, nbytes: float, on_done: Callable[[Transfer], None]) -> Transfer:
        self._advance()
        tr = Transfer(self._next_id, nbytes, self.loop.now, on_done)
        self._next_id += 1
        if nbytes <= 0:
            self.loop.after(self.spec.rtt_s, self._finish, tr)
            return tr
        self._active[tr.tid] = tr
        self._reschedule()
        return tr

    def cancel(self, tr: Transfer) -> None:
        if tr.done or tr.cancelled:
            return
        tr.cancelled = True
        if tr.tid in self._active:
            self._advance()
            del self._active[tr.tid]
            self._reschedule()

    def _advance(self) -> None:
        now = self.loop.now
        dt = now - self._last
        if dt > 0 and self._active:
            moved = self._rate * dt
            for tr in self._active.values():
                step = min(tr.remaining, moved)
                tr.remaining -= step
                self.bytes_sent += step
            self.busy_s += dt
        self._last = now

    def _reschedule(self) -> None:
        if self._event is not None:
            self._event.cancel()
            self._event = None
        if not self._active:
            self._rate = 0.0
            return
        now = self.loop.now
        rate = self.capacity(now) / len(self._active)
        if self.spec.per_flow_gbps:
            rate = min(rate, self.spec.per_flow_gbps * 1e9 / 8)
        self._rate = rate
        first = min(tr.remaining for tr in self._active.values())
        t_done = now + first / rate
        if self.spec.jitter > 0:
            boundary = (math.floor(now / self.spec.jitter_period_s) + 1) * self.spec.jitter_period_s
            t_done = min(t_done, boundary)
        self._event = self.loop.at(t_done, self._tick)

    def _tick(self) -> None:
        self._event = None
        self._advance()
        for tr in [t for t in self._active.values() if t.remaining <= 1e-6 * max(1.0, t.nbytes)]:
            del self._active[tr.tid]
            self.loop.after(self.spec.rtt_s, self._finish, tr)
        self._reschedule()

    def _finish(self, tr: Transfer) -> None:
        if tr.cancelled:
            return
        tr.done = True
        tr.on_done(tr)
