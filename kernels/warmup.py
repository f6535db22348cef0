"""Compile, and check, the kernels a server will run before its first request needs them.

Triton compiles a kernel variant on its first launch: inside MD's scheduler loop that stalls every
running request for the compile (seconds). At start-up MD runs the handoff attention kernel once per
tile variant it can pick for its geometry (BLOCK_M 16/32/64, with and without split-KV partitions),
and P and MD run the pack / unpack kernels of the packed WAN path, on small tensors of their own (the
server's pool is never touched). Each launch is compared with the torch reference: a kernel that
disagrees on this GPU is reported, and the caller keeps it off.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .handoff_attention import handoff_attention
from .handoff_attention_ref import handoff_attention_ref
from .kv_pack import pack_kv, unpack_kv

ATOL = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}


@dataclass
class WarmupReport:
    variants: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.mismatches


def _pool(slots: int, heads: int, dim: int, dtype: torch.dtype, device: torch.device, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(slots, heads, dim, generator=g).to(dtype).to(device)


def warm_up_handoff(q_heads: int, kv_heads: int, head_dim: int, v_head_dim: int, dtype: torch.dtype,
                    device: torch.device, page_size: int = 1, ks: tuple[int, ...] | None = None,
                    long_prefix: int = 1024, backend: str = "auto") -> WarmupReport:
    """Run the handoff kernel for k in `ks` (default: the first k of each tiling class the launcher has for
    this GQA group, `tile_class_ks`), over a short prefix (one partition) and a long one (split-KV +
    reduction), and compare each with the reference."""
    t0, rep = time.perf_counter(), WarmupReport()
    if ks is None:
        ks = tile_class_ks(q_heads // kv_heads)
    for prefix in (0, long_prefix):
        for k in ks:
            n = prefix + k
            rows = (n + page_size - 1) // page_size * page_size
            kb = _pool(rows + page_size, kv_heads, head_dim, dtype, device, seed=1)
            vb = _pool(rows + page_size, kv_heads, v_head_dim, dtype, device, seed=2)
            q = _pool(k, q_heads, head_dim, dtype, device, seed=3)
            r2t = torch.arange(page_size, page_size + rows, dtype=torch.int32, device=device)[None, :]
            args = (q, kb, vb, r2t, torch.zeros(1, dtype=torch.int64, device=device),
                    torch.tensor([prefix], device=device), torch.tensor([k], device=device))
            kw = dict(page_size=page_size, prefix_lens_cpu=[prefix], extend_lens_cpu=[k])
            out = handoff_attention(*args, backend=backend, **kw)
            ref = handoff_attention_ref(q, kb, vb, torch.empty_like(out), r2t, [0], [prefix], [k],
                                        1.0 / head_dim ** 0.5)
            name = f"k={k} prefix={prefix}"
            rep.variants.append(name)
            err = (out.float() - ref.float()).abs().max().item()
            if not err <= ATOL[dtype]:
                rep.mismatches.append(f"{name}: max abs error {err:.3g}")
    rep.seconds = time.perf_counter() - t0
    return rep


def tile_class_ks(group: int, max_k: int = 1024) -> tuple[int, ...]:
    """The smallest k of each (BLOCK_M, warps, stages) the launcher picks for a GQA group, k <= max_k."""
    from .handoff_tiling import H200_SM_COUNT, HandoffAttentionConfig, choose_tiling

    seen: dict[tuple[int, int, int], int] = {}
    for k in range(1, max_k + 1):
        t = choose_tiling(group, 1, 128, 128, [0], [k], H200_SM_COUNT, HandoffAttentionConfig())
        seen.setdefault((t.block_m, t.num_warps, t.num_stages), k)
    return tuple(sorted(seen.values()))


def warm_up_pack(layers: int, k_heads: int, k_head_dim: int, v_heads: int, v_head_dim: int,
                 dtype: torch.dtype, device: torch.device, fp8: bool, tokens: int = 64,
                 backend: str = "auto") -> WarmupReport:
    """Pack some rows and unpack them elsewhere (the WAN path's two kernels); check the round trip.
    `v_heads = 0`: an MLA pool's latent buffers alone."""
    t0, rep = time.perf_counter(), WarmupReport()
    k = [_pool(4 * tokens, k_heads, k_head_dim, dtype, device, seed=10 + i) for i in range(layers)]
    v = [_pool(4 * tokens, v_heads, v_head_dim, dtype, device, seed=20 + i) for i in range(layers)] if v_heads else []
    src = torch.randperm(2 * tokens, generator=torch.Generator().manual_seed(5))[:tokens].to(device)
    dst = (2 * tokens + torch.randperm(2 * tokens, generator=torch.Generator().manual_seed(6))[:tokens]).to(device)
    packed, _ = pack_kv(k, v, src, fp8=fp8, backend=backend)
    unpack_kv(packed, k, v, dst, fp8=fp8, backend=backend)
    name = f"pack/unpack fp8={fp8}"
    rep.variants.append(name)
    # e4m3 keeps 3 mantissa bits: an error of at most 1/16 of the head's largest value (plain: none)
    tol = 1 / 16 + 1e-3 if fp8 else 0.0
    for kind, bufs in (("k", k), ("v", v)):
        for i, b in enumerate(bufs):
            a, z = b[src].float(), b[dst].float()
            err = ((z - a).abs() / a.abs().amax(dim=-1, keepdim=True).clamp_min(1e-6)).max().item()
            if not err <= tol:
                rep.mismatches.append(f"{name} {kind}[{i}]: error {err:.3g} of the head's largest value")
    rep.seconds = time.perf_counter() - t0
    return rep
