"""Compile every kernel variant that matters on an H200 (sm_90a) without a GPU and report its resources.

    python -m sglang_pdd.lab.micro.resource_report            # table: shared memory, registers, spills
    python -m sglang_pdd.lab.micro.resource_report --quick    # the subset the CI test compiles
    python -m sglang_pdd.lab.micro.resource_report --json     # one JSON object per variant, for tests
    python -m sglang_pdd.lab.micro.resource_report --quick --bench-grid   # + every point of handoff_kernel's grid

Variants are the ones the launchers pick for the handoff shapes (k in {1, 8, 64, 256}, GQA 1/4/8, head dim
64/128, page size 1 and 16, bf16 and fp16, one or many partitions) and the pack/unpack kernels of a bf16
pool (MHA, and MLA's latent rows of 512 + 64). Each is compiled by driving the real launcher under `compile_only`, so what is reported is what
would be launched. `--bench-grid` adds every point of the GPU benchmark's grid (`handoff_kernel`: its k and
prefixes, its heads, bf16, pages 1 and 16); a compiled kernel that several points launch is one row, with
those points in its `points` (JSON). Exit status 1 when any variant spills or exceeds the H200's shared memory.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from sglang_pdd.lab.micro.compile_only import H200_MAX_SHARED_BYTES, compile_only, resources
from sglang_pdd.kernels.handoff_attention import plan_handoff_attention, run_plan
from sglang_pdd.kernels.handoff_tiling import HandoffAttentionConfig
from sglang_pdd.kernels.kv_pack import launch_pack_kernels
from sglang_pdd.kernels.kv_pack_layout import PackLayout

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AttnVariant:
    dtype: torch.dtype
    head_dim: int
    group: int
    k: int
    prefix: int
    page_size: int
    batch: int = 1
    tiles: tuple[int, int, int, int] | None = None  # BLOCK_M, BLOCK_N, warps, stages (None: the launcher's)

    def label(self) -> str:
        return (f"{str(self.dtype).split('.')[-1]} D={self.head_dim} G={self.group} k={self.k} "
                f"prefix={self.prefix} page={self.page_size}" + (f" batch={self.batch}" if self.batch > 1 else "")
                + (f" tiles={'x'.join(map(str, self.tiles))}" if self.tiles else ""))


def attn_variants(quick: bool) -> list[AttnVariant]:
    if quick:
        return [
            AttnVariant(torch.bfloat16, 128, 8, 64, 16384, 16),
            AttnVariant(torch.bfloat16, 128, 4, 1, 65536, 1),
            AttnVariant(torch.float16, 64, 1, 256, 4096, 1),
        ]
    out = []
    for dtype in (torch.bfloat16, torch.float16):
        for head_dim in (64, 128):
            for group in (1, 4, 8):
                for k in (1, 8, 64, 256):
                    for page in (1, 16):
                        out.append(AttnVariant(dtype, head_dim, group, k, 16384, page))
    return out


def bench_grid_variants(pages: tuple[int, ...] = (1, 16)) -> list[AttnVariant]:
    """Every point of the GPU benchmark's default grid (`handoff_kernel.Grid()`), per page size."""
    from sglang_pdd.lab.micro.handoff_kernel import Grid

    from sglang_pdd.lab.micro.device_check import kernel_grids
    from sglang_pdd.lab.micro.handoff_tune import TILES

    g = Grid()
    group = g.q_heads // g.kv_heads
    if g.kv_heads != (8 if group <= 4 else 4):
        raise RuntimeError("_compile_attention's head counts are no longer the benchmark's: update both")
    out = [AttnVariant(torch.bfloat16, g.head_dim, group, k, prefix, page)
           for page in pages for prefix in g.prefixes for k in g.ks]
    for d in kernel_grids(dry_run=False, timeout_s=90.0):  # the device check's grids, batch 8 included
        out += [AttnVariant(torch.bfloat16, d.head_dim, d.q_heads // d.kv_heads, k, prefix, d.page_size, d.batch)
                for prefix in d.prefixes for k in d.ks]
    # every tiling the device check's sweep times, at a point with partitions and at one without
    for batch, k in ((8, 256), (1, 256)):
        out += [AttnVariant(torch.bfloat16, g.head_dim, group, k, 16384, 16, batch, t) for t in TILES]
    return list(dict.fromkeys(out))


def _compile_attention(v: AttnVariant) -> list[Any]:
    kv_heads = 8 if v.group <= 4 else 4
    hq = kv_heads * v.group
    slots = 64
    q = torch.empty((v.batch * v.k, hq, v.head_dim), dtype=v.dtype)
    kb = torch.empty((slots, kv_heads, v.head_dim), dtype=v.dtype)
    vb = torch.empty_like(kb)
    out = torch.empty_like(q)
    r2t = torch.zeros((v.batch + 3, v.prefix + v.k + v.page_size), dtype=torch.int32)
    one = torch.ones(v.batch, dtype=torch.int64)
    config = HandoffAttentionConfig()
    if v.tiles is not None:
        bm, bn, warps, stages = v.tiles
        config = HandoffAttentionConfig(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages)
    with compile_only() as compiled:
        plan = plan_handoff_attention(q, kb, vb, out, r2t, one, one * v.prefix, one * v.k, [v.prefix] * v.batch,
                                      [v.k] * v.batch, v.head_dim**-0.5, v.page_size, config)
        run_plan(plan)
    return [(k, f"{v.label()} BLOCK_M={plan.block_m} BLOCK_N={plan.block_n} splits={plan.n_splits}")
            for k in compiled]


def _compile_pack() -> list[Any]:
    result = []
    for heads, dim, latent in ((8, 128, False), (8, 64, False), (1, 512 + 64, True)):  # MLA: DeepSeek-V3's row
        bufs = [torch.empty((64, heads, dim), dtype=torch.bfloat16) for _ in range(2)]
        k, v = bufs[:1], [] if latent else bufs[1:]
        slots = torch.zeros(32, dtype=torch.int64)
        for fp8 in (False, True):
            layout = PackLayout.for_buffers(k, v, 32, fp8)
            packed = torch.empty(layout.nbytes, dtype=torch.uint8)
            for direction in ("pack", "unpack"):
                with compile_only() as compiled:
                    launch_pack_kernels(layout, packed, k, v, slots, direction)
                label = f"bfloat16 {'MLA latent' if latent else f'H={heads}'} D={dim} {'fp8' if fp8 else 'plain'} {direction}"
                result.append((compiled[0], label))  # K and V launches share one variant
    return result


def collect(quick: bool, bench_grid: bool = False) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    by_hash: dict[str, dict[str, Any]] = {}
    variants = attn_variants(quick) + (bench_grid_variants() if bench_grid else [])
    pairs = [p for v in variants for p in _compile_attention(v)] + _compile_pack()
    for kernel, label in pairs:
        key = kernel.hash
        if key in by_hash:
            by_hash[key]["points"].append(label)
            continue
        res = resources(kernel)
        row = {**asdict(res), "variant": label, "points": [label], "fits": res.fits(H200_MAX_SHARED_BYTES)}
        by_hash[key] = row
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="only the variants the CI test compiles")
    parser.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    parser.add_argument("--bench-grid", action="store_true", help="also every point of handoff_kernel's grid")
    args = parser.parse_args(argv)
    # The interpreter replaces the JIT at decoration time; kernel modules are not imported yet.
    os.environ.pop("TRITON_INTERPRET", None)
    t0 = time.time()
    rows = collect(args.quick, args.bench_grid)
    if args.json:
        for r in rows:
            print(json.dumps(r))
    else:
        print(f"{'kernel':<30} {'variant':<70} {'warps':>5} {'stages':>6} {'smem B':>7} {'regs':>4} "
              f"{'spill st/ld':>11} fits")
        for r in rows:
            also = f" (+{len(r['points']) - 1})" if len(r["points"]) > 1 else ""
            print(f"{r['name']:<30} {(r['variant'] + also):<70} {r['num_warps']:>5} {r['num_stages']:>6} "
                  f"{r['shared_bytes']:>7} {r['registers']:>4} "
                  f"{r['spill_store_bytes']:>5}/{r['spill_load_bytes']:<5} {'yes' if r['fits'] else 'NO'}")
        print(f"{len(rows)} variants for sm_90a in {time.time() - t0:.0f} s")
    return 0 if all(r["fits"] for r in rows) else 1


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main())
