"""GPU benchmark: the handoff attention kernel against sglang's extend kernels (and flashinfer if installed).

    python -m sglang_pdd.lab.micro.handoff_kernel                 # H200 table: k x prefix, bf16, one layer
    python -m sglang_pdd.lab.micro.handoff_kernel --json out.json --page-size 16 --batch 4
    python -m sglang_pdd.lab.micro.handoff_kernel --smoke         # CPU, interpreter, tiny shapes: checks the script
    python -m sglang_pdd.lab.micro.handoff_kernel --point 64 4096 --impl pdd   # one point (what the table runs)

One attention layer of the handoff EXTEND: `batch` requests, each with k new tokens over a prefix of
`prefix` cached tokens, Llama-3-8B geometry by default (32 query heads, 8 KV heads, head dim 128), KV in
a fragmented paged pool. Columns (microseconds, median of triton.testing.do_bench):

  pdd call     sglang_pdd.kernels.handoff_attention, the full launcher (plan + 1-2 kernels)
  pdd kern     the same with the plan prepared once per batch and rebound per layer (`rebind_plan`)
  sgl extend   sglang extend_attention_fwd (prefix from the pool, new K/V contiguous), the triton backend's path
  sgl split    sglang verify_splitkv_fwd (split-KV verify kernel; constant k per request only), where it runs
  flashinfer   BatchPrefillWithPagedKVCacheWrapper.run (plan excluded), when flashinfer imports

plus the KV bandwidth the handoff kernel reaches, its roofline ratio (`roofline.py`: roofline time over
measured time), its max |error| against the torch reference and the tiles it ran.

Every (point, implementation) runs in a child process of its own under `--timeout-s` (`bounded.py`): a
kernel or a compile that does not finish is reported as STALL with its point and the stage it stalled in
(e.g. "first call (compile)"), and the run goes on. A comparator that stalls is not run again for larger
k (its compile grows with k). A comparator that fails or declines prints "n/a" and the reason, one whose
package is missing "absent"; neither is a failure. The exit status is 1 when any point of the handoff
kernel did not run, stalled, failed or exceeded its error tolerance.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from sglang_pdd.kernels.handoff_attention import handoff_attention, prepare_handoff_attention, rebind_plan, run_plan
from sglang_pdd.kernels.handoff_attention_ref import handoff_attention_ref
from sglang_pdd.lab.micro import bounded, handoff_tune, roofline
from sglang_pdd.lab.micro.handoff_comparators import COMPARATORS, PACKAGE

logger = logging.getLogger(__name__)

KS = (1, 8, 32, 64, 256)
PREFIXES = (4096, 16384, 65536)
SMOKE_KS = (1, 8, 64)
SMOKE_PREFIXES = (64,)
IMPLS = ("pdd", "sgl extend", "sgl split", "flashinfer")
# max |error| against the fp32 torch reference (outputs are weighted means of N(0, 1) values)
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}


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

    def flops(self) -> int:
        """QK and PV of every query over the positions it sees (prefix + itself and the tokens before)."""
        seen = self.k * self.prefix + self.k * (self.k + 1) // 2
        return 4 * self.batch * self.hq * self.dim * seen

    def reference(self) -> torch.Tensor:
        """The torch reference's output (fp32 math), in q's dtype."""
        out = torch.empty_like(self.q)
        rows = [int(r) for r in self.req_pool_indices.tolist()]
        return handoff_attention_ref(self.q, self.k_buffer, self.v_buffer, out, self.req_to_token, rows,
                                     [self.prefix] * self.batch, [self.k] * self.batch, self.sm_scale)


def _pdd(p: Problem, out: torch.Tensor) -> tuple[Callable[[], Any], Callable[[], Any], Any]:
    def call() -> Any:
        return handoff_attention(p.q, p.k_buffer, p.v_buffer, p.req_to_token, p.req_pool_indices, p.prefix_lens,
                                 p.extend_lens, sm_scale=p.sm_scale, page_size=p.page, out=out,
                                 prefix_lens_cpu=[p.prefix] * p.batch, extend_lens_cpu=[p.k] * p.batch,
                                 validate_indices=False, backend="triton")

    plan = prepare_handoff_attention(p.q, p.k_buffer, p.v_buffer, p.req_to_token, p.req_pool_indices,
                                     p.prefix_lens, p.extend_lens, sm_scale=p.sm_scale, page_size=p.page, out=out,
                                     prefix_lens_cpu=[p.prefix] * p.batch, extend_lens_cpu=[p.k] * p.batch,
                                     validate_indices=False)
    return call, lambda: run_plan(rebind_plan(plan, p.q, p.k_buffer, p.v_buffer, out)), plan


@dataclass
class Grid:
    """The benchmark's points and geometry, and how each point is run (its own process, bounded)."""

    ks: list[int] = field(default_factory=lambda: list(KS))
    prefixes: list[int] = field(default_factory=lambda: list(PREFIXES))
    batch: int = 1
    q_heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 1
    smoke: bool = False  # CPU, Triton's interpreter, fp32
    timeout_s: float = 90.0  # per (point, implementation), start-up and compile included
    skip: tuple[str, ...] = ()
    tune: bool = False  # the pdd point also sweeps other tilings (handoff_tune.py)
    tune_budget_s: float = 45.0

    @classmethod
    def smoke_grid(cls, **overrides: Any) -> Grid:
        values = dict(ks=list(SMOKE_KS), prefixes=list(SMOKE_PREFIXES), q_heads=4, kv_heads=2, head_dim=64,
                      smoke=True, timeout_s=60.0)
        values.update(overrides)
        return cls(**values)

    def child_argv(self, k: int, prefix: int, impl: str) -> list[str]:
        argv = [sys.executable, "-m", "sglang_pdd.lab.micro.handoff_kernel", "--point", str(k), str(prefix),
                "--impl", impl.replace(" ", "-"), "--batch", str(self.batch), "--q-heads", str(self.q_heads),
                "--kv-heads", str(self.kv_heads), "--head-dim", str(self.head_dim),
                "--page-size", str(self.page_size)]
        if self.tune:
            argv += ["--tune", "--tune-budget-s", str(self.tune_budget_s)]
        return argv + (["--smoke"] if self.smoke else [])

    def child_env(self) -> dict[str, str]:
        return bounded.child_env(self.smoke)


