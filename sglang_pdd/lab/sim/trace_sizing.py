"""`--scenario sizing --trace FILE`: the recommended PDD deployment for an operator's own trace (issue 46
item 3, docs/sim.md §9).

For each candidate shape (P instances of A, MD instances of B; `P_COUNTS` x `MD_COUNTS`) it runs
`pdd-never-lose` (the relay on P, decoding in P's batches, and the elastic relay pool, min 0, up to
`RelayPoolSpec.max_instances`) through the goodput search over time compression (§8) on the chosen
line, and recommends the shape with the highest BCR (at the run's own bill: the pool's
instance-hours included). The pool's recommended bounds are 0 and the most instances it had up at
the goodput point (0: relaying never paid for an instance on this traffic). The recommendation is
compared with xdc-pd-drc on the same P and MD pools and with same-dc-pd (the paper's 88 A in one site),
by BCR and by TTFT at the trace's own rate; and the report starts with the trace's hit-rate bathtub
(the share of requests per prefix-hit bucket, from the trace's own unbounded-cache hit).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from sglang_pdd.lab.sim.goodput import GoodputResult, search_goodput
from sglang_pdd.lab.sim.hardware import CHIP_A, CHIP_B
from sglang_pdd.lab.sim.metrics import Summary
from sglang_pdd.lab.sim.never_lose import never_lose_system
from sglang_pdd.lab.sim.never_lose_rules import NeverLoseConfig
from sglang_pdd.lab.sim.paper import PaperSetting, baseline_spec
from sglang_pdd.lab.sim.relay_pool import RelayPoolSpec
from sglang_pdd.lab.sim.report import table
from sglang_pdd.lab.sim.systems import PoolSpec, SystemSpec, make_system
from sglang_pdd.lab.sim.trace_run import HIST_EDGES, HIST_LABELS, LoadedTrace, replay
from sglang_pdd.lab.workload.mooncake import hit_histogram

P_COUNTS = (3, 4, 5)
MD_COUNTS = (3, 4)


@dataclass
class Candidate:
    spec: SystemSpec
    goodput: GoodputResult
    at_load: Summary  # at the trace's own rate
    pool_peak: int  # most pool instances up at the goodput point


def _drc(s: PaperSetting, p: int, md: int) -> SystemSpec:
    c = s.instance_chips
    return make_system("xdc-pd-drc", PoolSpec(CHIP_A, p, c), PoolSpec(CHIP_B, md, c), wan=s.wan)


def never_lose_for(s: PaperSetting, p: int, md: int, pool: RelayPoolSpec = RelayPoolSpec()) -> SystemSpec:
    """pdd-never-lose on `p` P and `md` MD instances, its budgets from the SLA (as `--scenario never-lose`)."""
    c = s.instance_chips
    base = make_system("pdd-bw", PoolSpec(CHIP_A, p, c), PoolSpec(CHIP_B, md, c),
                       rld=PoolSpec(CHIP_A, 1, chips_per_instance=c), wan=s.wan)
    return never_lose_system(base, rules=NeverLoseConfig(wan_budget_s=s.sla.ttft_s / 2), pool=pool,
                             ttft_slo_s=s.sla.ttft_s)


def _search(spec: SystemSpec, s: PaperSetting, tr: LoadedTrace) -> GoodputResult:
    return search_goodput(spec, s.sla, lambda k: replay(spec, s, tr, k), lo=1.0, hi=64.0, iters=s.goodput_iters)


def evaluate(spec: SystemSpec, s: PaperSetting, tr: LoadedTrace) -> Candidate:
    g = _search(spec, s, tr)
    pool = getattr(g.run.cluster, "pool", None) if g.run is not None else None
    return Candidate(spec, g, replay(spec, s, tr).summary, pool.peak if pool is not None else 0)


def run_trace_sizing(s: PaperSetting, tr: LoadedTrace, p_counts: Sequence[int] = P_COUNTS,
                     md_counts: Sequence[int] = MD_COUNTS) -> tuple[list[Candidate], Candidate, Candidate]:
    """(the never-lose candidates, xdc-pd-drc on the best one's pools, same-dc-pd)."""
    cands = [evaluate(never_lose_for(s, p, md), s, tr) for p in p_counts for md in md_counts]
    best = recommended(cands)
    drc = evaluate(_drc(s, best.spec.prefill.instances, best.spec.decode.instances), s, tr)
    same = evaluate(baseline_spec(s, best.spec.prefill.instances), s, tr)
    return cands, drc, same


def recommended(cands: Sequence[Candidate]) -> Candidate:
    """The highest BCR; on a tie the cheaper shape."""
    return max(cands, key=lambda c: (round(c.goodput.bcr, 6), -c.spec.price_per_hour))


def bathtub_lines(tr: LoadedTrace) -> list[str]:
    hits = [r.prefix_hit_len / r.input_len for r in tr.requests if r.input_len > 0]
    hist = hit_histogram(hits, HIST_EDGES)
    tokens = sum(r.input_len for r in tr.requests) or 1
    mean = sum(r.prefix_hit_len for r in tr.requests) / tokens
    out = [f"Hit-rate bathtub of the trace (the trace's own prefix hit, an unbounded cache; token-weighted "
           f"mean {mean:.3f})"]
    for label, share in zip(HIST_LABELS, hist):
        out.append(f"  {label:>7s} {share:6.1%} {'#' * round(share * 60)}")
    return out


def _row(name: str, c: Candidate, ref: Optional[Candidate]) -> list[str]:
    g, m = c.goodput, c.at_load
    rel = f"{(g.bcr / ref.goodput.bcr - 1) * 100:+.1f}%" if ref is not None and ref.goodput.bcr > 0 else "-"
    return [name, c.spec.chips_label(), f"{g.summary.price_per_hour:.1f}" if g.summary else "-",
            f"{g.rate:.2f}" if g.summary else "fails at x1", f"{g.goodput_rps:.2f}", f"{g.bcr:.4f}", rel,
            f"{m.ttft_p50:.2f}/{m.ttft_p90:.2f}/{m.ttft_p99:.2f}", f"{m.attainment:.3f}"]


def trace_sizing_report(tr: LoadedTrace, s: PaperSetting, res: tuple[list[Candidate], Candidate, Candidate]) -> str:
    cands, drc, same = res
    best = recommended(cands)
    sp = best.spec
    pool_max = best.pool_peak
    relay = ("the relay on P (in P's batches) and an elastic relay pool" if pool_max
             else "the relay on P (in P's batches); no pool instance paid for itself on this traffic")
    out = [tr.description, "", *bathtub_lines(tr), "",
           f"Candidates: pdd-never-lose on the {s.wan.bandwidth_gbps:g} Gb/s line (SLA: TTFT <= {s.sla.ttft_s:g} s, "
           f"TPOT <= {s.sla.tpot_s * 1e3:.0f} ms, {s.sla.attainment:.0%}); BCR at the run's own bill, goodput from "
           f"the trace replayed k x faster",
           table(["P x 8 A", "MD x 8 B", "bill/h at k", "k", "goodput req/s", "BCR", "pool peak"],
                 [[str(c.spec.prefill.instances), str(c.spec.decode.instances),
                   f"{c.goodput.summary.price_per_hour:.1f}" if c.goodput.summary else "-",
                   f"{c.goodput.rate:.2f}", f"{c.goodput.goodput_rps:.2f}", f"{c.goodput.bcr:.4f}", str(c.pool_peak)]
                  for c in cands]), "",
           f"Recommended: {sp.prefill.instances} P (8 x A each), {sp.decode.instances} MD (8 x B each), {relay}; "
           f"pool bounds {sp.pool.min_instances}..{pool_max} instance(s) of {sp.pool_instance.chips} x "
           f"{sp.pool_instance.chip.name} (start-up {sp.pool.startup_s:g} s)", "",
           table(["system", "chips", "bill/h at k", "k", "goodput req/s", "BCR", "BCR vs drc",
                  "TTFT p50/p90/p99 s at x1", "SLA att. at x1"],
                 [_row("pdd-never-lose (recommended)", best, drc), _row("xdc-pd-drc, same P and MD", drc, drc),
                  _row("same-dc-pd (88 x A)", same, drc)])]
    return "\n".join(out)

