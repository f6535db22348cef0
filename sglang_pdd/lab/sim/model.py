"""The served model, reduced to what a roofline needs: FLOPs, weight bytes and KV bytes."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from sglang_pdd.policy import kv_bytes


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


def from_hf_config(name: str, config: dict, *, total_params: float, active_params: float,
                   weight_bytes_per_param: float = 1.0, expert_params: float = 0.0) -> ModelSpec:
    """A ModelSpec from a Hugging Face `config.json`: the KV bytes per token as the router computes them
    (`policy/kv_bytes.py`: MLA = one latent + rope row per layer; MHA/GQA = K and V per KV head), the
    experts from `n_routed_experts`/`num_experts_per_tok`. An MLA config's attention FLOPs are counted in
    the form sglang's prefill runs it (decompressed heads: QK over qk_nope + qk_rope, PV over v_head_dim),
    as one `head_dim` of their mean."""
    heads = config["num_attention_heads"]
    if config.get("kv_lora_rank"):
        head_dim = (config["qk_nope_head_dim"] + config["qk_rope_head_dim"] + config["v_head_dim"]) // 2
    else:
        head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return ModelSpec(name, layers=config["num_hidden_layers"], hidden=config["hidden_size"], heads=heads,
                     head_dim=head_dim, kv_bytes_per_token=kv_bytes.per_token(config),
                     total_params=total_params, active_params=active_params,
                     weight_bytes_per_param=weight_bytes_per_param,
                     experts=config.get("n_routed_experts", 0) or 0,
                     top_k=config.get("num_experts_per_tok", 0) or 0, expert_params=expert_params)


# DeepSeek-V3 (and R1, Kimi K2's shape): the fields of its config.json that the roofline reads. KV in bf16
# (sglang's default for an MLA pool): 61 x (512 + 64) x 2 = 70,272 bytes per token.
DEEPSEEK_V3_CONFIG = {"num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 128,
                      "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
                      "v_head_dim": 128, "n_routed_experts": 256, "num_experts_per_tok": 8,
                      "torch_dtype": "bfloat16"}
# 671B total, 37B active; the routed experts of its 58 MoE layers: 58 x 256 x 3 x 7168 x 2048 ~ 654B.
_V3_PARAMS = dict(total_params=671e9, active_params=37e9, weight_bytes_per_param=1.0, expert_params=654e9)
DEEPSEEK_V3 = from_hf_config("deepseek-v3", DEEPSEEK_V3_CONFIG, **_V3_PARAMS)

# The same model with an MHA-family KV pool instead of MLA: GQA with 8 KV heads of 128 (the layout of
# the dense models of this size, e.g. Llama 3.1 405B), so 61 x 2 x 8 x 128 x 2 = 249,856 bytes per
# token, 3.6x the latent. Weights, FLOPs and experts are DeepSeek-V3's: only the KV format differs.
V3_SIZE_GQA8 = dataclasses.replace(DEEPSEEK_V3, name="v3-size-gqa8", kv_bytes_per_token=kv_bytes.per_token(
    {k: v for k, v in DEEPSEEK_V3_CONFIG.items() if k != "kv_lora_rank"} | {"num_key_value_heads": 8, "head_dim": 128}))

MODELS = {m.name: m for m in (PAPER_MOE, DENSE_70B, DEEPSEEK_V3, V3_SIZE_GQA8)}
