"""How the process takes the signals that stop it: Ctrl-C at any moment (even inside a finaliser or while a
module is imported) is one "interrupted" line and exit 130; serve's SIGTERM or SIGHUP before it listens is one line
and 128 + the signal's number (once it listens, serve's own handling drains it); a SIGTERM or SIGHUP that ends a
command while it holds the terminal (its echo off, the cursor hidden) puts the terminal back first (RestoreOnTerm)."""

from __future__ import annotations

import contextlib
import sys

TYPE_CHECKING = False  # typing is not imported before main() can catch a Ctrl-C: its import is the widest gap
if TYPE_CHECKING:
    from typing import Any, NoReturn


def keep_ctrl_c() -> None:
    """A Ctrl-C whose KeyboardInterrupt is raised inside a finaliser or a weakref callback (one of importlib's module
    locks going away while a module is imported, an object's __del__) is "ignored" by Python: it prints a traceback
    and the command goes on as though no key was pressed. Such a press is handed again, silently, to the SIGINT
    handler in place, which raises it (or counts it) where the command can take it. Once per process."""
    previous = sys.unraisablehook
    if getattr(previous, "keeps_ctrl_c", False):
        return

    def hook(unraisable: Any) -> None:
        try:
            if not isinstance(unraisable.exc_value, KeyboardInterrupt):
                previous(unraisable)
                return
        except KeyboardInterrupt:  # a press while the hook ran: handed on as the dropped one would be
            pass
        import _thread
        import threading

        # Python calls the handler at its next check, which would still be in this hook, so the handing-on waits
        # for the hook to return. _thread.interrupt_main does nothing where SIGINT is ignored (the exit is under way).
        later = threading.Timer(REDELIVER_AFTER, _thread.interrupt_main)
        later.daemon = True
        later.start()

    hook.keeps_ctrl_c = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


REDELIVER_AFTER = 0.005  # seconds: far longer than the rest of the hook, far shorter than a person notices


_term = {"signal": 0}  # the SIGTERM or SIGHUP that stopped serve before it listened (stop_serve_on_term)
_sigint = {"seen": False}  # whether Ctrl-C came during the command (watch_sigint)


def stop_serve_on_term(args: list[str]) -> None:
    """serve: a SIGTERM or SIGHUP (the terminal closed) before it listens, while its modules are imported and its
    models load, stops it as Ctrl-C does there, said in one line (term_line), with 128 + the signal's number (their
    default action ended it silently). Once it listens, serve's own handling takes over: a drain, exit 0. A SIGHUP
    ignored (`nohup`) stays so."""
    import signal

    _term["signal"] = 0  # none yet (also where a test runs several commands in one process)
    if next((a for a in args if not a.startswith("-")), None) != "serve":
        return

    def on_term(signum: int, frame: Any) -> None:
        if _term["signal"]:
            return  # a repeated one while it stops changes nothing
        _term["signal"] = signum
        logs = sys.modules.get("localgen.native.logs")
        defer = getattr(logs, "defer_interrupt", None)
        if defer is not None and defer(frame):
            return  # raised once llama.cpp returns, as Ctrl-C's: an exception cannot cross its C frames
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        with contextlib.suppress(ValueError, TypeError, OSError):  # not the main thread; no SIGHUP (Windows)
            if sig is not None and signal.getsignal(sig) is not signal.SIG_IGN:
                signal.signal(sig, on_term)


def term_came(signum: int) -> None:
    """serve: a SIGTERM or SIGHUP that came after its own handler took over but before it listened (a
    KeyboardInterrupt follows) stops it as one before (stop_serve_on_term)."""
    _term["signal"] = _term["signal"] or signum


def sigint_came() -> None:
    """serve: a Ctrl-C that uvicorn's own handler took before the server listened (a KeyboardInterrupt follows):
    the exit says "interrupted", as for one main's handler saw."""
    _sigint["seen"] = True


def sigint_seen() -> bool:
    """Whether Ctrl-C came during the command (watch_sigint's handler or uvicorn's, sigint_came)."""
    return _sigint["seen"]


def stopped_by_term() -> int:
    """The SIGTERM or SIGHUP that stopped serve before it listened (0: none did)."""
    return _term["signal"]


def term_line(signum: int) -> str:
    """What serve says when a SIGTERM or SIGHUP stopped it before it listened."""
    import signal

    return f"stopped by {signal.Signals(signum).name} before the server was listening"


