"""Plain-torch reference of the handoff attention: the oracle of the tests and the CPU fallback.

Same contract as `handoff_attention.handoff_attention`: request b has `prefix_lens[b]` cached positions
and `extend_lens[b]` new query tokens (rows `qo_indptr[b] : qo_indptr[b+1]` of `q`); query i sits at
position prefix + i and attends to positions [0, prefix + i] of its `req_to_token` row, whose K/V are
read from the token pool. Math in fp32, output in `out.dtype`.
"""

from __future__ import annotations

import torch


def handoff_attention_ref(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    out: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: list[int],
    prefix_lens: list[int],
    extend_lens: list[int],
    sm_scale: float,
) -> torch.Tensor:
    """Write attention of the new tokens into `out` ([T, Hq, Dv]) and return it."""
    num_heads = q.shape[1]
    group = num_heads // k_buffer.shape[1]
    q_start = 0
    for row, prefix, ext in zip(req_pool_indices, prefix_lens, extend_lens):
        if ext == 0:
            continue
        kv_len = prefix + ext
        slots = req_to_token[row, :kv_len].long()
        keys = k_buffer[slots].float().repeat_interleave(group, dim=1)  # [L, Hq, D]
        values = v_buffer[slots].float().repeat_interleave(group, dim=1)  # [L, Hq, Dv]
        queries = q[q_start : q_start + ext].float()  # [k, Hq, D]
        scores = torch.einsum("qhd,khd->hqk", queries, keys) * sm_scale
        q_pos = prefix + torch.arange(ext, device=q.device)
        k_pos = torch.arange(kv_len, device=q.device)
        visible = k_pos[None, :] <= q_pos[:, None]  # [k, L]
        scores = scores.masked_fill(~visible[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[q_start : q_start + ext] = torch.einsum("hqk,khd->qhd", probs, values).to(out.dtype)
        q_start += ext
    return out
