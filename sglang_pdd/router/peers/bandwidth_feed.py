"""Feed the router's WAN bandwidth estimate from the transfers prefill really completed.

Every prefill server with the plugin counts, per PDD path, the bytes and the wall seconds of each
completed transfer-engine batch (`sglang_pdd_transfer_bytes_total`, `sglang_pdd_transfer_seconds_total`,
`sglang_pdd_transfer_batches_total`). The `main` path (the fan-out's leg to MainDecode) is
certainly the WAN. `direct` (plain PD) is P->MD in the P->MD pipeline but P->RLD for odd traffic,
and one LAN sample would inflate the estimate for a long time: it counts only towards `wan_hosts`
(MD hosts that no P or RLD shares, `SiteLinks.wan_hosts`). On a line where most turns go P->MD,
those are most of the WAN's transfers (the congested preset: without them the estimate stayed at
`--wan-mbit` while P->MD's batches ran at 20-45 Mbit/s, docs/bench.md).
`TransferRateFeed.update` takes one `/metrics` page per prefill server, turns the
growth since the previous page into (bytes, seconds, batches) per destination site (the MDs of each
site are behind their own link, `policy.site_links`) and hands it to that site's estimator, which
ignores windows too small to say anything about bandwidth. `poll_forever` does that on a timer.
The same page's `sglang_pdd_lane_queued_bytes` (bytes queued on P's main lanes, per destination)
tells each site's link what P still has to send there (`SiteLinks`' queue-aware prediction).
"""

from __future__ import annotations

from typing import Callable

from sglang_pdd.server.metrics import parse_exposition
from sglang_pdd.policy.bandwidth import BandwidthEstimator
from sglang_pdd.policy.site_links import SiteLinks
from sglang_pdd.router.peers import metrics_poll

WAN_PATHS = ("main",)
DIRECT_PATH = "direct"
QUEUED = "sglang_pdd_lane_queued_bytes"
_NAMES = {"bytes": "sglang_pdd_transfer_bytes_total", "seconds": "sglang_pdd_transfer_seconds_total",
          "batches": "sglang_pdd_transfer_batches_total"}


def wan_totals_by_site(text: str, site_of: Callable[[str], str] = lambda host: "",
                       paths: tuple[str, ...] = WAN_PATHS,
                       wan_hosts: frozenset[str] = frozenset()) -> dict[str, dict[str, float]]:
    """Summed KV bytes, seconds and batches over the WAN paths (and plain PD's towards `wan_hosts`)
    in one exposition page, per site of the destination (its `peer` label is the transfer-engine
    session host:port; a page without the label counts for the default site "")."""
    out: dict[str, dict[str, float]] = {}
    for key, name in _NAMES.items():
        for labels, v in parse_exposition(text, name).items():
            lab = dict(labels)
            host = lab.get("peer", "").rpartition(":")[0]
            wan = lab.get("path") in paths or (lab.get("path") == DIRECT_PATH and host in wan_hosts)
            if lab.get("kind") != "kv" or not wan:
                continue
            totals = out.setdefault(site_of(host) if host else "", dict.fromkeys(_NAMES, 0.0))
            totals[key] += v
    return out


def queued_by_site(text: str, site_of: Callable[[str], str] = lambda host: "") -> dict[str, float]:
    """Bytes queued on P's main lanes per site of the destination, in one exposition page."""
    out: dict[str, float] = {}
    for labels, v in parse_exposition(text, QUEUED).items():
        host = dict(labels).get("peer", "").rpartition(":")[0]
        site = site_of(host) if host else ""
        out[site] = out.get(site, 0.0) + max(v, 0.0)
    return out


def wan_totals(text: str, paths: tuple[str, ...] = WAN_PATHS) -> dict[str, float]:
    """Summed KV bytes, seconds and batches over the WAN paths in one exposition page."""
    out = dict.fromkeys(_NAMES, 0.0)
    for totals in wan_totals_by_site(text, paths=paths).values():
        for k, v in totals.items():
            out[k] += v
    return out


class TransferRateFeed:
    """Feeds `links` (one estimator, or a site's each) from P's pages; `site_of(host)` names the site
    of a destination host (an MD's), "" for the default link."""

    def __init__(self, links: BandwidthEstimator | SiteLinks, paths: tuple[str, ...] = WAN_PATHS,
                 site_of: Callable[[str], str] = lambda host: ""):
        self.links = links if isinstance(links, SiteLinks) else SiteLinks.single(links, links.rtt_s)
        self.paths, self.site_of = paths, site_of
        self._last: dict[tuple[str, str], dict[str, float]] = {}
        self._sources: set[str] = set()  # P pages read: a series new on a later page starts from zero
        self.samples = 0

    @property
    def estimator(self) -> BandwidthEstimator:
        return self.links.default.bandwidth

    def update(self, source: str, text: str) -> None:
        for site, now in wan_totals_by_site(text, self.site_of, self.paths, self.links.wan_hosts).items():
            if (source, site) not in self._last and source in self._sources:
                self._last[(source, site)] = dict.fromkeys(_NAMES, 0.0)  # its first transfers count
            self._observe((source, site), self.links.of(site).bandwidth, now)
        self._sources.add(source)
        queued = queued_by_site(text, self.site_of)  # a lane not on the page holds nothing
        for site in self.links.names():
            self.links.of(site).observe_queue(source, queued.get(site, 0.0))

    def _observe(self, key: tuple[str, str], estimator: BandwidthEstimator, now: dict[str, float]) -> None:
        prev, self._last[key] = self._last.get(key), now
        if prev is None:
            return
        d = {k: now[k] - prev[k] for k in now}
        if any(v < 0 for v in d.values()):  # the server restarted: start over from this page
            return
        if d["bytes"] > 0 and d["seconds"] > 0:
            before = estimator.observations
            estimator.observe(d["bytes"], d["seconds"], transfers=int(d["batches"]))
            if estimator.observations == before:  # too small to say anything: carry it into the next
                self._last[key] = prev
            else:
                self.samples += 1

    async def poll_forever(self, session, urls: list[str], interval_s: float = 2.0) -> None:
        await metrics_poll.poll_forever(session, urls, interval_s, self.update, "bandwidth feed")
