"""Peer health: ejection after failures, the back-off, the health checker, and pick() skipping peers out."""

import asyncio

import aiohttp
import pytest

from sglang_pdd.router.peer_health import HealthChecker, PeerHealth
from sglang_pdd.router.peers import Peer, PeerPool
from sglang_pdd.lab.testing import fake_upstream as fu


def run(coro, guard_s: float = 30.0):
    return asyncio.run(asyncio.wait_for(coro, guard_s))


def test_peer_health_ejects_and_takes_back():
    t = [0.0]
    h = PeerHealth(eject_after=3, backoff_s=5, max_backoff_s=8, now=lambda: t[0])
    assert not h.failed() and not h.failed() and h.failed() and h.out
    t[0] = 5.1
    assert not h.out  # the back-off is over: it gets a try
    assert h.failed() and h.out_until == pytest.approx(5.1 + 8)  # doubled, capped
    h.succeeded()
    assert not h.out and h.failures == 0
    assert h.failed(unreachable=True) and h.out  # unreachable: out at once
    h.checked = True  # with a health checker, out until it answers
    t[0] += 1000
    assert h.out


def test_the_health_checker_takes_a_peer_back():
    async def go():
        async with fu.FakeCluster() as cl:
            pools = cl.pools()
            checker = HealthChecker(pools, interval_s=0.1)
            md = pools[2].peers[0]
            md.health.failed(unreachable=True)
            async with aiohttp.ClientSession() as s:
                await checker.check_once(s)
                back = not md.health.out
                await cl.servers[2].close()
                md.health.failed(unreachable=True)
                await checker.check_once(s)
                return back, md.health.out

    back, still_out = run(go())
    assert back and still_out


def test_pick_skips_peers_out_of_service():
    a, b = Peer("http://a"), Peer("http://b")
    for policy in ("least-loaded", "round-robin"):
        pool = PeerPool("main", [a, b], policy)
        a.health.failed(unreachable=True)
        assert pool.healthy() == [b] and pool.out() == [a]
        assert {pool.pick().url for _ in range(4)} == {"http://b"}
        b.health.failed(unreachable=True)
        assert pool.healthy() == [a, b]  # none in service: every peer gets a try
        assert pool.pick(exclude=(a,)) is b
        a.health.succeeded(), b.health.succeeded()
        assert pool.out() == []
