"""Agentic multi-turn workload: sessions whose context grows turn by turn (issue 3 item 2).

Model of a session (one agent run):

* Each agent type has a shared system prompt (`system_prompt_len` tokens, same tokens for
  every session of that type).
* A session's first turn inside the trace window is preceded by a *warm-up* request
  (`warmup=True`, turn 0) holding exactly that turn's reused prefix: the context the session
  already had when the window opened. Its arrival is 1 ms before the turn; a client sends all
  warm-ups before the window starts (the simulator pre-loads them into caches); never measured.
* Every measured turn draws a target prefix-hit rate h from `hit_histogram`. If the whole
  history H (previous prompt + previous output) fits, the turn appends tool output / user text
  to it: input L = ceil(H / h), reused prefix p = H ("the session grows"). If that would pass
  `max_input_len`, the agent compacts its context: L is drawn from `input_len`, the first
  p = round(h * L) tokens of the history are kept and the rest is rewritten.
* A fraction `odd_fraction` of turns are long-input / short-output ("odd traffic", docs/sim.md):
  their output length comes from `odd_output_len`.
* Sessions start as a Poisson process. A turn follows the previous one's completion after an
  exponential think time (tool execution, user): `think_s` records it for closed-loop replay
  (the simulator, a closed-loop client); `arrival_s` places it in open-loop time assuming the
  previous output streamed at `nominal_tpot_s`. Open loop, the request rate is ~`request_rate`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from sglang_pdd.lab.workload.distributions import HitHistogram, LengthRange
from sglang_pdd.lab.workload.request import SOURCE_OUTPUT, Segment, WorkloadRequest, truncate_segments

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkloadConfig:
    request_rate: float = 1.0  # measured requests per second, all sessions together
    duration_s: float = 60.0  # arrivals of turn >= 1 fall in [0, duration_s)
    hit_histogram: HitHistogram = field(default_factory=HitHistogram.default)
    input_len: LengthRange = LengthRange(2048, 4096)  # drawn on warm-up and on compaction
    max_input_len: int = 4096
    output_len: LengthRange = LengthRange(64, 128)
    odd_fraction: float = 0.035
    odd_output_len: LengthRange = LengthRange(8, 32)
    system_prompt_len: int = 256
    agent_types: int = 4
    mean_turns: float = 8.0  # turns per session ~ 1 + geometric
    think_time_s: float = 5.0  # mean gap between a turn's completion and the next turn
    nominal_tpot_s: float = 0.03  # to place turns in open-loop time: arrival += out * this
    vocab_size: int = 4096
    seed: int = 0

    def __post_init__(self) -> None:
        if self.request_rate <= 0 or self.duration_s <= 0:
            raise ValueError("request_rate and duration_s must be > 0")
        if not 0.0 <= self.odd_fraction <= 1.0:
            raise ValueError("odd_fraction must be in [0, 1]")
        if self.max_input_len < self.input_len.hi:
            raise ValueError("max_input_len must be >= input_len.hi")
        if self.system_prompt_len < 0 or self.agent_types < 1 or self.vocab_size <= 16:
            raise ValueError("need system_prompt_len >= 0, agent_types >= 1, vocab_size > 16")
        if self.mean_turns < 1 or self.think_time_s < 0:
            raise ValueError("need mean_turns >= 1 and think_time_s >= 0")

    @classmethod
    def cpu_bench(cls, **kw) -> "WorkloadConfig":
        """Scale of the CPU testbed: a tiny model, prompts of a few thousand tokens."""
        return cls(**kw)

    @classmethod
    def paper(cls, **kw) -> "WorkloadConfig":
        """docs/sim.md §3 scale: ~64K total length, ~1K output, mean hit ~90 %."""
        base = dict(input_len=LengthRange(52_000, 70_000), max_input_len=70_000,
                    output_len=LengthRange(768, 1280), odd_output_len=LengthRange(32, 400),
                    system_prompt_len=4096, vocab_size=152_000, mean_turns=12.0,
                    think_time_s=20.0, request_rate=10.0, duration_s=300.0)
        base.update(kw)
        return cls(**base)


_MASK64 = (1 << 64) - 1


def _seed(*parts: int) -> int:
    """A stable 63-bit seed from integers (splitmix64 mixing; fast, deterministic everywhere)."""
    h = 0x9E3779B97F4A7C15
    for p in parts:
        h = (h ^ (int(p) & _MASK64)) * 0xBF58476D1CE4E5B9 & _MASK64
        h = (h ^ (h >> 31)) * 0x94D049BB133111EB & _MASK64
        h ^= h >> 29
    return h >> 1


class _Session:
    def __init__(self, cfg: WorkloadConfig, sid: int, rng: np.random.Generator):
        self.cfg, self.sid, self.rng = cfg, sid, rng
        self.agent = int(rng.integers(cfg.agent_types))
        self.history: list[Segment] = [Segment(_seed(cfg.seed, 1, self.agent), cfg.system_prompt_len)]

    def _new_text(self, turn: int, kind: int, n: int) -> Segment:
        return Segment(_seed(self.cfg.seed, 2, self.sid, turn, kind), n)

    def start(self) -> tuple[float, int]:
        """Sets the context the session had before its first turn; returns turn 1's hit and length."""
        cfg = self.cfg
        h = float(cfg.hit_histogram.sample(self.rng))
        L = cfg.input_len.sample(self.rng)
        p = min(max(int(round(h * L)), 0), L - 1)
        sys = self.history[0]
        body = [sys.truncated(min(sys.length, p))] if p > 0 else []
        if p > sys.length:
            body.append(self._new_text(0, 0, p - sys.length))
        self.history = body
        return h, L

    def turn(self, t: int, arrival: float, think: float, h: float | None = None,
             L: int | None = None) -> WorkloadRequest:
        cfg, rng = self.cfg, self.rng
        H = sum(s.length for s in self.history)
        if h is None:
            h = float(cfg.hit_histogram.sample(rng))
            natural = math.ceil(H / h) if h > 0 else math.inf
            if H > 0 and natural <= cfg.max_input_len:
                L = max(natural, H + 1)
            else:
                L = cfg.input_len.sample(rng)
        p = min(max(int(round(h * L)), 0), H, L - 1)
        prompt = truncate_segments(self.history, p) + [self._new_text(t, 0, L - p)]
        odd = bool(rng.random() < cfg.odd_fraction)
        out = (cfg.odd_output_len if odd else cfg.output_len).sample(rng)
        req = WorkloadRequest(f"s{self.sid}-t{t}", self.sid, self.agent, t, arrival, L, p, out,
                              tuple(prompt), odd=odd, think_s=think)
        self.history = prompt + [Segment(_seed(cfg.seed, 3, self.sid, t), out, SOURCE_OUTPUT, t)]
        return req


