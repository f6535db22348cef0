"""Compile Triton kernels for a GPU that is not here (default: the H200's sm_90a) and report their resources.

Triton's wheel ships the NVIDIA backend and ptxas, so the whole pipeline (TTIR -> TTGIR -> LLIR -> PTX ->
cubin) runs on a CPU box; only launching needs a driver. `compile_only()` installs a stand-in driver whose
target is the chosen GPU and turns every launch into the JIT's own warm-up (compile, don't run), so the
real launchers compile exactly what they would launch; `resources()` reruns ptxas -v on the PTX to read
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
def compile_only(arch: int = H200_ARCH) -> Iterator[list[Any]]:
    """Within the block, launching a Triton kernel compiles it for `arch` (90 -> sm_90a) and runs nothing.

    Yields a list that collects the CompiledKernel of every launch, so an unchanged launcher can be driven
    with CPU tensors (only shapes, dtypes, strides and alignment matter) to compile what it would launch.
    """
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("compile-only needs TRITON_INTERPRET unset (run it in a subprocess)")
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction

    compiled: list[Any] = []
    original_run = JITFunction.run

    def run_as_warmup(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        kernel = original_run(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append(kernel)
        return kernel

    previous = driver._active
    driver.set_active(_driver_class(arch)())
    JITFunction.run = run_as_warmup  # type: ignore[method-assign]
    try:
        yield compiled
    finally:
        JITFunction.run = original_run  # type: ignore[method-assign]
        driver._active = previous


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
