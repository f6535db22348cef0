"""One request of an agentic workload and the deterministic spec of its prompt.

Requests carry a compact deterministic spec of their prompt (a list of `Segment`s: seeded
pseudo-random token runs, or "the output of turn t" of the same session) that expands to
concrete token IDs for a given vocabulary, so the real benchmark can send them to sglang.
A truncated segment expands to a prefix of the full one, so shared prefixes are real.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Mapping, Sequence

import numpy as np

SOURCE_TEXT = "text"
SOURCE_OUTPUT = "output"


@dataclass(frozen=True)
class Segment:
    """`length` tokens drawn from a PRNG seeded with `seed`; or, for source 'output', the
    model's real output of turn `turn` of the same session (the seed is the offline stand-in)."""

    seed: int
    length: int
    source: str = SOURCE_TEXT
    turn: int = -1

    def truncated(self, length: int) -> "Segment":
        return replace(self, length=length)

    def expand(self, vocab_size: int, reserved_low: int = 16) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        return rng.integers(reserved_low, vocab_size, size=self.length, dtype=np.int64)


def output_segment(turn: int, length: int) -> Segment:
    """A turn's real output as a cache records it (see `common_prefix_len`)."""
    return Segment(0, length, SOURCE_OUTPUT, turn)


def truncate_segments(segments: Sequence[Segment], n: int) -> list[Segment]:
    out, left = [], n
    for s in segments:
        if left <= 0:
            break
        out.append(s if s.length <= left else s.truncated(left))
        left -= min(s.length, left)
    return out


def common_prefix_len(a: Sequence[Segment], b: Sequence[Segment]) -> int:
    """Length of the shared token prefix of two segment lists of one session (exact: equal seed
    => equal run). Output segments compare by turn only: a turn has one real output, and its
    seed is just the offline stand-in, so a cache may record it as `output_segment(turn, n)`."""
    total = 0
    for sa, sb in zip(a, b):
        if sa.source != sb.source or sa.turn != sb.turn:
            break
        if sa.source != SOURCE_OUTPUT and sa.seed != sb.seed:
            break
        total += min(sa.length, sb.length)
        if sa.length != sb.length:
            break
    return total


@dataclass(frozen=True)
class WorkloadRequest:
    request_id: str
    session_id: int
    agent_type: int
    turn: int
    arrival_s: float
    input_len: int
    prefix_hit_len: int  # tokens shared with earlier turns of this session (incl. warm-up)
    max_output_tokens: int
    segments: tuple[Segment, ...] = ()
    warmup: bool = False
    odd: bool = False  # ground-truth label only; routers must not read it
    think_s: float = 0.0  # gap after the previous turn of the session completes (closed loop)
    # block-level prefix identity (Mooncake traces, `workload.mooncake`): the prompt is these
    # blocks of `block_tokens` tokens in order, the last one possibly partial; equal ids = equal
    # tokens across requests and sessions. Empty for generated workloads (per-session segments).
    block_ids: tuple[int, ...] = ()
    block_tokens: int = 0

    def block_lengths(self) -> list[int]:
        """Tokens of each block of `block_ids`: full blocks, then the (possibly partial) last."""
        k = len(self.block_ids)
        if k == 0:
            return []
        return [self.block_tokens] * (k - 1) + [self.input_len - self.block_tokens * (k - 1)]

    @property
    def hit_rate(self) -> float:
        return self.prefix_hit_len / self.input_len if self.input_len else 0.0

    def token_ids(self, vocab_size: int, outputs: Mapping[int, Sequence[int]] | None = None,
                  reserved_low: int = 16) -> list[int]:
        """Concrete prompt. `outputs[turn]` substitutes the real output of that turn."""
        if not self.segments:
            raise ValueError(f"{self.request_id}: trace record carries no token spec")
        ids: list[int] = []
        for s in self.segments:
            if s.source == SOURCE_OUTPUT and outputs is not None and s.turn in outputs:
                real = list(outputs[s.turn])[: s.length]
                ids.extend(real)
                if len(real) < s.length:  # model stopped early: pad from the stand-in
                    ids.extend(s.expand(vocab_size, reserved_low)[len(real):].tolist())
            else:
                ids.extend(s.expand(vocab_size, reserved_low).tolist())
        return ids

    def to_dict(self) -> dict:
        d = asdict(self)
        d["segments"] = [[s.seed, s.length, s.source, s.turn] for s in self.segments]
        if not self.block_ids:  # generated workloads keep their JSONL unchanged
            del d["block_ids"], d["block_tokens"]
        else:
            d["block_ids"] = list(self.block_ids)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "WorkloadRequest":
        segs = tuple(Segment(int(x[0]), int(x[1]), str(x[2]), int(x[3])) for x in d.get("segments", []))
        inp = int(d["input_len"])
        return cls(
            request_id=str(d.get("request_id", f"s{d.get('session_id', 0)}-t{d.get('turn', 0)}")),
            session_id=int(d.get("session_id", 0)),
            agent_type=int(d.get("agent_type", 0)),
            turn=int(d.get("turn", 1)),
            arrival_s=float(d["arrival_s"]),
            input_len=inp,
            prefix_hit_len=int(d.get("prefix_hit_len", 0)),
            max_output_tokens=int(d["max_output_tokens"]),
            segments=segs,
            warmup=bool(d.get("warmup", False)),
            odd=bool(d.get("odd", False)),
            think_s=float(d.get("think_s", 0.0)),
            block_ids=tuple(int(b) for b in d.get("block_ids", ())),
            block_tokens=int(d.get("block_tokens", 0)),
        )
