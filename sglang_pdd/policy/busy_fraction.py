"""The share of recent time an instance was busy, from its own running counter.

A deployment observes it without asking anyone: sglang's prefill scheduler counts its forward
time, and the simulator's `PrefillInstance.busy_s` is the same counter. The never-lose decision
(`policy.never_lose`) reads it to weigh the waiting a relay that slows P would add to P's other
requests against the waiting it saves (`relay_wait_cost`).

The estimate is an exponential moving average of busy time over wall time with time constant
`tau_s`, fed with samples at any spacing: a sample `dt` after the last weighs `1 - exp(-dt / tau)`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class BusyFraction:
    tau_s: float
    _fraction: float = field(default=0.0, init=False)
    _t: float | None = field(default=None, init=False)
    _busy: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        if not self.tau_s > 0:
            raise ValueError(f"tau_s must be > 0, got {self.tau_s}")

    @property
    def fraction(self) -> float:
        return self._fraction

    def sample(self, now_s: float, busy_s_total: float) -> float:
        """Feed the clock and the instance's running busy-time total; returns the new estimate.
        The first sample only sets the baseline."""
        if self._t is None:
            self._t, self._busy = now_s, busy_s_total
            return self._fraction
        dt, db = now_s - self._t, busy_s_total - self._busy
        if dt <= 0:
            return self._fraction
        self._t, self._busy = now_s, busy_s_total
        w = 1.0 - math.exp(-dt / self.tau_s)
        self._fraction += w * (min(1.0, max(0.0, db / dt)) - self._fraction)
        return self._fraction
