"""The bindings' ctypes layer, imported once and lightly (our log callback and abort handler installed);
the libggml llama.cpp maps; one output row's logits as a numpy view."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from localgen.errors import LocalgenError
from localgen.native import logs

_lib: Any = None
_numa_done = False


def lib() -> Any:
    """The bindings' ctypes layer, imported once: our log callback installed and llama.cpp's backends
    initialized."""
    global _lib
    if _lib is None:
        llama_cpp = _import_ctypes_layer()
        logs.install(llama_cpp)
        _install_abort_handler()
        llama_cpp.llama_backend_init()
        _lib = llama_cpp
    return _lib


_abort_cb: Any = None  # the ctypes thunk; kept referenced
# how the abort line is written (serve --log-format json sets a JSON line's maker: every line it writes is one)
_abort_line: Callable[[str, str | None], str] | None = None


def abort_line(make: Callable[[str, str | None], str] | None) -> None:
    """Write llama.cpp's abort as `make(message, hint)` makes it (None: the CLI's plain error line)."""
    global _abort_line
    _abort_line = make


_libggml: Any = None
_on_abort: set[str] = set()  # files being written that an abort removes (a quantization's temp file)


def remove_on_abort(path: str | os.PathLike[str]) -> None:
    """Have the abort handler remove `path` if llama.cpp aborts while it is written."""
    _on_abort.add(os.fspath(path))


def forget_on_abort(path: str | os.PathLike[str]) -> None:
    """`path` is no longer the abort handler's to remove."""
    _on_abort.discard(os.fspath(path))


_last_words: list[Callable[[], None]] = []  # what the running commands say before an abort ends the process
_said = threading.Lock()  # held by the one exit that says them (an abort, or a second Ctrl-C's watcher)
_rpc_used: list[bool] = []  # an RPC server is being added or was (native/devices.py): an abort may be one gone


def rpc_added() -> None:
    """An RPC server is being added (--rpc): llama.cpp's `Failed to connect` aborts are then one gone away."""
    _rpc_used[:] = [True]


@contextlib.contextmanager
def last_words(say: Callable[[], None]) -> Iterator[None]:
    """While the block runs, `say()` runs when llama.cpp aborts the process (or a second Ctrl-C ends a call stuck
    inside it), before the one-line error: a command's last words (bench: the rows it measured, and where they
    are kept). What it raises is dropped; stdout is flushed after it."""
    _last_words.append(say)
    try:
        yield
    finally:
        _last_words.remove(say)


def _say_last_words() -> None:
    """The last words, said once whichever exit comes first (a Ctrl-C pressed meanwhile cannot cut the exit's own
    line short)."""
    import sys

    if not _said.acquire(blocking=False):
        return
    for say in reversed(list(_last_words)):
        with contextlib.suppress(BaseException):
            say()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


_stuck: list[Any] = []  # exit_when_stuck's pending-call thunk, once it watches (kept referenced)


