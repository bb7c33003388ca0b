"""Tools from a Python file (`--functions FILE.py`, as `llm --functions` does): each public function
defined in the file is a tool; its type hints make the JSON Schema and its docstring the description."""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import json
import os
import re
import sys
import threading
import types
import typing
import weakref
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

from localgen.errors import ToolError
from localgen.tools.spec import NAME_CHARS, ToolSpec

_SIMPLE = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array"}


_redirect = threading.Lock()
_open: list[TextIO] = []  # while tools run (calls may overlap: one entry each), where their Python code prints
_fd_saved: list[int] = []  # descriptor 1 as it was (os.dup), while tools run with it pointed at stderr
_abandoned: weakref.WeakSet[threading.Thread] = weakref.WeakSet()  # tool calls left running past their timeout
# where the Python code of a tool prints, set in its own thread alone (and what copies its context: asyncio's
# tasks, asyncio.to_thread): every other thread's sys.stdout and sys.stderr are what they were
_route: contextvars.ContextVar[TextIO | None] = contextvars.ContextVar("localgen_tool_output", default=None)
# as cli/output.py's visible(): C0 but a line break and a tab, DEL, C1, and a CR alone (tools may not import cli)
_CONTROLS = re.compile(r"\r(?!\n)|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


class ToolStopped(BaseException):
    """Raised in a tool's thread that ran past its timeout, to stop it (as KeyboardInterrupt: not an Exception,
    which the tool may catch)."""


class _Shown:
    """Where a tool's Python code prints: stderr, on a terminal with its control characters shown escaped
    (`\\x1b`), as a tool's result is, and saying it is no terminal, so that a library that colours a terminal's
    text (rich, click) writes it plain; into a pipe or a file byte for byte."""

    def __init__(self, stream: TextIO, escaped: bool) -> None:
        self.stream = stream
        self.escaped = escaped

    def write(self, text: str) -> int:
        if self.escaped and isinstance(text, str):
            self.stream.write(_CONTROLS.sub(_escape, text))
            return len(text)
        return self.stream.write(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def isatty(self) -> bool:
        return False if self.escaped else bool(self.stream.isatty())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


class _Routed:
    """sys.stdout or sys.stderr while tools run: in a tool's own thread, where `_route` says (stderr, _Shown);
    in a call's past its timeout, nowhere; in every other thread (a spinner, a log line, serve's other requests),
    the stream it stands for, as before."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def _target(self) -> Any:
        return _route.get() or self.stream

    def write(self, text: str) -> int:
        if threading.current_thread() in _abandoned:
            return len(text)
        n = self._target().write(text)
        return len(text) if n is None else int(n)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def isatty(self) -> bool:
        return bool(self._target().isatty())

    def __getattr__(self, name: str) -> Any:  # flush, fileno, buffer, encoding: the thread's own stream's
        return getattr(self._target(), name)


def _escape(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 0x20 else f"\\u{code:04x}"


def _terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # closed, or no isatty
        return False


def _unwrapped(stream: TextIO) -> TextIO:
    return stream.stream if isinstance(stream, _Routed) else stream


def _route_streams() -> None:
    """sys.stdout and sys.stderr as _Routed (once: left so while a call past its timeout runs on)."""
    if sys.stdout is not None and not isinstance(sys.stdout, _Routed):
        sys.stdout = typing.cast(TextIO, _Routed(sys.stdout))
    if sys.stderr is not None and not isinstance(sys.stderr, _Routed):
        sys.stderr = typing.cast(TextIO, _Routed(sys.stderr))


def _unroute_streams() -> None:
    """sys.stdout and sys.stderr back as they were (those that something else has replaced since are left)."""
    if isinstance(sys.stdout, _Routed):
        sys.stdout = sys.stdout.stream
    if isinstance(sys.stderr, _Routed):
        sys.stderr = sys.stderr.stream


def abandon(worker: threading.Thread) -> None:
    """A tool call past its timeout: stopped where it next runs Python code (a thread cannot be killed; a C call, a
    sleep, end first), and nothing it prints from now on is shown: the turn has moved on without it."""
    import ctypes

    _abandoned.add(worker)
    if worker.ident is not None and worker.is_alive():  # CPython's C API: an exception raised in another thread
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident), ctypes.py_object(ToolStopped))
    with _redirect:
        _route_streams()


def abandoned(threads: Iterable[threading.Thread]) -> int:
    """How many of `threads` are tool calls left running past their timeout (abandon)."""
    return sum(1 for thread in list(threads) if thread in _abandoned)


@contextlib.contextmanager
def tools_running() -> Iterator[None]:
    """While a --functions file loads or its tools run: descriptor 1 is stderr's, which the programs a tool starts
    inherit (subprocess.run, os.system), so what they print is shown, but never into the answer (stdout carries
    only the answer; --json stays one object). That is safe process-wide: the answer is not written while a tool
    runs (the turn waits for its calls), and serve writes nothing on stdout. sys.stdout and sys.stderr are
    _Routed: the threads that `stdout_to_stderr` or `printing_to_stderr` mark print as a result is shown (_Shown);
    every other thread (a spinner, a log line, serve's other requests) writes as before. After, what calls left
    running past their timeout print is dropped (`abandon`); a program such a call started keeps writing to
    stderr, where it was pointed as it started."""
    with _redirect:
        if not _open:
            with contextlib.suppress(Exception):  # (what the answer wrote so far, before descriptor 1 moves)
                sys.stdout.flush()
            err = _unwrapped(sys.stderr)
            _route_streams()
            _fd_to_stderr()
            _open.append(typing.cast(TextIO, _Shown(err, _terminal(err))))
        else:
            _open.append(_open[0])
    try:
        yield
    finally:
        with _redirect:
            shown = _open.pop()
            if not _open:
                for stream in (shown, _unwrapped(sys.stdout), sys.__stdout__):  # what other threads (one a tool
                    with contextlib.suppress(Exception):  # started) wrote on stdout meanwhile: onto descriptor 1 now
                        stream.flush()  # type: ignore[union-attr]
                _fd_restore()
                if not any(t.is_alive() for t in list(_abandoned)):
                    _unroute_streams()


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """This thread's print()s (sys.stdout, sys.stderr) shown on stderr as a result is (on a terminal, its control
    characters escaped: a `print("\\x1b]52;...")` cannot write the clipboard or retitle the window), as a
    --functions file loads; and descriptor 1 is stderr's meanwhile (tools_running)."""
    with tools_running():
        token = _route.set(_open[-1])
        try:
            yield
        finally:
            _route.reset(token)


def printing_to_stderr(target: Callable[[], None]) -> Callable[[], None]:
    """`target` as a tool call's own thread runs it (made inside tools_running): what its Python code prints is
    shown as stdout_to_stderr's is; the threads it starts itself print as before (as the programs it starts do)."""
    shown = _open[-1]

    def run() -> None:
        _route.set(shown)  # (a thread's context is its own: nothing else sees this)
        target()

    return run


def _fd_to_stderr() -> None:
    """Descriptor 1 onto descriptor 2, the old one kept aside (nothing when either is closed)."""
    try:
        saved = os.dup(1)
    except OSError:
        return
    try:
        os.dup2(2, 1)
    except OSError:
        os.close(saved)
        return
    _fd_saved.append(saved)


def _fd_restore() -> None:
    """Descriptor 1 back as it was before the tools ran."""
    if _fd_saved:
        saved = _fd_saved.pop()
        os.dup2(saved, 1)
        os.close(saved)


def load(path: Path) -> list[tuple[ToolSpec, Callable[..., Any]]]:
    """The file's public functions as tools, but lambdas (a ToolError when the file cannot be loaded or has
    none)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"localgen_functions_{abs(hash(str(path)))}", path)
    if spec is None or spec.loader is None:
        raise ToolError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # where pydantic resolves the module's own annotations (`from __future__`)
    try:
        with stdout_to_stderr():  # what the module prints as it loads
            spec.loader.exec_module(module)
    except SyntaxError as e:
        raise ToolError(f"{path}:{e.lineno}: {e.msg}") from None
    except (Exception, SystemExit) as e:  # the user's module ran and failed (or called sys.exit): one line
        raise ToolError(f"loading {path} failed: {type(e).__name__}: {e}") from None
    found = [(name, fn) for name, fn in vars(module).items()  # a lambda has no name of its own to call it by
             if inspect.isfunction(fn) and fn.__module__ == module.__name__ and not name.startswith("_")
             and fn.__name__ != "<lambda>"]
    if not found:
        raise ToolError(f"{path} defines no public functions to use as tools")
    return [(describe(fn, path), fn) for _, fn in found]


def describe(fn: Callable[..., Any], where: Path | str = "") -> ToolSpec:
    """A function's tool: name, first docstring paragraph, and a schema from its parameters."""
    name = fn.__name__
    if not set(name) <= NAME_CHARS:
        raise ToolError(f"{where}: {name} is not a usable tool name")
    try:
        hints = typing.get_type_hints(fn, include_extras=True)  # Annotated's constraints (Field(pattern=...)) kept
    except Exception as e:  # an annotation that does not resolve
        raise ToolError(f"{where}: the type hints of {name} do not resolve: {e}") from None
    doc = inspect.getdoc(fn) or ""
    props: dict[str, Any] = {}
    required: list[str] = []
    defs: dict[str, Any] = {}
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        schema = _schema(hints.get(p.name, str), defs)
        note = _param_doc(doc, p.name)
        if note:
            schema["description"] = note
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
        else:
            default = _json_default(p.default)
            if default is not _NO_JSON:  # a default JSON has no word for is left out, not said to be null
                schema["default"] = default
        props[p.name] = schema
    params: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        params["required"] = required
    if defs:
        params["$defs"] = defs
    return ToolSpec(name, doc.split("\n\n")[0].strip(), params)


def call_args(fn: Callable[..., Any], args: dict[str, Any]) -> dict[str, Any]:
    """The model's JSON arguments as the function takes them: a pydantic model, dataclass, enum (...)
    parameter gets its instance, built by pydantic; a ToolError says which argument does not fit."""
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:  # described already, so they resolved then
        return args
    out = dict(args)
    for key, value in args.items():
        hint = hints.get(key)
        if hint is None or not _needs_pydantic(hint):
            continue
        from pydantic import TypeAdapter, ValidationError

        try:
            adapter: TypeAdapter[Any] = TypeAdapter(hint)
        except Exception:  # a class pydantic cannot build (described as a string): the value as it came
            continue
        try:
            out[key] = adapter.validate_python(value)
        except ValidationError as e:
            first = e.errors()[0] if e.errors() else {"msg": str(e)}
            raise ToolError(f"{fn.__name__}: argument {key} does not fit its type: {first['msg']}") from None
    return out


def positional(fn: Callable[..., Any], args: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """The arguments as the function is called with them: its positional-only parameters (`def f(a, /, b)`) by
    position, in order (one left out before another given takes its default), the rest by name."""
    try:
        only = [p for p in inspect.signature(fn).parameters.values() if p.kind == p.POSITIONAL_ONLY]
    except (TypeError, ValueError):  # described already, so it has one
        return [], args
    rest, given = dict(args), []
    for i, p in enumerate(only):
        if p.name in rest:
            given.append(rest.pop(p.name))
        elif p.default is not inspect.Parameter.empty and any(q.name in rest for q in only[i + 1:]):
            given.append(p.default)
        else:
            break
    return given, rest


_NO_JSON = object()


def _json_default(v: Any) -> Any:
    """A parameter's default as JSON: as it is, or its JSON form where pydantic has one (a date's ISO text, an
    enum's value, a set's list), the same that a model's argument is read back from; else _NO_JSON."""
    try:
        json.dumps(v, allow_nan=False)  # (inf and NaN are no JSON: GET /tools would be a 500)
        return v
    except (TypeError, ValueError):
        pass
    from pydantic_core import to_jsonable_python

    try:
        out = to_jsonable_python(v)
        json.dumps(out, allow_nan=False)
        return out
    except Exception:  # an object pydantic has no JSON for (or inf, NaN)
        return _NO_JSON


def _schema(hint: Any, defs: dict[str, Any]) -> dict[str, Any]:
    """A parameter's JSON Schema: plain types here, anything else (pydantic models, dataclasses, enums,
    TypedDicts) from pydantic, whose `$defs` go to the tool's own (`defs`), where its `$ref`s point."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in _SIMPLE:
        return {"type": _SIMPLE[hint]}
    if hint is typing.Any:
        return {}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin is typing.Annotated:  # Field(pattern=..., min_length=..., ge=..., description=...), annotated-types'
        schema = _from_pydantic(hint, defs)  # constraints: pydantic writes them (and call_args checks them)
        return _schema(args[0], defs) if schema is None else schema  # else its type's, as without the annotation
    if origin in (typing.Union, types.UnionType):
        kinds = [a for a in args if a is not type(None)]
        nulls = [{"type": "null"}] if len(kinds) < len(args) else []  # `int | None` takes null, as pydantic says
        if len(kinds) == 1 and not nulls:
            return _schema(kinds[0], defs)
        return {"anyOf": [*(_schema(a, defs) for a in kinds), *nulls]}
    if origin in (list, tuple, set, frozenset):
        return {"type": "array", **({"items": _schema(args[0], defs)} if args else {})}
    if origin is dict:
        return {"type": "object"}
    if _needs_pydantic(hint):
        schema = _from_pydantic(hint, defs)
        return {"type": "string"} if schema is None else schema  # one pydantic cannot describe: as before it was asked
    return {"type": "string"}


def _from_pydantic(hint: Any, defs: dict[str, Any]) -> dict[str, Any] | None:
    """pydantic's JSON Schema of `hint` (its `$defs` moved to `defs`); None where pydantic cannot describe it. A
    string pattern a grammar cannot hold (not anchored with ^ and $, \\b, lookaround: pydantic searches with it) is
    left out of the schema: the grammar then admits any string there, and call_args still checks the pattern."""
    from pydantic import TypeAdapter

    try:
        schema = dict(TypeAdapter(hint).json_schema(ref_template="#/$defs/{model}"))
    except Exception:
        return None
    found = schema.pop("$defs", {})
    _grammar_patterns(schema)
    _grammar_patterns(found)
    defs.update(found)
    return schema


def _grammar_patterns(node: Any) -> None:
    """Drops, in place, each `pattern` of a schema that the engine cannot turn into a grammar."""
    from localgen.engine.grammar import grammar_from_json_schema
    from localgen.errors import GrammarError

    if isinstance(node, list):
        for item in node:
            _grammar_patterns(item)
    elif isinstance(node, dict):
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            try:
                grammar_from_json_schema(json.dumps({"type": "string", "pattern": pattern}))
            except GrammarError:
                del node["pattern"]
        for key, value in node.items():
            if key not in ("pattern", "const", "default", "enum", "examples"):
                _grammar_patterns(value)


def _needs_pydantic(hint: Any) -> bool:
    """Whether a type, or one inside it (list[Model]), is a class JSON has no word for, or is `Annotated` (its
    constraints, `Field(pattern=..., ge=...)`, are pydantic's to write and check)."""
    if typing.get_origin(hint) is typing.Annotated:
        return True
    if isinstance(hint, type):
        return hint not in _SIMPLE and hint is not type(None)
    return any(_needs_pydantic(a) for a in typing.get_args(hint) if typing.get_origin(hint) is not typing.Literal)


def _param_doc(doc: str, name: str) -> str:
    """A parameter's description from `:param name: ...` or a Google-style `name: ...` line."""
    for line in doc.splitlines():
        s = line.strip()
        for head in (f":param {name}:", f"{name}:", f"{name} ("):
            if s.startswith(head):
                rest = s[len(head):]
                return rest.split(":", 1)[1].strip() if head.endswith("(") and ":" in rest else rest.strip()
    return ""
