"""What real sglang 0.5.23 needs to run on a CPU-only box (no GPU, no CPU sgl-kernel, no AMX).

Installed (by scripts/install-cpu.sh, only into a CPU-only environment) as a ``.pth`` file, because
sglang spawns its scheduler and detokenizer processes and every one of them needs it before sglang's
modules import; so does any process that imports transformers (it imports torchvision). sglang
itself must still run with ``SGLANG_USE_CPU_ENGINE=1`` (its own switch for its CPU engine):

    python -m sglang_pdd.lab.compat install   # writes sglang_pdd_cpu.pth into site-packages
    python -m sglang_pdd.lab.compat check     # imports sglang the way a server does, prints OK

What it does, each item a verified failure of stock sglang on such a box (see docs/cpu.md):

* declares the ``torchvision::nms`` / ``qnms`` operator schemas before torchvision imports (PyPI's
  torchvision is a CUDA build whose ``_C.so`` cannot load beside torch+cpu, and its meta
  registrations then fail on the missing operators);
* provides a stand-in ``sgl_kernel`` module (``sglang_pdd.lab.compat.sgl_kernel_cpu``) when the real one
  is absent: torch versions of the few ops the CPU text path calls, a clear error for the rest;
* after ``sglang.srt.disaggregation.mooncake.conn`` imports, sets
  ``MooncakeKVSender.supports_host_tensor_indices = False`` (that path pins host memory, which needs
  an accelerator);
* with ``SGLANG_PDD_CPU_AMX_ATTENTION=1``, lets sglang keep ``--attention-backend intel_amx`` on a CPU
  without AMX (``sglang_pdd.lab.compat.amx_attention``: the backend's two ops in torch; MLA models
  need it);
* with ``SGLANG_PDD_CPU_FORK_CHILDREN=1`` (the test servers), forks sglang's scheduler and detokenizer
  instead of spawning them (``sglang_pdd.lab.compat.fork_children``: a server start without importing
  sglang three times).

Nothing here imports torch or sglang until the module that needs the fix is being imported, so the
``.pth`` costs nothing in other processes.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
import sysconfig
from typing import Callable

logger = logging.getLogger(__name__)

ENV_SWITCH = "SGLANG_USE_CPU_ENGINE"
PTH_NAME = "sglang_pdd_cpu.pth"
# Guarded, so that uninstalling sglang-pdd leaves a silent no-op rather than an error at every start.
PTH_LINE = (
    "import importlib.util as _u; _u.find_spec('sglang_pdd') and "
    "__import__('sglang_pdd.lab.compat.cpu', fromlist=['activate']).activate()\n"
)
MOONCAKE_CONN = "sglang.srt.disaggregation.mooncake.conn"
RUNTIME_CONTEXT = "sglang.srt.runtime_context"  # SGLANG_PDD_CPU_AMX_ATTENTION=1: keep intel_amx (amx_attention)
ENGINE = "sglang.srt.entrypoints.engine"  # SGLANG_PDD_CPU_FORK_CHILDREN=1: fork its children (fork_children)


def _declare_torchvision_ops() -> None:
    import torch

    try:
        lib = torch.library.Library("torchvision", "DEF")  # noqa: F841 - kept alive below
    except RuntimeError:  # already defined (a real torchvision op library loaded first)
        return
    for op in ("nms", "qnms"):
        lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _KEEP.append(lib)


def _patch_mooncake_conn(module) -> None:
    module.MooncakeKVSender.supports_host_tensor_indices = False


def _fork_children(module) -> None:
    from sglang_pdd.lab.compat.fork_children import patch_engine

    patch_engine(module)


def _claim_amx_attention(module) -> None:
    from sglang_pdd.lab.compat.amx_attention import claim_amx_attention

    real = any(not isinstance(f, _CpuFinder) and hasattr(f, "find_spec") and f.find_spec("sgl_kernel", None)
               for f in sys.meta_path)
    if not real:  # only the stand-in's ops are known to run without AMX
        claim_amx_attention(module)


_KEEP: list = []
# module name -> (before its code runs, after its code ran)
_FIXES: dict[str, tuple[Callable | None, Callable | None]] = {
    "torchvision": (_declare_torchvision_ops, None),
    MOONCAKE_CONN: (None, _patch_mooncake_conn),
    RUNTIME_CONTEXT: (None, _claim_amx_attention),
    ENGINE: (None, _fork_children),
}


class _FixingLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, before: Callable | None, after: Callable | None):
        self._inner, self._before, self._after = inner, before, after

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        if self._before:
            self._before()
        self._inner.exec_module(module)
        if self._after:
            self._after(module)


class _CpuFinder(importlib.abc.MetaPathFinder):
    """Applies the fixes above on import, and serves the stand-in `sgl_kernel` when it is absent."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "sgl_kernel":
            if self._real_spec(fullname, path, target) is not None:
                return None
            stand_in = os.path.join(os.path.dirname(__file__), "sgl_kernel_cpu.py")
            return importlib.util.spec_from_file_location("sgl_kernel", stand_in)
        fix = _FIXES.get(fullname)
        if fix is None:
            return None
        spec = self._real_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _FixingLoader(spec.loader, *fix)
        return spec

    def _real_spec(self, fullname, path, target):
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                return spec
        return None


def activate() -> None:
    """Install the fixes in this process (idempotent)."""
    if any(isinstance(f, _CpuFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _CpuFinder())
    if "torchvision" in sys.modules:  # too late for the schema fix; say so instead of failing later
        logger.warning("sglang-pdd CPU compat activated after torchvision was imported")
    if MOONCAKE_CONN in sys.modules:
        _patch_mooncake_conn(sys.modules[MOONCAKE_CONN])


def install(site_dir: str | None = None) -> str:
    """Write the `.pth` file that activates the fixes in every process of this environment."""
    site_dir = site_dir or sysconfig.get_paths()["purelib"]
    path = os.path.join(site_dir, PTH_NAME)
    with open(path, "w") as f:
        f.write(PTH_LINE)
    return path


def check() -> None:
    """Import what a CPU sglang server imports; raise on the first failure."""
    os.environ[ENV_SWITCH] = "1"
    activate()
    import sglang.srt.disaggregation.mooncake.conn as conn  # noqa: F401
    import sglang.srt.managers.scheduler  # noqa: F401
    import sglang.srt.models.llama  # noqa: F401
    from mooncake.engine import TransferEngine  # noqa: F401

    assert conn.MooncakeKVSender.supports_host_tensor_indices is False


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else ""
    if cmd == "install":
        print(install())
        return 0
    if cmd == "check":
        check()
        print("sglang CPU environment: OK")
        return 0
    print("usage: python -m sglang_pdd.lab.compat install|check", file=sys.stderr)
    return 2
