"""pdd-never-lose's decision (docs/sim.md §9): the lane's queue-aware prediction against the simulated
line, and each routing rule of `policy.never_lose` (as the simulator names it: `never_lose_rules`), one
by one. The cluster that routes by them: test_never_lose.py."""

from dataclasses import replace

import pytest

from sglang_pdd.policy.pipeline import Pipeline
from sglang_pdd.lab.sim.engine import EventLoop
from sglang_pdd.lab.sim.lane import LineRateEstimator, shared_finish_s
from sglang_pdd.lab.sim.never_lose_rules import NeverLoseConfig, Observation, decide
from sglang_pdd.lab.sim.wan import WanLink, WanSpec

MB = 1e6
LINE = 100 * MB  # bytes/s


def obs(**kw) -> Observation:
    base = dict(missed_bytes=50 * MB, output_tokens=2000, lane_queued=(), line_bytes_per_s=LINE,
                flow_bytes_per_s=LINE, rtt_s=0.02, p_wait_s=0.0, rld_tpot_s=0.01)
    base.update(kw)
    return Observation(**base)


# ----- the lane: queue-aware prediction against the simulated line -----

def test_shared_finish_matches_the_fairly_shared_line():
    """Two transfers already on the line (30 MB and 200 MB left); a new 80 MB one finishes after
    80 + 30 + 80 MB of line time, as the processor-sharing link computes it."""
    loop = EventLoop()
    link = WanLink(loop, WanSpec(bandwidth_gbps=LINE * 8 / 1e9, rtt_s=0.02, jitter=0.0))
    done = {}
    link.start(30 * MB, lambda tr: None)
    link.start(200 * MB, lambda tr: None)
    predicted = shared_finish_s(80 * MB, link.queued_bytes(), LINE, 0.02)
    link.start(80 * MB, lambda tr: done.setdefault("t", loop.now))
    loop.run()
    assert predicted == pytest.approx(1.9 + 0.02)
    assert done["t"] == pytest.approx(predicted)


def test_queued_bytes_is_what_is_left():
    loop = EventLoop()
    link = WanLink(loop, WanSpec(bandwidth_gbps=LINE * 8 / 1e9, rtt_s=0.0, jitter=0.0))
    link.start(100 * MB, lambda tr: None)
    loop.at(0.25, lambda: None)
    loop.run(until=0.25)
    assert link.queued_bytes() == pytest.approx([75 * MB])


def test_line_rate_estimator_follows_the_lane_counters():
    est = LineRateEstimator(10 * MB, alpha=0.5)
    est.sample(100 * MB, 1.0)  # 100 MB/s while busy
    assert est.bytes_per_s == pytest.approx(55 * MB)
    est.sample(100 * MB + 1, 1.001)  # under min_busy_s: ignored, totals kept for the next one
    assert est.bytes_per_s == pytest.approx(55 * MB)
    est.sample(300 * MB, 2.0)
    assert est.bytes_per_s == pytest.approx(0.5 * 55 * MB + 0.5 * 200 * MB)


# ----- the rules, one by one -----

def test_within_budget_goes_p_md():
    d = decide(NeverLoseConfig(), obs(missed_bytes=50 * MB))  # 0.52 s on an idle line
    assert d.pipeline is Pipeline.P_MD and d.predicted_wan_s == pytest.approx(0.52)


def test_queue_aware_prediction_relays_what_the_idle_line_view_sends():
    """50 MB alone takes 0.52 s; behind 100 MB queued it takes 1.02 s: over the 1 s budget."""
    o = obs(lane_queued=(100 * MB,))
    assert decide(NeverLoseConfig(), o).pipeline is Pipeline.P_RLD_MD
    assert decide(NeverLoseConfig(queue_aware=False), o).pipeline is Pipeline.P_MD


def test_load_aware_prediction_counts_the_transfers_still_to_come():
    """50 MB on an idle line: 0.52 s. On a line busy half the recent time, transfers that start
    meanwhile share it: 0.5 s / (1 - 0.5) + RTT = 1.02 s, over the budget. The larger of that and the
    queue-aware time is the prediction; a line busy all the time is capped at 100x, not infinity."""
    on = NeverLoseConfig(load_aware=True)
    half = obs(missed_bytes=50 * MB, line_busy_fraction=0.5)
    assert decide(on, half).predicted_wan_s == pytest.approx(1.02)
    assert decide(on, half).pipeline is Pipeline.P_RLD_MD
    assert decide(NeverLoseConfig(), half).pipeline is Pipeline.P_MD  # off: as before
    queued = obs(missed_bytes=50 * MB, line_busy_fraction=0.1, lane_queued=(200 * MB,))
    assert decide(on, queued).predicted_wan_s == pytest.approx(1.02)  # the queue ahead dominates
    assert decide(on, obs(missed_bytes=50 * MB, line_busy_fraction=1.0)).predicted_wan_s == pytest.approx(50.02)


