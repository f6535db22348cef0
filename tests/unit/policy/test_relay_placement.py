"""The relay placement (issue 46): P's spare capacity, the elastic relay pool, or nothing; and the
pool's scale signal."""

import pytest

from sglang_pdd.policy import never_lose
from sglang_pdd.policy.pipelines import Pipeline
from sglang_pdd.policy.relay_placement import Placement, PlacementConfig, PoolView, decide
from sglang_pdd.policy.relay_pool_scale import PoolScaleConfig, PoolScaleInputs, pays_share, target

RATE = 1e6  # bytes/s
CFG = PlacementConfig.for_slo(5.0)  # P's WAN budget 2.5 s; at risk over 5 s; pool budget 2 RTT
UP = PoolView(up=1, free_slots=4)


def obs(wan_s: float, p_wait_s: float = 0.0, output: int = 1000, queued: float = 0.0, busy: float = 0.0):
    """A request whose missed KV takes `wan_s` on the idle line (RTT 10 ms)."""
    return never_lose.Observation(missed_bytes=(wan_s - 0.01) * RATE, output_tokens=output, lane_queued=[queued],
                                  line_bytes_per_s=RATE, flow_bytes_per_s=RATE, rtt_s=0.01, p_wait_s=p_wait_s,
                                  rld_tpot_s=0.01, p_busy_fraction=busy)


def test_the_defaults_come_from_the_ttft_slo():
    assert CFG.rules.wan_budget_s == 2.5 and CFG.ttft_slo_s == 5.0 and CFG.pool_budget(0.03) == pytest.approx(0.06)
    assert PlacementConfig(CFG.rules, pool_budget_s=0.3).pool_budget(0.03) == 0.3
    with pytest.raises(ValueError):
        PlacementConfig(CFG.rules, pool_budget_s=-1.0)


def test_with_the_pool_down_it_decides_as_never_lose():
    for o in (obs(0.5), obs(3.0), obs(3.0, p_wait_s=1.0), obs(3.0, output=10)):
        d, ref = decide(CFG, o, 0.2), never_lose.decide(CFG.rules, o)
        assert d.pipeline is ref.pipeline and d.warm_md == ref.warm_md
        assert d.placement is (Placement.NONE if ref.pipeline is Pipeline.P_MD else Placement.ON_P)
    assert decide(CFG, obs(0.5), 0.2).reason.endswith("pool down")


def test_an_up_pool_with_a_free_slot_takes_what_the_line_would_slow():
    d = decide(CFG, obs(0.5), 0.2, UP)  # 0.5 s: under P's budget, over the pool's
    assert d.placement is Placement.POOL and d.pipeline is Pipeline.P_RLD_MD
    d = decide(CFG, obs(3.0), 0.2, UP)  # P could host it too: the paid-for slot goes first
    assert d.placement is Placement.POOL
    assert decide(CFG, obs(0.015), 0.2, UP).placement is Placement.NONE  # within two RTTs: nothing gained
    full = decide(CFG, obs(0.5), 0.2, PoolView(up=1, free_slots=0))
    assert full.placement is Placement.NONE and full.reason.endswith("pool full")
    assert decide(CFG, obs(3.0), 0.2, PoolView(up=1, free_slots=0)).placement is Placement.ON_P


def test_odd_traffic_finishes_on_the_pool_and_warms_md_only_on_a_near_idle_lane():
    d = decide(CFG, obs(0.5, output=10), 0.2, UP)
    assert d.pipeline is Pipeline.P_RLD and d.warm_md
    d = decide(CFG, obs(0.5, output=10, queued=0.1 * RATE), 0.2, UP)  # 0.1 s queued > 2 RTT
    assert d.pipeline is Pipeline.P_RLD and not d.warm_md
    assert decide(CFG, obs(0.5, output=100), 0.2, UP).pipeline is Pipeline.P_RLD_MD  # decode 1 s > WAN


