"""The device check (scripts/device-check.sh) runs from a copy of the repo with a python where the project is
not installed, as on the device machine, and a benchmark point that exceeds its bound is reported as a
STALL while the rest runs and the exit status says so.

The "bare" python is a throwaway venv that sees this environment's packages (torch, triton, pytest, ...)
except sglang, flashinfer, msgspec, pyzmq and the project itself: the device machine has none of them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_pdd.lab.micro import bounded
from sglang_pdd.lab.micro import handoff_kernel as hk

REPO = Path(__file__).resolve().parents[4]
# what the device machine lacks (prefixes of top-level names in site-packages, lower case), and .pth files
HIDDEN = ("sglang", "__editable__", "flashinfer", "sgl_kernel", "msgspec", "zmq", "pyzmq")
COPY_IGNORE = shutil.ignore_patterns(".git", ".venv", "runs", ".artifacts", "__pycache__", "*.egg-info", "build",
                                     "dist", ".pytest_cache")


def _site_dirs() -> list[Path]:
    """Where this environment's packages live: torch's directory first, then every site-packages."""
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin, "torch is not installed"
    dirs = [Path(spec.origin).resolve().parents[1]] + [Path(d).resolve() for d in site.getsitepackages()]
    return [d for i, d in enumerate(dirs) if d.is_dir() and d not in dirs[:i]]


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("bare-python")
    packages = root / "site"
    packages.mkdir()
    for directory in _site_dirs():
        for entry in directory.iterdir():
            name = entry.name.lower()
            if name.endswith(".pth") or name.startswith(HIDDEN) or (packages / entry.name).exists():
                continue
            (packages / entry.name).symlink_to(entry)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "bare.pth").write_text(str(packages) + "\n")
    return str(python)


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment of the device machine: no venv, no PYTHONPATH, not CI (whose skips-fail rule is CI's)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "TRITON_INTERPRET", "PYTHONSAFEPATH", "OUT", "PYTHON", "CI")}
    env.update(extra)
    return env


def test_the_bare_python_lacks_the_project_and_sglang(bare_python: str, tmp_path: Path) -> None:
    def imports(module: str) -> bool:
        return subprocess.run([bare_python, "-c", f"import {module}"], cwd=tmp_path, env=_clean_env(),
                              capture_output=True, timeout=120).returncode == 0

    assert imports("torch") and imports("triton") and imports("pytest")
    for module in ("sglang_pdd", "sglang", "msgspec", "zmq"):
        assert not imports(module), f"{module} imports in the bare python"


def test_dry_run_from_a_copy_of_the_repo_with_a_bare_python(bare_python: str, tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    shutil.copytree(REPO, clone, ignore=COPY_IGNORE, symlinks=True)
    out = tmp_path / "out"
    proc = subprocess.run(["bash", "scripts/device-check.sh", "--dry-run"], cwd=clone, capture_output=True, text=True,
                          env=_clean_env(PYTHON=bare_python, OUT=str(out)), timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "device check: passed" in proc.stdout
    rows = json.loads((out / "device_check.json").read_text())
    status = {(r["section"], r["point"], r["impl"]): r["status"] for r in rows}

    assert status[("env", "imports", "sglang_pdd")] == "ok"
    imported_from = next(r["notes"] for r in rows if r["point"] == "imports")
    assert str(clone) not in imported_from  # the temporary tree, not the clone (whose sglang_pdd has no kernels)
    for module in ("test_handoff_attention.py", "test_handoff_variants.py", "test_handoff_hook.py", "test_kv_pack.py"):
        assert status[("tests", module, "pytest")] == "ok", module
    assert status[("tests", "tests/kernels", "pytest")] == "ok"
    notes = {(r["section"], r["point"], r["impl"]): r["notes"] for r in rows}
    for k in hk.SMOKE_KS:
        assert status[("kernel", f"b1 k={k} prefix={hk.SMOKE_PREFIXES[0]}", "pdd")] == "ok"
    # the tile sweep ran at the first point at least (its budget may end it early on a slow box)
    assert "sweep best" in notes[("kernel", f"b1 k={hk.SMOKE_KS[0]} prefix={hk.SMOKE_PREFIXES[0]}", "pdd")]
    sweeps = json.loads((out / "handoff.json").read_text())
    assert any(t["status"] == "ok" for r in sweeps if r["impl"] == "pdd" for t in r.get("tune", []))
    for impl in ("sgl extend", "sgl split", "flashinfer"):
        assert status[("kernel", "every point", impl)] == "absent"
    for impl in ("copy", "pack", "unpack", "pack fp8", "unpack fp8"):
        assert status[("pack", "64 tok", impl)] == "ok", impl
    for point in ("peak", "ratios of", "handoff kernel", "pack kernels", "device copy"):
        assert any(r["section"] == "roofline" and r["point"] == point for r in rows), point
    assert not [r for r in rows if r["failure"]]
    assert (out / "device_check.txt").read_text().startswith("section")


def test_a_point_past_its_bound_is_a_stall_and_the_grid_goes_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The real child (the smoke point in the interpreter), told to sleep at k=1: STALL with its point and
    stage; k=8 still runs; the exit status is 1. The bound is waited out once: 15 s, five times what a smoke
    point takes on the 2-core box (about 3 s, its child's start included)."""
    monkeypatch.setenv(bounded.STALL_ENV, hk.point_label(1, 64, "pdd"))
    out = tmp_path / "rows.json"
    rc = hk.main(["--smoke", "--ks", "1", "8", "--prefixes", "64", "--skip", "sgl-extend", "sgl-split", "flashinfer",
                  "--timeout-s", "15", "--json", str(out)])
    results = {(r["k"], r["impl"]): r for r in json.loads(out.read_text())}
    assert rc == 1
    stalled = results[(1, "pdd")]
    assert stalled["status"] == "STALL" and "forced stall" in stalled["why"], stalled
    assert results[(8, "pdd")]["status"] == "ok"
    printed = capsys.readouterr()
    assert "STALL" in printed.out and "k=1 prefix=64" in printed.out


