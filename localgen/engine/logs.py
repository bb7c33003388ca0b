"""Owns llama.cpp's log callback: lines go to a ring buffer (attached to load errors) and, with
--verbose, to stderr. Nothing from llama.cpp reaches the terminal otherwise."""

from __future__ import annotations

import collections
import ctypes
import sys
import threading
from typing import Any

# ggml's levels as this llama.cpp sends them (the bindings' comment lists an older order).
DEBUG, INFO, WARN, ERROR, CONT = 1, 2, 3, 4, 5

_ring: collections.deque[tuple[int, str]] = collections.deque(maxlen=1000)
_lock = threading.Lock()
_partial_level = INFO
_partial_text = ""
_echo = False
_callback: Any = None  # the ctypes thunk; kept referenced so it is not garbage-collected


def install(llama_cpp: Any) -> None:
    """Replace the bindings' callback with ours (idempotent)."""
    global _callback
    if _callback is not None:
        return

    def on_log(level: int, text: bytes, _user: Any) -> None:
        global _partial_level, _partial_text
        s = text.decode("utf-8", errors="replace")
        with _lock:
            if level == CONT:
                level = _partial_level
            _partial_level = level
            _partial_text += s
            while "\n" in _partial_text:
                line, _partial_text = _partial_text.split("\n", 1)
                if level == DEBUG:  # graph-building chatter; it would evict the lines that explain errors
                    continue
                _ring.append((level, line))
                if _echo:
                    print(f"llama.cpp: {line}", file=sys.stderr, flush=True)

    _callback = llama_cpp.llama_log_callback(on_log)
    llama_cpp.llama_log_set(_callback, ctypes.c_void_p(0))


def set_echo(on: bool) -> None:
    """With echo on (--verbose), every llama.cpp line is also written to stderr."""
    global _echo
    _echo = on


def lines(last: int = 40, min_level: int = 0) -> list[str]:
    """The last lines at or above a level (INFO, WARN, ERROR)."""
    with _lock:
        items = [line for lvl, line in _ring if lvl >= max(min_level, INFO)]
    return items[-last:]


def first_error() -> str | None:
    """The most telling recent error line (used as the reason a load failed)."""
    with _lock:
        errors = [line.strip() for lvl, line in _ring if lvl == ERROR and line.strip()]
    for line in errors:  # llama.cpp's first error names the cause; later ones say "failed to load"
        if "error loading model:" in line:
            return line.split("error loading model:", 1)[1].strip()
    return errors[0] if errors else None


def clear() -> None:
    """Forget buffered lines (before a load, so its error is the one reported)."""
    with _lock:
        _ring.clear()


def dump_to_stderr() -> None:
    """Write buffered lines (load output is hidden by fd redirection while it happens)."""
    with _lock:
        items = list(_ring)
    for _lvl, line in items:
        print(f"llama.cpp: {line}", file=sys.stderr)
