"""One chat turn on screen: stream an answer as it comes (Ctrl-C cancels it between two tokens), with each
tool call shown, asked for (y / n / always) and its result shown; record it, print its footer; a remote
failure keeps a partial answer or takes the question back, a tool's failure takes it back; restoring a
saved KV state, and saying how much of the history it keeps ready. Used by the chat loops (loop.py) and the
slash commands (slash.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

from localgen.cli.echo import EchoOff
from localgen.cli.options.tools import call_cut_note
from localgen.cli.signals import sigint_taken_by

EXACT_SLACK = 71  # the most tokens of a reused prompt evaluated again for exactness (engine/tokens.py reusable_prefix)


def restore_state(runner: Any, view: Any) -> None:
    """Load the conversation's saved KV state, so the next turn does not re-read the history up to the last
    answer (never with --no-prompt-cache). The state is what the last turn evaluated as its prompt: the answer
    generated after it is evaluated again with the next message, as in a chat that never stopped (a generated
    token is never reused: engine/tokens.py, reusable_prefix), and the notice says so with its size, where the
    footer goes (_show_footer: on the terminal, or scripted with --stats; a script's stderr stays quiet)."""
    conv = runner.sent()
    if not conv or not runner.prompt_cache:
        return
    from localgen.errors import ContextOverflowError, TemplateError

    request = runner.request(conv)
    try:
        if int(runner.backend.count(request)) > int(runner.backend.n_ctx) - runner.reserve():
            return  # with the answer's room, the next turn leaves the oldest turns out: the state's prefix is not sent
        reused = runner.backend.restore_conversation(runner.session.name, request)
    except (ContextOverflowError, TemplateError):  # a history the window (or the template's 4 MiB) cannot hold by
        return  # its size: no state of it applies
    if not reused or not (view.footer if view.interactive else view.stats):
        return
    kept = f"{reused:,} tokens of the history kept ready from the last time"
    rest = int(runner.backend.count(request)) - reused  # the conversation as rendered now, past the state
    if rest <= 0:
        view.info(f"{kept}: none of them is read again")
        return
    what = "the last answer" if conv[-1]["role"] == "assistant" else "the rest of the history"
    again = min(EXACT_SLACK, reused)  # a small state is evaluated again whole, never more than it holds
    view.info(f"{kept}: the next message reads again {what} ({rest:,} tokens) and at most {again:,} tokens before it")


def save_state(runner: Any) -> None:
    """Keep the conversation's KV state for a later --resume or /load (never with --no-prompt-cache); at the chat's
    end, the conversation too where an interrupt cut its last save short (ChatRunner.save_behind)."""
    runner.save_behind()
    if runner.prompt_cache:
        with contextlib.suppress(OSError):  # a cache: losing it costs time, never data
            runner.backend.save_conversation(runner.session.name)


@contextlib.contextmanager
def summary_interrupts(runner: Any) -> Iterator[None]:
    """While a turn is prepared: Ctrl-C during a summary stops only the summary (the turn goes on, leaving the
    oldest turns out); at any other moment it raises KeyboardInterrupt as before (the message is taken back)."""
    def on_sigint(signum: int, frame: Any) -> None:
        if runner.summarizing:
            runner.stop_summary()
            return
        logs = sys.modules.get("localgen.native.logs")
        if logs is not None and logs.defer_interrupt(frame):
            return  # raised once llama.cpp returns (native/logs.py): a handler that stops decodes must defer
        raise KeyboardInterrupt

    with sigint_taken_by(on_sigint):
        yield


def stream(runner: Any, view: Any, first: int, restore: list[Any] | None = None) -> bool:
    """Show one answer as it comes (with the tools it calls, each asked for first unless allowed), record
    it, and print its footer. A tool's failure takes the whole turn back: the question goes, or, for
    /retry, the answer it replaced (`restore`) comes back. True when the turn was taken back."""
    from localgen.cli.output import ReaderGone
    from localgen.errors import RemoteError, ToolError
    from localgen.tools.loop import Turn

    if first and not runner.trim_noticed:
        view.info(f"(the conversation outgrew the {runner.backend.n_ctx:,}-token context: the oldest turns are no "
                  "longer sent to the model, but stay in the saved conversation; the system prompt is always sent)")
        runner.trim_noticed = True
    screen = _Screen(view)
    turn = Turn()
    runner.stopping = False  # before Ctrl-C is ours: a press from now on stops this turn, even before it begins
    if Hangup.current is not None and Hangup.current.signum:  # a SIGTERM while the turn was prepared: it stops too
        runner.stop()
    from localgen.native.lib import last_words

    with _cancel_on_sigint(runner, view, screen.drop_typed) as presses, last_words(screen.aborted):
        try:
            screen.hold()
            try:
                runner.reply(screen.show, lambda call: _approve(call, runner, view, screen), turn)
            finally:
                presses.settle()  # from here on a press cannot cut the turn's record and save short
        except KeyboardInterrupt:  # a second Ctrl-C: stop even inside a long prompt evaluation
            if runner.gen is not None:
                runner.gen.close()
        except RemoteError as e:  # the endpoint failed: keep what arrived, or take the question back
            screen.finish()
            return _remote_failed(e, turn, runner, view, restore)
        except ToolError as e:  # nothing of the turn is kept: the question is taken back
            screen.finish()
            _take_back(runner, restore)
            if not view.interactive:
                raise
            view.error(e.message, e.hint or "the message was taken back; the conversation is as it was")
            return True
        except (ReaderGone, OSError):  # stdout's reader went away (`| head -1`), its disk is full or its terminal
            _keep_what_was_said(runner, turn)  # closed: the chat ends, and keeps what was said, as Ctrl-C keeps
            raise  # a partial answer
        except BaseException:  # worse: settle the stream before the engine goes
            if runner.gen is not None:
                runner.gen.close()
            raise
        finally:
            try:
                screen.finish()
            except (ReaderGone, OSError):  # the answer's last lines could not go (a terminal closed under it)
                _keep_what_was_said(runner, turn)
                raise
        return _settle(runner, view, turn, screen, presses.count > 0 or runner.stopping, restore,
                       lambda: presses.count > 0)


def _settle(runner: Any, view: Any, turn: Any, screen: _Screen, interrupted: bool, restore: list[Any] | None,
            pressed: Any = lambda: False) -> bool:
    """The answer over: the turn recorded and saved, and its footer printed (or, stopped before a word was said, the
    message taken back). Ctrl-C is still the turn's here (_Presses.settle): the presses of a burst that stopped the
    answer, which go on after it ends, cannot stop the save half-way (the conversation's file would lack the turn
    while the chat holds it). True when the turn was taken back."""
    if interrupted and not turn.results and not any(m.get("content") or m.get("reasoning_content")
                                                    for m in turn.messages):
        _take_back(runner, restore)  # stopped before a word was said: as if the message had not been sent
        view.info("(stopped before the answer began; the message was taken back)" if restore is None else
                  "(stopped before the new answer began; the answer it was to replace is kept)")  # /retry
        if not view.interactive:  # scripted: Ctrl-C ends the script (130), not only this answer
            _end_script(view)
        return True
    runner.record(turn)
    if not view.interactive and not screen.answered:
        sys.stdout.write("\n")  # an empty answer still ends with a line break: one line an answer, piped
        sys.stdout.flush()
    s = runner.last_stats
    if interrupted:
        view.info("(stopped; the partial answer is kept)")
    if s is not None:
        _show_footer(s, turn, runner, view)
    # scripted: the answer is kept, and Ctrl-C ends the script (130), one pressed while the turn was saved too
    if (interrupted or pressed()) and not view.interactive:
        _end_script(view)
    return False


def _keep_what_was_said(runner: Any, turn: Any) -> None:
    """The turn as far as it went, recorded and saved where its output could not be written (once: a turn whose
    messages are the conversation's last already is not added again)."""
    if runner.gen is not None:
        runner.gen.close()
    said = runner.session.messages
    if turn.messages and said[len(said) - len(turn.messages):] != turn.messages:
        runner.record(turn)
    elif not turn.messages:  # nothing said yet: the message start() took is saved as it is
        runner.save()


def _end_script(view: Any) -> None:
    """Ctrl-C in a scripted chat ends the script, as it ends `run --file`: one "interrupted" line, exit 130 (the
    chat's own Ctrl-C handler took the signal, so the exit would not know to say it). A SIGTERM or SIGHUP that
    stopped the answer ends it as that signal (Hangup)."""
    if Hangup.current is not None:
        Hangup.current.check()
    view.err.interrupted()
    raise KeyboardInterrupt


class Hangup:
    """SIGTERM and SIGHUP (a kill, the terminal closed) end the chat as the exit signal it is (128 + its number),
    the conversation kept: an answer under way stops between two tokens as at Ctrl-C, and its turn (the message
    and the partial answer) is saved before the chat ends; anywhere else the chat ends at once, saved as it is
    (start's save_state). A context manager: the previous handlers come back at its end."""

    current: Hangup | None = None  # the chat's, for handle()

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.signum = 0
        self.answering = False
        self.asking = False  # a tool call's question waits for the user
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Hangup:
        for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if sig is None:  # no SIGHUP (Windows)
                continue
            if signal.getsignal(sig) is signal.SIG_IGN:  # `nohup`: the user asked for the chat to outlive it
                continue
            with contextlib.suppress(ValueError):  # not the main thread: left as they are
                self._previous[sig] = signal.signal(sig, self._on_signal)
        Hangup.current = self
        return self

    def __exit__(self, *exc: object) -> None:
        Hangup.current = None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.signum = signum
        if self.answering:
            self.runner.stop()  # the answer ends at its next token; handle() then ends the chat
            if self.asking or getattr(self.runner.gen, "opening", False):  # a tool call's question: declined as at
                raise KeyboardInterrupt  # Ctrl-C there (_approve); an endpoint not begun: taken back, as at Ctrl-C
            return
        logs = sys.modules.get("localgen.native.logs")
        if logs is not None and logs.defer_interrupt(frame):  # inside llama.cpp (a /model loading): stopped as at
            return  # Ctrl-C once it returns, and handle() then ends the chat (an exception cannot cross its frames)
        self._exit()  # at the prompt, or a command waiting (a question, a file): the chat ends now

    def check(self) -> None:
        """End the chat where a signal came while it answered (the turn is saved by now)."""
        if self.signum:
            self._exit()

    def _exit(self) -> None:
        if self.signum == getattr(signal, "SIGHUP", None):  # the terminal is gone: what stdout holds can go nowhere
            from localgen.cli.output import silence_stdout

            silence_stdout()
        _drop_typed()
        raise SystemExit(128 + self.signum)


def _typed_ahead() -> bool:
    """Whether keys typed into the chat's terminal wait unread (FIONREAD)."""
    try:
        import fcntl
        import struct
        import termios
    except ImportError:  # Windows
        return False
    try:
        fd = sys.stdin.fileno()
        if not os.isatty(fd):
            return False
        return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]) > 0
    except (OSError, ValueError, AttributeError):
        return False


