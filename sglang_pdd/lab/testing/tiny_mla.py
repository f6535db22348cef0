"""The tiny test model's MLA variant: DeepSeek-V3 architecture (multi-head latent attention), constructed weights.

    python -m sglang_pdd.lab.testing.tiny_model OUT_DIR --arch mla [--kv-lora-rank 512 ...]

`TinyModelSpec(arch="mla")` builds a `DeepseekV3ForCausalLM` (transformers and sglang both load it) with
the MHA model's tokenizer, hidden size, layers, heads and context construction
(`sglang_pdd.lab.testing.context_model`), carried over to MLA:

* **Attention.** Per head, q is `[q_nope (head_dim) | q_rope (head_dim)]`; per token the cache holds one
  latent row `[RMSNorm(c_kv) (kv_lora_rank) | k_rope (head_dim)]`, shared by all heads, and k_nope / v
  are `kv_b_proj` of the latent. The read heads score through the rope part alone: k_rope comes from
  the constant channel (the same unit vector rotated by position at every token), q_rope from the
  constant channel with the amplitudes of `context_model.kernel` (interleaved pairs: DeepSeek's
  `rope_interleave`), q_nope and k_nope are zero. So each head reads exactly one earlier position, the
  distances of `context_model.read_offsets`, one-hot to 1e-11 as in the MHA model.
* **The latent carries the content.** `kv_a_proj_with_mqa` maps the residual's content dimensions at
  random into c_kv; v (per head) is a random map of the normalized latent with the MHA model's value
  scale. A wrong latent row therefore changes what every head reading that position sees.
* **MLP, readout:** the MHA model's (dense gated MLP in every layer, no experts: routing is a discrete
  choice that float reordering could flip; random lm_head, special tokens never greedy).

Rope: sglang's CPU DeepSeek path only builds `deepseek_yarn` rope, so the config says
`rope_type: yarn` with factor 1.0 (mscale 1): the same frequencies and scale as plain rope, through
the code real DeepSeek checkpoints use. No q LoRA (`q_lora_rank: null`, as DeepSeek-V2-Lite).

sglang serves it on CPU only with the `intel_amx` attention backend (`torch_native` cannot run MLA's
prefill; see `sglang_pdd.lab.compat.amx_attention`): `--attention-backend intel_amx` and
`SGLANG_PDD_CPU_AMX_ATTENTION=1` (`SERVER_FLAGS`, `SERVER_ENV`).
"""

from __future__ import annotations

import math

import numpy as np

from sglang_pdd.lab.testing.context_model import (ContextWeights, final_norm_and_head, kernel, mlp_layer, seeded_embedding,
                                                   read_offsets, rope_frequencies)

SERVER_ENV = {"SGLANG_PDD_CPU_AMX_ATTENTION": "1"}
ATTENTION_BACKEND = "intel_amx"


