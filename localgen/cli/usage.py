"""Usage errors as localgen says them: Click's message with the help to see, a llama.cpp flag of several letters
after one dash (`-ngl`) that a command lacks named as the user typed it, a model named by LOCALGEN_MODEL said so,
and Ollama's `run MODEL PROMPT` order pointed to -m."""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing is not imported on main()'s path (cli/main.py)
if TYPE_CHECKING:
    from typing import Any


# the commands whose -m defaults to LOCALGEN_MODEL (docs/configuration.md)
_MODEL_ENV_COMMANDS = ("run", "chat", "serve", "bench", "fit", "doctor", "tune", "perplexity", "embed", "rerank",
                       "launch")


def named_where(args: list[str], message: str) -> str:
    """The error of a model that is not there, named by LOCALGEN_MODEL rather than -m: it says so
    (`LOCALGEN_MODEL=NAME: unknown model ...`), or a name the user never typed would seem to come from nowhere."""
    name = os.environ.get("LOCALGEN_MODEL", "")
    typed = any(a in ("-m", "--model") or a.startswith("--model=") for a in args)
    bare = name.partition(":")[2] if name.startswith(("ollama:", "lmstudio:")) else name  # as their errors name it
    if not name or typed or not args or args[0] not in _MODEL_ENV_COMMANDS or bare not in message:
        return message
    return f"LOCALGEN_MODEL={name}: {message}"


def usage_line(args: list[str], e: Exception) -> str:
    """Click's usage error as localgen says it: its message and the command's help to see (empty where Click's is,
    for no arguments); a llama.cpp flag the command lacks (`tune -ngl 99`, read as `-n gl`) named, not the letter
    Click saw."""
    _close_only(e)
    message = e.format_message() if hasattr(e, "format_message") else str(e)
    if not message.strip():
        return message
    ctx = getattr(e, "ctx", None)
    foreign = foreign_flag(args, e)
    if foreign is not None:
        return f"{foreign[1]} (see '{foreign[0]} --help')"
    message = out_of_range(args, message, getattr(e, "param", None))
    if ctx is not None and ctx.parent is None:
        message = peer_command(message)
    return message + (f" (see '{ctx.command_path} --help')" if ctx is not None else "")


# A peer's command (Ollama's, llm's, llama.cpp's tools') → localgen's for it: offered when typed (Click offers
# only names spelled alike: `lst` got list, `models` nothing)
PEER_COMMANDS = {"models": "list", "ls": "list", "prompt": "run", "generate": "run", "complete": "run",
                 "cli": "run", "server": "serve", "download": "pull", "info": "show", "remove": "rm",
                 "delete": "rm", "copy": "cp", "unload": "stop", "embeddings": "embed", "benchmark": "bench",
                 "rpc": "rpc-server", "log": "logs", "collection": "collections"}


def peer_command(message: str) -> str:
    """Click's "No such command 'models'." with the localgen command a peer's name stands for."""
    import re

    m = re.fullmatch(r"No such command '(?P<name>[^']*)'\.(?: Did you mean .*)?", message, re.S)
    meant = PEER_COMMANDS.get(m["name"].lower()) if m else None
    return f"No such command '{m['name']}': localgen's is '{meant}'." if m and meant else message


CLOSE = 0.7  # how alike (difflib's ratio) a flag must be to the one typed to be offered as meant, dashes aside


def _close_only(e: Exception) -> None:
    """Click's "No such option: --bogus (Possible options: --verbose)" keeps only the options close to the one typed,
    compared without their dashes (Click's 0.6 with them offered --verbose for --bogus, -ot for --port)."""
    import difflib

    typed, offered = getattr(e, "option_name", None), getattr(e, "possibilities", None)
    if isinstance(typed, str) and offered:
        e.possibilities = [p for p in offered  # type: ignore[attr-defined]
                           if difflib.SequenceMatcher(None, typed.lstrip("-"), p.lstrip("-")).ratio() >= CLOSE]


