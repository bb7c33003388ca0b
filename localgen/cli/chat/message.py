"""One line of `localgen chat`: a /command, a dropped file to attach, or a message. A message takes what /read,
/image and --rag give it; taken back or failed, it gives its attachments back for the next one."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from typing import Any

from localgen.cli.chat.turn import Hangup, answering, stream, summary_interrupts
from localgen.cli.chat.view import ChatView
from localgen.cli.echo import EchoOff
from localgen.cli.output import plural
from localgen.errors import LocalgenError
from localgen.text import checked


def _no_press() -> None:
    pass


def _command(text: str, runner: Any, view: ChatView, press: Callable[[], None] = _no_press) -> bool:
    """A /command; Ctrl-C while it runs (a /model or /load loading a model) stops it where it is, and the chat
    goes on (it went on to "the message was taken back" about no message, and ended with a traceback). `press`
    raises a Ctrl-C that came as Enter was taken."""
    from localgen.cli.chat.slash import run_command

    try:
        press()
        return run_command(text, runner, view)
    except KeyboardInterrupt:
        if view.held is not None:  # the presses after it (a burst) change nothing
            view.held.end()
        if Hangup.current is not None:  # a SIGTERM or SIGHUP that stopped it inside llama.cpp: the chat ends so
            Hangup.current.check()
        if not view.interactive:
            raise
        view.info(f"(Ctrl-C stopped {text.split()[0]} before it finished)")
        return True


def handle(text: str, runner: Any, view: ChatView, command_ok: bool = True,
           press: Callable[[], None] = _no_press) -> bool:
    """One input: a /command or a message. False to leave. Scripted, an error ends the script. `press` raises a
    Ctrl-C that came as Enter was taken (LineInput.give_press): it stops the command, or takes the message back.
    A SIGTERM or SIGHUP meanwhile stops a message's answer as Ctrl-C would, then ends the chat (Hangup); a command
    it ends at once, unless the command is answering (/retry, /compact): a command may wait on the user or a file,
    which no stop would end."""
    if not text.strip():
        return True
    if command_ok and text.startswith("//"):  # a message that begins with /, written // (a path, a log line): a
        text, command_ok = text[1:], False  # message from here on, answered as one (a SIGTERM saves its turn)
    hangup = Hangup.current
    if hangup is None:
        return _handle(text, runner, view, command_ok, press)
    try:
        with contextlib.nullcontext() if command_ok and text.startswith("/") else answering():
            going = _handle(text, runner, view, command_ok, press)
    except Exception:  # what the stop left (a summary stopped, the terminal closed under the answer, which was
        hangup.check()  # kept): the chat ends as the signal
        raise
    hangup.check()
    return going


def _handle(text: str, runner: Any, view: ChatView, command_ok: bool, press: Callable[[], None]) -> bool:
    before: list[str] = []
    media: list[Any] = []
    held = len(runner.session.messages)  # a Ctrl-C just after start() added the message takes it back too
    try:
        if command_ok and attach_dropped(text, runner, view):  # before commands: a path starts with /; a """ block
            # is sent as it is
            return True
        if command_ok and text.startswith("/"):
            return _command(text, runner, view, press)
        before, media = list(view.attachments), list(view.media)
        press()
        text = checked(text, "the message")
        text = _with_excerpts(text, before, runner, view) if view.rag is not None else "\n\n".join([*before, text])
        view.attachments.clear()
        # the terminal held from Enter on (the answer's screen takes it over): keys typed while the message is
        # made ready are not echoed into the answer's place, and a paste is kept marked for the next prompt
        with EchoOff(for_prompt=True) if view.interactive else contextlib.nullcontext(), \
                summary_interrupts(runner):  # Ctrl-C while a summary is written stops only the summary
            first = runner.start(text, view.media)
        view.media.clear()
    except KeyboardInterrupt:  # Ctrl-C between Enter and the answer (fitting a long history to the window)
        if view.held is not None:  # the presses after it (a burst) change nothing
            view.held.end()
        del runner.session.messages[held:]  # start() takes its message back only where it raised inside it
        if not view.interactive:
            raise
        view.info("(stopped before the answer began; the message was taken back)")
        _attach_again(view, before, media)
        return True
    except LocalgenError as e:
        if not view.interactive:
            raise
        view.error(e.message, e.hint)
        _kept_after_failure(view, before, media, e)
        return True
    if stream(runner, view, first):  # taken back (Ctrl-C before the answer began, a tool's or endpoint's failure)
        _attach_again(view, before, media)
    messages = runner.session.messages
    if view.rag is not None and messages and messages[-1]["role"] != "user" and (view.interactive or view.err.tty):
        from localgen.embeddings.retrieve import sources_line

        view.info(sources_line(view.rag.last))  # (an answer was kept: a question taken back has none)
    return True


