"""Whether a peer is in service: consecutive failures take it out for a back-off, an answer brings it back.

A peer that could not be reached is out at once; one that failed otherwise (5xx, a stream cut, an
idle deadline) after `eject_after` failures in a row. While out, `PeerPool.pick` skips it as long as
a peer of its role is in service. The router's health checker (`HealthChecker`) asks each peer that
is out for `GET /health` every `interval_s`; a 200 takes it back (a request it serves does too).
Without a health checker, a peer out is tried again once `backoff_s` has passed (the back-off
doubles on each ejection, up to `max_backoff_s`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import aiohttp

logger = logging.getLogger(__name__)


@dataclass
class PeerHealth:
    eject_after: int = 3
    backoff_s: float = 5.0
    max_backoff_s: float = 60.0
    now: Callable[[], float] = time.monotonic
    failures: int = 0  # in a row
    ejections: int = 0
    out_until: float | None = None  # set while ejected
    checked: bool = False  # a health checker takes it back: out until it answers, whatever the back-off
    _backoff: float = field(init=False, default=0.0)

    @property
    def out(self) -> bool:
        """Ejected and its back-off not over."""
        return self.out_until is not None and (self.checked or self.now() < self.out_until)

    def failed(self, unreachable: bool = False) -> bool:
        """One failure; True when it ejected the peer."""
        self.failures += 1
        if self.out or not (unreachable or self.failures >= self.eject_after):
            return False
        self._backoff = min(self.max_backoff_s, self._backoff * 2 if self._backoff else self.backoff_s)
        self.out_until = self.now() + self._backoff
        self.ejections += 1
        return True

    def succeeded(self) -> None:
        """An answer (a request served, a health check passed): back in service, back-off reset."""
        self.failures, self.out_until, self._backoff = 0, None, 0.0


class HealthChecker:
    """Polls `GET /health` of every ejected peer of `pools` every `interval_s` (a background task)."""

    def __init__(self, pools, interval_s: float = 2.0, timeout_s: float = 2.0):
        self.pools, self.interval_s, self.timeout_s = pools, interval_s, timeout_s
        for pool in pools:
            for p in pool.peers:
                p.health.checked = True

    async def check_once(self, session: aiohttp.ClientSession) -> None:
        peers = [p for pool in self.pools for p in pool.peers if p.health.out_until is not None]
        await asyncio.gather(*(self._probe(session, p) for p in peers))

    async def _probe(self, session: aiohttp.ClientSession, peer) -> None:
        try:
            async with session.get(peer.url + "/health", timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as r:
                ok = r.status == 200
                await r.read()
        except Exception:  # still down
            return
        if ok:
            logger.info("peer %s answers its health check again: back in service", peer.url)
            peer.health.succeeded()

    async def run_forever(self, session: aiohttp.ClientSession) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.check_once(session)
