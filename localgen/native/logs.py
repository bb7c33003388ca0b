"""Owns llama.cpp's log callback: lines go to a ring buffer (attached to load errors) and, with
--verbose, to stderr. Nothing from llama.cpp reaches the terminal otherwise."""

from __future__ import annotations

import collections
import ctypes
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# ggml's levels as this llama.cpp sends them (the bindings' comment lists an older order).
DEBUG, INFO, WARN, ERROR, CONT = 1, 2, 3, 4, 5

KEPT_DEBUG = b"buffer type overridden to"  # the one debug line kept: a tensor a placement pattern moved
_ring: collections.deque[tuple[int, str]] = collections.deque(maxlen=1000)
_lock = threading.Lock()
_partial_level = INFO
_partial_text = ""
_echo = False
_callback: Any = None  # the ctypes thunk; kept referenced so it is not garbage-collected
_deferred = False  # a Ctrl-C that arrived inside the callback, to raise after llama.cpp returns
_taken: list[str] | None = None  # every line while taken() is open, past the ring's 1,000
_unbroken = 0  # how many `unbroken` blocks are open: a Ctrl-C meanwhile is deferred to the end of the outermost


def _on_log(level: int, text: bytes, _user: Any) -> None:
    global _partial_level, _partial_text
    with _lock:
        if level == DEBUG and not _partial_text and text.endswith(b"\n") and KEPT_DEBUG not in text:
            _partial_level = DEBUG  # whole debug lines, dropped below anyway (CUDA logs one every decode)
            return
    s = text.decode("utf-8", errors="replace")
    with _lock:
        if level == CONT:
            level = _partial_level
        _partial_level = level
        _partial_text += s
        while "\n" in _partial_text:
            line, _partial_text = _partial_text.split("\n", 1)
            if level == DEBUG:  # graph-building chatter; it would evict the lines that explain errors
                if KEPT_DEBUG.decode() not in line:
                    continue
                level = INFO  # where a -ot pattern put a tensor: the load's record (native/report.py) reads it
            _ring.append((level, line))
            if _taken is not None and level >= INFO:
                _taken.append(line)
            if _echo:
                print(f"llama.cpp: {line}", file=sys.stderr, flush=True)


def install(llama_cpp: Any) -> None:
    """Replace the bindings' callback with ours (idempotent)."""
    global _callback
    if _callback is not None:
        return
    _callback = llama_cpp.llama_log_callback(_on_log)
    llama_cpp.llama_log_set(_callback, ctypes.c_void_p(0))


def abort_check(cancelled: Callable[[], bool]) -> Callable[[Any], bool]:
    """The function for llama.cpp's abort callback (native/context.set_abort), which it calls between the
    operations of a computation: stop when `cancelled()` says so, or when a Ctrl-C came inside the call (noted by
    defer_interrupt; raise_deferred raises it once llama.cpp has returned)."""

    def _on_abort(_data: Any) -> bool:
        return _deferred or bool(cancelled())

    return _on_abort


_ON_ABORT = abort_check(bool).__code__  # every abort check's code: a Ctrl-C landing there is deferred


def defer_interrupt(frame: Any) -> bool:
    """Whether a Ctrl-C handler is running inside llama.cpp's call back into Python (its log callback, or an
    abort check). On a GPU llama.cpp logs on every decode, so that is where Ctrl-C usually lands; with an abort
    check set, it lands there on the CPU too. An exception raised there cannot cross the C frames (ctypes prints
    and drops it) and the computation would run on. If so, the interrupt is noted instead: an abort check then
    stops the computation, and `raise_deferred` raises it once llama.cpp has returned. So it is inside an
    `unbroken` block, which raises it at its end."""
    global _deferred
    if _unbroken:
        _deferred = True
        return True
    while frame is not None:
        if frame.f_code is _on_log.__code__ or frame.f_code is _ON_ABORT:
            _deferred = True
            return True
        frame = frame.f_back
    return False


class _Unbroken:
    def __init__(self, raising: bool, only_new: bool = False) -> None:
        self.counted = threading.current_thread() is threading.main_thread()  # where Python runs SIGINT handlers
        self.raising = raising
        self.only_new = only_new  # raise only a press that came during the block, not one pending before it
        self.before = False

    def __enter__(self) -> None:
        global _unbroken
        if self.counted:
            _unbroken += 1
            self.before = _deferred

    def __exit__(self, *exc: object) -> None:
        global _unbroken
        if self.counted:
            _unbroken -= 1
            if not _unbroken and self.raising and not (self.only_new and self.before):
                raise_deferred()


def unbroken(raising: bool = True) -> _Unbroken:
    """A block a Ctrl-C cannot cut in two, for a native object freed and the reference to it cleared: a press
    handled once llama_free had returned raised KeyboardInterrupt between the two, and the object was freed again
    later (SIGSEGV). A press inside the block, under one of the CLI's SIGINT handlers (each asks defer_interrupt),
    is raised where the outermost block ends (not `raising`: it stays pending, for the next raise_deferred). Off the
    main thread, which never runs a SIGINT handler, it does nothing."""
    return _Unbroken(raising)


def finalising() -> _Unbroken:
    """`unbroken` for a finaliser (__del__) that frees a native object: a press that came while it freed is raised
    at its end (Python drops it from a finaliser, and keep_ctrl_c hands it on), but one pending before the collector
    ran is left to the code it ran inside, which raises it where it would have (one noted inside llama.cpp's abort
    check waits for the decode it stops)."""
    return _Unbroken(True, only_new=True)


def pending() -> bool:
    """Whether a Ctrl-C waits to be raised (it came inside a callback or an `unbroken` block)."""
    return _deferred


def raise_deferred() -> None:
    """Raise the KeyboardInterrupt a Ctrl-C inside a callback could not (called after each llama.cpp call)."""
    global _deferred
    if _deferred:
        _deferred = False
        raise KeyboardInterrupt


def set_echo(on: bool) -> None:
    """With echo on (--verbose), every llama.cpp line is also written to stderr."""
    global _echo
    _echo = on


def lines(last: int = 40, min_level: int = 0) -> list[str]:
    """The last lines at or above a level (INFO, WARN, ERROR)."""
    with _lock:
        items = [line for lvl, line in _ring if lvl >= max(min_level, INFO)]
    return items[-last:]


@contextmanager
def taken() -> Iterator[list[str]]:
    """Every line llama.cpp logs meanwhile (INFO and above), however many: a quantizer's dry run has one a tensor."""
    global _taken
    found: list[str] = []
    with _lock:
        _taken = found
    try:
        yield found
    finally:
        with _lock:
            _taken = None


def first_error() -> str | None:
    """The most telling recent error line (used as the reason a load failed)."""
    with _lock:
        errors = [line.strip() for lvl, line in _ring if lvl == ERROR and line.strip()]
    for line in errors:  # llama.cpp's first error names the cause; later ones say "failed to load"
        if "error loading model:" in line:
            reason = line.split("error loading model:", 1)[1].strip()
            if "failed to load model from" in reason and line is not errors[0]:  # the loader's own words only (a
                return _unprefixed(errors[0])  # damaged tensor info): the line that said why came first
            return reason
    return errors[0] if errors else None


def _unprefixed(line: str) -> str:
    """A llama.cpp line without the name of the function that logged it (`gguf_init_from_reader: tensor ...`)."""
    head, sep, rest = line.partition(": ")
    return rest if sep and head.isidentifier() else line


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
