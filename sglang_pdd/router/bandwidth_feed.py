"""Feed the router's WAN bandwidth estimate from the transfers prefill really completed.

Every prefill server with the plugin counts, per PDD path, the bytes and the wall seconds of each
completed transfer-engine batch (`sglang_pdd_transfer_bytes_total`, `sglang_pdd_transfer_seconds_total`,
`sglang_pdd_transfer_batches_total`). Only the `main` path (the fan-out's leg to MainDecode) is
certainly the WAN: `direct` (plain PD) is P->MD in the P->MD pipeline but P->RLD for odd traffic,
and one LAN sample would inflate the estimate for a long time, so it is left out.
`TransferRateFeed.update` takes one `/metrics` page per prefill server, turns the
growth since the previous page into (bytes, seconds, batches) and hands it to the estimator, which
ignores windows too small to say anything about bandwidth. `poll_forever` does that on a timer.
"""

from __future__ import annotations

import asyncio
import logging

from sglang_pdd.metrics import parse_exposition
from sglang_pdd.policy.bandwidth import BandwidthEstimator

logger = logging.getLogger(__name__)

WAN_PATHS = ("main",)
_NAMES = {"bytes": "sglang_pdd_transfer_bytes_total", "seconds": "sglang_pdd_transfer_seconds_total",
          "batches": "sglang_pdd_transfer_batches_total"}


def wan_totals(text: str, paths: tuple[str, ...] = WAN_PATHS) -> dict[str, float]:
    """Summed KV bytes, seconds and batches over the WAN paths in one exposition page."""
    out = {}
    for key, name in _NAMES.items():
        out[key] = sum(v for labels, v in parse_exposition(text, name).items()
                       if dict(labels).get("kind") == "kv" and dict(labels).get("path") in paths)
    return out


class TransferRateFeed:
    def __init__(self, estimator: BandwidthEstimator, paths: tuple[str, ...] = WAN_PATHS):
        self.estimator, self.paths = estimator, paths
        self._last: dict[str, dict[str, float]] = {}
        self.samples = 0

    def update(self, source: str, text: str) -> None:
        now = wan_totals(text, self.paths)
        prev, self._last[source] = self._last.get(source), now
        if prev is None:
            return
        d = {k: now[k] - prev[k] for k in now}
        if any(v < 0 for v in d.values()):  # the server restarted: start over from this page
            return
        if d["bytes"] > 0 and d["seconds"] > 0:
            before = self.estimator.observations
            self.estimator.observe(d["bytes"], d["seconds"], transfers=int(d["batches"]))
            if self.estimator.observations == before:  # too small to say anything: carry it into the next
                self._last[source] = prev
            else:
                self.samples += 1

    async def poll_forever(self, session, urls: list[str], interval_s: float = 2.0) -> None:
        import aiohttp  # not a declared dependency; only the router process needs it

        while True:
            for url in urls:
                try:
                    async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as r:
                        if r.status == 200:
                            self.update(url, await r.text())
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    logger.debug("bandwidth feed: %s/metrics: %s", url, e)
            await asyncio.sleep(interval_s)
