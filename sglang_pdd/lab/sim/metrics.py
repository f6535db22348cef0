"""What a run is judged by: TTFT/TPOT percentiles, SLA attainment and goodput, cost, BCR, the
WAN bytes, and the share of output tokens RLD produced."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np

from sglang_pdd.lab.sim.records import RequestRecord


@dataclass(frozen=True)
class Sla:
    ttft_s: float = 10.0
    tpot_s: float = 0.1
    attainment: float = 0.9  # goodput = highest rate at which this share meets both


def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


@dataclass
class Summary:
    system: str
    chips: str
    price_per_hour: float
    requests: int
    finished: int
    window_s: float
    ttft_p50: float
    ttft_p90: float
    ttft_p99: float
    tpot_p50: float
    tpot_p90: float
    tpot_p99: float
    attainment: float  # share of requests meeting the SLA (unfinished ones miss it)
    sla_rps: float  # requests meeting the SLA per second of the window, at this load
    wan_gb: float
    wan_gbps: float  # mean over the run's span
    rld_token_share: float
    md_hit_mean: float
    pipelines: dict[str, float] = field(default_factory=dict)
    handoffs: dict[str, int] = field(default_factory=dict)
    goodput_rps: float = float("nan")  # filled by the goodput search
    bcr: float = float("nan")  # goodput_rps per cost unit per hour

    def as_dict(self) -> dict:
        return asdict(self)


def summarize(system: str, chips: str, price: float, records: Sequence[RequestRecord],
              window_s: float, sla: Sla, wan_bytes: float, span_s: float = 0.0) -> Summary:
    """`window_s`: the workload window (goodput per second of it); `span_s`: first arrival to
    last event (the WAN's mean rate is over the span, since transfers run into the drain)."""
    done = [r for r in records if r.finished]
    ttft = [r.ttft_s for r in done]
    tpot = [r.tpot_s for r in done if r.output_len > 1]
    meet = sum(1 for r in done if r.meets(sla.ttft_s, sla.tpot_s))
    n = len(records)
    out_tokens = sum(r.output_len for r in done)
    pipes: dict[str, float] = {}
    hand: dict[str, int] = {}
    for r in records:
        pipes[r.pipeline] = pipes.get(r.pipeline, 0) + 1 / max(n, 1)
        if r.handoff_mode:
            hand[r.handoff_mode] = hand.get(r.handoff_mode, 0) + 1
    return Summary(
        system=system, chips=chips, price_per_hour=price, requests=n, finished=len(done),
        window_s=window_s,
        ttft_p50=pct(ttft, 50), ttft_p90=pct(ttft, 90), ttft_p99=pct(ttft, 99),
        tpot_p50=pct(tpot, 50), tpot_p90=pct(tpot, 90), tpot_p99=pct(tpot, 99),
        attainment=meet / n if n else float("nan"), sla_rps=meet / window_s,
        wan_gb=wan_bytes / 1e9, wan_gbps=wan_bytes * 8 / 1e9 / max(span_s, window_s),
        rld_token_share=sum(r.tokens_rld for r in done) / out_tokens if out_tokens else 0.0,
        md_hit_mean=float(np.mean([r.md_hit / r.input_len for r in records])) if n else 0.0,
        pipelines=pipes, handoffs=hand)
