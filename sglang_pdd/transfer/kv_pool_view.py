"""The KV pool as the packed WAN path sees it: per-layer K and V buffers, pages, and the pack layout.

Only sglang's plain `MHATokenToKVPool` (exact class, token-major NHD layout, stored in its own dtype)
and plain `MLATokenToKVPool` (exact class: one latent buffer per layer, `[slots, 1, kv_lora_rank + rope]`,
seen as K with no V) qualify, on a server whose attention is not split across TP/PP ranks: a packed
block carries whole rows of every layer, which both sides must hold. Anything else gets a reason and
stays page by page.
Each prefill and decode KV manager gets its view when sglang builds it (`attach`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sglang_pdd.kernels.kv_pack_layout import PACKABLE_DTYPES, PackLayout
from sglang_pdd.kernels.warmup import warm_up_pack

logger = logging.getLogger(__name__)

POOL_CLASSES = ("MHATokenToKVPool", "MLATokenToKVPool")
_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}
ATTR = "_pdd_kv_pool_view"  # on the KV manager: a KVPoolView, or the reason there is none


@dataclass(frozen=True)
class KVPoolView:
    k: list[torch.Tensor]
    v: list[torch.Tensor]
    page_size: int

    @classmethod
    def of(cls, pool: Any, page_size: int, manager: Any = None) -> "KVPoolView | str":
        """The view of `pool`, or why the packed path cannot use it."""
        if type(pool).__name__ not in POOL_CLASSES:
            return f"pool {type(pool).__name__}"
        if getattr(pool, "use_hnd", False) or getattr(pool, "store_dtype", pool.dtype) != pool.dtype:
            return "pool layout"
        mla = type(pool).__name__ == "MLATokenToKVPool"
        if mla and getattr(pool, "use_dsa", False):
            return "pool with a DSA index"
        if mla:  # the latent rows: K alone
            k, v = getattr(pool, "kv_buffer", None), []
        else:
            k, v = getattr(pool, "k_buffer", None), getattr(pool, "v_buffer", None)
        if not isinstance(k, list) or not isinstance(v, list) or not k or (not mla and len(k) != len(v)):
            return "pool buffers"
        if k[0].dim() != 3:
            return f"pool buffers of {k[0].dim()} dims"
        if k[0].dtype not in PACKABLE_DTYPES:
            return f"pool dtype {k[0].dtype}"
        if manager is not None:
            if getattr(manager, "attn_tp_size", 1) != 1 or getattr(manager, "pp_size", 1) != 1:
                return "attention TP/PP"
            ptrs = list(getattr(getattr(manager, "kv_args", None), "kv_data_ptrs", []) or [])
            if ptrs != [t.data_ptr() for t in k] + [t.data_ptr() for t in v]:
                return "kv_args differ from the pool (draft or extra buffers)"
        return cls(list(k), list(v), int(page_size))

    @property
    def device(self) -> torch.device:
        return self.k[0].device

    @property
    def dtype_name(self) -> str:
        return _DTYPE_NAMES[self.k[0].dtype]

    def geometry(self) -> tuple:
        """(page_size, layers, k_heads, k_head_dim, v_heads, v_head_dim, dtype): as in LandingOffer (MLA:
        v_heads = v_head_dim = 0)."""
        k = self.k[0]
        v_heads, v_dim = (self.v[0].shape[1], self.v[0].shape[2]) if self.v else (0, 0)
        return (self.page_size, len(self.k), k.shape[1], k.shape[2], v_heads, v_dim, self.dtype_name)

    def layout(self, num_pages: int, fp8: bool) -> PackLayout:
        return PackLayout.for_buffers(self.k, self.v, num_pages * self.page_size, fp8)

    def slots(self, pages: np.ndarray) -> torch.Tensor:
        """Token slots of whole pages, in page order (page p holds slots p*page_size ..)."""
        p = torch.as_tensor(np.asarray(pages, dtype=np.int64))
        s = (p[:, None] * self.page_size + torch.arange(self.page_size)).reshape(-1)
        return s.to(self.device)


def attach(manager: Any, pool: Any) -> None:
    """Give a KV manager its pool view (or the reason it has none); called after sglang built it."""
    page_size = getattr(pool, "page_size", None) or 1
    setattr(manager, ATTR, KVPoolView.of(pool, page_size, manager))


def warm_up(manager: Any, fp8: bool) -> None:
    """On CUDA: compile the pack/unpack kernels for this geometry at start-up and check a round trip;
    a kernel that fails it leaves the manager without a view (page by page)."""
    view = view_of(manager)
    if not isinstance(view, KVPoolView) or view.device.type != "cuda":
        return

    geo = view.geometry()
    try:
        rep = warm_up_pack(geo[1], geo[2], geo[3], geo[4], geo[5], view.k[0].dtype, view.device, fp8=fp8)
    except Exception as e:  # never the server: the packed path stays off
        rep = None
        logger.exception("packed WAN kernels: warm-up failed")
        setattr(manager, ATTR, f"warm-up error: {e}")
    if rep is not None and not rep.ok:
        logger.error("packed WAN kernels disagree with their reference (%s): page by page", "; ".join(rep.mismatches))
        setattr(manager, ATTR, "self-check failed")
    elif rep is not None:
        logger.info("packed WAN kernels warmed up in %.1fs", rep.seconds)


def view_of(manager: Any) -> "KVPoolView | str":
    return getattr(manager, ATTR, "no pool view (manager built before the plugin loaded)")
