"""Process entry point: runs the app and turns every expected failure into one line and an exit code."""

from __future__ import annotations

import contextlib
import errno
import os
import sys

from localgen.cli.signals import interrupted_early, keep_ctrl_c, stop_serve_on_term

TYPE_CHECKING = False  # typing is not imported before main() can catch a Ctrl-C: its import is the widest gap
if TYPE_CHECKING:
    from typing import Any

_WRITE_ERRNOS = {errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EEXIST, errno.EFBIG}  # only a write meets these
_USE_ERRNOS = {errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EISDIR}  # a read's as well as a write's


def llama_env_switches() -> None:
    """llama.cpp's LLAMA_ARG_* switches (LLAMA_ARG_CPU_MOE, LLAMA_ARG_KV_UNIFIED) take `enabled` and `disabled` too,
    which Click does not: say them as Click does (1, 0), for this process and what it starts."""
    from localgen.loadsettings import LOAD_KNOBS, SWITCH
    from localgen.settings import BOOL

    for k in LOAD_KNOBS.values():
        name = k.envvar or ""
        if k.kind in (BOOL, SWITCH) and name.startswith("LLAMA_ARG_") and os.environ.get(name) in ("enabled",
                                                                                                  "disabled"):
            os.environ[name] = "1" if os.environ[name] == "enabled" else "0"


OFF = ("", "0", "false", "off", "no", "disabled")


def switch_on(name: str) -> bool:
    """Whether the switch variable `name` is on: as the LLAMA_ARG_* switches, `0`, `false`, `off`, `no`,
    `disabled` (any case) or empty are off; anything else set is on."""
    return os.environ.get(name, "").strip().lower() not in OFF


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; errors become `localgen: error: ...` (plus a hint) on stderr, never a traceback. Ctrl-C at any
    moment, even while the command's modules are imported, is one "interrupted" line and exit 130."""
    made_blocking: list[int] = []
    try:
        keep_ctrl_c()
        stop_serve_on_term(sys.argv[1:] if argv is None else argv)
        made_blocking = blocking_stdio(sys.argv[1:] if argv is None else argv)
        closed_stdio_to_devnull()
        utf8_stdin()
        utf8_output()
        sizes_that_are_sizes()
        empty_home_as_unset()
        _main(argv)
    except KeyboardInterrupt:  # before _main's own handling was set up (an import), or after it had done
        interrupted_early()
    finally:
        native = sys.modules.get("localgen.native.lib")
        if native is not None:  # --rpc's watch for a main thread stuck in llama.cpp ends with the command
            native.stop_watching()
        nonblocking_again(made_blocking)


def blocking_stdio(args: list[str]) -> list[int]:
    """stdin, stdout and stderr inherited non-blocking (a Node.js tool or a CI runner that shares its pipes) made
    blocking for the command, and the descriptors so changed: a write past a full pipe was a BlockingIOError (the
    answer cut, exit 1) and a read before the data came read as empty (chat ended, run said "no prompt"). The
    flag belongs to a description the parent shares, so nonblocking_again() puts it back when the command ends.
    Not serve's: it only writes log lines, which it drops rather than wait on a reader that never comes."""
    if next((a for a in args if not a.startswith("-")), None) == "serve":
        return []
    changed = []
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError, ValueError):  # closed (`>&-`), or no such flag for it (Windows)
            if not os.get_blocking(fd):
                os.set_blocking(fd, True)
                changed.append(fd)
    return changed


def nonblocking_again(fds: list[int]) -> None:
    """The descriptors blocking_stdio() changed made non-blocking again, as the parent left them, once what
    this process wrote is out."""
    for stream in (sys.stdout, sys.stderr) if fds else ():
        with contextlib.suppress(Exception):  # a full disk, a closed pipe: the command has said so already
            stream.flush()  # type: ignore[union-attr]
    for fd in fds:
        with contextlib.suppress(OSError, ValueError):
            os.set_blocking(fd, False)


def closed_stdio_to_devnull() -> None:
    """A standard stream the shell closed (`<&-`, `>&-`, `2>&-`: Python then has None for it) is /dev/null: stdin
    reads nothing there, and what goes to stderr goes nowhere (a closed stderr would take every error message
    with it). stdout, which carries the answer, is /dev/null opened for reading: a command that writes nothing
    there runs, and one whose output would be lost fails at its first write, as into `> /dev/full`, with one error
    line and exit 1. Each keeps its descriptor taken, so no file opened later becomes fd 0, 1 or 2."""
    if sys.stdin is None:  # read as empty (`chat <&-` is a scripted chat with no message)
        sys.stdin = open(os.devnull)  # noqa: SIM115  # kept open for the process
    if sys.stdout is None:
        sys.stdout = open(os.open(os.devnull, os.O_RDONLY), "w")  # noqa: SIM115  # a write fails with EBADF
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115  # kept open for the process


