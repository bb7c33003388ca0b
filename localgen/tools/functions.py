"""Tools from a Python file (`--functions FILE.py`, as `llm --functions` does): each public function
defined in the file is a tool; its type hints make the JSON Schema and its docstring the description."""

from __future__ import annotations

import inspect
import json
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localgen.errors import ToolError
from localgen.tools.spec import NAME_CHARS, ToolSpec

_SIMPLE = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array"}


def load(path: Path) -> list[tuple[ToolSpec, Callable[..., Any]]]:
    """The file's public functions as tools (a ToolError when the file cannot be loaded or has none)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"localgen_functions_{abs(hash(str(path)))}", path)
    if spec is None or spec.loader is None:
        raise ToolError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise ToolError(f"{path}:{e.lineno}: {e.msg}") from None
    except Exception as e:  # the user's module ran and failed: say where, in one line
        raise ToolError(f"loading {path} failed: {type(e).__name__}: {e}") from None
    found = [(name, fn) for name, fn in vars(module).items()
             if inspect.isfunction(fn) and fn.__module__ == module.__name__ and not name.startswith("_")]
    if not found:
        raise ToolError(f"{path} defines no public functions to use as tools")
    return [(describe(fn, path), fn) for _, fn in found]


def describe(fn: Callable[..., Any], where: Path | str = "") -> ToolSpec:
    """A function's tool: name, first docstring paragraph, and a schema from its parameters."""
    name = fn.__name__
    if not set(name) <= NAME_CHARS:
        raise ToolError(f"{where}: {name} is not a usable tool name")
    try:
        hints = typing.get_type_hints(fn)
    except Exception as e:  # an annotation that does not resolve
        raise ToolError(f"{where}: the type hints of {name} do not resolve: {e}") from None
    doc = inspect.getdoc(fn) or ""
    props: dict[str, Any] = {}
    required: list[str] = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        schema = _schema(hints.get(p.name, str))
        note = _param_doc(doc, p.name)
        if note:
            schema["description"] = note
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
        else:
            schema["default"] = p.default if _jsonable(p.default) else None
        props[p.name] = schema
    params: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        params["required"] = required
    return ToolSpec(name, doc.split("\n\n")[0].strip(), params)


def _jsonable(v: Any) -> bool:
    try:
        json.dumps(v)
    except (TypeError, ValueError):
        return False
    return True


def _schema(hint: Any) -> dict[str, Any]:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in _SIMPLE:
        return {"type": _SIMPLE[hint]}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        kinds = [a for a in args if a is not type(None)]
        return _schema(kinds[0]) if len(kinds) == 1 else {"anyOf": [_schema(a) for a in kinds]}
    if origin in (list, tuple, set, frozenset):
        return {"type": "array", **({"items": _schema(args[0])} if args else {})}
    if origin is dict:
        return {"type": "object"}
    return {"type": "string"}


def _param_doc(doc: str, name: str) -> str:
    """A parameter's description from `:param name: ...` or a Google-style `name: ...` line."""
    for line in doc.splitlines():
        s = line.strip()
        for head in (f":param {name}:", f"{name}:", f"{name} ("):
            if s.startswith(head):
                rest = s[len(head):]
                return rest.split(":", 1)[1].strip() if head.endswith("(") and ":" in rest else rest.strip()
    return ""