def _drop_typed() -> None:
    """The keys typed into the chat and not read (during an answer the signal stopped) are dropped, as at Ctrl-C:
    they would reach the shell after the chat ends, and run there. On a terminal in the foreground only."""
    try:
        import termios
    except ImportError:  # no termios (Windows)
        return
    with contextlib.suppress(OSError, ValueError, AttributeError, termios.error):  # no stdin, the terminal gone
        fd = sys.stdin.fileno()
        if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():  # from the background, tcflush would stop us
            termios.tcflush(fd, termios.TCIFLUSH)


@contextlib.contextmanager
def answering() -> Iterator[None]:
    """While an answer (or a summary) is made: a SIGTERM or SIGHUP stops it between two tokens, and the chat ends
    once its turn is saved (Hangup); elsewhere (a command waiting for a file or an answer) it ends the chat at once."""
    hangup = Hangup.current
    if hangup is None:
        yield
        return
    was, hangup.answering = hangup.answering, True
    try:
        yield
    finally:
        hangup.answering = was


def _show_footer(s: Any, turn: Any, runner: Any, view: Any) -> None:
    """The turn's footer: on the terminal (unless /set verbose off), or on stderr when scripted with --stats."""
    footer = _footer(s, runner.last_context, runner.backend.n_ctx)
    if len(turn.generations) > 1:
        declined = sum(1 for r in turn.results if r.declined)
        footer = (f"{len(turn.results)} tool call{'s' if len(turn.results) != 1 else ''}"
                  + (f" ({declined} declined)" if declined else "") + " · " + footer)
    if view.interactive and view.footer:
        view.info(footer)
    elif not view.interactive and view.stats:
        view.err.line(footer)
    if s.finish_reason == "context":
        view.info("(the answer filled the context window)")
    note = call_cut_note(s.finish_reason, turn, runner.sampling.max_tokens) if runner.toolbox is not None else None
    if note is not None:
        view.warning(note)