def test_at_risk_means_the_line_would_make_it_miss():
    assert decide(CFG, obs(4.0), 1.5).at_risk  # 5.5 s, 4 of them on the line
    assert not decide(CFG, obs(4.0), 0.5).at_risk  # 4.5 s: within the SLA
    late = decide(CFG, obs(2.0), 4.0)  # 6 s, but P's queue makes it late: no relay saves it
    assert late.predicted_ttft_s == pytest.approx(6.0) and not late.at_risk


SCALE = PoolScaleConfig(instance_price=8.0, base_price=72.0, max_instances=2)


def scale(share: float, instances: int = 0, occupancy: float = 0.0, n: int = 1000) -> int:
    return target(SCALE, PoolScaleInputs(n, round(share * n), instances, occupancy))


def test_the_pool_comes_up_when_the_requests_at_risk_pay_its_bill():
    assert pays_share(SCALE, 0) == pytest.approx(8 / 72) and pays_share(SCALE, 1) == pytest.approx(8 / 80)
    assert scale(0.0) == 0 and target(SCALE, PoolScaleInputs(0, 0, 1, 0.0)) == 0
    assert scale(0.10) == 0 and scale(0.12) == 1
    assert scale(0.08, instances=1) == 1  # between half and the full share: hold
    assert scale(0.05, instances=1) == 0  # under half: leave (after the caller's hold)
    assert scale(0.12, instances=1, occupancy=0.9) == 2 and scale(0.12, instances=1, occupancy=0.5) == 1
    assert scale(0.5, instances=2, occupancy=1.0) == 2  # at most max_instances
    assert target(PoolScaleConfig(8.0, 72.0, min_instances=1), PoolScaleInputs(10, 0, 0, 0.0)) == 1
    with pytest.raises(ValueError):
        PoolScaleConfig(8.0, 72.0, min_instances=3, max_instances=2)


def test_every_decision_names_its_rule_from_the_fixed_set():
    from sglang_pdd.policy.relay_placement import NO_RELAY_CAPACITY, RULES

    cases = {  # (observation, P's TTFT part, pool, P relays) -> (placement, rule)
        (0.5, 0.0, PoolView(), True): (Placement.NONE, never_lose.WITHIN_BUDGET),
        (3.0, 1.0, PoolView(), True): (Placement.NONE, never_lose.P_QUEUE),
        (3.0, 0.0, PoolView(), True): (Placement.ON_P, never_lose.HIDES_WAN),
        (3.0, 0.0, UP, True): (Placement.POOL, never_lose.HIDES_WAN),
        (3.0, 0.0, PoolView(up=1, free_slots=0), False): (Placement.NONE, NO_RELAY_CAPACITY),
        (3.0, 0.0, PoolView(), False): (Placement.NONE, NO_RELAY_CAPACITY),
    }
    for (wan, p_wait, pool, p_relays), (placement, rule) in cases.items():
        d = decide(CFG, obs(wan, p_wait_s=p_wait), p_wait, pool, p_relays)
        assert (d.placement, d.rule) == (placement, rule), (wan, p_wait, pool, p_relays, d)
        assert d.rule in RULES
    odd = decide(CFG, obs(3.0, output=10), 0.0, UP)
    assert (odd.placement, odd.pipeline, odd.rule) == (Placement.POOL, Pipeline.P_RLD, never_lose.ODD_TRAFFIC)


def test_a_p_that_cannot_relay_sends_what_it_would_have_relayed_p_to_md():
    """The router's P (no relay on P yet): with the pool full or down nothing is relayed; at risk still says
    whether the line puts the request over the SLA (what the pool's scale signal counts)."""
    full = PoolView(up=1, free_slots=0)
    d = decide(CFG, obs(6.0), 0.0, full, p_relays=False)
    assert d.pipeline is Pipeline.P_MD and d.at_risk and "pool full" in d.reason
    assert decide(CFG, obs(6.0), 0.0, full, p_relays=True).placement is Placement.ON_P  # control: P could
    assert decide(CFG, obs(6.0), 0.0, UP, p_relays=False).placement is Placement.POOL
