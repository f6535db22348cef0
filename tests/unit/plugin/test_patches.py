"""patches/ applies to the installed sglang, compiles, and its own unit tests pass on the patched copy.

The series is in sglang's repository layout (`python/sglang/...`, `test/registered/...`).
sglang_pdd.lab.testing.patched_sglang rebuilds that layout in a temporary directory from a copy of the
installed package (`<tmp>/python/sglang`) and runs `git apply --check`, then `git apply`, on every
patch in order; the test byte-compiles every Python file the series touches, and runs the unit tests the series adds
(CPU, no server) in one subprocess whose `PYTHONPATH` puts the patched copy first. The tests
import modules that only the series creates, so they cannot pass against the unpatched install.
The same subprocess checks the plugin's choice at load there: every capability of
`plugin.CAPABILITIES` takes sglang's extension point, and the hooks they retire are not registered;
patched_plugin_check.py drives the plugin's code through those extension points on sglang's own
classes.
"""

from __future__ import annotations

import py_compile
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_pdd.lab.testing import patched_sglang
from sglang_pdd.lab.testing.patched_sglang import touched as _touched

REPO = patched_sglang.REPO
PATCHES = patched_sglang.patches()
PLUGIN_CHECK = Path(__file__).with_name("patched_plugin_check.py")


@pytest.fixture(scope="module")
def patched_tree(patched_sglang_root) -> Path:
    return patched_sglang_root


def _run_patched(patched_tree: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**patched_sglang.environ(patched_tree), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, *argv], cwd=patched_tree, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_series_is_numbered_and_each_patch_has_a_pr_message():
    assert PATCHES, "patches/ holds no patch"
    assert [int(p.name[:4]) for p in PATCHES] == list(range(1, len(PATCHES) + 1))
    for patch in PATCHES:
        text = patch.read_text()
        assert text.startswith("From "), f"{patch.name} is not in git format-patch form"
        body = text.split("\n\n", 1)[1].split("\n---\n", 1)[0]
        for section in ("Motivation", "Design", "Tests"):
            assert re.search(rf"^{section}$", body, re.M), f"{patch.name}: no {section!r} section"
        touched = _touched(patch)
        assert any(p.startswith("python/sglang/") for p in touched), patch.name
        assert any(p.startswith("test/registered/") for p in touched), f"{patch.name} adds no test"
        assert "GIT binary patch" not in text and not any("__pycache__" in p for p in touched), \
            f"{patch.name} carries compiled files"


def test_the_series_applies_and_the_patched_files_compile(patched_tree):
    for patch in PATCHES:
        for rel in _touched(patch):
            if rel.endswith(".py"):
                py_compile.compile(str(patched_tree / rel), doraise=True,
                                   cfile=str(patched_tree / ".pyc" / (rel + "c")))


def test_the_patches_own_unit_tests_pass_on_the_patched_copy(patched_tree):
    tests = sorted({rel for p in PATCHES for rel in _touched(p)
                    if rel.startswith("test/registered/") and Path(rel).name.startswith("test_")})
    assert tests
    code = ("import sys, unittest, runpy, pathlib\n"
            "import sglang\n"
            f"assert sglang.__file__.startswith({str(patched_tree)!r}), sglang.__file__\n"
            "suite = unittest.TestSuite()\n"
            "for path in sys.argv[1:]:\n"
            "    sys.path.insert(0, str(pathlib.Path(path).parent))\n"
            "    mod = __import__(pathlib.Path(path).stem)\n"
            "    suite.addTests(unittest.defaultTestLoader.loadTestsFromModule(mod))\n"
            "res = unittest.TextTestRunner(verbosity=1).run(suite)\n"
            "print(f'RAN {res.testsRun} SKIPPED {len(res.skipped)}')\n"
            "from sglang_pdd import plugin\n"  # the plugin's choice at load on the patched sglang
            "caps = plugin.capability_paths()\n"
            "retired = {t for c in plugin.CAPABILITIES for t in c.retires}\n"
            "ok = all(caps.values()) and len(plugin.active_hooks()) == sum(1 for h in plugin.HOOKS if h.target not in retired or not h.retirable)\n"
            "print(f'CAPABILITIES {caps} ACTIVE {len(plugin.active_hooks())}/{len(plugin.HOOKS)}')\n"
            "sys.exit(0 if res.wasSuccessful() and not res.skipped and ok else 1)\n")
    proc = _run_patched(patched_tree, "-c", code, *[str(patched_tree / t) for t in tests])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    ran = int(re.search(r"RAN (\d+)", out).group(1))
    assert ran >= 40, out[-3000:]


def test_the_plugin_serves_the_extension_points_on_the_patched_copy(patched_tree):
    proc = _run_patched(patched_tree, str(PLUGIN_CHECK))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "PLUGIN CHECKS OK" in out, out[-3000:]
