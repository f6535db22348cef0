"""The bathtub: benefit-cost ratio against the mean prefix-hit rate (docs/sim.md).

For each hit rate h (requests of 64K tokens, hits uniform in h +- 0.2 %) the capacity of every
pool is measured at saturation with the simulator's own components:

* P: a prefill instance with a deep queue, run through the chunk scheduler (tail chunks alone,
  or batched as the "shallower tub" mitigation) -> requests/s per instance;
* D/MD: batch (TPOT-SLA and KV bound) / (output tokens x step time) -> requests/s per instance;
* WAN (cross-DC systems): link bytes/s over missed KV bytes per request.

Throughput is the smallest pool capacity; BCR is throughput per cost, and revenue-BCR weights
each request by what it is billed (cached input at `cached_price` of the uncached price).
This is a capacity model (no queueing, no SLA on TTFT), fast enough for a fine grid.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np

from sglang_pdd.lab.sim.cluster import decode_max_batch, pool_cost
from sglang_pdd.lab.sim.cost_model import CostModel
from sglang_pdd.lab.sim.engine import EventLoop
from sglang_pdd.lab.sim.paper import PaperSetting, baseline_spec, pdd_specs
from sglang_pdd.lab.sim.prefill import PrefillInstance, PrefillJob
from sglang_pdd.lab.sim.report import table
from sglang_pdd.lab.sim.systems import SystemSpec


@dataclass(frozen=True)
class Pricing:
    """Per-token list prices in one unit (only ratios matter): output 4x input, cached 0.2x."""

    input: float = 1.0
    cached_fraction: float = 0.2  # docs/sim.md §4 (Bathtub): cached input billed at 20 % (the paper: 10-25 %)
    output: float = 4.0


@dataclass
class BathtubPoint:
    hit: float
    p_rps: float  # per prefill instance
    d_rps: float  # per decode instance
    rps: dict[str, float] = field(default_factory=dict)
    wan_bound: dict[str, bool] = field(default_factory=dict)  # per cross-DC system: the line is its smallest capacity
    bcr: dict[str, float] = field(default_factory=dict)
    revenue_bcr: dict[str, float] = field(default_factory=dict)
    p_rps_batched_tail: float = 0.0
    p_rps_high_overhead: float = 0.0  # tails alone, with `high_overhead_s` per step
    p_rps_high_overhead_batched: float = 0.0

    def tail_penalty(self, high: bool = False) -> float:
        """Share of P throughput lost because tail chunks run alone."""
        a, b = ((self.p_rps_high_overhead, self.p_rps_high_overhead_batched) if high
                else (self.p_rps, self.p_rps_batched_tail))
        return max(0.0, 1.0 - a / b) if b > 0 else 0.0


def prefill_rps(cost: CostModel, hits: np.ndarray, length: int, chunk: int, batch_tails: bool) -> float:
    loop = EventLoop()
    p = PrefillInstance(loop, cost, "P", chunk, batch_tails, lambda key: None)
    p.capacity = 1 << 62  # saturation throughput, not memory
    for i, h in enumerate(hits):
        p.submit(PrefillJob(i, length, min(int(h * length), length - 1)))
    loop.run()
    return len(hits) / loop.now


def decode_rps(cost: CostModel, spec_pool, length: int, out: int, tpot_target: float) -> float:
    ctx = length + out // 2
    b = decode_max_batch(cost, spec_pool, ctx, tpot_target)
    return b / (out * cost.decode_step_s(b, b * ctx))


def run_bathtub(s: PaperSetting = PaperSetting(), hits: Optional[np.ndarray] = None,
                length: int = 64_000, out: int = 1000, samples: int = 60, spread: float = 0.002,
                pricing: Pricing = Pricing(), high_overhead_s: float = 0.05) -> list[BathtubPoint]:
    hits = np.round(np.arange(0.0, 1.0, 0.01), 2) if hits is None else hits
    rng = np.random.default_rng(0)
    systems: list[SystemSpec] = [baseline_spec(s, 4)] + [
        sp for sp in pdd_specs(s) if sp.name in ("xdc-pd-drc", "pdd-bw")]
    costs = {}
    for sp in systems:
        for pool in (sp.prefill, sp.decode):
            key = (pool.chip.name, pool.chips_per_instance)
            costs[key] = pool_cost(s.model, pool, s.eff)
    tpot = s.sla.tpot_s * 0.8
    d_cap = {sp.name: decode_rps(costs[(sp.decode.chip.name, sp.decode.chips_per_instance)],
                                 sp.decode, length, out, tpot) for sp in systems}
    points = []
    p_cost = costs[(systems[0].prefill.chip.name, systems[0].prefill.chips_per_instance)]
    p_pool = systems[0].prefill
    p_cost_hi = pool_cost(s.model, p_pool, replace(s.eff, step_overhead_s=high_overhead_s))
    for h in hits:
        hs = np.clip(h + rng.uniform(-spread, spread, samples), 0.0, 0.999)
        p1 = prefill_rps(p_cost, hs, length, systems[0].chunk_size, False)
        p2 = prefill_rps(p_cost, hs, length, systems[0].chunk_size, True)
        p3 = prefill_rps(p_cost_hi, hs, length, systems[0].chunk_size, False)
        p4 = prefill_rps(p_cost_hi, hs, length, systems[0].chunk_size, True)
        pt = BathtubPoint(float(h), p1, d_cap[systems[0].name], p_rps_batched_tail=p2,
                          p_rps_high_overhead=p3, p_rps_high_overhead_batched=p4)
        revenue = (length * (1 - h) * pricing.input + length * h * pricing.input * pricing.cached_fraction
                   + out * pricing.output)
        for sp in systems:
            caps = [p1 * sp.prefill.instances, d_cap[sp.name] * sp.decode.instances]
            if sp.wan is not None:
                missed = max(length * (1 - h), 1) * s.model.kv_bytes_per_token
                caps.append(sp.wan.bytes_per_s / missed)
                pt.wan_bound[sp.name] = caps[-1] <= min(caps[:-1])
            rps = min(caps)
            pt.rps[sp.name] = rps
            pt.bcr[sp.name] = rps / sp.price_per_hour
            pt.revenue_bcr[sp.name] = rps * revenue / sp.price_per_hour
        points.append(pt)
    return points


def bathtub_report(points: list[BathtubPoint]) -> str:
    names = list(points[0].bcr)
    rows = []
    for pt in points:
        if round(pt.hit * 100) % 5 and not _is_dip(points, pt, True):
            continue
        rows.append([f"{pt.hit:.2f}", f"{pt.p_rps:.3f}", f"{pt.tail_penalty() * 100:.1f}%",
                     f"{pt.p_rps_high_overhead:.3f}", f"{pt.tail_penalty(True) * 100:.1f}%",
                     f"{pt.d_rps:.2f}"] + [f"{pt.revenue_bcr[n]:.0f}" for n in names]
                    + [f"{pt.bcr[n] * 1e3:.1f}" for n in names])
    head = ["hit", "P req/s", "tail loss", "P req/s 50ms/step", "tail loss", "D req/s"]
    head += [f"rev-BCR {n}" for n in names] + [f"BCR x1e3 {n}" for n in names]
    lines = ["Bathtub: capacity per pool and BCR vs hit rate (64K input, 1K output); "
             "rows every 5 % plus the tail-chunk dips", table(head, rows)]
    for high, label in ((False, "default step overhead"), (True, "50 ms/step")):
        dips = [f"{p.hit:.2f} (-{p.tail_penalty(high) * 100:.1f} %)" for p in points
                if _is_dip(points, p, high)]
        lines.append(f"tail-chunk dips (P throughput lost to lone tail chunks, local maxima > 1 %), "
                     f"{label}: {', '.join(dips) or 'none'}")
    return "\n".join(lines)


def _is_dip(points: list[BathtubPoint], pt: BathtubPoint, high: bool = False) -> bool:
    """A local maximum of the tail-chunk penalty above 1 %."""
    i = points.index(pt)
    x = pt.tail_penalty(high)
    left = points[i - 1].tail_penalty(high) if i > 0 else 0.0
    right = points[i + 1].tail_penalty(high) if i + 1 < len(points) else 0.0
    return x > 0.01 and x >= left and x >= right
