"""The roofline of a device: how fast a kernel could be, given the bytes it must move and the FLOPs it must do.

    ratio = max(bytes / peak bandwidth, flops / peak FLOP/s) / measured seconds

1.0 means the kernel runs at the device's limit; the handoff attention and the pack kernels are memory
bound, so their ratio is the fraction of HBM bandwidth they reach. Peaks are the vendors' figures (dense
bf16 tensor-core FLOP/s; HBM bandwidth); the device check also measures a plain device copy against the
same peak, which is what a memory-bound kernel can reach in practice (about 0.9 on an H200).

A CPU gets a nominal peak (marked as such) so that the dry run computes the same columns.

`python -m sglang_pdd.lab.micro.roofline` measures the peak this device reaches in practice (a device
copy of 2 GiB; a bf16 matmul of 8192^3) and prints it as one RESULT line; the device check runs it in a
bounded child first and takes the ratios against it (issue 37 asks for the measured roofline).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Peak:
    name: str
    bytes_per_s: float
    flops_per_s: float
    nominal: bool = False  # a placeholder (CPU), not a device's figure

    def label(self) -> str:
        suffix = ", nominal" if self.nominal else ""
        return f"{self.name}: {self.bytes_per_s / 1e9:.0f} GB/s, {self.flops_per_s / 1e12:.0f} TFLOP/s{suffix}"


# Matched in order against the device name (torch.cuda.get_device_name).
PEAKS: tuple[Peak, ...] = (
    Peak("H200", 4.8e12, 989e12),
    Peak("H100 PCIe", 2.0e12, 756e12),
    Peak("H100", 3.35e12, 989e12),
    Peak("H20", 4.0e12, 148e12),
    Peak("A100-SXM4-80GB", 2.039e12, 312e12),
    Peak("A100", 1.555e12, 312e12),
    Peak("L40S", 0.864e12, 362e12),
)
CPU_NOMINAL = Peak("cpu", 50e9, 1e12, nominal=True)


def peak_for(device_name: str) -> Peak | None:
    """The peak of a device by its name; the nominal CPU peak for "cpu"; None when unknown."""
    if device_name.lower().startswith("cpu"):
        return CPU_NOMINAL
    for peak in PEAKS:
        if peak.name.lower() in device_name.lower():
            return peak
    return None


def ratio(seconds: float, bytes_moved: float, flops: float, peak: Peak | None) -> float | None:
    """Roofline time over measured time (1.0: at the device's limit); None without a peak or a time."""
    if peak is None or not seconds or seconds <= 0:
        return None
    return max(bytes_moved / peak.bytes_per_s, flops / peak.flops_per_s) / seconds


def measure_peak() -> dict[str, float | str]:
    """This CUDA device's copy bandwidth (bytes read + written per second) and bf16 matmul FLOP/s."""
    import torch
    from triton.testing import do_bench

    dev = torch.device("cuda")
    a = torch.empty(2 << 30, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    copy_ms = float(do_bench(lambda: b.copy_(a), warmup=25, rep=100))
    del a, b
    n = 8192
    x = torch.randn((n, n), device=dev, dtype=torch.bfloat16)
    y = torch.randn((n, n), device=dev, dtype=torch.bfloat16)
    mm_ms = float(do_bench(lambda: x @ y, warmup=25, rep=100))
    return {"device": torch.cuda.get_device_name(dev), "bytes_per_s": 2 * (2 << 30) / (copy_ms * 1e-3),
            "flops_per_s": 2 * n**3 / (mm_ms * 1e-3)}


def measured(result: dict[str, float | str]) -> Peak:
    return Peak(f"{result['device']} (measured)", float(result["bytes_per_s"]), float(result["flops_per_s"]))


if __name__ == "__main__":
    from sglang_pdd.lab.micro import bounded

    if "--measure" not in sys.argv[1:]:
        print("usage: python -m sglang_pdd.lab.micro.roofline --measure   (on a CUDA device)", file=sys.stderr)
        sys.exit(2)
    bounded.stage("copy and matmul")
    bounded.emit(measure_peak())
