"""The wheel `pip wheel` builds from the repository holds the plugin, its kernels as
`sglang_pdd.kernels` (never a top-level `kernels`), and the entry point sglang loads it through."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    pytest.importorskip("setuptools")
    pytest.importorskip("wheel")
    out = tmp_path_factory.mktemp("wheel")
    # build from a copy: setuptools writes build/ and *.egg-info next to the sources it builds
    src = out / "src"
    files = subprocess.run(["git", "-C", REPO, "ls-files", "-co", "--exclude-standard"], capture_output=True,
                           text=True, check=True).stdout.split()
    for f in files:
        if f.startswith(("sglang_pdd/", "kernels/")) or f in ("pyproject.toml", "setup.py", "README.md"):
            dst = src / f
            dst.parent.mkdir(parents=True, exist_ok=True)
            if os.path.isfile(os.path.join(REPO, f)):
                dst.write_bytes(open(os.path.join(REPO, f), "rb").read())
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(out), str(src)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = [p for p in out.iterdir() if p.suffix == ".whl"]
    return zipfile.ZipFile(whl)


def test_the_wheel_holds_the_plugin_and_its_kernels(wheel):
    names = wheel.namelist()
    assert "sglang_pdd/__init__.py" in names and "sglang_pdd/plugin.py" in names
    assert "sglang_pdd/kernels/__init__.py" in names
    assert any(n.startswith("sglang_pdd/kernels/") and n.endswith(".py") and not n.endswith("__init__.py")
               for n in names)  # the kernels themselves
    assert "sglang_pdd/router/__main__.py" in names and "sglang_pdd/testing/fake_upstream.py" in names
    assert not any(n.startswith(("kernels/", "tests/", "examples/")) for n in names)
    # every package in the source tree is in the wheel
    for root in ("sglang_pdd", "kernels"):
        for d, _, fs in os.walk(os.path.join(REPO, root)):
            if "__init__.py" in fs and "__pycache__" not in d:
                rel = os.path.relpath(d, REPO).replace(os.sep, "/")
                pkg = "sglang_pdd/kernels" + rel[len("kernels"):] if root == "kernels" else rel
                assert f"{pkg}/__init__.py" in names, pkg


def test_the_wheel_declares_the_plugin_entry_point_and_the_gpu_extra(wheel):
    (ep,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    cp = configparser.ConfigParser()
    cp.read_string(wheel.read(ep).decode())
    assert dict(cp["sglang.srt.plugins"]) == {"pdd": "sglang_pdd.plugin:load"}
    (meta,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    text = wheel.read(meta).decode()
    requires = [l.split(":", 1)[1].strip() for l in text.splitlines() if l.startswith("Requires-Dist:")]
    gpu = [r for r in requires if 'extra == "gpu"' in r]
    assert any(r.startswith("mooncake-transfer-engine==") for r in gpu), gpu  # the CUDA wheel
    assert not any("non-cuda" in r for r in gpu)
    assert any(r.startswith("sglang==0.5.23") for r in gpu)


def test_the_entry_point_resolves():
    from sglang_pdd import plugin

    assert callable(plugin.load)