def test_no_relay_on_a_busy_p():
    o = obs(missed_bytes=500 * MB, p_wait_s=1.5)
    d = decide(NeverLoseConfig(p_slack_s=1.0), o)
    assert d.pipeline is Pipeline.P_MD and "slack" in d.reason
    assert decide(NeverLoseConfig(slack_admission=False), o).pipeline is Pipeline.P_RLD_MD
    assert decide(NeverLoseConfig(p_slack_s=2.0), o).pipeline is Pipeline.P_RLD_MD


def test_no_relay_where_the_others_would_wait_more_than_the_relay_saves():
    """An idle P at arrival, slowed 1.375x while its relay side decodes. Busy 40 % of the recent time:
    the others' added wait is 0.22x what the relay saves, it relays. Busy 60 %: 1.93x, P->MD. Busy
    80 %: the slowed P could not keep up (110 %), P->MD. A dedicated RLD (slowdown 1) adds no wait; the
    rule can be switched off."""
    from sglang_pdd.policy.never_lose import relay_wait_cost

    assert relay_wait_cost(0.4, 1.375) == pytest.approx(0.4 * (0.55 / 0.45 - 0.4 / 0.6))
    assert relay_wait_cost(0.6, 1.375) == pytest.approx(0.6 * (0.825 / 0.175 - 0.6 / 0.4))
    assert relay_wait_cost(0.8, 1.375) == float("inf") and relay_wait_cost(0.99, 1.0) == 0.0
    assert relay_wait_cost(1.0, 1.0) == 0.0  # a saturated P behind a dedicated RLD: still no added wait
    cfg = NeverLoseConfig(relay_slowdown=1.375)
    assert decide(cfg, obs(missed_bytes=500 * MB, p_busy_fraction=0.4)).pipeline is Pipeline.P_RLD_MD
    d = decide(cfg, obs(missed_bytes=500 * MB, p_busy_fraction=0.6))
    assert d.pipeline is Pipeline.P_MD and "busy 60%" in d.reason and "1.93x" in d.reason
    assert decide(cfg, obs(missed_bytes=500 * MB, p_busy_fraction=0.8)).pipeline is Pipeline.P_MD
    assert decide(NeverLoseConfig(), obs(missed_bytes=500 * MB, p_busy_fraction=0.99)).pipeline is Pipeline.P_RLD_MD
    off = replace(cfg, headroom_admission=False)
    assert decide(off, obs(missed_bytes=500 * MB, p_busy_fraction=0.8)).pipeline is Pipeline.P_RLD_MD


def test_odd_traffic_finishes_on_the_relay():
    d = decide(NeverLoseConfig(), obs(missed_bytes=500 * MB, output_tokens=100))
    assert d.pipeline is Pipeline.P_RLD
    long = decide(NeverLoseConfig(), obs(missed_bytes=500 * MB, output_tokens=100, rld_tpot_s=0.1))
    assert long.pipeline is Pipeline.P_RLD_MD  # decode 10 s > WAN 5 s: not odd


def test_odd_traffic_warms_md_only_when_the_line_has_room():
    cfg = NeverLoseConfig(p_slack_s=10.0)
    room = decide(cfg, obs(missed_bytes=500 * MB, output_tokens=100, lane_queued=(60 * MB,)))
    assert room.pipeline is Pipeline.P_RLD and room.warm_md
    full = decide(cfg, obs(missed_bytes=500 * MB, output_tokens=100, lane_queued=(150 * MB,)))
    assert full.pipeline is Pipeline.P_RLD and not full.warm_md
    off = decide(replace(cfg, warm_md=False), obs(missed_bytes=500 * MB, output_tokens=100))
    assert not off.warm_md


def test_config_refuses_negative_budgets():
    with pytest.raises(ValueError):
        NeverLoseConfig(wan_budget_s=-1.0)
    with pytest.raises(ValueError):
        NeverLoseConfig(relay_slowdown=0.9)  # a relay side does not speed its P up
