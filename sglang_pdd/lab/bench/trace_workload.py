"""A recorded trace as the benchmark's workload (`--trace FILE`): a slice of it, scaled to the model.

The file is Mooncake's format (`timestamp`, `input_length`, `output_length`, `hash_ids`; recognised
by its fields, `workload.mooncake`) or ours (`WorkloadRequest.to_dict()` per line, what
`--export-trace` writes). A Mooncake trace is cut to a time window, compressed in time and scaled in
length as the simulator does it (the same `--trace-*` options), then to its first `max_requests`
records; every record is its own session, sent open loop at its (shifted) timestamp. The block ids
give the prompts: equal ids are equal tokens across requests, so the trace's prefix reuse is real
for the servers' caches. A window that starts after the trace does keeps the history before it:
each kept record whose prompt starts with blocks seen earlier in the trace gets a warm-up (that
prefix, sent before the measured window, as the generated presets' warm-ups), so the servers' caches
hold what the trace's would and the hit is the trace's own. `describe()` says what was cut and
scaled; the report carries it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Optional

from sglang_pdd.lab.workload.mooncake import MooncakeOptions, read_mooncake
from sglang_pdd.lab.workload.request import WorkloadRequest, truncate_segments
from sglang_pdd.lab.workload.trace import is_mooncake_file, read_jsonl


@dataclass(frozen=True)
class TraceSlice:
    path: str
    options: MooncakeOptions = field(default_factory=MooncakeOptions)
    max_requests: Optional[int] = None  # the first N records of the window (None: all)
    output_cap: Optional[int] = None  # bound on each request's output tokens after scaling (None: none)

    def __post_init__(self) -> None:
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError(f"--trace-requests must be >= 1, got {self.max_requests}")
        if self.output_cap is not None and self.output_cap < 1:
            raise ValueError(f"--trace-max-output must be >= 1, got {self.output_cap}")

    @property
    def name(self) -> str:
        base = self.path.replace("\\", "/").rsplit("/", 1)[-1]
        for ext in (".xz", ".gz", ".jsonl"):
            base = base[: -len(ext)] if base.endswith(ext) else base
        return base

    def requests(self) -> list[WorkloadRequest]:
        return list(_load(self)[0])

    def describe(self) -> str:
        return _load(self)[1]


def cut(reqs: list[WorkloadRequest], max_requests: Optional[int]) -> list[WorkloadRequest]:
    """The first `max_requests` measured requests by arrival (warm-ups of kept sessions kept), arrivals
    shifted so the first measured one is at 0."""
    measured = sorted((r for r in reqs if not r.warmup), key=lambda r: r.arrival_s)
    kept = measured if max_requests is None else measured[:max_requests]
    ids = {r.request_id for r in kept}
    sessions = {r.session_id for r in kept}
    out = [r for r in reqs if r.request_id in ids or (r.warmup and r.session_id in sessions)]
    t0 = kept[0].arrival_s if kept else 0.0
    return [replace(r, arrival_s=round(r.arrival_s - t0, 6)) for r in out]


def with_history(window: list[WorkloadRequest], history: list[WorkloadRequest]) -> list[WorkloadRequest]:
    """`window`'s requests with their prefix hit over the whole `history` (the same records read from
    the trace's start) and, before each one with a hit, a warm-up holding that prefix."""
    hit = {r.request_id: r.prefix_hit_len for r in history}
    out = []
    for r in window:
        h = hit.get(r.request_id, r.prefix_hit_len)
        if h > 0:
            out.append(replace(r, request_id=f"{r.request_id}-warm-up", warmup=True, turn=0, input_len=h,
                               prefix_hit_len=0, max_output_tokens=1, segments=tuple(truncate_segments(r.segments, h)),
                               arrival_s=round(r.arrival_s - 0.001, 6), block_ids=(), block_tokens=0))
        out.append(replace(r, prefix_hit_len=h))
    return out


@functools.lru_cache(maxsize=4)
def _load(ts: TraceSlice) -> tuple[tuple[WorkloadRequest, ...], str]:
    if is_mooncake_file(ts.path):
        tr = read_mooncake(ts.path, ts.options, output_cap=ts.output_cap)
        reqs = cut(tr.requests, ts.max_requests)
        if not reqs:
            raise ValueError(f"--trace {ts.path}: no record left ({tr.describe()})")
        parts = [tr.describe()]
        if ts.max_requests is not None and len(tr.requests) > len(reqs):
            parts.append(f"the first {len(reqs)} of them kept")
        if ts.options.start_s > 0:
            reqs = with_history(reqs, read_mooncake(ts.path, replace(ts.options, start_s=0.0),
                                                    output_cap=ts.output_cap).requests)
            n = sum(r.warmup for r in reqs)
            parts.append(f"{n} warm-ups hold the prefixes seen before the window (hits as in the whole trace)")
        if ts.output_cap is not None:
            parts.append(f"outputs capped at {ts.output_cap} tokens")
        span = max(r.arrival_s for r in reqs)
        parts.append(f"replayed open loop over {span:.0f} s from the first kept arrival")
        return tuple(reqs), "; ".join(parts)
    if ts.options != MooncakeOptions() or ts.output_cap is not None:
        raise ValueError("--trace-from/--trace-to/--trace-speedup/--trace-length-scale/--trace-max-context/"
                         "--trace-max-output apply to Mooncake-format traces only; "
                         f"{ts.path} is a benchmark trace (WorkloadRequest JSONL)")
    reqs = cut(read_jsonl(ts.path), ts.max_requests)
    if not reqs:
        raise ValueError(f"--trace {ts.path}: no request in it")
    n = sum(not r.warmup for r in reqs)
    return tuple(reqs), f"{n} measured requests of the benchmark trace {ts.path} (unscaled)"


def options_text(o: MooncakeOptions) -> dict:
    """The Mooncake options as JSON-ready values (inf as None)."""
    return {"from_s": o.start_s, "to_s": None if math.isinf(o.end_s) else o.end_s, "speedup": o.speedup,
            "length_scale": o.length_scale, "max_context": o.max_context, "block_tokens": o.block_tokens}
