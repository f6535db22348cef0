"""Decisions of the pipeline, bandwidth and handoff-mode policies (sglang_pdd.policy) on scripted inputs."""

import pytest

from sglang_pdd.policy.bandwidth import BandwidthEstimator
from sglang_pdd.policy.handoff_mode import (HandoffLoad, HandoffMode, HandoffModeConfig,
                                            HandoffModePolicy, HandoffPolicyKind)
from sglang_pdd.policy.pipeline import (Pipeline, PipelinePolicy, PipelinePolicyConfig, RouteBy,
                                      RouteInputs)

KV = 50_000
GBPS = 1e9 / 8


def _policy(bw_gbps=10.0, rtt=0.03, **kw):
    est = BandwidthEstimator(bw_gbps * GBPS, rtt_s=rtt)
    return PipelinePolicy(PipelinePolicyConfig(kv_bytes_per_token=KV, **kw), est, rtt)


def test_high_hit_fits_budget_goes_p_to_md():
    pol = _policy(wan_budget_s=1.0)
    d = pol.decide(RouteInputs(input_len=64_000, md_prefix_hit=63_000, max_output_tokens=1000))
    assert d.pipeline is Pipeline.P_MD
    assert d.missed_bytes == 1000 * KV
    assert d.predicted_wan_s == pytest.approx(1000 * KV / (10 * GBPS) + 0.03)
    assert not d.uses_relay and d.uses_wan and "budget" in d.reason


def test_low_hit_relays_through_rld():
    pol = _policy(wan_budget_s=1.0)
    d = pol.decide(RouteInputs(64_000, 6_400, 1000))
    assert d.pipeline is Pipeline.P_RLD_MD
    assert d.predicted_wan_s > 1.0 and d.uses_relay and d.uses_wan


def test_budget_boundary_is_inclusive_and_rtt_counts():
    rtt = 0.1
    pol = _policy(bw_gbps=8.0, rtt=rtt, wan_budget_s=0.6)
    missed_tokens = int(0.5 * 8 * GBPS / KV)  # exactly 0.5 s of data
    d = pol.decide(RouteInputs(100_000, 100_000 - missed_tokens, 1000))
    assert d.predicted_wan_s == pytest.approx(0.6)
    assert d.pipeline is Pipeline.P_MD
    d2 = pol.decide(RouteInputs(100_000, 100_000 - missed_tokens - 10, 1000))
    assert d2.pipeline is Pipeline.P_RLD_MD


def test_odd_traffic_finishes_on_rld_only_when_decode_beats_wan():
    pol = _policy(wan_budget_s=0.5, rld_tpot_s=0.03, odd_output_threshold=500)
    # 64K missed at 10 Gb/s ~ 2.6 s; 50 tokens * 30 ms = 1.5 s < 2.6 s -> odd
    d = pol.decide(RouteInputs(64_000, 0, 50))
    assert d.pipeline is Pipeline.P_RLD and "odd" in d.reason and not d.uses_wan
    # 400 tokens * 30 ms = 12 s > 2.6 s -> relay, MD takes over
    assert pol.decide(RouteInputs(64_000, 0, 400)).pipeline is Pipeline.P_RLD_MD
    # long output is never odd, however slow the WAN
    slow = _policy(bw_gbps=0.1, wan_budget_s=0.5, rld_tpot_s=0.03)
    assert slow.decide(RouteInputs(64_000, 0, 500)).pipeline is Pipeline.P_RLD_MD


def test_p_to_rld_alone_never_chosen_for_normal_traffic():
    pol = _policy(bw_gbps=1.0, wan_budget_s=0.2)
    for hit in (0, 1000, 32_000, 60_000, 63_999):
        for out in (500, 1000, 4000):
            assert pol.decide(RouteInputs(64_000, hit, out)).pipeline is not Pipeline.P_RLD


def test_relay_only_experiment_flag():
    pol = _policy(wan_budget_s=0.2, allow_relay_only=True, relay_only_below_hit=0.5)
    assert pol.decide(RouteInputs(64_000, 10_000, 1000)).pipeline is Pipeline.P_RLD
    assert pol.decide(RouteInputs(64_000, 40_000, 1000)).pipeline is Pipeline.P_RLD_MD


