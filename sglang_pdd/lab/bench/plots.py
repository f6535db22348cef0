"""PNG plots of a benchmark run (matplotlib, imported lazily, Agg backend):

* `ttft_cdf.png`: TTFT CDF per system;
* `wan_bytes.png`: WAN bytes per request per system (link counters) next to P's KV bytes (not with
  --base-url: no link counted);
* `hit_rate.png`: histogram of the trace's per-request prefix-hit rates (the workload's
  configuration made concrete) and of the cached share each system reported.
"""

from __future__ import annotations

import logging
import os

from sglang_pdd.lab.bench.report import MIB

logger = logging.getLogger(__name__)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def ttft_cdf(run, path: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for k, s in enumerate(run.systems):
        xs = sorted(r.ttft_s for r in s.records if r.ok and r.ttft_s is not None)
        if xs:
            ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=(getattr(s, "label", "") or s.name), color=f"C{k}")
    ax.axvline(run.preset.sla.ttft_s, color="grey", ls=":", label="TTFT SLA")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"TTFT CDF (preset {run.preset.name})")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def wan_bytes(run, path: str) -> None:
    plt = _plt()
    runs = [s for s in run.systems if s.summary]
    fig, ax = plt.subplots(figsize=(6, 4))
    x = range(len(runs))
    wan = [(s.summary.wan_bytes_per_request or 0.0) / MIB for s in runs]
    kv = [(s.summary.kv_bytes_per_request or 0.0) / MIB for s in runs]
    ax.bar([i - 0.2 for i in x], wan, width=0.4, label="WAN link (both directions)")
    ax.bar([i + 0.2 for i in x], kv, width=0.4, label="KV moved by P (any link)")
    ax.set_xticks(list(x), [(getattr(s, "label", "") or s.name) for s in runs])
    ax.set_ylabel("MiB per request")
    ax.set_title("Bytes per measured request")
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def hit_rate(run, path: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    bins = [i / 20 for i in range(21)]
    first = next((s for s in run.systems if s.records), None)
    if first is not None:
        ax.hist([r.hit_rate for r in first.records], bins=bins, alpha=0.4, color="grey",
                label="workload (configured)")
    for k, s in enumerate(run.systems):
        shares = [min(r.cached_tokens / r.prompt_tokens, 1.0) for r in s.records if r.ok and r.prompt_tokens]
        if shares:
            ax.hist(shares, bins=bins, histtype="step", lw=1.5, color=f"C{k}", ls=("-", "--", ":", "-.")[k % 4],
                    label=f"{getattr(s, 'label', '') or s.name}: cached (reported)")
    ax.set_xlabel("prefix hit rate")
    ax.set_ylabel("requests")
    ax.set_title("Per-request prefix hit rate")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plots(run, out_dir: str) -> dict[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    out = {}
    plots = [("ttft_cdf", ttft_cdf), ("wan_bytes", wan_bytes), ("hit_rate", hit_rate)]
    if not any(s.summary and s.summary.wan_bytes_per_request is not None for s in run.systems):
        plots.remove(("wan_bytes", wan_bytes))  # no link counted (--base-url): nothing to plot
    for name, fn in plots:
        path = os.path.join(out_dir, f"{name}.png")
        fn(run, path)
        out[name] = path
    return out
