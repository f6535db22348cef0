"""No docstring, comment or Markdown page names a module or a repository path that does not exist.

Modules move (the router went into rooms, loose modules into `server/`); a sentence that still names
the old place sends a reader to nothing. Read from the text and resolved by files on disk:

* a dotted name `sglang_pdd.<package>.<module>.<name>` resolves package by package (`<package>/` with
  an `__init__.py`, or `<module>.py`; the `kernels/` folder is `sglang_pdd.kernels`), and what is left
  is an attribute: its first part bound at the top of the last module found, a class's member in the
  class's body (or the class has bases it may inherit it from);
* in backticks, a short dotted name is read the same way when its first part is a top-level name of
  the package (`router.api.front_door`, `config.FLAGS`, relative to `sglang_pdd`) or the name of one
  module only (`kv_events.KvEventFeed`); `NOT_OURS` lists the first parts that are something else;
* a path that starts with a folder of this repository exists under some folder that holds one of that
  name: the top-level ones (`sglang_pdd/`, `tests/`, `docs/`, ...) at the root, `router/` or `server/`
  under `sglang_pdd/`, `relay/` under `decode/`, `bench/` under the lab, `unit/` under `tests/`. A
  path counts only where it starts a word, so a path through sglang's tree (`srt/disaggregation/...`,
  `srt/managers/...`) is never read as ours; a path with an extension or a closing slash counts
  anywhere, one without (`router/cache`, `policy/handoff_mode.HandoffModePolicy`) only in backticks;
* a Markdown link to a local file points at one.

Read: docstrings and comments of sglang_pdd/, kernels/, tests/ and scripts/; Markdown of docs/, the
top README.md, examples/**/README*.md and patches/*.md.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PY_ROOTS = ("sglang_pdd", "kernels", "tests", "scripts")
TOP_FOLDERS = ("sglang_pdd", "tests", "docs", "scripts", "examples", "kernels", "patches")
PATH_EXTENSIONS = {"py", "md", "sh", "yml", "yaml", "json", "jsonl", "toml", "txt", "patch", "cfg",
                   "ini", "j2", "csv", "png", "svg"}

# first parts of a short dotted name that are not a module of ours there: our package itself (read
# whole), a variable (`main.abort()`: the main leg, `pool.get_key_buffer`: sglang's pool), sglang's
# own modules of the same name (`server_args.ServerArgs`, `sampling.sampling_batch_info`)
NOT_OURS = {"sglang_pdd", "main", "pool", "server_args", "sampling"}

DOTTED = re.compile(r"(?<![\w.])sglang_pdd(?:\.[A-Za-z_]\w*)+")
BACKTICKS = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")


class Tree:
    """The repository on disk: its folders, which modules exist and what each binds at its top."""

    def __init__(self, root: Path):
        self.root = root
        pkg = root / "sglang_pdd"
        # a folder's name -> the folders that hold one of that name (`relay/` is under decode/)
        self.homes: dict[str, list[Path]] = {f: [root] for f in TOP_FOLDERS}
        # a module's name -> its files (`kv_events` is router/cache/kv_events.py)
        self.modules: dict[str, list[Path]] = {}
        for top in (pkg, root / "kernels", root / "tests"):
            for d in sorted(p for p in top.rglob("*") if p.is_dir() and p.name != "__pycache__"):
                self.homes.setdefault(d.name, []).append(d.parent)
            for f in sorted(top.rglob("*.py")):
                if top.name == "tests" and f.name == "__init__.py":
                    continue  # tests/unit/router/ mirrors the package: a name there is the package's
                name = f.parent.name if f.name == "__init__.py" else f.stem
                self.modules.setdefault(name, []).append(f)
        self.short_roots = {p.stem for p in pkg.glob("*.py") if p.stem != "__init__"} | {
            p.name for p in pkg.glob("*") if (p / "__init__.py").is_file()} | {"kernels"}
        folders = "|".join(sorted(map(re.escape, self.homes), key=len, reverse=True))
        self.path_re = re.compile(rf"(?<![\w./\-~$@])(?:{folders})/[\w./\-]*")

    # ---- dotted names -------------------------------------------------------------------------
    def dotted_ok(self, parts: list[str]) -> bool:
        """`parts` after `sglang_pdd`: packages and modules on disk, then attributes."""
        where = self.root / "sglang_pdd"  # a package folder, or a module file once one is reached
        for i, part in enumerate(parts):
            if where.is_dir():
                sub = (self.root / "kernels") if (i == 0 and part == "kernels") else where / part
                if (sub / "__init__.py").is_file():
                    where = sub
                    continue
                if where.joinpath(f"{part}.py").is_file():
                    where = where / f"{part}.py"
                    continue
            module = where / "__init__.py" if where.is_dir() else where
            return self.attribute_ok(module, parts[i:])
        return True

    def attribute_ok(self, module: Path, attrs: list[str]) -> bool:
        names, classes, lazy = top_names(module)
        if attrs[0] not in names:
            return lazy
        if len(attrs) > 1 and attrs[0] in classes:
            members, has_bases = classes[attrs[0]]
            return attrs[1] in members or has_bases
        return True

    # ---- paths --------------------------------------------------------------------------------
    def path_ok(self, path: str, in_backticks: bool) -> bool | None:
        """True/False for a path of this repository; None where the text is not a path to check."""
        first = path.split("/", 1)[0]
        bases = self.homes[first]
        is_dir = path.endswith("/")
        last = path.rstrip("/").rsplit("/", 1)[-1]
        ext = last.rsplit(".", 1)[-1] if "." in last else ""
        for base in bases:
            target = base / path.rstrip("/")
            if target.is_dir() if is_dir else target.exists():
                return True
            if not is_dir and ext not in PATH_EXTENSIONS:
                if target.with_name(last + ".py").is_file():
                    return True
                if "." in last:  # `policy/handoff_mode.HandoffModePolicy`: a module and its attribute
                    stem, *attrs = last.split(".")
                    module = target.with_name(stem + ".py")
                    if module.is_file() and self.attribute_ok(module, attrs):
                        return True
        return False if is_dir or ext in PATH_EXTENSIONS or in_backticks else None


@cache
def top_names(module: Path) -> tuple[set[str], dict[str, tuple[set[str], bool]], bool]:
    """What `module` binds at its top, its classes' members, and whether it has a module __getattr__."""
    tree = ast.parse(module.read_text())
    names: set[str] = set()
    classes: dict[str, tuple[set[str], bool]] = {}
    for node in tree.body:
        names |= bound(node)
        if isinstance(node, (ast.If, ast.Try)):  # `if TYPE_CHECKING:`, `try: import ...`
            for sub in ast.walk(node):
                names |= bound(sub)
        if isinstance(node, ast.ClassDef):
            members = set().union(*(bound(n) for n in node.body)) if node.body else set()
            classes[node.name] = (members, bool(node.bases))
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            names |= set(node.names)
    if module.name == "__init__.py":  # a package's submodules are its attributes once imported
        names |= {p.stem for p in module.parent.glob("*.py")} | {
            p.name for p in module.parent.iterdir() if (p / "__init__.py").is_file()}
    return names, classes, "__getattr__" in names


