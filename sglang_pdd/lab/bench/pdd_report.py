"""The PDD part of the benchmark report: what the router did and what it cost, per PDD system.

* pipelines: requests per pipeline (P->MD, P->RLD->MD, P->RLD) and handoffs per mode (one-shot,
  catch-up, as RelayDecode chose them);
* TPOT P50/P99 of the requests that went through a handoff (MD's step hiccup shows there);
* odd traffic: requests served P->RLD because their WAN transfer would outlast their decode, and the
  WAN bytes that were therefore never sent (MD's predicted missed KV at the choice);
* drift: over the measured window cut in thirds (by send time), the mean MD hit the router saw
  (prompt share already in MD's cache), the workload's prefix hit (what P's cache holds), and the
  mean requests in flight on RLD when each request was routed. With P->RLD allowed for low-hit
  requests (`pdd-relay-only`), MD's hit falls behind P's and RLD's load climbs; with the PDD policy
  they stay level.
"""

from __future__ import annotations

import math
from typing import Sequence

from sglang_pdd.lab.bench.metrics import RequestRecord, percentile

MIB = 1 << 20


def _mean(xs) -> float:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else math.nan


def _ms(x: float) -> str:
    return "n/a" if x != x else f"{x * 1e3:.1f}"


def pdd_stats(records: Sequence[RequestRecord]) -> dict:
    ok = [r for r in records if r.ok]
    pipes: dict[str, int] = {}
    modes: dict[str, int] = {}
    for r in ok:
        pipes[r.pipeline] = pipes.get(r.pipeline, 0) + 1
        if r.handoff_tokens is not None:
            modes[r.handoff_mode or "unknown"] = modes.get(r.handoff_mode or "unknown", 0) + 1
    handed = [r for r in ok if r.handoff_tokens is not None]
    odd = [r for r in ok if r.pipeline == "P->RLD" and r.route_reason.startswith("odd")]
    relay_only = [r for r in ok if r.pipeline == "P->RLD" and not r.route_reason.startswith("odd")]
    thirds = []
    if ok:
        t0, t1 = min(r.sent_s for r in ok), max(r.sent_s for r in ok)
        span = (t1 - t0) or 1.0
        for i in range(3):
            part = [r for r in ok if min(2, int(3 * (r.sent_s - t0) / span)) == i]
            thirds.append({
                "requests": len(part),
                "md_hit": _mean([r.md_hit / r.prompt_tokens for r in part if r.md_hit is not None and r.prompt_tokens]),
                "p_hit": _mean([r.hit_rate for r in part]),
                "rld_in_flight": _mean([r.rld_in_flight for r in part]),
            })
    return {
        "pipelines": pipes, "handoff_modes": modes,
        "handoff_tpot_p50_s": percentile([r.tpot_s for r in handed], 50),
        "handoff_tpot_p99_s": percentile([r.tpot_s for r in handed], 99),
        "odd_requests": len(odd), "odd_wan_bytes_avoided": sum(r.missed_bytes or 0 for r in odd),
        "relay_only_requests": len(relay_only),
        "relay_only_wan_bytes_avoided": sum(r.missed_bytes or 0 for r in relay_only),
        "thirds": thirds,
    }


def markdown(systems) -> list[str]:
    """Lines of the report's PDD section for the systems that went through the PDD router."""
    rows = [((getattr(s, "label", "") or s.name), pdd_stats(s.records)) for s in systems if any(r.pipeline for r in s.records)]
    if not rows:
        return []
    out = ["## PDD: pipelines, handoff modes, odd traffic", "",
           "| system | pipelines | handoff modes | handoff TPOT P50 / P99 (ms) | odd: requests, WAN MiB avoided "
           "| relay-only: requests, WAN MiB avoided |", "|---|---|---|---|---|---|"]
    for name, st in rows:
        pipes = ", ".join(f"{k or '?'} {v}" for k, v in sorted(st["pipelines"].items()))
        modes = ", ".join(f"{k} {v}" for k, v in sorted(st["handoff_modes"].items())) or "none"
        out.append(f"| {name} | {pipes} | {modes} | {_ms(st['handoff_tpot_p50_s'])} / {_ms(st['handoff_tpot_p99_s'])} "
                   f"| {st['odd_requests']}, {st['odd_wan_bytes_avoided'] / MIB:.1f} "
                   f"| {st['relay_only_requests']}, {st['relay_only_wan_bytes_avoided'] / MIB:.1f} |")
    out += ["", "Drift over the window (thirds by send time): MD hit the router saw / workload (P) hit / "
            "mean requests in flight on RLD at routing.", "",
            "| system | first third | second third | last third |", "|---|---|---|---|"]
    for name, st in rows:
        cells = [f"{t['md_hit']:.2f} / {t['p_hit']:.2f} / {t['rld_in_flight']:.1f} (n={t['requests']})"
                 if t["requests"] else "-" for t in st["thirds"]]
        out.append(f"| {name} | " + " | ".join(cells + ["-"] * (3 - len(cells))) + " |")
    return out + [""]
