"""The router runs the relay placement (issue 46 item 4): its RLDs are the relay pool (in service, free
slots from their load), each placed request is counted by placement and rule, and the pool's scale
signal (the share at risk over a window, the instances it pays for) is on /metrics for an autoscaler."""

from __future__ import annotations

import asyncio
import math

import pytest
from aiohttp.test_utils import TestClient, TestServer

from sglang_pdd.lab.testing import fake_upstream as fu
from sglang_pdd.policy import never_lose
from sglang_pdd.policy.bandwidth import BandwidthEstimator
from sglang_pdd.policy.pipeline import Pipeline, PipelinePolicy, PipelinePolicyConfig, RouteInputs
from sglang_pdd.policy.relay_placement import NO_RELAY_CAPACITY, PoolView
from sglang_pdd.policy.relay_pool_scale import PoolScaleConfig
from sglang_pdd.protocol.reply import ReplyMeta
from sglang_pdd.router.app import RouterApp
from sglang_pdd.router.peers import load_feed
from sglang_pdd.router.peers.placement import Placement
from sglang_pdd.router.peers.pool import Peer, PeerPool
from sglang_pdd.router.peers.relay_pool_signal import RelayPoolSignal
from sglang_pdd.router.request.dispatch import DispatchConfig, Dispatcher
from sglang_pdd.server.metrics import parse_exposition

KV = 16384
SLO = 2.0  # s: at 1 MB/s a 400-token prompt's KV (6.5 MB) takes 6.5 s, over the SLA
SCALE = PoolScaleConfig(instance_price=8, base_price=72, min_instances=0, max_instances=2)


def _policy() -> PipelinePolicy:
    return PipelinePolicy(PipelinePolicyConfig(kv_bytes_per_token=KV, ttft_slo_s=SLO), BandwidthEstimator(1e6), 0.001)


def _gauges(peer: Peer, running: float, usage: float) -> None:
    load_feed.update(peer, f'sglang:num_running_reqs{{a="1"}} {running}\nsglang:token_usage{{a="1"}} {usage}\n')


def test_the_signal_counts_a_window_of_seconds_and_forgets_older_ones():
    s = RelayPoolSignal(SCALE, window_s=10)
    assert s.counts(100.0) == (0, 0) and s.target(100.0, 0, 0.0) == 0  # nothing placed: min_instances
    for t, risk in ((100.2, True), (100.7, False), (105.0, True)):
        s.observe(t, risk)
    assert s.counts(105.5) == (3, 2) and s.target(105.5, 0, 0.0) == 1  # 2/3 at risk pays an instance (11 %)
    assert s.counts(110.5) == (1, 1)  # second 100 left the window; 105 is in it
    assert s.counts(200.0) == (0, 0) and s.target(200.0, 1, 0.0) == 0  # a quiet window: none
    s.observe(200.1, False)
    assert s.counts(200.2) == (1, 0)
    with pytest.raises(ValueError):
        RelayPoolSignal(SCALE, window_s=0)


def test_the_signal_asks_for_one_more_while_the_ones_up_are_busy():
    s = RelayPoolSignal(SCALE, window_s=30)
    for i in range(10):
        s.observe(50.0 + i, True)
    assert s.target(60.0, 1, 0.5) == 1 and s.target(60.0, 1, 0.9) == 2 and s.target(60.0, 2, 0.9) == 2  # max 2


def test_the_relay_pool_is_the_rlds_in_service_and_their_free_slots():
    rlds = [Peer("http://r0:1", token_channel="tcp://r0:2"), Peer("http://r1:1", token_channel="tcp://r1:2")]
    pl = Placement(PeerPool("prefill", [Peer("http://p:1", bootstrap_port=1)]), PeerPool("relay", rlds),
                   PeerPool("main", [Peer("http://md:1")]), _policy(), relay_slots=4)
    assert pl.relay_pool() == PoolView(2, 8) and pl.relay_occupancy() == 0.0
    _gauges(rlds[0], 3, 0.2)
    assert pl.relay_pool() == PoolView(2, 5) and pl.relay_occupancy() == pytest.approx((0.75 + 0) / 2)
    _gauges(rlds[1], 0, 0.95)  # its KV pool nearly full: no free slot, whatever its count
    assert pl.relay_pool() == PoolView(2, 1) and pl.relay_occupancy() == pytest.approx((0.75 + 0.95) / 2)
    rlds[0].health.failed(unreachable=True)  # out of service: not in the pool
    assert pl.relay_pool() == PoolView(1, 0)
    assert pl.policy.relay_pool == pl.relay_pool and pl.policy.p_relays is False  # the policy reads it


def test_a_full_pool_relays_nothing_and_the_decision_says_why():
    rld = Peer("http://r:1", token_channel="tcp://r:2")
    pl = Placement(PeerPool("prefill", [Peer("http://p:1", bootstrap_port=1)]), PeerPool("relay", [rld]),
                   PeerPool("main", [Peer("http://md:1")]), _policy(), relay_slots=2)
    cold = RouteInputs(input_len=400, md_prefix_hit=0, max_output_tokens=1000)
    d = pl.policy.decide(cold)
    assert (d.pipeline, d.placement, d.rule, d.at_risk) == (Pipeline.P_RLD_MD, "pool", never_lose.HIDES_WAN, True)
    warm = RouteInputs(input_len=400, md_prefix_hit=399, max_output_tokens=1000)  # 16 KB: 17 ms over the line
    assert pl.policy.decide(warm).placement == "pool"  # over 2 RTT: a free slot hides even that
    _gauges(rld, 2, 0.1)
    d = pl.policy.decide(cold)
    assert (d.pipeline, d.placement, d.rule, d.at_risk) == (Pipeline.P_MD, "none", NO_RELAY_CAPACITY, True)
    assert "pool full" in d.reason


