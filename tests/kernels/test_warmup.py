"""Start-up warm-up: every variant it runs is checked against the torch reference, and a wrong kernel
is reported (the server then keeps the kernel off)."""

import pytest
import torch

from sglang_pdd.kernels import warmup


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_handoff_warmup_runs_each_tile_variant_and_agrees_with_the_reference(dtype, device):
    rep = warmup.warm_up_handoff(8, 2, 64, 64, dtype, device, page_size=16, ks=(1, 8), long_prefix=256,
                                 backend="triton")
    assert rep.ok, rep.mismatches
    assert rep.variants == ["k=1 prefix=0", "k=8 prefix=0", "k=1 prefix=256", "k=8 prefix=256"]


@pytest.mark.parametrize("fp8", [False, True])
def test_pack_warmup_round_trips(fp8, device):
    rep = warmup.warm_up_pack(2, 2, 64, 2, 64, torch.float16, device, fp8=fp8, tokens=16, backend="triton")
    assert rep.ok, rep.mismatches


def test_a_wrong_kernel_is_reported(device, monkeypatch):
    real = warmup.handoff_attention
    monkeypatch.setattr(warmup, "handoff_attention", lambda *a, **kw: real(*a, **kw) * 1.5)
    rep = warmup.warm_up_handoff(4, 4, 64, 64, torch.float32, device, ks=(1,), long_prefix=64, backend="triton")
    assert not rep.ok and len(rep.mismatches) == 2


def test_default_warm_up_covers_every_tiling_class_the_launcher_picks() -> None:
    from sglang_pdd.kernels.handoff_tiling import H200_SM_COUNT, HandoffAttentionConfig, choose_tiling

    for group in (1, 4, 8):
        ks = warmup.tile_class_ks(group)
        def cls(k: int) -> tuple[int, int, int]:
            t = choose_tiling(group, 1, 128, 128, [0], [k], H200_SM_COUNT, HandoffAttentionConfig())
            return t.block_m, t.num_warps, t.num_stages
        assert {cls(k) for k in ks} == {cls(k) for k in range(1, 1025)}
    assert warmup.tile_class_ks(4) == (1, 5, 9, 256)  # 16, 32, 64 and 128 rows of (token, head)
