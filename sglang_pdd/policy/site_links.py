"""The WAN link to each site that runs MainDecode servers: its bandwidth estimate and RTT.

A router may front MD pools in several clusters, each behind its own link. The pipeline policy and
the MD choice predict a candidate's WAN time from its site's link; the transfer-rate feed updates
each site's estimate from the transfers P completed towards that site's MDs. The site "" is the
default link (`--wan-mbit`, `--wan-rtt-ms`), used by every MD given without a site.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sglang_pdd.policy.bandwidth import BandwidthEstimator


@dataclass
class Link:
    bandwidth: BandwidthEstimator
    rtt_s: float

    def predict_s(self, nbytes: float) -> float:
        return nbytes / self.bandwidth.bytes_per_s + self.rtt_s


@dataclass
class SiteLinks:
    default: Link
    sites: dict[str, Link] = field(default_factory=dict)

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
