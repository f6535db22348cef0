"""The relay pool's scale signal, live: how many RelayDecode instances this router's traffic pays for.

The router marks each request it places with a TTFT SLA at risk or not (`policy.relay_placement`: its
predicted P->MD TTFT is over the SLA because of the line), keeps the counts of the last `window_s`
seconds in one bucket per second (O(1) per request, memory bounded by the window), and on each
/metrics scrape asks the simulator's own rule (`policy.relay_pool_scale.target`) for the number of
instances: one once the share at risk pays an instance's price, more while the ones up are busy, none
once it falls under half of that. The router exports it as `sglang_pdd_router_relay_pool_target`; an
autoscaler (a Kubernetes HPA or KEDA, examples/kubernetes/relay-pool) sets the pool's replicas from it,
with a scale-down stabilisation window of its own. Instances that are down are out of service in the
router's view (`peers.health`), so the pool's addresses can all be listed up front (--relay, MD's
--pdd-relays) and the relay placement uses the ones that are up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sglang_pdd.policy.relay_pool_scale import PoolScaleConfig, PoolScaleInputs, target


@dataclass
class RelayPoolSignal:
    scale: PoolScaleConfig
    window_s: int = 30
    _requests: list[int] = field(init=False)
    _at_risk: list[int] = field(init=False)
    _second: int | None = field(init=False, default=None)  # the newest bucket's second

    def __post_init__(self) -> None:
        if not 1 <= self.window_s <= 3600:
            raise ValueError(f"the relay pool's window must be 1-3600 s, got {self.window_s}")
        self._requests, self._at_risk = [0] * self.window_s, [0] * self.window_s

    def _advance(self, now_s: float) -> int:
        """Clear the buckets of the seconds since the last call (at most the window's); the bucket of now."""
        sec = math.floor(now_s)
        if self._second is None or sec - self._second >= self.window_s:
            self._requests, self._at_risk = [0] * self.window_s, [0] * self.window_s
        elif sec > self._second:
            for s in range(self._second + 1, sec + 1):
                self._requests[s % self.window_s] = self._at_risk[s % self.window_s] = 0
        if self._second is None or sec > self._second:
            self._second = sec
        return self._second % self.window_s

    def observe(self, now_s: float, at_risk: bool) -> None:
        i = self._advance(now_s)
        self._requests[i] += 1
        self._at_risk[i] += 1 if at_risk else 0

    def counts(self, now_s: float) -> tuple[int, int]:
        """(requests placed, of which at risk) over the last window."""
        self._advance(now_s)
        return sum(self._requests), sum(self._at_risk)

    def target(self, now_s: float, instances: int, occupancy: float) -> int:
        """The instances the pool should have: `instances` up now, `occupancy` their mean use (0..1)."""
        requests, at_risk = self.counts(now_s)
        return target(self.scale, PoolScaleInputs(requests, at_risk, instances, min(max(occupancy, 0.0), 1.0)))
