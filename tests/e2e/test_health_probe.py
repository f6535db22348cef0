"""The router's health probe (`router.peers.probe`) on real sglang roles: P in prefill mode, RLD and
MD in decode mode each serve the one-token generate that carries sglang's fake bootstrap host (a lone
generate cannot make a real KV transfer on a PD server), asked the way the router asks each role (with
the roles' API key, as the router's session sends it); and the health checker takes an ejected role
back through it once its back-off is over, not before. This cluster's roles also spawn sglang's children as a
user's servers do (the other test servers fork them)."""

import asyncio

import aiohttp
import pytest

from sglang_pdd.router.peers import probe as health_probe
from sglang_pdd.router.peers import role_auth
from sglang_pdd.router.peers.health import HealthChecker
from sglang_pdd.router.peers.pool import Peer, PeerPool

from .shared_cluster import KEYED, ROLE_KEY, cluster_for

pytestmark = [pytest.mark.e2e, pytest.mark.shared_cluster(KEYED)]


def session() -> aiohttp.ClientSession:
    """A session that calls the roles as the router's does: with their key (shared_cluster.KEYED)."""
    return aiohttp.ClientSession(headers=role_auth.headers({role_auth.ENV_KEY: ROLE_KEY}))


@pytest.fixture(scope="module")
def pdd(request, shared_clusters, tiny_model):
    return cluster_for(request, shared_clusters, tiny_model)


def test_every_role_serves_the_probe(pdd):
    async def go():
        async with session() as s:
            return {role: await health_probe.probe(s, role, url, 120.0)
                    for role, url in (("prefill", pdd.prefill.url), ("relay", pdd.relay.url), ("main", pdd.main.url))}

    assert asyncio.run(go()) == {"prefill": None, "relay": None, "main": None}


def test_the_checker_takes_an_ejected_role_back_once_its_back_off_is_over(pdd):
    t = [0.0]
    pools = [PeerPool(role, [Peer(url)]) for role, url in
             (("prefill", pdd.prefill.url), ("relay", pdd.relay.url), ("main", pdd.main.url))]
    checker = HealthChecker(pools, probe_timeout_s=120.0)
    for pool in pools:
        pool.peers[0].health.now = lambda: t[0]
        pool.peers[0].health.failed(unreachable=True)

    async def go():
        async with session() as s:
            await checker.check_once(s)
            early = [p.peers[0].health.out for p in pools]
            t[0] = 1000.0
            await checker.check_once(s)
            return early, [p.peers[0].health.out for p in pools]

    early, late = asyncio.run(go())
    assert early == [True, True, True] and late == [False, False, False]


def test_this_clusters_roles_spawn_their_children_as_users_servers_do(pdd, reference_server):
    """The one cluster whose roles start sglang's children the way a user's server does (spawned: every child
    imports sglang and loads the plugin itself), so the path users run stays proven while the other test
    servers fork theirs to start faster (sglang_pdd.lab.compat.fork_children); the session's reference
    server is one of those, and is the control that the two differ."""
    roles = {role: s.child_start_methods() for role, s in (("prefill", pdd.prefill), ("relay", pdd.relay),
                                                            ("main", pdd.main))}
    assert all("spawn" in m and "fork" not in m for m in roles.values()), roles
    assert "fork" in reference_server.child_start_methods() and "spawn" not in reference_server.child_start_methods()
