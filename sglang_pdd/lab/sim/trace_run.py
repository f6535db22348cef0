"""Replay a request trace through the paper-scale deployments (`--scenario trace`).

The file is ours (`WorkloadRequest.to_dict()` per line, per-session caches) or Mooncake's
(`timestamp`, `input_length`, `output_length`, `hash_ids`; recognised by its fields), replayed
with block-level LRU radix caches on P, RLD and MD (`block_cache`). Per system it reports, at the
trace's own load (times its `speedup`): SLA attainment, TTFT P50/P90/P99, WAN traffic, the mean
and the histogram of the prefix hit at P and at MD (the bathtub of the trace); then SLA goodput
and BCR from a goodput search over time compression (the trace replayed k times faster).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Optional, Sequence

from sglang_pdd.lab.sim.goodput import GoodputResult, search_goodput
from sglang_pdd.lab.sim.metrics import Summary
from sglang_pdd.lab.sim.paper import PaperSetting, baseline_spec, pdd_specs
from sglang_pdd.lab.sim.records import RequestRecord
from sglang_pdd.lab.sim.relay_regimes import REGIMES, Regime
from sglang_pdd.lab.sim.report import summary_table, table
from sglang_pdd.lab.sim.runner import RunResult, run
from sglang_pdd.lab.sim.systems import SystemSpec
from sglang_pdd.lab.workload.mooncake import MooncakeOptions, hit_histogram, read_mooncake
from sglang_pdd.lab.workload.request import WorkloadRequest
from sglang_pdd.lab.workload.trace import is_mooncake_file, read_jsonl

logger = logging.getLogger(__name__)

HIST_EDGES = (0.2, 0.5, 0.8, 0.95)
HIST_LABELS = ("<20%", "20-50%", "50-80%", "80-95%", ">=95%")


@dataclass
class LoadedTrace:
    requests: list[WorkloadRequest]
    description: str

    @property
    def window_s(self) -> float:
        return max(r.arrival_s for r in self.requests) + 1.0


def load_trace(path: str, options: MooncakeOptions = MooncakeOptions()) -> LoadedTrace:
    if is_mooncake_file(path):
        tr = read_mooncake(path, options)
        if not tr.requests:
            raise SystemExit(f"{path}: no record in the chosen window ({tr.describe()})")
        return LoadedTrace(tr.requests, tr.describe())
    if options != MooncakeOptions():
        raise SystemExit("--trace-from/--trace-to/--trace-speedup/--trace-length-scale/"
                         "--trace-max-context apply to Mooncake-format traces only")
    reqs = read_jsonl(path)
    return LoadedTrace(reqs, f"{len(reqs)} trace records from {path}")


@dataclass
class TraceRow:
    spec: SystemSpec
    at_load: Summary
    p_hist: list[float]
    md_hist: list[float]
    p_hit: float  # token-weighted prefix hit at P
    md_hit: float  # token-weighted hit at MD (0 without a DRC)
    goodput: Optional[GoodputResult] = None


def _hits(records: Sequence[RequestRecord]) -> tuple[list[float], list[float], float, float]:
    tokens = sum(r.input_len for r in records) or 1
    return (hit_histogram([r.prefix_hit_len / r.input_len for r in records], HIST_EDGES),
            hit_histogram([r.md_hit / r.input_len for r in records], HIST_EDGES),
            sum(r.prefix_hit_len for r in records) / tokens,
            sum(r.md_hit for r in records) / tokens)


def trace_specs(s: PaperSetting, systems: Sequence[str]) -> list[SystemSpec]:
    specs = {sp.name: sp for sp in pdd_specs(s)}
    specs["same-dc-pd"] = baseline_spec(s, 4)
    unknown = [n for n in systems if n not in specs]
    if unknown:
        raise SystemExit(f"unknown systems {unknown}; known: {sorted(specs)}")
    return [specs[n] for n in systems]


def replay(spec: SystemSpec, s: PaperSetting, tr: LoadedTrace, speedup: float = 1.0) -> RunResult:
    """One run of the trace `speedup` times faster (open loop: one session per Mooncake record)."""
    reqs = tr.requests if speedup == 1.0 else [replace(r, arrival_s=r.arrival_s / speedup)
                                               for r in tr.requests]
    return run(spec, s.model, reqs, s.sla, tr.window_s / speedup, eff=s.eff)


def run_trace(s: PaperSetting, tr: LoadedTrace, systems: Sequence[str], goodput: bool = True,
              goodput_hi: float = 64.0) -> list[TraceRow]:
    rows = []
    for spec in trace_specs(s, systems):
        res = replay(spec, s, tr)
        row = TraceRow(spec, res.summary, *_hits(res.records))
        if goodput:
            row.goodput = search_goodput(spec, s.sla, lambda k, sp=spec: replay(sp, s, tr, k),
                                         lo=1.0, hi=goodput_hi, iters=s.goodput_iters)
        rows.append(row)
    return rows


def trace_report(tr: LoadedTrace, rows: Sequence[TraceRow]) -> str:
    rate = len(tr.requests) / tr.window_s
    out = [tr.description, "", f"A. All systems at the trace's load ({rate:.2f} req/s offered)",
           summary_table([r.at_load for r in rows]), "",
           "B. Prefix hit (token-weighted mean; share of requests per hit-rate bucket)"]
    body = []
    for r in rows:
        for where, mean, hist in (("P", r.p_hit, r.p_hist), ("MD", r.md_hit, r.md_hist)):
            if where == "MD" and not r.spec.drc:
                continue
            body.append([r.spec.name, where, f"{mean:.3f}"] + [f"{h * 100:.1f}%" for h in hist])
    out.append(table(["system", "cache", "hit"] + list(HIST_LABELS), body))
    if any(r.goodput is not None for r in rows):
        out += ["", "C. SLA goodput (trace replayed k x faster; highest k passing) and BCR"]
        gb = []
        for r in rows:
            g = r.goodput
            if g is None:
                continue
            s = g.summary
            gb.append([r.spec.name, r.spec.chips_label(), f"{r.spec.price_per_hour:.1f}",
                       f"{g.rate:.2f}" if s else "fails at x1", f"{rate * g.rate:.1f}",
                       f"{g.goodput_rps:.2f}", f"{g.bcr:.4f}",
                       f"{s.ttft_p50:.2f}/{s.ttft_p90:.2f}/{s.ttft_p99:.2f}" if s else "-",
                       f"{s.wan_gbps:.1f}" if s else "-"])
        out.append(table(["system", "chips", "cost/h", "k", "load req/s", "goodput req/s", "BCR",
                          "TTFT p50/p90/p99 s at k", "WAN Gb/s at k"], gb))
    return "\n".join(out)


def run_trace_regimes(s: PaperSetting, tr: LoadedTrace, systems: Sequence[str],
                      regimes: Sequence[Regime] = REGIMES, goodput: bool = True) -> str:
    """The trace on each WAN regime of `relay_regimes` (roomy, paper, congested, fluctuating)."""
    out = [tr.description]
    for rg in regimes:
        st = replace(s, wan=rg.wan(s.wan))
        names = [n for n in systems if n != "same-dc-pd"]  # no WAN: same in every regime
        out += ["", f"=== WAN regime: {rg.name} ({rg.gbps:g} Gb/s, jitter {rg.jitter:.0%} per "
                f"{rg.period_s:g} s) ==="]
        rows = run_trace(st, tr, names, goodput=goodput)
        out.append(trace_report(tr, rows).split("\n", 2)[2])
    return "\n".join(out)
