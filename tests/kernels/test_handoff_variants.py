"""Every k in 1..256 at which the launcher picks a new variant runs, and equals the torch reference.

The set of k comes from the launcher's own choice (`choose_tiling`): each k whose variant (the compiled
kernel: BLOCK_M, BLOCK_N, warps; and the partitions: their count and length) differs from k - 1's, the
k just before it (the last k of the previous variant), and the benchmark's k; on a GPU also every k where
the number of query tiles changes. On CPU the kernel runs in Triton's interpreter with the benchmark's
GQA group 4 (so the same BLOCK_M / BLOCK_N / warps choices), one KV head, head dim 64 and a short prefix
that splits in two at k = 57; on a GPU compiled, in bf16, with the benchmark's heads, head dim and
prefixes.

A plan-only test walks the benchmark's whole grid (k 1..256, its prefixes, batch 1 and 4) and checks
what bounds every loop of both kernels: no empty grid dimension, partitions that cover the KV range
without an empty one, a reduction that reads only partitions the partial pass wrote.
"""

from __future__ import annotations

import math

import pytest
import torch
from pool_fakes import make_paged_batch

from sglang_pdd.kernels import HandoffAttentionConfig, handoff_attention
from sglang_pdd.kernels.handoff_attention import prepare_handoff_attention
from sglang_pdd.kernels.handoff_tiling import H200_SM_COUNT, Tiling, choose_tiling
from sglang_pdd.lab.micro.handoff_kernel import Grid, Problem

pytest.importorskip("triton")
HAS_CUDA = torch.cuda.is_available()

BENCH = Grid()  # the GPU benchmark's default grid: its k, prefixes, heads and head dim
BENCH_KS, BENCH_PREFIXES = tuple(BENCH.ks), tuple(BENCH.prefixes)
BENCH_HEADS, BENCH_HEAD_DIM = (BENCH.q_heads, BENCH.kv_heads), BENCH.head_dim
MAX_K = 256
DEFAULT = HandoffAttentionConfig()

if HAS_CUDA:
    DTYPE, HEADS, HEAD_DIM, PREFIXES, TOL = torch.bfloat16, BENCH_HEADS, BENCH_HEAD_DIM, BENCH_PREFIXES, 3e-2
else:  # the interpreter: the benchmark's group (same tiles), one KV head, a prefix that splits at k > 56
    DTYPE, HEADS, HEAD_DIM, PREFIXES, TOL = torch.float32, (4, 1), 64, (200,), 2e-5


