"""No import circles among localgen's modules: every import counts, at the top or inside a function (a lazy
import that closes a circle still ties the two modules together); only `if TYPE_CHECKING:` blocks do not."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _modules() -> dict[str, Path]:
    out = {}
    for p in (ROOT / "localgen").rglob("*.py"):
        parts = p.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([base] if base else [])])
            out |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return {m for m in out if m in known and m != name}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles() -> None:
    mods = _modules()
    graph = {name: _imports(name, path, set(mods)) for name, path in mods.items()}
    assert _circles(graph) == []


def test_the_check_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


PACKAGES = ("cli", "serve", "remote", "tools", "embeddings", "log", "chat", "quant", "bench", "models", "engine",
            "native")


def _package(module: str) -> str:
    """A module's package as ARCHITECTURE.md's table names it: a subpackage, else the top."""
    part = module.split(".")[1] if module.count(".") else ""
    return part if part in PACKAGES else "top"


def test_each_package_imports_only_what_the_architecture_page_says_it_may() -> None:
    """docs/ARCHITECTURE.md's packages table: the localgen packages named in a row's "may import" column (cli's
    "everything below") are the only ones its modules import (the entry `python -m localgen` aside)."""
    import re

    rows = [line.split(" | ") for line in (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("| `localgen/")]
    allowed: dict[str, set[str]] = {}
    for first, _, may in rows:
        package = "top" if first.endswith(" top") else first.strip("| `").strip("/").split("/")[1]
        named = PACKAGES if "everything below" in may else re.findall(
            r"\b(" + "|".join(PACKAGES) + r")\b", re.sub(r"\([^)]*\)", "", may))
        allowed[package] = {*named, "top"}
    assert set(allowed) == {*PACKAGES, "top"}, sorted(allowed)
    mods = _modules()
    known = set(mods)
    wrong = {f"{name} imports {imported}" for name, path in mods.items()
             if name not in ("localgen", "localgen.__main__") for imported in _imports(name, path, known)
             if _package(imported) != _package(name) and _package(imported) not in allowed[_package(name)]}
    assert not wrong, sorted(wrong)


def test_the_error_text_module_serve_imports_at_start_up_is_the_standard_library_only() -> None:
    """remote/errortext.py, which serve/upstream.py and serve/remotes.py import at their top: nothing but the
    standard library and itself comes with it (not the client, its stream parser or httpx)."""
    import subprocess
    import sys

    code = ("import sys; before = set(sys.modules); import localgen.remote.errortext; "
            "print(*sorted(set(sys.modules) - before))")
    came = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=ROOT).stdout.split()
    ours = {m for m in came if m.split(".")[0] == "localgen"}
    assert ours == {"localgen", "localgen.remote", "localgen.remote.errortext"}, sorted(ours)
    assert [m for m in came if m not in ours and m.split(".")[0].lstrip("_") not in sys.stdlib_module_names] == []
