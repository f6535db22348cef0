"""WAN bandwidth estimator: a moving estimate of per-transfer throughput from completed transfers.

The estimate is what one new transfer can expect to get, so it already reflects the sharing of
the link between concurrent transfers (TCP fairness). Tiny transfers are latency-dominated and
say nothing about bandwidth, so they are ignored.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

logger = logging.getLogger(__name__)


@dataclass
class BandwidthEstimator:
    initial_bytes_per_s: float
    alpha: float = 0.2  # weight of the newest observation (exponential moving average)
    rtt_s: float = 0.0  # subtracted from observed durations (the fixed part of a transfer)
    min_bytes: int = 1 << 20  # transfers smaller than this are not observed
    floor_bytes_per_s: float = 1e6  # the estimate never drops below this

    def __post_init__(self) -> None:
        if self.initial_bytes_per_s <= 0 or not (0 < self.alpha <= 1):
            raise ValueError("initial bandwidth must be > 0 and 0 < alpha <= 1")
        self._estimate = float(self.initial_bytes_per_s)
        self.observations = 0

    @property
    def bytes_per_s(self) -> float:
        return self._estimate

    def observe(self, nbytes: float, duration_s: float, transfers: int = 1) -> None:
        """Feed `transfers` completed transfers of `nbytes` in all that took `duration_s` summed
        over them (each end to end: one RTT each is not bandwidth)."""
        if nbytes < self.min_bytes or duration_s <= 0:
            return
        data_s = max(duration_s - max(1, transfers) * self.rtt_s, 1e-6)
        sample = nbytes / data_s
        self._estimate = max(self.floor_bytes_per_s,
                             (1 - self.alpha) * self._estimate + self.alpha * sample)
        self.observations += 1
        logger.debug("bandwidth sample %.3g B/s -> estimate %.3g B/s", sample, self._estimate)
