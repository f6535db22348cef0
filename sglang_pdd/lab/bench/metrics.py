"""Per-request records and the per-system summary: percentiles, TPOT, SLA goodput, WAN bytes.

SLA goodput = requests that finished with TTFT <= the TTFT target *and* TPOT <= the TPOT target,
reported both as a share of the measured requests and per second of the measured window (first
send to last completion). A failed request never meets the SLA.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

from sglang_pdd.lab.bench.presets import Sla


@dataclass
class RequestRecord:
    request_id: str
    session_id: int
    turn: int
    input_len: int  # the workload's prompt length
    hit_rate: float  # the workload's prefix hit (reused tokens / input)
    sent_s: float  # relative to the start of the measured window
    ok: bool
    ttft_s: float | None = None
    e2e_s: float | None = None
    tpot_s: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0  # as the serving system reports it
    error: str = ""
    pipeline: str = ""  # PDD router's pipeline for this request (P->MD, P->RLD->MD, P->RLD)
    handoff_tokens: int | None = None
    handoff_mode: str = ""  # one-shot or catch-up (RLD's choice), empty without a handoff
    md_hit: int | None = None  # prompt tokens the router saw in MD's cache when it chose
    missed_bytes: int | None = None  # MD's predicted missed KV bytes at the choice
    rld_in_flight: int | None = None  # requests in flight on the chosen relay at the choice
    route_reason: str = ""  # why the router chose the pipeline

    @property
    def done_s(self) -> float:
        return self.sent_s + (self.e2e_s or 0.0)

    def meets(self, sla: Sla) -> bool:
        return (self.ok and self.ttft_s is not None and self.tpot_s is not None
                and self.ttft_s <= sla.ttft_s and self.tpot_s <= sla.tpot_s)

    def to_dict(self) -> dict:
        return asdict(self)


def percentile(values: Iterable[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), NaN for no values."""
    xs = sorted(v for v in values if v is not None and not math.isnan(v))
    if not xs:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class WanBytes:
    """Bytes over the WAN during the measured window: link counters (on the wire) and P's KV."""

    a_to_b: int = 0
    b_to_a: int = 0
    kv_sent: int | None = None  # P's sglang_pdd_transfer_bytes_total{kind="kv"}, None if unreadable
    kv_slices: int | None = None  # P's sglang_pdd_transfer_slices_total{kind="kv"}, None if unreadable

    @property
    def total(self) -> int:
        return self.a_to_b + self.b_to_a


@dataclass
class Summary:
    system: str
    requests: int
    failed: int
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p90_s: float
    tpot_p99_s: float
    e2e_p50_s: float
    window_s: float
    goodput_requests: int
    goodput_share: float
    goodput_rps: float
    wan_bytes_per_request: float | None  # None: the link was not counted (--base-url)
    kv_bytes_per_request: float | None
    output_tokens: int
    kv_slices_per_request: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(system: str, records: Sequence[RequestRecord], sla: Sla, wan: WanBytes,
              link_counted: bool = True) -> Summary:
    """`link_counted=False`: the WAN link's bytes are unknown (a live deployment), reported as None."""
    ok = [r for r in records if r.ok]
    n = len(records)
    window = (max(r.done_s for r in ok) - min(r.sent_s for r in records)) if ok else 0.0
    good = sum(r.meets(sla) for r in records)
    ttft = [r.ttft_s for r in ok]
    tpots = [r.tpot_s for r in ok]
    return Summary(
        system=system, requests=n, failed=n - len(ok),
        ttft_p50_s=percentile(ttft, 50), ttft_p90_s=percentile(ttft, 90), ttft_p99_s=percentile(ttft, 99),
        tpot_p50_s=percentile(tpots, 50), tpot_p90_s=percentile(tpots, 90), tpot_p99_s=percentile(tpots, 99),
        e2e_p50_s=percentile([r.e2e_s for r in ok], 50), window_s=window,
        goodput_requests=good, goodput_share=good / n if n else 0.0,
        goodput_rps=good / window if window > 0 else 0.0,
        wan_bytes_per_request=(wan.total / n if n else 0.0) if link_counted else None,
        kv_bytes_per_request=(wan.kv_sent / n if n else 0.0) if wan.kv_sent is not None else None,
        output_tokens=sum(r.output_tokens for r in ok),
        kv_slices_per_request=(wan.kv_slices / n if n else 0.0) if wan.kv_slices is not None else None)
