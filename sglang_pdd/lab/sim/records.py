"""Per-request outcome of a simulation run."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RequestRecord:
    request_id: str
    session_id: int
    turn: int
    arrival_s: float
    input_len: int
    output_len: int
    prefix_hit_len: int  # P-side hit (the workload's expected hit)
    md_hit: int  # D/MD radix-cache hit at routing time (0 without a DRC)
    pipeline: str
    route_reason: str = ""
    odd: bool = False
    first_token_s: float = float("nan")  # as seen by the router, in cluster A
    finish_s: float = float("nan")
    tokens_rld: int = 0
    tokens_md: int = 0
    wan_bytes: float = 0.0  # bytes this request put on the WAN (cancelled: the full size asked)
    handoff_mode: str = ""
    handoff_gap_s: float = 0.0  # time between RLD's last token and MD's first
    finished: bool = False

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float:
        if self.output_len <= 1:
            return 0.0
        return (self.finish_s - self.first_token_s) / (self.output_len - 1)

    def meets(self, ttft_s: float, tpot_s: float) -> bool:
        return self.finished and self.ttft_s <= ttft_s and self.tpot_s <= tpot_s
