"""pdd-never-lose (docs/sim.md §9): the cluster that routes by its rules (the rules and the lane's
prediction, one by one: test_never_lose_rules.py)."""

import json
from dataclasses import replace

import pytest

from sglang_pdd.policy.pipeline import Pipeline
from sglang_pdd.lab.workload.generator import generate, measured
from sglang_pdd.lab.sim.cli import main
from sglang_pdd.lab.sim.cluster import Cluster
from sglang_pdd.lab.sim.cost_model import Chunk
from sglang_pdd.lab.sim.hardware import Efficiency
from sglang_pdd.lab.sim.metrics import Sla
from sglang_pdd.lab.sim.never_lose import (DedicatedNeverLoseCluster, NeverLoseCluster, dedicated_never_lose_system,
                                           never_lose_system)
from sglang_pdd.lab.sim.never_lose_rules import NeverLoseConfig, decide
from sglang_pdd.lab.sim.never_lose_run import compared_specs
from sglang_pdd.lab.sim.paper import PaperSetting, pdd_specs
from sglang_pdd.lab.sim.prefill import PrefillJob
from sglang_pdd.lab.sim.presets import TINY_MODEL, tiny_system, tiny_workload
from sglang_pdd.lab.sim.relay_regimes import REGIMES
from sglang_pdd.lab.sim.runner import run, typical_context
from sglang_pdd.lab.sim.wan import WanSpec

SLA = Sla(ttft_s=2.0, tpot_s=0.05)
CONGESTED = WanSpec(bandwidth_gbps=0.05, rtt_s=0.02, jitter=0.0)
ROOMY = WanSpec(bandwidth_gbps=1.0, rtt_s=0.02, jitter=0.0)


# ----- the cluster -----

@pytest.fixture(scope="module")
def reqs():
    return generate(tiny_workload())


def _run(spec, reqs):
    return run(spec, TINY_MODEL, reqs, SLA, tiny_workload().duration_s, drain_s=600.0)


def test_bills_p_and_md_only():
    drc = tiny_system("xdc-pd-drc", wan=ROOMY)
    nl = never_lose_system(tiny_system("pdd-bw", wan=ROOMY))
    assert nl.price_per_hour == drc.price_per_hour
    assert nl.chips_label() == drc.chips_label()


def test_on_a_roomy_line_it_is_xdc_pd_drc(reqs):
    a = _run(never_lose_system(tiny_system("pdd-bw", wan=ROOMY)), reqs)
    b = _run(tiny_system("xdc-pd-drc", wan=ROOMY), reqs)
    assert all(r.pipeline == "P->MD" for r in a.records)
    assert {r.request_id: r.ttft_s for r in a.records} == pytest.approx(
        {r.request_id: r.ttft_s for r in b.records})


def test_congested_line_relays_and_everything_finishes_once(reqs):
    res = _run(never_lose_system(tiny_system("pdd-bw", wan=CONGESTED)), reqs)
    c = res.cluster
    assert sorted(r.request_id for r in res.records) == sorted(r.request_id for r in measured(reqs))
    assert all(r.finished for r in res.records) and set(c.finish_count.values()) == {1}
    assert any(r.pipeline != "P->MD" for r in res.records)
    assert not c.states and not c._tails and not c._orphans
    assert all(d.used == 0 for d in c.D + c.R) and all(p.used == 0 for p in c.P)
    # the lane's counters taught the router the line's rate (it starts at half of it)
    assert c.line.bytes_per_s == pytest.approx(CONGESTED.bytes_per_s, rel=0.02)


def test_slack_admission_keeps_busy_ps_from_relaying():
    """Loaded Ps and no slack allowed: a request whose P has a queue is not relayed."""
    busy = generate(tiny_workload(request_rate=8.0))
    strict = NeverLoseConfig(p_slack_s=0.0)
    res = _run(never_lose_system(tiny_system("pdd-bw", wan=CONGESTED), rules=strict), busy)
    free = _run(never_lose_system(tiny_system("pdd-bw", wan=CONGESTED),
                                  rules=replace(strict, slack_admission=False)), busy)
    relayed = lambda r: sum(x.pipeline != "P->MD" for x in r.records)  # noqa: E731
    assert relayed(res) < relayed(free)
    assert any("slack" in x.route_reason for x in res.records)


