"""Handoff attention: k new tokens per request against a long cached prefix, read from sglang's token pool.

The launcher of the split-KV kernels in `handoff_attention_triton.py`. It takes sglang-style inputs,
the ones an attention backend has in `forward_extend` after the new tokens' K/V went into the pool:

    q                [T, Hq, D]   queries of the new tokens, requests back to back (T = sum(extend_lens))
    k_buffer         [S, Hkv, D]  one layer's K of MHATokenToKVPool (`pool.get_key_buffer(layer_id)`)
    v_buffer         [S, Hkv, Dv] the same layer's V
    req_to_token     [R, C]       `req_to_token_pool.req_to_token` (int32 slot per position)
    req_pool_indices [B]          row of each request in req_to_token
    prefix_lens      [B]          cached positions before the new tokens (`extend_prefix_lens`)
    extend_lens      [B]          new tokens per request (`extend_seq_lens`)

and writes out [T, Hq, Dv]. It checks shapes, dtypes, strides, devices and index bounds first, then runs
the Triton kernels (CUDA, or CPU under TRITON_INTERPRET=1) or the torch reference (`backend`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from .backend import resolve_backend
from .checks import (
    INDEX_DTYPES,
    host_ints,
    require,
    require_dim,
    require_dtype,
    require_index_range,
    require_same_device,
    require_unit_last_stride,
)
from .handoff_attention_ref import handoff_attention_ref
from .handoff_tiling import HandoffAttentionConfig, choose_tiling, sm_count

logger = logging.getLogger(__name__)

ATTN_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_GROUP = 128
MAX_GRID_YZ = 65535  # CUDA's limit on the grid's second and third dimensions


@dataclass(frozen=True)
class HandoffPlan:
    """Everything a launch of the handoff kernels is made of; also what the compile-only check compiles."""

    group: int
    tok_per_tile: int
    n_qtiles: int
    n_splits: int
    split_len: int
    block_m: int
    block_n: int
    block_d: int
    block_dv: int
    num_warps: int
    num_stages: int
    partial_grid: tuple[int, int, int]
    reduce_grid: tuple[int, int, int]
    partial_args: tuple[Any, ...] = field(repr=False)
    partial_meta: dict[str, Any] = field(repr=False)
    reduce_args: tuple[Any, ...] | None = field(repr=False)
    reduce_meta: dict[str, Any] = field(repr=False)
    layout: tuple[Any, ...] = field(repr=False, default=())  # (shape, stride, dtype, device) of q, k, v, out


def _tensor_layout(*tensors: torch.Tensor) -> tuple[Any, ...]:
    return tuple((tuple(t.shape), t.stride(), t.dtype, t.device) for t in tensors)


def check_handoff_inputs(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    out: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    prefix_cpu: list[int],
    extend_cpu: list[int],
    page_size: int,
    validate_indices: bool,
) -> None:
    """Raise KernelArgumentError unless the inputs satisfy the contract of the module docstring."""
    for name, t, nd in (("q", q, 3), ("k_buffer", k_buffer, 3), ("v_buffer", v_buffer, 3), ("out", out, 3)):
        require_dim(name, t, nd)
        require_unit_last_stride(name, t)
    require_dim("req_to_token", req_to_token, 2)
    require_unit_last_stride("req_to_token", req_to_token)
    for name, t in (("req_pool_indices", req_pool_indices), ("prefix_lens", prefix_lens), ("extend_lens", extend_lens)):
        require_dim(name, t, 1)
        require_dtype(name, t, INDEX_DTYPES)
    require_dtype("req_to_token", req_to_token, INDEX_DTYPES)
    require_dtype("q", q, ATTN_DTYPES)
    require(k_buffer.dtype == q.dtype and v_buffer.dtype == q.dtype and out.dtype == q.dtype,
            f"q, k_buffer, v_buffer, out must share a dtype, got {q.dtype}, {k_buffer.dtype}, "
            f"{v_buffer.dtype}, {out.dtype} (quantized KV pools are not supported)")
    require_same_device({"q": q, "k_buffer": k_buffer, "v_buffer": v_buffer, "out": out,
                         "req_to_token": req_to_token, "req_pool_indices": req_pool_indices,
                         "prefix_lens": prefix_lens, "extend_lens": extend_lens})
    t_total, hq, d = q.shape
    slots, hkv, dk = k_buffer.shape
    require(dk == d, f"k_buffer head_dim {dk} != q head_dim {d}")
    require(v_buffer.shape[0] == slots and v_buffer.shape[1] == hkv,
            f"v_buffer shape {tuple(v_buffer.shape)} does not match k_buffer {tuple(k_buffer.shape)}")
    require(hkv > 0 and hq % hkv == 0, f"q heads {hq} must be a multiple of kv heads {hkv}")
    require(hq // hkv <= MAX_GROUP, f"GQA group {hq // hkv} > {MAX_GROUP} is not supported")
    require(tuple(out.shape) == (t_total, hq, v_buffer.shape[2]),
            f"out shape {tuple(out.shape)} != {(t_total, hq, v_buffer.shape[2])}")
    batch = req_pool_indices.numel()
    require(prefix_lens.numel() == batch and extend_lens.numel() == batch,
            f"req_pool_indices, prefix_lens, extend_lens lengths differ: "
            f"{batch}, {prefix_lens.numel()}, {extend_lens.numel()}")
    require(all(p >= 0 for p in prefix_cpu) and all(e >= 0 for e in extend_cpu),
            "prefix_lens and extend_lens must be >= 0")
    require(sum(extend_cpu) == t_total, f"sum(extend_lens) = {sum(extend_cpu)} != q rows {t_total}")
    kv_lens = [p + e for p, e in zip(prefix_cpu, extend_cpu)]
    require(max(kv_lens, default=0) <= req_to_token.shape[1],
            f"prefix + extend up to {max(kv_lens, default=0)} exceeds req_to_token width {req_to_token.shape[1]}")
    require(page_size >= 1 and page_size & (page_size - 1) == 0, f"page_size must be a power of two, got {page_size}")
    if validate_indices:
        _check_token_rows(req_to_token, req_pool_indices, kv_lens, slots, page_size)


def _check_token_rows(
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, kv_lens: list[int], slots: int, page_size: int
) -> None:
    """Rows in range, every slot the kernel will read in range, pages consecutive (syncs on CUDA)."""
    require_index_range("req_pool_indices", req_pool_indices, req_to_token.shape[0])
    max_len = max(kv_lens, default=0)
    if max_len == 0:
        return
    rows = req_to_token[req_pool_indices.long(), :max_len].long()
    pos = torch.arange(max_len, device=rows.device)
    used = pos[None, :] < torch.tensor(kv_lens, device=rows.device)[:, None]
    require_index_range("req_to_token slots", rows[used], slots)
    if page_size > 1:
        in_page = pos % page_size
        expect = rows[:, pos - in_page] + in_page[None, :]
        bad = used & (rows != expect)
        require(not bool(bad.any()),
                f"req_to_token is not paged with page_size={page_size}: slots within a page must be consecutive")


def plan_handoff_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    out: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    prefix_cpu: list[int],
    extend_cpu: list[int],
    sm_scale: float,
    page_size: int,
    config: HandoffAttentionConfig,
) -> HandoffPlan:
    """Choose tiles and partitions, allocate the partial buffers, and lay out the kernel arguments."""
    t_total, hq, d = q.shape
    hkv, dv = k_buffer.shape[1], v_buffer.shape[2]
    group = hq // hkv
    batch = len(extend_cpu)
    max_ext = max(extend_cpu, default=0)
    tiling = choose_tiling(group, hkv, d, dv, prefix_cpu, extend_cpu, sm_count(q.device), config)
    require(batch * hkv <= MAX_GRID_YZ and tiling.n_splits <= MAX_GRID_YZ,
            f"{batch} requests x {hkv} KV heads and {tiling.n_splits} partitions must each be <= {MAX_GRID_YZ}")
    block_m, block_n, block_d, block_dv = tiling.block_m, tiling.block_n, tiling.block_d, tiling.block_dv
    tok_per_tile, n_qtiles, n_splits, split_len = (tiling.tok_per_tile, tiling.n_qtiles, tiling.n_splits,
                                                   tiling.split_len)
    direct, num_warps = tiling.direct, tiling.num_warps

    qo_indptr = torch.zeros(batch + 1, dtype=torch.int64, device=q.device)
    torch.cumsum(extend_lens.to(torch.int64), 0, out=qo_indptr[1:])
    if direct:
        mid_o = torch.empty((1, 1, 1, 1), dtype=torch.float32, device=q.device)
        mid_lse = torch.empty((1, 1, 1), dtype=torch.float32, device=q.device)
    else:
        mid_o = torch.empty((t_total, hq, n_splits, dv), dtype=torch.float32, device=q.device)
        mid_lse = torch.empty((t_total, hq, n_splits), dtype=torch.float32, device=q.device)

    log2e = 1.4426950408889634
    partial_args = (
        q, k_buffer, v_buffer, out, mid_o, mid_lse, req_to_token, req_pool_indices, prefix_lens, extend_lens,
        qo_indptr, sm_scale * log2e, split_len, hkv,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        out.stride(0), out.stride(1), mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1), req_to_token.stride(0),
    )
    partial_meta = dict(
        G=group, TOK_PER_TILE=tok_per_tile, D=d, DV=dv, BLOCK_D=block_d, BLOCK_DV=block_dv,
        BLOCK_M=block_m, BLOCK_N=block_n, PAGE_SIZE=page_size, DIRECT_OUT=direct,
        INPUT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=num_warps, num_stages=tiling.num_stages,
    )
    reduce_args = None if direct else (
        out, mid_o, mid_lse, prefix_lens, extend_lens, qo_indptr, split_len,
        out.stride(0), out.stride(1), mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1),
    )
    reduce_meta = dict(DV=dv, BLOCK_DV=block_dv, num_warps=4 if block_dv <= 128 else 8, num_stages=1)
    return HandoffPlan(
        group=group, tok_per_tile=tok_per_tile, n_qtiles=n_qtiles, n_splits=n_splits, split_len=split_len,
        block_m=block_m, block_n=block_n, block_d=block_d, block_dv=block_dv, num_warps=num_warps,
        num_stages=tiling.num_stages, partial_grid=(n_qtiles, n_splits, batch * hkv),
        reduce_grid=(max(1, max_ext), batch, hq), partial_args=partial_args, partial_meta=partial_meta,
        reduce_args=reduce_args, reduce_meta=reduce_meta, layout=_tensor_layout(q, k_buffer, v_buffer, out),
    )


def rebind_plan(plan: HandoffPlan, q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
                out: torch.Tensor) -> HandoffPlan:
    """The same plan on another layer's tensors, which must match the planned ones in shape, stride,
    dtype and device (all layers of an MHATokenToKVPool do). The partial buffers are shared: launches
    on one stream run in order, so layer after layer may reuse them."""
    require(_tensor_layout(q, k_buffer, v_buffer, out) == plan.layout,
            "rebind_plan: q, k_buffer, v_buffer, out differ from the planned shapes/strides/dtypes/devices")
    partial_args = (q, k_buffer, v_buffer, out) + plan.partial_args[4:]
    reduce_args = None if plan.reduce_args is None else (out,) + plan.reduce_args[1:]
    return replace(plan, partial_args=partial_args, reduce_args=reduce_args)


def run_plan(plan: HandoffPlan) -> None:
    """Launch the kernels of `plan` (partial pass, then the reduction when there are partitions)."""
    from . import handoff_attention_triton as kern

    if plan.partial_grid[2] == 0:
        return
    kern.handoff_attn_partial_kernel[plan.partial_grid](*plan.partial_args, **plan.partial_meta)
    if plan.reduce_args is not None:
        kern.handoff_attn_reduce_kernel[plan.reduce_grid](*plan.reduce_args, **plan.reduce_meta)


def _checked_inputs(q, k_buffer, v_buffer, req_to_token, req_pool_indices, prefix_lens, extend_lens, sm_scale,
                    page_size, out, prefix_lens_cpu, extend_lens_cpu,
                    validate_indices) -> tuple[torch.Tensor, list[int], list[int], float]:
    """The prologue of both entry points: `out` (allocated if None), host lengths, checks, the scale."""
    if out is None:
        out = torch.empty((q.shape[0], q.shape[1], v_buffer.shape[-1]), dtype=q.dtype, device=q.device)
    prefix_cpu = host_ints("prefix_lens_cpu", prefix_lens_cpu, prefix_lens)
    extend_cpu = host_ints("extend_lens_cpu", extend_lens_cpu, extend_lens)
    check_handoff_inputs(q, k_buffer, v_buffer, out, req_to_token, req_pool_indices, prefix_lens, extend_lens,
                         prefix_cpu, extend_cpu, page_size, validate_indices)
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    return out, prefix_cpu, extend_cpu, scale


def prepare_handoff_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    *,
    sm_scale: float | None = None,
    page_size: int = 1,
    out: torch.Tensor | None = None,
    prefix_lens_cpu: Sequence[int] | None = None,
    extend_lens_cpu: Sequence[int] | None = None,
    validate_indices: bool = True,
    config: HandoffAttentionConfig | None = None,
) -> HandoffPlan:
    """Check the inputs and plan the Triton launch once per forward batch (arguments as `handoff_attention`).

    Per layer, `run_plan(rebind_plan(plan, q, k_buffer, v_buffer, out))` then costs two launches and a
    tuple rebuild instead of the checks and the plan.
    """
    out, prefix_cpu, extend_cpu, scale = _checked_inputs(
        q, k_buffer, v_buffer, req_to_token, req_pool_indices, prefix_lens, extend_lens, sm_scale, page_size, out,
        prefix_lens_cpu, extend_lens_cpu, validate_indices)
    return plan_handoff_attention(q, k_buffer, v_buffer, out, req_to_token, req_pool_indices, prefix_lens,
                                  extend_lens, prefix_cpu, extend_cpu, scale, page_size,
                                  config or HandoffAttentionConfig())


def handoff_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    *,
    sm_scale: float | None = None,
    page_size: int = 1,
    out: torch.Tensor | None = None,
    prefix_lens_cpu: Sequence[int] | None = None,
    extend_lens_cpu: Sequence[int] | None = None,
    validate_indices: bool = True,
    backend: str = "auto",
    config: HandoffAttentionConfig | None = None,
) -> torch.Tensor:
    """Attention of each request's new tokens over its cached prefix and, causally, over each other.

    `prefix_lens_cpu` / `extend_lens_cpu` (sglang's `extend_prefix_lens_cpu` / `extend_seq_lens_cpu`)
    spare a device sync; `validate_indices=False` skips the index-bound checks, which sync on CUDA.
    Returns `out` ([T, Hq, Dv], dtype of q).
    """
    out, prefix_cpu, extend_cpu, scale = _checked_inputs(
        q, k_buffer, v_buffer, req_to_token, req_pool_indices, prefix_lens, extend_lens, sm_scale, page_size, out,
        prefix_lens_cpu, extend_lens_cpu, validate_indices)
    if resolve_backend(backend, q.device) == "torch":
        rows = [int(r) for r in req_pool_indices.tolist()]
        return handoff_attention_ref(q, k_buffer, v_buffer, out, req_to_token, rows, prefix_cpu, extend_cpu, scale)
    if q.shape[0] == 0:
        return out
    plan = plan_handoff_attention(q, k_buffer, v_buffer, out, req_to_token, req_pool_indices, prefix_lens,
                                  extend_lens, prefix_cpu, extend_cpu, scale, page_size,
                                  config or HandoffAttentionConfig())
    logger.debug("handoff attention plan: %s", plan)
    run_plan(plan)
    return out
