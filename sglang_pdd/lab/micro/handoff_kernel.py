"""GPU benchmark: the handoff attention kernel against sglang's extend kernels (and flashinfer if installed).

    python -m sglang_pdd.lab.micro.handoff_kernel                 # H200 table: k x prefix, bf16, one layer
    python -m sglang_pdd.lab.micro.handoff_kernel --json out.json --page-size 16 --batch 4
    python -m sglang_pdd.lab.micro.handoff_kernel --smoke         # CPU, interpreter, tiny shapes: checks the script

One attention layer of the handoff EXTEND: `batch` requests, each with k new tokens over a prefix of
`prefix` cached tokens, Llama-3-8B geometry by default (32 query heads, 8 KV heads, head dim 128), KV in
a fragmented paged pool. Columns (microseconds, median of triton.testing.do_bench):

  pdd call     sglang_pdd.kernels.handoff_attention, the full launcher (plan + 1-2 kernels)
  pdd kern     the same with the plan prepared once per batch and rebound per layer (`rebind_plan`)
  sgl extend   sglang extend_attention_fwd (prefix from the pool, new K/V contiguous), the triton backend's path
  sgl split    sglang verify_splitkv_fwd (split-KV verify kernel; constant k per request only), where it runs
  flashinfer   BatchPrefillWithPagedKVCacheWrapper.run (plan excluded), when flashinfer imports

plus the KV bandwidth the handoff kernel reaches and its max |difference| from sglang's output.
Every comparator that fails prints "n/a" and the reason; the run goes on. Rows print as they finish.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from sglang_pdd.kernels.handoff_attention import handoff_attention, prepare_handoff_attention, rebind_plan, run_plan

logger = logging.getLogger(__name__)

KS = (1, 8, 32, 64, 256)
PREFIXES = (4096, 16384, 65536)


def _timer(smoke: bool) -> Callable[[Callable[[], Any]], float]:
    if smoke:
        def cpu_time(fn: Callable[[], Any]) -> float:
            fn()
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        return cpu_time
    from triton.testing import do_bench

    return lambda fn: float(do_bench(fn, warmup=10, rep=40))


class Problem:
    """One benchmark point: q, a fragmented paged pool, req_to_token, and the flattened index forms."""

    def __init__(self, batch: int, k: int, prefix: int, hq: int, hkv: int, dim: int, page: int,
                 dtype: torch.dtype, device: torch.device, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        kv_len = prefix + k
        pages_per_req = math.ceil(kv_len / page)
        num_pages = batch * pages_per_req + 1
        perm = torch.randperm(num_pages, generator=gen)
        self.req_to_token = torch.zeros((batch + 1, pages_per_req * page), dtype=torch.int32)
        self.page_ids = []
        for b in range(batch):
            pages = perm[b * pages_per_req : (b + 1) * pages_per_req]
            self.page_ids.append(pages)
            slots = (pages[:, None] * page + torch.arange(page)[None, :]).reshape(-1)
            self.req_to_token[b + 1] = slots.int()
        slots_total = num_pages * page
        # generated on the device: a 64K-token pool is 10^8 values
        self.k_buffer = (torch.randn((slots_total, hkv, dim), device=device) * 0.5).to(dtype)
        self.v_buffer = torch.randn((slots_total, hkv, dim), device=device).to(dtype)
        self.q = (torch.randn((batch * k, hq, dim), device=device) * 0.5).to(dtype)
        self.req_to_token = self.req_to_token.to(device)
        self.req_pool_indices = torch.arange(1, batch + 1, dtype=torch.int64, device=device)
        self.prefix_lens = torch.full((batch,), prefix, dtype=torch.int64, device=device)
        self.extend_lens = torch.full((batch,), k, dtype=torch.int64, device=device)
        self.batch, self.k, self.prefix, self.page, self.dim = batch, k, prefix, page, dim
        self.hq, self.hkv = hq, hkv
        self.sm_scale = dim**-0.5
        rows = self.req_to_token[1:].long()
        self.prefix_slots = rows[:, :prefix].reshape(-1).contiguous()
        self.new_slots = rows[:, prefix:kv_len].reshape(-1).contiguous()
        self.qo_indptr = torch.arange(0, batch + 1, dtype=torch.int32, device=device) * k
        self.kv_indptr = torch.arange(0, batch + 1, dtype=torch.int32, device=device) * prefix

    def kv_bytes(self) -> int:
        item = self.k_buffer.element_size()
        return self.batch * (self.prefix + self.k) * self.hkv * self.dim * 2 * item


def _pdd(p: Problem, out: torch.Tensor) -> tuple[Callable[[], Any], Callable[[], Any]]:
    def call() -> Any:
        return handoff_attention(p.q, p.k_buffer, p.v_buffer, p.req_to_token, p.req_pool_indices, p.prefix_lens,
                                 p.extend_lens, sm_scale=p.sm_scale, page_size=p.page, out=out,
                                 prefix_lens_cpu=[p.prefix] * p.batch, extend_lens_cpu=[p.k] * p.batch,
                                 validate_indices=False, backend="triton")

    plan = prepare_handoff_attention(p.q, p.k_buffer, p.v_buffer, p.req_to_token, p.req_pool_indices,
                                     p.prefix_lens, p.extend_lens, sm_scale=p.sm_scale, page_size=p.page, out=out,
                                     prefix_lens_cpu=[p.prefix] * p.batch, extend_lens_cpu=[p.k] * p.batch,
                                     validate_indices=False)
    return call, lambda: run_plan(rebind_plan(plan, p.q, p.k_buffer, p.v_buffer, out))


def _sglang_args(p: Problem, out: torch.Tensor) -> tuple[Any, ...]:
    k_new = p.k_buffer[p.new_slots].contiguous()
    v_new = p.v_buffer[p.new_slots].contiguous()
    return (p.q, k_new, v_new, out, p.k_buffer, p.v_buffer, p.qo_indptr, p.kv_indptr, p.prefix_slots,
            None, True, None, p.k, 1.0, 1.0)


def _sgl_extend(p: Problem, out: torch.Tensor) -> Callable[[], Any]:
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    args = _sglang_args(p, out)
    return lambda: extend_attention_fwd(*args, sm_scale=p.sm_scale)


def _sgl_split(p: Problem, out: torch.Tensor) -> Callable[[], Any]:
    from sglang.kernels.ops.attention.verify_splitkv import verify_splitkv_fwd

    args = _sglang_args(p, out)
    if not verify_splitkv_fwd(*args, sm_scale=p.sm_scale, max_bs=p.batch + 1):
        raise RuntimeError("verify_splitkv_fwd declined the case")
    return lambda: verify_splitkv_fwd(*args, sm_scale=p.sm_scale, max_bs=p.batch + 1)


def _flashinfer(p: Problem, out: torch.Tensor) -> Callable[[], Any]:
    import flashinfer

    device = p.q.device
    workspace = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=device)
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
    pages_per_req = math.ceil((p.prefix + p.k) / p.page)
    kv_page_indptr = torch.arange(0, p.batch + 1, dtype=torch.int32, device=device) * pages_per_req
    kv_page_indices = torch.cat(p.page_ids).int().to(device)
    last = (p.prefix + p.k) - (pages_per_req - 1) * p.page
    last_page_len = torch.full((p.batch,), last, dtype=torch.int32, device=device)
    wrapper.plan(p.qo_indptr, kv_page_indptr, kv_page_indices, last_page_len, p.hq, p.hkv, p.dim, p.page,
                 causal=True, sm_scale=p.sm_scale, q_data_type=p.q.dtype, kv_data_type=p.k_buffer.dtype)
    k_paged = p.k_buffer.view(-1, p.page, p.hkv, p.dim)
    v_paged = p.v_buffer.view(-1, p.page, p.hkv, p.dim)
    return lambda: wrapper.run(p.q, (k_paged, v_paged), out=out)


COMPARATORS: dict[str, Callable[[Problem, torch.Tensor], Callable[[], Any]]] = {
    "sgl extend": _sgl_extend,
    "sgl split": _sgl_split,
    "flashinfer": _flashinfer,
}


def bench_point(p: Problem, timer: Callable[[Callable[[], Any]], float], skip: set[str]) -> dict[str, Any]:
    row: dict[str, Any] = {"batch": p.batch, "k": p.k, "prefix": p.prefix, "page": p.page}
    ours = torch.empty_like(p.q)
    call, kern = _pdd(p, ours)
    call()
    row["pdd call"] = timer(call) * 1e3
    row["pdd kern"] = timer(kern) * 1e3
    row["pdd GB/s"] = p.kv_bytes() / (row["pdd kern"] * 1e-6) / 1e9
    for name, make in COMPARATORS.items():
        if name in skip:
            row[name] = "skipped"
            continue
        out = torch.empty_like(p.q)
        try:
            fn = make(p, out)
            fn()
            row[name] = timer(fn) * 1e3
            if name == "sgl extend":
                row["max|diff|"] = float((out.float() - ours.float()).abs().max())
        except Exception as e:  # noqa: BLE001 - a comparator that cannot run is reported, not fatal
            row[name] = f"n/a: {type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"
    return row


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:10.1f}" if v >= 0.1 else f"{v:10.2e}"
    if isinstance(v, str) and v.startswith("n/a"):
        return f"{'n/a':>10}"
    return f"{str(v):>10}"


COLUMNS = ("k", "prefix", "pdd call", "pdd kern", "sgl extend", "sgl split", "flashinfer", "pdd GB/s", "max|diff|")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ks", type=int, nargs="+", default=list(KS))
    ap.add_argument("--prefixes", type=int, nargs="+", default=list(PREFIXES))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--skip", nargs="*", default=[], choices=[c.replace(" ", "-") for c in COMPARATORS],
                    help="comparators to leave out (e.g. --skip flashinfer if it JIT-compiles for long)")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--smoke", action="store_true", help="CPU + TRITON_INTERPRET, tiny shapes (checks the script)")
    args = ap.parse_args(argv)

    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        args.ks, args.prefixes, args.q_heads, args.kv_heads, args.head_dim = [1, 8], [64], 4, 2, 64
        device, dtype = torch.device("cpu"), torch.float32
    else:
        if not torch.cuda.is_available():
            print("no CUDA device: run with --smoke to check the script on CPU", file=sys.stderr)
            return 2
        device, dtype = torch.device("cuda"), torch.bfloat16
        print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}, bf16, "
              f"Hq={args.q_heads} Hkv={args.kv_heads} D={args.head_dim} page={args.page_size} batch={args.batch}")
    timer = _timer(args.smoke)
    print("times in microseconds per layer; " + " ".join(f"{c:>10}" for c in COLUMNS), flush=True)
    rows, notes = [], {}
    for prefix in args.prefixes:
        for k in args.ks:
            p = Problem(args.batch, k, prefix, args.q_heads, args.kv_heads, args.head_dim, args.page_size,
                        dtype, device)
            row = bench_point(p, timer, {c.replace("-", " ") for c in args.skip})
            rows.append(row)
            for name in COMPARATORS:
                if isinstance(row.get(name), str) and row[name].startswith("n/a"):
                    notes.setdefault(row[name], []).append(f"k={k} prefix={prefix}")
            print("                                         " + " ".join(_fmt(row.get(c, "")) for c in COLUMNS),
                  flush=True)
            del p
    for why, where in notes.items():
        print(f"{why}  ({len(where)} points, first {where[0]})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main())
