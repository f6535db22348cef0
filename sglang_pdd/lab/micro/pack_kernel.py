"""GPU benchmark: the pack / unpack kernels of the packed WAN path on the device, against a plain device copy.

    python -m sglang_pdd.lab.micro.pack_kernel                    # Llama-3-8B pool, 4096 tokens, page 16, bf16
    python -m sglang_pdd.lab.micro.pack_kernel --tokens 512 --json out.json
    python -m sglang_pdd.lab.micro.pack_kernel --smoke            # CPU, interpreter, tiny pool: checks the script

One request's KV (every layer's K and V rows of `tokens` tokens, pages scattered over a pool twice that
size) is packed into one staging buffer and unpacked into other pages of the pool (`kernels.pack_kv`,
`kernels.unpack_kv`), plain and fp8. Rows (microseconds, median of triton.testing.do_bench):

  copy          a device copy of the plain payload's size: what a memory-bound kernel can reach
  pack          pack_kv, plain         unpack        unpack_kv, plain
  pack fp8      pack_kv, e4m3 + scales unpack fp8    unpack_kv, e4m3

`kern` is the kernel launches alone (`launch_pack_kernels`), `call` the public function (checks, layout,
padding). GB/s counts the bytes the kernels read and write; the roofline ratio is that over the
device's peak bandwidth (`roofline.py`). Every point checks its round trip (plain: exact; fp8: within
1/16 of each head's largest value) and runs in its own bounded child process (`bounded.py`): a stall
is reported as STALL with its point and the run goes on. Exit status 1 when any point is not ok.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from sglang_pdd.kernels.kv_pack import launch_pack_kernels, pack_kv, unpack_kv
from sglang_pdd.kernels.kv_pack_layout import PackLayout
from sglang_pdd.lab.micro import bounded, roofline

logger = logging.getLogger(__name__)

IMPLS = ("copy", "pack", "unpack", "pack fp8", "unpack fp8")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
FP8_TOLERANCE = 1 / 16 + 1e-3  # e4m3 keeps 3 mantissa bits: of each (layer, token, head)'s largest value
# Triton's CPU interpreter rounds float -> e4m3 without carrying into the exponent (a value just under a power
# of two can come out halved; docs/kernels.md, section 4); GPUs round correctly. The smoke run checks less.
FP8_TOLERANCE_INTERPRETER = 0.5


@dataclass
class PoolGeometry:
    layers: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    dtype: str = "bfloat16"
    tokens: int = 4096
    page_size: int = 16
    smoke: bool = False
    timeout_s: float = 90.0

    @classmethod
    def smoke_geometry(cls, **overrides: Any) -> PoolGeometry:
        values = dict(layers=2, kv_heads=2, head_dim=64, dtype="float32", tokens=64, page_size=4, smoke=True,
                      timeout_s=60.0)
        values.update(overrides)
        return cls(**values)

    def label(self) -> str:
        return (f"{self.tokens} tok x {self.layers} layers x {self.kv_heads} x {self.head_dim} {self.dtype}, "
                f"page {self.page_size}")

    def child_argv(self, impl: str) -> list[str]:
        argv = [sys.executable, "-m", "sglang_pdd.lab.micro.pack_kernel", "--point", impl.replace(" ", "-"),
                "--layers", str(self.layers), "--kv-heads", str(self.kv_heads), "--head-dim", str(self.head_dim),
                "--dtype", self.dtype, "--tokens", str(self.tokens), "--page-size", str(self.page_size)]
        return argv + (["--smoke"] if self.smoke else [])

    def child_env(self) -> dict[str, str]:
        return bounded.child_env(self.smoke)


def _round_trip_error(k: list[torch.Tensor], v: list[torch.Tensor], src: torch.Tensor, dst: torch.Tensor) -> float:
    """Largest |unpacked - original| over each (layer, token, head)'s largest |original| value."""
    worst = 0.0
    for bufs in (k, v):
        for b in bufs:
            a, z = b[src].float(), b[dst].float()
            err = ((z - a).abs() / a.abs().amax(dim=-1, keepdim=True).clamp_min(1e-6)).max().item()
            worst = max(worst, err)
    return worst


