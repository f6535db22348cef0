"""`--scenario never-lose`: pdd-never-lose against xdc-pd-drc and pdd-adaptive, every WAN regime,
several seeds.

Per regime and seed: BCR from the goodput search (at the run's own bill: an elastic relay pool is
billed for its instance-hours), and TTFT P99 at a fixed load (the paper workload at `probe_rate`
req/s; a trace at its own rate). On the paper workload a seed is the workload's and the line's
jitter seed; on a trace (fixed arrivals) it is the line's. The goal (issue 46): BCR at least
xdc-pd-drc's and TTFT P99 at most its own, and BCR within `GOAL_PP` points (of xdc-pd-drc's BCR) of
the better of pdd-adaptive and xdc-pd-drc.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Optional, Sequence

from sglang_pdd.lab.sim.goodput import max_goodput, search_goodput
from sglang_pdd.lab.sim.never_lose import dedicated_never_lose_system, never_lose_system
from sglang_pdd.lab.sim.never_lose_rules import NeverLoseConfig
from sglang_pdd.lab.sim.paper import PaperSetting, pdd_specs
from sglang_pdd.lab.sim.relay_pool import RelayPoolSpec
from sglang_pdd.lab.sim.relay_regimes import REGIMES, Regime
from sglang_pdd.lab.sim.report import table
from sglang_pdd.lab.sim.runner import run_workload
from sglang_pdd.lab.sim.trace_run import LoadedTrace, replay

SYSTEMS = ("xdc-pd-drc", "pdd-never-lose", "pdd-adaptive")
GOAL_PP = 3.0  # BCR within this many points (of xdc-pd-drc's BCR) of the better of pdd-adaptive and xdc-pd-drc


RELAYS = {"pool": partial(never_lose_system, relay_batching="mixed"),
          "mixed": partial(never_lose_system, relay_batching="mixed"),
          "partition": partial(never_lose_system, relay_batching="partition"),
          "dedicated": dedicated_never_lose_system}


def compared_specs(s: PaperSetting, relay: str = "pool", adaptive: bool = True) -> list:
    """xdc-pd-drc, pdd-never-lose and pdd-adaptive (the paper's dedicated RLD pool). pdd-never-lose's
    P relays what would spend over half the TTFT SLA on the line (the SLA is the operator's, so the router
    knows it), an elastic pool instance that is up what would spend over two RTTs.
    Its relay: on P, decoding in P's batches, with the elastic pool when P has no spare capacity
    (`pool`, the default), on P only (`mixed`), on an SM partition of P, or pdd-bw's RLD pool
    (`dedicated`)."""
    specs = {sp.name: sp for sp in pdd_specs(s)}
    rules = NeverLoseConfig(wan_budget_s=s.sla.ttft_s / 2)
    kw = {"pool": RelayPoolSpec(), "ttft_slo_s": s.sla.ttft_s} if relay == "pool" else {}
    out = [specs["xdc-pd-drc"], RELAYS[relay](specs["pdd-bw"], name=SYSTEMS[1], rules=rules, **kw)]
    return out + [specs["pdd-adaptive"]] if adaptive else out


@dataclass
class Cell:
    bcr: float
    goodput_rps: float
    ttft_p99: float  # at the fixed load
    relayed: float  # share of requests relayed at the fixed load
    bill: float = 0.0  # cost per hour at the goodput point (an elastic pool's instance-hours included)
    pooled: float = 0.0  # share of requests relayed on the elastic pool at the goodput point


def _pooled(res) -> float:
    recs = res.records
    return sum(r.route_reason.startswith("pool") for r in recs) / len(recs) if recs else 0.0


def _cell(g, at_load) -> Cell:
    m = at_load.summary
    pooled = _pooled(g.run) if g.run is not None else 0.0
    return Cell(g.bcr, g.goodput_rps, m.ttft_p99, max(0.0, 1.0 - m.pipelines.get("P->MD", 0.0)),
                g.summary.price_per_hour if g.summary else 0.0, pooled)


def run_never_lose(s: PaperSetting, seeds: Sequence[int], tr: Optional[LoadedTrace] = None,
                   regimes: Sequence[Regime] = REGIMES, probe_rate: float = 16.0, lo: Optional[float] = None,
                   relay: str = "pool", adaptive: bool = True) -> dict[tuple[str, int, str], Cell]:
    """{(regime, seed, system): Cell} on the paper workload, or on `tr` when given; the goodput search
    starts at `lo` req/s (default: half the probe rate)."""
    out = {}
    for rg in regimes:
        for seed in seeds:
            st = replace(s, wan=replace(rg.wan(s.wan), seed=seed),
                         workload=replace(s.workload, seed=seed))
            for spec in compared_specs(st, relay, adaptive):
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


def gap_pp(drc: Cell, nl: Cell, adaptive: Cell) -> float:
    """How far pdd-never-lose's BCR is below the better of pdd-adaptive and xdc-pd-drc, in points of
    xdc-pd-drc's BCR (negative: above it)."""
    best = max(drc.bcr, adaptive.bcr)
    ref = drc.bcr if drc.bcr > 0 else best
    return (best - nl.bcr) / ref * 100 if ref > 0 else 0.0


def goal_misses(drc: Cell, nl: Cell, adaptive: Cell) -> list[str]:
    """The parts of issue 46's goal a cell misses (empty: it meets it)."""
    out = []
    if nl.bcr < drc.bcr:
        out.append("BCR < drc")
    if nl.ttft_p99 > drc.ttft_p99:
        out.append("P99 > drc")
    if gap_pp(drc, nl, adaptive) > GOAL_PP:
        out.append(f"{gap_pp(drc, nl, adaptive):.1f} pp below best")
    return out


GOAL_HEAD = ("drc BCR", "adaptive BCR", "never-lose BCR", "vs drc", "gap to best", "bill/h",
             "TTFT p99 drc / never-lose / adaptive", "relayed (pool at k)", "goal")


def never_lose_report(cells: dict[tuple[str, int, str], Cell], load: str) -> str:
    regimes = list(dict.fromkeys(k[0] for k in cells))
    seeds = sorted({k[1] for k in cells})
    three = all((rg, sd, SYSTEMS[2]) in cells for rg in regimes for sd in seeds)
    head = ["regime", "seed", *(GOAL_HEAD if three else CELL_HEAD)]
    body, verdict, met, n = [], [], 0, 0
    for rg in regimes:
        deltas, wins = [], True
        for sd in seeds:
            a, b = cells[(rg, sd, SYSTEMS[0])], cells[(rg, sd, SYSTEMS[1])]
            deltas.append(bcr_change(a, b))
            wins &= b.bcr >= a.bcr and b.ttft_p99 <= a.ttft_p99
            if not three:
                body.append([rg, str(sd), *cell_row(a, b)])
                continue
            ad = cells[(rg, sd, SYSTEMS[2])]
            miss = goal_misses(a, b, ad)
            met += not miss
            n += 1
            body.append([rg, str(sd), f"{a.bcr:.4f}", f"{ad.bcr:.4f}", f"{b.bcr:.4f}", f"{bcr_change(a, b):+.1f}%",
                         f"{gap_pp(a, b, ad):+.1f} pp", f"{b.bill:.1f}",
                         f"{a.ttft_p99:.2f} / {b.ttft_p99:.2f} / {ad.ttft_p99:.2f}",
                         f"{b.relayed:.1%} ({b.pooled:.1%})", "yes" if not miss else "NO: " + ", ".join(miss)])
        verdict.append(f"  {rg:16s} BCR change {min(deltas):+.1f} .. {max(deltas):+.1f}% over "
                       f"{len(seeds)} seeds; BCR >= and TTFT p99 <= xdc-pd-drc in every seed: "
                       f"{'yes' if wins else 'NO'}")
    title = (f"pdd-never-lose vs xdc-pd-drc and pdd-adaptive (TTFT p99 and relayed share at {load}; the pool's "
             f"share and the bill at the goodput point; goal: BCR >= drc, P99 <= drc, within {GOAL_PP:g} pp of "
             f"the better of adaptive and drc)" if three else
             f"pdd-never-lose vs xdc-pd-drc (TTFT p99 and relayed share at {load})")
    tail = [f"  goal met in {met} of {n} cells"] if three else []
    return "\n".join([title, table(head, body), "", *verdict, *tail])
