"""Whether a peer is in service: consecutive failures take it out for a back-off, a served probe brings it back.

A peer that could not be reached is out at once; one that failed otherwise (5xx, a stream cut, an
idle deadline it is to blame for) after `eject_after` failures in a row. While out, `PeerPool.pick`
skips it as long as a peer of its role is in service.

Coming back: the router's health checker (`HealthChecker`) looks at each peer that is out every
`interval_s`; once its back-off is over it sends the peer a probe generate (`peers.probe`), and only
a probe that was served takes it back: sglang's `/health` answers 200 whenever the server runs, even
one that fails every request. Without a health checker, a peer out is tried again once its back-off
has passed. Either way it comes back on probation: one more failure takes it out again for twice
the back-off (up to `max_backoff_s`), and only `recover_after` real requests served in a row end the
probation and reset the back-off. A request it serves while out (every peer of its role was out)
takes it back too.

A peer refused service (`refused`: `peers.role_lock` found it answering without the role key) is out
whatever its health, and no fallback sends it a request (`PeerPool.healthy`).

`progress` counts the answers the peer gave on any request (each stream chunk, P's reply): the
dispatcher blames an idle deadline on the peer only when it gave none on any request meanwhile.
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
    recover_after: int = 5  # real requests served in a row that end a probation (and reset the back-off)
    now: Callable[[], float] = time.monotonic
    failures: int = 0  # in a row
    ejections: int = 0
    out_until: float | None = None  # set while ejected (until a probe or a request served takes it back)
    checked: bool = False  # a health checker takes it back: out until its probe is served, whatever the back-off
    probation: bool = False  # ejected before and not yet recovered: one failure takes it out again
    served: int = 0  # real requests served in a row (a probation ends at recover_after)
    progress: int = 0  # answers given on any request (chunks, replies)
    refused: str = ""  # why the router refuses it service whatever its health ("": it does not)
    _backoff: float = field(init=False, default=0.0)

    @property
    def out(self) -> bool:
        """Refused service, or ejected and not back: its back-off is not over, or (with a health
        checker) no probe was served yet."""
        return bool(self.refused) or (self.out_until is not None and (self.checked or self.now() < self.out_until))

    @property
    def due(self) -> bool:
        """Out with its back-off over: the health checker may probe it."""
        return self.out_until is not None and self.now() >= self.out_until

    @property
    def backoff(self) -> float:
        """The current back-off (0 in good standing)."""
        return self._backoff

    def failed(self, unreachable: bool = False) -> bool:
        """One failure; True when it ejected the peer."""
        self.failures += 1
        self.served = 0
        if self.out or not (unreachable or self.probation or self.failures >= self.eject_after):
            return False
        self._backoff = min(self.max_backoff_s, self._backoff * 2 if self._backoff else self.backoff_s)
        self.out_until = self.now() + self._backoff
        self.ejections += 1
        self.probation = True
        return True

    def succeeded(self) -> None:
        """A real request served: back in service; `recover_after` in a row end a probation."""
        self.failures, self.out_until = 0, None
        self.served += 1
        if self.probation and self.served >= self.recover_after:
            self.probation, self._backoff = False, 0.0

    def probe_served(self) -> None:
        """The health checker's probe was served: back in service, on probation (the back-off is kept)."""
        self.failures, self.out_until, self.served = 0, None, 0

    def progressed(self) -> None:
        self.progress += 1


class HealthChecker:
    """Every `interval_s` (a background task): each ejected peer of `pools` is asked for `GET /health`
    (is it up at all), and once its back-off is over, sent the probe generate of its role
    (`probe.probe`); a probe served takes it back."""

    def __init__(self, pools, interval_s: float = 2.0, timeout_s: float = 2.0, probe_timeout_s: float = 30.0):
        self.pools, self.interval_s, self.timeout_s = pools, interval_s, timeout_s
        self.probe_timeout_s = probe_timeout_s
        for pool in pools:
            for p in pool.peers:
                p.health.checked = True

    async def check_once(self, session: aiohttp.ClientSession) -> None:
        jobs = [self._check(session, pool.role, p) for pool in self.pools for p in pool.peers
                if p.health.out_until is not None]
        await asyncio.gather(*jobs)

    async def _check(self, session: aiohttp.ClientSession, role: str, peer) -> None:
        from sglang_pdd.router.peers import probe as health_probe

        try:
            async with session.get(peer.url + "/health", timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as r:
                up = r.status == 200
                await r.read()
        except Exception:  # still down
            return
        if not up or not peer.health.due:
            return
        problem = await health_probe.probe(session, role, peer.url, self.probe_timeout_s)
        if problem is not None:
            logger.info("peer %s is up but its probe failed (%s): still out", peer.url, problem)
            return
        logger.info("peer %s served its probe: back in service (on probation, back-off %gs)", peer.url,
                    peer.health.backoff)
        peer.health.probe_served()

    async def run_forever(self, session: aiohttp.ClientSession) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.check_once(session)
