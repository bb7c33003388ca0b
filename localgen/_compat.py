"""Every place localgen reaches past a third-party library's public API, in one module.

Each entry names the versions it was written for and what it relies on; tests/test_compat.py has a test per
entry that fails when the library changes under it (then the entry is fixed, or deleted if the library no
longer needs it). Nothing here runs at import: each library is imported by the function that patches it.

1. fast_typer_coercion    typer 0.29 (click vendored as typer._click): plain values coerced without pydantic.
2. flash_attn_argv        typer 0.29: `-fa` with an optional value, which its options cannot take.
3. llama_cpp_ctypes_layer llama-cpp-python 0.3.x (0.3.36): the ctypes layer without the package's __init__.
4. bindings_function      llama-cpp-python 0.3.x: a fresh ctypes function from the bindings' private CDLL.
5. sqlite_utils_module    sqlite-utils 3.x-4.2: its import without pandas.
6. httpx_transport        httpx 0.28 / httpcore 1.0: a transport whose pool uses our network backend.
7. schema_converter_class llama-cpp-python 0.3.x: the JSON-schema converter with its literals' backslashes escaped.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, get_args, get_origin

# --- 1. Typer's runtime coercion ----------------------------------------------------------------------------
# Written for typer 0.29.2. Typer builds a pydantic TypeAdapter for every parameter of a command on every call
# (`run` has over 70): with pydantic's import, most of a one-shot's start before any work. Values of the plain
# types localgen's options use (bool, str, int, float, Path and lists of them) are coerced here directly, with
# the same range and path checks; any other annotation keeps typer's own coercion. Relies on:
# typer._coercion.build_runtime_param(descriptor) (also bound by name in typer.core), RuntimeParam's
# dataclass fields (parameter_info, annotation) and its _coerce_value(value, param, ctx) hook, and the
# descriptor's annotation / parameter_info / file_annotation.

_TYPER_OWN = ("parser", "allow_dash")  # options set so keep typer's coercion (localgen sets none)
_TRUE = {"1", "true", "t", "yes", "y", "on"}
_FALSE = {"0", "false", "f", "no", "n", "off", ""}


def fast_typer_coercion() -> None:
    """Route typer's runtime coercion through `_fast` where it applies (idempotent)."""
    import typer.core
    from typer import _coercion

    original = _coercion.build_runtime_param
    if getattr(original, "_localgen", False):
        return

    def build(descriptor: Any) -> Any:
        fast = _fast(descriptor, _coercion)
        return fast if fast is not None else original(descriptor)

    build._localgen = True  # type: ignore[attr-defined]
    _coercion.build_runtime_param = build
    setattr(typer.core, "build_runtime_param", build)  # noqa: B010 (typer.core imported the name itself)


def _fast(descriptor: Any, coercion: Any) -> Any:
    annotation = descriptor.annotation
    info = descriptor.parameter_info
    if descriptor.file_annotation is not None or any(getattr(info, k) for k in _TYPER_OWN):
        return None
    one = annotation
    if get_origin(annotation) is list:
        (one,) = get_args(annotation) or (None,)
    if one not in (bool, str, int, float, Path):
        return None
    if getattr(info, "path_type", None) not in (None, str) or (info.path_type is str and one is not Path):
        return None  # path_type=str on a Path: the text as typed, for a callback (cli/inputfile.py, input_path)

    class Fast(coercion.RuntimeParam):  # type: ignore[misc,name-defined]
        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            origin: Any = get_origin(self.annotation)
            if origin is list:
                items = value if isinstance(value, (list, tuple)) else [value]
                return [_one(one, self.parameter_info, v, param, ctx) for v in items]
            return _one(one, self.parameter_info, value, param, ctx)

    return Fast(parameter_info=info, annotation=annotation)


def _one(kind: type, info: Any, value: Any, param: Any, ctx: Any) -> Any:
    import typer

    def bad(message: str) -> Exception:
        return typer.BadParameter(message, ctx=ctx, param=param)

    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise bad(f"{value!r} is not a valid boolean.")
    if kind is str:
        if isinstance(value, bytes):
            return value.decode(errors="replace")
        return str(value)
    if kind is Path and getattr(info, "path_type", None) is str:
        return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    if kind is Path:
        return _path(Path(value) if not isinstance(value, Path) else value, info, bad)
    if kind is int:
        if isinstance(value, bool):
            raise bad(f"{value!r} is not a valid integer.")
        try:
            number: Any = value if isinstance(value, int) else int(str(value).strip())
        except ValueError:
            raise bad(f"{value!r} is not a valid integer.") from None
    else:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise bad(f"{value!r} is not a valid number.") from None
        if not math.isfinite(number):
            raise bad(f"{value!r} is not a finite number.")
    lo, hi = info.min, info.max
    if (lo is not None and number < lo) or (hi is not None and number > hi):
        if info.clamp:
            return kind(lo) if lo is not None and number < lo else kind(hi)
        left = "" if lo is None else f"{lo}<="
        right = "" if hi is None else f"<={hi}"
        raise bad(f"{value} is not in the range {left}x{right}.")
    return number


