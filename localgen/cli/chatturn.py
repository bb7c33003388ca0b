"""One chat turn on screen: stream an answer as it comes (Ctrl-C cancels it between two tokens), record it,
print its footer; a remote failure keeps a partial answer or takes the question back; restoring a saved
KV state. Used by the chat loops (chatflow.py) and the slash commands (slash.py)."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any


def restore_state(runner: Any, view: Any) -> None:
    """Load the conversation's saved KV state, so the next turn does not re-read the history."""
    conv = runner.sent()
    if not conv:
        return
    reused = runner.backend.restore_conversation(runner.session.name, runner.request(conv))
    if reused:
        view.info(f"restored the KV state of {reused:,} tokens; the history is not re-read")


def stream(gen: Any, runner: Any, view: Any, first: int) -> None:
    """Show one answer as it comes, record it, and print its footer."""
    from localgen.cli.render import make_view

    if first and not runner.trim_noticed:
        view.info(f"(the conversation outgrew the {runner.backend.n_ctx:,}-token context: the oldest turns are no "
                  "longer sent to the model, but stay in the saved conversation; the system prompt is always sent)")
        runner.trim_noticed = True
    from localgen.errors import RemoteError

    out = make_view(view.console if view.markdown else None, view.plain or not view.interactive, view.think)
    with _cancel_on_sigint(gen) as pressed:
        try:
            for chunk in gen:
                out.feed(chunk.text)
        except KeyboardInterrupt:  # a second Ctrl-C: stop even inside a long prompt evaluation
            gen.close()
        except RemoteError as e:  # the endpoint failed: keep what arrived, or take the question back
            out.finish()
            _remote_failed(e, gen, runner, view)
            return
        except BaseException:  # the reader went away, or worse: settle the stream before the engine goes
            gen.close()
            raise
        finally:
            out.finish()
        interrupted = pressed()
    runner.finish(gen)
    s = gen.stats
    if interrupted:
        view.info("(stopped; the partial answer is kept)")
    if s is None:
        return
    footer = _footer(s, runner.backend.n_ctx)
    if view.interactive and view.footer:
        view.info(footer)
    elif not view.interactive and view.stats:
        view.err.line(footer)
    if s.finish_reason == "context":
        view.info("(the answer filled the context window)")


def _remote_failed(e: Any, gen: Any, runner: Any, view: Any) -> None:
    """A partial answer is kept (and said to be partial); with nothing received, the message is taken back
    so that the conversation stays as it was. Scripted, the error then ends the chat."""
    if gen.text:
        runner.finish(gen)
        e.message += " (the partial answer is kept)"
    else:
        runner.session.messages.pop()
    if not view.interactive:
        raise e
    view.error(e.message, e.hint)


@contextlib.contextmanager
def _cancel_on_sigint(gen: Any) -> Iterator[Callable[[], bool]]:
    """First Ctrl-C cancels the answer between two tokens (the screen stays whole); a second raises."""
    presses = 0
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(signum: int, frame: Any) -> None:
        nonlocal presses
        presses += 1
        gen.cancel()
        if presses > 1:
            logs = sys.modules.get("localgen.engine.logs")
            if logs is not None and logs.defer_interrupt(frame):
                return  # raised once llama.cpp returns (engine/logs.py)
            raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGINT, on_sigint)
    except ValueError:  # not the main thread: keep the default behaviour
        yield lambda: False
        return
    try:
        yield lambda: presses > 0
    finally:
        signal.signal(signal.SIGINT, previous)


def _footer(s: Any, n_ctx: int) -> str:
    parts = [f"{s.completion_tokens} tokens"]
    if s.decode_tps:
        parts.append(f"{s.decode_tps:.1f} tok/s")
    if s.ttft_s is not None:
        parts.append(f"first token {s.ttft_s:.2f} s")
    parts.append(f"context {s.prompt_tokens + s.completion_tokens:,}/{n_ctx:,}")
    return " · ".join(parts)
