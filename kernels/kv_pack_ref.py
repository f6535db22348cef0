"""Plain-torch reference of KV packing: the oracle of the tests and the CPU fallback.

Same layout as the Triton kernels (`kv_pack.PackLayout`): K rows of all layers, then V rows, each region
[layer][token][heads * head_dim]; with fp8, e4m3 payloads and then fp32 scales, one per (layer, token, head).
An MLA pool passes its latent buffers as K and no V buffers (an empty V region).
"""

from __future__ import annotations

import torch

from .kv_pack_layout import FP8_MAX, PackLayout


def quantize_fp8_blocks(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., head_dim] -> (e4m3 values, fp32 scale per block), the kernel's arithmetic in fp32."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1)
    # A tensor divisor, not the Python float: on CUDA, torch divides by a scalar as a multiplication by
    # its reciprocal (1 ulp off a correctly rounded division for some amax), and every e4m3 code of the
    # block follows the scale; the kernels' div_rn and torch's tensor division both round correctly.
    scale = torch.where(amax > 0, amax / torch.full_like(amax, FP8_MAX), torch.ones_like(amax))
    return (xf / scale[..., None]).to(torch.float8_e4m3fn), scale


def dequantize_fp8_blocks(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * scale[..., None]).to(dtype)


def pack_kv_ref(
    layout: PackLayout,
    k_buffers: list[torch.Tensor],
    v_buffers: list[torch.Tensor],
    slots: torch.Tensor,
    out: torch.Tensor,
) -> torch.Tensor:
    """Gather rows `slots` of every layer's K and V into `out` (uint8, layout.nbytes); returns out."""
    idx = slots.long()
    for kind, bufs in (("k", k_buffers), ("v", v_buffers)):
        if not bufs:  # MLA: the latent rows are all in K
            continue
        rows = torch.stack([b[idx] for b in bufs])  # [L, n, H, D]
        if layout.fp8:
            q, scale = quantize_fp8_blocks(rows)
            layout.data_view(out, kind).copy_(q.reshape(-1).view(torch.uint8))
            layout.scale_view(out, kind).copy_(scale.reshape(-1))
        else:
            layout.data_view(out, kind).copy_(rows.reshape(-1))
    return out


def unpack_kv_ref(
    layout: PackLayout,
    packed: torch.Tensor,
    k_buffers: list[torch.Tensor],
    v_buffers: list[torch.Tensor],
    slots: torch.Tensor,
) -> None:
    """Scatter the packed rows into rows `slots` of every layer's K and V; touches nothing else."""
    idx = slots.long()
    for kind, bufs in (("k", k_buffers), ("v", v_buffers)):
        if not bufs:
            continue
        heads, dim = bufs[0].shape[1], bufs[0].shape[2]
        shape = (len(bufs), layout.num_tokens, heads, dim)
        if layout.fp8:
            q = layout.data_view(packed, kind).view(torch.float8_e4m3fn).reshape(shape)
            scale = layout.scale_view(packed, kind).reshape(shape[:3])
            rows = dequantize_fp8_blocks(q, scale, bufs[0].dtype)
        else:
            rows = layout.data_view(packed, kind).reshape(shape)
        for layer, buf in enumerate(bufs):
            buf[idx] = rows[layer]