def out_of_range(args: list[str], message: str, param: Any) -> str:
    """Click's "Invalid value for '--logprobs': 30 is not in the range 0<=x<=20." said as localgen says a value
    past its range ("--logprobs must be within 0 to 20, not 30"; "at least", "at most" for one bound), naming the
    flag as typed, or the environment variable the value came from (LOCALGEN_PORT=0 is no --port the user
    typed); its other "Invalid value" messages so too ("--ctx: 'abc' is not a valid integer"). Any other message
    as it is."""
    import re

    head = r"Invalid value for '(?P<name>[^']*)'(?: / '[^']*')*(?: \(env var: '[^']*'\))?: "
    m = re.fullmatch(head + r"(?P<value>.+) is not in the range (?:(?P<low>[^<x]+)<=)?x(?:<=(?P<high>[^<]+))?\.",
                     message)
    opts = list(getattr(param, "opts", None) or [])
    if not opts:
        return message
    if m is None:  # an argument (bench compare's RUN_A) is named as Click names it
        other = re.fullmatch(head + r"(?P<why>.+?)\.?", message, re.S)
        if other is None or "\n" in other["why"]:
            return message
        return f"{_named(args, param, opts) if opts[0].startswith('-') else other['name']}: {other['why']}"
    value, low, high = (g[:-2] if g is not None and re.fullmatch(r"-?\d+\.0", g) else g
                        for g in (m["value"], m["low"], m["high"]))
    from localgen.settings import INT32

    if high == str(INT32) and low is not None:  # a C int's top is no bound of the setting's own (settings.py)
        v, lo = _number(value), _number(low)
        below = v is not None and lo is not None and v < lo
        bound = f"at least {low}" if below else f"at most {INT32:,} (llama.cpp takes it as a C int)"
    else:
        bound = (f"within {low} to {high}" if low is not None and high is not None else
                 f"at least {low}" if low is not None else f"at most {high}")
    return f"{_named(args, param, opts)} must be {bound}, not {value}"


def _named(args: list[str], param: Any, opts: list[str]) -> str:
    """The flag of a bad value as the user typed it (the last given, whose value Click kept; `-c-1` too), else the
    environment variable it came from, else the flag's longest name."""
    from localgen.cli.optionorder import last_typed

    envvar = getattr(param, "envvar", None)
    return last_typed(args, opts, joined=True) or (
        f"{envvar}" if isinstance(envvar, str) and envvar in os.environ else max(opts, key=len))


def _number(text: str | None) -> float | None:
    """A number Click's message gives, or None."""
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def foreign_flag(args: list[str], error: Exception | None = None) -> tuple[str, str] | None:
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


def model_first(args: list[str], message: str) -> str | None:
    """A hint for `localgen run MODEL PROMPT` (Ollama's `ollama run MODEL PROMPT`): the model goes after -m."""
    import re
    import shlex

    positional = [a for a in args[1:] if not a.startswith("-")]
    if args[:1] != ["run"] or not message.startswith("Got unexpected extra argument") or len(positional) < 2:
        return None
    model = positional[0]
    meant = [model] if re.fullmatch(MODEL_WORD, model) and (":" in model or "/" in model or model.endswith(".gguf")) \
        else names_a_model(model)
    if not meant:
        return None
    return f"the model is named with -m: localgen run -m {shlex.quote(meant[0])} \"PROMPT\"" + "".join(
        f" or -m {shlex.quote(m)}" for m in meant[1:])


MODEL_WORD = r"[\w.-]+(/[\w.-]+)*(:[\w.@-]+)?"  # what a model's name looks like on a command line


def names_a_model(word: str) -> list[str]:
    """The models `word` names here, as a user typing Ollama's `ollama run MODEL` means one: itself where it is a
    catalogue entry (smollm2:135m) or a preset, else the entries of the family it names (llama3.2: llama3.2:1b,
    llama3.2:3b); none for any other word. Read only where a mistake is suspected."""
    import re

    from localgen.errors import LocalgenError
    from localgen.models import catalogue, presets

    if not re.fullmatch(MODEL_WORD, word):
        return []
    try:
        entries = catalogue.read(quiet=True).entries  # a look: the model used says what of the file is wrong
        if word in entries or presets.find(word) is not None:
            return [word]
        return sorted((name for name in entries if name.partition(":")[0] == word), key=_size_of_tag)
    except LocalgenError:  # a damaged catalogue or preset: said where the model is used, not here
        return []


def _size_of_tag(name: str) -> float:
    """A catalogue name's size as its tag says it (gemma3:270m before gemma3:4b before gemma3:12b); a tag of no
    size last."""
    import re

    m = re.match(r"(\d+(?:\.\d+)?)([mb])", name.partition(":")[2].lower())
    return float(m[1]) * (1e6 if m[2] == "m" else 1e9) if m else float("inf")