def config(spec, vocab: int, bos: int, eos: int):
    """The DeepseekV3Config of `spec` (a TinyModelSpec with arch="mla")."""
    from transformers import DeepseekV3Config

    theta = ContextWeights().rope_theta
    return DeepseekV3Config(
        vocab_size=vocab, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
        moe_intermediate_size=spec.intermediate, num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads, num_key_value_heads=spec.heads,
        first_k_dense_replace=spec.layers, moe_layer_freq=1,  # every layer dense: the expert fields are unused
        n_routed_experts=1, num_experts_per_tok=1, n_group=1, topk_group=1, n_shared_experts=1,
        kv_lora_rank=spec.kv_lora_rank, q_lora_rank=None, qk_rope_head_dim=spec.head_dim,
        qk_nope_head_dim=spec.head_dim, v_head_dim=spec.head_dim, num_nextn_predict_layers=0,
        max_position_embeddings=spec.max_positions, rms_norm_eps=1e-5, tie_word_embeddings=False,
        bos_token_id=bos, eos_token_id=eos, torch_dtype=spec.dtype, rope_interleave=True,
        rope_parameters={"rope_type": "yarn", "rope_theta": theta, "factor": 1.0,
                         "original_max_position_embeddings": spec.max_positions, "beta_fast": 32.0,
                         "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
    )


def _interleave(re: np.ndarray, im: np.ndarray) -> np.ndarray:
    out = np.empty(2 * len(re))
    out[0::2], out[1::2] = re, im
    return out


def construct(cfg, w: ContextWeights, seed: int, special_tokens: int) -> dict:
    """The state dict of a `DeepseekV3ForCausalLM(cfg)` (see the module doc); token IDs below
    `special_tokens` are never predicted."""
    import torch

    d, heads, layers, inter, vocab = (cfg.hidden_size, cfg.num_attention_heads, cfg.num_hidden_layers,
                                      cfg.intermediate_size, cfg.vocab_size)
    rope, nope, vd, rank = cfg.qk_rope_head_dim, cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    randn, sd, content, const = seeded_embedding(seed, vocab, d, w)
    freqs = rope_frequencies(rope, w.rope_theta)
    offsets = read_offsets(layers, heads, w.reach, w.local)
    k_unit = torch.from_numpy(_interleave(np.ones(rope // 2), np.zeros(rope // 2)))
    var = 1.0  # mean square of a content entry of the residual
    for l in range(layers):
        p = f"model.layers.{l}."
        rms = math.sqrt((const * const + var * content) / d)
        x0 = const / rms  # the constant channel after RMSNorm
        wq = torch.zeros(heads * (nope + rope), d, dtype=torch.float64)
        wo = torch.zeros(d, heads * vd, dtype=torch.float64)
        for h, off in enumerate(offsets[l]):
            z, gap = kernel(freqs, off, w.span)  # off: the distances this head reads
            amp = w.gap / gap * math.sqrt(nope + rope)  # scores are scaled by 1/sqrt(qk_head_dim)
            row = h * (nope + rope) + nope
            wq[row:row + rope, 0] = torch.from_numpy(_interleave(z.real, z.imag) * amp) / x0
            wo[1:, h * vd:(h + 1) * vd] = randn(content, vd) * (w.read_gain / math.sqrt(vd * heads))
        kv_a = torch.zeros(rank + rope, d, dtype=torch.float64)
        kv_a[:rank, 1:] = randn(rank, content) * (rms / math.sqrt(content * var))  # c_kv entries ~ N(0, 1)
        kv_a[rank:, 0] = k_unit / x0  # k_rope: one unit vector per pair, rotated by the position
        kv_b = torch.zeros(heads * (nope + vd), rank, dtype=torch.float64)
        for h in range(heads):  # k_nope rows stay zero; v ~ N(0, var) from the normalized latent
            row = h * (nope + vd) + nope
            kv_b[row:row + vd] = randn(vd, rank) * math.sqrt(var / rank)
        sd.update({p + "self_attn.q_proj.weight": wq, p + "self_attn.kv_a_proj_with_mqa.weight": kv_a,
                   p + "self_attn.kv_a_layernorm.weight": torch.ones(rank, dtype=torch.float64),
                   p + "self_attn.kv_b_proj.weight": kv_b, p + "self_attn.o_proj.weight": wo,
                   p + "input_layernorm.weight": torch.ones(d, dtype=torch.float64),
                   p + "post_attention_layernorm.weight": torch.ones(d, dtype=torch.float64)})
        var = mlp_layer(sd, p, randn, w, d, inter, content, const, var)
    return final_norm_and_head(sd, randn, d, vocab, content, const, var, special_tokens)


def model(spec, vocab: int, bos: int, eos: int, special_tokens: int):
    """The transformers model of `spec` (arch="mla"), float32, weights per `spec.weights`."""
    import torch
    from transformers import DeepseekV3ForCausalLM

    cfg = config(spec, vocab, bos, eos)
    torch.manual_seed(spec.seed)
    m = DeepseekV3ForCausalLM(cfg)
    if spec.weights == "context":
        state = construct(cfg, ContextWeights(), spec.seed, special_tokens)
        m.load_state_dict({k: v.to(torch.float32) for k, v in state.items()})
    return m


def load(model_dir: str):
    """The built model on transformers, float32, for `model_check.measure` (model_check.load)."""
    from sglang_pdd.lab.testing import model_check

    return model_check.load(model_dir)