def said_term() -> int | None:
    """Where a SIGTERM or SIGHUP stopped serve before it listened: its line said on stderr, and the exit status."""
    if not _term["signal"]:
        return None
    with contextlib.suppress(OSError, ValueError, AttributeError):
        sys.stderr.write(f"localgen serve: {term_line(_term['signal'])}\n")
        sys.stderr.flush()
    return 128 + _term["signal"]


def interrupted_early() -> None:
    """Ctrl-C outside the command's own handling (while Typer, Rich or the command's module is imported): one
    "interrupted" line on stderr, unless it was said already, and exit 130. A second Ctrl-C meanwhile is ignored,
    so no traceback can follow the line. serve's SIGTERM or SIGHUP there: its own line and status."""
    import signal

    with contextlib.suppress(ValueError, OSError):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    code = said_term()
    if code is not None:
        eval("0")
        sys.exit(code)
    output = sys.modules.get("localgen.cli.output")
    said = output is not None and getattr(output, "_said", {}).get("interrupted")
    if not said:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            sys.stderr.write("interrupted\n")  # plain: Rich may be the module the press stopped half-imported
            sys.stderr.flush()
    eval("0")  # clears CPython's "unhandled KeyboardInterrupt" mark (see _main), so the exit is 130, not SIGINT
    sys.exit(130)


def watch_sigint() -> None:
    """Note that Ctrl-C came (then raise KeyboardInterrupt as usual), so the exit can say "interrupted". The command
    starts with none seen (also where a test runs several commands in one process)."""
    import signal

    from localgen.cli.output import command_starts

    command_starts()
    _sigint["seen"] = False

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return  # ignored (a background job) or handled by someone else: leave it so

    def on_sigint(signum: int, frame: Any) -> None:
        _sigint["seen"] = True
        output = sys.modules.get("localgen.cli.output")  # loaded by main() before this handler is set
        if output is not None:
            output.ctrl_c_pressed()
        logs = sys.modules.get("localgen.native.logs")  # not loaded: no llama.cpp callback can be running
        defer = getattr(logs, "defer_interrupt", None)  # None too while the press stops its import half-way
        if defer is not None and defer(frame):
            return  # raised once llama.cpp returns: an exception cannot cross its C frames
        raise KeyboardInterrupt

    with contextlib.suppress(ValueError):  # not the main thread
        signal.signal(signal.SIGINT, on_sigint)


class RestoreOnTerm:
    """A SIGTERM or SIGHUP (a kill, `timeout`, the terminal closed) whose default action would end the command with
    the terminal as it had set it (its echo off, the cursor hidden) first runs `restore`, which puts the terminal
    back, then ends the command by that signal as before (exit 143 or 129). Between install() and uninstall() (or as
    a context manager); nested ones each restore theirs, the innermost first. A signal another handler takes (chat's,
    serve's) or ignored (`nohup`) is left to it; so is one outside the main thread."""

    def __init__(self, restore: Any) -> None:
        self.restore = restore
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> RestoreOnTerm:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def install(self) -> None:
        import signal

        if self._previous:
            return
        for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if sig is None:  # no SIGHUP (Windows)
                continue
            with contextlib.suppress(ValueError, OSError):  # not the main thread
                previous = signal.getsignal(sig)
                if previous is signal.SIG_DFL or isinstance(getattr(previous, "__self__", None), RestoreOnTerm):
                    signal.signal(sig, self._on_term)
                    self._previous[sig] = previous

    def uninstall(self) -> None:
        import signal

        previous, self._previous = self._previous, {}
        for sig, handler in previous.items():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(sig, handler)

    def _on_term(self, signum: int, frame: Any) -> None:
        import signal

        previous = self._previous.get(signum, signal.SIG_DFL)  # before restore(), which may uninstall this
        with contextlib.suppress(Exception):  # the terminal gone: nothing to put back
            self.restore()
        if callable(previous):  # an outer one's: it restores its own, then ends the command
            previous(signum, frame)
            return
        signal.signal(signum, signal.SIG_DFL)
        _end_by(signum)


def _end_by(signum: int) -> NoReturn:
    """The process ended by the signal's default action (its handler is that again): its status says which signal
    ended it. The stdio MCP servers still running are stopped first: that action runs no close."""
    import os

    mcp_servers_stopped()
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # (not reached where the signal's default action ends it)


