"""Replay a JSONL workload trace through the paper-scale deployments."""

from __future__ import annotations

from typing import Sequence

from sglang_pdd.lab.workload.trace import read_jsonl
from sglang_pdd.lab.sim.paper import PaperSetting, baseline_spec, pdd_specs
from sglang_pdd.lab.sim.report import summary_table
from sglang_pdd.lab.sim.runner import run


def run_trace(s: PaperSetting, path: str, systems: Sequence[str]) -> str:
    reqs = read_jsonl(path)
    window = max(r.arrival_s for r in reqs) + 1.0
    specs = {sp.name: sp for sp in pdd_specs(s)}
    specs["same-dc-pd"] = baseline_spec(s, 4)
    unknown = [n for n in systems if n not in specs]
    if unknown:
        raise SystemExit(f"unknown systems {unknown}; known: {sorted(specs)}")
    sums = [run(specs[n], s.model, reqs, s.sla, window, eff=s.eff).summary for n in systems]
    return f"{len(reqs)} trace records from {path}, window {window:.0f} s\n" + summary_table(sums)
