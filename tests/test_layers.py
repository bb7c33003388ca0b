"""Layers point one way: cli → serve/bench/chat/models → engine → native → llama_cpp. Only localgen/native/
(and localgen/_compat.py, the third-party patches) talks to the bindings; ruff's TID251 refuses an import of
llama_cpp elsewhere, and this test the calls an import check cannot see."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "localgen"
# names of the bindings' C functions and types (llama_decode, ggml_backend_dev_get, mtmd_encode_chunk, ...)
_NATIVE_NAME = re.compile(r"^(llama|ggml|mtmd|clip)_[a-z0-9_]+$")
# Modules above the native layer that still call the bindings through the Engine's `lib` attribute, and
# how many such names each uses: a ratchet while the calls move behind the wrappers of localgen/native/.
# A module may only go down; one that reaches 0 leaves the table.
LEFT: dict[str, int] = {
    "localgen/engine/embed.py": 26,
    "localgen/engine/tune.py": 12,
}
# Modules above the native layer that still take the bindings' handle itself: the same ratchet.
HANDLE_LEFT = {"localgen/engine/embed.py", "localgen/engine/tune.py"}


def _outside_native() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py")
                  if p.relative_to(ROOT).parts[0] != "native" and p.name != "_compat.py")


def _name(p: Path) -> str:
    return str(p.relative_to(ROOT.parent))


def test_only_the_native_layer_imports_llama_cpp_or_calls_lib() -> None:
    found = []
    for path in _outside_native():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found += [f"{_name(path)}:{node.lineno} import {a.name}" for a in node.names
                          if a.name.split(".")[0] == "llama_cpp"]
            elif isinstance(node, ast.ImportFrom) and node.module:
                if node.module.split(".")[0] == "llama_cpp":
                    found.append(f"{_name(path)}:{node.lineno} from {node.module}")
                if node.module == "localgen.native.lib" and any(a.name in ("lib", "libggml") for a in node.names):
                    found.append(f"{_name(path)}:{node.lineno} imports the bindings' handle from native/lib.py")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("lib", "libggml", "import_module")):
                found.append(f"{_name(path)}:{node.lineno} calls {node.func.id}()")
    holders = {f.split(":")[0] for f in found}
    assert holders <= HANDLE_LEFT, found
    assert holders == HANDLE_LEFT, "fewer modules take the handle than the table says: shrink HANDLE_LEFT"


def test_calls_into_the_bindings_outside_the_native_layer_only_go_down() -> None:
    counts: dict[str, int] = {}
    for path in _outside_native():
        n = sum(1 for node in ast.walk(ast.parse(path.read_text(), str(path)))
                if isinstance(node, ast.Attribute) and _NATIVE_NAME.match(node.attr))
        if n:
            counts[_name(path)] = n
    grew = {m: (n, LEFT.get(m, 0)) for m, n in counts.items() if n > LEFT.get(m, 0)}
    assert grew == {}, "calls into the bindings belong in localgen/native/: (found, allowed) per module"
    assert counts == LEFT, "fewer calls left than the table says: lower LEFT in tests/test_layers.py"
