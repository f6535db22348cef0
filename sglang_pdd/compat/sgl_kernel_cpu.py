"""Stand-in for `sgl_kernel` on a CPU-only box (PyPI has no CPU build of it).

Served as `sgl_kernel` by `sglang_pdd.compat.cpu` only when the real package is absent. The ops the
CPU text path of sglang 0.5.23 calls are plain torch here; any other name imports (sglang imports
some at module level) but raises a clear NotImplementedError when called.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

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
