"""Mooncake-format request traces (the FAST'25 release): read them as `WorkloadRequest`s.

One JSON object per line: `timestamp` (ms from the start), `input_length`, `output_length` and
`hash_ids`, the ids of the prompt's 512-token blocks in order. Equal ids are the same block (the
same tokens), across requests and sessions, so two prompts share a cacheable prefix for as many
leading ids as they share. A file is recognised by those fields (`is_mooncake_record`).

Token identity: block `b` is `block_tokens` tokens drawn from a PRNG seeded by `b` alone
(`block_segment`), so equal ids give equal tokens in every request, and the partial last block of
a prompt (`input_length` is rarely a multiple of 512) is a *prefix* of block `b`'s tokens. Every
request carries these blocks as its `segments`, so `WorkloadRequest.token_ids(vocab)` gives the
concrete prompt the benchmark sends, equal to `token_ids_for_blocks(...)`.

Sessions: the format has none; each record is its own session (turn 1), replayed open loop at
its timestamp. Outputs: the trace has no block ids for outputs. A later turn that re-sends an
answer already has it among its `hash_ids`, so outputs matter for hits only through the cache
space they take (the simulator caches them as a block that never hits).

Options (`MooncakeOptions`): a time window, time compression, and a length scale for a model
with a smaller context. `MooncakeTrace.describe()` says what was applied.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Optional, Sequence

import numpy as np

from sglang_pdd.lab.workload.request import Segment, WorkloadRequest
from sglang_pdd.lab.workload.trace import open_text

BLOCK_TOKENS = 512
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
_SEED_BASE = 0x6D6F6F6E << 32  # "moon": keeps block seeds apart from the generator's small seeds


def is_mooncake_record(d: Mapping) -> bool:
    """A record in the Mooncake format (as opposed to our own `WorkloadRequest.to_dict()`)."""
    return all(k in d for k in FIELDS)


def block_seed(block_id: int) -> int:
    return _SEED_BASE + int(block_id)


def block_segment(block_id: int, length: int) -> Segment:
    """The first `length` tokens of block `block_id` (a prefix of the full block)."""
    return Segment(block_seed(block_id), length)


def token_ids_for_blocks(hash_ids: Sequence[int], input_length: int, vocab_size: int,
                         block_tokens: int = BLOCK_TOKENS, reserved_low: int = 16) -> list[int]:
    """The prompt of a Mooncake record: its blocks' tokens, cut at `input_length`.
    Deterministic: equal ids give equal tokens everywhere."""
    need = math.ceil(input_length / block_tokens) if input_length > 0 else 0
    if len(hash_ids) < need:
        raise ValueError(f"input_length {input_length} needs {need} blocks of {block_tokens} "
                         f"tokens, hash_ids has {len(hash_ids)}")
    out: list[int] = []
    for i, b in enumerate(hash_ids[:need]):
        n = min(block_tokens, input_length - i * block_tokens)
        out.extend(block_segment(b, block_tokens).expand(vocab_size, reserved_low)[:n].tolist())
    return out


def add_trace_options(group) -> None:
    """The --trace-* options of a Mooncake-format replay (the simulator's and the benchmark's CLIs);
    `options_from(args)` reads them back."""
    group.add_argument("--trace-from", type=float, default=0.0, help="keep records from this trace time, s (default 0)")
    group.add_argument("--trace-to", type=float, default=float("inf"),
                       help="keep records before this trace time, s (default: to the end)")
    group.add_argument("--trace-speedup", type=float, default=1.0,
                       help="compress time: replay k x faster, k < 1 slower (default 1)")
    group.add_argument("--trace-length-scale", type=float, default=1.0,
                       help="scale block size, prompt and output lengths by this factor in (0, 1], for a model "
                            "with a smaller context or a slower box (default 1)")
    group.add_argument("--trace-max-context", type=int, default=None,
                       help="drop records whose scaled input + output exceed this (default: keep all)")


def options_from(args) -> "MooncakeOptions":
    """MooncakeOptions from `add_trace_options`' arguments; ValueError naming --trace-* when out of range."""
    try:
        return MooncakeOptions(args.trace_from, args.trace_to, args.trace_speedup, args.trace_length_scale,
                               args.trace_max_context)
    except ValueError as e:
        raise ValueError(f"--trace-*: {e}") from None


@dataclass(frozen=True)
class MooncakeOptions:
    start_s: float = 0.0  # keep records with start_s <= timestamp < end_s (trace time)
    end_s: float = math.inf
    speedup: float = 1.0  # time compression: arrival = (timestamp - start_s) / speedup
    length_scale: float = 1.0  # multiply block size, prompt and output lengths (smaller model)
    max_context: Optional[int] = None  # drop records whose scaled input + output exceed this

    def __post_init__(self) -> None:
        if self.speedup <= 0:
            raise ValueError(f"speedup must be > 0, got {self.speedup}")
        if not 0 < self.length_scale <= 1:
            raise ValueError(f"length_scale must be in (0, 1], got {self.length_scale}")
        if self.end_s <= self.start_s:
            raise ValueError(f"empty time window [{self.start_s}, {self.end_s})")

    @property
    def block_tokens(self) -> int:
        return max(1, round(BLOCK_TOKENS * self.length_scale))


