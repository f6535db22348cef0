"""The WAN link to each site that runs MainDecode servers: its bandwidth estimate and RTT.

A router may front MD pools in several clusters, each behind its own link. The pipeline policy and
the MD choice predict a candidate's WAN time from its site's link; the transfer-rate feed updates
each site's estimate from the transfers P completed towards that site's MDs. The site "" is the
default link (`--wan-mbit`, `--wan-rtt-ms`), used by every MD given without a site.

Each link also knows, per P, what is queued towards its site ahead of a new transfer: the larger of
P's gauge of its main lanes (`sglang_pdd_lane_queued_bytes`, read with the transfer counters) and the
router's own record of MD's KV it sent through that P (P->MD, P->RLD->MD's main leg), drained at the
link's estimated rate since (P->MD's KV leaves on sglang's own queues, which the gauge does not see).
A transfer to the site waits for it (`policy.wan_queue`, FIFO).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from sglang_pdd.policy.bandwidth import BandwidthEstimator
from sglang_pdd.policy.wan_queue import finish_s


@dataclass
class Link:
    bandwidth: BandwidthEstimator
    rtt_s: float
    queued: dict[str, float] = field(default_factory=dict)  # P URL -> bytes on its main lanes to this site (its page)
    routed: dict[str, tuple[float, float]] = field(default_factory=dict)  # P URL -> (bytes left, at) routed through P
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)

    def predict_s(self, nbytes: float, prefill: str = "") -> float:
        """The transfer's time behind what is queued through `prefill` for this site ("" or an unknown
        P: nothing queued, the idle-line prediction)."""
        return finish_s(nbytes, [self.queued_bytes(prefill)], self.bandwidth.bytes_per_s, self.rtt_s, fifo=True)

    def queued_bytes(self, prefill: str) -> float:
        return max(self.queued.get(prefill, 0.0), self._routed_left(prefill)) if prefill else 0.0

    def observe_queue(self, prefill: str, nbytes: float) -> None:
        """P's page says `nbytes` are queued on its main lanes to this site."""
        self.queued[prefill] = max(float(nbytes), 0.0)

    def routed_to(self, prefill: str, nbytes: float) -> None:
        """The router sent `nbytes` of MD's missed KV through `prefill` (P->MD, or P->RLD->MD's main leg)."""
        if prefill:
            self.routed[prefill] = (self._routed_left(prefill) + max(float(nbytes), 0.0), self.clock())

    def _routed_left(self, prefill: str) -> float:
        left, at = self.routed.get(prefill, (0.0, 0.0))
        return max(left - (self.clock() - at) * self.bandwidth.bytes_per_s, 0.0) if left else 0.0


@dataclass
class SiteLinks:
    default: Link
    sites: dict[str, Link] = field(default_factory=dict)
    # hosts whose plain-PD (P->MD) transfers cross the WAN: MD hosts no P or RLD shares (the router's
    # placement sets them; the bandwidth feed then learns from P->MD's transfers too)
    wan_hosts: frozenset[str] = frozenset()

    @classmethod
    def single(cls, bandwidth: BandwidthEstimator, rtt_s: float) -> "SiteLinks":
        return cls(Link(bandwidth, rtt_s))

    def add(self, site: str, bytes_per_s: float, rtt_s: float) -> Link:
        if not site:
            raise ValueError("a site needs a name")
        link = self.sites[site] = Link(BandwidthEstimator(bytes_per_s, rtt_s=rtt_s), rtt_s)
        return link

    def of(self, site: str) -> Link:
        return self.sites.get(site, self.default) if site else self.default

    def names(self) -> list[str]:
        return [""] + list(self.sites)
