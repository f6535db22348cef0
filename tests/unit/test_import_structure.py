"""The serving wing's import structure: what a server or the router imports (`sglang_pdd` outside
`sglang_pdd/lab`, and `kernels/`, imported as `sglang_pdd.kernels`).

The rules are read from the source: every `import` and `from ... import`, at module level or inside a
function, absolute or relative, and `importlib.import_module("...")` with a constant name. Mooncake's
import-structure test is the model.

1. The serving wing never imports the lab: `sglang_pdd.lab` (bench, micro-benchmarks, faults, sim,
   workload, testbed, testing, compat, demo) may import the serving wing, not the other way round;
   checked once more by importing every serving module in a fresh interpreter.
2. Only the control modules (`CONTROL_MODULES`: decode/relay/controls.py, decode/main/controls.py,
   transfer/controls.py, prefill_relay/controls.py) import `sglang_pdd.test_switches`. They choose once, when their role starts,
   the controlled classes or the seams the serving code is given; no other serving module knows a
   test switch.
3. No import cycle: the module import graph is acyclic. An edge goes from a module to the deepest
   serving module an import names: `from pkg import mod` to `pkg.mod`, `from pkg import name` to
   `pkg`, `import a.b` to `a.b`. The package `__init__` modules Python runs on the way to a submodule
   are not edges of their own (a package whose `__init__` exposes its submodules would otherwise be a
   cycle with each of them).
4. At most `MAX_FLOORS` floors. A room is a package of the serving wing (its `__init__` and its
   modules; a subpackage is a room of its own), and each loose top-level module (`config`, `engine`,
   `plugin`, `test_switches`, the package root) is one. Some rooms import each other both ways (today:
   config <-> server; decode <-> decode/relay, decode/main, whose runtime decode/runtime.py chooses;
   router/request <-> router/request/migration; router/api <-> router/api/openai), so the room graph
   has no longest path and floors are counted on the module graph instead: a chain of imports (a path in
   the acyclic module graph) starts on one floor and climbs one each time an import leaves the room of
   the module that makes it; the wing's floors are the most any chain climbs. Where the room graph is
   acyclic this is its longest path; imports inside a room (a package's own layering) add no floor.
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
TEST_SWITCHES = "sglang_pdd.test_switches"
CONTROL_MODULES = ("sglang_pdd.decode.relay.controls", "sglang_pdd.decode.main.controls",
                   "sglang_pdd.transfer.controls", "sglang_pdd.prefill_relay.controls")
MAX_FLOORS = 8


def module_name(path: Path, root: Path, package: str) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([package, *parts])


def _imports(source: str, module: str, is_package: bool):
    """(line, base, names) for each import of `source`: `import base`, `from base import names`
    (relative bases resolved), `import_module("base")`."""
    here = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name, []
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            yield node.lineno, base, [a.name for a in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
              in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            yield node.lineno, node.args[0].value, []


def imported_names(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """Every module name an `import` statement of `source` names (relative ones resolved)."""
    out: list[tuple[int, str]] = []
    for line, base, names in _imports(source, module, is_package):
        out.append((line, base))
        out += [(line, f"{base}.{n}") for n in names]
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


def switches_imports(repo: Path) -> list[str]:
    """Imports of the test switches by serving modules other than the control modules."""
    found = []
    for path, mod in serving_sources(repo):
        if mod in CONTROL_MODULES:
            continue
        for line, name in imported_names(path.read_text(), mod, path.name == "__init__.py"):
            if name == TEST_SWITCHES or name.startswith(TEST_SWITCHES + "."):
                found.append(f"{path.relative_to(repo)}:{line} imports {name}")
    return found


def import_graph(repo: Path) -> tuple[dict[str, set[str]], dict[str, str]]:
    """(module -> the serving modules it imports, module -> its room), as the docstring defines them."""
    sources = serving_sources(repo)
    known = {mod for _, mod in sources}

    def deepest(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    rooms: dict[str, str] = {}
    for path, mod in sources:
        is_package = path.name == "__init__.py"
        parent = mod.rpartition(".")[0]
        rooms[mod] = mod if is_package or parent == "sglang_pdd" else parent
        edges = set()
        for _, base, names in _imports(path.read_text(), mod, is_package):
            for target in [f"{base}.{n}" if f"{base}.{n}" in known else base for n in names] or [base]:
                edges.add(deepest(target))
        graph[mod] = {e for e in edges if e is not None and e != mod}
    return graph, rooms


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


def floors(graph: dict[str, set[str]], rooms: dict[str, str]) -> tuple[int, list[str]]:
    """The most floors an import chain climbs, and that chain (the graph must be acyclic)."""
    best: dict[str, tuple[int, list[str]]] = {}

    def climb(v: str) -> tuple[int, list[str]]:
        if v not in best:
            best[v] = (1, [v])
            for w in sorted(graph[v]):
                n, chain = climb(w)
                n += rooms[w] != rooms[v]
                if n > best[v][0]:
                    best[v] = (n, [v, *chain])
        return best[v]

    return max((climb(v) for v in sorted(graph)), key=lambda c: c[0], default=(0, []))


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


def test_only_the_control_modules_import_the_test_switches():
    graph, _ = import_graph(REPO)
    assert all(m in graph for m in CONTROL_MODULES)  # the named control modules exist
    assert all(TEST_SWITCHES in graph[m] for m in CONTROL_MODULES)  # and are the ones that read the switches
    assert switches_imports(REPO) == []


def fake_tree(root: Path, modules: dict[str, str]) -> Path:
    """A serving wing of `modules` (dotted name under sglang_pdd -> source; `pkg.__init__` for a
    package's own), every folder a package."""
    (root / "kernels").mkdir(parents=True)
    for name, source in modules.items():
        path = root / "sglang_pdd" / f"{name.replace('.', '/')}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    for folder in [root / "sglang_pdd", *(root / "sglang_pdd").rglob("*")]:
        if folder.is_dir() and not (folder / "__init__.py").exists():
            (folder / "__init__.py").write_text("")
    return root


def test_the_rule_catches_a_test_switches_import_outside_the_control_modules(tmp_path):
    """Negative control: a serving module that imports the switches, in each form, is reported; the
    control module and the lab are not."""
    repo = fake_tree(tmp_path, {
        "test_switches": "",
        "transfer.controls": "from sglang_pdd import test_switches\n",  # a control module: allowed
        "lab.faults": "from sglang_pdd.test_switches import TestKnobs\n",  # the lab: allowed
        "transfer.lanes": """\
            from sglang_pdd import test_switches
            def lazy():
                from ..test_switches import TestKnobs
                import sglang_pdd.test_switches
            """,
    })
    found = switches_imports(repo)
    assert [f.split(" imports ")[1] for f in found] == [
        "sglang_pdd.test_switches", "sglang_pdd.test_switches", "sglang_pdd.test_switches.TestKnobs",
        "sglang_pdd.test_switches"], found
    assert all(f.startswith("sglang_pdd/transfer/lanes.py:") for f in found)


def test_the_serving_wing_has_no_import_cycle():
    graph, _ = import_graph(REPO)
    assert len(graph) > 80 and sum(map(len, graph.values())) > 200  # the walk found the imports
    assert import_cycles(graph) == []


def test_the_rule_catches_an_import_cycle_closed_inside_a_function(tmp_path):
    """Negative control: pipeline -> never_lose at module level, never_lose -> pipeline inside a function
    (the cycle this rule was written for) is a cycle; a package's `__init__` that imports its own
    submodules, which import each other through it, is not."""
    repo = fake_tree(tmp_path, {
        "policy.pipeline": "from sglang_pdd.policy import never_lose\n",
        "policy.never_lose": """\
            def decide():
                from .pipeline import Pipeline
            """,
        "kernels_like.__init__": "from .pack import pack\nfrom .backend import resolve\n",
        "kernels_like.pack": "from sglang_pdd.kernels_like import backend\n",
        "kernels_like.backend": "",
    })
    graph, _ = import_graph(repo)
    assert graph["sglang_pdd.policy.never_lose"] == {"sglang_pdd.policy.pipeline"}
    assert graph["sglang_pdd.kernels_like.pack"] == {"sglang_pdd.kernels_like.backend"}
    assert import_cycles(graph) == [["sglang_pdd.policy.never_lose", "sglang_pdd.policy.pipeline"]]


def test_the_serving_wing_has_at_most_eight_floors():
    graph, rooms = import_graph(REPO)
    n, chain = floors(graph, rooms)
    assert 3 <= n <= MAX_FLOORS, [f"{m} ({rooms[m]})" for m in chain]


def test_the_rule_counts_floors_by_rooms(tmp_path):
    """Negative control: a chain through nine rooms is nine floors, too many; a chain of nine modules in
    one room is one floor, and a chain that leaves a room and comes back climbs each time."""
    chain = {f"r{i}.m": f"from sglang_pdd.r{i + 1} import m\n" for i in range(1, 9)}
    graph, rooms = import_graph(fake_tree(tmp_path / "rooms", {**chain, "r9.m": ""}))
    n, path = floors(graph, rooms)
    assert n == 9 > MAX_FLOORS and path == [f"sglang_pdd.r{i}.m" for i in range(1, 10)]
    one_room = {f"room.m{i}": f"from sglang_pdd.room import m{i + 1}\n" for i in range(1, 9)}
    graph, rooms = import_graph(fake_tree(tmp_path / "one", {**one_room, "room.m9": ""}))
    assert floors(graph, rooms)[0] == 1
    back_and_forth = {"a.top": "import sglang_pdd.a.sub.mid\n", "a.sub.mid": "from sglang_pdd.a import low\n",
                      "a.low": "from sglang_pdd import config\n", "config": ""}
    graph, rooms = import_graph(fake_tree(tmp_path / "back", back_and_forth))
    assert rooms["sglang_pdd.config"] == "sglang_pdd.config" and rooms["sglang_pdd.a.low"] == "sglang_pdd.a"
    assert floors(graph, rooms) == (4, ["sglang_pdd.a.top", "sglang_pdd.a.sub.mid", "sglang_pdd.a.low",
                                        "sglang_pdd.config"])
