"""The CPU stand-in of sgl_kernel's `murmur_hash32_cpu` (seeded sampling on CPU servers) is bit-exact
to sglang's own Triton kernel, so a seeded request samples the same tokens on a CPU and a GPU server."""

from __future__ import annotations

import importlib.util

import pytest
import torch

triton = pytest.importorskip("triton")


def _sglang_kernel_module():
    spec = importlib.util.find_spec("sglang")
    if spec is None:
        pytest.skip("sglang is not installed")
    import os

    path = os.path.join(os.path.dirname(spec.origin), "kernels", "ops", "sampling", "murmur_hash.py")
    mspec = importlib.util.spec_from_file_location("_sglang_murmur_hash", path)
    mod = importlib.util.module_from_spec(mspec)
    mspec.loader.exec_module(mod)  # decorates the kernel now: under the interpreter on CPU
    return mod


def test_cpu_op_equals_sglangs_triton_kernel(device: torch.device) -> None:
    from sglang_pdd.lab.compat.sgl_kernel_cpu import murmur_hash32_cpu

    mod = _sglang_kernel_module()
    seeds = torch.tensor([0, 1, 1234, (1 << 62) + 77, (1 << 63) - 1], dtype=torch.int64)
    positions = torch.tensor([0, 5, 3000, 1 << 20, 7], dtype=torch.int64)
    cols = torch.arange(3000, dtype=torch.int64)
    want = torch.empty((len(seeds), len(cols)), dtype=torch.uint32, device=device)
    grid = (len(seeds), triton.cdiv(len(cols), 1024))
    mod.murmur_hash32_kernel[grid](seeds.to(torch.uint64).to(device), positions.to(device), cols.to(device), want,
                                   len(seeds), len(cols), BLOCK_SIZE=1024)
    got = murmur_hash32_cpu(seeds.to(torch.uint64), positions, cols)
    assert torch.equal(got.to(torch.int64), want.cpu().to(torch.int64))
