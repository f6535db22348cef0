"""Kernel tests run on CUDA when a GPU is present, else on CPU under Triton's interpreter.

TRITON_INTERPRET must be set before a kernel module is imported (`@triton.jit` reads it at decoration);
the launchers import their kernel modules lazily, so setting it here, at collection, is early enough.
Compiled kernels go to a throw-away TRITON_CACHE_DIR.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"
if "TRITON_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="pdd-triton-cache-")
    os.environ["TRITON_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)

try:
    import triton  # noqa: F401

    HAS_TRITON = True
except ImportError:
    HAS_TRITON = False

if HAS_TRITON and not HAS_CUDA:
    from interpreter_patches import patch_fp8_downcast

    patch_fp8_downcast()


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device("cuda") if HAS_CUDA else torch.device("cpu")
