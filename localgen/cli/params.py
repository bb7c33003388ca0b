"""Fast coercion of command-line values. Typer builds a pydantic TypeAdapter for every parameter of a
command on every call — `run` has over 70 — which cost a one-shot 0.19 s (pydantic's import included)
before any work. Values of the plain types localgen's options use (bool, str, int, float, Path and lists
of them) are coerced here directly, with the same range and path checks; any other annotation keeps
typer's own coercion."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, get_args, get_origin

_TRUE = {"1", "true", "t", "yes", "y", "on"}
_FALSE = {"0", "false", "f", "no", "n", "off", ""}


def install() -> None:
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
    if getattr(descriptor, "file_annotation", None) is not None or getattr(info, "parser", None) is not None:
        return None
    one = annotation
    if get_origin(annotation) is list:
        (one,) = get_args(annotation) or (None,)
    if one not in (bool, str, int, float, Path) or getattr(info, "click_type", None) is not None:
        return None

    class Fast(coercion.RuntimeParam):  # type: ignore[misc,name-defined]
        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            origin: Any = get_origin(self.annotation)
            if origin is list:
                items = value if isinstance(value, (list, tuple)) else [value]
                return [_one(one, self.parameter_info, v, param, ctx) for v in items]
            return _one(one, self.parameter_info, value, param, ctx)

    return Fast(parameter_info=info, annotation=annotation)


def _one(kind: type, info: Any, value: Any, param: Any, ctx: Any) -> Any:
    from typer._click.exceptions import BadParameter  # type: ignore[import-not-found]

    def bad(message: str) -> Exception:
        return BadParameter(message, ctx=ctx, param=param)  # type: ignore[no-any-return]

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
