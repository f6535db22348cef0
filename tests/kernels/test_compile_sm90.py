"""The kernels compile for the H200 (sm_90a) without register spills and within its shared memory.

Runs the compile-only resource report in a subprocess (the interpreter, which this test process may use,
replaces Triton's JIT at import time). No GPU needed: Triton's bundled ptxas does the compile. Besides the
quick set, every point of the GPU benchmark's grid (`handoff_kernel`, pages 1 and 16) is compiled: every
variant the device check launches is known to compile for sm_90a, spill-free, before a GPU is at hand.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sglang_pdd.lab.micro.resource_report import bench_grid_variants

pytest.importorskip("triton")

EXPECTED_KERNELS = {
    "handoff_attn_partial_kernel",
    "handoff_attn_reduce_kernel",
    "pack_rows_kernel",
    "unpack_rows_kernel",
    "pack_fp8_kernel",
    "unpack_fp8_kernel",
}


def test_kernels_compile_for_sm90a_without_spills_within_shared_memory() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_pdd.lab.micro.resource_report", "--quick", "--bench-grid", "--json"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert rows, f"no variants compiled (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    assert {r["name"] for r in rows} == EXPECTED_KERNELS
    bad = [r for r in rows if not r["fits"]]
    assert not bad, f"variants that spill or exceed shared memory: {bad}"
    compiled = [p for r in rows for p in r["points"]]
    missing = [v.label() for v in bench_grid_variants() if not any(p.startswith(v.label() + " ") for p in compiled)]
    assert not missing, f"benchmark points that compiled nothing: {missing}"
    assert proc.returncode == 0, proc.stderr[-3000:]
