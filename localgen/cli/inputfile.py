"""An input file a flag names (--file, -f, -jf, --image, --functions, --api-key-file, ...), checked as the flags
are parsed: there, readable, not a folder; else one usage error of one shape, `--file notes.txt: no such file`,
where Click's own exists=True would say it in another. A model flag's name that is a path (-m ./m.gguf, --draft)
is such a file too (`LOCALGEN_MODEL=./m.gguf: no such file` when the environment gave it). Stdlib and Typer only:
`ps` and `launch` use it too."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from typer._click.core import Context  # typer.Context's base, which Click's own context functions return


def input_problem(path: str | Path) -> str | None:
    """Why the input file at `path` cannot be read, in a few words ("no such file"), or None. A pipe or a device
    (`/dev/stdin`, `<(cmd)`) is read as a file; only a folder is refused. Nothing is opened (a FIFO would wait)."""
    import errno
    import os
    import stat

    full = Path(path).expanduser()
    try:
        mode = os.stat(full).st_mode
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return "no such file"
        if e.errno in (errno.EACCES, errno.EPERM):
            return "permission denied"
        return (e.strerror or str(e)).lower()
    if stat.S_ISDIR(mode):
        return "a folder, not a file"
    if not os.access(full, os.R_OK):
        return "permission denied"
    return None


URL_HINTS = {"--image": "--image takes a file; -a takes an http(s) URL"}  # a URL where a flag takes only files


def check_input(flag: str, path: str | Path) -> None:
    """A usage error, `FLAG PATH: why`, when the input file a flag names cannot be read."""
    why = input_problem(path) if str(path) else "an empty path, not a file"  # (Path("") would be ".", a folder)
    path = path if str(path) else '""'
    if why is not None:
        from localgen.errors import UsageError

        web = why == "no such file" and str(path).lower().startswith(("http://", "https://"))
        raise UsageError(f"{flag} {path}: {why}", hint=URL_HINTS.get(flag) if web else None)


def input_file(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """The Click callback of an option naming input files as strings (one, or a list): each checked by
    check_input."""
    if value is not None and not ctx.resilient_parsing:  # (shell completion parses without acting; "" is a path)
        flag = "/".join(sorted(param.opts, key=len))  # as --help shows it: -f/--document
        for path in value if isinstance(value, (list, tuple)) else [value]:
            check_input(flag, path)
    return value


def input_path(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """input_file for an option typed Path (or list[Path]) and declared with path_type=str: it sees each path as
    typed, so `-f ""` is an empty path where Typer's Path would have made it the folder ".", and gives Paths back."""
    if value is None:
        return None
    if any(not isinstance(v, str) for v in (value if isinstance(value, (list, tuple)) else [value])):
        raise TypeError(f"{param.opts[0]}: declare it with path_type=str for input_path")  # a bug, not input
    value = input_file(ctx, param, value)
    return [Path(v) for v in value] if isinstance(value, (list, tuple)) else Path(value)


STDIN_FILE = "/dev/stdin"  # what `--file -` reads: stdin as a file (a pipe or a redirect), where the system has it


