"""Why P->RLD alone is excluded (docs/sim.md): a time series of the relay-only failure.

If low-hit requests finish on RLD, MD never sees those turns, so MD's radix cache for their
sessions falls behind P's; the next turns look low-hit to MD too and go to RLD again (a
ratchet), RLD fills up and TTFT explodes. With an overload guard on RLD (relay-only only while
RLD's occupancy is below a threshold) the router flips between the two regimes: it oscillates.
The run compares pdd-adaptive (both pipelines end at MD) with both relay-only variants.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from sglang_pdd.lab.workload.generator import generate
from sglang_pdd.lab.sim.cluster import Cluster
from sglang_pdd.lab.sim.paper import PaperSetting
from sglang_pdd.lab.sim.runner import typical_context
from sglang_pdd.lab.sim.systems import PoolSpec, RoutingSpec, make_system
from sglang_pdd.lab.sim.hardware import CHIP_A, CHIP_B
from sglang_pdd.lab.sim.report import table


@dataclass
class Series:
    name: str
    t: list[float] = field(default_factory=list)
    rld_usage: list[float] = field(default_factory=list)
    relay_only_share: list[float] = field(default_factory=list)  # of arrivals in the window
    md_hit: list[float] = field(default_factory=list)
    ttft_p90: list[float] = field(default_factory=list)


def _variants(s: PaperSetting) -> list:
    p = PoolSpec(CHIP_A, s.pdd_p_instances, s.instance_chips)
    md = PoolSpec(CHIP_B, s.pdd_md_instances, s.instance_chips)
    rld = PoolSpec(CHIP_A, 1, chips_per_instance=s.pdd_rld_chips)
    ratchet = RoutingSpec(allow_relay_only=True, relay_only_below_hit=0.9)
    guard = replace(ratchet, relay_only_max_rld_usage=0.8)
    return [make_system("pdd-adaptive", p, md, rld=rld, wan=s.wan),
            replace(make_system("pdd-relay-only", p, md, rld=rld, wan=s.wan, routing=ratchet),
                    name="relay-only"),
            replace(make_system("pdd-relay-only", p, md, rld=rld, wan=s.wan, routing=guard),
                    name="relay-only+guard")]


def run_oscillation(s: PaperSetting = PaperSetting(), rate: float = 14.0, window_s: float = 600.0,
                    bin_s: float = 20.0) -> list[Series]:
    wl = replace(s.workload, request_rate=rate, duration_s=window_s)
    reqs = generate(wl)
    ctx = typical_context(reqs)
    out = []
    for spec in _variants(s):
        c = Cluster(spec, s.model, s.eff, context_tokens=ctx, tpot_target_s=s.sla.tpot_s * 0.8)
        ser = Series(spec.name)
        usage: dict[int, list[float]] = {}

        def sample(c=c, usage=usage) -> None:
            usage.setdefault(int(c.loop.now // bin_s), []).append(
                float(np.mean([r.occupancy for r in c.R])))
            if c.loop.now < window_s:
                c.loop.after(2.0, sample)

        c.loop.at(0.0, sample)
        recs = c.run(reqs, until=window_s + 120.0)
        for b in range(int(window_s // bin_s)):
            lo, hi = b * bin_s, (b + 1) * bin_s
            rs = [r for r in recs if lo <= r.arrival_s < hi]
            if not rs:
                continue
            ser.t.append(lo)
            ser.rld_usage.append(float(np.mean(usage.get(b, [0.0]))))
            ser.relay_only_share.append(sum(r.pipeline == "P->RLD" for r in rs) / len(rs))
            ser.md_hit.append(float(np.mean([r.md_hit / r.input_len for r in rs])))
            tt = [r.ttft_s if r.finished else window_s for r in rs]
            ser.ttft_p90.append(float(np.percentile(tt, 90)))
        out.append(ser)
    return out


def oscillation_report(series: list[Series]) -> str:
    lines = ["Relay-only routing (P->RLD alone for MD hit < 0.9) vs PDD's two pipelines, "
             "per 20 s window: RLD occupancy | share routed P->RLD | MD hit | TTFT p90 (s)"]
    rows = []
    n = min(len(s.t) for s in series)
    for i in range(0, n, max(1, n // 15)):
        row = [f"{series[0].t[i]:.0f}"]
        for s in series:
            row.append(f"{s.rld_usage[i]:.2f} | {s.relay_only_share[i]:.2f} | "
                       f"{s.md_hit[i]:.2f} | {s.ttft_p90[i]:.1f}")
        rows.append(row)
    lines.append(table(["t (s)"] + [s.name for s in series], rows))
    for s in series:
        u = np.array(s.rld_usage)
        lines.append(f"{s.name}: RLD occupancy mean {u.mean():.2f}, std {u.std():.2f}; "
                     f"MD hit first/last third {np.mean(s.md_hit[: n // 3]):.3f}/"
                     f"{np.mean(s.md_hit[-n // 3:]):.3f}; TTFT p90 last third "
                     f"{np.mean(s.ttft_p90[-n // 3:]):.1f} s")
    return "\n".join(lines)
