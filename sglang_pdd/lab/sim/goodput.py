"""SLA goodput: the highest load at which a deployment still meets its SLA.

Goodput is the rate of SLA-meeting requests (per second of the workload window) at the highest
offered session load whose attainment is at least `Sla.attainment`, found by bisection on the
workload's `request_rate` with everything else (seed included) fixed. BCR is goodput per unit
of hardware cost per hour.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Callable, Optional

from sglang_pdd.lab.workload.generator import WorkloadConfig
from sglang_pdd.lab.sim.hardware import Efficiency
from sglang_pdd.lab.sim.metrics import Sla, Summary
from sglang_pdd.lab.sim.model import ModelSpec
from sglang_pdd.lab.sim.runner import RunResult, run_workload
from sglang_pdd.lab.sim.systems import SystemSpec

logger = logging.getLogger(__name__)


@dataclass
class GoodputResult:
    rate: float  # offered request_rate at the best passing point
    summary: Optional[Summary]  # that run (goodput_rps and bcr filled in)
    runs: int
    run: Optional[RunResult] = None  # the best passing run (its records and cluster)

    @property
    def goodput_rps(self) -> float:
        return self.summary.goodput_rps if self.summary else 0.0

    @property
    def bcr(self) -> float:
        return self.summary.bcr if self.summary else 0.0


def _passes(res: RunResult, sla: Sla) -> bool:
    return res.summary.attainment >= sla.attainment


def max_goodput(spec: SystemSpec, model: ModelSpec, wl: WorkloadConfig, sla: Sla,
                lo: float = 0.5, hi: float = 64.0, iters: int = 6,
                eff: Efficiency = Efficiency()) -> GoodputResult:
    return search_goodput(spec, sla, lambda rate: run_workload(
        spec, model, replace(wl, request_rate=rate), sla, eff=eff), lo, hi, iters)


def search_goodput(spec: SystemSpec, sla: Sla, run_at: Callable[[float], RunResult],
                   lo: float, hi: float, iters: int) -> GoodputResult:
    """The highest `rate` (any load knob: request rate, a trace's time compression) at which
    `run_at(rate)` passes the SLA: doubling from `lo`, then `iters` log-space bisections."""
    runs = 0
    best: Optional[RunResult] = None
    best_rate = 0.0

    def attempt(rate: float) -> bool:
        nonlocal runs, best, best_rate
        runs += 1
        res = run_at(rate)
        ok = _passes(res, sla)
        logger.info("%s @ %.2f: attainment %.3f", spec.name, rate, res.summary.attainment)
        if ok and rate > best_rate:
            best, best_rate = res, rate
        return ok

    if not attempt(lo):
        return GoodputResult(0.0, None, runs)
    # bracket by doubling, then bisect in log space
    r = lo
    while r < hi:
        nxt = min(r * 2, hi)
        if not attempt(nxt):
            hi = nxt
            break
        r = nxt
    else:
        hi = r
    lo_ok = best_rate
    for _ in range(iters):
        if hi / lo_ok < 1.04:
            break
        mid = (lo_ok * hi) ** 0.5
        if attempt(mid):
            lo_ok = mid
        else:
            hi = mid
    s = best.summary
    s.goodput_rps = s.sla_rps
    s.bcr = s.goodput_rps / s.price_per_hour  # the run's bill (an elastic pool's varies)
    return GoodputResult(best_rate, s, runs, best)
