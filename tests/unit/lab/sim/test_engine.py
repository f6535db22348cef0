"""Event engine and cluster accounting: every request finishes exactly once, nothing leaks."""

import numpy as np
import pytest

from sglang_pdd.lab.workload.generator import generate, measured
from sglang_pdd.lab.sim.cost_model import CostModel
from sglang_pdd.lab.sim.decode import DecodeInstance
from sglang_pdd.lab.sim.engine import EventLoop
from sglang_pdd.lab.sim.hardware import InstanceSpec
from sglang_pdd.lab.sim.metrics import Sla
from sglang_pdd.lab.sim.prefill import PrefillInstance, PrefillJob
from sglang_pdd.lab.sim.presets import CPU_A, TINY_MODEL, tiny_system, tiny_workload
from sglang_pdd.lab.sim.runner import run
from sglang_pdd.lab.sim.systems import SYSTEM_NAMES
from sglang_pdd.lab.sim.wan import WanSpec

SLA = Sla(ttft_s=2.0, tpot_s=0.05)


def test_event_loop_orders_by_time_then_fifo_and_cancels():
    loop, seen = EventLoop(), []
    loop.at(2.0, seen.append, "c")
    loop.at(1.0, seen.append, "a")
    loop.at(1.0, seen.append, "b")
    ev = loop.at(1.5, seen.append, "x")
    ev.cancel()
    loop.run()
    assert seen == ["a", "b", "c"] and loop.now == 2.0
    with pytest.raises(ValueError):
        loop.at(1.0, seen.append, "past")


def test_event_loop_run_until_stops_early():
    loop, seen = EventLoop(), []
    for t in (1.0, 2.0, 3.0):
        loop.at(t, seen.append, t)
    loop.run(until=2.5)
    assert seen == [1.0, 2.0]
    loop.run()
    assert seen == [1.0, 2.0, 3.0]


def _cluster_run(name, wl=None, **kw):
    wl = wl or tiny_workload()
    reqs = generate(wl)
    res = run(tiny_system(name, **kw), TINY_MODEL, reqs, SLA, wl.duration_s, drain_s=600.0)
    return reqs, res


@pytest.mark.parametrize("name", SYSTEM_NAMES)
def test_every_request_finishes_exactly_once_and_nothing_leaks(name):
    reqs, res = _cluster_run(name)
    c = res.cluster
    ids = [r.request_id for r in measured(reqs)]
    assert sorted(r.request_id for r in res.records) == sorted(ids)  # warm-ups never recorded
    assert all(r.finished for r in res.records)
    assert sorted(c.finish_count) == sorted(ids) and set(c.finish_count.values()) == {1}
    for r in res.records:
        assert r.tokens_rld + r.tokens_md == r.output_len, r
        assert r.first_token_s >= r.arrival_s and r.finish_s >= r.first_token_s
    assert not c.states and not c._tails and not c._orphans
    for inst in c.D + c.R:
        assert inst.used == 0 and not inst.reserved and not inst.running and not inst.waiting
    for p in c.P:
        assert p.used == 0 and not p.queue
    if c.wan is not None:
        assert c.wan.active == 0


def test_pdd_uses_both_pipelines_and_hands_off():
    _, res = _cluster_run("pdd-adaptive")
    pipes = {r.pipeline for r in res.records}
    assert {"P->MD", "P->RLD->MD"} <= pipes
    relayed = [r for r in res.records if r.pipeline == "P->RLD->MD" and r.tokens_md > 0]
    assert relayed and all(r.handoff_mode for r in relayed)
    assert all(r.tokens_rld >= 1 for r in relayed)
    assert all(r.tokens_md == r.output_len for r in res.records if r.pipeline == "P->MD")


def test_catch_up_keeps_rld_busy_longer_than_one_shot():
    _, one = _cluster_run("pdd-one-shot")
    _, catch = _cluster_run("pdd-catch-up")
    assert sum(r.tokens_rld for r in catch.records) > sum(r.tokens_rld for r in one.records)
    assert max(r.handoff_gap_s for r in catch.records) <= max(r.handoff_gap_s for r in one.records) + 0.05