def measure_point(geo: PoolGeometry, impl: str) -> dict[str, Any]:
    """In the child: one implementation on one pool; times in microseconds."""
    bounded.stall_if_asked(f"{impl} {geo.tokens} tok")
    device = torch.device("cpu") if geo.smoke else torch.device("cuda")
    device_name = "cpu" if geo.smoke else torch.cuda.get_device_name(device)
    dtype = DTYPES[geo.dtype]
    timer = bounded.timer(geo.smoke)
    bounded.stage("pool")
    gen = torch.Generator().manual_seed(0)
    pages = -(-geo.tokens // geo.page_size)
    pool_slots = 2 * pages * geo.page_size
    backing = torch.randn((2 * geo.layers, pool_slots, geo.kv_heads, geo.head_dim), device=device).to(dtype)
    bufs = list(backing.unbind(0))
    k, v = bufs[: geo.layers], bufs[geo.layers :]
    perm = torch.randperm(2 * pages, generator=gen)
    offsets = torch.arange(geo.page_size)[None, :]
    src = (perm[:pages, None] * geo.page_size + offsets).reshape(-1)[: geo.tokens].to(device)
    dst = (perm[pages:, None] * geo.page_size + offsets).reshape(-1)[: geo.tokens].to(device)
    payload = 2 * geo.layers * geo.tokens * geo.kv_heads * geo.head_dim * backing.element_size()
    result: dict[str, Any] = {"device": device_name, "payload": payload}
    if impl == "copy":
        a = torch.empty(payload, dtype=torch.uint8, device=device)
        b = torch.empty_like(a)
        bounded.stage("timing")
        result.update(us=timer(lambda: b.copy_(a)) * 1e3, bytes=2 * payload)
        return result
    fp8 = impl.endswith("fp8")
    layout = PackLayout.for_buffers(k, v, geo.tokens, fp8)
    staging = torch.empty(layout.nbytes, dtype=torch.uint8, device=device)
    bounded.stage("first call (compile)")
    pack_kv(k, v, src, fp8=fp8, out=staging)
    unpack_kv(staging, k, v, dst, fp8=fp8)
    result["err"] = _round_trip_error(k, v, src, dst)
    result["tolerance"] = (FP8_TOLERANCE_INTERPRETER if geo.smoke else FP8_TOLERANCE) if fp8 else 0.0
    bounded.stage("timing")
    if impl.startswith("pack"):
        call = lambda: pack_kv(k, v, src, fp8=fp8, out=staging, validate_indices=False)  # noqa: E731
        kern = lambda: launch_pack_kernels(layout, staging, k, v, src, "pack")  # noqa: E731
    else:
        call = lambda: unpack_kv(staging, k, v, dst, fp8=fp8, validate_indices=False)  # noqa: E731
        kern = lambda: launch_pack_kernels(layout, staging, k, v, dst, "unpack")  # noqa: E731
    result.update(us_call=timer(call) * 1e3, us=timer(kern) * 1e3, bytes=payload + layout.nbytes,
                  packed=layout.nbytes, us_host=_host_us(kern, geo.smoke))
    return result


def _host_us(fn: Callable[[], Any], smoke: bool, n: int = 20) -> float:
    """Host time per launch: `n` calls queued without waiting for the device (what a timing of a small
    point cannot go below when the host, not the kernel, is the bound)."""
    if not smoke:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    seconds = time.perf_counter() - t0
    if not smoke:
        torch.cuda.synchronize()
    return seconds / n * 1e6


def run_points(geo: PoolGeometry, on_result: Callable[[dict[str, Any]], None] | None = None,
               deadline: float | None = None, peak: roofline.Peak | None = None) -> list[dict[str, Any]]:
    """Each implementation in a bounded child; one dict per implementation (status, us, GB/s, roofline, ...)."""
    results = []
    for impl in IMPLS:
        r: dict[str, Any] = {"impl": impl, "tokens": geo.tokens}
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left < 5:
            r.update(status="not run", why="out of the time budget")
        else:
            timeout = geo.timeout_s if left is None else min(geo.timeout_s, left)
            outcome = bounded.run_child(geo.child_argv(impl), timeout, env=geo.child_env())
            r.update(outcome.result, status=outcome.status, seconds=round(outcome.seconds, 1))
            if outcome.status != "ok":
                r["why"] = outcome.why()
            elif "err" in r and not r["err"] <= r["tolerance"]:
                r.update(status="BAD", why=f"round trip error {r['err']:.3g} > {r['tolerance']:g}")
        if "us" in r:
            r["GB/s"] = r["bytes"] / (r["us"] * 1e-6) / 1e9
            top = peak or roofline.peak_for(r.get("device", ""))
            r["roofline"] = roofline.ratio(r["us"] * 1e-6, r["bytes"], 0.0, top)
        results.append(r)
        if on_result is not None:
            on_result(r)
    return results


def _cell(v: Any, fmt: str) -> str:
    return format(v, fmt) if isinstance(v, (int, float)) else "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--head-dim", type=int)
    ap.add_argument("--dtype", choices=list(DTYPES))
    ap.add_argument("--tokens", type=int)
    ap.add_argument("--page-size", type=int)
    ap.add_argument("--timeout-s", type=float, help="bound of each point, start-up included (default 90; 60 smoke)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--smoke", action="store_true", help="CPU + TRITON_INTERPRET, a tiny pool (checks the script)")
    ap.add_argument("--point", choices=[i.replace(" ", "-") for i in IMPLS],
                    help="run one point in this process and print its result line (the table's child)")
    args = ap.parse_args(argv)
    given = {f: getattr(args, f) for f in ("layers", "kv_heads", "head_dim", "dtype", "tokens", "page_size",
                                           "timeout_s") if getattr(args, f) is not None}
    geo = PoolGeometry.smoke_geometry(**given) if args.smoke else PoolGeometry(**given)
    if not geo.smoke and not torch.cuda.is_available():
        print("no CUDA device: run with --smoke to check the script on CPU", file=sys.stderr)
        return 2
    if args.point is not None:
        if geo.smoke:
            os.environ["TRITON_INTERPRET"] = "1"
        bounded.emit(measure_point(geo, args.point.replace("-", " ")))
        return 0
    print(f"{geo.label()}; each point in its own process, at most {geo.timeout_s:g} s")
    print(f"{'impl':<11} {'status':>7} {'call us':>9} {'kern us':>9} {'MB moved':>9} {'GB/s':>8} {'roofline':>8}")

    def show(r: dict[str, Any]) -> None:
        print(f"{r['impl']:<11} {r['status']:>7} {_cell(r.get('us_call'), '9.1f'):>9} {_cell(r.get('us'), '9.1f'):>9} "
              f"{_cell(r.get('bytes', 0) / 1e6 if 'bytes' in r else None, '9.1f'):>9} "
              f"{_cell(r.get('GB/s'), '8.1f'):>8} {_cell(r.get('roofline'), '8.2f'):>8}  {r.get('why', '')}",
              flush=True)

    results = run_points(geo, show)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"geometry": asdict(geo), "results": results}, f, indent=1)
    return 0 if all(r["status"] == "ok" for r in results) else 1


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main())