def point_label(k: int, prefix: int, impl: str) -> str:
    return f"k={k} prefix={prefix} {impl}"


def measure_point(grid: Grid, k: int, prefix: int, impl: str) -> dict[str, Any]:
    """In the child: one implementation at one point; times in microseconds, error against the reference."""
    bounded.stall_if_asked(point_label(k, prefix, impl))
    if grid.smoke:
        device, dtype, device_name = torch.device("cpu"), torch.float32, "cpu"
    else:
        device, dtype = torch.device("cuda"), torch.bfloat16
        device_name = torch.cuda.get_device_name(device)
    timer = bounded.timer(grid.smoke)
    bounded.stage("inputs")
    p = Problem(grid.batch, k, prefix, grid.q_heads, grid.kv_heads, grid.head_dim, grid.page_size, dtype, device)
    bounded.stage("torch reference")
    want = p.reference().float()
    out = torch.empty_like(p.q)
    result: dict[str, Any] = {"device": device_name, "dtype": str(dtype).split(".")[-1], "bytes": p.kv_bytes(),
                              "flops": p.flops()}
    if impl == "pdd":
        call, kern, plan = _pdd(p, out)
        bounded.stage("first call (compile)")
        call()
        result["err"] = float((out.float() - want).abs().max())
        bounded.stage("timing")
        result["us_call"] = timer(call) * 1e3
        result["us"] = timer(kern) * 1e3
        result["plan"] = (f"BLOCK {plan.block_m}x{plan.block_n} w{plan.num_warps} s{plan.num_stages}, "
                          f"{plan.n_qtiles} q tiles, {plan.n_splits} splits of {plan.split_len}")
        result["tolerance"] = TOLERANCE[dtype]
        if grid.tune:
            bounded.stage("tile sweep")
            chosen = handoff_tune.Candidate(plan.block_m, plan.block_n, plan.num_warps, plan.num_stages)
            result["tune"] = handoff_tune.sweep(p, want, timer, chosen, TOLERANCE[dtype], grid.tune_budget_s)
            top = handoff_tune.best(result["tune"])
            if top is not None:
                result["best"], result["us_best"] = top["label"], top["us"]
        return result
    try:
        bounded.stage("first call (compile)")
        fn = COMPARATORS[impl](p, out)
        fn()
        result["err"] = float((out.float() - want).abs().max())
        bounded.stage("timing")
        result["us"] = timer(fn) * 1e3
    except Exception as e:  # noqa: BLE001 - a comparator that cannot run is reported, not fatal
        msg = str(e).splitlines()[0][:100] if str(e) else ""
        return {**result, "status": "n/a", "why": f"{type(e).__name__}: {msg}"}
    return result


