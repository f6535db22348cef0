"""The handoff kernel's tiling: which compiled variant runs (BLOCK_M, BLOCK_N, warps, pipeline stages) and how
the KV range is cut into partitions, from the geometry, the lengths and the SM count. The rule was tuned on an
H200 (docs/kernels.md, section 5 (b)); `HandoffAttentionConfig` overrides any part of it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .checks import require

H200_SM_COUNT = 132
MAX_BLOCK_M = 128  # one wgmma M of 64 per warpgroup, two warpgroups (8 warps)


@dataclass(frozen=True)
class HandoffAttentionConfig:
    """Tiling of the handoff kernel. `None` fields are chosen per launch by `plan_handoff_attention`."""

    block_m: int | None = None  # (token, head) rows per program; power of two >= 16
    block_n: int | None = None  # KV positions per inner step; power of two >= 16
    split_len: int | None = None  # KV positions per partition; multiple of block_n
    min_split_len: int = 256  # never cut partitions shorter than this (when split_len is None)
    target_programs: int | None = None  # programs to aim for; None: 8 or 4 x SM count (choose_tiling)
    num_warps: int | None = None
    num_stages: int | None = None


def next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def sm_count(device: torch.device) -> int:
    """The device's SM count (an H200's off CUDA: what the interpreter and compile-only runs plan for)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return H200_SM_COUNT


@dataclass(frozen=True)
class Tiling:
    """What `choose_tiling` picks for a launch: the tiles (which compiled kernel runs) and the grids.

    A `HandoffPlan` is a Tiling plus the tensors; tests enumerate the tilings the launcher can pick.
    """

    block_m: int
    block_n: int
    block_d: int
    block_dv: int
    tok_per_tile: int
    n_qtiles: int
    n_splits: int
    split_len: int
    num_warps: int
    num_stages: int

    @property
    def direct(self) -> bool:
        """One partition: the partial kernel writes the output and no reduction runs."""
        return self.n_splits == 1


def choose_tiling(group: int, hkv: int, d: int, dv: int, prefix_cpu: Sequence[int], extend_cpu: Sequence[int],
                  sm_count: int, config: HandoffAttentionConfig) -> Tiling:
    """The launcher's choice of tiles and partitions from the geometry, the lengths and the SM count."""
    max_ext = max(extend_cpu, default=0)
    max_kv = max((p + e for p, e in zip(prefix_cpu, extend_cpu)), default=0)
    block_d, block_dv = max(16, next_pow2(d)), max(16, next_pow2(dv))

    # Tuned on an H200 (docs/kernels.md, section 5 (b): the device check's tile sweep, batch 8, prefixes of
    # 16K and 64K, k 1 to 256, Llama-3-8B heads). Up to 32 rows of (token, head) per request the kernel is
    # memory bound: one short tile (mma.sync), 4 warps, and many partitions (8 x SM programs) to keep
    # loads in flight. From 33 rows it is compute bound: 64-row tiles (wgmma, one warpgroup) with 3
    # stages beat 128-row tiles with 8 warps by 5-15 %, until 1024 rows, where 128 x 8 warps wins by 2-5 %.
    rows = group * max(1, max_ext)
    if rows <= 32:
        tile_m, warps, stages, per_sm = max(16, next_pow2(rows)), 4, 2, 8
    elif rows < 1024:
        tile_m, warps, stages, per_sm = 64, 4, 3, 4
    else:
        tile_m, warps, stages, per_sm = MAX_BLOCK_M, 8, 3, 4
    block_m = max(config.block_m or tile_m, next_pow2(group))
    block_n = config.block_n or (64 if max(block_d, block_dv) <= 128 else 32)
    for name, v in (("block_m", block_m), ("block_n", block_n)):
        require(v >= 16 and v & (v - 1) == 0, f"{name} must be a power of two >= 16, got {v}")
    tok_per_tile = block_m // group
    n_qtiles = max(1, math.ceil(max_ext / tok_per_tile))

    if config.split_len is not None:
        split_len = config.split_len
        require(split_len > 0 and split_len % block_n == 0,
                f"split_len {split_len} must be a positive multiple of block_n {block_n}")
    else:
        base = sum(math.ceil(e / tok_per_tile) for e in extend_cpu) * hkv
        target = config.target_programs or per_sm * sm_count
        wanted = max(1, math.ceil(target / max(1, base)))
        cap = max(1, math.ceil(max_kv / config.min_split_len))
        n_splits = min(wanted, cap)
        split_len = math.ceil(max(1, max_kv) / n_splits / block_n) * block_n
    n_splits = max(1, math.ceil(max_kv / split_len))
    if block_m != tile_m:  # the caller's tile, or one raised to the GQA group: warps to its size
        warps = 4 if block_m <= 64 else 8
    num_warps = config.num_warps or warps
    return Tiling(block_m=block_m, block_n=block_n, block_d=block_d, block_dv=block_dv, tok_per_tile=tok_per_tile,
                  n_qtiles=n_qtiles, n_splits=n_splits, split_len=split_len, num_warps=num_warps,
                  num_stages=config.num_stages or stages)