class _Screen:
    """The answer's view, made anew after each question to the user (a live region cannot span a prompt). While
    it holds the terminal, typed keys are not echoed (cli/echo.py): an echoed `^C` would break the answer's lines."""

    def __init__(self, view: Any) -> None:
        self.view = view
        self.out: Any = None
        self.echo = EchoOff(for_prompt=True) if view.interactive else None
        self.answered = False  # some of the answer's text was shown (not only thinking or tool calls)

    def hold(self) -> None:
        """Take the terminal: from the question sent to the answer's end, or to the next question to the user."""
        if self.echo is not None:
            self.echo.off()

    def show(self, event: Any) -> None:
        from localgen.cli.chat.render import make_view
        from localgen.tools.stream import Piece

        if self.out is None:
            self.hold()
            v = self.view
            self.out = make_view(v.console if v.markdown else None, v.plain or not v.interactive, v.think, v.info)
        self.out.show(event)
        if isinstance(event, Piece) and event.kind == "content" and event.text:
            self.answered = True

    def aborted(self) -> None:
        """llama.cpp ends the process (an RPC server gone mid-answer): the echo comes back and the answer ends before
        its error line (which was glued to the answer, the terminal left without echo): render.py's abort()."""
        if self.echo is not None:
            self.echo.restore()
        if self.out is not None:
            with contextlib.suppress(OSError, ValueError):
                self.out.abort()

    def drop_typed(self) -> None:
        """Ctrl-C: the keys typed before it go, as a terminal drops them (cli/echo.py keeps what was written)."""
        if self.echo is not None:
            self.echo.drop_typed()

    def finish(self) -> None:
        if self.out is not None:
            self.out.finish()
            self.out = None
        if self.echo is not None:
            self.echo.restore()


