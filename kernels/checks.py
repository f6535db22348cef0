"""Argument checks shared by the kernel launchers: shapes, dtypes, strides, devices and index bounds.

A launcher calls these before it launches, so a wrong argument fails with a `KernelArgumentError` naming
the argument instead of reading or writing out of bounds on the device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class KernelArgumentError(ValueError):
    """An argument of a kernel launcher has the wrong shape, dtype, stride, device or an index out of range."""


INDEX_DTYPES = (torch.int32, torch.int64)


def require(cond: bool, msg: str) -> None:
    if not cond:
        raise KernelArgumentError(msg)


def require_dim(name: str, t: torch.Tensor, ndim: int) -> None:
    require(t.dim() == ndim, f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")


def require_dtype(name: str, t: torch.Tensor, dtypes: Sequence[torch.dtype]) -> None:
    require(t.dtype in dtypes, f"{name} dtype must be one of {list(dtypes)}, got {t.dtype}")


def require_same_device(tensors: dict[str, torch.Tensor]) -> torch.device:
    devices = {name: t.device for name, t in tensors.items()}
    first = next(iter(devices.values()))
    for name, dev in devices.items():
        require(dev == first, f"{name} is on {dev}, expected {first} (all tensors on one device)")
    return first


def require_unit_last_stride(name: str, t: torch.Tensor) -> None:
    require(t.stride(-1) == 1, f"{name} must be contiguous in its last dim, strides {t.stride()}")


def require_index_range(name: str, idx: torch.Tensor, upper: int) -> None:
    """Every value of `idx` in [0, upper). Costs a device sync on CUDA."""
    if idx.numel() == 0:
        return
    lo, hi = int(idx.min()), int(idx.max())
    require(lo >= 0 and hi < upper, f"{name} values must lie in [0, {upper}), got [{lo}, {hi}]")


def host_ints(name: str, values: torch.Tensor | Sequence[int] | None, fallback: torch.Tensor) -> list[int]:
    """A host list of ints: `values` if given (checked against the device tensor's length), else a sync."""
    if values is None:
        return [int(v) for v in fallback.tolist()]
    out = [int(v) for v in (values.tolist() if isinstance(values, torch.Tensor) else values)]
    require(len(out) == fallback.numel(), f"{name} has {len(out)} entries, expected {fallback.numel()}")
    return out
