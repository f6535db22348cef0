"""Run one deployment on one workload and summarise it."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Optional, Sequence

from sglang_pdd.lab.workload.generator import WorkloadConfig, generate, measured
from sglang_pdd.lab.workload.request import WorkloadRequest
from sglang_pdd.lab.sim.cluster import Cluster
from sglang_pdd.lab.sim.hardware import Efficiency
from sglang_pdd.lab.sim.metrics import Sla, Summary, summarize
from sglang_pdd.lab.sim.model import ModelSpec
from sglang_pdd.lab.sim.records import RequestRecord
from sglang_pdd.lab.sim.systems import SystemSpec

logger = logging.getLogger(__name__)


@dataclass
class RunResult:
    summary: Summary
    records: list[RequestRecord]
    cluster: Cluster


def typical_context(reqs: Sequence[WorkloadRequest]) -> int:
    """Mean KV tokens a decoding request holds: prompt plus half its output."""
    m = measured(reqs)
    if not m:
        return 1
    return int(sum(r.input_len + r.max_output_tokens / 2 for r in m) / len(m))


def run(spec: SystemSpec, model: ModelSpec, reqs: Sequence[WorkloadRequest], sla: Sla,
        window_s: float, drain_s: float = 300.0, eff: Efficiency = Efficiency(),
        context_tokens: Optional[int] = None, closed_loop: bool = True) -> RunResult:
    ctx = context_tokens or typical_context(reqs)
    cls = getattr(spec, "cluster_class", Cluster)  # a relay variant's spec names its own
    cluster = cls(spec, model, eff, context_tokens=ctx, tpot_target_s=sla.tpot_s * 0.8)
    records = cluster.run(reqs, until=window_s + drain_s, closed_loop=closed_loop)
    wan = cluster.wan.bytes_sent if cluster.wan is not None else 0.0
    s = summarize(spec.name, spec.chips_label(), _bill(spec, cluster, records), records, window_s, sla, wan,
                  span_s=_span(records))
    logger.info("%s: %d/%d finished, %d events", spec.name, s.finished, s.requests,
                cluster.loop.processed)
    return RunResult(s, records, cluster)


def _bill(spec: SystemSpec, cluster: Cluster, records: Sequence[RequestRecord]) -> float:
    """The bill per hour: the spec's, or the run's mean where capacity is billed while up (an elastic
    relay pool: `bill_per_hour` over the first arrival to the last finish)."""
    bill = getattr(cluster, "bill_per_hour", None)
    if bill is None or not records:
        return spec.price_per_hour
    start = min(r.arrival_s for r in records)
    return bill(start, start + _span(records))


def _span(records: Sequence[RequestRecord]) -> float:
    """First arrival to last finish (or to the last arrival if nothing finished)."""
    if not records:
        return 0.0
    start = min(r.arrival_s for r in records)
    ends = [r.finish_s for r in records if r.finished] or [max(r.arrival_s for r in records)]
    return max(ends) - start


@functools.lru_cache(maxsize=32)
def cached_workload(wl: WorkloadConfig) -> tuple[WorkloadRequest, ...]:
    """Generated requests, shared by every system evaluated on the same configuration."""
    return tuple(generate(wl))


def run_workload(spec: SystemSpec, model: ModelSpec, wl: WorkloadConfig, sla: Sla,
                 **kw) -> RunResult:
    return run(spec, model, cached_workload(wl), sla, wl.duration_s, **kw)
