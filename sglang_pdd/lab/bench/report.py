"""The benchmark's outputs: `report.json` (everything), `report.md` (the table), and one
`calibration-<system>.json` per system in the simulator's calibration format
(`python -m sglang_pdd.lab.sim --calibrate calibration-<system>.json`, see sim/calibration.py).
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import asdict
from typing import Sequence

from sglang_pdd.lab.bench import cpu, hit_report, pdd_report, repeats
from sglang_pdd.lab.bench.metrics import RequestRecord, Summary
from sglang_pdd.lab.bench.trace_workload import options_text

logger = logging.getLogger(__name__)

MIB = 1024 * 1024

COLUMNS = ("system", "TTFT P50 (s)", "TTFT P90 (s)", "TTFT P99 (s)", "TPOT P50 (ms)", "TPOT P99 (ms)", "goodput",
           "goodput (req/s)", "WAN MiB/req", "KV MiB/req", "KV slices/req", "failed")


def _f(x: float | None, fmt: str) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def table_rows(summaries: Sequence[Summary]) -> list[list[str]]:
    rows = []
    for s in summaries:
        rows.append([
            s.system, _f(s.ttft_p50_s, ".2f"), _f(s.ttft_p90_s, ".2f"), _f(s.ttft_p99_s, ".2f"),
            _f(s.tpot_p50_s * 1e3 if s.tpot_p50_s == s.tpot_p50_s else None, ".1f"),
            _f(s.tpot_p99_s * 1e3 if s.tpot_p99_s == s.tpot_p99_s else None, ".1f"),
            f"{s.goodput_requests}/{s.requests} ({s.goodput_share:.0%})", _f(s.goodput_rps, ".3f"),
            _f(s.wan_bytes_per_request / MIB if s.wan_bytes_per_request is not None else None, ".2f"),
            _f(s.kv_bytes_per_request / MIB if s.kv_bytes_per_request is not None else None, ".2f"),
            _f(s.kv_slices_per_request, ".0f"), str(s.failed)])
    return rows


def markdown_table(summaries: Sequence[Summary]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r) + " |" for r in table_rows(summaries)]
    return "\n".join(lines)


def text_table(summaries: Sequence[Summary]) -> str:
    rows = [list(COLUMNS)] + table_rows(summaries)
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in rows)


def tiny_model_spec(info: dict) -> dict:
    """The tiny model as the simulator's ModelSpec fields (sim.model.ModelSpec)."""
    spec = info["spec"]
    params = float(info.get("parameters", 0)) or 1.0
    return {"name": "tiny-llama-testbed", "layers": spec["layers"], "hidden": spec["hidden"],
            "heads": spec["heads"], "head_dim": spec["head_dim"],
            "kv_bytes_per_token": int(info["kv_bytes_per_token"]), "total_params": params,
            "active_params": params, "weight_bytes_per_param": 4.0 if spec["dtype"] == "float32" else 2.0}


def calibration_report(sim_name: str, trace: str, records: Sequence[RequestRecord], link: dict,
                       model: dict | None) -> dict:
    """A system's measured requests in sim/calibration.py's report format (closed loop)."""
    rate = link.get("rate_mbit")
    d = {"system": sim_name, "trace": trace, "closed_loop": True,
         "wan": {"bandwidth_gbps": (rate / 1000.0) if rate else 1000.0,
                 "rtt_s": 2 * link.get("delay_ms", 0.0) / 1000.0, "jitter": 0.0},
         "requests": [{"request_id": r.request_id, "ttft_s": r.ttft_s, "tpot_s": r.tpot_s}
                      for r in records if r.ok]}
    if model is not None:
        d["model"] = model
    return d


def report_dict(run) -> dict:
    """Everything about a `runner.BenchRun`, JSON-ready."""
    p = run.preset
    return {
        "preset": p.name,
        "workload": workload_dict(p),
        "sla": asdict(p.sla),
        "link": run.testbed,
        "model": run.model_info.get("spec", {}) | {"kv_bytes_per_token": run.model_info.get("kv_bytes_per_token")},
        "trace": os.path.basename(run.trace_path),
        "runtime_s": run.runtime_s,
        "client": getattr(run, "client", "") or ("client threads in cluster A stream /generate from each "
                                                 "system's router in A (upstream mini-lb for the baselines, "
                                                 "the PDD router for pdd*)"),
        "hit_histogram": hit_report.histograms(run.systems),
        "server_flags": list(getattr(run, "server_flags", ())),
        "placement": getattr(run, "placement", {}),
        "repeats": getattr(run, "repeats", 1),
        "baseline": getattr(run, "baseline", None),
        "over_repeats": repeat_aggregate(run),
        "systems": {(s.label or s.name): {
            "system": s.name, "repeat": s.repeat, "cpu": s.cpu,
            "sim_name": s.sim_name, "description": s.description, "startup_s": s.startup_s,
            "warmup_failed": s.warmup_failed, "error": s.error, "cpu_s": s.cpu_s,
            "summary": s.summary.to_dict() if s.summary else None,
            "pdd": pdd_report.pdd_stats(s.records) if any(r.pipeline for r in s.records) else None,
            "wan": {"a_to_b": s.wan.a_to_b, "b_to_a": s.wan.b_to_a, "kv_sent": s.wan.kv_sent},
            "background": s.background or None,
            "requests": [r.to_dict() for r in s.records]} for s in run.systems},
    }