def run_grid(grid: Grid, on_result: Callable[[dict[str, Any]], None] | None = None,
             deadline: float | None = None, peak: roofline.Peak | None = None) -> list[dict[str, Any]]:
    """Every (point, implementation) in a bounded child; returns one dict per pair, in order.

    Each dict has k, prefix, impl, status (ok, STALL, ERROR, BAD, n/a, absent, skipped, not run) and, when it
    ran, us (the kernel), us_call (pdd: the launcher), GB/s, roofline, err, plan, why. `deadline` (a
    time.monotonic() value) bounds the whole grid: pairs it leaves no time for are "not run". `peak`: the
    roofline's peak (default: the vendor's figures for the device's name).
    """
    present = {impl: importlib.util.find_spec(pkg) is not None for impl, pkg in PACKAGE.items()}
    stalled_at: dict[str, int] = {}
    results = []
    for prefix in grid.prefixes:
        for k in grid.ks:
            for impl in IMPLS:
                r: dict[str, Any] = {"k": k, "prefix": prefix, "impl": impl, "batch": grid.batch,
                                     "page": grid.page_size}
                left = None if deadline is None else deadline - time.monotonic()
                if impl in grid.skip:
                    r.update(status="skipped", why="--skip")
                elif impl != "pdd" and not present[impl]:
                    r.update(status="absent", why=f"{PACKAGE[impl]} is not installed")
                elif impl in stalled_at and k >= stalled_at[impl]:
                    r.update(status="not run", why=f"stalled at k={stalled_at[impl]}")
                elif left is not None and left < 5:
                    r.update(status="not run", why="out of the time budget")
                else:
                    timeout = grid.timeout_s if left is None else min(grid.timeout_s, left)
                    outcome = bounded.run_child(grid.child_argv(k, prefix, impl), timeout, env=grid.child_env())
                    r.update(outcome.result)
                    r["seconds"] = round(outcome.seconds, 1)
                    if outcome.status != "ok":
                        r.update(status=outcome.status, why=outcome.why())
                        if outcome.status == "STALL" and impl != "pdd":
                            stalled_at[impl] = k
                    else:
                        r.setdefault("status", "ok")
                        if r["status"] == "ok" and impl == "pdd" and not r["err"] <= r["tolerance"]:
                            r.update(status="BAD", why=f"max |error| {r['err']:.3g} > {r['tolerance']:g}")
                if "us" in r:
                    top = peak or roofline.peak_for(r.get("device", ""))
                    r["GB/s"] = r["bytes"] / (r["us"] * 1e-6) / 1e9
                    r["roofline"] = roofline.ratio(r["us"] * 1e-6, r["bytes"], r["flops"], top)
                    if "us_best" in r:
                        r["roofline_best"] = roofline.ratio(r["us_best"] * 1e-6, r["bytes"], r["flops"], top)
                results.append(r)
                if on_result is not None:
                    on_result(r)
    return results


def is_failure(r: dict[str, Any]) -> bool:
    """A failure of the device check: the handoff kernel's point did not run cleanly (comparators never are)."""
    return r["impl"] == "pdd" and r["status"] != "ok"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:10.1f}" if v >= 0.1 else f"{v:10.2e}"
    if v is None:
        return f"{'-':>10}"
    return f"{str(v)[:10]:>10}"


COLUMNS = ("k", "prefix", "pdd call", "pdd kern", "sgl extend", "sgl split", "flashinfer", "pdd GB/s", "roofline",
           "max|err|")


