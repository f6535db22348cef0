"""pdd-never-lose with its elastic relay pool (issue 46, docs/sim.md §9): the pool stays down and the
bill is xdc-pd-drc's where relaying does not pay; on a congested line it comes up after its start-up,
relays, is billed for the time it is up, and leaves when the load is gone."""

import pytest

from sglang_pdd.lab.sim.metrics import Sla
from sglang_pdd.lab.sim.never_lose import never_lose_system
from sglang_pdd.lab.sim.presets import TINY_MODEL, tiny_system, tiny_workload
from sglang_pdd.lab.sim.relay_pool import RelayPoolSpec
from sglang_pdd.lab.sim.runner import run
from sglang_pdd.lab.sim.wan import WanSpec
from sglang_pdd.lab.workload.generator import generate, measured

SLA = Sla(ttft_s=2.0, tpot_s=0.05)
CONGESTED = WanSpec(bandwidth_gbps=0.05, rtt_s=0.02, jitter=0.0)
ROOMY = WanSpec(bandwidth_gbps=1.0, rtt_s=0.02, jitter=0.0)
POOL = RelayPoolSpec(startup_s=3.0, hold_s=4.0, window_s=5.0, tick_s=1.0, max_instances=2)


@pytest.fixture(scope="module")
def reqs():
    return generate(tiny_workload())


def _run(spec, reqs):
    return run(spec, TINY_MODEL, reqs, SLA, tiny_workload().duration_s, drain_s=600.0)


def pooled(wan):
    return never_lose_system(tiny_system("pdd-bw", wan=wan), pool=POOL, ttft_slo_s=SLA.ttft_s)


def test_where_nothing_is_at_risk_the_pool_stays_down_and_it_is_xdc_pd_drc(reqs):
    a, b = _run(pooled(ROOMY), reqs), _run(tiny_system("xdc-pd-drc", wan=ROOMY), reqs)
    assert a.cluster.pool.spells == [] and a.summary.price_per_hour == b.summary.price_per_hour
    assert all(r.pipeline == "P->MD" for r in a.records)
    assert {r.request_id: r.ttft_s for r in a.records} == pytest.approx({r.request_id: r.ttft_s for r in b.records})


def test_on_a_congested_line_the_pool_comes_up_relays_and_is_billed_for_its_time(reqs):
    spec = pooled(CONGESTED)
    res = _run(spec, reqs)
    c, pool = res.cluster, res.cluster.pool
    assert pool.spells and pool.peak >= 1
    first_up = pool.spells[0][0] + POOL.startup_s
    on_pool = [r for r in res.records if r.route_reason.startswith("pool")]
    assert on_pool and min(r.arrival_s for r in on_pool) >= first_up  # nothing relayed on it while it starts
    assert any(c.R[len(c.P) + j].tokens_out > 0 for j in range(POOL.max_instances))
    # everything finishes once and leaves nothing behind; the pool leaves once the load is gone
    assert sorted(r.request_id for r in res.records) == sorted(r.request_id for r in measured(reqs))
    assert all(r.finished for r in res.records) and set(c.finish_count.values()) == {1}
    assert all(d.used == 0 for d in c.D + c.R) and not c.states and not c._pool_of
    assert all(b is not None for _, b in pool.spells) and pool.state == ["down"] * POOL.max_instances
    # the bill: P and MD, plus the instance-hours over the run's span (start-up included)
    start = min(r.arrival_s for r in res.records)
    end = max(r.finish_s for r in res.records)
    up_s = pool.instance_seconds(start, end)
    assert up_s >= POOL.startup_s
    assert res.summary.price_per_hour == pytest.approx(
        spec.price_per_hour + up_s / (end - start) * spec.pool_instance.price_per_hour)
    assert spec.price_per_hour < res.summary.price_per_hour <= spec.price_per_hour + 2 * spec.pool_instance.price_per_hour


def test_the_pool_spec_refuses_nonsense():
    with pytest.raises(ValueError):
        RelayPoolSpec(min_instances=3, max_instances=2)
    with pytest.raises(ValueError):
        RelayPoolSpec(window_s=0.0)
