"""PNG plots of the simulator's outputs. matplotlib is imported lazily (optional dependency)."""

from __future__ import annotations

import logging
from pathlib import Path

logger = logging.getLogger(__name__)


def _plt():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise SystemExit("plots need matplotlib (pip install 'sglang-pdd[bench]')") from e
    return plt


def _out(d: str, name: str) -> Path:
    p = Path(d)
    p.mkdir(parents=True, exist_ok=True)
    return p / name


def plot_paper(res: dict, out_dir: str) -> None:
    plt = _plt()
    rows = [r for r in res["rows"] if r.goodput is not None]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    names = [r.spec.name if i else "baseline" for i, r in enumerate(rows)]
    axes[0].bar(names, [r.goodput.bcr for r in rows])
    axes[0].set_title("BCR (SLA goodput / cost per hour)")
    axes[1].bar(names, [r.spec.price_per_hour for r in rows])
    axes[1].set_title("hardware cost per hour")
    for r, n in zip(res["rows"], names):
        s = r.at_load
        axes[2].plot([50, 90, 99], [s.ttft_p50, s.ttft_p90, s.ttft_p99], marker="o", label=n)
    axes[2].set_yscale("log")
    axes[2].set_xlabel("percentile")
    axes[2].set_title(f"TTFT (s) at {res['load']:.1f} req/s")
    axes[2].legend(fontsize=7)
    for ax in axes[:2]:
        ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    fig.tight_layout()
    fig.savefig(_out(out_dir, "paper.png"), dpi=120)
    plt.close(fig)


def plot_bathtub(points, out_dir: str) -> None:
    plt = _plt()
    h = [p.hit for p in points]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for name in points[0].revenue_bcr:
        axes[0].plot(h, [p.revenue_bcr[name] for p in points], label=name)
        axes[1].plot(h, [p.bcr[name] * 1e3 for p in points], label=name)
    axes[0].set_title("revenue BCR (billed tokens / cost)")
    axes[1].set_title("throughput BCR x1e3 (req/s / cost)")
    axes[2].plot(h, [p.tail_penalty() * 100 for p in points], label="default step overhead")
    axes[2].plot(h, [p.tail_penalty(True) * 100 for p in points], label="50 ms/step")
    axes[2].set_title("P throughput lost to lone tail chunks (%)")
    for ax in axes:
        ax.set_xlabel("prefix hit rate")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(_out(out_dir, "bathtub.png"), dpi=120)
    plt.close(fig)


def plot_oscillation(series, out_dir: str) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for s in series:
        axes[0].plot(s.t, s.rld_usage, label=s.name)
        axes[1].plot(s.t, s.md_hit, label=s.name)
        axes[2].plot(s.t, s.ttft_p90, label=s.name)
    axes[0].set_title("RLD occupancy")
    axes[1].set_title("mean MD radix hit")
    axes[2].set_title("TTFT p90 (s)")
    axes[2].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("time (s)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(_out(out_dir, "oscillation.png"), dpi=120)
    plt.close(fig)


def plot_wan_sweep(points, out_dir: str) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    names = [s.system for s in points[0].summaries]
    g = [p.gbps for p in points]
    for i, n in enumerate(names):
        axes[0].plot(g, [p.summaries[i].ttft_p99 for p in points], marker="o", label=n)
        axes[1].plot(g, [p.summaries[i].rld_token_share * 100 for p in points], marker="o", label=n)
    axes[0].set_yscale("log")
    axes[0].set_title("TTFT p99 (s)")
    axes[1].set_title("RLD share of output tokens (%)")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("WAN Gbit/s")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(_out(out_dir, "wan_sweep.png"), dpi=120)
    plt.close(fig)
