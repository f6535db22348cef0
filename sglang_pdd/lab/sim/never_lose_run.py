"""`--scenario never-lose`: pdd-never-lose against xdc-pd-drc, every WAN regime, several seeds.

Per regime and seed: BCR from the goodput search, and TTFT P99 at a fixed load (the paper
workload at `probe_rate` req/s; a trace at its own rate). On the paper workload a seed is the
workload's and the line's jitter seed; on a trace (fixed arrivals) it is the line's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Optional, Sequence

from sglang_pdd.lab.sim.goodput import max_goodput, search_goodput
from sglang_pdd.lab.sim.never_lose import dedicated_never_lose_system, never_lose_system
from sglang_pdd.lab.sim.never_lose_rules import NeverLoseConfig
from sglang_pdd.lab.sim.paper import PaperSetting, pdd_specs
from sglang_pdd.lab.sim.relay_regimes import REGIMES, Regime
from sglang_pdd.lab.sim.report import table
from sglang_pdd.lab.sim.runner import run_workload
from sglang_pdd.lab.sim.trace_run import LoadedTrace, replay

SYSTEMS = ("xdc-pd-drc", "pdd-never-lose")


RELAYS = {"mixed": partial(never_lose_system, relay_batching="mixed"),
          "partition": partial(never_lose_system, relay_batching="partition"),
          "dedicated": dedicated_never_lose_system}


def compared_specs(s: PaperSetting, relay: str = "mixed") -> list:
    """xdc-pd-drc, and pdd-never-lose relaying only what would spend over half the TTFT SLA
    on the line (the SLA is the operator's, so the router knows it); its relay on P (decoding in P's
    batches, or on an SM partition of P), or pdd-bw's RLD pool (`relay="dedicated"`)."""
    specs = {sp.name: sp for sp in pdd_specs(s)}
    rules = NeverLoseConfig(wan_budget_s=s.sla.ttft_s / 2)
    return [specs["xdc-pd-drc"], RELAYS[relay](specs["pdd-bw"], name=SYSTEMS[1], rules=rules)]


@dataclass
class Cell:
    bcr: float
    goodput_rps: float
    ttft_p99: float  # at the fixed load
    relayed: float  # share of requests relayed at the fixed load


def _cell(g, at_load) -> Cell:
    m = at_load.summary
    return Cell(g.bcr, g.goodput_rps, m.ttft_p99, max(0.0, 1.0 - m.pipelines.get("P->MD", 0.0)))


def run_never_lose(s: PaperSetting, seeds: Sequence[int], tr: Optional[LoadedTrace] = None,
                   regimes: Sequence[Regime] = REGIMES, probe_rate: float = 16.0, lo: Optional[float] = None,
                   relay: str = "mixed") -> dict[tuple[str, int, str], Cell]:
    """{(regime, seed, system): Cell} on the paper workload, or on `tr` when given; the goodput search
    starts at `lo` req/s (default: half the probe rate)."""
    out = {}
    for rg in regimes:
        for seed in seeds:
            st = replace(s, wan=replace(rg.wan(s.wan), seed=seed),
                         workload=replace(s.workload, seed=seed))
            for spec in compared_specs(st, relay):
                if tr is None:
                    g = max_goodput(spec, st.model, st.workload, st.sla, lo=lo or probe_rate / 2,
                                    iters=st.goodput_iters, eff=st.eff)
                    at = run_workload(spec, st.model, replace(st.workload, request_rate=probe_rate),
                                      st.sla, eff=st.eff)
                else:
                    g = search_goodput(spec, st.sla, lambda k, sp=spec: replay(sp, st, tr, k),
                                       lo=1.0, hi=64.0, iters=st.goodput_iters)
                    at = replay(spec, st, tr)
                out[(rg.name, seed, spec.name)] = _cell(g, at)
    return out


CELL_HEAD = ("drc BCR", "never-lose BCR", "BCR change", "drc TTFT p99", "never-lose TTFT p99", "relayed")


def bcr_change(a: Cell, b: Cell) -> float:
    """b's BCR against a's, in percent."""
    return (b.bcr / a.bcr - 1) * 100 if a.bcr > 0 else float("inf")


def cell_row(a: Cell, b: Cell) -> list[str]:
    """The columns of CELL_HEAD: xdc-pd-drc's cell `a` against pdd-never-lose's `b`."""
    return [f"{a.bcr:.4f}", f"{b.bcr:.4f}", f"{bcr_change(a, b):+.1f}%", f"{a.ttft_p99:.2f}", f"{b.ttft_p99:.2f}",
            f"{b.relayed:.1%}"]


def never_lose_report(cells: dict[tuple[str, int, str], Cell], load: str) -> str:
    regimes = list(dict.fromkeys(k[0] for k in cells))
    seeds = sorted({k[1] for k in cells})
    head = ["regime", "seed", *CELL_HEAD]
    body, verdict = [], []
    for rg in regimes:
        deltas, wins = [], True
        for sd in seeds:
            a, b = cells[(rg, sd, SYSTEMS[0])], cells[(rg, sd, SYSTEMS[1])]
            deltas.append(bcr_change(a, b))
            wins &= b.bcr >= a.bcr and b.ttft_p99 <= a.ttft_p99
            body.append([rg, str(sd), *cell_row(a, b)])
        verdict.append(f"  {rg:16s} BCR change {min(deltas):+.1f} .. {max(deltas):+.1f}% over "
                       f"{len(seeds)} seeds; BCR >= and TTFT p99 <= xdc-pd-drc in every seed: "
                       f"{'yes' if wins else 'NO'}")
    return "\n".join([f"pdd-never-lose vs xdc-pd-drc (TTFT p99 and relayed share at {load})",
                      table(head, body), "", *verdict])