def input_path_or_stdin(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """input_path for a flag where `-` is stdin (run's and embed's --file), read as the file STDIN_FILE."""
    import os
    import sys

    if value == "-" and not ctx.resilient_parsing and sys.stdin is not None and sys.stdin.isatty():
        from localgen.errors import UsageError  # (as -a - is refused there: nothing would say it waits on you)

        raise UsageError(f"{param.opts[0]} - reads stdin, but stdin is this terminal",
                         hint="pipe the lines in, or give the file's path")
    if value == "-" and os.path.exists(STDIN_FILE):
        value = STDIN_FILE
    return input_path(ctx, param, value)


def shown_input(path: str | Path | None) -> str:
    """An input file's name in a message: `stdin` for none, or for `--file -` (STDIN_FILE)."""
    return "stdin" if path is None or str(path) == STDIN_FILE else str(path)


def file_source(path: str | Path | None) -> str:
    """Where --file's lines came from, in a message: `stdin`, or `--file PATH`."""
    shown = shown_input(path)
    return shown if shown == "stdin" else f"--file {shown}"


def check_model(flag: str, name: str | None, env: str | None = None) -> None:
    """A usage error, `FLAG PATH: why`, when a model name the user typed is a file's path (models/names.py: ./m.gguf,
    /abs/m.gguf, m.gguf, dir/m.gguf, or a file that is there) that cannot be read; `ENV=PATH: why` when the
    environment gave it (`env`, else the running command's option of that flag read from its envvar: origin). Any
    other name (a catalogue name, owner/repo, ollama:NAME) is the resolver's to find, with its own errors; so is a
    model a conversation or a collection recorded (its file gone since is no mistake on this command line)."""
    from localgen.errors import UsageError

    if name and _a_path(name):
        env = env or origin(flag)
        why = input_problem(name.strip())
        if why is not None and env is not None:
            raise UsageError(f"{env}={name}: {why}")
        check_input(flag, name.strip())
        from localgen.models.gguf_meta import not_a_file

        kind = not_a_file(name.strip())
        if kind is not None:  # a text input may be a pipe; a model is read at offsets, more than once
            raise UsageError(f"{env}={name}: {kind}, not a model file" if env else f"{flag} {name}: {kind}, not a "
                             "model file")


def check_model_file(name: str, lead: str = "") -> None:
    """A usage error, `[LEAD]no such model file: PATH`, when a model name a command takes as its argument (show
    NAME, pull NAME, cp SOURCE) is a file's path (as check_model tells one) with nothing there: exit 2 as -m's is,
    where the resolver's would be 1 (a folder or a FIFO there is the header reader's usage error already)."""
    from localgen.errors import UsageError

    if _a_path(name) and input_problem(name.strip()) == "no such file":
        raise UsageError(f"{lead}no such model file: {name.strip()}")


def _a_path(name: str | None) -> bool:
    """Whether a model name is a file's path as the resolver takes it (a preset's name wins over a file or folder of
    that name here); False for what is no name at all (empty, too long: the resolver says why)."""
    from localgen.errors import LocalgenError
    from localgen.models import names
    from localgen.models.resolve import spec_of

    if not name:
        return False
    try:
        return isinstance(spec_of(name), names.PathSpec)
    except LocalgenError:
        return False


def env_source(ctx: Context, name: str) -> str | None:
    """The environment variable the command's parameter `name` took its value from (LOCALGEN_CTX, LLAMA_ARG_RPC,
    ...), or None when it was typed, left to its default, or has no envvar: what an error about its value names
    instead of a flag the user never typed (typer vendors click: typer._click)."""
    from typer._click.core import ParameterSource

    if ctx.get_parameter_source(name) is not ParameterSource.ENVIRONMENT:
        return None
    envvar = next((p.envvar for p in ctx.command.params if p.name == name), None)
    return envvar if isinstance(envvar, str) else None


def origin(flag: str) -> str | None:
    """env_source of the running command's option `flag` (as model_flag names it), or None where no command runs."""
    from typer._click.globals import get_current_context

    ctx = get_current_context(silent=True)
    if ctx is None:
        return None
    return next((env_source(ctx, p.name) for p in ctx.command.params if p.name and model_flag(list(p.opts)) == flag),
                None)


def model_file(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """The Click callback of an option naming models (-m, --draft; one, or a list): each checked by check_model."""
    if value and not ctx.resilient_parsing:
        flag = model_flag(param.opts)
        for name in value if isinstance(value, (list, tuple)) else [value]:
            check_model(flag, name)
    return value


def model_flag(opts: list[str]) -> str:
    """A model option as its errors name it: its short name and its first long one (-m/--model, -md/--draft)."""
    return "/".join([*(o for o in opts if not o.startswith("--")), *[o for o in opts if o.startswith("--")][:1]])