def _attach_again(view: ChatView, attachments: list[str], media: list[Any]) -> None:
    """A message taken back gives back what was attached to it: sent again (Up, Enter), it goes with the files, as
    it first did, and /detach drops them."""
    view.attachments[:0] = [a for a in attachments if a not in view.attachments]
    view.media[:0] = [m for m in media if m not in view.media]
    n = len(attachments) + len(media)
    if n:
        view.info(f"(its {plural(n, 'attachment')} stay{'s' if n == 1 else ''} attached for your next message; "
                  f"/detach drops {'it' if n == 1 else 'them'})")


def _kept_after_failure(view: ChatView, before: list[str], media: list[Any], e: LocalgenError) -> None:
    """A message that failed keeps what was attached to it, as one taken back does (its /read files too, which
    were taken off to be sent), and says so; but an attachment the decoder could not read (its header was
    sound) is dropped, and said: attached, it would fail every message after."""
    from localgen.media import MediaError

    view.attachments[:0] = [a for a in before if a not in view.attachments]
    bad: list[Any] = []
    if isinstance(e, MediaError) and media:
        named = [m for m in media if m.source in e.message]
        # the one named, not another whose name is part of its (a.png beside aa.png); none named: all of them
        bad = [m for m in named if not any(m.source != o.source and m.source in o.source for o in named)] or media
        view.media[:] = [m for m in view.media if m not in bad]
    n = len(view.media) + len(view.attachments)
    them = f"stay{'s' if n == 1 else ''} attached"
    if bad:
        kept = f"; {plural(n, 'other attachment')} {them} (/detach drops {'it' if n == 1 else 'them'})" if n else ""
        view.info(f"(dropped {', '.join(m.label() for m in bad)}{kept})")
    elif n and (before or media):
        view.info(f"(its {plural(n, 'attachment')} {them} for your next message; /detach drops "
                  f"{'it' if n == 1 else 'them'})")


def _with_excerpts(question: str, before: list[str], runner: Any, view: ChatView) -> str:
    """--rag: the message with the question's excerpts before it (after what /read attached), those that fit
    the window with the system prompt and room for the answer; the lowest-scoring are left out first, said in
    one line. Older turns leave the window before excerpts do (chat's window, chat/runner.py)."""
    hits = view.rag.search(question)
    limit = int(runner.backend.n_ctx) - runner.reserve()
    head = runner.head()

    def fits(message: str) -> bool:
        return bool(runner.count([*head, {"role": "user", "content": "\n\n".join([*before, message])}]) <= limit)

    return "\n\n".join([*before, view.rag.message(question, hits, fits, view.info)])


def attach_dropped(text: str, runner: Any, view: ChatView) -> bool:
    """A line that is only the path of an image, audio or video file (a file dropped on the terminal) attaches it to
    the next message instead of sending the path as text."""
    from localgen import media
    from localgen.cli.chat.slash import attach_media

    path = media.dropped_path(text)
    if path is None:
        return False
    if not path.is_file():
        if re.match(r"/[a-z]+(\s|$)", text.strip()) or not view.interactive:  # /image a.png: a command, for the
            # commands; a script's line naming no file is its text (./out.png made), as it was before a path attached
            return False
        raise media.MediaError(f"no such file: {path}")  # a dropped file gone: not an unknown /command, nor text
    found = media.read(str(path))
    attach_media(runner, view, found)
    view.info(f"attached {found.label()}: it goes with your next message (/detach drops it)")
    return True