_REPLIES = ("y", "yes", "n", "no", "a", "always", "")  # to a tool call's question: "" is Enter, a no


def _approve(call: Any, runner: Any, view: Any, screen: _Screen) -> bool:
    """Whether a tool call may run: yes with --yes or "always" for this tool; otherwise the user is asked
    (y / n / a; Enter declines), again after any other reply (a question typed there by mistake must not
    decline the call). Ctrl-C or Ctrl-D at the question declines the call and stops the answer; so does a SIGTERM or
    SIGHUP, which then ends the chat (Hangup)."""
    if runner.stopping:
        return False
    if view.yes or call.name in view.always:
        return True
    screen.finish()
    if _typed_ahead():  # a line typed while the call was written would answer the question unseen (a `y` ran a
        _drop_typed()  # call the `n` on the screen then declined, and each answer went to the next question)
        view.info("(what you typed during the answer was dropped: a tool call's question takes only what is typed "
                  "at it)")
    previous = signal.getsignal(signal.SIGINT)
    hangup = Hangup.current
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if hangup is not None:
            hangup.asking = True
        question = f"run {call.name}? [y]es / [n]o / [a]lways for {call.name}: "
        while (word := view.ask(question).strip().lower()) not in _REPLIES:
            view.info("answer y, n or a (Enter declines)")
    except (KeyboardInterrupt, EOFError):
        word = ""
        runner.stop()
    finally:
        if hangup is not None:
            hangup.asking = False
        signal.signal(signal.SIGINT, previous)
    if word in ("a", "always"):
        view.always.add(call.name)
        return True
    return word in ("y", "yes")


