"""Which implementation a launcher runs: the Triton kernel or the plain-torch reference.

`auto` picks Triton for CUDA tensors, and for CPU tensors only when Triton's interpreter is on
(`TRITON_INTERPRET=1`, the tests' setting); otherwise the torch reference runs (the CPU fallback).
Triton is imported lazily so that `sglang_pdd.kernels` imports on boxes without it.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import Literal

import torch

logger = logging.getLogger(__name__)

Backend = Literal["auto", "triton", "torch"]
BACKENDS: tuple[str, ...] = ("auto", "triton", "torch")


def triton_available() -> bool:
    """Whether the `triton` package can be imported here."""
    return importlib.util.find_spec("triton") is not None


def interpreter_enabled() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (read when a kernel module is imported)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def resolve_backend(requested: str, device: torch.device) -> Literal["triton", "torch"]:
    """The implementation to run for tensors on `device`; raises ValueError when `requested` cannot run."""
    if requested not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {requested!r}")
    triton_ok = triton_available() and (device.type == "cuda" or interpreter_enabled())
    if requested == "torch":
        return "torch"
    if requested == "triton":
        if not triton_ok:
            raise ValueError(
                f"backend='triton' needs triton and a CUDA tensor or TRITON_INTERPRET=1 (device {device})"
            )
        return "triton"
    return "triton" if triton_ok else "torch"
