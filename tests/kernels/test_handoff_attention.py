"""Contract of `handoff_attention`: the Triton kernels equal the torch reference on sglang-style paged inputs.

On CPU the kernels run under Triton's interpreter (conftest) with small tiles; on a GPU the same cases run
compiled, plus bf16. The reference itself is pinned against a dense causal softmax written independently.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from pool_fakes import make_paged_batch

from sglang_pdd.kernels import HandoffAttentionConfig, KernelArgumentError, handoff_attention, handoff_attention_ref
from sglang_pdd.kernels.backend import resolve_backend
from sglang_pdd.kernels.handoff_attention import (
    plan_handoff_attention,
    prepare_handoff_attention,
    rebind_plan,
    run_plan,
)

pytest.importorskip("triton")
HAS_CUDA = torch.cuda.is_available()

TOL = {torch.float32: (2e-5, 2e-5), torch.float16: (4e-3, 1e-2), torch.bfloat16: (2e-2, 2e-2)}
SMALL = HandoffAttentionConfig(block_m=16, block_n=16, split_len=64)

# (name, dtype, page_size, q_heads, kv_heads, head_dim, [(prefix, k), ...], config). Together they cover
# k = 1..64, prefix 0..2K, page sizes 1 and 16, GQA ratios 1/4/8, head dims 64/128, one and many
# partitions, partitions that straddle the prefix/new-token border, and tiles of several tokens.
CASES = [
    ("mha-d64-fp32-page1", torch.float32, 1, 2, 2, 64, [(0, 1), (37, 5), (300, 17), (64, 64)], SMALL),
    ("gqa4-d128-fp16-page16", torch.float16, 16, 8, 2, 128, [(2048, 1), (100, 64), (0, 33)],
     HandoffAttentionConfig(block_m=32, block_n=32, split_len=512)),
    ("gqa8-d64-fp32-page16", torch.float32, 16, 8, 1, 64, [(1000, 8), (16, 64), (2047, 3)],
     HandoffAttentionConfig(block_m=64, block_n=32, split_len=256)),
    ("gqa8-d128-fp16-page1-one-partition", torch.float16, 1, 16, 2, 128, [(500, 2), (0, 64), (77, 1)],
     HandoffAttentionConfig(block_m=16, block_n=64, split_len=1024)),
    ("gqa3-d80-fp32-odd-shapes", torch.float32, 1, 6, 2, 80, [(45, 7), (3, 1)], SMALL),
]
if HAS_CUDA:
    CASES += [
        ("gqa4-d128-bf16-page16-auto", torch.bfloat16, 16, 32, 8, 128, [(2048, 1), (700, 64), (0, 256)], None),
        ("gqa8-d64-bf16-page1-auto", torch.bfloat16, 1, 16, 2, 64, [(4096, 8), (1, 32)], None),
    ]


def _dense_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int, scale: float) -> torch.Tensor:
    """One request, one head, written out by hand: softmax over positions <= prefix + i."""
    out = torch.empty(q.shape[0], v.shape[1], dtype=torch.float64)
    for i in range(q.shape[0]):
        keys = k[: prefix + i + 1].double()
        w = torch.softmax(keys @ q[i].double() * scale, dim=0)
        out[i] = w @ v[: prefix + i + 1].double()
    return out


def test_reference_is_causal_softmax_over_prefix_and_earlier_new_tokens() -> None:
    b = make_paged_batch([5, 0], [3, 2], q_heads=4, kv_heads=2, head_dim=16, dtype=torch.float32, page_size=4,
                         device=torch.device("cpu"))
    scale = 0.25
    out = torch.empty_like(b.q)
    handoff_attention_ref(b.q, b.k_buffer, b.v_buffer, out, b.req_to_token, [1, 2], [5, 0], [3, 2], scale)
    starts = [0, 3]
    for req, (prefix, ext) in enumerate([(5, 3), (0, 2)]):
        slots = b.req_to_token[req + 1, : prefix + ext].long()
        for head in range(4):
            kvh = head // 2
            want = _dense_causal(b.q[starts[req] : starts[req] + ext, head], b.k_buffer[slots, kvh],
                                 b.v_buffer[slots, kvh], prefix, scale)
            torch.testing.assert_close(out[starts[req] : starts[req] + ext, head].double(), want,
                                       atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_kernel_matches_reference_on_ragged_paged_batch(case: tuple, device: torch.device) -> None:
    _, dtype, page, hq, hkv, dim, reqs, config = case
    b = make_paged_batch([p for p, _ in reqs], [k for _, k in reqs], hq, hkv, dim, dtype, page, device)
    scale = 1.0 / math.sqrt(dim)
    got = handoff_attention(*b.args(), sm_scale=scale, page_size=page, backend="triton", config=config)
    want = torch.empty_like(b.q[..., : b.v_buffer.shape[-1]])
    handoff_attention_ref(b.q, b.k_buffer, b.v_buffer, want, b.req_to_token, b.req_pool_indices.tolist(),
                          [p for p, _ in reqs], [k for _, k in reqs], scale)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=rtol)


def test_kernel_reads_new_tokens_kv_from_the_pool(device: torch.device) -> None:
    """Changing the K of a new token in the pool changes later tokens' output but not earlier ones'."""
    b = make_paged_batch([20], [6], q_heads=2, kv_heads=2, head_dim=64, dtype=torch.float32, page_size=1,
                         device=device)
    before = handoff_attention(*b.args(), backend="triton", config=SMALL).clone()
    slot_of_token3 = int(b.req_to_token[1, 20 + 3])
    b.k_buffer[slot_of_token3] *= 5.0
    after = handoff_attention(*b.args(), backend="triton", config=SMALL)
    torch.testing.assert_close(after[:3], before[:3], atol=0, rtol=0)
    assert (after[3:] - before[3:]).abs().amax(dim=(1, 2)).min() > 1e-3


def test_plan_prepared_once_serves_every_layer(device: torch.device) -> None:
    """One plan per batch, rebound per layer, gives each layer's own result (shared partial buffers)."""
    reqs = [(300, 9), (40, 2)]
    first = make_paged_batch([p for p, _ in reqs], [k for _, k in reqs], 8, 2, 64, torch.float32, 16, device)
    second = dataclasses.replace(first, q=torch.randn_like(first.q), k_buffer=torch.randn_like(first.k_buffer),
                                 v_buffer=torch.randn_like(first.v_buffer))  # same rows and slots, new q/K/V
    layers = [first, second]
    config = HandoffAttentionConfig(block_m=16, block_n=16, split_len=128)
    plan = prepare_handoff_attention(*first.args(), page_size=16, config=config)
    assert plan.n_splits > 1
    for layer in layers:
        out = torch.empty_like(layer.q)
        run_plan(rebind_plan(plan, layer.q, layer.k_buffer, layer.v_buffer, out))
        want = handoff_attention(*layer.args(), page_size=16, backend="torch")
        torch.testing.assert_close(out, want, atol=2e-5, rtol=2e-5)
    with pytest.raises(KernelArgumentError, match="rebind_plan"):
        rebind_plan(plan, first.q[:, :4], first.k_buffer, first.v_buffer, torch.empty_like(first.q[:, :4]))