@dataclass
class MooncakeTrace:
    path: str
    options: MooncakeOptions
    requests: list[WorkloadRequest] = field(default_factory=list)
    records: int = 0  # records in the file
    outside_window: int = 0
    too_long: int = 0  # dropped by max_context

    def describe(self) -> str:
        o = self.options
        win = f"{o.start_s:g}-{'end' if math.isinf(o.end_s) else f'{o.end_s:g}'} s"
        span = max((r.arrival_s for r in self.requests), default=0.0)
        parts = [f"{len(self.requests)} of {self.records} Mooncake records from {self.path}",
                 f"window {win} of trace time ({self.outside_window} outside)",
                 f"time compressed x{o.speedup:g} (arrivals over {span:.0f} s)",
                 f"lengths x{o.length_scale:g} (block {o.block_tokens} tokens)"]
        if o.max_context is not None:
            parts.append(f"{self.too_long} over {o.max_context} tokens dropped")
        return "; ".join(parts)


def _record(d: Mapping, line: int) -> tuple[float, int, int, list[int]]:
    try:
        ts, inp, out = float(d["timestamp"]), int(d["input_length"]), int(d["output_length"])
        ids = [int(b) for b in d["hash_ids"]]
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"line {line}: not a Mooncake record ({FIELDS}): {e}") from None
    if inp <= 0 or out < 0:
        raise ValueError(f"line {line}: input_length must be > 0 and output_length >= 0")
    need = math.ceil(inp / BLOCK_TOKENS)
    if len(ids) != need:
        raise ValueError(f"line {line}: input_length {inp} needs {need} hash_ids "
                         f"(blocks of {BLOCK_TOKENS}), got {len(ids)}")
    return ts, inp, out, ids


def iter_records(path: str | Path) -> Iterator[tuple[int, Mapping]]:
    with open_text(path) as f:
        for i, line in enumerate(f, 1):
            if line.strip():
                yield i, json.loads(line)


class _SeenBlocks:
    """Unbounded prefix cache over block ids (a trie of dicts): each request's hit if every
    earlier prompt had been kept. It fills `prefix_hit_len`, the trace's own expected hit."""

    def __init__(self) -> None:
        self.root: dict = {}

    def hit_then_insert(self, ids: Sequence[int], lengths: Sequence[int]) -> int:
        hit, node, matching = 0, self.root, True
        for b, n in zip(ids, lengths):
            child = node.get(b)
            if child is None:
                child = node[b] = [0, {}]
                matching = False
            elif matching:
                m = min(child[0], n)
                hit += m
                matching = m == n
            child[0] = max(child[0], n)
            node = child[1]
        return hit


def read_mooncake(path: str | Path, options: MooncakeOptions = MooncakeOptions(),
                  output_cap: Optional[int] = None) -> MooncakeTrace:
    """All records in the window as open-loop `WorkloadRequest`s (one session each), sorted by
    arrival. `output_cap` bounds `max_output_tokens` (a client's max_tokens)."""
    o, bt = options, options.block_tokens
    tr = MooncakeTrace(str(path), o)
    seen = _SeenBlocks()
    for line, d in iter_records(path):
        tr.records += 1
        ts, inp, out, ids = _record(d, line)
        t = ts / 1000.0
        if not o.start_s <= t < o.end_s:
            tr.outside_window += 1
            continue
        last = inp - BLOCK_TOKENS * (len(ids) - 1)
        last_s = min(bt, max(1, round(last * o.length_scale)))
        inp_s = bt * (len(ids) - 1) + last_s
        out_s = max(1, round(out * o.length_scale))
        if output_cap is not None:
            out_s = min(out_s, output_cap)
        if o.max_context is not None and inp_s + out_s > o.max_context:
            tr.too_long += 1
            continue
        lengths = [bt] * (len(ids) - 1) + [last_s]
        n = len(tr.requests)
        tr.requests.append(WorkloadRequest(
            request_id=f"mc{line}", session_id=n, agent_type=0, turn=1,
            arrival_s=(t - o.start_s) / o.speedup, input_len=inp_s,
            prefix_hit_len=seen.hit_then_insert(ids, lengths), max_output_tokens=out_s,
            segments=tuple(block_segment(b, m) for b, m in zip(ids, lengths)),
            block_ids=tuple(ids), block_tokens=bt))
    tr.requests.sort(key=lambda r: r.arrival_s)
    return tr


def hit_histogram(hits: Sequence[float], edges: Sequence[float] = (0.2, 0.5, 0.8, 0.95)) -> list[float]:
    """Shares of requests whose hit rate falls in [0, e0), [e0, e1), ..., [e_last, 1]."""
    h = np.asarray(hits, dtype=float)
    if h.size == 0:
        return [0.0] * (len(edges) + 1)
    idx = np.searchsorted(np.asarray(edges), h, side="right")
    return (np.bincount(idx, minlength=len(edges) + 1) / h.size).tolist()