def test_decode_radix_cache_cuts_wan_bytes():
    _, naive = _cluster_run("xdc-pd-naive")
    _, drc = _cluster_run("xdc-pd-drc")
    assert drc.summary.wan_gb < 0.5 * naive.summary.wan_gb
    assert drc.summary.md_hit_mean > 0.8 and naive.summary.md_hit_mean == 0.0


def test_relay_only_lets_md_cache_fall_behind():
    wl = tiny_workload(duration_s=60.0)
    _, ok = _cluster_run("pdd-adaptive", wl)
    _, bad = _cluster_run("pdd-relay-only", wl)
    assert any(r.pipeline == "P->RLD" for r in bad.records)
    assert bad.summary.md_hit_mean < ok.summary.md_hit_mean
    assert bad.summary.rld_token_share > ok.summary.rld_token_share


@pytest.mark.parametrize("name", ["xdc-pd-naive", "xdc-pd-drc", "pdd-adaptive"])
def test_more_wan_bandwidth_never_raises_ttft(name):
    """For routing that does not read the bandwidth (pdd-bw does: see the next test)."""
    wl = tiny_workload(duration_s=40.0)
    prev = None
    for gbps in (0.05, 0.1, 0.2, 0.5, 2.0):
        _, res = _cluster_run(name, wl, wan=WanSpec(bandwidth_gbps=gbps, rtt_s=0.02, jitter=0.0))
        cur = np.array([res.summary.ttft_p50, res.summary.ttft_p90, res.summary.ttft_p99])
        if prev is not None:
            assert (cur <= prev * 1.02 + 1e-3).all(), (gbps, cur, prev)
        prev = cur


def test_bandwidth_aware_routing_spends_more_bandwidth_on_p_to_md():
    """pdd-bw sends a request P->MD whenever its predicted WAN time fits the budget, so a
    faster link moves requests off RLD (P->MD share never falls) at the price of up to one
    budget of WAN time in their TTFT: TTFT is not monotone in bandwidth for this policy."""
    wl = tiny_workload(duration_s=40.0)
    prev = -1.0
    for gbps in (0.05, 0.2, 2.0):
        _, res = _cluster_run("pdd-bw", wl, wan=WanSpec(bandwidth_gbps=gbps, rtt_s=0.02, jitter=0.0))
        share = res.summary.pipelines.get("P->MD", 0.0)
        assert share >= prev
        prev = share
    assert prev > 0.9


def test_prefill_tail_chunk_runs_alone_unless_batching():
    cost = CostModel(TINY_MODEL, InstanceSpec(CPU_A, 1))

    def steps(batching):
        loop = EventLoop()
        done = []
        p = PrefillInstance(loop, cost, "P", chunk_size=1000, tail_chunk_batching=batching,
                            on_prefilled=done.append)
        p.submit(PrefillJob("a", 1500, 0))  # a full chunk, then a 500-token tail
        p.submit(PrefillJob("b", 300, 0))
        loop.run()
        assert done == ["a", "b"] and p.used == 2 * 0 + 1800  # KV held until released
        return p.steps

    assert steps(False) == 3  # [a:1000] [a:500 alone] [b:300]
    assert steps(True) == 2  # [a:1000] [a:500 + b:300]


def test_decode_instance_counts_tokens_and_admits_within_capacity():
    cost = CostModel(TINY_MODEL, InstanceSpec(CPU_A, 1))
    loop = EventLoop()
    d = DecodeInstance(loop, cost, "D", max_batch=2)
    finished, admitted = [], []
    for k in ("a", "b", "c"):
        d.admit(k, 100, admitted.append)
    assert admitted == ["a", "b"] and d.used == 200  # batch cap holds "c" back

    def fin(key):
        finished.append((key, loop.now))
        d.release(key)

    d.join("a", 100, 5, fin)
    d.join("b", 100, 3, fin)
    loop.run()
    assert [k for k, _ in finished] == ["b", "a"] and admitted == ["a", "b", "c"]
    assert d.tokens_out == 3 * 2 + 2 * 1  # 3 steps with two requests, 2 with one
    assert d.used == 100  # "c" admitted, never joined
