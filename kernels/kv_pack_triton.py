"""Triton kernels that gather a request's KV rows from all layers into one staging buffer, and back.

A "buffer table" is a uint64 tensor of per-layer data pointers (sglang's MHATokenToKVPool keeps one,
`k_data_ptrs` / `v_data_ptrs`); all layers of a table share shape, dtype and strides. A slot's row is
`heads * head_dim` contiguous elements at `base + slot * slot_stride`. Packed region layout: [layer][token][row].

Plain kernels copy elements unchanged. The fp8 kernels quantize each (layer, token, head) block of
`head_dim` elements to e4m3 with one fp32 scale (amax / FP8_MAX), and dequantize on the way back;
the arithmetic matches `kv_pack_ref.quantize_fp8_blocks` bit for bit.

Only imported lazily, by `kv_pack.py`, so `sglang_pdd.kernels` imports without triton.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def pack_rows_kernel(
    Ptrs,
    Slots,
    Out,
    n_tokens,
    row,
    slot_stride,
    BLOCK_T: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    layer = tl.program_id(0)
    offs_t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_w = tl.program_id(2) * BLOCK_W + tl.arange(0, BLOCK_W)
    t_ok = offs_t < n_tokens
    mask = t_ok[:, None] & (offs_w < row)[None, :]
    base = tl.load(Ptrs + layer).to(tl.pointer_type(Out.dtype.element_ty))
    slots = tl.load(Slots + offs_t, mask=t_ok, other=0).to(tl.int64)
    vals = tl.load(base + slots[:, None] * slot_stride + offs_w[None, :], mask=mask)
    dst_row = layer.to(tl.int64) * n_tokens + offs_t
    tl.store(Out + dst_row[:, None] * row + offs_w[None, :], vals, mask=mask)


@triton.jit
def unpack_rows_kernel(
    Packed,
    Ptrs,
    Slots,
    n_tokens,
    row,
    slot_stride,
    BLOCK_T: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    layer = tl.program_id(0)
    offs_t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_w = tl.program_id(2) * BLOCK_W + tl.arange(0, BLOCK_W)
    t_ok = offs_t < n_tokens
    mask = t_ok[:, None] & (offs_w < row)[None, :]
    base = tl.load(Ptrs + layer).to(tl.pointer_type(Packed.dtype.element_ty))
    slots = tl.load(Slots + offs_t, mask=t_ok, other=0).to(tl.int64)
    src_row = layer.to(tl.int64) * n_tokens + offs_t
    vals = tl.load(Packed + src_row[:, None] * row + offs_w[None, :], mask=mask)
    tl.store(base + slots[:, None] * slot_stride + offs_w[None, :], vals, mask=mask)


@triton.jit
def pack_fp8_kernel(
    Ptrs,
    Slots,
    OutQ,
    OutScale,
    n_tokens,
    heads,
    slot_stride,
    HEAD_DIM: tl.constexpr,
    SRC_DTYPE: tl.constexpr,
    FP8_MAX: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    layer = tl.program_id(0)
    offs_t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    head = tl.program_id(2)
    offs_d = tl.arange(0, BLOCK_D)
    t_ok = offs_t < n_tokens
    mask = t_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    base = tl.load(Ptrs + layer).to(tl.pointer_type(SRC_DTYPE))
    slots = tl.load(Slots + offs_t, mask=t_ok, other=0).to(tl.int64)
    x = tl.load(base + slots[:, None] * slot_stride + head * HEAD_DIM + offs_d[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    # Correctly rounded divisions (`/` is approximate on GPUs) keep the bytes identical to torch's.
    scale = tl.where(amax > 0.0, tl.math.div_rn(amax, tl.full(amax.shape, FP8_MAX, tl.float32)), 1.0)
    q = tl.math.div_rn(x, scale[:, None]).to(tl.float8e4nv)
    dst_row = layer.to(tl.int64) * n_tokens + offs_t
    row = heads * HEAD_DIM
    tl.store(OutQ + dst_row[:, None] * row + head * HEAD_DIM + offs_d[None, :], q, mask=mask)
    tl.store(OutScale + dst_row * heads + head, scale, mask=t_ok)


@triton.jit
def unpack_fp8_kernel(
    PackedQ,
    Scales,
    Ptrs,
    Slots,
    n_tokens,
    row,
    heads,
    slot_stride,
    HEAD_DIM: tl.constexpr,
    DST_DTYPE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    """Rows of all heads per program (as the plain kernel), each element times its head's scale."""
    layer = tl.program_id(0)
    offs_t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_w = tl.program_id(2) * BLOCK_W + tl.arange(0, BLOCK_W)
    t_ok = offs_t < n_tokens
    mask = t_ok[:, None] & (offs_w < row)[None, :]
    src_row = layer.to(tl.int64) * n_tokens + offs_t
    q = tl.load(PackedQ + src_row[:, None] * row + offs_w[None, :], mask=mask, other=0.0)
    scale = tl.load(Scales + src_row[:, None] * heads + (offs_w // HEAD_DIM)[None, :], mask=mask, other=1.0)
    x = q.to(tl.float32) * scale
    base = tl.load(Ptrs + layer).to(tl.pointer_type(DST_DTYPE))
    slots = tl.load(Slots + offs_t, mask=t_ok, other=0).to(tl.int64)
    tl.store(base + slots[:, None] * slot_stride + offs_w[None, :], x.to(DST_DTYPE), mask=mask)