def point_row(rs: list[dict[str, Any]]) -> dict[str, Any]:
    """The table's row of one point from its per-implementation results."""
    by = {r["impl"]: r for r in rs}
    pdd = by["pdd"]
    row: dict[str, Any] = {"k": pdd["k"], "prefix": pdd["prefix"]}
    for impl, r in by.items():
        cell = r["us"] if r["status"] == "ok" else r["status"]
        row["pdd kern" if impl == "pdd" else impl] = cell
    ok = pdd["status"] == "ok"
    row["pdd call"] = pdd.get("us_call") if ok else pdd["status"]
    row["pdd GB/s"] = pdd.get("GB/s") if ok else None
    row["roofline"] = pdd.get("roofline") if ok else None
    row["max|err|"] = pdd.get("err")
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ks", type=int, nargs="+")
    ap.add_argument("--prefixes", type=int, nargs="+")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--q-heads", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--head-dim", type=int)
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--skip", nargs="*", default=[], choices=[c.replace(" ", "-") for c in COMPARATORS],
                    help="comparators to leave out (e.g. --skip flashinfer if it JIT-compiles for long)")
    ap.add_argument("--timeout-s", type=float, help="bound of each (point, implementation), start-up included "
                    "(default 90; 60 with --smoke)")
    ap.add_argument("--json", help="also write the results (one object per point and implementation) here")
    ap.add_argument("--smoke", action="store_true", help="CPU + TRITON_INTERPRET, tiny shapes (checks the script)")
    ap.add_argument("--point", type=int, nargs=2, metavar=("K", "PREFIX"),
                    help="run one point in this process and print its result line (the table's child)")
    ap.add_argument("--impl", choices=[i.replace(" ", "-") for i in IMPLS], default="pdd")
    ap.add_argument("--tune", action="store_true", help="at each pdd point also time other tilings (handoff_tune)")
    ap.add_argument("--tune-budget-s", type=float, help="the tile sweep of one point (default 45)")
    args = ap.parse_args(argv)

    given = {name: getattr(args, attr) for name, attr in (
        ("ks", "ks"), ("prefixes", "prefixes"), ("q_heads", "q_heads"), ("kv_heads", "kv_heads"),
        ("head_dim", "head_dim"), ("timeout_s", "timeout_s")) if getattr(args, attr) is not None}
    given.update(batch=args.batch, page_size=args.page_size, skip=tuple(s.replace("-", " ") for s in args.skip),
                 tune=args.tune)
    if args.tune_budget_s is not None:
        given["tune_budget_s"] = args.tune_budget_s
    grid = Grid.smoke_grid(**given) if args.smoke else Grid(**given)

    if args.point is not None:
        if grid.smoke:
            os.environ["TRITON_INTERPRET"] = "1"
        elif not torch.cuda.is_available():
            print("no CUDA device: run with --smoke to check the script on CPU", file=sys.stderr)
            return 2
        bounded.emit(measure_point(grid, args.point[0], args.point[1], args.impl.replace("-", " ")))
        return 0

    if not grid.smoke and not torch.cuda.is_available():
        print("no CUDA device: run with --smoke to check the script on CPU", file=sys.stderr)
        return 2
    print(f"{'CPU, interpreter, fp32' if grid.smoke else 'CUDA, bf16'}: Hq={grid.q_heads} Hkv={grid.kv_heads} "
          f"D={grid.head_dim} page={grid.page_size} batch={grid.batch}; each point in its own process, "
          f"at most {grid.timeout_s:g} s")
    print("times in microseconds per layer; " + " ".join(f"{c:>10}" for c in COLUMNS), flush=True)
    pending: list[dict[str, Any]] = []
    notes: dict[str, list[str]] = {}

    def on_result(r: dict[str, Any]) -> None:
        pending.append(r)
        if r["status"] not in ("ok", "absent", "skipped"):
            notes.setdefault(f"{r['impl']}: {r['status']}: {r.get('why', '')}", []).append(
                f"k={r['k']} prefix={r['prefix']}")
        if r["impl"] == IMPLS[-1]:
            row = point_row(pending)
            print("                                 " + " ".join(_fmt(row.get(c)) for c in COLUMNS), flush=True)
            pending.clear()

    results = run_grid(grid, on_result)
    for r in results:
        if r["status"] == "absent" and r["k"] == grid.ks[0] and r["prefix"] == grid.prefixes[0]:
            print(f"{r['impl']}: absent ({r['why']})")
    for why, where in notes.items():
        print(f"{why}  ({len(where)} points: {', '.join(where[:4])}{' ...' if len(where) > 4 else ''})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    failures = [r for r in results if is_failure(r)]
    if failures:
        print(f"FAILED: {len(failures)} points of the handoff kernel did not run cleanly", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main())