def test_headroom_admission_reads_each_ps_busy_fraction(reqs):
    """On an SM partition the cluster's rules carry its P's slowdown while relaying (the deployment's own
    `prefill_factor`), and the route reads the chosen P's busy fraction from that P's counter: a P
    busy 90 % of the last seconds does not relay a near miss, the idle other P does."""
    spec = never_lose_system(tiny_system("pdd-bw", wan=CONGESTED), relay_batching="partition")
    c = NeverLoseCluster(spec, TINY_MODEL, Efficiency(), context_tokens=typical_context(reqs))
    assert c.rules.relay_slowdown == pytest.approx(spec.prefill_factor) and spec.prefill_factor > 1.0
    w = max(measured(reqs), key=lambda r: r.input_len)  # its whole prompt misses MD: over the budget
    seen = {}

    def look(t):
        for p in range(len(c.P)):
            seen[(t, p)] = decide(c.rules, c.observe(w, 0, p))

    c.loop.at(0.0, look, 0.0)
    c.loop.at(10.0, lambda: (setattr(c.P[0], "busy_s", 9.0), look(10.0)))
    c.loop.run()
    assert seen[(0.0, 0)].pipeline is not Pipeline.P_MD  # no history: a near miss relays
    busy, idle = seen[(10.0, 0)], seen[(10.0, 1)]
    assert busy.pipeline is Pipeline.P_MD and "no relay: P busy 89%" in busy.reason
    assert idle.pipeline is not Pipeline.P_MD


def test_odd_requests_keep_md_warm(reqs):
    """Odd traffic relayed on a slow line: with warm_md its prompt still reaches MD, so MD's
    hit for later turns is higher."""
    wan = WanSpec(bandwidth_gbps=0.1, rtt_s=0.02, jitter=0.0)  # 2-token outputs: all odd
    odd = [replace(r, max_output_tokens=2) for r in reqs]
    cfg = NeverLoseConfig(wan_budget_s=0.05, p_slack_s=100.0)
    warm = _run(never_lose_system(tiny_system("pdd-bw", wan=wan), rules=cfg), odd)
    cold = _run(never_lose_system(tiny_system("pdd-bw", wan=wan), rules=replace(cfg, warm_md=False)),
                odd)
    assert warm.cluster.warm_sent > 0 and cold.cluster.warm_sent == 0
    assert sum(r.md_hit for r in warm.records) > sum(r.md_hit for r in cold.records)


def test_the_route_reads_the_p_that_prefills_the_request():
    """The P is chosen before the route, and the slack read is that P's queue."""
    busy = generate(tiny_workload(request_rate=8.0))
    spec = never_lose_system(tiny_system("pdd-bw", wan=CONGESTED))
    c = NeverLoseCluster(spec, TINY_MODEL, Efficiency(), context_tokens=typical_context(busy),
                         tpot_target_s=SLA.tpot_s * 0.8)
    observed, prefilled, waits = {}, {}, []
    real_observe = c.observe

    def spy(w, md_hit, p):
        o = real_observe(w, md_hit, p)
        observed[w.request_id] = p
        waits.append((o.p_wait_s, [q.queued_tokens / c.p_tokens_per_s for q in c.P], p))
        return o

    c.observe = spy
    for i, inst in enumerate(c.P):
        inst.submit = (lambda job, i=i, f=inst.submit: (prefilled.setdefault(job.key, i), f(job)))
    c.run(busy, until=tiny_workload().duration_s + 600.0)
    assert observed and observed == {k: v for k, v in prefilled.items() if k in observed}
    assert all(o == pytest.approx(q[p]) for o, q, p in waits)
    assert any(len(set(q)) > 1 for _, q, _ in waits)  # the Ps' queues differ: the choice matters


# ----- the scenario -----