def utf8_stdin() -> None:
    """stdin read as UTF-8 whatever the locale, a byte that is not UTF-8 kept as Python keeps it under C.UTF-8
    (surrogateescape): the prompt, message or --each-line line that holds it is refused saying which byte and where
    (text.problem), the other lines go on. Under a locale such as en_US.UTF-8 Python's stdin is strict, and the
    first such byte was a UnicodeDecodeError traceback that lost every line after it. Read as a file is (-f,
    --file): a byte order mark at its start dropped (utf-8-sig), CRLF and CR read as LF."""
    with contextlib.suppress(AttributeError, ValueError, OSError):  # not a text stream, or read from already
        sys.stdin.reconfigure(encoding="utf-8-sig", errors="surrogateescape", newline=None)  # type: ignore[union-attr]


MAX_SIZE = 10_000  # columns or lines no terminal has: Rich allocates by it (COLUMNS=99999999999 was a MemoryError)


def sizes_that_are_sizes() -> None:
    """A COLUMNS or LINES that is no terminal size (0, -1, `abc`, `²`, past MAX_SIZE) is unset, so the terminal's
    own size is used: Rich took COLUMNS=0 as a width of 0 and the chat drew nothing, and `²` (a digit to
    str.isdigit) was a ValueError traceback from every Rich console, --help's too."""
    for name in ("COLUMNS", "LINES"):
        given = os.environ.get(name)
        if given is not None and not (given.isascii() and given.isdigit() and len(given) <= 5
                                      and 0 < int(given) <= MAX_SIZE):
            del os.environ[name]


def empty_home_as_unset() -> None:
    """HOME set to nothing (`HOME= localgen ...`, a service manager's empty value) is unset, so the home folder is
    the password database's, as platformdirs reads it: Python's expanduser took it as `/`, so a LOCALGEN_HOME of
    `~/lg` was `/lg` and the Hugging Face cache `/.cache`."""
    if os.environ.get("HOME") == "" and sys.platform != "win32":  # Windows reads USERPROFILE
        del os.environ["HOME"]


def utf8_output() -> None:
    """stdout and stderr that no character can fail: one that is not a terminal (a file, a pipe) writes UTF-8
    whatever the locale or code page, and a terminal that is not UTF-8 shows `?` for a character it cannot. On
    Windows, output redirected to a file was in the ANSI code page, and the first character outside it (你好, ✓)
    a UnicodeEncodeError traceback."""
    import codecs

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError, OSError, LookupError, TypeError):  # not a text stream
            if codecs.lookup(stream.encoding).name == "utf-8":
                continue
            if not stream.isatty():  # its error handler kept: stderr's backslashreplace writes a stray surrogate
                stream.reconfigure(encoding="utf-8", errors=stream.errors)  # type: ignore[union-attr]
            elif stream.errors == "strict":
                stream.reconfigure(errors="replace")  # type: ignore[union-attr]


