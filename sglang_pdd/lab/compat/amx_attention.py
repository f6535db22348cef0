"""sglang's `intel_amx` attention backend on a CPU without AMX or sgl-kernel: torch versions of its two ops.

sglang's CPU attention for MLA models (DeepSeek-V2/V3: latent KV) is `intel_amx`
(sglang/srt/layers/attention/intel_amx_backend.py), which calls sgl-kernel's
`torch.ops.sgl_kernel.extend_attention_cpu` and `decode_attention_cpu`. The `torch_native` backend
cannot run such a model: for a prompt with nothing cached, sglang's DeepSeek code takes its MHA
prefill path (k and v expanded from the latent, not written to the cache) and `torch_native` reads K
and V from the cache, which holds the latent rows (shape error). The stand-in `sgl_kernel`
(`sglang_pdd.lab.compat.sgl_kernel_cpu`) registers the two ops below, with the argument lists of
sglang 0.5.23's call sites, so the `intel_amx` backend runs MHA and MLA models alike:

* `extend_attention_cpu`: per request, the cached prefix's K/V come from the cache
  (`req_to_token`), the new tokens' from `k_extend` / `v_extend` (the caller already wrote them, or
  chose not to: the MHA prefill path of an MLA model), causal within the new tokens;
* `decode_attention_cpu`: writes the step's `key` / `value` at `loc` (the real kernel writes them
  itself; sglang does not), then attends over the request's whole row of `req_to_token`.

Both compute in float32 with one softmax per query row (grouped KV heads repeated), which is what
transformers does for these models. Speculative tree masks and cross-attention are refused with a
clear error.

sglang only uses `intel_amx` when its platform probe says the CPU has AMX; without AMX it silently
falls back to `torch_native`. `claim_amx_attention()` overrides that probe through sglang's own
`override_platform(has_amx=True)` when `SGLANG_PDD_CPU_AMX_ATTENTION=1` (default: off, so a CPU server
keeps sglang's choice); `sglang_pdd.lab.compat.cpu` calls it once sglang's runtime context imports.
The probe is read only to pick the attention backend (and by gpt-oss); the AMX weight packing is
decided at import from the CPU itself and stays off.
"""

from __future__ import annotations

import os

import torch

ENV_AMX_ATTENTION = "SGLANG_PDD_CPU_AMX_ATTENTION"

EXTEND_SCHEMA = (
    "extend_attention_cpu(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, Tensor(a!) o_extend, "
    "Tensor k_buffer, Tensor v_buffer, float k_scale, float v_scale, Tensor req_to_token, "
    "Tensor req_pool_indices, Tensor seq_lens, Tensor extend_seq_lens, Tensor extend_start_loc, "
    "int max_len_extend, float sm_scale, float logit_cap, bool is_cross_attention, int sliding_window, "
    "Tensor? encoder_lens, Tensor? sinks, Tensor? tree_mask, bool is_causal) -> ()"
)
DECODE_SCHEMA = (
    "decode_attention_cpu(Tensor query, Tensor(a!) k_buffer, Tensor(b!) v_buffer, float k_scale, "
    "float v_scale, Tensor(c!) output, Tensor? key, Tensor? value, Tensor loc, Tensor attn_logits, "
    "Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, float sm_scale, float logit_cap, "
    "bool is_cross_attention, int sliding_window, Tensor? encoder_lens, Tensor? sinks) -> ()"
)


def _refuse(what: str) -> None:
    raise NotImplementedError(f"{what} has no torch stand-in (sglang-pdd CPU compat); it needs the real sgl-kernel")


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, sm_scale: float,
            logit_cap: float, window: int, sinks: torch.Tensor | None) -> torch.Tensor:
    """q [Tq, H, D], k [Tk, Hkv, D], v [Tk, Hkv, Dv]; query i sits at position q_pos[i] among the keys
    0..Tk-1 and sees the keys at or before it (and within `window` of it, when > 0). -> [Tq, H, Dv]"""
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads != kv_heads:
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * sm_scale
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    k_pos = torch.arange(k.shape[0], device=q.device)
    visible = k_pos[None, :] <= q_pos[:, None]
    if window > 0:
        visible &= k_pos[None, :] > q_pos[:, None] - window
    scores = scores.masked_fill(~visible[None], float("-inf"))
    if sinks is not None:  # one extra logit per head that takes softmax mass and contributes no value
        sink = sinks.float().view(heads, 1, 1).expand(heads, scores.shape[1], 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v.float())