def _path(p: Path, info: Any, bad: Any) -> Path:
    label = str(p)
    if info.exists and not p.exists():
        raise bad(f"Path {label!r} does not exist.")
    if p.exists():
        if not info.dir_okay and p.is_dir():
            raise bad(f"Path {label!r} is a directory.")
        if not info.file_okay and not p.is_dir():
            raise bad(f"Path {label!r} is a file.")
        if info.readable and not os.access(p, os.R_OK):
            raise bad(f"Path {label!r} is not readable.")
        if info.writable and not os.access(p, os.W_OK):
            raise bad(f"Path {label!r} is not writable.")
    return p.resolve() if info.resolve_path else p


# --- 2. `-fa` with an optional value --------------------------------------------------------------------------
# Written for typer 0.29.2: an option takes exactly its values (its flag_value/is_flag are documented as "not
# fully functional"), and the parser takes the next word as the value whatever it is (`-fa -p x` would set
# flash attention to "-p"). llama.cpp's `-fa` is bare or takes on|off|auto, so the words are rewritten first.

FA_FLAGS = ("-fa", "--flash-attn")
FA_VALUES = frozenset({"on", "off", "auto", "1", "0", "true", "false", "enabled", "disabled"})
FA_COMMANDS = frozenset({"run", "chat", "serve", "fit"})


def _fa_typo(word: str) -> bool:
    """Whether a word after a bare -fa is a misspelt on|off|auto (`onn`, `offf`, `atuo`), not a prompt's word."""
    import difflib

    return word.isalpha() and 2 < len(word) <= 6 and bool(difflib.get_close_matches(word.lower(), ("on", "off", "auto"),
                                                                                      n=1, cutoff=0.75))


def flash_attn_argv(args: list[str]) -> list[str]:
    """`-fa`, `-fa on|off|auto` and `--flash-attn X` as one `--flash-attn=X` word (run, chat, serve, fit: not
    bench, whose -fa takes a list, as llama-bench's)."""
    first = next((a for a in args if not a.startswith("-")), None)
    if first not in FA_COMMANDS:
        return args
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            out += args[i:]
            break
        if a in FA_FLAGS:
            nxt = args[i + 1] if i + 1 < len(args) else None
            if nxt is not None and (nxt.lower() in FA_VALUES or _fa_typo(nxt)):  # a typo: the value's error, not
                out.append(f"--flash-attn={nxt}")  # a prompt ("give the prompt once", with -p)
                i += 2
                continue
            out.append("--flash-attn=on")
        elif a.startswith("-fa="):
            out.append("--flash-attn=" + a[4:])
        else:
            out.append(a)
        i += 1
    return out


# --- 3. The bindings' ctypes layer without their package __init__ ---------------------------------------------
# Written for llama-cpp-python 0.3.36 (the layout of 0.3.x): `llama_cpp/__init__.py` imports the high-level
# Llama class, its chat formats, jinja2 and numpy on every start, none of it needed to load a model;
# `llama_cpp/llama_cpp.py` holds the ctypes declarations and imports only the package's _ctypes_extensions.
# The package is stood in by a module with the declarations whose other attributes (Llama, LlamaGrammar,
# LlamaCache...) load the real high-level modules on first use.

_HIGH_LEVEL = ("llama_cpp.llama", "llama_cpp.llama_grammar", "llama_cpp.llama_cache")


def llama_cpp_ctypes_layer() -> Any:
    """`llama_cpp` as a stand-in holding `llama_cpp.llama_cpp`'s declarations (the real package if it is
    already imported)."""
    import importlib
    import importlib.util
    import sys
    import types

    from localgen.errors import LocalgenError

    if "llama_cpp" in sys.modules:  # already imported in full (by another library, or a test)
        return sys.modules["llama_cpp"]
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise LocalgenError("llama-cpp-python is not installed", hint="run scripts/install.sh")
    package = types.ModuleType("llama_cpp")
    package.__path__ = list(spec.submodule_search_locations)
    package.__file__ = spec.origin
    package.__spec__ = spec  # find_spec("llama_cpp") on the stand-in then answers as for the real package
    sys.modules["llama_cpp"] = package
    try:
        layer = importlib.import_module("llama_cpp.llama_cpp")
    except BaseException:
        del sys.modules["llama_cpp"]
        raise
    package.__dict__.update({k: v for k, v in vars(layer).items() if not k.startswith("__")})
    package.__dict__["__version__"] = bindings_version(spec.origin)

    def __getattr__(name: str) -> Any:  # Llama, LlamaGrammar, ...: from the high-level modules
        for module in _HIGH_LEVEL:
            found = vars(importlib.import_module(module))
            if name in found:
                return found[name]
        raise AttributeError(f"module 'llama_cpp' has no attribute {name!r}")

    package.__dict__["__getattr__"] = __getattr__
    return package