def _main(argv: list[str] | None) -> None:
    if (sys.argv[1:] if argv is None else argv) in (["--version"], ["-V"]):
        print_version()
    import typer

    from localgen._compat import fast_typer_coercion
    from localgen.cli import app, signals, usage
    from localgen.cli.output import ErrWriter, ReaderGone, guard_stderr, guard_stdout, silence_stdout
    from localgen.errors import LocalgenError

    fast_typer_coercion()
    llama_env_switches()
    from localgen.cli import helpall

    args, show_all = helpall.wanted(normalize_argv(list(sys.argv[1:] if argv is None else argv)))
    first = next((a for a in args if not a.startswith("-")), None)
    command = typer.main.get_command(app.build(first if first in app.COMMANDS else None))
    if "--help" in args or "-h" in args or not args:  # what the help alone shows
        helpall.readable(command)
        if not show_all:
            helpall.trim(command, first)
    debug = switch_on("LOCALGEN_DEBUG")
    line_buffered_stdout()
    guard_stdout()
    guard_stderr()
    signals.watch_sigint()
    err = ErrWriter()
    from localgen.models import catalogue, ollamastore, presets

    catalogue.warn_with(err.warn)  # what of the user's models.toml cannot be used: said once, the rest works
    ollamastore.warn_with(err.warn)  # an Ollama model's settings localgen has no knob for: said once each
    presets.warn_with(err.warn)  # a damaged preset file that `list` (and every listing) leaves out
    rc: Any = 0
    try:
        if args and not ("--help" in args or "-h" in args):
            from localgen.paths import check_home

            check_home()
        rc = command.main(args=args, prog_name="localgen", standalone_mode=False)
    except typer.Exit as e:
        rc = e.exit_code
    except typer.Abort:
        rc = signals.said_term() or 130
        if rc == 130:
            err.interrupted()
    except typer.TyperException as e:  # usage errors: bad flag, value out of range, missing file
        message = usage.usage_line(args, e)
        if message.strip():  # empty for "no arguments": the help was already printed
            err.error(message, usage.model_first(args, message))
        rc = getattr(e, "exit_code", 2)
    except LocalgenError as e:
        if debug:
            raise
        from localgen.errors import ModelNotFoundError

        foreign = usage.foreign_flag(args) if any(len(a) > 2 and a[0] == "-" != a[1] for a in args) else None
        err.error(usage.named_where(args, e.message) if isinstance(e, ModelNotFoundError) else e.message,
                  foreign[1] if foreign else e.hint)  # `embed -mg 0 hi`: "unknown model 'g'", and why
        rc = e.exit_code
    except KeyboardInterrupt:
        rc = signals.said_term() or 130
        if rc == 130:
            err.interrupted()
    except (ReaderGone, BrokenPipeError):  # the reader went away (`| head -1`): a normal end
        silence_stdout()
        rc = 0
    except OSError as e:
        if debug:
            raise
        err.error(describe_os_error(e))
        rc = 1
    rc = flush_stdout(err, rc if isinstance(rc, int) else 0)
    if rc == 130 and signals.sigint_seen():
        err.interrupted()  # typer turns a KeyboardInterrupt into a silent 130
    if rc in (130, 143, 129):  # SIGINT, SIGTERM, SIGHUP: 128 + the number
        # A Ctrl-C (or serve's early SIGTERM or SIGHUP, raised as one) that landed inside exec() of a string (a
        # dataclass being made while a module is imported) leaves CPython's "unhandled KeyboardInterrupt" mark
        # set although it was handled here, and the interpreter would then end by killing itself with SIGINT
        # instead of exiting with rc. Evaluating a string clears that mark (pythonrun.c, run_eval_code_obj).
        eval("0")
    sys.exit(rc)


def print_version() -> None:
    """`localgen --version`, as the app's eager --version says it, without importing Typer and Rich (100 modules),
    and then exit: a reader gone is a normal end, a full disk one error line."""
    from localgen.cli import version_line

    try:
        print(version_line(), flush=True)
    except BrokenPipeError:
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit goes there
    except OSError as e:  # `> /dev/full`
        from localgen.cli.output import StdoutError

        message = describe_os_error(StdoutError(e.errno, e.strerror))  # before stdout is replaced (`>&-`)
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115  # nothing more to write there at exit
        print(f"localgen: error: {message}", file=sys.stderr)
        sys.exit(1)
    sys.exit(0)


def line_buffered_stdout() -> None:
    """stdout into a pipe or a file writes each line as it is printed, as on a terminal (Python would hold it
    in an 8 KiB block until exit): `doctor | cat` shows each line as it is known, and on a merged `2>&1` stdout's
    lines and stderr's (line-buffered already) come in the order they were printed. Partial lines (an answer's
    tokens) are flushed where they are written.

    Unbuffered (`python -u`, PYTHONUNBUFFERED=1, as Docker images set it), stdout writes straight to its file
    descriptor, and a write to a terminal that has fallen behind waits there: Ctrl-C then ends it short, and
    Python drops the rest of the text it was writing (the token shown last, part of a chat frame). Under a
    buffer, what the write did not take stays in the buffer and goes at the next flush, as without -u."""
    import io

    stream = sys.__stdout__
    with contextlib.suppress(AttributeError, ValueError, OSError):  # detached, or no descriptor: left as it is
        if stream is not None and sys.stdout is stream and isinstance(stream.buffer, io.RawIOBase):
            raw = io.FileIO(stream.fileno(), "wb", closefd=False)  # sys.__stdout__ keeps the descriptor
            sys.stdout = io.TextIOWrapper(io.BufferedWriter(raw), encoding=stream.encoding, errors=stream.errors,
                                          line_buffering=True)
    with contextlib.suppress(AttributeError, ValueError):  # replaced by something that cannot (a test's capture)
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]


