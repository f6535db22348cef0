"""Compile Triton kernels for a GPU that is not here (default: the H200's sm_90a) and report their resources.

Triton's wheel ships the NVIDIA backend and ptxas, so the whole pipeline (TTIR -> TTGIR -> LLIR -> PTX ->
cubin) runs on a CPU box; only launching needs a driver. `compile_only()` installs a stand-in driver whose
target is the chosen GPU, `compile_launch()` compiles exactly what a launcher would launch (the JIT's own
warm-up path, with the launcher's arguments), and `resources()` reruns ptxas -v on the PTX to read
registers and spill bytes. It catches what the interpreter cannot: compile errors (e.g. fp16 `tl.dot`
with K < 16), shared memory over the device limit, register spills.

Must run in a process where TRITON_INTERPRET is unset (the interpreter replaces the JIT at import time).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

H200_ARCH = 90
H200_MAX_SHARED_BYTES = 232_448  # 227 KiB opt-in dynamic shared memory per block on sm_90
MAX_REGISTERS_PER_THREAD = 255


@dataclass(frozen=True)
class KernelResources:
    """What one compiled variant needs on the device."""

    name: str
    num_warps: int
    num_stages: int
    shared_bytes: int
    registers: int
    spill_store_bytes: int
    spill_load_bytes: int

    @property
    def spills(self) -> bool:
        return self.spill_store_bytes > 0 or self.spill_load_bytes > 0

    def fits(self, max_shared: int = H200_MAX_SHARED_BYTES) -> bool:
        return self.shared_bytes <= max_shared and not self.spills and self.registers <= MAX_REGISTERS_PER_THREAD


def _driver_class(arch: int) -> type:
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase
    from triton.backends.nvidia.driver import ty_to_cpp

    class CompileOnlyDriver(DriverBase):
        """A driver that knows its target and nothing else: kernels compile, launches fail."""

        @classmethod
        def is_active(cls) -> bool:
            return True

        def map_python_to_cpp_type(self, ty: str) -> str:
            return ty_to_cpp(ty)

        def get_current_target(self) -> Any:
            return GPUTarget("cuda", arch, 32)

        def get_active_torch_device(self) -> Any:
            import torch

            return torch.device("cpu")

        def get_current_device(self) -> int:
            return 0

        def get_current_stream(self, device: int | None = None) -> int:
            return 0

        def set_current_device(self, device: int) -> None:
            return None

        def get_benchmarker(self) -> Any:
            raise RuntimeError("compile-only driver cannot benchmark")

        def get_device_interface(self) -> Any:
            raise RuntimeError("compile-only driver has no device")

    return CompileOnlyDriver


@contextlib.contextmanager
def compile_only(arch: int = H200_ARCH) -> Iterator[None]:
    """Within the block, Triton JIT functions compile for `arch` (e.g. 90 -> sm_90a) instead of running."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("compile-only needs TRITON_INTERPRET unset (run it in a subprocess)")
    from triton.runtime.driver import driver

    previous = driver._active
    driver.set_active(_driver_class(arch)())
    try:
        yield
    finally:
        driver._active = previous


def compile_launch(jit_fn: Any, grid: tuple[int, ...], args: tuple[Any, ...], meta: dict[str, Any]) -> Any:
    """Compile `jit_fn[grid](*args, **meta)` without launching it; returns Triton's CompiledKernel."""
    return jit_fn.warmup(*args, grid=grid, **meta)


_REG_RE = re.compile(r"Used (\d+) registers")
_SPILL_RE = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def resources(kernel: Any, arch: int = H200_ARCH) -> KernelResources:
    """Registers and spills from `ptxas -v` on the kernel's PTX; shared memory from Triton's metadata."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    ptx = kernel.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        proc = subprocess.run(
            [get_ptxas(arch).path, "-v", "--regAllocOptLevel=2", f"--gpu-name={sm_arch_from_capability(arch)}",
             src, "-o", os.path.join(tmp, "k.cubin")],
            capture_output=True, text=True, check=True,
        )
    log = proc.stdout + proc.stderr
    regs = _REG_RE.search(log)
    spill = _SPILL_RE.search(log)
    if regs is None or spill is None:
        raise RuntimeError(f"could not parse ptxas -v output:\n{log}")
    md = kernel.metadata
    return KernelResources(
        name=md.name, num_warps=md.num_warps, num_stages=md.num_stages, shared_bytes=int(md.shared),
        registers=int(regs.group(1)), spill_store_bytes=int(spill.group(1)), spill_load_bytes=int(spill.group(2)),
    )
