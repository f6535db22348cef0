"""Deployments locked by default (issue 47 item 4): a router without a role key refuses to start unless
`--insecure-roles`; with a key it asks every role for `GET /model_info` without it, and a role that
answers (an open API) is refused service: no request reaches it, `/ready` says so, the log names the
flags. The fake roles check keys by sglang's own rule (`fake_upstream.FakeRole.api_key`); the controls:
the same cluster with every role keyed serves, and `--insecure-roles` (the check off) serves through
the open role."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from sglang_pdd.lab.testing import fake_upstream as fu
from sglang_pdd.router.api.admission import ModelLimits
from sglang_pdd.router.app import RouterApp
from sglang_pdd.router.peers import role_auth, role_lock
from sglang_pdd.router.peers.pool import Peer, PeerPool
from sglang_pdd.router.request.dispatch import DispatchConfig, Dispatcher

KEY = "role-key-4711"
BODY = {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 4}}
ARGV = ["--prefill", "http://p:1", "--main", "http://m:1", "--tokenizer", "t"]


@pytest.fixture
def keyed(monkeypatch):
    monkeypatch.setenv(role_auth.ENV_KEY, KEY)
    monkeypatch.delenv(role_auth.ENV_KEY_FILE, raising=False)


def _cluster(open_main: bool, main2: bool = False) -> fu.FakeCluster:
    keyed_role = lambda r: fu.FakeRole(r, api_key=KEY)  # noqa: E731
    return fu.FakeCluster(prefill=keyed_role("prefill"), relay=keyed_role("relay"),
                          main=fu.FakeRole("main", api_key=None if open_main else KEY),
                          main2=keyed_role("main") if main2 else None)


async def _serve(cl: fu.FakeCluster, role_lock_s: float = 2.0):
    """(statuses of /ready and of one /generate, /ready's body) through a router in front of `cl`."""
    cfg = DispatchConfig("direct", request_timeout_s=30, bandwidth_poll_s=0, load_poll_s=0, migration_limit=0,
                         idle_timeout_s={r: 30 for r in ("prefill", "relay", "main")}, health_check_s=0,
                         role_lock_s=role_lock_s)
    tok = fu.CharTokenizer()
    d = Dispatcher(*cl.pools(), cfg, decode=lambda ids: tok.decode(ids))
    app = RouterApp(d, tok, "fake", limits=ModelLimits(vocab_size=1024, context_len=1 << 16))
    async with TestClient(TestServer(app.app)) as c:  # the router's start-up checked every role once
        ready = await c.get("/ready")
        gen = await c.post("/generate", json=BODY)
        metrics = await (await c.get("/metrics")).text()
        return ready.status, gen.status, await ready.json(), metrics, d


def test_an_open_role_is_refused_service_and_the_router_is_not_ready(keyed, caplog):
    async def go():
        async with _cluster(open_main=True) as cl:
            return await _serve(cl), cl

    caplog.set_level(logging.ERROR, logger=role_lock.__name__)
    (ready, gen, body, metrics, d), cl = asyncio.run(asyncio.wait_for(go(), 60))
    assert (ready, gen) == (503, 503)
    assert "every main server is refused service" in body["missing"] and body["out"]["main"] == [cl.urls[2]]
    assert cl.main.bodies == [] and cl.prefill.bodies == []  # no request went out: no MD may serve it
    assert d.main.peers[0].health.refused.startswith("answers /model_info without the role key (HTTP 200)")
    assert f'sglang_pdd_router_peer_out_of_service{{peer="{cl.urls[2]}",role="main"}} 1.0' in metrics
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert cl.urls[2] in record.getMessage() and "--api-key" in record.getMessage()
    assert "--insecure-roles" in record.getMessage()


def test_control_every_role_keyed_serves(keyed):
    async def go():
        async with _cluster(open_main=False) as cl:
            return await _serve(cl), cl

    (ready, gen, body, _, d), cl = asyncio.run(asyncio.wait_for(go(), 60))
    assert (ready, gen) == (200, 200) and len(cl.main.bodies) == 1
    assert not any(p.health.refused for pool in (d.prefill, d.relay, d.main) for p in pool.peers)


def test_control_without_the_check_the_open_role_serves(keyed):
    """role_lock_s 0 (the router's --insecure-roles): the same open MD serves, so the check is what refused it."""
    async def go():
        async with _cluster(open_main=True) as cl:
            return await _serve(cl, role_lock_s=0), cl

    (ready, gen, *_), cl = asyncio.run(asyncio.wait_for(go(), 60))
    assert (ready, gen) == (200, 200) and len(cl.main.bodies) == 1


def test_an_open_replica_gets_nothing_even_when_every_other_is_out(keyed):
    """Two MDs, one open: requests go to the keyed one; with it ejected, the fallback that tries a peer out
    of service (`PeerPool.healthy`) still never picks the open one."""
    async def go():
        async with _cluster(open_main=True, main2=True) as cl:
            ready, gen, _, _, d = await _serve(cl)
            d.main.peers[1].health.failed(unreachable=True)  # the keyed MD out: every MD is out now
            return ready, gen, [p.url for p in d.main.healthy()], cl

    ready, gen, healthy, cl = asyncio.run(asyncio.wait_for(go(), 60))
    assert (ready, gen) == (200, 200)
    assert cl.main.bodies == [] and len(cl.main2.bodies) == 1
    assert healthy == [cl.urls[3]]  # the ejected keyed MD still gets a try, the open one never


def test_a_role_is_checked_when_it_first_answers_and_again_later():
    """Not up: not known and still in service; open: refused; keyed again: back in service; locked: asked
    again only after recheck_s (a role restarted without its key is found then)."""
    clock = [0.0]

    async def go():
        role = fu.FakeRole("main", api_key=KEY)
        server = TestServer(role.app())
        role.api_key = None  # open at first
        peer = Peer("http://127.0.0.1:1")  # nothing listens there yet
        lock = role_lock.RoleLock([PeerPool("main", [peer])], interval_s=2.0, recheck_s=60.0, now=lambda: clock[0])
        seen = []
        async with aiohttp.ClientSession() as s:
            await lock.check_once(s)
            seen.append((lock.state.get(peer.url), peer.health.out))
            await server.start_server()
            peer.url = str(server.make_url("")).rstrip("/")
            clock[0] += 2
            await lock.check_once(s)  # up, and open
            seen.append((lock.state[peer.url], peer.health.out))
            role.api_key = KEY
            clock[0] += 2
            await lock.check_once(s)
            seen.append((lock.state[peer.url], peer.health.out))
            role.api_key = None  # restarted without its key
            clock[0] += 30
            await lock.check_once(s)  # not due yet
            seen.append((lock.state[peer.url], peer.health.out))
            clock[0] += 30
            await lock.check_once(s)
            seen.append((lock.state[peer.url], peer.health.out))
        await server.close()
        return seen

    assert asyncio.run(asyncio.wait_for(go(), 30)) == [
        (None, False), ("open", True), ("locked", False), ("locked", False), ("open", True)]


@pytest.mark.parametrize("status, want", [(401, "locked"), (403, "locked"), (200, "open"), (404, "open"),
                                          (307, "open"), (500, None), (502, None)])
def test_what_an_answer_says(status, want):
    assert role_lock.verdict(status) == want


def test_the_router_refuses_to_start_without_a_role_key(monkeypatch):
    from sglang_pdd.router.__main__ import main

    monkeypatch.delenv(role_auth.ENV_KEY, raising=False)
    monkeypatch.delenv(role_auth.ENV_KEY_FILE, raising=False)
    with pytest.raises(SystemExit) as e:
        main(ARGV)
    assert "no role key" in str(e.value) and "--insecure-roles" in str(e.value)
    assert role_auth.ENV_KEY in str(e.value) and "--api-key" in str(e.value)

    class PastTheKeyCheck(Exception):
        pass

    def tokenizer(*_a, **_k):
        raise PastTheKeyCheck

    import transformers

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", tokenizer)
    with pytest.raises(PastTheKeyCheck):  # the controls: --insecure-roles, or a key, start
        main(ARGV + ["--insecure-roles"])
    monkeypatch.setenv(role_auth.ENV_KEY, KEY)
    with pytest.raises(PastTheKeyCheck):
        main(ARGV)


def test_readiness_every_server_of_a_role_refused_is_not_ready_one_of_two_is():
    from sglang_pdd.router.peers.readiness import readiness

    def pools(refused_relays: int):
        p, m = PeerPool("prefill", [Peer("http://p")]), PeerPool("main", [Peer("http://m")])
        r = PeerPool("relay", [Peer("http://r0"), Peer("http://r1")])
        for peer in r.peers[:refused_relays]:
            peer.health.refused = "answers /model_info without the role key (HTTP 200)"
        return p, r, m

    r = readiness(*pools(2), migration_limit=1)
    assert not r.ready and r.pipelines == [] and "every relay server is refused service" in r.missing
    assert r.out["relay"] == ["http://r0", "http://r1"]
    r = readiness(*pools(1), migration_limit=1)  # the control: the other relay serves
    assert r.ready and r.out["relay"] == ["http://r0"] and "P->RLD->MD" in r.pipelines
