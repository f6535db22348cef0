"""Accelerators on the paper's four axes (peak compute, memory capacity, memory bandwidth,
interconnect bandwidth) plus a price, and instances built from them.

The presets are assumptions, not vendor data: chip A is compute-strong (good at prefill), chip
B has ~1.6x the memory bandwidth and 1.33x the memory but less compute, and costs 25 % more
(the paper prices B 20-30 % above A; docs/sim.md, "Paper-scenario hardware").
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Chip:
    name: str
    peak_tflops: float  # dense peak at the serving precision, TFLOP/s
    mem_gb: float  # HBM capacity, GB (1e9 bytes)
    mem_bw_tbps: float  # HBM bandwidth, TB/s
    interconnect_gbps: float  # scale-up bandwidth per chip, GB/s
    price_per_hour: float  # relative cost units per chip-hour (amortised hardware)

    def __post_init__(self) -> None:
        for f in ("peak_tflops", "mem_gb", "mem_bw_tbps", "interconnect_gbps", "price_per_hour"):
            if getattr(self, f) <= 0:
                raise ValueError(f"chip {self.name}: {f} must be > 0")

    def priced(self, price_per_hour: float) -> "Chip":
        return replace(self, price_per_hour=price_per_hour)


CHIP_A = Chip("A", peak_tflops=800.0, mem_gb=96.0, mem_bw_tbps=1.6, interconnect_gbps=400.0,
              price_per_hour=1.0)
CHIP_B = Chip("B", peak_tflops=400.0, mem_gb=128.0, mem_bw_tbps=2.6, interconnect_gbps=400.0,
              price_per_hour=1.25)

CHIPS = {c.name: c for c in (CHIP_A, CHIP_B)}


@dataclass(frozen=True)
class Efficiency:
    """Achievable fractions of peak. MFU ramps with tokens per step: mfu * t / (t + half)."""

    mfu: float = 0.5
    mfu_half_tokens: int = 256
    mbu: float = 0.8
    step_overhead_s: float = 0.004  # launch / scheduling cost of every forward
    mem_usable: float = 0.9  # of HBM; the rest is activations, graphs, fragmentation


@dataclass(frozen=True)
class InstanceSpec:
    """One serving instance: `chips` chips of one kind running one model replica."""

    chip: Chip
    chips: int = 8
    eff: Efficiency = Efficiency()

    @property
    def flops(self) -> float:
        return self.chip.peak_tflops * 1e12 * self.chips

    @property
    def mem_bw(self) -> float:
        return self.chip.mem_bw_tbps * 1e12 * self.chips * self.eff.mbu

    @property
    def mem_bytes(self) -> float:
        return self.chip.mem_gb * 1e9 * self.chips * self.eff.mem_usable

    @property
    def interconnect(self) -> float:
        return self.chip.interconnect_gbps * 1e9 * self.chips

    @property
    def price_per_hour(self) -> float:
        return self.chip.price_per_hour * self.chips
