"""`localgen logs`: the log of prompts and answers — the latest, a full-text search, one conversation —
and `logs path|on|off|status`."""

from __future__ import annotations

from typing import Annotated

import typer

logs_app = typer.Typer(name="logs", invoke_without_command=True, no_args_is_help=False,
                       help="Show logged prompts and answers (every run and chat exchange): the latest, matches "
                            "of -q, a conversation; `logs path|on|off|status`.")


@logs_app.callback()
def logs(
    ctx: typer.Context,
    count: Annotated[int, typer.Option("--count", "-n", min=0, help="How many (0: all).")] = 3,
    query: Annotated[
        str | None, typer.Option("--query", "-q", show_default=False,
                                 help="Full-text search of prompts and answers, best matches first.")
    ] = None,
    model: Annotated[str | None, typer.Option("--model", "-m", show_default=False, help="Only this model.")] = None,
    cid: Annotated[
        str | None, typer.Option("--cid", show_default=False,
                                 help="Only this conversation, by its id or a saved chat's name (all of it with -n 0).")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="A JSON array of the exchanges.")] = False,
) -> None:
    """Show the latest logged exchanges, oldest first (or the best matches of -q)."""
    if ctx.invoked_subcommand is not None:  # `logs -n 5 status`: the listing's options would do nothing there
        from localgen.cli.options.knobs import typed_by_user
        from localgen.errors import UsageError

        for param in ctx.command.params:
            if param.name and typed_by_user(ctx, param.name):
                flag = "/".join(sorted(param.opts, key=len))
                raise UsageError(f"{flag} lists exchanges: `logs {ctx.invoked_subcommand}` takes no options",
                                 hint="drop it: it goes with `localgen logs` alone")
        return
    import itertools
    import json
    import sys

    from localgen.cli.options import refuse_empty

    refuse_empty(("-q", query), ("-m", model), ("--cid", cid))  # each would filter nothing: not what was asked
    from localgen.text import checked

    for flag, value in (("-q", query), ("-m", model), ("--cid", cid)):
        if value is not None:
            checked(value, flag)  # bytes that are not UTF-8 match nothing the log holds: a usage error
    from localgen.cli.log.conversation import chats_log_id
    from localgen.cli.output import ErrWriter, TextWriter
    from localgen.log import store

    if query is not None:
        store.search_words(query)  # refused before the log is looked for: a fresh home too (docs/logs.md)
    out = TextWriter(sys.stdout)
    if not store.path().exists():
        ErrWriter().line(f"nothing is logged yet (the log will be {store.path()})")
        if json_out:  # still a JSON array: a script reads none
            out.write("[]\n")
        return
    file_name = _file_name(model)
    entries = store.recent(count, query=query, model=model, cid=cid, file_name=file_name)
    first = next(entries, None)  # (a log that cannot be read at all is the one error line of recent())
    named = chats_log_id(cid) if first is None and cid is not None else None
    if named is not None:  # --cid NAME: a saved chat's (chat --list, /save NAME), by its conversation in the log
        entries = store.recent(count, query=query, model=model, cid=named, file_name=file_name)
        first = next(entries, None)
    _say_damage()
    if first is None:
        what = " and ".join(f"{k} {v[:80] + '…' if len(v) > 80 else v!r}"  # a long one cut, as errors are
                            for k, v in (("-q", query), ("-m", model), ("--cid", cid)) if v)
        ErrWriter().line((f"no logged exchange matches {what}" + _other_models(model)) if what else
                         "the log holds no exchange yet")
        if json_out:
            out.write("[]\n")
        return
    entries = itertools.chain([first], entries)
    if json_out:
        from dataclasses import fields

        from localgen.cli.output import finite_json

        # the array written an exchange at a time, as json.dumps(indent=1) writes it whole: the same bytes
        for i, e in enumerate(entries):
            item = json.dumps(finite_json({f.name: getattr(e, f.name) for f in fields(e)}), ensure_ascii=False,
                              indent=1, allow_nan=False).replace("\n", "\n ")
            if not out.write(("[\n " if i == 0 else ",\n ") + item):
                return
        out.write("\n]\n")
        return
    for e in entries:
        head = f"# {e.datetime_utc.replace('T', ' ')}  {e.model}  conversation {e.conversation_id}"
        parts = [head, ""]
        if e.system:
            parts += ["## System", "", e.system, ""]
        # an answer stopped before its end (Ctrl-C, a kill, a reader gone) or broken off looks finished otherwise
        cut = {"cancelled": " (stopped before its end)", "error": " (broken off by an error)"}.get(e.finish_reason, "")
        parts += ["## Prompt", "", e.prompt, "", f"## Response{cut}", "", e.response, ""]
        if not out.write("\n".join(parts) + "\n"):
            return


