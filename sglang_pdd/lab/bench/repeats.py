"""Figures that survive noise: `--repeat N` runs every system N times interleaved (A B C A B C ...);
this module reduces the N runs of each system to medians with their min-max, and each figure's
ratio to the baseline's *in the same repeat* (the ratio cancels what a repeat's box state does to
both).

"Relayed" figures are over the requests the PDD router sent through RelayDecode (pipeline
P->RLD->MD or P->RLD): the requests RLD exists for. For a system without RLD they are over all its
requests (on the cold preset every turn is a miss, so a baseline's requests are the same turns).
"""

from __future__ import annotations

import math
import statistics
from typing import Callable, Mapping, Sequence

from sglang_pdd.lab.bench.metrics import RequestRecord, Summary

RELAYED = ("P->RLD->MD", "P->RLD")


def _median(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.median(xs) if xs else float("nan")


def relayed(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    ok = [r for r in records if r.ok]
    via_rld = [r for r in ok if r.pipeline in RELAYED]
    return via_rld if any(r.pipeline for r in ok) else ok


# figure name -> (unit scale for the table, how it is read from a run)
FIGURES: dict[str, tuple[str, Callable]] = {
    "TTFT P50 (s)": (".2f", lambda s, recs: s.ttft_p50_s),
    "TTFT P99 (s)": (".2f", lambda s, recs: s.ttft_p99_s),
    "TPOT P50 (ms)": (".0f", lambda s, recs: s.tpot_p50_s * 1e3),
    "TPOT P99 (ms)": (".0f", lambda s, recs: s.tpot_p99_s * 1e3),
    "goodput (share)": (".2f", lambda s, recs: s.goodput_share),
    "relayed TTFT median (s)": (".2f", lambda s, recs: _median([r.ttft_s for r in relayed(recs)])),
    "relayed TPOT median (ms)": (".0f", lambda s, recs: _median([r.tpot_s * 1e3 for r in relayed(recs)])),
}


def figures(summary: Summary, records: Sequence[RequestRecord]) -> dict[str, float]:
    return {name: float(fn(summary, records)) for name, (_, fn) in FIGURES.items()}


def aggregate(per_repeat: Mapping[str, Sequence[dict[str, float] | None]], baseline: str | None) -> dict:
    """system -> one figures dict per repeat (None: that repeat failed) ->
    {system: {figure: {median, min, max, values, ratios}}}; ratios are per repeat against `baseline`."""
    out: dict = {}
    base = per_repeat.get(baseline) if baseline else None
    for system, runs in per_repeat.items():
        out[system] = {}
        for fig in FIGURES:
            vals = [r[fig] if r else float("nan") for r in runs]
            good = [v for v in vals if not math.isnan(v)]
            ratios = []
            if base is not None:
                for i, v in enumerate(vals):
                    b = base[i][fig] if i < len(base) and base[i] else float("nan")
                    ratios.append(v / b if b and not math.isnan(b) and not math.isnan(v) else float("nan"))
            out[system][fig] = {
                "median": statistics.median(good) if good else float("nan"),
                "min": min(good) if good else float("nan"), "max": max(good) if good else float("nan"),
                "values": vals, "ratios": ratios}
    return out


HIGHER_IS_BETTER = {"goodput (share)"}


def verdicts(agg: dict, baseline: str | None) -> dict[str, dict[str, tuple[int, int]]]:
    """system -> figure -> (repeats in which the system was better than `baseline`, repeats compared).
    A verdict is stable when it is all or none of them; a tie (ratio 1) counts as not better."""
    out: dict = {}
    if not baseline:
        return out
    for system, per_fig in agg.items():
        if system == baseline:
            continue
        out[system] = {}
        for fig, d in per_fig.items():
            rs = [r for r in d["ratios"] if not math.isnan(r)]
            better = sum((r > 1) if fig in HIGHER_IS_BETTER else (r < 1) for r in rs)
            out[system][fig] = (better, len(rs))
    return out


def verdict_lines(agg: dict, baseline: str | None) -> list[str]:
    lines = []
    for system, per_fig in verdicts(agg, baseline).items():
        parts = []
        for fig, (better, n) in per_fig.items():
            if n:
                state = "stable" if better in (0, n) else "flips"
                parts.append(f"{fig} better in {better}/{n} ({state})")
        if parts:
            lines.append(f"* `{system}` against `{baseline}`, repeat by repeat: " + "; ".join(parts) + ".")
    return lines + [""] if lines else []


def _fmt(x: float, spec: str) -> str:
    return "n/a" if x is None or math.isnan(x) else format(x, spec)


def markdown(agg: dict, baseline: str | None, repeats: int) -> list[str]:
    if not agg:
        return []
    figs = list(FIGURES)
    lines = [f"## Over {repeats} interleaved repeats", "",
             "Each cell: median (min-max) over the repeats" +
             (f"; below it, the ratio to `{baseline}` in each repeat." if baseline else "."), "",
             "| system | " + " | ".join(figs) + " |", "|---|" + "---|" * len(figs)]
    for system, per_fig in agg.items():
        cells = []
        for f in figs:
            spec = FIGURES[f][0]
            d = per_fig[f]
            cell = f"{_fmt(d['median'], spec)} ({_fmt(d['min'], spec)}-{_fmt(d['max'], spec)})"
            if baseline and system != baseline and d["ratios"]:
                cell += "<br>x " + " / ".join(_fmt(r, ".2f") for r in d["ratios"])
            cells.append(cell)
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    return lines + [""] + verdict_lines(agg, baseline)