def generate(cfg: WorkloadConfig, include_warmup: bool = True) -> list[WorkloadRequest]:
    """All requests of the configured window, sorted by arrival time. A session's first turn in
    the window is preceded by its warm-up (`warmup_for`)."""
    rng = np.random.default_rng(cfg.seed)
    mean_turns = max(cfg.mean_turns, 1.0)
    session_rate = cfg.request_rate / mean_turns
    # Sessions started before t=0 too, so the window is in steady state from the start.
    t = -mean_turns * (cfg.think_time_s + cfg.output_len.mean * cfg.nominal_tpot_s)
    reqs: list[WorkloadRequest] = []
    sid = 0
    while True:
        t += rng.exponential(1.0 / session_rate)
        if t >= cfg.duration_s:
            break
        sess = _Session(cfg, sid, rng)
        n_turns = int(rng.geometric(1.0 / mean_turns)) if mean_turns > 1 else 1
        h1, L1 = sess.start()
        arrival, think, turns = t, 0.0, []
        for k in range(1, n_turns + 1):
            req = sess.turn(k, arrival, think, h1 if k == 1 else None, L1 if k == 1 else None)
            turns.append(req)
            think = float(rng.exponential(cfg.think_time_s))
            arrival += req.max_output_tokens * cfg.nominal_tpot_s + think
        turns = [r for r in turns if 0.0 <= r.arrival_s < cfg.duration_s]
        if turns:
            first = turns[0]
            if include_warmup and first.prefix_hit_len > 0:
                reqs.append(warmup_for(first))
            reqs.extend(turns)
        sid += 1
    reqs.sort(key=lambda r: (r.arrival_s, r.session_id, r.turn))
    logger.info("generated %d requests from %d sessions", len(reqs), sid)
    return reqs


def warmup_for(first: WorkloadRequest) -> WorkloadRequest:
    """The context a session had before the trace window opened: `first`'s reused prefix,
    sent one think time earlier (or at least 1 ms earlier) and never measured."""
    p = first.prefix_hit_len
    return WorkloadRequest(f"s{first.session_id}-t0", first.session_id, first.agent_type, 0,
                           first.arrival_s - 1e-3, p, 0, 1,
                           tuple(truncate_segments(first.segments, p)), warmup=True)


def measured(reqs: Iterable[WorkloadRequest]) -> list[WorkloadRequest]:
    return [r for r in reqs if not r.warmup]