def test_a_full_pool_relays_on_a_prefill_that_relays():
    """The same full pool, but the chosen P relays (--pdd-relay local, named with its token port): the relay
    goes on P (rule hides-wan on P's never-lose rules), and a P without one sends the request P->MD."""
    rld = Peer("http://r:1", token_channel="tcp://r:2")
    local = Peer("http://p:1", bootstrap_port=1, token_channel="tcp://p:18592")
    plain = Peer("http://q:1", bootstrap_port=1)
    pl = Placement(PeerPool("prefill", [local, plain]), PeerPool("relay", [rld]),
                   PeerPool("main", [Peer("http://md:1")]), _policy(), relay_slots=2)
    _gauges(rld, 2, 0.1)  # full
    cold = RouteInputs(input_len=400, md_prefix_hit=0, max_output_tokens=1000)
    pl.chose_prefill(local)
    d = pl.policy.decide(cold)
    assert (d.pipeline, d.placement) == (Pipeline.P_RLD_MD, "p") and pl.policy.p_relays
    pl.chose_prefill(plain)
    d = pl.policy.decide(cold)
    assert (d.pipeline, d.placement, d.rule) == (Pipeline.P_MD, "none", NO_RELAY_CAPACITY)  # the control


def test_over_http_the_decisions_and_the_scale_signal_are_metrics():
    cfg = DispatchConfig("auto", request_timeout_s=60.0, bandwidth_poll_s=0, load_poll_s=0,
                         idle_timeout_s={r: 30.0 for r in ("prefill", "relay", "main")}, migration_limit=1,
                         health_check_s=0, relay_slots=2, relay_pool_scale=SCALE, relay_pool_window_s=60)
    prompt = list(range(5, 405))  # 400 tokens, none cached on MD
    n = 600  # over the odd-traffic threshold: relayed, it goes P->RLD->MD

    async def go():
        async with fu.FakeCluster() as cl:
            tok = fu.CharTokenizer()
            d = Dispatcher(*cl.pools(), cfg, decode=tok.decode, policy=_policy())
            app = RouterApp(d, tok, "fake", limits=fu.ModelLimits(vocab_size=1024, context_len=1 << 16))
            async with TestClient(TestServer(app.app)) as c:
                before = await (await c.get("/metrics")).text()
                body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": n}}
                first = await (await c.post("/generate", json=body)).json()
                _gauges(d.relay.peers[0], 2, 0.1)  # the RLD full: the pool has no free slot
                second = await (await c.post("/generate", json={**body, "input_ids": prompt[::-1]})).json()
                return before, first, second, await (await c.get("/metrics")).text()

    before, first, second, after = asyncio.run(asyncio.wait_for(go(), 30))
    assert ReplyMeta.of(first["meta_info"]).pipeline == "P->RLD->MD"
    assert ReplyMeta.of(second["meta_info"]).pipeline == "P->MD"
    assert first["output_ids"] == second["output_ids"] == [fu.token(i) for i in range(n)]

    def decisions(text):
        return {(dict(k)["placement"], dict(k)["rule"]): v
                for k, v in parse_exposition(text, "sglang_pdd_router_relay_decisions_total").items() if v}

    assert decisions(before) == {} and decisions(after) == {("pool", never_lose.HIDES_WAN): 1,
                                                           ("none", NO_RELAY_CAPACITY): 1}
    target = parse_exposition(after, "sglang_pdd_router_relay_pool_target")
    share = parse_exposition(after, "sglang_pdd_router_relay_pool_at_risk_share")
    assert list(parse_exposition(before, "sglang_pdd_router_relay_pool_target").values()) == [0.0]
    assert list(share.values()) == [1.0]  # both at risk: the line puts them over the SLA
    assert list(target.values()) == [2.0]  # at risk, and the one RLD up is full: one more


def test_ps_busy_fraction_comes_from_its_idle_counter_and_reaches_the_policy():
    """The headroom rule's input, live: wall time less the scheduler's idle time, averaged (tau 10 s)."""
    p = Peer("http://p:1", bootstrap_port=1)
    pl = Placement(PeerPool("prefill", [p]), PeerPool("relay", [Peer("http://r:1", token_channel="tcp://r:2")]),
                   PeerPool("main", [Peer("http://md:1")]), _policy())
    page = 'sglang:num_running_reqs{{a="1"}} 0\nsglang:scheduler_idle_seconds_total{{a="1"}} {}\n'
    assert load_feed.update(p, page.format(100.0), now_s=1000.0) and p.busy.fraction == 0.0  # the baseline
    for i in range(1, 31):  # 30 s, each second 0.25 s idle: 75 % busy
        load_feed.update(p, page.format(100.0 + 0.25 * i), now_s=1000.0 + i)
    assert p.busy.fraction == pytest.approx(0.75 * (1 - math.exp(-3)), rel=1e-6)
    pl.pick_prefill([1, 2, 3])
    assert pl.policy.prefill_state().busy_fraction == p.busy.fraction
    idle_only = Peer("http://q:1")
    load_feed.update(idle_only, 'sglang:num_running_reqs{a="1"} 0\n', now_s=1.0)  # no counter: no estimate
    assert idle_only.busy.fraction == 0.0
