"""Layers point one way: cli → serve/bench/chat/models → engine → native → llama_cpp. Only localgen/native/
(and localgen/_compat.py, the third-party patches) talks to the bindings; ruff's TID251 refuses an import of
llama_cpp elsewhere, and this test the uses an import check cannot see."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "localgen"
# names of the bindings' C functions, types and constants (llama_decode, ggml_backend_dev_get, mtmd_encode_chunk,
# LLAMA_TOKEN_ATTR_CONTROL, ...)
_NATIVE_NAME = re.compile(r"^(llama|ggml|mtmd|clip|LLAMA|GGML)_[A-Za-z0-9_]+$")


def _outside_native() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py")
                  if p.relative_to(ROOT).parts[0] != "native" and p.name != "_compat.py")


def _name(p: Path) -> str:
    return str(p.relative_to(ROOT.parent))


def test_only_the_native_layer_imports_llama_cpp_or_takes_its_handle() -> None:
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
    assert found == []


def test_no_call_into_the_bindings_outside_the_native_layer() -> None:
    """A C function of llama.cpp, ggml or libmtmd named outside localgen/native/ is a wrapper missing there."""
    found = [f"{_name(path)}:{node.lineno} {node.attr}" for path in _outside_native()
             for node in ast.walk(ast.parse(path.read_text(), str(path)))
             if isinstance(node, ast.Attribute) and _NATIVE_NAME.match(node.attr)]
    assert found == []