def _fake_child(script: str) -> list[str]:
    return [sys.executable, "-S", "-c", script]


def test_grid_semantics_with_stand_in_children(monkeypatch: pytest.MonkeyPatch) -> None:
    """A comparator that stalls is not run again for larger k and fails nothing; a stalled or failing point
    of the handoff kernel is a failure; a result over its tolerance is BAD."""
    ok = ('print("STAGE timing"); print(\'RESULT {"device": "cpu", "bytes": 1000, "flops": 10, "err": %s, '
          '"tolerance": 0.001, "us": 5.0, "us_call": 6.0, "plan": "p"}\')')
    behaviour = {
        (1, "pdd"): ok % "0.0",
        (1, "sgl extend"): 'import time; print("STAGE first call (compile)", flush=True); time.sleep(60)',
        (8, "pdd"): ok % "0.5",
        (64, "pdd"): "import sys; print('boom'); sys.exit(3)",
    }

    def child_argv(self: hk.Grid, k: int, prefix: int, impl: str) -> list[str]:
        return _fake_child(behaviour.get((k, impl), ok % "0.0"))

    monkeypatch.setattr(hk.Grid, "child_argv", child_argv)
    monkeypatch.setattr(hk.importlib.util, "find_spec", lambda name: object())  # every comparator "installed"
    grid = hk.Grid.smoke_grid(timeout_s=3.0, skip=("flashinfer",))
    results = {(r["k"], r["impl"]): r for r in hk.run_grid(grid)}

    assert results[(1, "pdd")]["status"] == "ok" and results[(1, "pdd")]["roofline"] > 0
    stall = results[(1, "sgl extend")]
    assert stall["status"] == "STALL" and "first call (compile)" in stall["why"]
    assert results[(8, "sgl extend")]["status"] == "not run" and "stalled at k=1" in results[(8, "sgl extend")]["why"]
    assert results[(8, "sgl split")]["status"] == "ok"
    assert results[(8, "pdd")]["status"] == "BAD"
    assert results[(64, "pdd")]["status"] == "ERROR" and "boom" in results[(64, "pdd")]["why"]
    assert results[(1, "flashinfer")]["status"] == "skipped"
    failed = {key for key, r in results.items() if hk.is_failure(r)}
    assert failed == {(8, "pdd"), (64, "pdd")}


def test_a_deadline_leaves_the_remaining_points_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hk.Grid, "child_argv", lambda self, k, prefix, impl: _fake_child("raise SystemExit(1)"))
    results = hk.run_grid(hk.Grid.smoke_grid(skip=("sgl extend", "sgl split", "flashinfer")), deadline=0.0)
    assert {r["status"] for r in results if r["impl"] == "pdd"} == {"not run"}
    assert all(hk.is_failure(r) for r in results if r["impl"] == "pdd")


def test_run_child_reports_stage_result_and_errors() -> None:
    fine = bounded.run_child(_fake_child('print("STAGE a"); print(\'RESULT {"x": 1}\')'), 10)
    assert (fine.status, fine.result, fine.stage) == ("ok", {"x": 1}, "a")
    crashed = bounded.run_child(_fake_child('print("STAGE b"); print("trace"); raise SystemExit(2)'), 10)
    assert crashed.status == "ERROR" and crashed.stage == "b" and crashed.why() == "trace"
    silent = bounded.run_child(_fake_child("pass"), 10)
    assert silent.status == "ERROR"  # exit 0 without a result line is no result
    stalled = bounded.run_child(_fake_child('import time; print("STAGE c", flush=True); time.sleep(60)'), 1)
    assert stalled.status == "STALL" and stalled.stage == "c" and stalled.seconds < 30
    assert "last stage: c" in stalled.why()

