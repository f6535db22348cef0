"""Contract of `pack_kv` / `unpack_kv`: byte-identical to the torch reference, lossless round trip (plain),
bounded error (fp8), and an unpack that writes its target rows and nothing else."""

from __future__ import annotations

import pytest
import torch

from sglang_pdd.kernels import KernelArgumentError, PackLayout, pack_kv, pack_kv_ref, unpack_kv
from sglang_pdd.kernels.kv_pack_layout import FP8_MAX

from tests.fakes.kv_pool import MHATokenToKVPool

pytest.importorskip("triton")
HAS_CUDA = torch.cuda.is_available()

DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if HAS_CUDA else [])


def _pool(layers: int, slots: int, heads: int, dim: int, dtype: torch.dtype, device: torch.device,
          seed: int, v_dim: int | None = None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    pool = MHATokenToKVPool(slots=slots, head_num=heads, head_dim=dim, v_head_dim=v_dim, layer_num=layers,
                            dtype=dtype, device=device, seed=seed)
    return pool.k_buffer, pool.v_buffer


def _canary_pool(layers: int, slots: int, heads: int, dim: int, dtype: torch.dtype, device: torch.device,
                 pad: int = 3) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """Every layer's K and V is a view into one canary-filled tensor, with `pad` spare slots around each."""
    backing = torch.full((2 * layers, slots + 2 * pad, heads, dim), -7.0, dtype=dtype, device=device)
    views = [backing[i, pad : pad + slots] for i in range(2 * layers)]
    return backing, views[:layers], views[layers:]


def _differing(packed: torch.Tensor, ref: torch.Tensor, layout: PackLayout) -> str:
    """Where two packed buffers differ, by region (what a failure on a device needs to say)."""
    o = layout.offsets
    bounds = sorted((v, k) for k, v in o.items())
    parts = []
    for (start, name), (end, _) in zip(bounds, bounds[1:]):
        n = int((packed[start:end] != ref[start:end]).sum())
        if n:
            parts.append(f"{name}: {n} of {end - start} bytes")
    return "; ".join(parts) or "none"


@pytest.mark.parametrize("fp8", [False, True], ids=["plain", "fp8"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("v_dim", [32, 64], ids=["k-and-v-apart", "k-and-v-in-one-launch"])
def test_pack_is_byte_identical_to_reference(dtype: torch.dtype, fp8: bool, v_dim: int, device: torch.device) -> None:
    """Byte for byte, fp8 included: the reference divides as the kernels do (correctly rounded; on a GPU
    torch's division by a Python float is a multiplication by its reciprocal, and was 1 ulp off)."""
    k, v = _pool(3, 300, 2, 64, dtype, device, seed=1, v_dim=v_dim)
    slots = torch.randperm(300, generator=torch.Generator().manual_seed(2))[:48].to(device)
    packed, layout = pack_kv(k, v, slots, fp8=fp8, backend="triton")
    assert layout.kv_adjacent == (v_dim == 64)
    ref = torch.full_like(packed, 0xAB)
    pack_kv_ref(layout, k, v, slots, ref)
    for start, end in layout.gaps():
        ref[start:end] = 0
    assert torch.equal(packed, ref), f"bytes differ from the reference: {_differing(packed, ref, layout)}"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_plain_round_trip_is_lossless_into_other_slots(dtype: torch.dtype, device: torch.device) -> None:
    k, v = _pool(4, 200, 4, 32, dtype, device, seed=3)
    gen = torch.Generator().manual_seed(4)
    src = torch.randperm(200, generator=gen)[:70].to(device)
    dst = torch.randperm(150, generator=gen)[:70].to(device)
    packed, _ = pack_kv(k, v, src, backend="triton")
    dk, dv = _pool(4, 150, 4, 32, dtype, device, seed=5)
    unpack_kv(packed, dk, dv, dst, backend="triton")
    for layer in range(4):
        assert torch.equal(dk[layer][dst], k[layer][src])
        assert torch.equal(dv[layer][dst], v[layer][src])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_fp8_round_trip_error_is_within_e4m3_precision(dtype: torch.dtype, device: torch.device) -> None:
    k, v = _pool(2, 100, 2, 64, dtype, device, seed=6)
    k[0][5, 1] *= 50.0  # an outlier block: its scale must not leak into other blocks
    slots = torch.arange(100, device=device)
    packed, layout = pack_kv(k, v, slots, fp8=True, backend="triton")
    assert layout.nbytes < layout.raw_bytes * (0.6 if dtype != torch.float32 else 0.3)
    dk, dv = _pool(2, 100, 2, 64, dtype, device, seed=7)
    unpack_kv(packed, dk, dv, slots, fp8=True, backend="triton")
    for src, got in ((k, dk), (v, dv)):
        for layer in range(2):
            x, y = src[layer].float(), got[layer].float()
            amax = x.abs().amax(dim=-1, keepdim=True)
            # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 for normals, absolute <= 2^-9 * scale below.
            bound = torch.maximum(x.abs() / 16, amax / FP8_MAX * 2**-9) + amax * 1e-6
            assert bool(((x - y).abs() <= bound * 1.01 + 1e-3 * (dtype != torch.float32)).all())


@pytest.mark.parametrize("fp8", [False, True], ids=["plain", "fp8"])
def test_unpack_writes_nothing_outside_its_targets(fp8: bool, device: torch.device) -> None:
    dtype = torch.float16
    layers, slots_n, heads, dim = 3, 64, 3, 32  # row of 96: the 128-wide tile overhangs it
    k, v = _pool(layers, 100, heads, dim, dtype, device, seed=8)
    src = torch.randperm(100, generator=torch.Generator().manual_seed(9))[:20].to(device)
    # The last slot is a target; slot 0 is not, so a masked-off token written to slot 0 shows.
    dst = torch.tensor([63, 1] + list(range(5, 41, 2)), device=device)
    packed, _ = pack_kv(k, v, src, fp8=fp8, backend="triton")
    backing, dk, dv = _canary_pool(layers, slots_n, heads, dim, dtype, device)
    before = backing.clone()
    unpack_kv(packed, dk, dv, dst, fp8=fp8, backend="triton")
    written = torch.zeros(backing.shape[:2], dtype=torch.bool, device=device)
    written[:, 3 + dst] = True
    assert torch.equal(backing[~written], before[~written]), "a row outside the targets changed"
    assert bool((backing[written] != -7.0).any(dim=-1).any(dim=-1).all()), "a target row was not written"


def test_layout_round_trips_through_its_wire_form_and_sizes_regions() -> None:
    layout = PackLayout(num_layers=4, num_tokens=4096, k_heads=8, k_head_dim=64, v_heads=8, v_head_dim=64,
                        dtype=torch.bfloat16, fp8=True)
    assert PackLayout.from_dict(layout.to_dict()) == layout
    plain = PackLayout(4, 4096, 8, 64, 8, 64, torch.bfloat16)
    assert plain.nbytes == plain.raw_bytes == 4 * 4096 * 8 * 64 * 2 * 2
    assert layout.nbytes == 4 * 4096 * 8 * 64 * 2 + 4 * 4096 * 8 * 4 * 2


def test_pack_on_cpu_without_interpreter_uses_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    k, v = _pool(2, 50, 2, 16, torch.float32, torch.device("cpu"), seed=10)
    slots = torch.tensor([4, 9, 1])
    packed, layout = pack_kv(k, v, slots)
    assert torch.equal(layout.data_view(packed, "k").reshape(2, 3, 2, 16)[1], k[1][slots])


def _cpu_pool() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    return _pool(2, 40, 2, 16, torch.float32, torch.device("cpu"), seed=11)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda k, v: unpack_kv(pack_kv(k, v, torch.tensor([1, 2]))[0], k, v, torch.tensor([3, 3])), "unique"),
        (lambda k, v: pack_kv(k, v, torch.tensor([0, 40])), "slots values"),
        (lambda k, v: unpack_kv(torch.zeros(10, dtype=torch.uint8), k, v, torch.tensor([1])), "bytes, layout needs"),
        (lambda k, v: pack_kv(k, v[:1], torch.tensor([1])), "K layers"),
        (lambda k, v: pack_kv([t.transpose(1, 2) for t in k], v, torch.tensor([1])), "contiguous"),
        (lambda k, v: pack_kv(k, v, torch.tensor([1.0])), "slots dtype"),
        (lambda k, v: pack_kv([k[0], k[1].half()], v, torch.tensor([1])), "differs"),
        (lambda k, v: pack_kv(k, v, torch.tensor([1]), out=torch.zeros(3, dtype=torch.uint8)), "layout needs"),
    ],
    ids=["dup-target", "slot-range", "size", "layers", "stride", "index-dtype", "mixed-layers", "out-size"],
)
def test_launchers_reject_bad_arguments_before_launch(call, match: str) -> None:  # noqa: ANN001
    k, v = _cpu_pool()
    with pytest.raises(KernelArgumentError, match=match):
        call(k, v)
