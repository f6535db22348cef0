"""The RLD variants without a dedicated pool: elastic (a P switches role) and co-located on P."""

import pytest

from sglang_pdd.lab.workload.generator import generate, measured
from sglang_pdd.lab.sim.colocated_relay import SharedPrefillCost, colocated_system
from sglang_pdd.lab.sim.cost_model import Chunk, CostModel
from sglang_pdd.lab.sim.decode import DecodeInstance
from sglang_pdd.lab.sim.elastic_relay import ElasticCluster, elastic_system
from sglang_pdd.lab.sim.engine import EventLoop
from sglang_pdd.lab.sim.hardware import Efficiency, InstanceSpec
from sglang_pdd.lab.sim.metrics import Sla
from sglang_pdd.lab.sim.presets import CPU_A, TINY_MODEL, tiny_system, tiny_workload
from sglang_pdd.lab.sim.relay_regimes import REGIMES, relay_systems
from sglang_pdd.lab.sim.runner import run
from sglang_pdd.lab.sim.wan import WanSpec

SLA = Sla(ttft_s=2.0, tpot_s=0.05)
CONGESTED = WanSpec(bandwidth_gbps=0.05, rtt_s=0.02, jitter=0.0)
ROOMY = WanSpec(bandwidth_gbps=1.0, rtt_s=0.02, jitter=0.0)


@pytest.fixture(scope="module")
def reqs():
    return generate(tiny_workload())


def _run(spec, reqs):
    return run(spec, TINY_MODEL, reqs, SLA, tiny_workload().duration_s, drain_s=600.0)


def _bcr(res, spec):
    return res.summary.sla_rps / spec.price_per_hour


def test_variants_bill_p_and_md_only():
    bw = tiny_system("pdd-bw", wan=ROOMY)
    drc = tiny_system("xdc-pd-drc", wan=ROOMY)
    for sp in (elastic_system(bw), colocated_system(bw)):
        assert sp.price_per_hour == drc.price_per_hour < bw.price_per_hour
        assert sp.chips_label() == drc.chips_label()


def test_elastic_on_a_roomy_line_is_xdc_pd_drc(reqs):
    """Nothing relayed: no switch, and every request's TTFT is cross-DC PD's."""
    el = elastic_system(tiny_system("pdd-bw", wan=ROOMY))
    a, b = _run(el, reqs), _run(tiny_system("xdc-pd-drc", wan=ROOMY), reqs)
    assert a.cluster.switches == 0 and a.cluster.off_p_share(100.0) == 0.0
    assert all(r.pipeline == "P->MD" for r in a.records)
    ta = {r.request_id: r.ttft_s for r in a.records}
    assert ta == pytest.approx({r.request_id: r.ttft_s for r in b.records})
    assert _bcr(a, el) == pytest.approx(_bcr(b, tiny_system("xdc-pd-drc", wan=ROOMY)))


@pytest.mark.parametrize("make", [elastic_system, colocated_system])
def test_every_request_finishes_once_and_nothing_leaks(make, reqs):
    res = _run(make(tiny_system("pdd-bw", wan=CONGESTED)), reqs)
    c = res.cluster
    assert sorted(r.request_id for r in res.records) == sorted(r.request_id for r in measured(reqs))
    assert all(r.finished for r in res.records) and set(c.finish_count.values()) == {1}
    assert any(r.pipeline == "P->RLD->MD" for r in res.records)
    for r in res.records:
        assert r.tokens_rld + r.tokens_md == r.output_len
    assert not c.states and not c._tails and not c._orphans
    for inst in c.D + c.R:
        assert inst.used == 0 and not inst.reserved and not inst.running and not inst.waiting
    for p in c.P:
        assert p.used == 0 and not p.queue


def test_elastic_host_leaves_the_p_role_while_relaying(reqs):
    res = _run(elastic_system(tiny_system("pdd-bw", wan=CONGESTED)), reqs)
    c = res.cluster
    assert c.switches >= 1 and c.fallbacks >= 1  # the first relayed routes went P->MD
    assert 0.0 < c.off_p_share(c.loop.now) <= 1.0


def test_elastic_host_takes_no_prefill_out_of_the_p_role(reqs):
    spec = elastic_system(tiny_system("pdd-bw", wan=CONGESTED))
    c = ElasticCluster(spec, TINY_MODEL, Efficiency(), context_tokens=2000, tpot_target_s=0.04)
    picks, pick = [], c._pick_p
    c._pick_p = lambda: picks.append((c.role, pick())) or picks[-1][1]
    c.run(reqs)
    assert any(role != "P" for role, _ in picks)
    assert all(p != c.host for role, p in picks if role != "P")


