"""Pack a request's KV rows (all layers, K and V) into one staging buffer for the WAN, and unpack on MD.

Mooncake TCP moves many small slices stop-and-wait per lane, so page-by-page KV over a high-RTT link is
latency bound. P gathers the missed rows into one contiguous buffer (`pack_kv`), sends it as one or a
few large slices, and MD scatters it into its own slots (`unpack_kv`). Slot numbers never cross: each side
passes its own slot list, in the same token order.

    k_buffers, v_buffers  one tensor per layer, [num_slots, heads, head_dim] (MHATokenToKVPool.k_buffer/v_buffer);
                          an MLA pool passes its latent buffers [num_slots, 1, kv_lora_rank + rope] as
                          k_buffers and no v_buffers (MLATokenToKVPool.kv_buffer, [])
    slots                 [n] int32/int64 slot of each token, in token order

`fp8=True` (opt-in) stores e4m3 with one fp32 scale per (layer, token, head): about half the bytes of a
bf16/fp16 pool, a quarter of fp32. It is lossy; see docs/kernels.md before enabling it.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import torch

from .backend import resolve_backend
from .checks import (
    INDEX_DTYPES,
    require,
    require_dim,
    require_dtype,
    require_index_range,
    require_same_device,
)
from .kv_pack_layout import FP8_MAX, PACKABLE_DTYPES, PackLayout
from .kv_pack_ref import pack_kv_ref, unpack_kv_ref

logger = logging.getLogger(__name__)

BLOCK_T = 8
BLOCK_W = 512
_PTR_TABLES: OrderedDict[tuple, torch.Tensor] = OrderedDict()
_CHECKED_POOLS: OrderedDict[tuple, None] = OrderedDict()


def _check_buffers(name: str, bufs: list[torch.Tensor]) -> None:
    require(len(bufs) > 0, f"{name} is empty")
    first = bufs[0]
    for i, b in enumerate(bufs):
        require_dim(f"{name}[{i}]", b, 3)
        require(b.shape == first.shape and b.stride() == first.stride() and b.dtype == first.dtype
                and b.device == first.device,
                f"{name}[{i}] differs from {name}[0] in shape, stride, dtype or device")
    require_dtype(f"{name}[0]", first, PACKABLE_DTYPES)
    require(first.stride(2) == 1 and first.stride(1) == first.shape[2],
            f"{name}: each slot's [heads, head_dim] must be contiguous, strides {first.stride()}")


def _pool_key(bufs: list[torch.Tensor]) -> tuple:
    first = bufs[0]
    return (tuple(b.data_ptr() for b in bufs), tuple(first.shape), first.stride(), first.dtype, str(first.device))


def check_kv_buffers(k_buffers: list[torch.Tensor], v_buffers: list[torch.Tensor], slots: torch.Tensor,
                     validate_indices: bool, unique: bool) -> None:
    """Raise KernelArgumentError unless the buffers form an MHA pool (or, with no V buffers, an MLA
    pool's latent buffers) and `slots` index it.

    A pool that passed is remembered by its buffers' addresses and geometry: checking 2 x 32 layers
    one by one costs the host hundreds of microseconds, more than packing a 1K-token request on an
    H200, and a server packs from the same pool every time."""
    key = (_pool_key(k_buffers), _pool_key(v_buffers) if v_buffers else None) if k_buffers else None
    if key is None or key not in _CHECKED_POOLS:
        _check_buffers("k_buffers", k_buffers)
        if v_buffers:
            _check_buffers("v_buffers", v_buffers)
            require(len(k_buffers) == len(v_buffers), f"{len(k_buffers)} K layers but {len(v_buffers)} V layers")
            require(k_buffers[0].dtype == v_buffers[0].dtype and k_buffers[0].shape[0] == v_buffers[0].shape[0],
                    "K and V buffers must share dtype and slot count")
        _CHECKED_POOLS[key] = None
        while len(_CHECKED_POOLS) > 16:
            _CHECKED_POOLS.popitem(last=False)
    require_dim("slots", slots, 1)
    require_dtype("slots", slots, INDEX_DTYPES)
    require_same_device({"k_buffers": k_buffers[0], "v_buffers": (v_buffers or k_buffers)[0], "slots": slots})
    if validate_indices:
        require_index_range("slots", slots, k_buffers[0].shape[0])
        if unique and slots.numel() > 1:
            require(torch.unique(slots).numel() == slots.numel(), "slots must be unique (a scatter target twice)")


def _check_staging(name: str, buf: torch.Tensor, layout: PackLayout, device: torch.device) -> None:
    require_dim(name, buf, 1)
    require(buf.dtype == torch.uint8 and buf.is_contiguous(), f"{name} must be a contiguous uint8 tensor")
    require(buf.numel() == layout.nbytes, f"{name} has {buf.numel()} bytes, layout needs {layout.nbytes}")
    require(buf.device == device, f"{name} is on {buf.device}, KV on {device}")
    require(buf.data_ptr() % 16 == 0, f"{name} must be 16-byte aligned")


def _ptr_table(bufs: list[torch.Tensor]) -> torch.Tensor:
    key = (str(bufs[0].device), tuple(b.data_ptr() for b in bufs))
    table = _PTR_TABLES.get(key)
    if table is None:
        table = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64, device=bufs[0].device)
        _PTR_TABLES[key] = table
        while len(_PTR_TABLES) > 16:
            _PTR_TABLES.popitem(last=False)
    return table


def _tl_dtype(dtype: torch.dtype):  # noqa: ANN202 - a triton.language dtype
    import triton.language as tl

    return {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}[dtype]


def launch_pack_kernels(layout: PackLayout, packed: torch.Tensor, k_buffers: list[torch.Tensor],
                        v_buffers: list[torch.Tensor], slots: torch.Tensor, direction: str) -> None:
    """Launch the Triton pack ("pack") or unpack ("unpack") kernels; no checks (the public calls check).

    One launch moves K and V together when their packed regions are adjacent (`layout.kv_adjacent`: the
    table lists K's layers then V's, and the region is [2 x layer][token][row]); else one per kind (MLA:
    K alone). A launch costs the host tens of microseconds, which is the time of a 1K-token request."""
    if layout.num_tokens == 0:
        return
    if layout.kv_adjacent and k_buffers[0].stride() == v_buffers[0].stride():
        o = layout.offsets
        end = o["v_data"] + layout.data_elems("v") * layout.elem_bytes
        data = packed[: end] if layout.fp8 else packed[: end].view(layout.dtype)
        scales = None
        if layout.fp8:
            scales = packed[o["k_scale"] : o["k_scale"] + 4 * (layout.scale_elems("k") + layout.scale_elems("v"))]
            scales = scales.view(torch.float32)
        _launch(layout, data, scales, k_buffers + v_buffers, 2 * layout.num_layers, slots, "k", direction)
        return
    for kind, bufs in (("k", k_buffers), ("v", v_buffers)):
        if not bufs:  # MLA: no V region
            continue
        scales = layout.scale_view(packed, kind) if layout.fp8 else None
        _launch(layout, layout.data_view(packed, kind), scales, bufs, layout.num_layers, slots, kind, direction)


def _launch(layout: PackLayout, data: torch.Tensor, scales: torch.Tensor | None, bufs: list[torch.Tensor],
            tables: int, slots: torch.Tensor, kind: str, direction: str) -> None:
    """One launch over `tables` buffers (grid axis 0), rows of `kind`'s width."""
    from triton import cdiv, next_power_of_2

    from . import kv_pack_triton as kern

    n = layout.num_tokens
    table = _ptr_table(bufs)
    heads, dim, slot_stride = bufs[0].shape[1], bufs[0].shape[2], bufs[0].stride(0)
    row = layout.row(kind)
    block_w = min(BLOCK_W, next_power_of_2(row))
    grid = (tables, cdiv(n, BLOCK_T), cdiv(row, block_w))
    if layout.fp8:
        fp8_data = data.view(torch.float8_e4m3fn)
        if direction == "pack":  # one head per program: its amax is the scale
            kern.pack_fp8_kernel[(tables, cdiv(n, BLOCK_T), heads)](
                table, slots, fp8_data, scales, n, heads, slot_stride, HEAD_DIM=dim,
                SRC_DTYPE=_tl_dtype(layout.dtype), FP8_MAX=FP8_MAX, BLOCK_T=BLOCK_T, BLOCK_D=next_power_of_2(dim))
        else:  # whole rows per program, as the plain kernel (one head per program was 1.8x its time)
            kern.unpack_fp8_kernel[grid](fp8_data, scales, table, slots, n, row, heads, slot_stride, HEAD_DIM=dim,
                                         DST_DTYPE=_tl_dtype(layout.dtype), BLOCK_T=BLOCK_T, BLOCK_W=block_w)
        return
    if direction == "pack":
        kern.pack_rows_kernel[grid](table, slots, data, n, row, slot_stride, BLOCK_T=BLOCK_T, BLOCK_W=block_w)
    else:
        kern.unpack_rows_kernel[grid](data, table, slots, n, row, slot_stride, BLOCK_T=BLOCK_T, BLOCK_W=block_w)


def pack_kv(
    k_buffers: list[torch.Tensor],
    v_buffers: list[torch.Tensor],
    slots: torch.Tensor,
    *,
    fp8: bool = False,
    out: torch.Tensor | None = None,
    validate_indices: bool = True,
    backend: str = "auto",
) -> tuple[torch.Tensor, PackLayout]:
    """Gather rows `slots` of every layer into one uint8 staging buffer; returns (buffer, layout).

    `out` may be a preallocated (e.g. transfer-engine registered) buffer of exactly `layout.nbytes`.
    """
    check_kv_buffers(k_buffers, v_buffers, slots, validate_indices, unique=False)
    layout = PackLayout.for_buffers(k_buffers, v_buffers, slots.numel(), fp8)
    device = slots.device
    if out is None:
        out = torch.empty(layout.nbytes, dtype=torch.uint8, device=device)
    _check_staging("out", out, layout, device)
    for start, end in layout.gaps():
        out[start:end].zero_()
    if resolve_backend(backend, device) == "torch":
        return pack_kv_ref(layout, k_buffers, v_buffers, slots, out), layout
    launch_pack_kernels(layout, out, k_buffers, v_buffers, slots, "pack")
    return out, layout


def unpack_kv(
    packed: torch.Tensor,
    k_buffers: list[torch.Tensor],
    v_buffers: list[torch.Tensor],
    slots: torch.Tensor,
    *,
    fp8: bool = False,
    validate_indices: bool = True,
    backend: str = "auto",
) -> PackLayout:
    """Scatter a buffer made by `pack_kv` into rows `slots` (this side's slots, same token order).

    Writes exactly those rows of every layer's K and V and nothing else; `slots` must be unique.
    The layout is rebuilt from this side's buffers, so a geometry mismatch with the packer fails the
    size check instead of scattering garbage.
    """
    check_kv_buffers(k_buffers, v_buffers, slots, validate_indices, unique=True)
    layout = PackLayout.for_buffers(k_buffers, v_buffers, slots.numel(), fp8)
    _check_staging("packed", packed, layout, slots.device)
    if resolve_backend(backend, slots.device) == "torch":
        unpack_kv_ref(layout, packed, k_buffers, v_buffers, slots)
        return layout
    launch_pack_kernels(layout, packed, k_buffers, v_buffers, slots, "unpack")
    return layout
