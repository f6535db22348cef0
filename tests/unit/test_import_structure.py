"""The two wings: what a server or the router imports (`sglang_pdd`, `kernels/`) never imports the lab.

`sglang_pdd.lab` (bench, micro-benchmarks, faults, sim, workload, testbed, testing, compat, demo) may
import the serving wing; the other way round is refused. The rule is read from the source (every
`import` and `from ... import`, at module level or inside a function, absolute or relative), and
checked once more by importing every serving module in a fresh interpreter. Mooncake's import-structure
test is the model.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAB = "sglang_pdd.lab"


def module_name(path: Path, root: Path, package: str) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([package, *parts])


def imported_names(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """Every module name an `import` statement of `source` names (relative ones resolved)."""
    out: list[tuple[int, str]] = []
    here = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            out.append((node.lineno, base))
            out += [(node.lineno, f"{base}.{a.name}") for a in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
              in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            out.append((node.lineno, node.args[0].value))
    return out


def serving_sources(repo: Path) -> list[tuple[Path, str]]:
    """(file, module) for every module of the serving wing: sglang_pdd outside lab/, and kernels/."""
    files = []
    pkg = repo / "sglang_pdd"
    for p in sorted(pkg.rglob("*.py")):
        if (pkg / "lab") in p.parents:
            continue
        files.append((p, module_name(p, pkg, "sglang_pdd")))
    for p in sorted((repo / "kernels").rglob("*.py")):
        files.append((p, module_name(p, repo / "kernels", "sglang_pdd.kernels")))
    return files


def lab_imports(repo: Path) -> list[str]:
    found = []
    for path, mod in serving_sources(repo):
        for line, name in imported_names(path.read_text(), mod, path.name == "__init__.py"):
            if name == LAB or name.startswith(LAB + "."):
                found.append(f"{path.relative_to(repo)}:{line} imports {name}")
    return found


def test_no_serving_module_imports_the_lab():
    assert len(serving_sources(REPO)) > 80  # the walk found the serving wing
    assert lab_imports(REPO) == []


def test_the_rule_catches_a_lab_import(tmp_path):
    """Negative control: a serving module that imports the lab, in each form the rule reads, is reported."""
    (tmp_path / "sglang_pdd" / "router").mkdir(parents=True)
    (tmp_path / "sglang_pdd" / "lab").mkdir()
    (tmp_path / "kernels").mkdir()
    (tmp_path / "sglang_pdd" / "__init__.py").write_text("")
    (tmp_path / "sglang_pdd" / "lab" / "__init__.py").write_text("import sglang_pdd.router\n")  # allowed
    (tmp_path / "sglang_pdd" / "router" / "__init__.py").write_text("")
    (tmp_path / "sglang_pdd" / "router" / "app.py").write_text(textwrap.dedent("""\
        import json
        from sglang_pdd.lab.testing import identity
        def lazy():
            from ..lab import sim
            import importlib
            return importlib.import_module("sglang_pdd.lab.bench.runner")
        """))
    found = lab_imports(tmp_path)
    assert [f.split(" imports ")[1] for f in found] == [
        "sglang_pdd.lab.testing", "sglang_pdd.lab.testing.identity", "sglang_pdd.lab", "sglang_pdd.lab.sim",
        "sglang_pdd.lab.bench.runner"], found
    assert all(f.startswith("sglang_pdd/router/app.py:") for f in found)


def test_importing_the_serving_wing_loads_no_lab_module():
    """Import every serving module in a fresh interpreter: no `sglang_pdd.lab` module beyond those the
    interpreter had at start (the CPU compat layer is activated by a .pth file on CPU boxes)."""
    mods = sorted(m for _, m in serving_sources(REPO) if not m.endswith("__main__"))
    code = textwrap.dedent(f"""\
        import importlib, json, sys
        before = {{m for m in sys.modules if m.startswith("{LAB}")}}
        failed = {{}}
        for m in {mods!r}:
            try:
                importlib.import_module(m)
            except Exception as e:  # an optional dependency missing: the static test covers it
                failed[m] = repr(e)
        after = {{m for m in sys.modules if m.startswith("{LAB}")}}
        print(json.dumps({{"new": sorted(after - before), "failed": failed}}))
        """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["new"] == []
    assert len(out["failed"]) < len(mods) // 4, out["failed"]