def test_cli_compares_in_every_regime_on_a_trace(tmp_path, capsys):
    """`--scenario never-lose --trace`: one row per regime and seed, and a verdict per regime."""
    recs = [{"timestamp": 200 * i, "input_length": 512 * 6 + 100, "output_length": 30 + i,
             "hash_ids": list(range(4)) + [100 + 2 * i, 101 + 2 * i, 102 + 2 * i]} for i in range(30)]
    path = tmp_path / "mc.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert main(["--scenario", "never-lose", "--trace", str(path), "--seeds", "0,1"]) == 0
    out = capsys.readouterr().out
    assert "30 of 30 Mooncake records" in out
    for rg in REGIMES:
        assert sum(line.lstrip().startswith(rg.name) for line in out.splitlines()) == 2 + 1  # 2 seeds + verdict
    assert out.count("in every seed:") == len(REGIMES)


def test_cli_refuses_bad_seeds():
    with pytest.raises(SystemExit):
        main(["--scenario", "never-lose", "--seeds", "0,x"])


def test_the_relay_side_shares_p_kv_pool():
    """No static carve-out: P has its whole pool while the relay side holds nothing, the relay's
    reservations come out of it, and freeing either side lets the other go on."""
    wl = tiny_workload()
    ctx = typical_context(generate(wl))
    drc = Cluster(tiny_system("xdc-pd-drc", wan=ROOMY), TINY_MODEL, Efficiency(),
                context_tokens=ctx)
    c = NeverLoseCluster(never_lose_system(tiny_system("pdd-bw", wan=ROOMY)), TINY_MODEL,
                         Efficiency(), context_tokens=ctx)
    p, r = c.P[0], c.R[0]
    pool = drc.P[0].capacity
    assert p.capacity == pool and r.capacity == pool
    admitted = []
    r.admit("a", pool // 2, admitted.append)
    assert admitted == ["a"] and p.capacity == pool - pool // 2
    r.admit("b", pool // 2 + 1, admitted.append)  # does not fit beside "a"
    assert admitted == ["a"]
    r.release("a")
    assert admitted == ["a", "b"] and p.capacity == pool - (pool // 2 + 1)
    done = []
    p.on_prefilled = done.append
    job = PrefillJob("j", pool // 2 + 10, 0)
    p.submit(job)  # stalls on memory: "b" holds more than half
    c.loop.run()
    assert done == []
    r.release("b")  # the relay frees its KV: the P's stalled job goes on
    c.loop.run()
    assert done == ["j"]
    r.admit("c", pool // 2, admitted.append)  # "j" still holds its KV (its transfer is not done)
    assert admitted[-1] == "b"
    p.release(job)  # P frees it: the relay's waiting reservation is admitted
    assert admitted[-1] == "c"


def test_md_is_chosen_as_xdc_pd_drc_chooses_it(reqs):
    """Same hits and loads, same MD: the route is what changes, not the MD choice."""
    ctx = typical_context(reqs)
    nl = NeverLoseCluster(never_lose_system(tiny_system("pdd-bw", wan=CONGESTED)), TINY_MODEL,
                          Efficiency(), context_tokens=ctx)
    drc = Cluster(tiny_system("xdc-pd-drc", wan=CONGESTED), TINY_MODEL, Efficiency(),
                  context_tokens=ctx)
    ms = measured(reqs)
    for i, w in enumerate(ms):
        for c in (nl, drc):
            c.drc[i % 2].insert_prompt(ms[(i * 7) % len(ms)])
            for j, d in enumerate(c.D):
                d.used = (i * 37 + j * 11) % 5 * d.capacity // 8  # varied KV usage
        assert nl._md_of(w) == drc._md_of(w), w.request_id


def test_the_scenario_budgets_half_the_ttft_sla():
    s = PaperSetting()
    drc, nl, ad = compared_specs(replace(s, sla=replace(s.sla, ttft_s=3.0)))
    assert drc.name == "xdc-pd-drc" and nl.name == "pdd-never-lose"
    assert nl.rules.wan_budget_s == 1.5 and nl.price_per_hour == drc.price_per_hour
    assert nl.pool_budget_s is None and nl.pool.min_instances == 0 and ad.name == "pdd-adaptive"


def test_the_dedicated_variant_bills_its_pool_and_relaying_does_not_slow_p(reqs):
    """`--relay dedicated`: pdd-bw's RLD pool, billed; the same rules with slowdown 1 (the headroom rule
    never fires); P's steps are never slowed; on a congested line it relays and everything finishes once."""
    base = tiny_system("pdd-bw", wan=CONGESTED)
    ded = dedicated_never_lose_system(base)
    assert ded.price_per_hour == base.price_per_hour > tiny_system("xdc-pd-drc", wan=CONGESTED).price_per_hour
    res = _run(ded, reqs)
    c = res.cluster
    assert isinstance(c, DedicatedNeverLoseCluster) and c.rules.relay_slowdown == 1.0
    assert not hasattr(c.P[0].cost, "slowed_steps")  # P's own cost model, no co-located relay side
    assert any(r.pipeline != "P->MD" for r in res.records)
    assert not any("no relay: P busy" in r.route_reason for r in res.records)
    assert all(r.finished for r in res.records) and set(c.finish_count.values()) == {1}
    assert all(d.used == 0 for d in c.D + c.R) and all(p.used == 0 for p in c.P)
    drc, nl, _ = compared_specs(PaperSetting(), relay="dedicated")
    bw = {sp.name: sp for sp in pdd_specs(PaperSetting())}["pdd-bw"]
    assert nl.name == "pdd-never-lose" and nl.relay == bw.relay and nl.price_per_hour == bw.price_per_hour


# ----- the relay decoding in P's batches (the default) -----

def test_a_mixed_batch_relay_rides_on_ps_steps_and_decodes_alone_when_p_is_idle(reqs):
    """`relay_batching="mixed"`: P's step carries the relay's decode step (its time added, not a factor);
    a relay step while P runs one ends with it; with P idle the relay decodes at its own pace. The
    headroom rule reads the step's slowdown with one relayed decode riding on it (above 1, below the
    partition's). On a congested line it relays and everything finishes."""
    from sglang_pdd.lab.sim.mixed_batch_relay import MixedPrefillCost, RidingRelayCost, mixed_slowdown

    spec = never_lose_system(tiny_system("pdd-bw", wan=CONGESTED))
    assert spec.relay_batching == "mixed"
    c = NeverLoseCluster(spec, TINY_MODEL, Efficiency(), context_tokens=typical_context(reqs))
    p, r = c.P[0], c.R[0]
    assert isinstance(p.cost, MixedPrefillCost) and isinstance(r.cost, RidingRelayCost)
    raw = p.cost.cost
    slow = mixed_slowdown(raw, spec.chunk_size, typical_context(reqs))
    assert c.rules.relay_slowdown == pytest.approx(slow) and 1.0 < slow < spec.prefill_factor
    chunk = [Chunk(512, 0)]
    assert p.cost.prefill_step_s(chunk) == pytest.approx(raw.prefill_step_s(chunk))  # no relay running
    r.join("x", 1000, 50, lambda k: None)
    with_relay = p.cost.prefill_step_s(chunk)
    assert with_relay == pytest.approx(raw.prefill_step_s(chunk) + raw.decode_step_s(1, 1000))
    assert with_relay < raw.prefill_step_s(chunk) * spec.prefill_factor
    p.busy = True  # P's step (just planned above) is in flight: the relay's token comes with it
    assert r.cost.decode_step_s(1, 1000) == pytest.approx(max(with_relay, raw.decode_step_s(1, 1000)))
    p.busy = False
    assert r.cost.decode_step_s(1, 1000) == pytest.approx(raw.decode_step_s(1, 1000))
    res = _run(never_lose_system(tiny_system("pdd-bw", wan=CONGESTED)), reqs)
    assert any(x.pipeline != "P->MD" for x in res.records)
    assert all(x.finished for x in res.records) and set(res.cluster.finish_count.values()) == {1}
    assert all(d.used == 0 for d in res.cluster.D + res.cluster.R) and all(q.used == 0 for q in res.cluster.P)


def test_relay_batching_is_mixed_or_partition():
    with pytest.raises(ValueError, match="relay_batching"):
        never_lose_system(tiny_system("pdd-bw", wan=CONGESTED), relay_batching="green")
