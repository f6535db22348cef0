"""The router's standing work on its peers: one HTTP session (every call carries the router's role
key), the check that every role asks for that key (`role_lock`, where a key is configured), the
health checker that brings ejected peers back, the WAN bandwidth feed from P's completed transfers,
each peer's load from its /metrics, and MD's KV-event subscribers."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp

from sglang_pdd.router.cache.kv_subscriber import KvEventSubscriber
from sglang_pdd.router.peers import load_feed, role_auth
from sglang_pdd.router.peers.bandwidth_feed import TransferRateFeed
from sglang_pdd.router.peers.health import HealthChecker
from sglang_pdd.router.peers.pool import PeerPool
from sglang_pdd.router.peers.role_lock import RoleLock


@dataclass
class Polls:
    """How often each service runs, in seconds (0: never)."""

    health_check_s: float = 2.0
    bandwidth_poll_s: float = 2.0
    load_poll_s: float = 1.0
    role_lock_s: float = 2.0  # with a role key: ask a peer not known to be locked whether it is (0: never)


class PeerServices:
    def __init__(self, pools: tuple[PeerPool, PeerPool, PeerPool], polls: Polls, links=None,
                 kv_subscribers: list[KvEventSubscriber] | tuple = ()):
        """`pools`: P, RLD and MD; `links`: the policy's WAN links the bandwidth feed updates (None: no feed)."""
        self.prefill, self.relay, self.main = pools
        self.polls, self.links, self.kv_subscribers = polls, links, kv_subscribers
        self.session: aiohttp.ClientSession | None = None
        self.role_lock: RoleLock | None = None
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        headers = role_auth.headers()
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), headers=headers)
        if headers and self.polls.role_lock_s > 0:  # before the first request: the roles up now are known
            self.role_lock = RoleLock((self.prefill, self.relay, self.main), self.polls.role_lock_s)
            await self.role_lock.start()
        for sub in self.kv_subscribers:
            sub.start()
        if self.polls.health_check_s > 0:
            checker = HealthChecker((self.prefill, self.relay, self.main), self.polls.health_check_s)
            self._tasks.append(asyncio.create_task(checker.run_forever(self.session)))
        if self.links is not None and self.polls.bandwidth_poll_s > 0:
            sites = {p.host: p.site for p in self.main.peers}
            self.feed = TransferRateFeed(self.links, site_of=lambda host: sites.get(host, ""))
            self._tasks.append(asyncio.create_task(self.feed.poll_forever(
                self.session, [p.url for p in self.prefill.peers], self.polls.bandwidth_poll_s)))
        if self.polls.load_poll_s > 0:
            peers = self.prefill.peers + self.relay.peers + self.main.peers
            self._tasks.append(asyncio.create_task(load_feed.poll_forever(self.session, peers, self.polls.load_poll_s)))

    async def close(self) -> None:
        await asyncio.gather(*(sub.close() for sub in self.kv_subscribers))
        if self.role_lock is not None:
            await self.role_lock.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.session is not None:
            await self.session.close()