def extend_attention_cpu(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, k_scale, v_scale,
                         req_to_token, req_pool_indices, seq_lens, extend_seq_lens, extend_start_loc,
                         max_len_extend, sm_scale, logit_cap, is_cross_attention, sliding_window,
                         encoder_lens, sinks, tree_mask, is_causal) -> None:
    if is_cross_attention or encoder_lens is not None:
        _refuse("extend_attention_cpu with cross-attention")
    if tree_mask is not None:
        _refuse("extend_attention_cpu with a speculative tree mask")
    for i in range(seq_lens.shape[0]):
        seq_len, ext_len, start = int(seq_lens[i]), int(extend_seq_lens[i]), int(extend_start_loc[i])
        prefix_len = seq_len - ext_len
        rows = req_to_token[int(req_pool_indices[i]), :seq_len].long()
        q = q_extend[start:start + ext_len]
        if k_extend is None:  # the caller's KV is in the cache already
            k, v = k_buffer[rows] * k_scale, v_buffer[rows] * v_scale
        else:
            k_new, v_new = k_extend[start:start + ext_len], v_extend[start:start + ext_len]
            if prefix_len:
                if k_buffer.shape[1:] != k_new.shape[1:] or v_buffer.shape[1:] != v_new.shape[1:]:
                    raise ValueError(
                        f"extend_attention_cpu: a cached prefix of {prefix_len} tokens with K/V rows of "
                        f"{tuple(k_buffer.shape[1:])}/{tuple(v_buffer.shape[1:])} beside new rows of "
                        f"{tuple(k_new.shape[1:])}/{tuple(v_new.shape[1:])}")
                k = torch.cat([k_buffer[rows[:prefix_len]] * k_scale, k_new.to(k_buffer.dtype)])
                v = torch.cat([v_buffer[rows[:prefix_len]] * v_scale, v_new.to(v_buffer.dtype)])
            else:
                k, v = k_new, v_new
        q_pos = torch.arange(prefix_len, seq_len, device=q.device)
        if not is_causal:
            q_pos = torch.full_like(q_pos, seq_len - 1)
        out = _attend(q, k, v, q_pos, sm_scale, logit_cap, sliding_window, sinks)
        o_extend[start:start + ext_len] = out.to(o_extend.dtype)


def decode_attention_cpu(query, k_buffer, v_buffer, k_scale, v_scale, output, key, value, loc, attn_logits,
                         req_to_token, req_pool_indices, seq_lens, sm_scale, logit_cap, is_cross_attention,
                         sliding_window, encoder_lens, sinks) -> None:
    if is_cross_attention or encoder_lens is not None:
        _refuse("decode_attention_cpu with cross-attention")
    if key is not None:  # the real kernel writes the step's KV itself (for MLA, v_buffer views k_buffer)
        k_buffer[loc.long()] = key.to(k_buffer.dtype)
        v_buffer[loc.long()] = value.to(v_buffer.dtype)
    for i in range(seq_lens.shape[0]):
        seq_len = int(seq_lens[i])
        rows = req_to_token[int(req_pool_indices[i]), :seq_len].long()
        q_pos = torch.tensor([seq_len - 1], device=query.device)
        out = _attend(query[i:i + 1], k_buffer[rows] * k_scale, v_buffer[rows] * v_scale, q_pos, sm_scale,
                      logit_cap, sliding_window, sinks)
        output[i:i + 1] = out.to(output.dtype)


def register(lib) -> None:
    """Define and implement both ops in `lib` (a `torch.library.Library("sgl_kernel", "FRAGMENT")`)."""
    lib.define(EXTEND_SCHEMA)
    lib.define(DECODE_SCHEMA)
    lib.impl("extend_attention_cpu", extend_attention_cpu, "CPU")
    lib.impl("decode_attention_cpu", decode_attention_cpu, "CPU")


def claim_amx_attention(runtime_context) -> None:
    """Let sglang keep `--attention-backend intel_amx` on this CPU (see the module doc); off unless asked."""
    if os.environ.get(ENV_AMX_ATTENTION) == "1":
        runtime_context.override_platform(has_amx=True).install()
