"""Stand-in for `sgl_kernel` on a CPU-only box (PyPI has no CPU build of it).

Served as `sgl_kernel` by `sglang_pdd.lab.compat.cpu` only when the real package is absent. The ops the
CPU text path of sglang 0.5.23 calls are plain torch here; any other name imports (sglang imports
some at module level) but raises a clear NotImplementedError when called.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from sglang_pdd.lab.compat import amx_attention

__version__ = "0.0.0+sglang-pdd-cpu-stand-in"


def _gated(act, x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    d = x.shape[-1] // 2
    y = act(x[..., :d]) * x[..., d:]
    if out is None:
        return y
    out.copy_(y)
    return out


def silu_and_mul(input: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    return _gated(F.silu, input, out)


def gelu_and_mul(input: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    return _gated(F.gelu, input, out)


def gelu_tanh_and_mul(input: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    return _gated(lambda t: F.gelu(t, approximate="tanh"), input, out)


def weak_ref_tensor(tensor: torch.Tensor) -> torch.Tensor:
    return tensor  # CPU graphs are not captured, so a strong reference is harmless


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """For every buffer (base pointer, row stride in bytes): row[tgt[i]] = row[src[i]]."""
    tgt = tgt_loc.tolist()
    src = src_loc.tolist()
    for base, stride in zip(data_ptrs.tolist(), strides.tolist()):
        for t, s in zip(tgt, src):
            if t != s:
                ctypes.memmove(base + t * stride, base + s * stride, stride)


_M32 = 0xFFFFFFFF


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) | (x >> (32 - r))) & _M32


def _murmur3_mix(h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    k = (k * 0xCC9E2D51) & _M32  # int64 products wrap mod 2^64: their low 32 bits are exact
    k = (_rotl32(k, 15) * 0x1B873593) & _M32
    h = _rotl32(h ^ k, 13)
    return (h * 5 + 0xE6546B64) & _M32


def murmur_hash32_cpu(seed: torch.Tensor, positions: torch.Tensor, col_indices: torch.Tensor) -> torch.Tensor:
    """sglang's seeded-sampling hash (sglang/kernels/ops/sampling/murmur_hash.py, the Triton kernel's
    arithmetic bit for bit): [n] seeds x [n] positions x [m] token ids -> [n, m] uint32."""
    s = seed.to(torch.int64)
    h = torch.zeros(s.shape[0], 1, dtype=torch.int64, device=s.device)
    h = _murmur3_mix(h, (s & _M32)[:, None])
    h = _murmur3_mix(h, ((s >> 32) & _M32)[:, None])
    h = _murmur3_mix(h, (positions.to(torch.int64) & _M32)[:, None])
    h = _murmur3_mix(h, (col_indices.to(torch.int64) & _M32)[None, :])
    h = h ^ 16
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _M32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _M32
    h = h ^ (h >> 16)
    return h.to(torch.uint32)


def _register_ops() -> None:
    """The CPU ops sglang calls through torch.ops.sgl_kernel (the real package registers them in C++)."""
    try:
        lib = torch.library.Library("sgl_kernel", "FRAGMENT")
        lib.define("murmur_hash32_cpu(Tensor seed, Tensor positions, Tensor col_indices) -> Tensor")
    except RuntimeError:  # already defined in this process
        return
    lib.impl("murmur_hash32_cpu", murmur_hash32_cpu, "CPU")
    amx_attention.register(lib)  # extend_attention_cpu, decode_attention_cpu (the intel_amx backend)

    @torch.library.register_fake("sgl_kernel::murmur_hash32_cpu", lib=lib)
    def _(seed, positions, col_indices):
        return seed.new_empty((seed.shape[0], col_indices.shape[0]), dtype=torch.uint32)

    _LIBS.append(lib)


_LIBS: list = []
_register_ops()


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def _missing(*_args, **_kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} has no CPU stand-in (sglang-pdd CPU compat); "
            "this code path needs the real sgl-kernel on an accelerator"
        )

    _missing.__name__ = name
    return _missing