def bindings_version(init_py: str | None) -> str:
    """The bindings' __version__, read from their __init__.py's `__version__ = "..."` line (cheaper than
    importlib.metadata); the installed distribution's version where that line is missing."""
    import re

    try:
        with open(init_py or "", encoding="utf-8") as f:
            m = re.search(r"^__version__ = [\"']([^\"']+)", f.read(), re.M)
        if m:
            return m.group(1)
    except OSError:
        pass
    import importlib.metadata

    return importlib.metadata.version("llama-cpp-python")


# --- 4. A fresh function from the bindings' library ---------------------------------------------------------
# Written for llama-cpp-python 0.3.36: `llama_cpp.llama_cpp._lib` is the ctypes.CDLL of libllama, and
# indexing a CDLL makes a new function object each time. The bindings declare some functions with a restype
# that costs per call (llama_get_logits_ith returns POINTER(c_float)); a fresh object takes other argtypes
# and restype without changing theirs.


def bindings_function(lc: Any, name: str) -> Any:
    """A new ctypes function object for libllama's `name` (set its argtypes and restype yourself)."""
    return lc._lib[name]


# --- 5. sqlite-utils without pandas -------------------------------------------------------------------------
# Written for sqlite-utils 4.2.1 (and 3.x): sqlite_utils.db imports pandas (and so pyarrow) at import time
# when installed, under `except ImportError`, only to map pandas.Timestamp, which localgen never stores. That
# slows every start in a data-science venv, and on a CUDA machine pyarrow's import after llama.cpp's libraries
# aborted the process (free(): invalid pointer, H100 image of 2026-11-23). A None in sys.modules makes that
# import raise ImportError while sqlite_utils loads.


def sqlite_utils_module() -> Any:
    """sqlite_utils, imported without pandas (as it is if sqlite_utils or pandas is already imported)."""
    import sys

    if "sqlite_utils" in sys.modules or "pandas" in sys.modules:
        import sqlite_utils

        return sqlite_utils
    sys.modules["pandas"] = None  # type: ignore[assignment]  # `import pandas` raises ImportError meanwhile
    try:
        import sqlite_utils
    finally:
        del sys.modules["pandas"]
    return sqlite_utils


# --- 6. An httpx transport over our own network backend ---------------------------------------------------------
# Written for httpx 0.28.1 and httpcore 1.0.9: httpx.HTTPTransport takes no network backend, so its private
# `_pool` (an httpcore.ConnectionPool) is replaced by one built with ours and the same TLS context. fetch.py's
# backend checks each address it connects to (no private addresses for a server) and keeps a deadline.


def httpx_transport(ssl_context: Any, network_backend: Any) -> Any:
    """An httpx.HTTPTransport whose connections go through `network_backend` (an httpcore NetworkBackend)."""
    import httpcore
    import httpx

    transport = httpx.HTTPTransport(verify=ssl_context)
    transport._pool = httpcore.ConnectionPool(ssl_context=ssl_context, network_backend=network_backend)
    return transport


# --- 7. The JSON-schema converter's literals ---------------------------------------------------------------------
# Written for llama-cpp-python 0.3.36 (llama_cpp.llama_grammar.SchemaConverter, a copy of llama.cpp's
# json_schema_to_grammar.py): its _format_literal escapes `"`, CR and LF for GBNF but not the backslash, so a
# property name, const or enum value holding `"` or `\` (JSON-escaped as \" or \\) made a grammar that does not
# parse, and a "\t" in a const forced a raw tab. Relies on every literal of JSON text going through
# _format_literal(literal) -> '"..."' (property names, const, enum; not_literal's single characters).
_GBNF_ESCAPES = {"\\": "\\\\", '"': '\\"', "\r": "\\r", "\n": "\\n"}


def schema_converter_class() -> Any:
    """The bindings' SchemaConverter, its literals escaped as GBNF reads them."""
    from llama_cpp.llama_grammar import SchemaConverter

    class Converter(SchemaConverter):  # type: ignore[misc]
        def _format_literal(self, literal: str) -> str:
            return '"' + "".join(_GBNF_ESCAPES.get(c, c) for c in literal) + '"'

    return Converter
