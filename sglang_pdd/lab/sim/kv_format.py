"""`--scenario kv-format`: how the KV format moves PDD's economics (MHA-family pool vs MLA latent).

Two models of the same size that differ only in their KV pool (`model.py`): DeepSeek-V3 with its MLA
latent (70 KB/token) and the same weights with a GQA-8 pool (250 KB/token). Per model, on the paper's
hardware with instances large enough to hold the weights twice over (16 x A for a 671B model):

* the bathtub (`bathtub.py`, a capacity model): BCR of same-DC PD, cross-DC PD with DRC and PDD per
  prefix-hit rate, and the hit below which the WAN, not P or MD, caps cross-DC PD (the tub's left wall);
* the simulated runs of `never_lose_run.py` (pdd-never-lose vs xdc-pd-drc, BCR from the goodput
  search and TTFT P99 at the probe load) on every WAN regime, on the paper workload or a trace.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

import numpy as np

from sglang_pdd.lab.sim.bathtub import BathtubPoint, run_bathtub
from sglang_pdd.lab.sim.hardware import CHIP_A
from sglang_pdd.lab.sim.model import MODELS, ModelSpec
from sglang_pdd.lab.sim.never_lose_run import CELL_HEAD, SYSTEMS, Cell, cell_row, run_never_lose
from sglang_pdd.lab.sim.paper import PaperSetting
from sglang_pdd.lab.sim.relay_regimes import REGIMES, Regime
from sglang_pdd.lab.sim.report import table
from sglang_pdd.lab.sim.trace_run import LoadedTrace

DEFAULT_MODELS = ("v3-size-gqa8", "deepseek-v3")
LENGTH, OUT = 64_000, 1000  # the bathtub's request: 64K input, 1K output


def instance_chips(model: ModelSpec, s: PaperSetting) -> int:
    """The smallest instance (8, 16, 32 ... chips of A) whose usable memory holds the weights twice:
    the other half is KV. 8 for the paper's 230B model, 16 for DeepSeek-V3 at fp8."""
    n = 8
    while n * CHIP_A.mem_gb * 1e9 * s.eff.mem_usable < 2 * model.weight_bytes:
        n *= 2
    return n


def setting_for(s: PaperSetting, model: ModelSpec) -> PaperSetting:
    """The paper's deployment for `model`: the same instance counts, each `instance_chips` wide (the
    baseline's chip count and RLD's instance scale with it)."""
    n = instance_chips(model, s)
    return replace(s, model=model, instance_chips=n, baseline_chips=s.baseline_chips * n // s.instance_chips,
                   pdd_rld_chips=max(s.pdd_rld_chips, n))


@dataclass
class ModelResult:
    setting: PaperSetting
    bathtub: list[BathtubPoint]
    wall: Optional[float]  # the lowest hit at which the WAN no longer caps xdc-pd-drc (None: it always does)
    runs: dict[tuple[str, int, str], Cell]


def wan_wall(points: Sequence[BathtubPoint]) -> Optional[float]:
    """The lowest hit from which on cross-DC PD's capacity is P's or MD's, not the line's."""
    return next((pt.hit for pt in points if not pt.wan_bound["xdc-pd-drc"]), None)


def run_kv_format(s: PaperSetting, names: Sequence[str] = DEFAULT_MODELS, seeds: Sequence[int] = (0,),
                  tr: Optional[LoadedTrace] = None, regimes: Sequence[Regime] = REGIMES,
                  hits: Optional[np.ndarray] = None, probe_rate: float = 4.0) -> dict[str, ModelResult]:
    """Per model: its deployment, the bathtub, and the simulated runs (TTFT P99 at `probe_rate` req/s,
    the same for both models; the goodput search from a quarter of it, so a model that cannot serve the
    probe load on a line still gets a BCR)."""
    hits = np.round(np.arange(0.0, 1.0, 0.05), 2) if hits is None else hits
    out = {}
    for name in names:
        st = setting_for(s, MODELS[name])
        points = run_bathtub(st, hits=hits, length=LENGTH, out=OUT)
        runs = run_never_lose(st, seeds, tr, regimes, probe_rate, lo=probe_rate / 4, relay="mixed", adaptive=False)
        out[name] = ModelResult(st, points, wan_wall(points), runs)
    return out


def kv_format_report(res: dict[str, ModelResult], load: str) -> str:
    lines = ["KV format: the same model with an MHA-family (GQA-8) pool and with MLA (docs/sim.md §10)"]
    gbps = next(iter(res.values())).setting.wan.bandwidth_gbps
    head = ["model", "KV/token", "64K prompt KV", f"cold 64K on {gbps:g}G", "instances", "xdc-pd-drc WAN-bound below"]
    rows = []
    for name, r in res.items():
        m, st = r.setting.model, r.setting
        kv64 = LENGTH * m.kv_bytes_per_token
        rows.append([name, f"{m.kv_bytes_per_token / 1e3:.0f} KB", f"{kv64 / 2**30:.2f} GiB",
                     f"{kv64 * 8 / (gbps * 1e9):.2f} s", f"{st.instance_chips} chips",
                     f"{r.wall:.2f} hit" if r.wall is not None else "every hit"])
    lines += [table(head, rows), "", "Bathtub (capacity model, 64K in / 1K out): BCR x1e3 per system"]
    names = list(res)
    systems = list(res[names[0]].bathtub[0].bcr)
    head = ["hit"] + [f"{n[:12]} {sys}" for n in names for sys in systems]
    body = []
    for i, pt in enumerate(res[names[0]].bathtub):
        if round(pt.hit * 100) % 10:
            continue
        body.append([f"{pt.hit:.2f}"] + [f"{res[n].bathtub[i].bcr[sys] * 1e3:.1f}" for n in names for sys in systems])
    lines += [table(head, body), "", f"Simulated runs: {SYSTEMS[1]} vs {SYSTEMS[0]} (TTFT P99 at {load})"]
    head = ["model", "regime", "seed", *CELL_HEAD]
    body = [[name, rg, str(sd), *cell_row(a, r.runs[(rg, sd, SYSTEMS[1])])]
            for name, r in res.items() for (rg, sd, sys), a in r.runs.items() if sys == SYSTEMS[0]]
    lines.append(table(head, body))
    return "\n".join(lines)