def flush_stdout(err: Any, rc: int) -> int:
    """What stdout still holds (a line cut short, or text a failed write kept in its buffer) goes out before the
    exit, where Python's own flush at exit could only print a traceback and exit 120: a full disk (`> /dev/full`)
    is one error line (none more where the command has said it) and exit 1; a reader gone, a quiet end; Ctrl-C,
    130. Returns the exit status."""
    from localgen.cli.output import ReaderGone, silence_stdout

    try:
        if sys.stdout is not None:  # None where the shell closed it (`>&-`)
            sys.stdout.flush()
    except (ReaderGone, BrokenPipeError):
        silence_stdout()
    except KeyboardInterrupt:
        err.interrupted()
        return 130
    except ValueError:  # closed: nothing it holds can go
        pass
    except OSError as e:
        silence_stdout()  # what it holds cannot be written: the exit's flush goes nowhere
        if rc == 0:
            err.error(describe_os_error(e))
            return 1
    return rc


def normalize_argv(args: list[str]) -> list[str]:
    """`-fa`, `-fa on|off|auto` and `--flash-attn X` as one `--flash-attn=X` word (run, chat, serve, fit)."""
    from localgen._compat import flash_attn_argv

    return flash_attn_argv(args)


_loopback: dict[str, bool] = {}  # serve's checks ask several times: one lookup (one resolver timeout) at most


def is_loopback(host: str) -> bool:
    """Whether listening on `host` listens on loopback only: localhost, a loopback address, or a name that
    resolves (as binding resolves it) to loopback addresses only (`vm` in /etc/hosts as 127.0.0.1)."""
    if host not in _loopback:
        _loopback[host] = _resolves_to_loopback(host)
    return _loopback[host]


def _resolves_to_loopback(host: str) -> bool:
    import ipaddress
    import socket

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        found = {str(info[4][0]) for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)}
    except (OSError, UnicodeError):
        return False
    try:
        return bool(found) and all(ipaddress.ip_address(a.partition("%")[0]).is_loopback for a in found)
    except ValueError:
        return False


_RIGHTS_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR}


def describe_os_error(e: OSError) -> str:
    """An OSError as one line a user can act on: `cannot write PATH: reason`, `cannot use PATH: reason` where a
    reader could have met it too (a folder it cannot enter)."""
    reason = e.strerror or str(e)
    path = e.filename
    if path is None and e.errno == errno.EBADF and _stdout_closed():  # `>&-`: the descriptor was never open
        return "stdout is closed: the output has nowhere to go"
    from localgen.cli.output import StdoutError

    if isinstance(e, StdoutError):  # `> /dev/full`: the reason alone did not say which write failed
        return f"cannot write to stdout: {reason}"
    if path is None or reason.startswith(f"{os.fsdecode(path)} "):  # the reason names it ("X is a file, not a
        return reason  # folder": paths.make_dirs)
    from localgen import paths

    ours = paths.within_home(path)  # a folder of localgen's own (LOCALGEN_HOME's): what to do about its rights
    hint = f" ({paths.home_hint()})" if ours and e.errno in _RIGHTS_ERRNOS else ""  # (a full disk's is plain)
    if e.errno in _WRITE_ERRNOS:
        return f"cannot write {os.fsdecode(path)}: {reason}{hint}"
    if e.errno in _USE_ERRNOS:
        return f"cannot use {os.fsdecode(path)}: {reason}{hint}"
    if e.errno == errno.ENOENT:  # (of localgen's own folders: one it could not make, not a file it could not read)
        return f"cannot {'make' if ours else 'read'} {os.fsdecode(path)}: {reason}{hint}"
    return f"{os.fsdecode(path)}: {reason}{hint}"


def _stdout_closed() -> bool:
    """Whether stdout is the shell's closed one (closed_stdio_to_devnull: /dev/null, open for reading only)."""
    try:
        import fcntl
    except ImportError:  # Windows
        return False

    try:
        return fcntl.fcntl(sys.stdout.fileno(), fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
    except (OSError, ValueError, AttributeError):
        return False