def tiling_for(k: int, prefix: int, hq: int, hkv: int, batch: int = 1, head_dim: int = BENCH_HEAD_DIM) -> Tiling:
    return choose_tiling(hq // hkv, hkv, head_dim, head_dim, [prefix] * batch, [k] * batch, H200_SM_COUNT, DEFAULT)


def variant(t: Tiling) -> tuple[int, ...]:
    """What a new variant is: another compiled kernel, or other partitions (on a GPU: or query tiles)."""
    return (t.block_m, t.block_n, t.num_warps, t.n_splits, t.split_len) + ((t.n_qtiles,) if HAS_CUDA else ())


def variant_ks(prefix: int, hq: int, hkv: int, head_dim: int = BENCH_HEAD_DIM) -> list[int]:
    """The k in 1..MAX_K where the launcher's variant changes, the k before each, and the benchmark's."""
    ks, previous = set(BENCH_KS), None
    for k in range(1, MAX_K + 1):
        v = variant(tiling_for(k, prefix, hq, hkv, head_dim=head_dim))
        if v != previous:
            ks.update({k, k - 1} - {0})
        previous = v
    return sorted(ks)


def test_the_k64_point_of_the_benchmark_has_the_tiles_of_k32() -> None:
    """Issue 37: at prefix 4096 the benchmark stalled at k = 64 after k = 32 ran (sglang's split-KV
    comparator, compiling). Both launch the same kernel of ours (BLOCK_M 64, BLOCK_N 64, 4 warps, 3 stages,
    17 partitions of 256); k = 64 has 4 query tiles, not 2."""
    t32, t64 = tiling_for(32, 4096, *BENCH_HEADS), tiling_for(64, 4096, *BENCH_HEADS)
    for t in (t32, t64):
        assert (t.block_m, t.block_n, t.num_warps, t.num_stages, t.n_splits, t.split_len) == (64, 64, 4, 3, 17, 256)
    assert (t32.n_qtiles, t64.n_qtiles) == (2, 4)
    # one KV head and head dim 64 (the interpreter's geometry) pick the very same tiles for that point
    assert variant(tiling_for(64, 4096, 4, 1, head_dim=64)) == variant(t64)


def test_the_launcher_picks_the_tiles_the_h200_sweep_measured_fastest() -> None:
    """docs/kernels.md 5 (b): the device check's sweep at batch 8, prefixes 16K and 64K (page 16). choose_tiling
    returns the fastest tiling measured at 11 of those 12 points (tiles, warps, stages, partitions); at k = 1,
    prefix 64K, 16 x 128 with 3 stages was 7 % faster, and one rule for both prefixes was kept."""
    fastest = {1: (16, 64, 4, 2, 17), 8: (32, 64, 4, 2, 17), 32: (64, 64, 4, 3, 5), 64: (64, 64, 4, 3, 3),
               128: (64, 64, 4, 3, 2), 256: (128, 64, 8, 3, 2)}
    for prefix in (16384, 65536):
        for k, want in fastest.items():
            t = tiling_for(k, prefix, *BENCH_HEADS, batch=8)
            assert (t.block_m, t.block_n, t.num_warps, t.num_stages, t.n_splits) == want, (k, prefix, t)


@pytest.mark.parametrize("batch", [1, 4])
def test_every_plan_of_the_benchmark_grid_bounds_its_loops(batch: int) -> None:
    hq, hkv = BENCH_HEADS
    for prefix in BENCH_PREFIXES + (0, 1, 255, 256, 257):
        for k in range(1, MAX_K + 1):
            t = tiling_for(k, prefix, hq, hkv, batch)
            max_kv = prefix + k
            where = f"k={k} prefix={prefix} batch={batch}: {t}"
            assert t.block_m >= 16 and t.block_n >= 16 and t.num_warps in (4, 8), where
            assert t.tok_per_tile >= 1 and t.n_qtiles * t.tok_per_tile >= k > (t.n_qtiles - 1) * t.tok_per_tile, where
            assert t.split_len > 0 and t.split_len % t.block_n == 0, where
            # partitions cover [0, max_kv) and none is empty (a partition starting past the end would
            # have no program writing its partial; the reduction reads only s * split_len <= prefix + i)
            assert (t.n_splits - 1) * t.split_len < max_kv <= t.n_splits * t.split_len, where
            # the reduction of the last token reads exactly n_splits partitions
            assert math.ceil(max_kv / t.split_len) == t.n_splits, where
            # programs: every grid dimension at least 1, and not absurdly many
            assert 1 <= t.n_splits * batch * t.n_qtiles * hkv <= 64 * H200_SM_COUNT, where


def test_a_prepared_plan_has_the_chosen_tiling_and_grids() -> None:
    hq, hkv = HEADS
    prefix = PREFIXES[0]
    for k in (1, 64, MAX_K):
        b = make_paged_batch([prefix], [k], hq, hkv, HEAD_DIM, torch.float32, 1, torch.device("cpu"))
        plan = prepare_handoff_attention(*b.args(), validate_indices=False)
        t = tiling_for(k, prefix, hq, hkv, head_dim=HEAD_DIM)
        assert (plan.block_m, plan.block_n, plan.n_qtiles, plan.n_splits, plan.split_len, plan.num_warps) == (
            t.block_m, t.block_n, t.n_qtiles, t.n_splits, t.split_len, t.num_warps)
        assert plan.partial_grid == (t.n_qtiles, t.n_splits, hkv)
        assert plan.reduce_grid == (k, 1, hq) and (plan.reduce_args is None) == t.direct


CASES = [(prefix, k) for prefix in PREFIXES for k in variant_ks(prefix, *HEADS, head_dim=HEAD_DIM)]


def test_the_variant_set_is_what_the_launcher_picks() -> None:
    for prefix in PREFIXES:
        ks = variant_ks(prefix, *HEADS, head_dim=HEAD_DIM)
        every = {variant(tiling_for(k, prefix, *HEADS, head_dim=HEAD_DIM)) for k in range(1, MAX_K + 1)}
        assert {variant(tiling_for(k, prefix, *HEADS, head_dim=HEAD_DIM)) for k in ks} == every
        assert {1, 64, MAX_K} <= set(ks)
        tiles = {tiling_for(k, prefix, *HEADS, head_dim=HEAD_DIM) for k in ks}
        assert {t.block_m for t in tiles} == {16, 32, 64, 128}
        assert {t.direct for t in tiles} == ({False} if HAS_CUDA else {True, False})


@pytest.mark.parametrize(("prefix", "k"), CASES, ids=[f"prefix{p}-k{k}" for p, k in CASES])
def test_each_variant_matches_the_reference(prefix: int, k: int, device: torch.device) -> None:
    """The benchmark's own inputs (a fragmented pool, made on the device) for one request of k tokens."""
    hq, hkv = HEADS
    p = Problem(1, k, prefix, hq, hkv, HEAD_DIM, 1, DTYPE, device, seed=k)
    got = handoff_attention(p.q, p.k_buffer, p.v_buffer, p.req_to_token, p.req_pool_indices, p.prefix_lens,
                            p.extend_lens, sm_scale=p.sm_scale, backend="triton")
    torch.testing.assert_close(got.float(), p.reference().float(), atol=TOL, rtol=TOL)
