"""Whether each role is locked (takes calls only with the router's key): a role anyone can call is refused service.

A role started without sglang's `--api-key` serves its whole API to whoever reaches its port:
`/abort_request {"abort_all": true}`, `/flush_cache`, `/update_weights_from_disk`, `/generate`. With
a key, sglang answers 401 on every path but `/health*`, `/ready*` and `/metrics*`
(`sglang.srt.utils.auth.decide_request_auth`). So, with a role key configured (`role_auth`), the
router asks every peer `GET /model_info` **without** the key (a read of the model's name, harmless
where it is served):

* **401 or 403**: locked. Asked again every `recheck_s`, so that a role restarted without its key
  is found.
* **any other answer below 500** (200: its API is open): open. The peer is refused service
  (`PeerHealth.refused`): no request goes to it, not even when every peer of its role is out;
  `/ready` and `/health` list it as out, `sglang_pdd_router_peer_out_of_service` is 1, and the
  router logs an error naming the role's `--api-key` and the router's `--insecure-roles`. Asked
  again every `interval_s`; back in service once it answers 401. Every peer of a role open leaves
  the router not ready (`peers.readiness`): a deployment whose roles lack their key never turns
  ready, while a router that serves is never stopped by one replica restarted without it.
* **no answer, or 5xx**: not known yet (a role still loading its weights); asked again every
  `interval_s`. It stays in service meanwhile, as any peer the router has not heard from: the
  check is of the role's configuration, not of its health.

The router checks every peer once as it starts (each answer within `timeout_s`), before it takes
a request, so the roles already up are known from its first request on; a role that comes up
later is checked when it first answers. `--insecure-roles` turns the check off (and lets the router
start without a role key: `router.__main__`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

import aiohttp

logger = logging.getLogger(__name__)

PATH = "/model_info"  # any path but /health*, /ready*, /metrics*: sglang's key check answers 401 first
LOCKED_STATUSES = (401, 403)
FIX = ("start it with sglang's --api-key (the key the router holds in SGLANG_PDD_ROLE_API_KEY), "
       "or start the router with --insecure-roles to call open roles")


def verdict(status: int) -> str | None:
    """`locked`, `open`, or None (not known: a 5xx, e.g. a proxy before a role still starting)."""
    if status in LOCKED_STATUSES:
        return "locked"
    return "open" if status < 500 else None


class RoleLock:
    """Asks each peer of `pools` whether it takes calls without the key, on a session of its own that
    sends none: at `start`, then every `interval_s` (every `recheck_s` once locked)."""

    def __init__(self, pools, interval_s: float = 2.0, recheck_s: float = 60.0, timeout_s: float = 2.0,
                 now: Callable[[], float] = time.monotonic):
        self.pools, self.interval_s, self.recheck_s, self.timeout_s = pools, interval_s, recheck_s, timeout_s
        self.now = now
        self.state: dict[str, str] = {}  # peer URL -> locked | open (absent: not known yet)
        self._due: dict[str, float] = {}  # peer URL -> when to ask it next
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task | None = None

    async def check_once(self, session: aiohttp.ClientSession) -> None:
        """Ask every peer that is due."""
        now = self.now()
        due = [(pool.role, p) for pool in self.pools for p in pool.peers if self._due.get(p.url, now) <= now]
        await asyncio.gather(*(self._check(session, role, p) for role, p in due))

    async def _check(self, session: aiohttp.ClientSession, role: str, peer) -> None:
        status = None
        try:
            async with session.get(peer.url + PATH, timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                                   allow_redirects=False) as r:
                status = r.status
                await r.read()
        except Exception:  # not up yet
            pass
        found = verdict(status) if status is not None else None
        before = self.state.get(peer.url)
        self._due[peer.url] = self.now() + (self.recheck_s if found == "locked" else self.interval_s)
        if found is None or found == before:
            return
        self.state[peer.url] = found
        if found == "open":
            peer.health.refused = f"answers {PATH} without the role key (HTTP {status})"
            logger.error("sglang-pdd router: %s %s answers %s without the role key (HTTP %d): anyone who reaches "
                         "its port can abort every request, flush its cache or load other weights. Refused "
                         "service until it asks for the key: %s", role, peer.url, PATH, status, FIX)
            return
        peer.health.refused = ""
        if before == "open":
            logger.warning("sglang-pdd router: %s %s now asks for the role key (HTTP %d): back in service",
                           role, peer.url, status)
        else:
            logger.info("sglang-pdd router: %s %s asks for the role key (HTTP %d)", role, peer.url, status)

    async def start(self) -> None:
        """Check every peer once (each within `timeout_s`), then go on in the background."""
        self._session = aiohttp.ClientSession()  # sends no key: the question is whether the role asks for one
        await self.check_once(self._session)
        self._task = asyncio.create_task(self._run_forever())

    async def _run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.check_once(self._session)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
