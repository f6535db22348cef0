"""Small deployments: the CPU testbed's scale (tiny model, a few thousand tokens), used by the
unit tests and as the starting point of calibration against the testbed benchmark."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from sglang_pdd.lab.workload.generator import WorkloadConfig
from sglang_pdd.lab.sim.hardware import Chip
from sglang_pdd.lab.sim.model import ModelSpec
from sglang_pdd.lab.sim.systems import PoolSpec, SystemSpec, make_system
from sglang_pdd.lab.sim.wan import WanSpec

# A few-layer random-weight Llama as the CPU testbed builds it: KV sized so a few-thousand-token
# prompt is MBs (docs/design.md). Numbers are placeholders until calibrated against the testbed.
TINY_MODEL = ModelSpec("tiny-llama", layers=4, hidden=256, heads=8, head_dim=32,
                       kv_bytes_per_token=2 * 4 * 8 * 32 * 4, total_params=20e6,
                       active_params=20e6, weight_bytes_per_param=4.0)

# One CPU socket seen as a "chip": ~1 TFLOP/s fp32, 64 GB, 50 GB/s.
CPU_A = Chip("cpuA", peak_tflops=1.0, mem_gb=64.0, mem_bw_tbps=0.05, interconnect_gbps=10.0,
             price_per_hour=1.0)
CPU_B = Chip("cpuB", peak_tflops=0.6, mem_gb=64.0, mem_bw_tbps=0.08, interconnect_gbps=10.0,
             price_per_hour=1.25)


def tiny_workload(**kw) -> WorkloadConfig:
    base = dict(request_rate=2.0, duration_s=30.0, mean_turns=4.0, think_time_s=1.0,
                nominal_tpot_s=0.01, seed=7)
    base.update(kw)
    return WorkloadConfig.cpu_bench(**base)


def tiny_system(name: str, wan: Optional[WanSpec] = None, **kw) -> SystemSpec:
    """`name` from systems.SYSTEM_NAMES on single-"chip" CPU instances: 2 P, 1 RLD, 2 D/MD."""
    wan = wan or WanSpec(bandwidth_gbps=0.2, rtt_s=0.02, jitter=0.0)
    p = PoolSpec(CPU_A, 2, chips_per_instance=1)
    d = PoolSpec(CPU_B, 2, chips_per_instance=1)
    rld = PoolSpec(CPU_A, 1, chips_per_instance=1)
    spec = make_system(name, p, d, rld=rld, wan=wan, chunk_size=1024, **kw)
    return replace(spec, drc_capacity_tokens=2_000_000)
