"""Queue-aware WAN time: what P's lane to MD's site already holds, and the line it shares.

The router's per-transfer bandwidth estimate (`policy.bandwidth`) predicts a transfer's time as
if the line were idle: missed bytes / throughput + RTT. A request queued behind other transfers
on the same lane waits longer. P's transfer engine knows the bytes still to send per active
transfer (its lane state) and how fast the line drained them while it had data in flight, so
the router can predict the finish time under fair sharing (processor sharing: a new transfer of
`b` bytes beside others with `r_i` left finishes after `b + sum(min(r_i, b))` bytes of line
time), ignoring transfers that start later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from sglang_pdd.policy.wan_queue import finish_s


def shared_finish_s(nbytes: float, queued: Sequence[float], line_bytes_per_s: float,
                    rtt_s: float) -> float:
    """Time for a new transfer of `nbytes` on a fairly shared line whose active transfers have
    `queued` bytes left each: `(nbytes + sum(min(q, nbytes))) / line + rtt` (`policy.wan_queue`)."""
    return finish_s(nbytes, queued, line_bytes_per_s, rtt_s, fifo=False)


@dataclass
class LineRateEstimator:
    """The line's drain rate while the lane had data in flight: an exponential moving average of
    (bytes sent) / (busy time) between samples, from the lane's own counters."""

    initial_bytes_per_s: float
    alpha: float = 0.2
    min_busy_s: float = 0.01  # samples over shorter busy time say little

    def __post_init__(self) -> None:
        if self.initial_bytes_per_s <= 0 or not 0 < self.alpha <= 1:
            raise ValueError("initial rate must be > 0 and 0 < alpha <= 1")
        self._estimate = float(self.initial_bytes_per_s)
        self._bytes = 0.0
        self._busy = 0.0

    @property
    def bytes_per_s(self) -> float:
        return self._estimate

    def sample(self, bytes_sent_total: float, busy_s_total: float) -> None:
        """Feed the lane's running totals; the difference since the last sample is one sample."""
        db, dt = bytes_sent_total - self._bytes, busy_s_total - self._busy
        if dt < self.min_busy_s:
            return
        self._bytes, self._busy = bytes_sent_total, busy_s_total
        self._estimate = (1 - self.alpha) * self._estimate + self.alpha * (db / dt)
