"""The served model, reduced to what a roofline needs: FLOPs, weight bytes and KV bytes."""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    heads: int  # attention (query) heads
    head_dim: int
    kv_bytes_per_token: int  # all layers, at the serving KV precision
    total_params: float
    active_params: float  # per token (== total for dense)
    weight_bytes_per_param: float = 1.0
    experts: int = 0  # 0 = dense
    top_k: int = 0
    expert_params: float = 0.0  # parameters inside routed experts (part of total_params)

    def __post_init__(self) -> None:
        if self.active_params > self.total_params or self.kv_bytes_per_token <= 0:
            raise ValueError(f"invalid model spec {self.name}")
        if self.experts and not (0 < self.top_k <= self.experts and 0 < self.expert_params < self.total_params):
            raise ValueError(f"invalid MoE spec {self.name}")

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def weight_bytes(self) -> float:
        return self.total_params * self.weight_bytes_per_param

    @property
    def attn_flops_per_pair(self) -> float:
        """FLOPs of one (query token, key token) pair over all layers: QK^T and PV."""
        return 4.0 * self.layers * self.heads * self.head_dim

    @property
    def comm_bytes_per_token(self) -> float:
        """Tensor/expert-parallel traffic per token per forward (two all-reduces a layer, bf16)."""
        return 2.0 * 2.0 * self.hidden * self.layers

    def weight_bytes_read(self, tokens: int) -> float:
        """Weight bytes one forward over `tokens` tokens reads: for MoE, only the experts hit."""
        return _weight_bytes_read(self, tokens)


@functools.lru_cache(maxsize=8192)
def _weight_bytes_read(m: ModelSpec, tokens: int) -> float:
    if not m.is_moe:
        return m.weight_bytes
    dense = m.total_params - m.expert_params
    touched = 1.0 - (1.0 - m.top_k / m.experts) ** max(tokens, 1)
    return (dense + m.expert_params * touched) * m.weight_bytes_per_param


# A ~230B-total / 22B-active MoE with a 50 KB/token KV (docs/sim.md, "Paper-scenario hardware"), fp8 weights.
PAPER_MOE = ModelSpec("paper-moe", layers=60, hidden=6144, heads=64, head_dim=128,
                      kv_bytes_per_token=50_000, total_params=230e9, active_params=22e9,
                      weight_bytes_per_param=1.0, experts=128, top_k=8, expert_params=215e9)

# A 70B dense model with GQA (8 KV heads), bf16 weights and KV: 320 KiB/token.
DENSE_70B = ModelSpec("dense-70b", layers=80, hidden=8192, heads=64, head_dim=128,
                      kv_bytes_per_token=2 * 80 * 8 * 128 * 2, total_params=70e9,
                      active_params=70e9, weight_bytes_per_param=2.0)

MODELS = {m.name: m for m in (PAPER_MOE, DENSE_70B)}
