"""Kernel tests run on CUDA when a GPU is present, else on CPU under Triton's interpreter.

`@triton.jit` reads TRITON_INTERPRET when it decorates: Triton's own library functions (`tl.cdiv`, ...)
at `import triton`, our kernels when a launcher first imports its kernel module (lazily, inside a test).
So this file sets the variable and imports Triton (before anything else in the run does), then takes the
variable out of the process environment again and sets it per test only: servers that other suites
start in the same pytest run do not inherit it. Compiled kernels go to a throw-away TRITON_CACHE_DIR.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
HAS_TRITON = True

if not HAS_CUDA:
    _previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.language  # noqa: F401  # decorates Triton's library in interpreter mode
    except ImportError:
        HAS_TRITON = False
    finally:
        if _previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = _previous
    if HAS_TRITON:
        from triton.language import standard
        from triton.runtime.interpreter import InterpretedFunction

        if not isinstance(standard.cdiv, InterpretedFunction):
            raise RuntimeError(
                "triton was imported (in compiled mode) before tests/kernels/conftest.py could set "
                "TRITON_INTERPRET=1, e.g. by a test module importing sglang at collection; run the kernel "
                "tests alone or with TRITON_INTERPRET=1 in the environment")
        from interpreter_patches import patch_fp8_downcast

        patch_fp8_downcast()


@pytest.fixture(scope="session")
def _triton_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("triton-cache")


@pytest.fixture(autouse=True)
def _triton_env(monkeypatch: pytest.MonkeyPatch, _triton_cache_dir: Path) -> Iterator[None]:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(_triton_cache_dir))
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    yield


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device("cuda") if HAS_CUDA else torch.device("cpu")
