"""The wheel `pip wheel` builds from the repository holds the plugin, its kernels as
`sglang_pdd.kernels` (never a top-level `kernels`), and the entry point sglang loads it through; that
wheel, and `pip install ./`, install into a fresh venv where the package imports and the entry point
resolves."""

from __future__ import annotations

import configparser
import json
import os
import subprocess
import sys
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A copy of the package's sources: setuptools writes build/ and *.egg-info next to what it builds."""
    src = tmp_path_factory.mktemp("src")
    files = subprocess.run(["git", "-C", REPO, "ls-files", "-co", "--exclude-standard"], capture_output=True,
                           text=True, check=True).stdout.split()
    for f in files:
        if f.startswith(("sglang_pdd/", "kernels/")) or f in ("pyproject.toml", "setup.py", "README.md"):
            dst = src / f
            dst.parent.mkdir(parents=True, exist_ok=True)
            if os.path.isfile(os.path.join(REPO, f)):
                dst.write_bytes(open(os.path.join(REPO, f), "rb").read())
    return src


@pytest.fixture(scope="module")
def wheel_path(source, tmp_path_factory):
    pytest.importorskip("setuptools")
    pytest.importorskip("wheel")
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(out), str(source)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = [p for p in out.iterdir() if p.suffix == ".whl"]
    return whl


@pytest.fixture(scope="module")
def wheel(wheel_path):
    return zipfile.ZipFile(wheel_path)


def test_the_wheel_holds_the_plugin_and_its_kernels(wheel):
    names = wheel.namelist()
    assert "sglang_pdd/__init__.py" in names and "sglang_pdd/plugin.py" in names
    assert "sglang_pdd/kernels/__init__.py" in names
    assert any(n.startswith("sglang_pdd/kernels/") and n.endswith(".py") and not n.endswith("__init__.py")
               for n in names)  # the kernels themselves
    assert "sglang_pdd/router/__main__.py" in names and "sglang_pdd/lab/testing/fake_upstream.py" in names
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


# -- installed into a fresh venv (no site packages, --no-deps) -----------------------------------
# What is checked there needs nothing but the standard library: importing sglang_pdd, its metadata, and
# resolving the plugin entry point (sglang_pdd.plugin imports only sglang_pdd.config). Calling load()
# needs sglang, and sglang_pdd.kernels needs torch; neither is installed there (both are checked absent).
FRESH_CHECK = r"""
import importlib.metadata as md, importlib.util, json, sys
import sglang_pdd
(ep,) = md.entry_points(group="sglang.srt.plugins", name="pdd")
dist = md.distribution("sglang-pdd")
print(json.dumps({
    "file": sglang_pdd.__file__, "prefix": sys.prefix, "version": sglang_pdd.__version__,
    "dist_version": dist.version, "entry_point": ep.value, "load_callable": callable(ep.load()),
    "requires": dist.requires, "files": [f.as_posix() for f in dist.files],
    "direct_url": dist.read_text("direct_url.json"),
    "absent": [m for m in ("kernels", "sglang", "torch", "msgspec") if importlib.util.find_spec(m) is None],
}))
"""


def clean_env() -> dict:
    """This environment without PYTHONPATH: pip must not see the checkout as an installed package."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def fresh_venv(path, with_pip: bool) -> str:
    """A venv of this interpreter's base Python without site packages; returns its python."""
    args = [sys.executable, "-m", "venv", str(path)] + ([] if with_pip else ["--without-pip"])
    r = subprocess.run(args, capture_output=True, text=True, timeout=120, env=clean_env())
    assert r.returncode == 0, r.stdout + r.stderr
    return str(path / "bin" / "python")


def check_installed(python: str, cwd) -> dict:
    # -I: no PYTHONPATH, no user site, no current directory: only what the venv holds
    r = subprocess.run([python, "-I", "-c", FRESH_CHECK], capture_output=True, text=True, timeout=60, cwd=cwd)
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(r.stdout)
    assert got["file"].startswith(got["prefix"] + os.sep), got["file"]  # installed, not the checkout
    assert got["version"] == got["dist_version"] == "0.1.0"
    assert got["entry_point"] == "sglang_pdd.plugin:load" and got["load_callable"]
    assert "sglang_pdd/kernels/__init__.py" in got["files"] and "sglang_pdd/router/__main__.py" in got["files"]
    assert not any(f.startswith("kernels/") for f in got["files"])
    assert set(got["absent"]) == {"kernels", "sglang", "torch", "msgspec"}  # a fresh venv, no leaks
    assert any(r.startswith("msgspec") for r in got["requires"])
    return got


def test_the_wheel_installs_and_loads_in_a_fresh_venv(wheel_path, tmp_path):
    python = fresh_venv(tmp_path / "venv", with_pip=False)
    r = subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
                        "--disable-pip-version-check", "-q", str(wheel_path)],
                       capture_output=True, text=True, timeout=120, env=clean_env())
    assert r.returncode == 0, r.stdout + r.stderr
    check_installed(python, tmp_path)


def test_pip_install_of_the_source_tree_installs_and_loads_in_a_fresh_venv(source, tmp_path):
    """`pip install ./` as a user runs it: the venv's own pip, build isolation (its build env fetches
    setuptools>=69, about 1 MB, from the package index), non-editable."""
    python = fresh_venv(tmp_path / "venv", with_pip=True)
    r = subprocess.run([python, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", "-q", "./"],
                       capture_output=True, text=True, timeout=180, cwd=source, env=clean_env())
    if r.returncode != 0 and not os.environ.get("CI") and "setuptools" in r.stdout + r.stderr and (
            "No matching distribution" in r.stdout + r.stderr or "Could not find a version" in r.stdout + r.stderr):
        pytest.skip(f"the isolated build could not fetch setuptools (no package index?): {r.stderr[-300:]}")
    assert r.returncode == 0, r.stdout + r.stderr
    got = check_installed(python, tmp_path)
    assert not json.loads(got["direct_url"])["dir_info"].get("editable")  # pip's record: a copy, not a link