@logs_app.command("path")
def path() -> None:
    """Print where the log is."""
    from localgen.log import store

    typer.echo(str(store.path()))


@logs_app.command("on")
def on() -> None:
    """Log every run and chat exchange (the default)."""
    from localgen.log import store

    store.set_enabled(True)
    typer.echo("logging is on", err=True)


@logs_app.command("off")
def off() -> None:
    """Stop logging until `localgen logs on` (what is logged stays)."""
    from localgen.log import store

    store.set_enabled(False)
    typer.echo("logging is off", err=True)


@logs_app.command("status")
def status() -> None:
    """Whether logging is on, where the log is, and how many exchanges it holds."""
    from localgen.cli.output import plural
    from localgen.log import store

    damage, unread = store.damage(), None
    try:
        counted = plural(store.count() if store.path().exists() else 0, "exchange")
    except store.Damaged as e:  # the damage is where counting reads: still say whether logging is on, and where
        counted, damage = "its exchanges cannot be counted", damage or e.said
    except store.LogError as e:  # a folder, a newer localgen's log: the same, and why on stderr
        counted, unread = "its exchanges cannot be counted", e
    typer.echo(f"logging is {'on' if store.enabled() else 'off'}{' but failing' if damage else ''} · {store.path()} · "
               f"{counted}{f' · damaged: {damage}' if damage else ''}")
    _say_damage(damage)
    if unread is not None:
        from localgen.cli.output import ErrWriter

        ErrWriter().warn(unread.message + (f"; {unread.hint}" if unread.hint else ""))


def _say_damage(damage: str | None = None) -> None:
    """One warning line when the last write found the log damaged (or `damage` says it is): it may still read,
    but nothing is logged."""
    from localgen.log import store

    damage = damage or store.damage()
    if damage:
        from localgen.cli.output import ErrWriter

        ErrWriter().warn(f"the log at {store.path()} is damaged ({damage}): runs are not logged; {store.MOVE_AWAY}")


def _file_name(model: str | None) -> str | None:
    """The file name of the model -m names, here (a run given that file's path is logged by it): `-m smollm2:135m`
    finds `run -m ~/models/SmolLM2-135M-Instruct.Q4_1.gguf` too. None where it names no file here (offline: the
    log is read, nothing is fetched)."""
    if not model:
        return None
    from pathlib import Path

    from localgen.errors import LocalgenError
    from localgen.models import embedded
    from localgen.models.resolve import resolve

    shipped = embedded.EMBEDDED.get(model)
    if shipped is not None:  # a model in packages: its file's name, never assembled for a listing of the log
        return shipped.filename
    try:
        path = resolve(model, offline=True).path
    except (LocalgenError, OSError):
        return None
    return Path(path).name if path else None


def _other_models(model: str | None) -> str:
    """Where -m names no model of the log's: that said, with those it might have meant (`-m smollm2` for
    smollm2:135m: names it begins, then names spelled alike), as run's unknown model says them."""
    if model is None:
        return ""
    import difflib

    from localgen.log import store

    logged = store.models()
    if model in logged:
        return ""
    meant = [n for n in logged if n.lower().startswith(model.lower())][:3] or \
        difflib.get_close_matches(model, logged, n=3, cutoff=0.6)
    return " (the log has no model by that name" + (f"; did you mean {' or '.join(meant)}?)" if meant else ")")
