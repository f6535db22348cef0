"""The serving policy's queue-aware WAN prediction and its TTFT-SLA (never-lose) decision."""

import math

import pytest

from sglang_pdd.policy import never_lose
from sglang_pdd.policy.bandwidth import BandwidthEstimator
from sglang_pdd.policy.pipeline import Pipeline, PipelinePolicy, PipelinePolicyConfig, PrefillState, RouteInputs
from sglang_pdd.policy.site_links import SiteLinks
from sglang_pdd.policy.wan_queue import finish_s

KVB = 1000  # bytes per token
RATE = 1e6  # bytes/s: 1000 tokens a second


def policy(slo: float = 0.0, budget: float = 0.5, state: PrefillState | None = PrefillState("http://p:1")):
    bw = BandwidthEstimator(RATE, rtt_s=0.0)
    pol = PipelinePolicy(PipelinePolicyConfig(kv_bytes_per_token=KVB, wan_budget_s=budget, odd_output_threshold=0,
                                              ttft_slo_s=slo), bw, rtt_s=0.0)
    pol.prefill_state = lambda: state
    return pol


def near_miss():  # 600 missed tokens: 0.6 s on an idle line
    return RouteInputs(input_len=2000, md_prefix_hit=1400, max_output_tokens=64)


def test_fifo_waits_for_everything_queued_fair_share_only_for_its_own_size():
    assert finish_s(100, [50, 300], 10.0, 1.0, fifo=True) == pytest.approx((100 + 350) / 10 + 1)
    assert finish_s(100, [50, 300], 10.0, 1.0, fifo=False) == pytest.approx((100 + 150) / 10 + 1)
    with pytest.raises(ValueError):
        finish_s(1, [], 0.0, 0.0)


def test_the_prediction_adds_what_the_chosen_p_lane_holds_for_the_site():
    pol = policy()
    assert pol.predict_wan_s(600 * KVB, "", "http://p:1") == pytest.approx(0.6)
    pol.links.default.observe_queue("http://p:1", 2e6)  # P's page: 2 MB queued to the default site
    assert pol.predict_wan_s(600 * KVB, "", "http://p:1") == pytest.approx(2.6)
    assert pol.predict_wan_s(600 * KVB, "", "http://other:1") == pytest.approx(0.6)  # another P's lane is empty
    assert pol.predict_wan_s(600 * KVB) == pytest.approx(0.6)  # no P known: the idle-line view


def test_a_near_miss_behind_a_queue_relays_on_an_idle_p():
    pol = policy(slo=2.0)
    assert pol.decide(near_miss()).pipeline is Pipeline.P_MD  # 0.6 s <= 1 s (half the SLA)
    pol.links.default.observe_queue("http://p:1", 1e6)
    d = pol.decide(near_miss())
    assert d.pipeline is Pipeline.P_RLD_MD and d.predicted_wan_s == pytest.approx(1.6)
    assert "budget 1.0s" in d.reason


def test_a_busy_p_does_not_relay():
    pol = policy(slo=2.0, state=PrefillState("http://p:1", waiting=1))
    pol.links.default.observe_queue("http://p:1", 1e6)
    d = pol.decide(near_miss())
    assert d.pipeline is Pipeline.P_MD and "no relay" in d.reason


def test_without_an_slo_the_budget_flag_decides_and_no_slack_rule():
    pol = policy(slo=0.0, budget=0.5, state=PrefillState("http://p:1", waiting=3))
    assert pol.decide(near_miss()).pipeline is Pipeline.P_RLD_MD  # 0.6 s > 0.5 s, P busy or not
    pol = policy(slo=2.0, budget=0.5)
    assert pol.decide(near_miss()).pipeline is Pipeline.P_MD  # the SLA's half (1 s) replaces the flag


def test_what_the_router_sent_through_p_queues_until_the_line_drained_it():
    pol = policy(slo=2.0)
    link, now = pol.links.default, [0.0]
    link.clock = lambda: now[0]
    assert pol.decide(near_miss()).pipeline is Pipeline.P_MD  # 0.6 s; now on its way through P
    assert link.queued_bytes("http://p:1") == 600 * KVB
    assert pol.decide(near_miss()).pipeline is Pipeline.P_RLD_MD  # behind it: 1.2 s
    assert link.queued_bytes("http://p:1") == 2 * 600 * KVB  # the relayed request's main leg queues too
    now[0] = 0.6  # half of it drained at the estimated rate
    assert link.queued_bytes("http://p:1") == pytest.approx(600 * KVB)
    now[0] = 1.2
    assert link.queued_bytes("http://p:1") == 0
    assert pol.decide(near_miss()).pipeline is Pipeline.P_MD
    link.observe_queue("http://p:1", 5e6)  # P's gauge says more is queued than the router's record: it wins
    assert link.queued_bytes("http://p:1") == 5e6


def test_links_per_site_keep_their_own_queues():
    bw = BandwidthEstimator(RATE)
    links = SiteLinks.single(bw, 0.0)
    links.add("b", RATE, 0.0)
    links.of("b").observe_queue("p", 5e6)
    assert links.of("").queued_bytes("p") == 0 and links.of("b").queued_bytes("p") == 5e6


def test_the_simulator_runs_the_same_decision():
    from sglang_pdd.lab.sim import never_lose_rules

    assert never_lose_rules.decide is never_lose.decide
    obs = never_lose.Observation(600e3, 64, [1e6], RATE, RATE, 0.0, 0.0, 0.05)
    assert never_lose.predict_wan_s(never_lose.NeverLoseConfig(), obs) == pytest.approx(1.2)  # fair share
    fifo = never_lose.Observation(600e3, 64, [1e6], RATE, RATE, 0.0, math.inf, 0.05, fifo=True)
    d = never_lose.decide(never_lose.NeverLoseConfig(wan_budget_s=1.0), fifo)
    assert d.predicted_wan_s == pytest.approx(1.6) and d.pipeline is Pipeline.P_MD  # busy P: no relay


def test_a_negative_slo_is_refused():
    with pytest.raises(ValueError):
        PipelinePolicyConfig(kv_bytes_per_token=1, ttft_slo_s=-1)
