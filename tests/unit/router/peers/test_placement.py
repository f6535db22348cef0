"""A new request while every MD is out of service goes P->RLD at once (issue 35): the pipeline policy
sees the router's peer health (`Placement.in_service`), so RLD serves it alone and no MD is tried;
once an MD is back in service the normal choice resumes. The policy and placement alone, then over
the router's HTTP front with fake roles."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from aiohttp.test_utils import TestClient, TestServer

from sglang_pdd.lab.testing import fake_upstream as fu
from sglang_pdd.server.metrics import parse_exposition
from sglang_pdd.policy.bandwidth import BandwidthEstimator
from sglang_pdd.policy.pipeline import NO_MAIN, InService, Pipeline, PipelinePolicy, PipelinePolicyConfig, RouteInputs
from sglang_pdd.protocol.reply import ReplyMeta
from sglang_pdd.router.app import RouterApp
from sglang_pdd.router.request.dispatch import DispatchConfig, Dispatcher
from sglang_pdd.router.peers.pool import Peer, PeerPool
from sglang_pdd.router.peers.placement import Placement

KV = 16384
FAST = PipelinePolicyConfig(kv_bytes_per_token=KV)  # 1 GB/s below: every prompt here fits P->MD's budget


def _policy() -> PipelinePolicy:
    return PipelinePolicy(FAST, BandwidthEstimator(1e9), 0.001)


def _placement(mains: int = 2) -> Placement:
    return Placement(PeerPool("prefill", [Peer("http://p:1", bootstrap_port=1)]),
                     PeerPool("relay", [Peer("http://r:1", token_channel="tcp://r:2")]),
                     PeerPool("main", [Peer(f"http://md{i}:1") for i in range(mains)]), _policy())


def _out(*peers: Peer) -> None:
    for p in peers:
        p.health.failed(unreachable=True)


def test_every_md_out_sends_the_request_to_the_relay_alone_and_one_back_ends_it():
    pl = _placement()
    inp = RouteInputs(input_len=400, md_prefix_hit=0, max_output_tokens=1000)
    assert pl.policy.decide(inp).pipeline is Pipeline.P_MD  # the control: every MD in service
    _out(pl.main.peers[0])
    assert pl.policy.decide(inp).pipeline is Pipeline.P_MD  # one MD left in service: the normal choice
    _out(pl.main.peers[1])
    d = pl.policy.decide(inp)
    assert (d.pipeline, d.reason) == (Pipeline.P_RLD, NO_MAIN) and not d.uses_wan
    assert d.missed_bytes == 400 * KV  # still reported: what P->MD would have sent over the WAN
    pl.main.peers[1].health.probe_served()  # the health checker's probe was served: back in service
    assert pl.policy.decide(inp).pipeline is Pipeline.P_MD


@pytest.mark.parametrize("also_out", ["relay", "prefill"])
def test_without_a_relay_or_a_prefill_in_service_the_choice_is_the_normal_one(also_out):
    pl = _placement(mains=1)
    _out(pl.main.peers[0], getattr(pl, also_out).peers[0])
    assert pl.in_service() == InService(prefill=also_out != "prefill", relay=also_out != "relay", main=False)
    assert pl.policy.decide(RouteInputs(400, 0, 1000)).pipeline is Pipeline.P_MD


def test_a_policy_outside_a_router_sees_every_role_in_service():
    """The simulator's policy has no placement: its roles are always in service."""
    assert _policy().in_service() == InService() and not InService().relay_alone


@contextlib.asynccontextmanager
async def _auto_router(cl: fu.FakeCluster):
    """A real Dispatcher (--pipeline auto, with the pipeline policy) and RouterApp before `cl`."""
    cfg = DispatchConfig("auto", request_timeout_s=60.0, bandwidth_poll_s=0, load_poll_s=0,
                         idle_timeout_s={r: 30.0 for r in ("prefill", "relay", "main")},
                         migration_limit=1, health_check_s=0)
    tok = fu.CharTokenizer()
    d = Dispatcher(*cl.pools(), cfg, decode=tok.decode, policy=_policy())
    app = RouterApp(d, tok, "fake", limits=fu.ModelLimits(vocab_size=1024, context_len=1 << 16))
    async with TestClient(TestServer(app.app)) as client:
        yield client, d


def test_over_http_a_request_with_every_md_out_goes_p_rld_and_no_md_is_tried():
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 12}}
    cold = {"input_ids": [8, 9, 10, 11], "sampling_params": {"max_new_tokens": 12}}

    async def go():
        async with fu.FakeCluster(relay=fu.FakeRole("relay", handoff_tokens=0)) as cl:
            async with _auto_router(cl) as (c, d):
                md = d.main.peers[0]
                outs = [await (await c.post("/generate", json=body)).json()]  # the control: MD in service
                md.health.failed(unreachable=True)  # every MD out (a WAN cut took it out)
                outs.append(await (await c.post("/generate", json=cold)).json())  # none of it cached on MD
                md_calls_while_out = len(cl.main.bodies) - 1
                md.health.probe_served()  # back in service
                outs.append(await (await c.post("/generate", json=body)).json())
                metrics = await (await c.get("/metrics")).text()
                return outs, md_calls_while_out, len(cl.main.bodies), len(cl.relay.bodies), metrics

    outs, md_while_out, md_calls, relay_calls, metrics = asyncio.run(asyncio.wait_for(go(), 30))
    metas = [ReplyMeta.of(o["meta_info"]) for o in outs]
    assert [m.pipeline for m in metas] == ["P->MD", "P->RLD", "P->MD"]
    assert all(o["output_ids"] == [fu.token(i) for i in range(12)] for o in outs)  # the fakes' output
    out_meta = metas[1]
    assert out_meta.reason == NO_MAIN and out_meta.migrations == 0 and out_meta.handoff_tokens is None
    assert md_while_out == 0 and md_calls == 2 and relay_calls == 1  # RLD alone served it, MD never asked
    avoided = {dict(k)["reason"]: v
               for k, v in parse_exposition(metrics, "sglang_pdd_router_wan_bytes_avoided_total").items()}
    assert avoided == {"no-main": 4 * KV}  # why P->RLD: the label says


def test_the_policy_reads_the_p_just_picked_and_its_queue():
    from sglang_pdd.router.peers import load_feed

    pl = _placement()
    assert pl.policy.prefill_state() is None
    p = pl.pick_prefill([1, 2, 3])
    load_feed.update(p, 'sglang:num_running_reqs{a="1"} 1\nsglang:num_queue_reqs{a="1"} 2\n'
                        'sglang:token_usage{a="1"} 0.5\n')
    st = pl.policy.prefill_state()
    assert st.url == "http://p:1" and st.waiting == 2 and p.running == 3
    assert pl.policy.links.wan_hosts == {"md0", "md1"}  # plain PD to them crosses the WAN (the feed reads it)
    pl = Placement(PeerPool("prefill", [Peer("http://h:1", bootstrap_port=1)]),
                   PeerPool("relay", [Peer("http://r:1", token_channel="tcp://r:2")]),
                   PeerPool("main", [Peer("http://h:2"), Peer("http://m:3")]), _policy())
    assert pl.policy.links.wan_hosts == {"m"}  # an MD on P's host: its plain PD may be the LAN
