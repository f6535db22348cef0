"""The report's hit-rate histogram: the share of measured requests per prefix-hit bucket, for the
workload (its own expected hit: what an unbounded cache would reuse) and for each system (the cached
share of the prompt it reported, `meta_info.cached_tokens` / prompt tokens). The buckets are the
simulator's (`sim.trace_run`), so a trace's bench and simulator reports line up.
"""

from __future__ import annotations

from sglang_pdd.lab.workload.mooncake import hit_histogram

EDGES = (0.2, 0.5, 0.8, 0.95)
LABELS = ("<20%", "20-50%", "50-80%", "80-95%", ">=95%")


def histograms(systems) -> dict:
    """{"buckets", "workload": shares, "systems": {label: shares}} over each system's records."""
    first = next((s for s in systems if s.records), None)
    out: dict = {"buckets": list(LABELS), "workload": None, "systems": {}}
    if first is not None:
        out["workload"] = hit_histogram([r.hit_rate for r in first.records], EDGES)
    for s in systems:
        shares = [min(r.cached_tokens / r.prompt_tokens, 1.0) for r in s.records if r.ok and r.prompt_tokens]
        if shares:
            out["systems"][s.label or s.name] = hit_histogram(shares, EDGES)
    return out


def markdown(systems) -> list[str]:
    h = histograms(systems)
    if h["workload"] is None:
        return []
    rows = [("workload (expected)", h["workload"])] + [(f"{k}: cached (reported)", v) for k, v in h["systems"].items()]
    out = ["## Prefix hit per request (share of measured requests per bucket)", "",
           "| | " + " | ".join(LABELS) + " |", "|---|" + "---|" * len(LABELS)]
    out += [f"| {name} | " + " | ".join(f"{x:.0%}" for x in v) + " |" for name, v in rows]
    return out + [""]
