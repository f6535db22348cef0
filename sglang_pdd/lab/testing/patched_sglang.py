"""A copy of the installed sglang with the series of patches/ applied, for tests that run on it.

`build(root)` copies the installed package to `<root>/python/sglang` (sglang's repository layout,
the one the patches name), runs `git apply --check` and then `git apply` on every patch in order,
and returns `root`; `PatchError` names the patch that does not apply. The copy keeps the installed
bytecode (valid for the files no patch touched), so servers started on it import as fast as on the
install. `environ(root)` puts the copy first on `PYTHONPATH`: a process started with it imports the
patched sglang, and the plugin takes its extension points there (plugin.CAPABILITIES).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PATCHES_DIR = REPO / "patches"
_DIFF_PATH = re.compile(r"^\+\+\+ b/(\S+)$", re.M)


class PatchError(RuntimeError):
    """A patch of the series does not apply to the installed sglang."""


def patches() -> list[Path]:
    return sorted(PATCHES_DIR.glob("[0-9][0-9][0-9][0-9]-*.patch"))


def touched(patch: Path) -> list[str]:
    """The paths (sglang's repository layout) a patch writes."""
    return _DIFF_PATH.findall(patch.read_text())


def installed_sglang() -> Path | None:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _git_apply(root: Path, patch: Path, *flags: str) -> subprocess.CompletedProcess:
    # Paths are relative to `root`, the cwd; no index (not a repository).
    return subprocess.run(["git", "apply", "-p1", *flags, str(patch)], cwd=root, capture_output=True, text=True)


def build(root: Path, src: Path | None = None) -> Path:
    """Copy sglang (`src`, default the installed one) under `root` and apply the series to it."""
    src = src or installed_sglang()
    if src is None:
        raise PatchError("sglang is not installed")
    shutil.copytree(src, root / "python" / "sglang")
    for patch in patches():
        check = _git_apply(root, patch, "--check")
        if check.returncode != 0:
            raise PatchError(f"{patch.name} does not apply to the installed sglang:\n{check.stderr}")
        done = _git_apply(root, patch)
        if done.returncode != 0:
            raise PatchError(f"{patch.name}: git apply failed:\n{done.stderr}")
    return root


def environ(root: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (default os.environ) with the patched copy first on PYTHONPATH, then this repository."""
    base = dict(os.environ if base is None else base)
    parts = [str(root / "python"), str(REPO), base.get("PYTHONPATH", "")]
    base["PYTHONPATH"] = os.pathsep.join(p for p in parts if p)
    return base
