"""sglang's token pools (`sglang.srt.mem_cache.memory_pool`): the MHA KV pool and the req_to_token pool.

Torch and numpy only: the kernel tests use these on a GPU box without sglang.
"""

from __future__ import annotations

import numpy as np
import torch


class MHATokenToKVPool:
    """sglang's plain MHA token pool, reduced to what the plugin and the attention backends use. Keep the
    name: the handoff attention hook and the packed WAN pool view accept a pool by its class name.

    Per layer a K buffer [rows, head_num, head_dim] and a V buffer [rows, head_num, v_head_dim], token-major,
    stored in `dtype` on `device`. Rows: sglang's `size` (usable slots; sglang adds a padding page, so
    size + page_size rows, slot 0 the padding slot), or exactly `slots`, or `pages` * page_size. Contents:
    zeros (as sglang allocates), `fill`, or normal numbers from `seed` (K of every layer, then V).
    `writes` records each `set_kv_buffer` as (layer_id, slots).
    """

    def __init__(self, size: int | None = None, page_size: int = 1, dtype: torch.dtype = torch.float32,
                 head_num: int = 2, head_dim: int = 8, layer_num: int = 2, device="cpu",
                 enable_memory_saver: bool = False, v_head_dim: int | None = None, *, slots: int | None = None,
                 pages: int | None = None, fill: float | None = None, seed: int | None = None, **_sglang_options):
        given = [n for n in (size, slots, pages) if n is not None]
        assert len(given) == 1, "give one of size (sglang's), slots or pages"
        if size is not None:
            rows = size + page_size
        elif slots is not None:
            rows = size = slots
        else:
            rows = size = pages * page_size
        v_head_dim = v_head_dim or head_dim
        gen = torch.Generator().manual_seed(seed) if seed is not None else None

        def buf(dim: int) -> torch.Tensor:
            shape = (rows, head_num, dim)
            if fill is not None:
                return torch.full(shape, fill, dtype=dtype, device=device)
            if gen is not None:
                return torch.randn(shape, generator=gen).to(dtype).to(device)
            return torch.zeros(shape, dtype=dtype, device=device)

        self.size, self.page_size, self.layer_num, self.device = size, page_size, layer_num, device
        self.dtype = self.store_dtype = dtype
        self.head_num, self.head_dim, self.v_head_dim = head_num, head_dim, v_head_dim
        self.use_hnd = False
        self.k_buffer = [buf(head_dim) for _ in range(layer_num)]
        self.v_buffer = [buf(v_head_dim) for _ in range(layer_num)]
        self.writes: list[tuple[int, list[int]]] = []

    # what the attention backends call
    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k_buffer[layer_id]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v_buffer[layer_id]

    def set_kv_buffer(self, layer, loc, k, v, *a, **kw) -> None:
        loc = getattr(loc, "loc", loc).long()  # sglang's KVWriteLoc or bare slots
        self.k_buffer[layer.layer_id][loc] = k.view(-1, self.head_num, self.head_dim).to(self.dtype)
        self.v_buffer[layer.layer_id][loc] = v.view(-1, self.head_num, self.v_head_dim).to(self.dtype)
        self.writes.append((layer.layer_id, loc.tolist()))

    # test helpers
    def slots(self, pages) -> torch.Tensor:
        """Token slots of whole pages, in page order (page p holds slots p * page_size ..)."""
        p = torch.as_tensor(np.asarray(pages, dtype=np.int64))
        return (p[:, None] * self.page_size + torch.arange(self.page_size)).reshape(-1)

    def buffers(self) -> list[torch.Tensor]:
        """K of every layer, then V: the order of the KV manager's `kv_data_ptrs`."""
        return self.k_buffer + self.v_buffer

    def snapshot(self) -> list[torch.Tensor]:
        return [t.clone() for t in self.buffers()]


class MLATokenToKVPool:
    """sglang's plain MLA token pool (DeepSeek-style latent KV), reduced to what the packed WAN path uses:
    per layer one buffer [rows, 1, kv_lora_rank + qk_rope_head_dim] (`kv_buffer`), no K/V split. Rows and
    contents as in `MHATokenToKVPool` (whose arguments it takes; its head geometry is ignored)."""

    def __init__(self, size: int | None = None, page_size: int = 1, dtype: torch.dtype = torch.float32,
                 kv_lora_rank: int = 12, qk_rope_head_dim: int = 4, layer_num: int = 2, device="cpu", *,
                 slots: int | None = None, pages: int | None = None, fill: float | None = None,
                 seed: int | None = None, **_sglang_options):
        rows = MHATokenToKVPool(size, page_size, dtype, 1, kv_lora_rank + qk_rope_head_dim, layer_num, device,
                                slots=slots, pages=pages, fill=fill, seed=seed)
        self.size, self.page_size, self.layer_num, self.device = rows.size, page_size, layer_num, device
        self.dtype = self.store_dtype = dtype
        self.kv_lora_rank, self.qk_rope_head_dim, self.use_dsa = kv_lora_rank, qk_rope_head_dim, False
        self.kv_buffer = rows.k_buffer

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.kv_buffer[layer_id]

    slots = MHATokenToKVPool.slots

    def buffers(self) -> list[torch.Tensor]:
        """The latent buffer of every layer: the order of the KV manager's `kv_data_ptrs`."""
        return list(self.kv_buffer)

    def snapshot(self) -> list[torch.Tensor]:
        return [t.clone() for t in self.buffers()]


class ReqToTokenPool:
    """sglang's req_to_token pool: row r maps a request's positions to token slots; `size` + 1 rows (row 0
    unused, as in sglang)."""

    def __init__(self, size: int, max_context_len: int, device="cpu", enable_memory_saver: bool = False, **_):
        self.size = size
        self.req_to_token = torch.zeros((size + 1, max_context_len), dtype=torch.int32, device=device)
