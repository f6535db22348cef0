"""Peer health: ejection after failures, the back-off and its probation, the health checker's probe
generate, and pick() skipping peers out."""

import asyncio

import aiohttp
import pytest

from sglang_pdd.router.peers import probe as health_probe
from sglang_pdd.router.peers.health import HealthChecker, PeerHealth
from sglang_pdd.router.peers.pool import Peer, PeerPool
from sglang_pdd.lab.testing import fake_upstream as fu


def run(coro, guard_s: float = 30.0):
    return asyncio.run(asyncio.wait_for(coro, guard_s))


def test_peer_health_ejects_and_takes_back():
    t = [0.0]
    h = PeerHealth(eject_after=3, backoff_s=5, max_backoff_s=8, now=lambda: t[0])
    assert not h.failed() and not h.failed() and h.failed() and h.out
    t[0] = 5.1
    assert not h.out  # the back-off is over: it gets a try
    assert h.failed() and h.out_until == pytest.approx(5.1 + 8)  # on probation: one failure, doubled, capped
    h.succeeded()
    assert not h.out and h.failures == 0
    assert h.failed(unreachable=True) and h.out  # unreachable: out at once
    h.checked = True  # with a health checker, out until its probe is served
    t[0] += 1000
    assert h.out and h.due


def test_a_readmitted_peer_that_fails_again_goes_out_for_twice_as_long():
    """Re-admission (a probe served) keeps the back-off: only real requests served in a row reset it."""
    t = [0.0]
    h = PeerHealth(eject_after=3, backoff_s=5, max_backoff_s=60, recover_after=2, now=lambda: t[0], checked=True)
    assert h.failed(unreachable=True) and h.out_until == 5
    t[0] = 6
    assert h.out and h.due  # back-off over, no probe served yet: still out
    h.probe_served()
    assert not h.out
    assert h.failed() and h.out_until == 6 + 10  # one failure on probation: out again, twice as long
    t[0] = 20
    h.probe_served()
    assert h.failed() and h.out_until == 20 + 20
    t[0] = 50
    h.probe_served()
    h.succeeded()
    assert h.failed() and h.out_until == 50 + 40  # one request served is not yet a recovery
    t[0] = 100
    h.probe_served()
    h.succeeded(), h.succeeded()  # recover_after in a row: the probation ends, the back-off resets
    assert not h.failed() and not h.failed() and h.failed(), "out of probation: eject_after failures again"
    assert h.out_until == 100 + 5


async def _checker_rounds(cl, fail_generate: bool):
    """MD ejected; the checker looks before and after its back-off ends (a fake clock)."""
    pools = cl.pools()
    checker = HealthChecker(pools, interval_s=0.1)
    md = pools[2].peers[0]
    t = [0.0]
    md.health.now = lambda: t[0]
    if fail_generate:  # /health still answers 200: the server runs, it does not serve
        cl.main.behaviour = fu.status(500, "every request fails")
    md.health.failed(unreachable=True)
    async with aiohttp.ClientSession() as s:
        await checker.check_once(s)
        early = (md.health.out, len(cl.main.bodies))
        t[0] = md.health.out_until + 0.1
        await checker.check_once(s)
        out = md.health.out
        again = md.health.failed()  # re-admitted, it fails again: out for twice the back-off
        return early, out, cl.main.bodies, cl.main.aborts, (again, md.health.out_until - t[0])


def test_the_health_checker_takes_a_peer_back_once_its_probe_is_served():
    async def go():
        async with fu.FakeCluster() as cl:
            return await _checker_rounds(cl, fail_generate=False)

    early, still_out, bodies, _, again = run(go())
    assert early == (True, 0)  # within its back-off: not probed, still out
    assert again == (True, 2 * 5.0)
    assert not still_out and len(bodies) == 1
    probe = bodies[0]
    assert probe["input_ids"] == list(health_probe.PROBE_IDS) and probe["stream"] is True
    assert probe["sampling_params"]["max_new_tokens"] == 1
    assert probe["bootstrap_host"] == health_probe.FAKE_BOOTSTRAP_HOST  # PD roles: no real KV transfer


def test_a_peer_that_answers_health_but_fails_every_request_stays_out():
    async def go():
        async with fu.FakeCluster() as cl:
            return await _checker_rounds(cl, fail_generate=True)

    early, still_out, bodies, aborts, _ = run(go())
    assert still_out and len(bodies) == 1  # probed, not served
    assert aborts == [bodies[0]["rid"]]  # the failed probe was let go on the peer


@pytest.mark.parametrize("role", ["prefill", "relay"])
def test_each_role_gets_the_probe_it_can_answer(role):
    """P: a non-streamed reply (as the router asks P), RLD: a stream to its finish."""
    async def go():
        async with fu.FakeCluster() as cl:
            pools = dict(zip(("prefill", "relay", "main"), cl.pools()))
            async with aiohttp.ClientSession() as s:
                problem = await health_probe.probe(s, role, pools[role].peers[0].url, 5.0)
                getattr(cl, role).behaviour = fu.status(503, "down")
                failed = await health_probe.probe(s, role, pools[role].peers[0].url, 5.0)
            return problem, failed, getattr(cl, role).bodies

    problem, failed, bodies = run(go())
    assert problem is None and "down" in failed
    assert bodies[0].get("stream", False) is (role != "prefill")


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
