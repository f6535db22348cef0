"""docs/design.md's map lists every module of the serving wing, and only modules that exist.

The map is a nested list: a package's line is `**`name/`**` and its modules are indented under it
(`name.py`), the package root's under a line without a name, `kernels/` at the top of the repository.
The lab is listed by its folders and top-level modules only. A module added, moved or removed without
its line in the map fails here, with the line to add or drop.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ITEM = re.compile(r"^( *)\* (\*\*)?(?:`([\w./]+)`)?")


def map_section(design: str) -> str:
    start = design.index("\n## Map\n")
    end = design.index("\n## ", start + 1)
    return design[start:end]


def listed(section: str) -> set[str]:
    """Repository paths the map names: `sglang_pdd/router/app.py`, `kernels/warmup.py`, `sglang_pdd/lab/bench/`."""
    stack: list[str] = []
    out = set()
    for line in section.splitlines():
        m = ITEM.match(line)
        if not m:
            continue
        depth, is_package, name = len(m.group(1)) // 2, bool(m.group(2)), m.group(3) or ""
        stack = stack[:depth]
        if is_package:
            stack.append(name)
            continue
        if not name or not stack:
            continue
        top = "" if stack[0] == "kernels/" else "sglang_pdd/"
        out.add(top + "".join(stack) + name)
    return out


def expected(repo: Path) -> set[str]:
    """Every serving module (packages' `__init__.py` but the root's aside), and the lab's entries."""
    out = set()
    pkg = repo / "sglang_pdd"
    for p in pkg.rglob("*.py"):
        rel = p.relative_to(repo).as_posix()
        if rel.startswith("sglang_pdd/lab/") or (p.name == "__init__.py" and p.parent != pkg):
            continue
        out.add(rel)
    for p in (repo / "kernels").rglob("*.py"):
        if p.name != "__init__.py":
            out.add(p.relative_to(repo).as_posix())
    lab = pkg / "lab"
    out |= {f"sglang_pdd/lab/{p.name}/" for p in lab.iterdir() if (p / "__init__.py").is_file()}
    out |= {f"sglang_pdd/lab/{p.name}" for p in lab.glob("*.py") if p.name != "__init__.py"}
    return out


def differences(repo: Path) -> tuple[list[str], list[str]]:
    """(modules the map leaves out, entries of the map that are not in the tree)."""
    names = listed(map_section((repo / "docs" / "design.md").read_text()))
    want = expected(repo)
    return sorted(want - names), sorted(names - want)


def test_the_map_lists_every_serving_module():
    names = listed(map_section((REPO / "docs" / "design.md").read_text()))
    assert len(names) > 100  # the map was read
    assert differences(REPO) == ([], [])


def test_the_rule_sees_a_missing_and_a_stale_line(tmp_path):
    """Negative control: a module the map leaves out, and a line for a module that moved."""
    for d in ("sglang_pdd/router/peers", "sglang_pdd/lab/sim", "kernels", "docs"):
        (tmp_path / d).mkdir(parents=True)
    for f in ("sglang_pdd/__init__.py", "sglang_pdd/config.py", "sglang_pdd/router/__init__.py",
              "sglang_pdd/router/app.py", "sglang_pdd/router/peers/__init__.py", "sglang_pdd/router/peers/pool.py",
              "sglang_pdd/router/peers/health.py", "sglang_pdd/lab/__init__.py", "sglang_pdd/lab/sim/__init__.py",
              "kernels/__init__.py", "kernels/warmup.py"):
        (tmp_path / f).write_text("")
    (tmp_path / "docs" / "design.md").write_text(
        "# d\n\n## Map\n\n* **the package root** — entry points\n  * `__init__.py` — x\n  * `config.py` — x\n"
        "* **`router/`** — the router\n  * `app.py` — x\n  * `dispatch.py` — moved away\n"
        "  * **`peers/`** (door 3) — x\n    * `pool.py` — x\n"
        "* **`kernels/`** — x\n  * `warmup.py` — x\n* **`lab/`** — x\n  * `sim/` — x\n\n## Next\n")
    assert differences(tmp_path) == (["sglang_pdd/router/peers/health.py"], ["sglang_pdd/router/dispatch.py"])
