"""Chat's slash commands: one table from name to handler. A handler returns False to leave the chat."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localgen import settings
from localgen.cli.chat.view import covered
from localgen.cli.output import plural
from localgen.errors import LocalgenError, UsageError

MAX_ATTACHMENT = 1 << 20
Handler = Callable[[Any, Any, str], bool | None]


def run_command(text: str, runner: Any, view: Any) -> bool:
    """Dispatch one `/command args` line."""
    cmd, _, arg = text.strip().partition(" ")
    slashes = "a message that begins with / is written //: `//usr/lib` sends /usr/lib"
    if "\n" in cmd:  # a paste of lines whose first is a word alone (its newline split the error over two lines)
        raise UsageError(f"a command is one line: {cmd.partition(chr(10))[0]} was followed by more lines",
                         hint=slashes)
    handler = COMMANDS.get(cmd)
    if handler is None:
        raise UsageError(f"unknown command {cmd}; /help lists them", hint=slashes)
    if arg.strip() and cmd in NO_ARGUMENT:  # `/retry 3` is not three retries, nor `/clear now` a question
        raise UsageError(f"{cmd} takes no argument: {arg.strip()!r} was not understood",
                         hint="/help lists the commands")
    return handler(runner, view, arg.strip()) is not False


def _exit(runner: Any, view: Any, arg: str) -> bool:
    return False


def _help(runner: Any, view: Any, arg: str) -> None:
    import textwrap

    from localgen.cli.chat.repl import COMMANDS as HELP
    from localgen.cli.chat.repl import KEYS_HELP

    width = view.console.width - 1 if view.console is not None else None
    for name, meta in HELP.items():  # on a terminal, a long row goes on under its text, never under the names
        row = f"{name:9} {meta}"
        view.info(textwrap.fill(row, width, subsequent_indent=" " * 10, break_long_words=False,
                                break_on_hyphens=False) if width and width > 30 else row)
    if view.interactive:  # scripted, lines are messages (docs/chat.md, Scripted): no keys to press
        view.info(KEYS_HELP)


def _set(runner: Any, view: Any, arg: str) -> None:
    key, _, value = arg.partition(" ")
    value = value.strip()
    empty = value in ('""', "''")  # an empty value written as a shell writes one: `/set stop ""` clears the stop
    if empty:  # strings (it set a stop string of two quote characters), `/set system ""` the system prompt
        value = ""
    if not key or (not value and key != "system" and not empty):
        raise UsageError("usage: /set PARAM VALUE (see /show for the current values)")
    if key == "system":
        runner.session.system = value or None
        view.info("system prompt set" if value else "system prompt removed")
    elif key == "reasoning":
        if value not in ("on", "off", "default"):
            raise UsageError("/set reasoning takes on, off or default (the chat template's own)")
        runner.thinking = None if value == "default" else value == "on"
        view.info(f"reasoning {value}: the template's thinking switch (enable_thinking)"
                  + (" is left as it is" if value == "default" else f" is {value}"))
    elif key == "compact":
        if value not in ("on", "off"):
            raise UsageError("/set compact takes on or off")
        runner.compact = runner.session.compact = value == "on"
        view.info(f"compact {value}: " + ("when the conversation outgrows the window, the model summarizes the "
                                          "oldest turns" if value == "on" else
                                          "the oldest turns are left out when the conversation outgrows the window"))
    elif key in ("think", "verbose", "markdown"):
        if value not in ("on", "off"):
            raise UsageError(f"/set {key} takes on or off")
        setattr(view, {"think": "think", "verbose": "footer", "markdown": "markdown"}[key], value == "on")
        view.info(f"{key} {value}")
    else:
        if settings.field_name(key) is None:  # every name /set takes, its own ones too (settings knows its knobs only)
            names = ", ".join(sorted([*settings.KNOBS, *CHAT_SETTINGS]))
            raise UsageError(f"unknown setting {key!r}{settings.guess(key, CHAT_SETTINGS) or '; /set takes: ' + names}")
        view.info(runner.set(key, value))
    runner.save()


CHAT_SETTINGS = ("system", "reasoning", "compact", "think", "verbose", "markdown")  # /set's own, beside sampling


def _show(runner: Any, view: Any, arg: str) -> None:
    info = runner.backend.describe()["model"]
    session = runner.session
    if info.get("endpoint"):  # a remote model: the server knows its file and quantization, we do not
        view.info(f"model {info['name']} · at {', '.join(info['endpoint'])}")
    else:
        view.info(f"model {info['name']} ({info['quantization']}) · {info['file']}")
    if runner.unsaved:  # its last save failed: the file is behind the conversation
        saved = f"not saved ({runner.unsaved}): {session.path}"
    else:  # nothing is written before the first exchange
        saved = f"saved at {session.path}" if session.path.exists() else f"to be saved at {session.path}"
    view.info(f"conversation {session.name} · {plural(len(session.messages), 'message')} · {saved}")
    view.info(f"system: {session.system or 'none'}")
    view.info(_summary_line(runner))
    view.info(" · ".join(f"{k} {settings.as_text(k, getattr(runner.sampling, k))}" for k in settings.KNOBS))
    view.info(f"think {'on' if view.think else 'off'} · verbose {'on' if view.footer else 'off'} · "
              f"markdown {'on' if view.markdown else 'off'} · compact {'on' if runner.compact else 'off'}")


def _summary_line(runner: Any) -> str:
    """What compaction folded: how many messages the summary stands for, and the summary itself."""
    s = runner.session.summary
    if s is None:
        return "summary: none (nothing compacted)"
    of = f"{s.count:,} of the first {plural(s.covers, 'message')}" if s.count < s.covers else \
        f"the first {plural(s.covers, 'message')}"
    return (f"summary of {of} ({plural(s.compactions, 'compaction')}, "
            f"{plural(s.tokens, 'token')}; the messages stay saved): {s.text}")


def _compact(runner: Any, view: Any, arg: str) -> None:
    """Summarize every exchange but the last N (1) now; a summary that fails changes nothing."""
    from localgen.cli.chat.turn import summary_interrupts

    if arg and not (arg.isascii() and arg.isdigit() and len(arg) < 6):  # "²" is a digit int() refuses
        raise UsageError("usage: /compact [N] (keep the last N exchanges as they are; 1 unless given)")
    keep = int(arg) if arg else 1
    from localgen.cli.chat.turn import answering
    from localgen.compact import NotSmaller

    try:
        with summary_interrupts(runner), answering():  # a SIGTERM stops the summary, then ends the chat
            done = runner.compact_now(keep)
    except NotSmaller as e:  # short turns: their summary is as long
        view.info(f"nothing compacted: {e.message}")
        return
    except LocalgenError as e:
        e.hint = e.hint or "nothing was compacted; the conversation is as it was"
        raise
    if done is None:
        view.info("nothing to compact: " + _why_nothing(runner, keep))
        return
    runner.save()


def _why_nothing(runner: Any, keep: int) -> str:
    """Why /compact KEEP found nothing to fold, in words."""
    exchanges = sum(1 for m in runner.session.messages if m["role"] == "user")
    last = "the last exchange" if keep == 1 else f"the last {keep} exchanges"
    if not runner.session.messages:
        return "the conversation is empty"
    if exchanges <= keep:
        return (f"the conversation has {plural(exchanges, 'exchange')}, and /compact keeps {last} as "
                f"{'it is' if keep == 1 else 'they are'}")
    return f"what comes before {last} is summarized already"


def _system(runner: Any, view: Any, arg: str) -> None:
    if arg:
        runner.session.system = arg
        runner.save()
        view.info("system prompt set")
    else:
        view.info(f"system: {runner.session.system or 'none'}")


def _kept_before_leaving(runner: Any, command: str) -> None:
    """/clear and /load leave the conversation for another: one whose last save failed (a full or read-only disk,
    its name taken by another chat) is saved again first, room may have come back; if that fails too, the command
    is refused, as it would drop the only copy (it did, and the chat still ended with exit 0)."""
    if runner.unsaved is None or not runner.session.messages:
        return
    runner.save(warn=False)
    if runner.unsaved is not None:
        hint = ("/save NAME keeps it under another name; then try again" if runner.unsaved_taken else
                "free some room, or /save NAME to keep it under another name, then try again")
        raise LocalgenError(f"{command} would drop this conversation, which is not saved ({runner.unsaved})",
                            hint=hint)


def _clear(runner: Any, view: Any, arg: str) -> None:
    """A new conversation, as a fresh chat starts one (a name from the clock, claimed at its first save, and its
    own conversation in the log), with the same model, system prompt and /set values: the one cleared stays
    whole in its file (a chat saved by name is never emptied) and in the log."""
    import dataclasses
    import time

    from localgen.chat import session as sessions
    from localgen.cli.chat.turn import save_state
    from localgen.log.store import new_id

    old = runner.session
    if not old.messages:
        view.info("conversation cleared")
        return
    _kept_before_leaving(runner, "/clear")
    save_state(runner)  # its KV state, for a later --resume or /load of it
    now = time.time()
    runner.adopt(dataclasses.replace(old, name=sessions.new_name(), messages=[], settings=dict(old.settings),
                                     summary=None, created=now, updated=now, log_id=new_id(), fresh=True,
                                     auto_named=True, extra={}),
                 runner.sampling)
    view.info(f"conversation cleared: this chat goes on as {runner.session.name} ({old.name} is kept as it was)")


def _undo(runner: Any, view: Any, arg: str) -> None:
    if arg:
        raise UsageError(f"/undo takes no argument (it drops the last exchange): {arg!r} was not understood")
    view.info("last exchange dropped" if runner.session.undo() else "nothing to undo")
    runner.forget()
    runner.save()


def _retry(runner: Any, view: Any, arg: str) -> None:
    from localgen.cli.chat.turn import answering

    with answering():  # a SIGTERM stops the new answer as it stops a message's, and keeps what was said
        _answer_again(runner, view)


def _answer_again(runner: Any, view: Any) -> None:
    from localgen.cli.chat.turn import stream, summary_interrupts

    messages = runner.session.messages
    kept = list(messages)
    if runner.session.pop_answer() is None:
        messages[:] = kept
        raise UsageError("nothing to retry")
    old = kept[len(messages):]  # the answer being replaced: it comes back if the new one fails
    try:
        with summary_interrupts(runner):  # Ctrl-C while a summary is written stops only the summary
            first = runner.prepare()
    except BaseException:
        messages.extend(old)
        raise
    stream(runner, view, first, restore=old)


def _read(runner: Any, view: Any, arg: str) -> None:
    if not arg:
        raise UsageError("usage: /read FILE")
    view.attachments.append(_read_attachment(Path(arg).expanduser()))
    view.info(f"{arg} will be sent with your next message")


def _media(kind: str) -> Handler:
    def attach(runner: Any, view: Any, arg: str) -> None:
        import re

        from localgen import media
        from localgen.regular import not_a_file

        if not arg:
            raise UsageError(f"usage: /{kind} FILE (or an http(s) URL)")
        spec = media.typed_path(arg)
        if spec == "-":  # media.read's stdin: the chat's own input (a script's next lines, the terminal)
            raise UsageError(f"/{kind} takes a file path or an http(s) URL, not - (stdin): the chat reads your "
                             "messages from there", hint=f"save it to a file and give /{kind} its path")
        local = not re.match(r"https?://|data:", spec, re.I)  # as media.read tells them apart
        if local and (what := not_a_file(path := Path(spec).expanduser())) not in (None, "is a folder"):
            # a FIFO would hold the chat until a writer came (deaf to SIGTERM, as /read's was), /dev/zero read 20 MiB
            raise LocalgenError(f"cannot read {path}: it {what} (/{kind} takes a regular file or a URL)")
        found = media.read(spec)
        if found.kind != kind:
            what = {"audio": "audio", "image": "an image", "video": "a video"}[found.kind]
            raise UsageError(f"{arg} is {what}: use /{found.kind}")
        attach_media(runner, view, found)
        view.info(f"{found.label()} will be sent with your next message")

    return attach


def attach_media(runner: Any, view: Any, found: Any) -> None:
    """Keep `found` for the next message, once the model says it can read it (a local model's projector is
    loaded here; a remote endpoint is asked when the message goes)."""
    check = getattr(runner.backend, "check_media", None)
    if check is not None:
        check([found])
    view.media.append(found)


def _detach(runner: Any, view: Any, arg: str) -> None:
    n = len(view.media) + len(view.attachments)
    view.media.clear()
    view.attachments.clear()
    view.info(f"dropped {n} attachment{'s' if n != 1 else ''}" if n else "nothing is attached")


def _save(runner: Any, view: Any, arg: str) -> None:
    from localgen.chat import saved
    from localgen.chat import session as sessions
    from localgen.regular import not_a_file

    if not arg:
        raise UsageError("usage: /save NAME")
    name = sessions.check_name(arg, model_hint=None)  # a name, never a model
    target = saved.chats_dir() / f"{name}.json"
    session = runner.session
    if name != session.name and (kind := not_a_file(target)) is not None:  # never offered to overwrite
        raise LocalgenError(f"cannot save as {name!r}: {target} {kind}, not a saved conversation",
                            hint="pick another name")
    if name != session.name and target.exists():
        if not view.interactive:
            raise UsageError(f"a conversation named {name!r} exists; /save does not overwrite it",
                             hint="pick another name")
        try:
            answer = view.ask(f"A conversation named {name!r} exists. Overwrite it? [y/N] ")
        except EOFError:  # Ctrl-D: no, as Enter is
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            view.info("not saved")
            return
    # the conversation as it was saved until now, for a save that fails: it goes on saving there
    before = (session.name, session.fresh, session.auto_named, runner.unsaved, runner.unsaved_taken)
    if name != session.name:  # a new file is claimed; one the user agreed to overwrite is not
        session.fresh, session.auto_named = not target.exists(), False
    session.name = name
    try:
        written = runner.save(warn=False, empty=True)
    except BaseException:
        session.name, session.fresh, session.auto_named, runner.unsaved, runner.unsaved_taken = before
        raise
    if written is None:  # the file it was saved to until now stays its file: later turns are saved there
        why = runner.unsaved
        session.name, session.fresh, session.auto_named, runner.unsaved, runner.unsaved_taken = before
        view.info(f"not saved: {why}; the chat goes on as {session.name}")
        return
    view.info(f"saved to {written}")


def _load(runner: Any, view: Any, arg: str) -> None:
    from localgen.chat import session as sessions
    from localgen.cli.chat.turn import restore_state, save_state
    from localgen.cli.chat.view import summarized

    if not arg:
        raise UsageError("usage: /load NAME")
    sessions.check_name(arg, model_hint="/model")  # a model's name typed here: /model takes it
    _kept_before_leaving(runner, f"/load {arg}")  # first: /load of this conversation then reads what it saved
    loaded = sessions.ChatSession.load(arg)
    if loaded.log_id is None:  # a file written by hand or by another tool: its answers are logged from now on
        from localgen.log.store import new_id

        loaded.log_id = new_id()
    save_state(runner)
    switching = bool(loaded.model and loaded.model != runner.session.model and not view.model_given)
    backend = view.loader(loaded.model) if switching else runner.backend  # its own model, as --resume takes it
    try:
        _can_read(backend, loaded)
    except BaseException:
        if switching:
            backend.close()
        raise
    if switching:
        runner.switch(backend, loaded.model)
    else:
        loaded.model = runner.session.model
    before = (runner.session, runner.sampling, runner.first, runner.trim_noticed, runner.compact)
    try:  # its own /set values under the command-line flags, as --resume applies them; the chat's grammar stays
        runner.adopt(loaded, view.sampling.params(runner.backend.defaults, loaded.settings,
                                                  grammar=runner.sampling.grammar))
        runner.compact = view.compaction(loaded)  # --compact / --no-compact, else the loaded conversation's own
        restore_state(runner, view)
    except BaseException:  # refused: the chat goes on with the conversation it had (it held the refused one)
        runner.session, runner.sampling, runner.first, runner.trim_noticed, runner.compact = before
        raise
    view.info(f"continuing {loaded.name}: {plural(len(loaded.messages), 'message')}" + summarized(loaded))


def _can_read(backend: Any, loaded: Any) -> None:
    """A WrongModel, before anything changes, where the conversation holds images or audio and the model it would
    go on with reads text only."""
    from localgen.errors import WrongModel
    from localgen.media import has_media

    if has_media(loaded.messages) and hasattr(backend, "projector"):  # (a remote model's server reads them)
        try:
            backend.projector()
        except WrongModel as e:
            raise WrongModel(f"the conversation {loaded.name} holds images or audio, and {e.message}",
                             hint=e.hint) from None


def _model(runner: Any, view: Any, arg: str) -> None:
    if not arg:
        raise UsageError("usage: /model NAME")
    from localgen.chat.runner import has_template
    from localgen.types import GenerationRequest

    backend = view.loader(arg)
    try:
        if has_template(backend):  # a broken one fails now (without one, the conversation goes as plain text)
            backend.render(GenerationRequest(messages=({"role": "user", "content": "hi"},)))
    except BaseException:
        backend.close()
        raise
    runner.switch(backend, arg)
    runner.save()


def _stats(runner: Any, view: Any, arg: str) -> None:
    from localgen.cli.output import format_stats

    view.info(format_stats(runner.last_stats) if runner.last_stats else "no answer yet")


def _context(runner: Any, view: Any, arg: str) -> None:
    used, n_ctx, first = runner.context_used()
    n = len(runner.session.messages)
    window = f" ({n - first:,} in the window)" if first else ""
    if runner.session.summary is not None:
        window = f" ({covered(runner.session.summary)}; {n - first:,} in the window)"
    view.info(f"{used:,} of {n_ctx:,} tokens used ({used * 100 // n_ctx} %) as the next prompt sends the conversation "
              f"(the footer's figure: as the last answer ended, before its turn was closed) · "
              f"{plural(n, 'message')}{window}")


def _read_attachment(path: Path) -> str:
    """The file as the next message's attachment: read only up to one byte past the bound (a huge file is refused
    without reading it whole), UTF-8 as -f reads a file (the line of a bad byte named). Only a regular file is
    opened: a FIFO would block the chat until a writer came, /dev/zero never end."""
    from localgen.regular import Unreadable, read_regular
    from localgen.text import decode

    try:
        data = read_regular(path, MAX_ATTACHMENT)
    except Unreadable as e:
        raise LocalgenError(f"cannot read {path}: {e} (/read takes a regular file)") from None
    except OSError as e:
        raise LocalgenError(f"cannot read {path}: {e.strerror}") from None
    if len(data) > MAX_ATTACHMENT:
        raise LocalgenError(f"{path} is larger than {MAX_ATTACHMENT >> 20} MiB")
    return f"Contents of {path.name}:\n\n{decode(data, str(path))}"


def _think(runner: Any, view: Any, arg: str) -> None:
    said = next((m for m in reversed(runner.session.messages) if m["role"] == "assistant"), None)
    reasoning = said.get("reasoning_content") if said else None
    if not reasoning:
        view.info("the last answer has no thinking")
        return
    from localgen.cli.output import for_terminal, visible

    if view.console is not None:
        view.console.print(visible(reasoning.strip()), style="dim", markup=False, highlight=False)
    else:
        print(for_terminal(reasoning.strip(), sys.stdout))


def _tools(runner: Any, view: Any, arg: str) -> None:
    if runner.toolbox is None:
        view.info("no tools: start the chat with --functions FILE.py or --mcp SERVER")
        return
    if not runner.toolbox.specs:  # it printed nothing
        view.info("no tools are offered now: the MCP servers that gave them have gone" if runner.toolbox.had_tools
                  else "no tools are offered: the MCP servers list none")
        return
    for spec in runner.toolbox.specs:
        params = ", ".join(spec.parameters.get("properties", {}))
        allowed = " (runs without asking)" if view.yes or spec.name in view.always else ""
        view.info(f"{spec.name}({params}){allowed}: {spec.description.splitlines()[0] if spec.description else ''}")


def _sources(runner: Any, view: Any, arg: str) -> None:
    """--rag: the excerpts the last message was sent with, in full, best first."""
    if view.rag is None:
        raise UsageError("/sources shows the excerpts of --rag: start the chat with --rag COLLECTION")
    if not view.rag.last:
        view.info("no excerpts yet: they come with your next message" if not runner.session.messages else
                  "the last message was sent without excerpts")
        return
    for hit in view.rag.last:
        view.info(f"[{hit.id}] (score {hit.score:.3f})\n{hit.text}")


COMMANDS: dict[str, Handler] = {
    "/exit": _exit, "/bye": _exit, "/quit": _exit, "/help": _help, "/?": _help, "/set": _set, "/show": _show,
    "/system": _system, "/clear": _clear, "/undo": _undo, "/retry": _retry, "/read": _read, "/save": _save,
    "/load": _load, "/model": _model, "/stats": _stats, "/context": _context, "/compact": _compact, "/tools": _tools,
    "/think": _think, "/sources": _sources, "/image": _media("image"), "/audio": _media("audio"),
    "/video": _media("video"), "/detach": _detach,
}
NO_ARGUMENT = ("/help", "/?", "/show", "/clear", "/retry", "/detach", "/stats", "/context", "/tools", "/think",
               "/sources")  # /undo says what it does in its own refusal
