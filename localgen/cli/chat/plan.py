"""`localgen chat`'s flags become its ChatPlan: the rules chat shares with run (options/plan.py; a scripted chat cannot
ask before a tool call runs), then which conversation, where notices go and what is printed. Nothing after
this sees ChatArgs."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from localgen.cli.options import ModelArgs, refuse_empty
from localgen.cli.options import plan as shared
from localgen.cli.options.plan import LoadPlan, SendPlan


@dataclass(frozen=True, kw_only=True)
class ChatArgs(ModelArgs):
    """`localgen chat`'s parameters (chat/command.py)."""

    name: str | None
    resume: bool
    list_: bool
    plain: bool
    stats: bool
    compact: bool | None
    no_log: bool


@dataclass(frozen=True)
class ChatPlan:
    """Everything `chat` will do, decided before anything loads: what to load, what to send with every message,
    which conversation, and how it shows."""

    load: LoadPlan
    send: SendPlan
    name: str | None  # the conversation's name (with resume: the one to go on with; a log's id works too)
    resume: bool
    interactive: bool  # the REPL on a terminal; else one message per stdin line, answers plainly
    plain: bool  # no Markdown or colour (--plain, NO_COLOR)
    stats: bool  # scripted: each answer's stats to stderr
    compact: bool | None  # fold the oldest turns into a summary (--compact), not (--no-compact), or as saved (None)
    no_log: bool


def check(f: ChatArgs) -> ChatPlan:
    """Usage errors before anything loads (the rules chat shares with run), then the plan."""
    refuse_empty(("the conversation name", f.name))
    _not_a_model(f)
    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    model = shared.check(f, shared.CommandRules(
        cannot_ask=None if interactive else "a scripted chat (stdin not a terminal)"))
    return ChatPlan(load=model.load, send=model.send, name=f.name, resume=f.resume, interactive=interactive,
                    plain=f.plain or bool(os.environ.get("NO_COLOR")), stats=f.stats, compact=f.compact,
                    no_log=f.no_log)


def _not_a_model(f: ChatArgs) -> None:
    """`localgen chat llama3.2`, typed as `ollama run llama3.2` is, with no -m: a conversation of that name with
    the default model, its preset's settings unused, and no word said. With -m (or --resume) the name is the
    conversation's, whatever model it also names."""
    from localgen.cli.usage import names_a_model
    from localgen.errors import UsageError

    if f.name is None or f.resume or f.typed("model") or _saved(f.name):  # (a saved one: "continue it with
        return  # --resume NAME", as before)
    meant = names_a_model(f.name)
    if meant:
        import shlex

        raise UsageError(f"{f.name} names a model, not a conversation: the model is named with -m",
                         hint=f"localgen chat -m {shlex.quote(meant[0])}" + "".join(
                             f" or -m {shlex.quote(m)}" for m in meant[1:]) + "; with -m, NAME names the "
                         "conversation")


def _saved(name: str) -> bool:
    """Whether a conversation of that name is saved (what chat says of it comes later, with the way to go on)."""
    from localgen.chat import saved

    try:
        return (saved.chats_dir() / f"{name}.json").is_file()
    except (OSError, ValueError):
        return False
