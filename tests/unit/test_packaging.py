"""The wheel `pip wheel` builds from the repository holds the plugin, its kernels as
`sglang_pdd.kernels` (never a top-level `kernels`), the entry point sglang loads it through, the console
scripts, the Apache-2.0 license (PEP 639: `License-Expression` and the LICENSE file) and every
third-party module the code imports as a declared dependency (the router's in the `router` extra, the
lab's in `lab`); that wheel, and `pip install ./`, install into a fresh venv where the package imports
and the entry point resolves, and the wheel's `sglang-pdd-router` starts a router that serves a request."""

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
        if f.startswith(("sglang_pdd/", "kernels/")) or f in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
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


# -- license, dependencies, console scripts -------------------------------------------------------
def _metadata(wheel) -> list[tuple[str, str]]:
    (meta,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    head = wheel.read(meta).decode().split("\n\n", 1)[0]
    return [(k, v.strip()) for k, _, v in (line.partition(":") for line in head.splitlines()) if v]


def test_the_wheel_carries_the_apache_license_in_the_pep_639_form(wheel):
    meta = _metadata(wheel)
    assert ("License-Expression", "Apache-2.0") in meta and ("License-File", "LICENSE") in meta
    assert not any(k == "License" for k, _ in meta)  # the deprecated free-text form
    assert not any(k == "Classifier" and v.startswith("License ::") for k, v in meta)
    (lic,) = [n for n in wheel.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
    text = wheel.read(lic).decode()
    with open(os.path.join(REPO, "LICENSE")) as f:
        assert text == f.read()
    assert "Apache License" in text and "Version 2.0, January 2004" in text


CONSOLE_SCRIPTS = {"sglang-pdd-router": "sglang_pdd.router.__main__:main", "sglang-pdd-demo": "sglang_pdd.lab.demo:main",
                   "sglang-pdd-bench": "sglang_pdd.lab.bench.__main__:main", "sglang-pdd-sim": "sglang_pdd.lab.sim.cli:main",
                   "sglang-pdd-faults": "sglang_pdd.lab.faults.__main__:main"}


def test_the_console_scripts_name_callables_that_take_no_arguments(wheel):
    import importlib
    import inspect

    (ep,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    cp = configparser.ConfigParser()
    cp.read_string(wheel.read(ep).decode())
    assert dict(cp["console_scripts"]) == CONSOLE_SCRIPTS
    for target in CONSOLE_SCRIPTS.values():
        mod, _, fn = target.partition(":")
        main = getattr(importlib.import_module(mod), fn)
        # the generated script calls main() without arguments
        assert all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                   for p in inspect.signature(main).parameters.values()), target


def _requires(wheel) -> dict[str, set[str]]:
    """{extra ("" for the base): normalised distribution names it requires}."""
    from packaging.requirements import Requirement

    out: dict[str, set[str]] = {}
    for k, v in _metadata(wheel):
        if k != "Requires-Dist":
            continue
        r = Requirement(v)
        extra = next((e for e in ("router", "grammar", "gpu", "lab", "bench", "test")
                      if r.marker and r.marker.evaluate({"extra": e})), "")
        out.setdefault(extra, set()).add(_norm(r.name))
        if r.name == "sglang-pdd":  # an extra that pulls another (lab -> router)
            out[extra] |= {f"sglang-pdd[{e}]" for e in r.extras}
    return out


def _norm(name: str) -> str:
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def _third_party_imports(root: str) -> dict[str, set[str]]:
    """{top-level module imported anywhere under root (a package directory): files importing it}."""
    import ast

    out: dict[str, set[str]] = {}
    for d, _, fs in os.walk(os.path.join(REPO, root)):
        for f in fs:
            if not f.endswith(".py"):
                continue
            path = os.path.join(d, f)
            with open(path) as fh:
                tree = ast.parse(fh.read())
            for n in ast.walk(tree):
                mods = ([a.name for a in n.names] if isinstance(n, ast.Import) else
                        [n.module] if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module else [])
                for m in mods:
                    top = m.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in ("sglang_pdd", "__future__"):
                        out.setdefault(top, set()).add(os.path.relpath(path, REPO))
    return out


# distributions sglang==0.5.23 (the gpu extra) brings on a GPU box: what sglang's own metadata requires
SGLANG_BRINGS = {"torch", "triton", "flashinfer"}  # flashinfer: module of flashinfer-python
# a module whose distribution differs between the CPU install and the GPU extra
SAME_AS = {"mooncake-transfer-engine-non-cuda": "mooncake-transfer-engine"}


def _dists_of(module: str) -> set[str]:
    import importlib.metadata as md

    return {SAME_AS.get(_norm(d), _norm(d)) for d in md.packages_distributions().get(module, [])}


def _check_declared(modules: dict[str, set[str]], allowed: set[str]) -> None:
    for mod, files in sorted(modules.items()):
        if mod in SGLANG_BRINGS and "sglang" in allowed:
            continue
        dists = _dists_of(mod)
        assert dists, f"{mod} (imported by {sorted(files)[:3]}) is not installed here: cannot tell its distribution"
        assert dists & allowed, f"{mod} ({sorted(dists)}, imported by {sorted(files)[:3]}) is not a declared dependency"


def test_every_module_the_serving_wing_imports_is_declared(wheel):
    req = _requires(wheel)
    imports = _third_party_imports("sglang_pdd")
    for sub in ("lab", "router"):  # the router and the lab are checked on their own below
        sub_imports = _third_party_imports(os.path.join("sglang_pdd", sub))
        for mod, files in sub_imports.items():
            imports[mod] -= files
    imports = {m: f for m, f in imports.items() if f}
    for mod, files in _third_party_imports("kernels").items():
        imports.setdefault(mod, set()).update(files)
    # a server: the base and the gpu extra (sglang, Mooncake; torch and triton come with sglang)
    _check_declared(imports, req[""] | req["gpu"])


# the router's one module that uses sglang (its OpenAI chat layer, where sglang is installed beside it)
ROUTER_SGLANG_LAYER = os.path.join("sglang_pdd", "router", "api", "openai", "sglang_server.py")
# and its one module that uses xgrammar (inside a grammar worker; the `grammar` extra)
ROUTER_GRAMMAR_COMPILE = os.path.join("sglang_pdd", "router", "api", "grammar", "compile.py")


def test_the_router_needs_only_the_base_and_the_router_extra(wheel):
    import ast

    req = _requires(wheel)
    imports = _third_party_imports(os.path.join("sglang_pdd", "router"))
    assert {"aiohttp", "transformers", "prometheus_client"} <= set(imports)
    # sglang's OpenAI layer is optional: imported inside its functions only, so a router box needs no sglang
    with open(os.path.join(REPO, ROUTER_SGLANG_LAYER)) as fh:
        top = [n for n in ast.parse(fh.read()).body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not any((n.module or "").split(".")[0] in ("sglang", "fastapi", "pydantic") for n in top
                   if isinstance(n, ast.ImportFrom)) and not any(a.name.split(".")[0] == "sglang" for n in top
                                                                 if isinstance(n, ast.Import) for a in n.names)
    imports = {m: f - {ROUTER_SGLANG_LAYER} for m, f in imports.items() if f - {ROUTER_SGLANG_LAYER}}
    assert not {"sglang", "torch"} & set(imports)  # a router box needs no sglang
    # xgrammar (and the torch it pulls) is the `grammar` extra's, imported inside grammar_compile's functions only
    assert imports.pop("xgrammar") == {ROUTER_GRAMMAR_COMPILE}
    _check_declared({"xgrammar": {ROUTER_GRAMMAR_COMPILE}}, req["grammar"])
    with open(os.path.join(REPO, ROUTER_GRAMMAR_COMPILE)) as fh:
        assert not [n for n in ast.parse(fh.read()).body if isinstance(n, (ast.Import, ast.ImportFrom))
                    and "xgrammar" in ast.unparse(n)]
    _check_declared(imports, req[""] | req["router"])
    # the negative control: without the router extra, aiohttp is not declared
    with pytest.raises(AssertionError, match="aiohttp"):
        _check_declared(imports, req[""])


def test_the_lab_extra_covers_the_lab(wheel):
    req = _requires(wheel)
    assert "sglang-pdd[router]" in req["lab"]
    imports = _third_party_imports(os.path.join("sglang_pdd", "lab"))
    imports.pop("pytest", None)  # lab/testbed/pytest_plugin.py: the test extra's
    _check_declared(imports, req[""] | req["router"] | req["lab"] | req["gpu"])


# -- the wheel's console script, run from a fresh venv ---------------------------------------------
def _venv_with_the_wheel_and_this_envs_dependencies(wheel_path, tmp_path) -> str:
    """A fresh venv (no site packages) with the wheel installed --no-deps; its dependencies come from
    this environment's site-packages, appended to sys.path by a .pth (the package is offline here), so
    the venv's own copy of sglang_pdd is found first (and this environment's editable install's own
    .pth files are not processed: a path from a .pth line is not a site directory)."""
    import sysconfig

    python = fresh_venv(tmp_path / "venv", with_pip=False)
    r = subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
                        "--disable-pip-version-check", "-q", str(wheel_path)],
                       capture_output=True, text=True, timeout=120, env=clean_env())
    assert r.returncode == 0, r.stdout + r.stderr
    site = subprocess.run([python, "-I", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    here = sysconfig.get_path("purelib")
    with open(os.path.join(site, "zz_deps_from_the_test_env.pth"), "w") as f:
        f.write(here + "\n")
        compat = os.path.join(here, "sglang_pdd_cpu.pth")  # this CPU box's torch needs it (docs/cpu.md)
        if os.path.exists(compat):
            with open(compat) as c:
                f.write(c.read())
    return python


def test_the_wheels_router_console_script_starts_and_serves(wheel_path, tmp_path, tiny_model):
    import time
    import urllib.request

    from sglang_pdd.lab.testing.servers import free_port
    from tests.examples.fake_router import running_roles

    python = _venv_with_the_wheel_and_this_envs_dependencies(wheel_path, tmp_path)
    script = os.path.join(os.path.dirname(python), "sglang-pdd-router")
    env = {**clean_env(), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env = {k: v for k, v in env.items() if not k.startswith("SGLANG_PDD_SECRET")}
    r = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 0 and "--prefill" in r.stdout and "--main" in r.stdout, r.stdout + r.stderr
    where = subprocess.run([python, "-I", "-c", "import sglang_pdd.router.__main__ as m, sys; print(m.__file__); "
                            "print(sys.prefix)"], capture_output=True, text=True, check=True, cwd=tmp_path).stdout.split()
    assert where[0].startswith(where[1] + os.sep), where  # the wheel's copy, not the checkout

    port = free_port()
    with running_roles() as cl:
        p, _, md = cl.urls
        log = open(tmp_path / "router.log", "w+")
        proc = subprocess.Popen([script, "--prefill", p, "8998", "--main", md, "--tokenizer", tiny_model,
                                 "--host", "127.0.0.1", "--port", str(port), "--pipeline", "direct",
                                 "--bandwidth-poll-s", "0", "--load-poll-s", "0", "--log-level", "warning",
                                 "--insecure-roles"],  # the fake roles have no key
                                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 120  # a bound on the wait, not a timing assertion
            while True:
                assert proc.poll() is None, f"the router exited: {log.seek(0) or log.read()[-3000:]}"
                try:
                    with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                        if resp.status == 200:
                            break
                except OSError:
                    pass
                assert time.monotonic() < deadline, f"router not healthy: {log.seek(0) or log.read()[-3000:]}"
                time.sleep(0.2)
            req = urllib.request.Request(url + "/generate", data=json.dumps(
                {"text": "hello", "sampling_params": {"max_new_tokens": 4}}).encode(),
                headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as resp:
                body = json.loads(resp.read())
            assert resp.status == 200 and body["meta_info"]["completion_tokens"] == 4, body
        finally:
            proc.terminate()
            proc.wait(30)
            log.close()