def workload_dict(p) -> dict:
    """What was replayed: the generated preset's knobs, or the recorded trace's slice and scaling."""
    if p.trace is not None:
        t = p.trace
        return {"trace": t.name, "description": t.describe(), "options": options_text(t.options),
                "max_requests": t.max_requests, "output_cap": t.output_cap}
    return {"seed": p.workload.seed, "hit_histogram": p.workload.hit_histogram.to_spec(),
            "max_sessions": p.max_sessions, "max_turns": p.max_turns,
            "input_len": asdict(p.workload.input_len), "output_len": asdict(p.workload.output_len),
            "description": p.describe_workload()}


def repeat_aggregate(run) -> dict:
    per: dict[str, list] = {}
    for s in run.systems:
        per.setdefault(s.name, [])
        per[s.name].append(repeats.figures(s.summary, s.records) if s.summary else None)
    return repeats.aggregate(per, getattr(run, "baseline", None))


def idle_statement(run) -> str:
    flags = list(getattr(run, "server_flags", ()))
    if not flags:
        return "Idle behaviour: each server's own default (PDD roles wait, plain servers spin as upstream)."
    return (f"Idle behaviour: every sglang server of every system, baselines included, ran with `{' '.join(flags)}` "
            "(docs/idle.md).")


def _clean(x):
    """NaN -> None, so the JSON is standard."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def write_reports(run, out_dir: str) -> dict[str, str]:
    """Write report.json, report.md and calibration-<system>.json; returns name -> path."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    rep = _clean(report_dict(run))
    paths["json"] = os.path.join(out_dir, "report.json")
    with open(paths["json"], "w", encoding="utf-8") as f:
        json.dump(rep, f, indent=1)
    model = tiny_model_spec(run.model_info) if run.model_info else None
    for s in run.systems:
        if not s.records:
            continue
        path = os.path.join(out_dir, f"calibration-{s.label or s.name}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(_clean(calibration_report(s.sim_name, os.path.abspath(run.trace_path), s.records,
                                                run.testbed, model)), f, indent=1)
        paths[f"calibration-{s.label or s.name}"] = path
    summaries = [s.summary for s in run.systems if s.summary]
    link = (f"Link: {run.testbed.get('delay_ms')} ms one way, {run.testbed.get('rate_mbit')} Mbit/s. " if run.testbed
            else f"Client: {getattr(run, 'client', '')}. ")
    md = [f"# Benchmark: preset `{run.preset.name}`", "", f"Workload: {run.preset.describe_workload()}.", "",
          f"SLA: TTFT <= {run.preset.sla.ttft_s} s and TPOT <= {run.preset.sla.tpot_s * 1e3:.0f} ms. "
          f"{link}Runtime {run.runtime_s:.0f} s.", ""]
    if run.testbed:
        md += [idle_statement(run), "", f"Placement: {_placement_text(getattr(run, 'placement', {}))}.", ""]
    md += _background_text(run)
    md += [markdown_table(summaries), ""]
    n = getattr(run, "repeats", 1)
    if n > 1:
        md += repeats.markdown(repeat_aggregate(run), getattr(run, "baseline", None), n)
    md += hit_report.markdown(run.systems)
    md += pdd_report.markdown(run.systems)
    md += cpu.markdown({(s.label or s.name): s.cpu for s in run.systems if s.cpu},
                       {(s.label or s.name): s.summary.window_s for s in run.systems if s.summary})
    for s in run.systems:
        if s.error:
            md.append(f"* `{s.name}` failed: {s.error} (logs: {s.log_dir})")
    paths["md"] = os.path.join(out_dir, "report.md")
    with open(paths["md"], "w", encoding="utf-8") as f:
        f.write("\n".join(md) + "\n")
    return paths


def _background_text(run) -> list[str]:
    """The bulk flow that shared the link (congested presets): what it was and what it got."""
    flows = [(s.label or s.name, s.background) for s in run.systems if s.background]
    if not flows:
        return []
    kind = flows[0][1]
    got = ", ".join(f"{label} {bg['mbit'].get(bg['direction'], 0.0):.1f}" for label, bg in flows)
    return [f"Background traffic: one {kind['kind']} flow {kind['direction']} over the whole measured window "
            f"(its bytes are left out of WAN MiB/req); it averaged (Mbit/s over the window): {got}.", ""]


def _placement_text(p: dict) -> str:
    if not p:
        return "not recorded"
    sets = p.get("cpu_sets", {})
    return (f"`{p.get('placement')}` (cluster A on CPUs {sets.get('A')}, cluster B on {sets.get('B')}; "
            f"{', '.join(p.get('unpinned', []))} unpinned; box CPUs {p.get('cpus')}; "
            f"torch threads per server: {_threads_text(p.get('threads') or {})}; "
            f"OMP_WAIT_POLICY: {p.get('omp_wait_policy', 'default')})")


def _threads_text(threads: dict) -> str:
    given = {m: n for m, n in threads.items() if n != "default"}
    if not given:
        return "torch's default (one per CPU it may run on)"
    return ", ".join(f"{m} {n}" for m, n in sorted(given.items())) + ", others torch's default"
