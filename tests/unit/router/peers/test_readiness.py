"""Liveness and readiness (issue 35 item 1): `/live` answers while the process serves, whatever its peers;
`/ready` answers 200 while some pipeline can serve a request, RLD alone included, so a WAN cut that takes
every MD out leaves the router ready and its streams going on (on P->RLD alone), while `/health` (every
role in service) says 503; with P out `/ready` is 503 and says what is missing. Both probes need no API
key and are not counted in flight. Over the router's HTTP front with fake roles."""

from __future__ import annotations

import asyncio
import json
import types

import pytest

from sglang_pdd.lab.testing import fake_upstream as fu
from sglang_pdd.protocol.reply import ReplyMeta
from sglang_pdd.router.peers.pool import Peer, PeerPool
from sglang_pdd.router.peers.readiness import readiness
from tests.unit.router.kit.fixed_model import PROMPT, final_reply, model, reference, run
from tests.unit.router.kit.front_door import (HoldingDispatcher, connect, metrics_text, refused, request, response,
                                              served, until)


async def _probe(c, path: str) -> tuple[int, dict]:
    r = await c.get(path)
    return r.status, await r.json()


def _pool(role: str, *out: bool) -> PeerPool:
    peers = [Peer(f"http://{role}{i}:1") for i in range(len(out))]
    for p, o in zip(peers, out):
        if o:
            p.health.failed(unreachable=True)
    return PeerPool(role, peers)


@pytest.mark.parametrize("p_out, rld_out, md_out, limit, mode, ready, pipelines", [
    (False, False, False, 1, "direct", True, ["P->MD", "P->RLD->MD", "P->RLD"]),
    (False, False, True, 1, "direct", True, ["P->RLD"]),  # every MD out (a WAN cut): RLD alone serves
    (False, False, True, 0, "direct", False, []),  # ... under direct only through a migration, which 0 forbids
    (False, False, True, 0, "auto", True, ["P->RLD"]),  # ... under auto a new request goes P->RLD at once
    (False, False, True, 0, "relay", True, ["P->RLD"]),
    (False, True, True, 1, "auto", False, []),  # no MD and no RLD
    (False, True, False, 0, "direct", True, ["P->MD"]),
    (True, False, False, 1, "auto", False, []),  # no P: nothing serves
])
def test_readiness_is_some_pipeline_open(p_out, rld_out, md_out, limit, mode, ready, pipelines):
    r = readiness(_pool("prefill", p_out), _pool("relay", rld_out), _pool("main", md_out, md_out), limit, mode)
    assert (r.ready, r.pipelines) == (ready, pipelines)
    assert (r.body()["status"], "missing" in r.body()) == (("ready", False) if ready else ("not ready", True))


def test_without_relays_every_md_out_is_not_ready():
    r = readiness(_pool("prefill", False), _pool("relay"), _pool("main", True), 1)
    assert not r.ready and "no relay" in r.missing and r.out == {"prefill": [], "main": ["http://main0:1"]}


@pytest.mark.parametrize("limit", [1, 0])  # 0: the control, RLD alone never serves
def test_the_router_stays_ready_and_streams_go_on_through_a_wan_cut(limit):
    async def go():
        async with fu.FakeCluster() as cl:
            cl.main.behaviour = model(fail_at=3)  # the WAN goes: MD's stream is cut after 3 tokens
            cl.relay.behaviour = model()
            async with fu.router_client(cl, migration_limit=limit) as c:
                before = await _probe(c, "/ready")
                r = await c.post("/generate", json={"input_ids": PROMPT, "stream": True,
                                                    "sampling_params": {"max_new_tokens": 10}})
                streamed = (r.status, await r.text())
                await cl.servers[2].close()  # ... and MD stays unreachable: the router takes it out
                await c.post("/generate", json={"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4}})
                return (before, streamed, await _probe(c, "/ready"), await _probe(c, "/live"),
                        await _probe(c, "/health"), cl)

    before, (status, text), ready, live, health, cl = run(go())
    assert before[0] == 200 and before[1]["pipelines"] == ["P->MD", "P->RLD->MD", "P->RLD"]
    assert live == (200, {"status": "live"})
    assert health[0] == 503 and health[1]["down"] == ["main"]  # /health: every role in service, stricter
    assert ready[1]["out"] == {"main": [cl.url(2)]}
    if limit:
        assert status == 200
        out = final_reply(text, stream=True)
        assert out["output_ids"] == reference(10)  # the stream in flight went on, no gap, no duplicate
        assert ReplyMeta.of(out["meta_info"]).migration_pipelines == ["P->RLD"]
        assert ready[0] == 200 and ready[1]["pipelines"] == ["P->RLD"] and "missing" not in ready[1]
    else:
        assert "error" in text
        assert ready[0] == 503 and "--migration-limit 0" in ready[1]["missing"]


def test_with_prefill_out_the_router_is_live_but_not_ready():
    async def go():
        async with fu.FakeCluster() as cl:
            async with fu.router_client(cl, migration_limit=1) as c:
                before = await _probe(c, "/ready")
                # MD waits for P's KV, as a real decode does (the fake would answer at once, and a request it
                # finished before P's refusal reached the router was a 200: a race in the fake, seen in CI)
                cl.main.behaviour = fu.hang()
                await cl.servers[0].close()  # P is gone: the request that finds it takes it out
                failed = (await c.post("/generate", json={"input_ids": PROMPT,
                                                          "sampling_params": {"max_new_tokens": 4}})).status
                return before, failed, await _probe(c, "/ready"), await _probe(c, "/live"), cl

    before, failed, ready, live, cl = run(go())
    assert before[0] == 200  # the control: the same router with P in service
    assert failed >= 500
    assert ready[0] == 503 and ready[1]["status"] == "not ready" and ready[1]["pipelines"] == []
    assert ready[1]["missing"] == "no prefill server in service" and ready[1]["out"] == {"prefill": [cl.url(0)]}
    assert live[0] == 200


class _ReadyHolding(HoldingDispatcher):
    prefill, relay, main = _pool("prefill", False), _pool("relay", False), _pool("main", False)
    cfg = types.SimpleNamespace(migration_limit=1, pipeline="auto")


def test_probes_need_no_key_and_get_through_a_full_router():
    async def go():
        d = _ReadyHolding()
        async with served(d, max_in_flight=1, app_kw={"api_keys": ("k",)}) as (app, port):
            gen = json.dumps({"text": "ab", "sampling_params": {"max_new_tokens": 2}}).encode()
            held = await connect(port, request("POST", "/generate", gen, {"Authorization": "Bearer k"}))
            await until(lambda: d.started == 1, "the one request allowed held")
            out = {}
            for path in ("/live", "/ready", "/v1/models"):  # /v1/models: the control, it needs a key
                r, w = await connect(port, request("GET", path))
                out[path] = (await response(r))[0]
                w.close()
            r, w = await connect(port, request("GET", "/v1/models", b"", {"Authorization": "Bearer k"}))
            out["full"] = (await response(r))[0]  # the control: a counted request finds the router full
            w.close()
            d.release.set()
            await response(held[0])
            held[1].close()
            return out, refused(await metrics_text(port))

    out, counts = asyncio.run(asyncio.wait_for(go(), 30))
    assert out == {"/live": 200, "/ready": 200, "/v1/models": 401, "full": 503}
    assert counts["auth"] == 1 and counts["in-flight"] == 1
