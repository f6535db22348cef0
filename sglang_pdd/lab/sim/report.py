"""Text tables for the simulator's outputs."""

from __future__ import annotations

import math
from typing import Sequence

from sglang_pdd.lab.sim.metrics import Summary
from sglang_pdd.lab.sim.paper import PAPER, PaperRow, assumptions


def _f(x: float, fmt: str = "{:.2f}") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(out)


def summary_table(summaries: Sequence[Summary]) -> str:
    rows = [[s.system, s.chips, _f(s.price_per_hour, "{:.1f}"), _f(s.attainment, "{:.3f}"),
             f"{_f(s.ttft_p50)}/{_f(s.ttft_p90)}/{_f(s.ttft_p99)}",
             f"{_f(s.tpot_p50 * 1e3, '{:.0f}')}/{_f(s.tpot_p99 * 1e3, '{:.0f}')}",
             _f(s.wan_gbps, "{:.1f}"), _f(s.rld_token_share * 100, "{:.1f}%"),
             _f(s.md_hit_mean, "{:.3f}")] for s in summaries]
    return table(["system", "chips", "cost/h", "SLA att.", "TTFT p50/p90/p99 s", "TPOT p50/p99 ms",
                  "WAN Gb/s", "RLD tok", "MD hit"], rows)


def _pct(new: float, old: float) -> float:
    return (new / old - 1.0) * 100 if old and not math.isnan(old) and old > 0 else float("nan")