def test_relay_only_overload_guard():
    pol = _policy(wan_budget_s=0.2, allow_relay_only=True, relay_only_below_hit=0.9,
                  relay_only_max_rld_usage=0.8)
    assert pol.decide(RouteInputs(64_000, 10_000, 1000, rld_kv_usage=0.5)).pipeline is Pipeline.P_RLD
    assert pol.decide(RouteInputs(64_000, 10_000, 1000, rld_kv_usage=0.85)).pipeline is Pipeline.P_RLD_MD


def test_hit_threshold_routing_ignores_bandwidth():
    pol = _policy(bw_gbps=0.01, route_by=RouteBy.HIT_THRESHOLD, hit_threshold=0.95)
    assert pol.decide(RouteInputs(1000, 960, 1000)).pipeline is Pipeline.P_MD
    assert pol.decide(RouteInputs(1000, 940, 1000)).pipeline is Pipeline.P_RLD_MD


def test_bandwidth_estimate_moves_toward_observations_and_changes_routing():
    est = BandwidthEstimator(10 * GBPS, alpha=0.5, rtt_s=0.03)
    pol = PipelinePolicy(PipelinePolicyConfig(kv_bytes_per_token=KV, wan_budget_s=1.0), est, 0.03)
    inp = RouteInputs(64_000, 50_000, 1000)  # 0.7 GB: 0.59 s at 10 Gb/s
    assert pol.decide(inp).pipeline is Pipeline.P_MD
    for _ in range(8):  # transfers now see ~2 Gb/s (congestion)
        est.observe(1e9, 1e9 / (2 * GBPS) + 0.03)
    assert est.bytes_per_s == pytest.approx(2 * GBPS, rel=0.05)
    assert pol.decide(inp).pipeline is Pipeline.P_RLD_MD


def test_bandwidth_estimator_ignores_tiny_and_invalid_transfers():
    est = BandwidthEstimator(5e9, min_bytes=1 << 20)
    est.observe(1000, 0.001)
    est.observe(1e9, 0.0)
    assert est.bytes_per_s == 5e9 and est.observations == 0
    with pytest.raises(ValueError):
        BandwidthEstimator(0.0)


def test_handoff_fixed_modes():
    load = HandoffLoad(rld_running=0, rld_kv_usage=0.0, md_batch_size=100)
    assert HandoffModePolicy(HandoffModeConfig(HandoffPolicyKind.ONE_SHOT)).decide(load).mode is HandoffMode.ONE_SHOT
    assert HandoffModePolicy(HandoffModeConfig(HandoffPolicyKind.CATCH_UP)).decide(load).mode is HandoffMode.CATCH_UP


@pytest.mark.parametrize("load,mode,word", [
    (HandoffLoad(10, 0.9, 100), HandoffMode.ONE_SHOT, "KV usage"),
    (HandoffLoad(60, 0.1, 100), HandoffMode.ONE_SHOT, "running"),
    (HandoffLoad(10, 0.1, 4), HandoffMode.ONE_SHOT, "MD batch"),
    (HandoffLoad(10, 0.1, 100), HandoffMode.CATCH_UP, "room"),
])
def test_adaptive_handoff_follows_load(load, mode, word):
    pol = HandoffModePolicy(HandoffModeConfig(HandoffPolicyKind.ADAPTIVE, rld_busy_running=48,
                                              rld_busy_kv_usage=0.8, md_small_batch=8))
    d = pol.decide(load)
    assert d.mode is mode and word in d.reason


def test_catch_up_stops_when_gap_small():
    pol = HandoffModePolicy(HandoffModeConfig(stop_gap_tokens=2))
    assert pol.catch_up_done(2) and pol.catch_up_done(0) and not pol.catch_up_done(3)


def test_invalid_policy_config_rejected():
    with pytest.raises(ValueError):
        PipelinePolicyConfig(kv_bytes_per_token=0)