def test_plan_partitions_a_long_prefix_to_fill_an_h200() -> None:
    """k = 8 tokens over a 16K prefix with 8 KV heads: partitions, not query tiles, supply the parallelism."""
    b = make_paged_batch([16], [8], q_heads=32, kv_heads=8, head_dim=128, dtype=torch.float16, page_size=16,
                         device=torch.device("cpu"))
    plan = plan_handoff_attention(b.q, b.k_buffer, b.v_buffer, torch.empty_like(b.q), b.req_to_token,
                                  b.req_pool_indices, b.prefix_lens, b.extend_lens, [16384], [8], 0.1, 16,
                                  HandoffAttentionConfig())
    programs = plan.partial_grid[0] * plan.partial_grid[1] * plan.partial_grid[2]
    assert plan.n_qtiles == 1 and plan.n_splits > 1
    assert programs >= 132
    assert plan.n_splits * plan.split_len >= 16384 + 8


def test_auto_backend_falls_back_to_torch_on_cpu_without_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert resolve_backend("auto", torch.device("cpu")) == "torch"
    with pytest.raises(ValueError):
        resolve_backend("triton", torch.device("cpu"))


def test_torch_backend_equals_reference() -> None:
    b = make_paged_batch([9, 0], [2, 4], 4, 1, 32, torch.float32, 1, torch.device("cpu"))
    got = handoff_attention(*b.args(), backend="torch")
    want = torch.empty_like(got)
    handoff_attention_ref(b.q, b.k_buffer, b.v_buffer, want, b.req_to_token, [1, 2], [9, 0], [2, 4],
                          1.0 / math.sqrt(32))
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def _batch() -> object:
    return make_paged_batch([10, 3], [2, 1], 4, 2, 64, torch.float32, 1, torch.device("cpu"))


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda b: setattr(b, "k_buffer", b.k_buffer.half()), "share a dtype"),
        (lambda b: setattr(b, "q", b.q[:, :3]), "multiple of kv heads"),
        (lambda b: setattr(b, "k_buffer", b.k_buffer.transpose(1, 2).contiguous().transpose(1, 2)), "contiguous"),
        (lambda b: setattr(b, "extend_lens", b.extend_lens + 1), "sum\\(extend_lens\\)"),
        (lambda b: b.req_to_token.__setitem__((1, 5), 10**6), "req_to_token slots"),
        (lambda b: setattr(b, "req_pool_indices", b.req_pool_indices + 10), "req_pool_indices values"),
        (lambda b: setattr(b, "prefix_lens", b.prefix_lens + 100), "exceeds req_to_token width"),
        (lambda b: setattr(b, "req_to_token", b.req_to_token.float()), "req_to_token dtype"),
    ],
    ids=["dtype-mix", "heads", "stride", "extend-sum", "slot-range", "row-range", "width", "index-dtype"],
)
def test_launcher_rejects_bad_arguments_before_launch(mutate, match: str) -> None:  # noqa: ANN001
    b = _batch()
    mutate(b)
    with pytest.raises(KernelArgumentError, match=match):
        handoff_attention(*b.args(), backend="triton")


def test_launcher_rejects_rows_that_are_not_paged() -> None:
    b = make_paged_batch([40], [3], 2, 2, 64, torch.float32, 16, torch.device("cpu"))
    b.req_to_token[1, 17] = b.req_to_token[1, 17] + 1  # breaks page 1's consecutive slots
    with pytest.raises(KernelArgumentError, match="not paged"):
        handoff_attention(*b.args(), page_size=16, backend="triton")
