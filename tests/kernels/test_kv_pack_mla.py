"""`pack_kv` / `unpack_kv` on an MLA pool (DeepSeek-style latent KV): one buffer per layer,
[slots, 1, kv_lora_rank + qk_rope_head_dim], passed as K with no V buffers. The Triton kernels are
byte-identical to the torch reference, the plain round trip is lossless, fp8 (one scale per latent row)
is within e4m3 precision, and an unpack writes its target rows and nothing else. DeepSeek-V3's row
(512 + 64) is not a power of two: the kernels' tiles overhang it."""

from __future__ import annotations

import pytest
import torch

from sglang_pdd.kernels import KernelArgumentError, PackLayout, pack_kv, pack_kv_ref, unpack_kv
from sglang_pdd.kernels.kv_pack_layout import FP8_MAX

pytest.importorskip("triton")
HAS_CUDA = torch.cuda.is_available()

DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if HAS_CUDA else [])
ROW = 512 + 64  # DeepSeek-V3's latent row: kv_lora_rank + qk_rope_head_dim


def _latent(layers: int, slots: int, dtype: torch.dtype, device: torch.device, seed: int,
            row: int = ROW) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(slots, 1, row, generator=g).to(dtype).to(device) for _ in range(layers)]


@pytest.mark.parametrize("fp8", [False, True], ids=["plain", "fp8"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_pack_is_byte_identical_to_reference(dtype: torch.dtype, fp8: bool, device: torch.device) -> None:
    kv = _latent(3, 120, dtype, device, seed=1)
    slots = torch.randperm(120, generator=torch.Generator().manual_seed(2))[:21].to(device)
    packed, layout = pack_kv(kv, [], slots, fp8=fp8, backend="triton")
    assert layout == PackLayout(3, 21, 1, ROW, 0, 0, dtype, fp8) and layout.latent
    ref = torch.full_like(packed, 0xAB)
    pack_kv_ref(layout, kv, [], slots, ref)
    for start, end in layout.gaps():
        ref[start:end] = 0
    assert torch.equal(packed, ref)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_plain_round_trip_is_lossless_into_other_slots(dtype: torch.dtype, device: torch.device) -> None:
    kv = _latent(2, 100, dtype, device, seed=3)
    gen = torch.Generator().manual_seed(4)
    src = torch.randperm(100, generator=gen)[:33].to(device)
    dst = torch.randperm(80, generator=gen)[:33].to(device)
    packed, layout = pack_kv(kv, [], src, backend="triton")
    assert layout.nbytes == layout.raw_bytes == 2 * 33 * ROW * kv[0].element_size()  # no V region
    out = _latent(2, 80, dtype, device, seed=5)
    unpack_kv(packed, out, [], dst, backend="triton")
    for layer in range(2):
        assert torch.equal(out[layer][dst], kv[layer][src])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_fp8_round_trip_error_is_within_e4m3_precision(dtype: torch.dtype, device: torch.device) -> None:
    kv = _latent(2, 40, dtype, device, seed=6)
    kv[0][5, 0, -64:] *= 50.0  # an outlier rope part: its row's scale must not leak into other rows
    slots = torch.arange(40, device=device)
    packed, layout = pack_kv(kv, [], slots, fp8=True, backend="triton")
    assert layout.nbytes < layout.raw_bytes * (0.6 if dtype != torch.float32 else 0.3)
    out = _latent(2, 40, dtype, device, seed=7)
    unpack_kv(packed, out, [], slots, fp8=True, backend="triton")
    for layer in range(2):
        x, y = kv[layer].float(), out[layer].float()
        amax = x.abs().amax(dim=-1, keepdim=True)
        bound = torch.maximum(x.abs() / 16, amax / FP8_MAX * 2**-9) + amax * 1e-6
        assert bool(((x - y).abs() <= bound * 1.01 + 1e-3 * (dtype != torch.float32)).all())


@pytest.mark.parametrize("fp8", [False, True], ids=["plain", "fp8"])
def test_unpack_writes_nothing_outside_its_targets(fp8: bool, device: torch.device) -> None:
    dtype, layers, n = torch.float16, 2, 48
    kv = _latent(layers, 60, dtype, device, seed=8)
    src = torch.randperm(60, generator=torch.Generator().manual_seed(9))[:12].to(device)
    dst = torch.tensor([n - 1, 1] + list(range(5, 25, 2)), device=device)  # slot 0 is no target
    packed, _ = pack_kv(kv, [], src, fp8=fp8, backend="triton")
    backing = torch.full((layers, n + 6, 1, ROW), -7.0, dtype=dtype, device=device)
    views = [backing[i, 3:3 + n] for i in range(layers)]
    before = backing.clone()
    unpack_kv(packed, views, [], dst, fp8=fp8, backend="triton")
    written = torch.zeros(backing.shape[:2], dtype=torch.bool, device=device)
    written[:, 3 + dst] = True
    assert torch.equal(backing[~written], before[~written]), "a row outside the targets changed"
    assert bool((backing[written] != -7.0).any(dim=-1).all()), "a target row was not written"


def test_a_latent_pool_and_an_mha_pool_do_not_unpack_into_each_other() -> None:
    kv = _latent(2, 20, torch.float32, torch.device("cpu"), seed=10, row=16)
    k = [t.clone() for t in kv]
    v = [t.clone() for t in kv]
    packed, _ = pack_kv(kv, [], torch.tensor([1, 2]))
    with pytest.raises(KernelArgumentError, match="bytes, layout needs"):
        unpack_kv(packed, k, v, torch.tensor([3, 4]))


@pytest.mark.parametrize("fp8", [False, True], ids=["plain", "fp8"])
def test_the_start_up_warm_up_checks_the_latent_geometry(fp8: bool, device: torch.device) -> None:
    from sglang_pdd.kernels.warmup import warm_up_pack

    rep = warm_up_pack(2, 1, ROW, 0, 0, torch.float16, device, fp8=fp8, tokens=16, backend="triton")
    assert rep.ok and rep.variants == [f"pack/unpack fp8={fp8}"], rep.mismatches
