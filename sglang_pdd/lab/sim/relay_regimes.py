"""BCR of the RLD variants across WAN regimes (issue 17 item 6).

Four systems on the paper's setting: cross-DC PD with DRC (no RLD), pdd-bw with the paper's
dedicated RLD pool, pdd-bw with an elastic RLD (`elastic_relay`) and pdd-bw with RLD co-located
on P (`colocated_relay`). Regimes: a roomy line, the paper's 40 Gb/s line, a congested line
(section D's 25 Gb/s) and a fluctuating 40 Gb/s line (capacity redrawn every 10 s with 50 %
relative std instead of 15 % every 1 s).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from sglang_pdd.lab.sim.colocated_relay import colocated_system
from sglang_pdd.lab.sim.elastic_relay import elastic_system
from sglang_pdd.lab.sim.goodput import GoodputResult, max_goodput
from sglang_pdd.lab.sim.paper import PaperSetting, pdd_specs
from sglang_pdd.lab.sim.report import table
from sglang_pdd.lab.sim.runner import run_workload
from sglang_pdd.lab.sim.systems import SystemSpec
from sglang_pdd.lab.sim.wan import WanSpec


@dataclass(frozen=True)
class Regime:
    name: str
    gbps: float
    jitter: float = 0.15
    period_s: float = 1.0

    def wan(self, base: WanSpec) -> WanSpec:
        return replace(base, bandwidth_gbps=self.gbps, jitter=self.jitter,
                       jitter_period_s=self.period_s)


REGIMES = (Regime("roomy 100G", 100.0), Regime("paper 40G", 40.0),
           Regime("congested 25G", 25.0), Regime("fluctuating 40G", 40.0, 0.5, 10.0))


def relay_systems(s: PaperSetting, **variant_kw) -> list[SystemSpec]:
    """xdc-pd-drc, pdd-bw (dedicated RLD), pdd-elastic, pdd-colocated on `s.wan`."""
    specs = {sp.name: sp for sp in pdd_specs(s)}
    bw = specs["pdd-bw"]
    ekw = {k: v for k, v in variant_kw.items() if k in ("switch_s", "idle_back_s")}
    ckw = {k: v for k, v in variant_kw.items() if k in ("share", "interference")}
    return [specs["xdc-pd-drc"], bw, elastic_system(bw, **ekw), colocated_system(bw, **ckw)]


@dataclass
class RegimeRow:
    regime: Regime
    results: dict[str, GoodputResult]
    prices: dict[str, float]
    notes: dict[str, str]  # per variant, from one run at the probe load


def _notes(spec: SystemSpec, s: PaperSetting, rate: float) -> str:
    res = run_workload(spec, s.model, replace(s.workload, request_rate=rate), s.sla, eff=s.eff)
    c, m = res.cluster, res.summary
    relayed = 1.0 - m.pipelines.get("P->MD", 0.0)
    if hasattr(c, "spells"):
        spells = ", ".join(f"{a:.0f}-{'end' if b is None else f'{b:.0f}'} s" for a, b in c.spells)
        wanted = sorted(r.arrival_s for r in res.records
                        if r.pipeline != "P->MD" or "relay role not up" in r.route_reason)
        gap = max((b - a for a, b in zip(wanted, wanted[1:])), default=0.0)
        return (f"relayed {relayed:.1%}, host out of the P role {spells} ({c.fallbacks} "
                f"fallbacks to P->MD); longest gap between relayed arrivals {gap:.1f} s")
    if spec.name == "pdd-colocated":
        slowed = sum(p.cost.slowed_steps for p in c.P) / max(1, sum(p.steps for p in c.P))
        return f"relayed {relayed:.1%}, {slowed:.0%} of prefill steps slowed"
    return f"relayed {relayed:.1%}"


def run_relay_regimes(s: PaperSetting = PaperSetting(), regimes: Sequence[Regime] = REGIMES,
                      probe_rate: float = 16.0, **variant_kw) -> list[RegimeRow]:
    out = []
    for rg in regimes:
        st = replace(s, wan=rg.wan(s.wan))
        specs = relay_systems(st, **variant_kw)
        res = {sp.name: max_goodput(sp, s.model, s.workload, s.sla, lo=probe_rate / 2,
                                    iters=s.goodput_iters, eff=s.eff) for sp in specs}
        notes = {sp.name: _notes(sp, st, probe_rate) for sp in specs if sp.relay is not None}
        out.append(RegimeRow(rg, res, {sp.name: sp.price_per_hour for sp in specs}, notes))
    return out


def relay_regimes_report(rows: list[RegimeRow], probe_rate: float = 16.0) -> str:
    names = list(rows[0].results)
    head = ["system", "cost/h"] + [r.regime.name for r in rows]
    body = []
    for n in names:
        cells = [n, f"{rows[0].prices[n]:.1f}"]
        for r in rows:
            g, ref = r.results[n], r.results[names[0]]
            rel = (g.bcr / ref.bcr - 1) * 100 if ref.bcr > 0 else float("nan")
            cells.append(f"{g.bcr:.4f} ({rel:+.0f}%) {g.goodput_rps:.1f}/s")
        body.append(cells)
    lines = ["BCR (vs xdc-pd-drc) and SLA goodput, by WAN regime",
             table(head, body), "", f"at {probe_rate:.0f} req/s offered:"]
    for r in rows:
        for n, note in r.notes.items():
            lines.append(f"  {r.regime.name:16s} {n:14s} {note}")
    return "\n".join(lines)
