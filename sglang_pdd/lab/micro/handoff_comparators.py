"""The kernels the handoff kernel benchmark compares against: sglang's extend and split-KV Triton
kernels and flashinfer's paged prefill, each built for one `handoff_kernel.Problem` (imported only
when its package is installed: `PACKAGE` names it)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from sglang_pdd.lab.micro.handoff_kernel import Problem

PACKAGE = {"sgl extend": "sglang", "sgl split": "sglang", "flashinfer": "flashinfer"}


def _sglang_args(p: Problem, out: torch.Tensor) -> tuple[Any, ...]:
    k_new = p.k_buffer[p.new_slots].contiguous()
    v_new = p.v_buffer[p.new_slots].contiguous()
    return (p.q, k_new, v_new, out, p.k_buffer, p.v_buffer, p.qo_indptr, p.kv_indptr, p.prefix_slots,
            None, True, None, p.k, 1.0, 1.0)


def _sgl_extend(p: Problem, out: torch.Tensor) -> Callable[[], Any]:
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    args = _sglang_args(p, out)
    return lambda: extend_attention_fwd(*args, sm_scale=p.sm_scale)


def _sgl_split(p: Problem, out: torch.Tensor) -> Callable[[], Any]:
    from sglang.kernels.ops.attention.verify_splitkv import verify_splitkv_fwd

    args = _sglang_args(p, out)
    if not verify_splitkv_fwd(*args, sm_scale=p.sm_scale, max_bs=p.batch + 1):
        raise RuntimeError("verify_splitkv_fwd declined the case")
    return lambda: verify_splitkv_fwd(*args, sm_scale=p.sm_scale, max_bs=p.batch + 1)


def _flashinfer(p: Problem, out: torch.Tensor) -> Callable[[], Any]:
    import flashinfer

    device = p.q.device
    workspace = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=device)
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
    pages_per_req = math.ceil((p.prefix + p.k) / p.page)
    kv_page_indptr = torch.arange(0, p.batch + 1, dtype=torch.int32, device=device) * pages_per_req
    kv_page_indices = torch.cat(p.page_ids).int().to(device)
    last = (p.prefix + p.k) - (pages_per_req - 1) * p.page
    last_page_len = torch.full((p.batch,), last, dtype=torch.int32, device=device)
    wrapper.plan(p.qo_indptr, kv_page_indptr, kv_page_indices, last_page_len, p.hq, p.hkv, p.dim, p.page,
                 causal=True, sm_scale=p.sm_scale, q_data_type=p.q.dtype, kv_data_type=p.k_buffer.dtype)
    k_paged = p.k_buffer.view(-1, p.page, p.hkv, p.dim)
    v_paged = p.v_buffer.view(-1, p.page, p.hkv, p.dim)
    return lambda: wrapper.run(p.q, (k_paged, v_paged), out=out)


COMPARATORS: dict[str, Callable[["Problem", torch.Tensor], Callable[[], Any]]] = {
    "sgl extend": _sgl_extend,
    "sgl split": _sgl_split,
    "flashinfer": _flashinfer,
}