def test_colocated_relaying_takes_its_share_of_prefill():
    cost = CostModel(TINY_MODEL, InstanceSpec(CPU_A, 1))
    loop = EventLoop()
    relay = DecodeInstance(loop, cost, "R0", 4)
    spec = colocated_system(tiny_system("pdd-bw"), share=0.25, interference=0.0)
    shared = SharedPrefillCost(cost, relay, spec.prefill_factor)
    chunks = [Chunk(1024, 0)]
    assert shared.prefill_step_s(chunks) == cost.prefill_step_s(chunks)  # idle decode: free
    relay.admit("r", 10, lambda k: None)
    relay.join("r", 10, 100, lambda k: None)
    # throughput while relaying = (1 - share) of the P's
    assert cost.prefill_step_s(chunks) / shared.prefill_step_s(chunks) == pytest.approx(0.75)
    with_noise = colocated_system(tiny_system("pdd-bw"), share=0.25, interference=0.1)
    assert with_noise.prefill_factor == pytest.approx(1.1 / 0.75)


def test_colocated_memory_split_is_static(reqs):
    bw = tiny_system("pdd-bw", wan=ROOMY)
    base = _run(bw, reqs).cluster
    c = _run(colocated_system(bw, share=0.25), reqs).cluster
    for p0, p, r in zip(base.P, c.P, c.R):
        assert r.capacity == int(p0.capacity * 0.25) and p.capacity == p0.capacity - r.capacity


def test_bcr_ordering_on_a_congested_line(reqs):
    """Relaying rescues the TTFT tail cross-DC PD misses; without a pool's bill the elastic
    relay beats both cross-DC PD and the dedicated pool."""
    bw = tiny_system("pdd-bw", wan=CONGESTED)
    drc = tiny_system("xdc-pd-drc", wan=CONGESTED)
    el = elastic_system(bw)
    b = {sp.name: _bcr(_run(sp, reqs), sp) for sp in (drc, bw, el)}
    assert b["pdd-elastic"] > b["xdc-pd-drc"]
    assert b["pdd-elastic"] > b["pdd-bw"]


def test_negative_control_huge_switch_cost_loses_the_advantage(reqs):
    bw = tiny_system("pdd-bw", wan=CONGESTED)
    drc = tiny_system("xdc-pd-drc", wan=CONGESTED)
    fast, slow = elastic_system(bw), elastic_system(bw, switch_s=1e4)
    r_slow = _run(slow, reqs)
    assert all(r.pipeline == "P->MD" for r in r_slow.records)  # the relay never comes up
    assert _bcr(r_slow, slow) <= _bcr(_run(drc, reqs), drc)
    assert _bcr(r_slow, slow) < _bcr(_run(fast, reqs), fast)


def test_regimes_and_systems():
    from sglang_pdd.lab.sim.paper import PaperSetting
    names = [sp.name for sp in relay_systems(PaperSetting())]
    assert names == ["xdc-pd-drc", "pdd-bw", "pdd-elastic", "pdd-colocated"]
    assert {r.name for r in REGIMES} >= {"paper 40G", "congested 25G"}
    assert [r.gbps for r in REGIMES if "fluct" in r.name] == [40.0]


def test_report_has_a_bcr_row_per_system_and_a_column_per_regime():
    from types import SimpleNamespace as NS
    from sglang_pdd.lab.sim.relay_regimes import RegimeRow, relay_regimes_report
    names = ("xdc-pd-drc", "pdd-bw", "pdd-elastic", "pdd-colocated")
    prices = dict(zip(names, (72.0, 80.0, 72.0, 72.0)))
    res = {n: NS(bcr=0.2 + 0.01 * i, goodput_rps=10.0 + i) for i, n in enumerate(names)}
    rows = [RegimeRow(rg, res, prices, {"pdd-elastic": "note"}) for rg in REGIMES]
    lines = relay_regimes_report(rows).splitlines()
    assert all(rg.name in lines[1] for rg in REGIMES)
    assert lines[3].split()[:2] == ["xdc-pd-drc", "72.0"] and "(+0%)" in lines[3]
    assert lines[4].startswith("pdd-bw") and "0.2100 (+5%) 11.0/s" in lines[4]
    assert [ln.split()[0] for ln in lines[3:7]] == list(names)
    assert sum("note" in ln for ln in lines) == len(REGIMES)
