"""The tile sweep of the handoff kernel: at one benchmark point, time the launcher's own choice and the
other tilings it could run (BLOCK_M, BLOCK_N, warps, pipeline stages, partition count), in one process.

Run by `handoff_kernel --tune` inside the point's bounded child, after the launcher's own tiling was
measured: every candidate is planned with an explicit `HandoffAttentionConfig`, checked against the torch
reference and timed like the launcher's (`pdd kern`: the plan prepared once). The sweep stops taking new
candidates when its time budget is spent, so a slow compile costs the sweep's tail, not the point. What it
prints is what the launcher's defaults (`choose_tiling`) are tuned from; docs/kernels.md has the tables.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from sglang_pdd.kernels.handoff_attention import prepare_handoff_attention, rebind_plan, run_plan
from sglang_pdd.kernels.handoff_tiling import HandoffAttentionConfig, next_pow2, sm_count


@dataclass(frozen=True)
class Candidate:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    target_sms: int | None = None  # programs aimed for, in SMs (None: the launcher's own count, choose_tiling)

    def config(self, sms: int) -> HandoffAttentionConfig:
        target = None if self.target_sms is None else self.target_sms * sms
        return HandoffAttentionConfig(block_m=self.block_m, block_n=self.block_n, num_warps=self.num_warps,
                                      num_stages=self.num_stages, target_programs=target)

    def label(self) -> str:
        split = "" if self.target_sms is None else f" x{self.target_sms}SM"
        return f"{self.block_m}x{self.block_n} w{self.num_warps} s{self.num_stages}{split}"


# Tilings that fit sm_90a without spills (compile-only report, docs/kernels.md section 5; tests/kernels/
# test_compile_sm90.py compiles each): 16 and 32 rows lower to mma.sync, 64 and 128 rows to wgmma.
# (16 | 32) x 64 with 3 stages spill when a single partition writes the output directly: left out.
TILES = (
    (16, 64, 4, 2), (16, 128, 4, 2), (16, 128, 4, 3),
    (32, 64, 4, 2), (32, 128, 4, 2),
    (64, 64, 4, 2), (64, 64, 4, 3), (64, 64, 8, 2), (64, 128, 8, 2),
    (128, 64, 8, 2), (128, 64, 8, 3),
)
SPLIT_TARGETS = (1, 2, 8)  # partition counts aimed at 1, 2 and 8 x SM programs, on the launcher's tiles


def candidates(group: int, k: int, chosen: Candidate) -> list[Candidate]:
    """The tilings worth timing at k new tokens of a GQA group: tiles no taller than twice the rows of
    one request (taller tiles only add masked rows), and the launcher's tiles with other partition counts."""
    rows = group * k
    cap = max(16, 2 * next_pow2(rows))
    out = [Candidate(*t) for t in TILES if t[0] <= cap and t[0] >= group]
    out += [Candidate(chosen.block_m, chosen.block_n, chosen.num_warps, chosen.num_stages, s) for s in SPLIT_TARGETS]
    return [c for c in dict.fromkeys(out) if c != chosen]


def sweep(problem: Any, want: torch.Tensor, timer: Callable[[Callable[[], Any]], float], chosen: Candidate,
          tolerance: float, budget_s: float) -> list[dict[str, Any]]:
    """Time every candidate at `problem` (a handoff_kernel.Problem) within `budget_s`; one dict each."""
    p = problem
    sms = sm_count(p.q.device)
    out = torch.empty_like(p.q)
    t_end = time.monotonic() + budget_s
    results = []
    for c in candidates(p.hq // p.hkv, p.k, chosen):
        if time.monotonic() > t_end:
            results.append({**asdict(c), "label": c.label(), "status": "not run", "why": "sweep budget spent"})
            continue
        try:
            plan = prepare_handoff_attention(p.q, p.k_buffer, p.v_buffer, p.req_to_token, p.req_pool_indices,
                                             p.prefix_lens, p.extend_lens, sm_scale=p.sm_scale, page_size=p.page,
                                             out=out, prefix_lens_cpu=[p.prefix] * p.batch,
                                             extend_lens_cpu=[p.k] * p.batch, validate_indices=False,
                                             config=c.config(sms))
            run_plan(plan)
            err = float((out.float() - want).abs().max())
            us = timer(lambda: run_plan(rebind_plan(plan, p.q, p.k_buffer, p.v_buffer, out))) * 1e3
        except Exception as e:  # noqa: BLE001 - a tiling that does not compile or launch is a row
            results.append({**asdict(c), "label": c.label(), "status": "ERROR",
                            "why": f"{type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"})
            continue
        status = "ok" if err <= tolerance else "BAD"
        results.append({**asdict(c), "label": c.label(), "status": status, "us": us, "err": err,
                        "splits": plan.n_splits})
    return results


def best(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    ok = [r for r in results if r["status"] == "ok"]
    return min(ok, key=lambda r: r["us"]) if ok else None
