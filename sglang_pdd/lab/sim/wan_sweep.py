"""TTFT and goodput-relevant figures against WAN bandwidth, at one load: where RLD matters."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from sglang_pdd.lab.sim.metrics import Summary
from sglang_pdd.lab.sim.paper import PaperSetting, pdd_specs
from sglang_pdd.lab.sim.report import summary_table
from sglang_pdd.lab.sim.runner import run_workload


@dataclass
class WanPoint:
    gbps: float
    summaries: list[Summary]


def run_wan_sweep(s: PaperSetting = PaperSetting(), rate: float = 16.0,
                  gbps: Sequence[float] = (10.0, 25.0, 40.0, 100.0),
                  systems: Sequence[str] = ("xdc-pd-drc", "pdd-adaptive", "pdd-bw")) -> list[WanPoint]:
    wl = replace(s.workload, request_rate=rate)
    out = []
    for g in gbps:
        st = replace(s, wan=replace(s.wan, bandwidth_gbps=g))
        specs = [sp for sp in pdd_specs(st) if sp.name in systems]
        out.append(WanPoint(g, [run_workload(sp, s.model, wl, s.sla, eff=s.eff).summary
                                for sp in specs]))
    return out


def wan_sweep_report(points: list[WanPoint], rate: float = 16.0) -> str:
    lines = [f"WAN bandwidth sweep at {rate:.0f} req/s offered"]
    for p in points:
        lines += ["", f"WAN {p.gbps:.0f} Gbit/s", summary_table(p.summaries)]
    return "\n".join(lines)
