"""Kernel-test scaffolding over sglang's token pool: a paged slot allocation, a req_to_token table, a ragged
batch, and the EXTEND attention of sglang's torch_native backend. The pool, layer and forward batch
stand-ins themselves are tests.fakes' (kv_pool, attention).

Pages are handed out in random order (a fragmented pool), each page's slots consecutive, as sglang's
paged allocator does; position p of a request lives in slot page(p // page_size) * page_size + p % page_size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedBatch:
    q: torch.Tensor
    k_buffer: torch.Tensor
    v_buffer: torch.Tensor
    req_to_token: torch.Tensor
    req_pool_indices: torch.Tensor
    prefix_lens: torch.Tensor
    extend_lens: torch.Tensor

    def args(self) -> tuple[torch.Tensor, ...]:
        return (self.q, self.k_buffer, self.v_buffer, self.req_to_token, self.req_pool_indices,
                self.prefix_lens, self.extend_lens)


def paged_slots(lengths: list[int], page_size: int, num_slots: int, gen: torch.Generator) -> list[torch.Tensor]:
    """Slots for requests of `lengths` positions, pages drawn at random from a pool of `num_slots`."""
    pages_needed = [-(-n // page_size) for n in lengths]
    free_pages = torch.randperm(num_slots // page_size, generator=gen)
    assert sum(pages_needed) <= free_pages.numel(), "pool too small"
    out, used = [], 0
    for n, pages in zip(lengths, pages_needed):
        chosen = free_pages[used : used + pages]
        used += pages
        slots = (chosen[:, None] * page_size + torch.arange(page_size)[None, :]).reshape(-1)[:n]
        out.append(slots)
    return out


def make_paged_batch(
    prefix_lens: list[int],
    extend_lens: list[int],
    q_heads: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    page_size: int,
    device: torch.device,
    seed: int = 0,
    v_head_dim: int | None = None,
) -> PagedBatch:
    """A ragged batch: request b owns row b + 1 of req_to_token (row 0 unused, as in sglang)."""
    gen = torch.Generator().manual_seed(seed)
    kv_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    num_slots = max(256, (sum(kv_lens) + page_size * len(kv_lens)) * 2)
    num_slots = -(-num_slots // page_size) * page_size
    width = -(-(max(kv_lens) + 1) // page_size) * page_size
    req_to_token = torch.zeros((len(kv_lens) + 2, width), dtype=torch.int32)
    for b, slots in enumerate(paged_slots(kv_lens, page_size, num_slots, gen)):
        req_to_token[b + 1, : slots.numel()] = slots.int()
    dv = v_head_dim or head_dim
    k_buffer = torch.randn((num_slots, kv_heads, head_dim), generator=gen).to(dtype)
    v_buffer = torch.randn((num_slots, kv_heads, dv), generator=gen).to(dtype)
    q = torch.randn((sum(extend_lens), q_heads, head_dim), generator=gen).to(dtype)
    return PagedBatch(
        q=q.to(device), k_buffer=k_buffer.to(device), v_buffer=v_buffer.to(device),
        req_to_token=req_to_token.to(device),
        req_pool_indices=torch.arange(1, len(kv_lens) + 1, dtype=torch.int64, device=device),
        prefix_lens=torch.tensor(prefix_lens, dtype=torch.int64, device=device),
        extend_lens=torch.tensor(extend_lens, dtype=torch.int64, device=device),
    )


# -- sglang's torch_native backend, for the hook's check where sglang is not installed (a bare GPU box) ---

class SdpaExtendBackend:
    """What sglang's torch_native backend computes for an EXTEND: store the new K/V, then per request SDPA
    of the new tokens (front-padded to the sequence length, causal) over the row's slots."""

    def __init__(self, runner):
        self.token_to_kv_pool, self.req_to_token_pool = runner.token_to_kv_pool, runner.req_to_token_pool
        self.kv_index_translator = None

    def forward(self, q, k, v, layer, fb, save_kv_cache=True, **kwargs):
        pool = self.token_to_kv_pool
        if save_kv_cache:
            pool.set_kv_buffer(layer, fb.out_cache_loc, k, v)
        hq, d, out, start = layer.tp_q_head_num, layer.qk_head_dim, [], 0
        q3 = q.reshape(-1, hq, d)
        for row, p, e in zip(fb.req_pool_indices.tolist(), fb.extend_prefix_lens_cpu, fb.extend_seq_lens_cpu):
            slots = self.req_to_token_pool.req_to_token[row, : p + e].long()
            query = torch.zeros((hq, p + e, d), dtype=q.dtype, device=q.device)
            query[:, p:] = q3[start : start + e].movedim(0, 1)
            keys = pool.get_key_buffer(layer.layer_id)[slots].movedim(0, 1)
            vals = pool.get_value_buffer(layer.layer_id)[slots].movedim(0, 1)
            o = torch.nn.functional.scaled_dot_product_attention(
                query[None], keys[None], vals[None], is_causal=True, scale=layer.scaling,
                enable_gqa=hq != layer.tp_k_head_num)[0]
            out.append(o.movedim(0, 1)[p:])
            start += e
        return torch.cat(out).reshape(-1, hq * layer.v_head_dim)
