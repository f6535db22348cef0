"""One-shot vs catch-up handoff, chosen from load (docs/handoff.md).

* One-shot: RLD hands all its eager tokens to MD at once and is freed immediately; MD runs one
  larger EXTEND step (a hiccup for MD's running batch).
* Catch-up: hand over in chunks while RLD keeps decoding, until MD has caught up (the gap is at
  most `stop_gap_tokens`); many small EXTENDs instead of one big one, RLD held longer.
* Adaptive: one-shot when RLD is loaded (free it), MD's batch is small (the hiccup hurts few
  requests) or RLD has no more eager tokens than one catch-up chunk (one EXTEND either way);
  catch-up otherwise.

RelayDecode runs this policy on the first `Ready` of each handoff (MD sends its batch size and
its chunk size); the simulator runs the same object.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class HandoffMode(str, enum.Enum):
    ONE_SHOT = "one-shot"
    CATCH_UP = "catch-up"


class HandoffPolicyKind(str, enum.Enum):
    ONE_SHOT = "one-shot"
    CATCH_UP = "catch-up"
    ADAPTIVE = "adaptive"


@dataclass(frozen=True)
class HandoffLoad:
    rld_running: int  # requests decoding on the RLD instance
    rld_kv_usage: float  # fraction of RLD's KV pool in use, 0..1
    md_batch_size: int  # requests decoding on the MD instance
    eager_tokens: int = 0  # tokens RLD decoded so far for this request (0: unknown)
    chunk_tokens: int = 0  # catch-up chunk size MD asked for (0: unknown)


@dataclass(frozen=True)
class HandoffModeDecision:
    mode: HandoffMode
    reason: str
    label: str = "configured"  # a short, fixed name of the reason (a metrics label)


@dataclass(frozen=True)
class HandoffModeConfig:
    kind: HandoffPolicyKind = HandoffPolicyKind.ADAPTIVE
    rld_busy_running: int = 48
    rld_busy_kv_usage: float = 0.8
    md_small_batch: int = 8
    stop_gap_tokens: int = 2  # catch-up ends when MD is at most this many tokens behind


class HandoffModePolicy:
    def __init__(self, cfg: HandoffModeConfig | None = None):
        self.cfg = cfg or HandoffModeConfig()

    def decide(self, load: HandoffLoad) -> HandoffModeDecision:
        cfg = self.cfg
        if cfg.kind is HandoffPolicyKind.ONE_SHOT:
            return HandoffModeDecision(HandoffMode.ONE_SHOT, "configured one-shot")
        if cfg.kind is HandoffPolicyKind.CATCH_UP:
            return HandoffModeDecision(HandoffMode.CATCH_UP, "configured catch-up")
        if load.rld_kv_usage >= cfg.rld_busy_kv_usage:
            return HandoffModeDecision(HandoffMode.ONE_SHOT, f"RLD KV usage {load.rld_kv_usage:.2f} >= "
                                       f"{cfg.rld_busy_kv_usage}: free it", "rld_kv_busy")
        if load.rld_running >= cfg.rld_busy_running:
            return HandoffModeDecision(HandoffMode.ONE_SHOT, f"RLD running {load.rld_running} >= "
                                       f"{cfg.rld_busy_running}: free it", "rld_busy")
        if load.eager_tokens and load.chunk_tokens and load.eager_tokens <= load.chunk_tokens:
            return HandoffModeDecision(HandoffMode.ONE_SHOT, f"{load.eager_tokens} eager tokens fit one "
                                       f"chunk of {load.chunk_tokens}", "fits_one_chunk")
        if load.md_batch_size <= cfg.md_small_batch:
            return HandoffModeDecision(HandoffMode.ONE_SHOT, f"MD batch {load.md_batch_size} <= "
                                       f"{cfg.md_small_batch}: hiccup is cheap", "md_small_batch")
        return HandoffModeDecision(HandoffMode.CATCH_UP, "RLD has room: spare MD's batch one big EXTEND",
                                   "md_busy")

    def catch_up_done(self, gap_tokens: int) -> bool:
        return gap_tokens <= self.cfg.stop_gap_tokens