def exit_when_stuck() -> None:
    """Make a second Ctrl-C end the process (`interrupted` on stderr, exit 130) when the main thread has run no
    Python since the first: it is inside a llama.cpp call that does not return (an RPC server gone silent mid-load
    or mid-answer: llama.cpp waits for its answer for ever), where Python's own handler cannot run. A thread reads
    the presses (signal.set_wakeup_fd) and asks the main thread to answer each (Py_AddPendingCall, which only
    it runs). Once per process, from the main thread only; nothing where another part has the wakeup descriptor."""
    import ctypes
    import signal
    import threading

    if _stuck or threading.current_thread() is not threading.main_thread():
        return
    read, write = os.pipe()
    try:
        os.set_blocking(write, False)  # (not on Windows before Python 3.12: no watch there)
        before = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except (ValueError, AttributeError, OSError):
        before = -2
    if before != -1:  # another part's (an event loop's): left to it
        if before >= 0:
            signal.set_wakeup_fd(before)
        os.close(read)
        os.close(write)
        return
    presses = [0, 0]  # Ctrl-C seen by the thread, and the last one the main thread answered

    def answered(n: int | None) -> int:
        presses[1] = max(presses[1], n or 0)
        return 0

    thunk = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(answered)
    add = ctypes.pythonapi.Py_AddPendingCall
    add.argtypes, add.restype = [ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int
    stopped: list[bool] = []
    _stuck.extend((thunk, write, stopped))

    def watch() -> None:
        while True:
            try:
                data = os.read(read, 64)
            except OSError:
                return
            if not data or stopped:  # stop_watching(): the command is over
                os.close(read)
                return
            for signum in data:
                if signum != signal.SIGINT:
                    continue
                if presses[1] < presses[0]:  # the last press is still unanswered: the main thread is stuck
                    _exit_interrupted()
                presses[0] += 1
                add(ctypes.cast(thunk, ctypes.c_void_p), presses[0])

    threading.Thread(target=watch, name="localgen-stuck-watch", daemon=True).start()


def stop_watching() -> None:
    """The end of exit_when_stuck's watch, as the command ends (a process that goes on, such as a test's, keeps
    no watcher that a later Ctrl-C would end it by). From the main thread."""
    import signal

    if not _stuck:
        return
    _, write, stopped = _stuck
    stopped.append(True)
    with contextlib.suppress(ValueError):
        current = signal.set_wakeup_fd(-1)
        if current not in (-1, write):  # another part's since: given back to it
            signal.set_wakeup_fd(current)
    with contextlib.suppress(OSError):
        os.close(write)  # the thread reads the end and stops
    _stuck.clear()


def _exit_interrupted() -> None:
    """`interrupted` and exit 130 at once, the files an abort would remove removed (see exit_when_stuck)."""
    import contextlib

    for path in list(_on_abort):
        with contextlib.suppress(OSError):
            os.unlink(path)
    _say_last_words()
    with contextlib.suppress(OSError):
        os.write(2, b"\ninterrupted\n" if os.isatty(2) else b"interrupted\n")
    os._exit(130)


def libggml() -> Any:
    """The ggml library llama.cpp itself uses. A wheel cannot hold symlinks, so it carries libggml.so and
    libggml.so.0 as two files: loading the other one (as the bindings' _ggml module does) would give a second
    device registry that llama.cpp never sees."""
    import ctypes
    import os

    global _libggml
    if _libggml is None:
        lc = _lib if _lib is not None else _import_ctypes_layer()
        libdir = os.path.join(os.path.dirname(lc.__file__ or ""), "lib")
        mapped = _mapped("libggml.")
        names = ([mapped] if mapped else []) + [os.path.join(libdir, n) for n in (
            "libggml.so.0", "libggml.0.dylib", "libggml.so", "libggml.dylib", "ggml.dll")]
        path = next((n for n in names if os.path.exists(n)), None)
        if path is None:
            raise OSError("libggml not found beside the bindings")
        _libggml = ctypes.CDLL(path)
    return _libggml


def _mapped(prefix: str) -> str | None:
    """The path of a shared library this process has mapped whose file name starts with `prefix` (Linux)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rsplit(None, 1)[-1]
                if "/" in path and path.rsplit("/", 1)[-1].startswith(prefix) and ".so" in path:
                    return path
    except OSError:
        pass
    return None


def _install_abort_handler() -> None:
    """When llama.cpp meets a state it cannot go on from (GGML_ABORT: a GPU with no memory for its own
    context, an RPC server that went away mid-generation), it aborts the process with a C backtrace. localgen
    cannot continue either, but says so in one line and exits 1."""
    import contextlib
    import ctypes
    import sys

    global _abort_cb
    try:
        setter = libggml().ggml_set_abort_callback
    except (AttributeError, OSError):
        return
    callback_type = ctypes.CFUNCTYPE(None, ctypes.c_char_p)

    def on_abort(message: bytes | None) -> None:
        text = (message or b"").decode("utf-8", errors="replace").strip()
        why = text.split(": ", 1)[-1] if ": " in text else text
        hint = None
        rpc = "an RPC server went away or failed: a generation cannot go on without it; run again"
        if "RPC" in text:
            hint = rpc
        elif "CUDA" in text or "out of memory" in text.lower():
            hint = "the GPU ran out of memory: try fewer --gpu-layers, a smaller --ctx, or free GPU memory"
        elif _rpc_used and "failed to connect" in text.lower():  # a server killed during the load
            hint = rpc
        try:
            for path in list(_on_abort):
                with contextlib.suppress(OSError):
                    os.unlink(path)
            _say_last_words()
            if _abort_line is not None:
                sys.stderr.write(_abort_line(f"llama.cpp stopped: {why}", hint) + "\n")
            else:
                sys.stderr.write(f"localgen: error: llama.cpp stopped: {why}{f' ({hint})' if hint else ''}\n")
            sys.stderr.flush()
        finally:
            os._exit(1)

    _abort_cb = callback_type(on_abort)
    setter.argtypes = [callback_type]
    setter.restype = callback_type
    setter(_abort_cb)


def _import_ctypes_layer() -> Any:
    """`llama_cpp` with its ctypes declarations, without the package's heavy __init__ (localgen/_compat.py)."""
    from localgen._compat import llama_cpp_ctypes_layer

    return llama_cpp_ctypes_layer()


def ready() -> None:
    """The bindings imported and llama.cpp's backends initialized, once (what lib() does first)."""
    lib()


def version() -> str:
    """The bindings' version (llama-cpp-python's)."""
    return str(lib().__version__)


def build_id() -> str:
    """This llama.cpp build as a saved state depends on it: the bindings' version and the library file's size
    and time (a rebuild of the same version, with other backends or options, is another build)."""
    import os

    path = getattr(lib()._lib, "_name", "") or ""
    try:
        st = os.stat(path)
        stamp = f"{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        stamp = "?"
    return f"{version()}|{os.path.basename(path)}|{stamp}"


def system_info() -> str:
    """What llama.cpp says it was built with and uses on this machine (llama_print_system_info)."""
    return str(lib().llama_print_system_info().decode("utf-8", errors="replace").strip())


def init_numa(strategy: int) -> None:
    """llama.cpp's NUMA strategy, set once per process before the first load."""
    global _numa_done
    if not _numa_done:
        lib().llama_numa_init(strategy)
        _numa_done = True


_logits_ith: Any = None  # llama_get_logits_ith returning the address as an int (the bindings' gives a pointer)
_views: dict[tuple[int, int], Any] = {}  # (address, n_vocab) → a numpy view of the floats there
_MAX_VIEWS = 4096


def logits_row(ctx: Any, row: int, n_vocab: int) -> Any:
    """A numpy view of one output row's logits of the last decode (-1: the last row); valid until the next.

    A view only points at memory (it owns nothing), so one made for an address serves every later row that
    llama.cpp places there: making a view is not free (docs/benchmarks.md, `localgen serve` against
    llama-server), a serving step's pick makes one or more per token, and the rows sit at a few addresses,
    reused from step to step."""
    global _logits_ith
    if _logits_ith is None:
        import ctypes

        from localgen._compat import bindings_function

        fn = bindings_function(lib(), "llama_get_logits_ith")  # a new object: the bindings' own keeps its restype
        fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_int32], ctypes.c_void_p
        _logits_ith = fn
    address = _logits_ith(ctx, row)
    if not address:
        raise LocalgenError(f"llama.cpp has no logits for output row {row}")
    key = (address, n_vocab)
    view = _views.get(key)
    if view is None:  # the imports only here: the per-token path is the lookup above
        import ctypes

        import numpy as np

        if len(_views) >= _MAX_VIEWS:  # buffers reallocated many times over: start afresh
            _views.clear()
        view = np.ctypeslib.as_array(ctypes.cast(address, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,))
        _views[key] = view
    return view
