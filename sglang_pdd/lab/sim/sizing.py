"""Sizing: the cheapest mix of chips meeting the SLA at a given load.

Candidates are enumerated in order of price (P instances of A, one RLD instance of A, MD
instances of A or B for PDD; P and D instances of A for the same-DC baseline) and simulated
until the first that meets the SLA attainment; a capacity pre-filter skips mixes whose
decode pool cannot hold the load at all.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, replace
from typing import Optional

from sglang_pdd.lab.sim.cluster import decode_max_batch, pool_cost
from sglang_pdd.lab.sim.hardware import CHIP_A, CHIP_B
from sglang_pdd.lab.sim.metrics import Summary
from sglang_pdd.lab.sim.paper import PaperSetting
from sglang_pdd.lab.sim.report import summary_table
from sglang_pdd.lab.sim.runner import run_workload
from sglang_pdd.lab.sim.systems import PoolSpec, SystemSpec, make_system

logger = logging.getLogger(__name__)


@dataclass
class SizingResult:
    family: str
    spec: Optional[SystemSpec]
    summary: Optional[Summary]
    evaluated: int


def _decode_rps(s: PaperSetting, pool: PoolSpec, ctx: int, out: float) -> float:
    cost = pool_cost(s.model, pool, s.eff)
    b = decode_max_batch(cost, pool, ctx, s.sla.tpot_s * 0.8)
    return pool.instances * b / (out * cost.decode_step_s(b, b * ctx))


def candidates(s: PaperSetting, family: str, max_instances: int = 8) -> list[SystemSpec]:
    out = []
    rng = range(1, max_instances + 1)
    if family == "same-dc-pd":
        for p, d in itertools.product(rng, rng):
            out.append(make_system("same-dc-pd", PoolSpec(CHIP_A, p), PoolSpec(CHIP_A, d)))
    else:
        for p, d, rld, md_chip in itertools.product(rng, rng, (4, 8, 16), (CHIP_A, CHIP_B)):
            out.append(make_system(family, PoolSpec(CHIP_A, p), PoolSpec(md_chip, d),
                                   rld=PoolSpec(CHIP_A, 1, chips_per_instance=rld), wan=s.wan))
    return sorted(out, key=lambda sp: (sp.price_per_hour, sp.prefill.instances))


def cheapest(s: PaperSetting, family: str, load: float, max_evals: int = 40) -> SizingResult:
    wl = replace(s.workload, request_rate=load)
    w = s.workload
    ctx, out_len = int(w.input_len.mean + w.output_len.mean / 2), w.output_len.mean
    evaluated = 0
    for sp in candidates(s, family):
        # realised closed-loop rate is below the offered one; 0.6 x load is a safe lower bound
        if _decode_rps(s, sp.decode, ctx, out_len) < 0.6 * load:
            continue
        if evaluated >= max_evals:
            break
        evaluated += 1
        summ = run_workload(sp, s.model, wl, s.sla, eff=s.eff).summary
        logger.info("%s %s: attainment %.3f", family, sp.chips_label(), summ.attainment)
        if summ.attainment >= s.sla.attainment:
            return SizingResult(family, sp, summ, evaluated)
    return SizingResult(family, None, None, evaluated)


def sizing_report(s: PaperSetting = PaperSetting(), load: Optional[float] = None) -> str:
    load = load or 16.0
    results = [cheapest(s, f, load) for f in ("same-dc-pd", "pdd-bw")]
    lines = [f"Cheapest chip mix meeting the SLA (TTFT <= {s.sla.ttft_s} s, TPOT <= "
             f"{s.sla.tpot_s * 1e3:.0f} ms, {s.sla.attainment:.0%}) at {load:.1f} req/s offered"]
    found = [r for r in results if r.spec is not None]
    for r in results:
        if r.spec is None:
            lines.append(f"{r.family}: nothing passed within {r.evaluated} simulations")
        else:
            rld = f", RLD {r.spec.relay.chips} x {r.spec.relay.chip.name}" if r.spec.relay else ""
            lines.append(f"{r.family}: {r.spec.chips_label()} (P {r.spec.prefill.chips} x A{rld}, "
                         f"D/MD {r.spec.decode.chips} x {r.spec.decode.chip.name}), cost "
                         f"{r.spec.price_per_hour:.1f}/h, {r.evaluated} simulations")
    if found:
        lines.append(summary_table([r.summary for r in found]))
    if len(found) == 2:
        a, b = found
        lines.append(f"cost of {b.family} vs {a.family}: "
                     f"{(b.spec.price_per_hour / a.spec.price_per_hour - 1) * 100:+.1f} %")
    return "\n".join(lines)
