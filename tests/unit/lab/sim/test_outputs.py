"""The simulator's derived outputs: bathtub, goodput search, sizing order."""

from dataclasses import replace

import numpy as np
import pytest

from sglang_pdd.lab.sim.bathtub import run_bathtub
from sglang_pdd.lab.sim.goodput import max_goodput
from sglang_pdd.lab.sim.metrics import Sla
from sglang_pdd.lab.sim.paper import PaperSetting
from sglang_pdd.lab.sim.presets import CPU_B, TINY_MODEL, tiny_system, tiny_workload
from sglang_pdd.lab.sim.sizing import candidates
from sglang_pdd.lab.sim.systems import PoolSpec


@pytest.fixture(scope="module")
def bathtub():
    hits = np.round(np.arange(0.60, 0.95, 0.01), 2)
    return {round(p.hit, 2): p for p in run_bathtub(PaperSetting(), hits=hits, samples=20)}


def test_tail_chunk_loss_peaks_just_past_a_chunk_multiple(bathtub):
    # 64000 * (1 - h) just above 8192 * k: k = 1 at h = 0.87, k = 2 at h = 0.74, k = 3 at h = 0.61
    for h_dip, h_after in ((0.87, 0.88), (0.74, 0.75), (0.61, 0.62)):
        assert bathtub[h_dip].tail_penalty(True) > 2 * bathtub[h_after].tail_penalty(True) + 0.005
    assert all(0.0 <= p.tail_penalty() <= p.tail_penalty(True) + 0.01 for p in bathtub.values())


def test_higher_hit_means_more_prefill_capacity(bathtub):
    caps = [bathtub[h].p_rps_batched_tail for h in sorted(bathtub)]
    assert all(b > a for a, b in zip(caps, caps[1:]))


def test_pdd_capacity_is_capped_by_decode_and_wan(bathtub):
    s = PaperSetting()
    for h in (0.6, 0.75, 0.9):
        p = bathtub[h]
        wan_cap = s.wan.bytes_per_s / (64_000 * (1 - h) * s.model.kv_bytes_per_token)
        caps = (p.p_rps * s.pdd_p_instances, wan_cap)  # MD on B has its own decode rate
        assert p.rps["pdd-bw"] <= min(caps) + 1e-9
        assert p.rps["same-dc-pd"] <= p.d_rps * 7 + 1e-9  # 7 D instances of A
    p = bathtub[0.9]
    assert p.bcr["xdc-pd-drc"] > p.bcr["pdd-bw"]  # same capacity, RLD costs more


def test_goodput_grows_with_decode_capacity():
    wl = tiny_workload(duration_s=30.0)
    sla = Sla(ttft_s=1.0, tpot_s=0.05)
    small = tiny_system("xdc-pd-drc")
    big = replace(small, decode=PoolSpec(CPU_B, 4, chips_per_instance=1))
    g_small = max_goodput(small, TINY_MODEL, wl, sla, lo=0.5, hi=32.0, iters=3)
    g_big = max_goodput(big, TINY_MODEL, wl, sla, lo=0.5, hi=32.0, iters=3)
    assert g_small.summary is not None and g_small.summary.attainment >= sla.attainment
    assert g_big.rate >= g_small.rate
    assert g_small.bcr == pytest.approx(g_small.goodput_rps / small.price_per_hour)


def test_sizing_candidates_come_cheapest_first():
    c = candidates(PaperSetting(), "pdd-bw", max_instances=3)
    prices = [sp.price_per_hour for sp in c]
    assert prices == sorted(prices) and len({sp.decode.chip.name for sp in c}) == 2