def _take_back(runner: Any, restore: list[Any] | None) -> None:
    """The conversation as it was before the turn."""
    if restore is None:
        runner.session.messages.pop()
    else:
        runner.session.messages.extend(restore)


def _remote_failed(e: Any, turn: Any, runner: Any, view: Any, restore: list[Any] | None) -> bool:
    """A partial answer is kept (and said to be partial); with nothing received, the message is taken back
    so that the conversation stays as it was. Scripted, the error then ends the chat. True when taken back."""
    if turn.messages:
        runner.record(turn)
        e.message += " (the partial answer is kept)"
    else:
        _take_back(runner, restore)
    if not view.interactive:
        raise e
    view.error(e.message, e.hint)
    return not turn.messages


class _Presses:
    """Ctrl-C during one answer: the first cancels it between two tokens (the screen stays whole; an endpoint's
    stream waiting for its next piece ends then too); a second raises, to stop even inside a long prompt evaluation,
    until settle(): once the answer is over, while its turn is recorded and saved and its footer printed, a press
    only stops what is left of the turn. A first press raises too while an endpoint has not begun to answer (nothing
    on screen yet, and no stream to end). Each drops the keys typed before it (`drop_typed`)."""

    def __init__(self, runner: Any, drop_typed: Callable[[], None]) -> None:
        self.runner = runner
        self.drop_typed = drop_typed
        self.count = 0
        self.settled = False

    def settle(self) -> None:
        self.settled = True

    def __call__(self, signum: int, frame: Any) -> None:
        self.count += 1
        self.drop_typed()
        self.runner.stop()
        if (self.count > 1 or getattr(self.runner.gen, "opening", False)) and not self.settled:
            logs = sys.modules.get("localgen.native.logs")
            if logs is not None and logs.defer_interrupt(frame):
                return  # raised once llama.cpp returns (native/logs.py)
            raise KeyboardInterrupt


@contextlib.contextmanager
def _cancel_on_sigint(runner: Any, view: Any, drop_typed: Callable[[], None]) -> Iterator[_Presses]:
    """Ctrl-C is the answer's (_Presses) until the turn is recorded and its footer printed; then, on a terminal, the
    presses until the next prompt (the rest of a burst) change nothing (repl.py Between)."""
    presses = _Presses(runner, drop_typed)
    with sigint_taken_by(presses):
        try:
            yield presses
        finally:
            if view.held is not None:
                view.held.end()


def _footer(s: Any, used: int, n_ctx: int) -> str:
    """The turn's tokens (over all its rounds), decode rate and time to first token; the window in use now."""
    from localgen.cli.output import plural

    parts = [plural(s.completion_tokens, "token")]
    if s.decode_tps:
        parts.append(f"{s.decode_tps:.1f} tok/s")
    if s.ttft_s is not None:
        parts.append(f"first token {s.ttft_s:.2f} s")
    parts.append(f"context {used:,}/{n_ctx:,}")
    return " · ".join(parts)
