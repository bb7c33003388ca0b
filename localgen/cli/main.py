"""Process entry point: runs the app and turns every expected failure into one line and an exit code."""

from __future__ import annotations

import contextlib
import errno
import os
import sys

TYPE_CHECKING = False  # typing is not imported before main() can catch a Ctrl-C: its import is the widest gap
if TYPE_CHECKING:
    from typing import Any

_WRITE_ERRNOS = {errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EEXIST, errno.ENOTDIR,
                 errno.EISDIR, errno.EFBIG}


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
    try:
        keep_ctrl_c()
        stop_serve_on_term(sys.argv[1:] if argv is None else argv)
        closed_stdio_to_devnull()
        utf8_stdin()
        _main(argv)
    except KeyboardInterrupt:  # before _main's own handling was set up (an import), or after it had done
        interrupted_early()
    finally:
        native = sys.modules.get("localgen.native.lib")
        if native is not None:  # --rpc's watch for a main thread stuck in llama.cpp ends with the command
            native.stop_watching()


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
    first such byte was a UnicodeDecodeError traceback that lost every line after it."""
    with contextlib.suppress(AttributeError, ValueError, OSError):  # not a text stream, or read from already
        sys.stdin.reconfigure(encoding="utf-8", errors="surrogateescape")  # type: ignore[union-attr]


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


def stopped_by_term() -> int:
    """The SIGTERM or SIGHUP that stopped serve before it listened (0: none did)."""
    return _term["signal"]


def term_line(signum: int) -> str:
    """What serve says when a SIGTERM or SIGHUP stopped it before it listened."""
    import signal

    return f"stopped by {signal.Signals(signum).name} before the server was listening"


def _said_term() -> int | None:
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
    code = _said_term()
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


def _main(argv: list[str] | None) -> None:
    if (sys.argv[1:] if argv is None else argv) in (["--version"], ["-V"]):
        print_version()
    import typer

    from localgen._compat import fast_typer_coercion
    from localgen.cli import app
    from localgen.cli.output import ErrWriter, ReaderGone, guard_stdout, silence_stdout
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
    _watch_sigint()
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
        rc = _said_term() or 130
        if rc == 130:
            err.interrupted()
    except typer.TyperException as e:  # usage errors: bad flag, value out of range, missing file
        message = _usage_line(args, e)
        if message.strip():  # empty for "no arguments": the help was already printed
            err.error(message, _model_first(args, message))
        rc = getattr(e, "exit_code", 2)
    except LocalgenError as e:
        if debug:
            raise
        from localgen.errors import ModelNotFoundError

        foreign = _foreign_flag(args) if any(len(a) > 2 and a[0] == "-" != a[1] for a in args) else None
        err.error(_named_where(args, e.message) if isinstance(e, ModelNotFoundError) else e.message,
                  foreign[1] if foreign else e.hint)  # `embed -mg 0 hi`: "unknown model 'g'", and why
        rc = e.exit_code
    except KeyboardInterrupt:
        rc = _said_term() or 130
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
    if rc == 130 and _sigint["seen"]:
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
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115  # nothing more to write there at exit
        print(f"localgen: error: {describe_os_error(e)}", file=sys.stderr)
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


_sigint = {"seen": False}


def _watch_sigint() -> None:
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


def normalize_argv(args: list[str]) -> list[str]:
    """`-fa`, `-fa on|off|auto` and `--flash-attn X` as one `--flash-attn=X` word (run, chat, serve)."""
    from localgen._compat import flash_attn_argv

    return flash_attn_argv(args)


def is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def describe_os_error(e: OSError) -> str:
    """An OSError as one line a user can act on: `cannot write PATH: reason`."""
    reason = e.strerror or str(e)
    path = e.filename
    if path is None and e.errno == errno.EBADF and _stdout_closed():  # `>&-`: the descriptor was never open
        return "stdout is closed: the output has nowhere to go"
    if path is None:
        return reason
    if e.errno in _WRITE_ERRNOS:
        return f"cannot write {os.fsdecode(path)}: {reason}"
    if e.errno == errno.ENOENT:
        return f"cannot read {os.fsdecode(path)}: {reason}"
    return f"{os.fsdecode(path)}: {reason}"


def _stdout_closed() -> bool:
    """Whether stdout is the shell's closed one (closed_stdio_to_devnull: /dev/null, open for reading only)."""
    import fcntl

    try:
        return fcntl.fcntl(sys.stdout.fileno(), fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
    except (OSError, ValueError, AttributeError):
        return False


# the commands whose -m defaults to LOCALGEN_MODEL (docs/configuration.md)
_MODEL_ENV_COMMANDS = ("run", "chat", "serve", "bench", "fit", "doctor", "tune", "perplexity", "embed", "rerank",
                       "launch")


def _named_where(args: list[str], message: str) -> str:
    """The error of a model that is not there, named by LOCALGEN_MODEL rather than -m: it says so
    (`LOCALGEN_MODEL=NAME: unknown model ...`), or a name the user never typed would seem to come from nowhere."""
    name = os.environ.get("LOCALGEN_MODEL", "")
    typed = any(a in ("-m", "--model") or a.startswith("--model=") for a in args)
    bare = name.partition(":")[2] if name.startswith(("ollama:", "lmstudio:")) else name  # as their errors name it
    if not name or typed or not args or args[0] not in _MODEL_ENV_COMMANDS or bare not in message:
        return message
    return f"LOCALGEN_MODEL={name}: {message}"


def _usage_line(args: list[str], e: Exception) -> str:
    """Click's usage error as localgen says it: its message and the command's help to see (empty where Click's is,
    for no arguments); a llama.cpp flag the command lacks (`tune -ngl 99`, read as `-n gl`) named, not the letter
    Click saw."""
    message = e.format_message() if hasattr(e, "format_message") else str(e)
    if not message.strip():
        return message
    ctx = getattr(e, "ctx", None)
    foreign = _foreign_flag(args, e)
    if foreign is not None:
        return f"{foreign[1]} (see '{foreign[0]} --help')"
    return message + (f" (see '{ctx.command_path} --help')" if ctx is not None else "")


def _foreign_flag(args: list[str], error: Exception | None = None) -> tuple[str, str] | None:
    """The llama.cpp-style flag of several letters after one dash (`-ngl`, `-ctk`, `-np`) that a command was given
    and lacks while other commands have it: the command and what to say ("localgen tune", "localgen tune has no
    -ngl option: run, chat, ... have it"). Click reads such a word as a short flag and its value (`-n gl`), so its
    usage `error` names the wrong flag: the word is named where Click's error is about it, in the command Click was
    parsing. With no `error` (a command that ran and failed on what Click made of the word: `embed -mg 0 hi` looks
    for a model called "g"), any such word of the command's own. None where there is none (every command is
    imported to know: an error's path only)."""
    import typer

    from localgen.cli import app

    root = typer.main.get_command(app.build())

    def takes_value(command: Any, word: str) -> bool:
        return any(word in p.opts for p in command.params  # an option (not an argument) that is no switch
                   if hasattr(p, "is_flag") and not (p.is_flag or getattr(p, "count", False)))

    # each command on the line with the words given to it (not its options' values, not its subcommand's words)
    segments: list[tuple[Any, list[str], list[str]]] = [(root, ["localgen"], [])]
    value_next = False
    for a in args[:args.index("--") if "--" in args else len(args)]:
        command, path, words = segments[-1]
        if value_next:  # an option's value, whatever it looks like (`run -p -npl`)
            value_next = False
        elif a.startswith("-"):
            words.append(a)
            value_next = "=" not in a and takes_value(command, a)
        elif (sub := getattr(command, "commands", {}).get(a)) is not None:
            segments.append((sub, [*path, a], []))
    ctx = getattr(error, "ctx", None)
    failed = getattr(ctx, "command_path", None) if error is not None else None
    command, path, words = next((seg for seg in segments if " ".join(seg[1]) == failed), segments[-1])
    if command is root:
        return None

    def flags(c: Any) -> set[str]:
        return {o for p in c.params for o in (*p.opts, *p.secondary_opts)}

    def every(c: Any, name: str) -> list[tuple[str, Any]]:  # a group's own flags (bench's) count too
        subs = getattr(c, "commands", {})
        return [(name, c), *(pair for sub, s in subs.items() for pair in every(s, f"{name} {sub}".strip()))]

    message = (error.format_message() if hasattr(error, "format_message") else str(error)) if error else ""
    own, commands = flags(command), every(root, "")[1:]
    for k, a in enumerate(words):
        flag = a.split("=", 1)[0]
        if a.startswith("--") or len(flag) < 3 or flag in own or flag[:2] in words[:k]:
            continue  # (`ps -n 3 -ngl 9`: Click's error may be about the -n given first)
        param = getattr(error, "param", None)  # Click's NoSuchOption has option_name, BadParameter param
        about = error is None or getattr(error, "option_name", None) in (flag, flag[:2]) or (
            param is not None and flag[:2] in param.opts and a[2:] in message) or message.startswith(
            "Got unexpected extra argument")
        others = [name for name, c in commands if flag in flags(c)] if about else []
        if others:
            shown = others if len(others) <= 6 else [*others[:5], f"{len(others) - 5} more"]
            named = ", ".join(shown[:-1]) + (" and " if len(shown) > 1 else "") + shown[-1]
            command_path, verb = " ".join(path), "has" if len(others) == 1 else "have"
            return command_path, f"{command_path} has no {flag} option: {named} {verb} it"
    return None


def _model_first(args: list[str], message: str) -> str | None:
    """A hint for `localgen run MODEL PROMPT` (Ollama's `ollama run MODEL PROMPT`): the model goes after -m."""
    import re
    import shlex

    positional = [a for a in args[1:] if not a.startswith("-")]
    if args[:1] != ["run"] or not message.startswith("Got unexpected extra argument") or len(positional) < 2:
        return None
    model = positional[0]
    if not re.fullmatch(r"[\w.-]+(/[\w.-]+)*(:[\w.@-]+)?", model) or not (":" in model or "/" in model or
                                                                      model.endswith(".gguf")):
        return None
    return f"the model is named with -m: localgen run -m {shlex.quote(model)} \"PROMPT\""
