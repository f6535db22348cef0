"""Calibration: the same workload through the simulator and through the CPU testbed benchmark.

The benchmark (issue 3) is expected to write a report JSON of this shape (extra keys ignored):

    {"system": "pdd-bw",                       # one of sim.systems.SYSTEM_NAMES
     "trace": "trace.jsonl",                   # the workload it replayed (or pass --trace)
     "closed_loop": true,                      # turns sent after the previous one completed
     "wan": {"bandwidth_gbps": 0.2, "rtt_s": 0.02, "jitter": 0.0},
     "model": {...ModelSpec fields...},        # optional, default presets.TINY_MODEL
     "requests": [{"request_id": "s0-t1", "ttft_s": 0.41, "tpot_s": 0.03}, ...]}

`python -m sglang_pdd.lab.sim --calibrate REPORT.json [--trace TRACE.jsonl]` replays the trace
through the simulated deployment (presets.tiny_system, the testbed's shape) and prints predicted
vs measured TTFT/TPOT percentiles side by side, plus the per-request error. `report_from_records`
writes the same format from a simulation, so the pipeline can be checked end to end today.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from sglang_pdd.lab.workload.trace import read_jsonl
from sglang_pdd.lab.sim.metrics import Sla
from sglang_pdd.lab.sim.model import ModelSpec
from sglang_pdd.lab.sim.presets import TINY_MODEL, tiny_system
from sglang_pdd.lab.sim.records import RequestRecord
from sglang_pdd.lab.sim.report import table
from sglang_pdd.lab.sim.runner import run
from sglang_pdd.lab.sim.wan import WanSpec

logger = logging.getLogger(__name__)


@dataclass
class Calibration:
    system: str
    matched: int
    measured_only: int
    predicted_only: int
    rows: list[list[str]]
    ttft_median_abs_err_s: float
    ttft_median_ratio: float  # measured / predicted


def report_from_records(records: Sequence[RequestRecord], system: str, trace: str,
                        wan: Optional[WanSpec] = None, closed_loop: bool = True) -> dict:
    d = {"system": system, "trace": trace, "closed_loop": closed_loop,
         "requests": [{"request_id": r.request_id, "ttft_s": r.ttft_s, "tpot_s": r.tpot_s,
                       "pipeline": r.pipeline} for r in records if r.finished]}
    if wan is not None:
        d["wan"] = {"bandwidth_gbps": wan.bandwidth_gbps, "rtt_s": wan.rtt_s, "jitter": wan.jitter}
    return d


def calibrate(report: dict, trace_path: Optional[str] = None, window_s: Optional[float] = None,
              sla: Sla = Sla(ttft_s=2.0, tpot_s=0.1)) -> Calibration:
    trace = trace_path or report.get("trace")
    if not trace:
        raise ValueError("no trace: give --trace or a 'trace' key in the report")
    reqs = read_jsonl(trace)
    wan = WanSpec(**report["wan"]) if "wan" in report else None
    model = ModelSpec(**report["model"]) if "model" in report else TINY_MODEL
    spec = tiny_system(report["system"], wan=wan)
    window = window_s or max(r.arrival_s for r in reqs) + 1.0
    res = run(spec, model, reqs, sla, window, drain_s=3600.0,
              closed_loop=bool(report.get("closed_loop", True)))
    pred = {r.request_id: r for r in res.records if r.finished}
    meas = {m["request_id"]: m for m in report["requests"]}
    both = sorted(set(pred) & set(meas))
    rows = []
    for q in (50, 90, 99):
        pt = np.percentile([r.ttft_s for r in pred.values()], q) if pred else float("nan")
        mt = np.percentile([m["ttft_s"] for m in meas.values()], q) if meas else float("nan")
        pp = np.percentile([r.tpot_s for r in pred.values()], q) if pred else float("nan")
        mp = np.percentile([m.get("tpot_s", float("nan")) for m in meas.values()], q) if meas else float("nan")
        rows.append([f"P{q}", f"{pt:.3f}", f"{mt:.3f}", f"{pp * 1e3:.1f}", f"{mp * 1e3:.1f}"])
    err = [abs(pred[k].ttft_s - meas[k]["ttft_s"]) for k in both]
    ratio = [meas[k]["ttft_s"] / pred[k].ttft_s for k in both if pred[k].ttft_s > 0]
    return Calibration(report["system"], len(both), len(set(meas) - set(pred)),
                       len(set(pred) - set(meas)), rows,
                       float(np.median(err)) if err else float("nan"),
                       float(np.median(ratio)) if ratio else float("nan"))


def calibration_report(c: Calibration) -> str:
    return "\n".join([
        f"Calibration of {c.system}: {c.matched} requests matched by id "
        f"({c.measured_only} only measured, {c.predicted_only} only simulated)",
        table(["", "TTFT sim (s)", "TTFT testbed (s)", "TPOT sim (ms)", "TPOT testbed (ms)"], c.rows),
        f"per request: median |TTFT error| {c.ttft_median_abs_err_s:.3f} s, "
        f"median measured/simulated TTFT {c.ttft_median_ratio:.2f}"])


def calibrate_cli(report_path: str, trace_path: Optional[str], setting=None) -> int:
    report = json.loads(Path(report_path).read_text(encoding="utf-8"))
    print(calibration_report(calibrate(report, trace_path)))
    return 0