def bound(node: ast.AST) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    targets: list[ast.AST] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


# ---- the texts --------------------------------------------------------------------------------
def python_texts(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every docstring and comment of a Python file."""
    source = path.read_text()
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                out += [(body[0].lineno + i, line)
                        for i, line in enumerate(body[0].value.value.splitlines())]
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
    return out


def markdown_texts(path: Path) -> list[tuple[int, str]]:
    return list(enumerate(path.read_text().splitlines(), start=1))


def sources(root: Path) -> list[tuple[Path, list[tuple[int, str]], bool]]:
    """(file, its texts, is Markdown) for every file the rule reads."""
    found = []
    for top in PY_ROOTS:
        for p in sorted((root / top).rglob("*.py")):
            found.append((p, python_texts(p), False))
    pages = sorted((root / "docs").rglob("*.md")) + [root / "README.md"]
    pages += sorted((root / "examples").rglob("README*.md")) + sorted((root / "patches").glob("*.md"))
    for p in pages:
        if p.is_file():
            found.append((p, markdown_texts(p), True))
    return found


def stale_names(root: Path) -> list[str]:
    """'file:line: name' for every name in the texts that resolves to nothing on disk."""
    tree = Tree(root)
    stale = []
    for path, texts, is_markdown in sources(root):
        rel = path.relative_to(root)
        for line, text in texts:
            for bad in stale_in(tree, text, path if is_markdown else None):
                stale.append(f"{rel}:{line}: {bad}")
    return sorted(set(stale))


def stale_in(tree: Tree, text: str, page: Path | None) -> list[str]:
    bad = []
    for m in DOTTED.finditer(text):
        if not tree.dotted_ok(m.group(0).split(".")[1:]):
            bad.append(m.group(0))
    in_ticks = [(m.start(1), m.end(1)) for m in BACKTICKS.finditer(text)]
    for m in BACKTICKS.finditer(text):
        name = re.match(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+", m.group(1))
        parts = name.group(0).split(".") if name else []
        if not parts or parts[-1] in PATH_EXTENSIONS:  # `config.py` is a file, not an attribute `py`
            continue
        if parts[0] in tree.short_roots:
            if not tree.dotted_ok(parts):
                bad.append(name.group(0))
        elif parts[0] not in NOT_OURS and len(tree.modules.get(parts[0], ())) == 1:
            # `kv_events.KvEventFeed`: the one module of that name
            if not tree.attribute_ok(tree.modules[parts[0]][0], parts[1:]):
                bad.append(name.group(0))
    for m in tree.path_re.finditer(text):
        path = m.group(0).rstrip(".-")
        follows = text[m.end():m.end() + 1]
        if follows in ("*", "{", "<", "[") or "..." in m.group(0) or "//" in path:
            continue
        ticked = any(a <= m.start() and m.end() <= b for a, b in in_ticks)
        if tree.path_ok(path, ticked) is False:
            bad.append(path)
    if page is not None:
        for m in LINK.finditer(text):
            target = m.group(1).split("#", 1)[0]
            if not target or re.match(r"[a-z]+:", target):
                continue
            if not (page.parent / target).exists():
                bad.append(f"link {target}")
    return bad


# ---- the tests --------------------------------------------------------------------------------
def test_every_named_module_and_path_exists():
    assert len(sources(REPO)) > 200  # the walk found the sources and the pages
    assert stale_names(REPO) == []


def test_the_rule_catches_stale_names(tmp_path):
    """Negative control: a tree with one module and texts that name it, and what no longer exists."""
    (tmp_path / "sglang_pdd" / "router" / "peers").mkdir(parents=True)
    (tmp_path / "kernels").mkdir()
    (tmp_path / "docs").mkdir()
    for init in ("sglang_pdd", "sglang_pdd/router", "sglang_pdd/router/peers", "kernels"):
        (tmp_path / init / "__init__.py").write_text("")
    (tmp_path / "sglang_pdd" / "router" / "peers" / "placement.py").write_text(
        '"""Where a request goes: `sglang_pdd.router.peers.placement.MainChoice`, in `router/peers/`."""\n'
        "class MainChoice:\n    site = None\n\n"
        "# the old home: sglang_pdd.router.placement\n")
    (tmp_path / "kernels" / "pack.py").write_text("def pack():\n    pass  # see `kernels.pack.pack`\n")
    (tmp_path / "docs" / "x.md").write_text(
        "Fine: `router.peers.placement.MainChoice.site`, sglang_pdd/router/peers/placement.py, "
        "sglang_pdd.kernels.pack, `router/peers`, [x](x.md), sglang's python/sglang/srt/server/x.py.\n"
        "Stale: `router.peers.placement.Gone`, router/dispatch.py, docs/gone.md, [y](y.md),\n"
        "sglang_pdd.decode_runtime.runtime, `router/cache`, `kernels.pack.unpack`.\n")
    assert stale_names(tmp_path) == [
        "docs/x.md:2: docs/gone.md",
        "docs/x.md:2: link y.md",
        "docs/x.md:2: router.peers.placement.Gone",
        "docs/x.md:2: router/dispatch.py",
        "docs/x.md:3: kernels.pack.unpack",
        "docs/x.md:3: router/cache",
        "docs/x.md:3: sglang_pdd.decode_runtime.runtime",
        "sglang_pdd/router/peers/placement.py:5: sglang_pdd.router.placement",
    ]