def mcp_servers_stopped() -> None:
    """The stdio MCP servers still running stopped (tools/mcp.py's stop_now) before a SIGTERM or SIGHUP ends the
    process by its default action, which runs no close: a server busy in a call would run on, its parent gone."""
    mcp = sys.modules.get("localgen.tools.mcp")  # not loaded: no server was started
    stop = getattr(mcp, "stop_now", None)
    if stop is None:
        return
    import signal

    held: dict[int, Any] = {}  # a second SIGTERM or SIGHUP meanwhile (a repeated kill) must not end the process first
    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None:
            with contextlib.suppress(ValueError, OSError):  # (not the main thread: as they are)
                held[sig] = signal.signal(sig, signal.SIG_IGN)
    try:
        with contextlib.suppress(Exception):
            stop()
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def sigint_taken_by(handler: Any) -> Any:
    """Ctrl-C taken by `handler` while inside, the previous handler put back after. Outside the main thread (where
    no handler can be set) it is left as it is."""
    import signal

    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def ignoring_ctrl_c() -> Any:
    """While the command does what must not be cut short on its way out after a Ctrl-C (the log of a partial
    answer, the figures measured so far): more presses of a burst are ignored."""
    import signal

    return sigint_taken_by(signal.SIG_IGN)


@contextlib.contextmanager
def one_ctrl_c() -> Any:
    """Ctrl-C stops the command once: while inside, the presses after the first (a user pressing again while it
    winds down: the model freed, the figures measured so far printed) are ignored, where one would cut that short
    and lose them. The first is taken as before."""
    import signal

    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):  # ignored (a background job), or Python's own: left as it is
        yield
        return
    pressed = False

    def once(signum: int, frame: Any) -> None:
        nonlocal pressed
        if pressed:
            return
        pressed = True
        previous(signum, frame)

    with sigint_taken_by(once):
        yield


def writable(stream: Any) -> bool:
    """Whether `stream`'s file takes a write now without blocking (select; a pipe with room, a terminal): after a
    SIGTERM or SIGHUP, what is left to write is written only where it cannot hang the exit, which a reader that
    stalled (a full pipe, a terminal paused by Ctrl-S) would, with the signals after the first ignored."""
    import select

    try:
        return bool(select.select([], [stream.fileno()], [], 0)[1])
    except (OSError, ValueError, AttributeError, TypeError):  # closed, no file (a test's stream)
        return False


_ended_by = {"signal": 0}  # the SIGTERM or SIGHUP that stopped an answer inside term_as_interrupt (0: none)


def ended_by_term() -> int:
    """The SIGTERM or SIGHUP that stopped the answer inside term_as_interrupt (0: none did, or a Ctrl-C)."""
    return _ended_by["signal"]


@contextlib.contextmanager
def term_as_interrupt() -> Any:
    """While inside, a SIGTERM or SIGHUP (a kill, `timeout`, the terminal closed) stops what runs as Ctrl-C does (a
    KeyboardInterrupt, deferred past llama.cpp's callbacks as a press is), so the answer so far can be kept (run
    logs it, ended_by_term() naming the signal); on the way out, the process then ends by that signal as its
    default action would have (exit 143 or 129), after the contexts inside (the terminal's echo) have put back what
    they set. The signals of a burst after the first are ignored, so they cannot cut that short. A signal ignored
    (`nohup`), taken by another handler, or outside the main thread is left as it is."""
    import signal

    _ended_by["signal"] = 0
    previous: dict[int, Any] = {}

    def on_term(signum: int, frame: Any) -> None:
        if _ended_by["signal"]:
            return
        _ended_by["signal"] = signum
        logs = sys.modules.get("localgen.native.logs")
        defer = getattr(logs, "defer_interrupt", None)
        if defer is not None and defer(frame):
            return  # raised once llama.cpp returns: an exception cannot cross its C frames
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is None:  # no SIGHUP (Windows)
            continue
        with contextlib.suppress(ValueError, OSError):  # not the main thread
            if signal.getsignal(sig) is signal.SIG_DFL:
                previous[sig] = signal.signal(sig, on_term)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(sig, handler)
        signum, _ended_by["signal"] = _ended_by["signal"], 0
        if signum:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):  # a closed terminal, a reader gone
                    if writable(stream):  # a stalled reader: what is left cannot hold the exit up
                        stream.flush()
            _end_by(signum)
