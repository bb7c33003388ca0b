"""`--help` lists the options most uses need; `--help-all` lists every one. run, chat and serve take every
setting of the table (about 100 options for run): their help would run to several screens, so the rest are
hidden from `--help` (never from parsing: a hidden option works the same) and an epilog says how many and
where they are. And the help reads as a user writes the command (readable): each value as a word, no
Python types, one long name a row, so that the descriptions have room at 80 columns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

FLAG = "--help-all"
_SAMPLING = {"temperature", "top_k", "top_p", "min_p", "seed", "max_tokens", "stop", "system"}
_LOADING = {"model", "ctx", "threads", "gpu_layers", "offline"}
COMMON: dict[str, frozenset[str]] = {
    "run": frozenset({"prompt_arg", "prompt", "raw", "document", "file", "parallel", "image", "attach", "video",
                      "json_out", "stats", "think", "continue_", "no_log", "grammar", "json_schema", "endpoint", "rag",
                      "verbose",
                      *_SAMPLING, *_LOADING}),
    "chat": frozenset({"name", "resume", "list_", "plain", "stats", "compact", "think", "no_log", "endpoint",
                       "functions", "mcp", "rag", "verbose", *_SAMPLING, *_LOADING}),
    "serve": frozenset({"models", "host", "port", "parallel", "api_key", "api_key_file", "keep_alive", "max_models",
                        "max_memory", "cors", "endpoints", "quiet", "verbose", *_SAMPLING, *_LOADING}
                       - {"system", "model"}),
}


def wanted(args: list[str]) -> tuple[list[str], bool]:
    """The arguments with --help-all made --help, and whether it was given; `help [COMMAND]` (as `ollama help`,
    `git help`) is `[COMMAND] --help`."""
    if args[:1] == ["help"]:
        while args[:1] == ["help"]:  # `help help` too, as git's
            args = args[1:]
        args = [*args, "--help"]
    if FLAG not in args:
        return args, False
    return ["--help" if a == FLAG else a for a in args], True


def trim(group: Any, name: str | None) -> None:
    """Hide from `name`'s help the options not in its common set (click's `hidden`), and say in an epilog how
    many there are and how to see them."""
    common = COMMON.get(name or "")
    command = getattr(group, "commands", {}).get(name) if common else None
    if command is None or common is None:
        return
    hidden = 0
    for param in command.params:
        if param.param_type_name == "option" and param.name not in common:
            param.hidden = True
            hidden += 1
    command.epilog = (f"{hidden} more options (sampling, loading and GPU, and the rest): localgen {name} {FLAG}"
                      + (f"\n\n{command.epilog}" if command.epilog else ""))


LONGEST_METAVAR = 14  # `FILE:SCALE,...`; a longer one is written out in the help
LONGEST_CHOICES = 11  # `on|off|auto`: a longer list of choices widens the value column past what 80 columns spare
# bounds that mean "any": a C int's or an unsigned 32-bit seed's, which the help need not spell out
_ANY = (-(2**31), 2**31 - 1, 2**32 - 1)


def readable(command: Any) -> None:
    """Every command's help (groups' subcommands too) as a user writes the command: a value's kind as a word
    (N, NUM, TEXT, FILE, DIR, PATH, a|b|c) where Typer would show a Python type (`<int>`, `<list[Path]>`), none
    for a flag; a number's range in words in its help (`[1 to 1024]`), not `<int range> [1<=x<=1024]`; and one
    long name a row, its aliases named in its help ("Also --ctx-size."), so the name column stays narrow."""
    # as the help is written, after parsing: a name taken out of a row here still parses (`--ctx-size 8 -h`)
    write = command.format_help

    def format_help(ctx: Any, formatter: Any) -> None:
        for param in command.get_params(ctx):  # with click's -h/--help
            _readable(param)
        write(ctx, formatter)

    command.format_help = format_help
    if command.help:  # a paragraph's lines joined, as Click joins them and this Typer does only for the first
        import inspect

        first, *rest = inspect.cleandoc(command.help).split("\n\n")
        command.help = "\n\n".join([first, *(p if p.startswith("\b") else " ".join(p.splitlines()) for p in rest)])
    for sub in getattr(command, "commands", {}).values():
        readable(sub)


def _readable(param: Any) -> None:
    if param.param_type_name == "argument":
        param.display_type_rich = lambda ctx: None  # its name (PROMPT, TEXT) says what it takes
        return
    if param.metavar is None:
        param.metavar = _word(param)
    extra = []
    if "|" in param.metavar and len(param.metavar) > LONGEST_CHOICES:  # too wide a column: named in the help
        *first, last = param.metavar.split("|")
        extra.append(f"One of {', '.join(first)} or {last}.")
        param.metavar = "MODE"
    elif len(param.metavar) > LONGEST_METAVAR:  # `PATTERN=BUFFER,...`: likewise
        extra.append(f"Takes {param.metavar}.")
        param.metavar = "SPEC"
    lo, hi = getattr(param, "min", None), getattr(param, "max", None)
    lo, hi = (None if lo in _ANY else lo), (None if hi in _ANY else hi)
    if lo is not None or hi is not None:
        extra.append(f"[{lo:g} to {hi:g}]" if lo is not None and hi is not None
                     else f"[at least {lo:g}]" if lo is not None else f"[at most {hi:g}]")
    param.min = param.max = None  # Typer's own `[x>=16]` is not shown
    longs = [o for o in param.opts if o.startswith("--")]
    if len(longs) > 1:
        param.opts = [o for o in param.opts if o not in longs[1:]]
        extra.append("Also " + ", ".join(longs[1:]) + ".")
    if param.secondary_opts:  # --no-X: named in the help, not in a column of its own
        off = ", ".join(param.secondary_opts)
        if param.default is True:
            extra.append(f"On by default; {off} turns it off.")
        elif param.default is False:
            extra.append(f"Off by default ({off}).")
        elif not any(o in (param.help or "") for o in param.secondary_opts):
            extra.append(f"{off} turns it off.")  # a default of None (chosen at run time): its help tells the rest
        param.secondary_opts = []
        param.show_default = False
    if extra:
        param.help = " ".join([(param.help or "").strip(), *extra]).strip()


def _word(param: Any) -> str:
    """A value's kind as a word, as llama.cpp's and most CLIs' help write it ("" for a flag)."""
    desc = param.type_descriptor
    if param.is_flag or param.count:
        return ""
    if desc.is_choice:
        return "|".join(str(c) for c in desc.choices or ())
    if desc.is_path:
        info = desc.parameter_info
        return "DIR" if not getattr(info, "file_okay", True) else "FILE" if not getattr(info, "dir_okay", True) \
            else "PATH"
    kind = desc.annotation
    while args := [a for a in getattr(kind, "__args__", ()) if a is not type(None)]:
        kind = args[0]  # list[Path] or int | None: the element
    if kind is Path:
        return "FILE" if getattr(desc.parameter_info, "dir_okay", True) is False else "PATH"
    return {int: "N", float: "NUM", str: "TEXT", bool: ""}.get(kind, "VALUE")