def paper_report(res: dict) -> str:
    s, rows = res["setting"], res["rows"]
    base: PaperRow = rows[0]
    by = {r.spec.name: r for r in rows}
    out = [f"PDD paper scenario (docs/sim.md §3) — simulated, {res['runtime_s']:.1f} s wall", "",
           "Assumptions:"]
    out += [f"  - {a}" for a in assumptions(s)]
    out += ["", f"A. Goodput and cost (goodput search per system; BCR = goodput / cost per hour)"]
    trows = []
    for r in rows:
        g = r.goodput
        gp = g.goodput_rps if g else float("nan")
        bcr = g.bcr if g else float("nan")
        trows.append([r.label, r.spec.chips_label(), _f(r.spec.price_per_hour, "{:.1f}"),
                      _f(g.rate if g else float("nan"), "{:.1f}"), _f(gp), _f(bcr, "{:.4f}"),
                      _f(_pct(bcr, base.goodput.bcr), "{:+.1f}%"),
                      _f(_pct(gp, base.goodput.goodput_rps), "{:+.1f}%"),
                      _f(_pct(r.spec.price_per_hour, base.spec.price_per_hour), "{:+.1f}%")])
    out.append(table(["system", "chips", "cost/h", "load req/s", "goodput req/s", "BCR",
                      "BCR vs base", "goodput vs base", "cost vs base"], trows))
    out += ["", f"B. All systems at one load: {res['load']:.1f} req/s offered "
            f"(the cross-DC PD + DRC goodput point; {res['requests_at_load']} measured requests)"]
    out.append(summary_table([r.at_load for r in rows]))
    tight = res.get("tight_rows") or []
    if tight:
        out += ["", f"D. Congested line: WAN {s.tight_wan_gbps:.0f} Gbit/s (same deployments); "
                f"goodput search, then all at {s.tight_load:.0f} req/s offered"]
        out.append(table(["system", "chips", "goodput req/s", "BCR", "BCR vs base"],
                         [[r.label, r.spec.chips_label(), _f(r.goodput.goodput_rps), _f(r.goodput.bcr, "{:.4f}"),
                           _f(_pct(r.goodput.bcr, base.goodput.bcr), "{:+.1f}%")]
                          for r in tight if r.goodput is not None]))
        out.append(summary_table([r.at_load for r in tight]))
    # comparison with the paper
    pdd = by.get("pdd-bw") or by.get("pdd-adaptive")
    xdc, naive = by["xdc-pd-drc"].at_load, by["xdc-pd-naive"].at_load
    p = pdd.at_load
    tby = {r.spec.name: r for r in tight}
    out += ["", "C. Against the paper's headline numbers (PDD = pdd-bw unless noted; "
            f"{s.wan.bandwidth_gbps:.0f} Gbit/s = sections A/B, {s.tight_wan_gbps:.0f} Gbit/s = section D)"]

    def ttft_cut(a: Summary, b: Summary) -> str:
        return (f"{_pct(a.ttft_p50, b.ttft_p50):+.1f}% / {_pct(a.ttft_p90, b.ttft_p90):+.1f}% / "
                f"{_pct(a.ttft_p99, b.ttft_p99):+.1f}%")

    comp = [
        ["BCR gain vs same-DC baseline", f"{PAPER['bcr_gain'] * 100:+.1f}%",
         f"{_pct(pdd.goodput.bcr, base.goodput.bcr):+.1f}% @{s.wan.bandwidth_gbps:.0f}G (pdd-adaptive "
         f"{_pct(by['pdd-adaptive'].goodput.bcr, base.goodput.bcr):+.1f}%, xdc-pd-drc "
         f"{_pct(by['xdc-pd-drc'].goodput.bcr, base.goodput.bcr):+.1f}%)"
         + (f"; {_pct(tby['pdd-bw'].goodput.bcr, base.goodput.bcr):+.1f}% @{s.tight_wan_gbps:.0f}G "
            f"(xdc-pd-drc {_pct(tby['xdc-pd-drc'].goodput.bcr, base.goodput.bcr):+.1f}%)" if tby else "")],
        ["SLA goodput gain", f"{PAPER['goodput_gain'] * 100:+.1f}%",
         f"{_pct(pdd.goodput.goodput_rps, base.goodput.goodput_rps):+.1f}% @{s.wan.bandwidth_gbps:.0f}G"
         + (f"; {_pct(tby['pdd-bw'].goodput.goodput_rps, base.goodput.goodput_rps):+.1f}% "
            f"@{s.tight_wan_gbps:.0f}G" if tby else "")],
        ["hardware cost", f"-{PAPER['cost_reduction'][0] * 100:.1f}..-{PAPER['cost_reduction'][1] * 100:.1f}%",
         f"{_pct(pdd.spec.price_per_hour, base.spec.price_per_hour):+.1f}% "
         f"({pdd.spec.chips_label()} vs {base.spec.chips_label()}; paper 43 x A + 32 x B vs 88 x A)"],
        ["TTFT vs cross-DC PD+DRC, P50/P90/P99", f"-{PAPER['ttft_reduction'] * 100:.1f}%",
         f"{ttft_cut(p, xdc)} @{s.wan.bandwidth_gbps:.0f}G"
         + (f"; {ttft_cut(tby['pdd-bw'].at_load, tby['xdc-pd-drc'].at_load)} @{s.tight_wan_gbps:.0f}G"
            if tby else "")],
        ["TTFT vs naive cross-DC PD", "", f"{ttft_cut(p, naive)} @{s.wan.bandwidth_gbps:.0f}G (naive is link-bound)"],
        ["RLD share of output tokens", f"{PAPER['rld_token_share'] * 100:.1f}%",
         f"{p.rld_token_share * 100:.1f}% @{s.wan.bandwidth_gbps:.0f}G (pdd-adaptive "
         f"{by['pdd-adaptive'].at_load.rld_token_share * 100:.1f}%)"
         + (f"; {tby['pdd-bw'].at_load.rld_token_share * 100:.1f}% @{s.tight_wan_gbps:.0f}G "
            f"(pdd-adaptive {tby['pdd-adaptive'].at_load.rld_token_share * 100:.1f}%)" if tby else "")],
        ["WAN bandwidth reduction", f"~{PAPER['wan_reduction_x']:.0f}x",
         f"{1 / max(1 - p.md_hit_mean, 1e-9):.1f}x fewer KV bytes to ship (MD hit {p.md_hit_mean:.3f}); "
         f"measured {naive.wan_gbps:.1f} Gb/s naive (link-capped) vs {p.wan_gbps:.1f} Gb/s PDD"],
    ]
    out.append(table(["figure", "paper", "simulated"], comp))
    return "\n".join(out)
