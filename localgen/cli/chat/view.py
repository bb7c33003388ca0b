"""ChatView: where a chat's notices go (the Rich console on a terminal, stderr when scripted), what it shows of
each answer (/set think, verbose, markdown), what is attached to the next message, and which tool calls run
without asking."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from localgen.cli.options.knobs import SamplingFlags
from localgen.cli.output import ErrWriter, rich_console, visible


@dataclass
class ChatView:
    """Where a chat's notices go: the Rich console on a terminal, stderr when scripted (stdout carries
    only answers then)."""

    interactive: bool
    plain: bool
    stats: bool
    think: bool = True
    footer: bool = True
    markdown: bool = True
    console: Any = None
    loader: Any = None  # name -> backend, for /model and /load
    sampling: SamplingFlags = field(default_factory=SamplingFlags)  # the flags given, over a loaded chat's /set values
    model_given: bool = False  # -m was typed: /load keeps this model instead of the loaded chat's
    attachments: list[str] = field(default_factory=list)
    media: list[Any] = field(default_factory=list)  # images and audio for the next message (/image, /audio)
    err: ErrWriter = field(default_factory=ErrWriter)
    yes: bool = False  # tool calls run without asking (--yes)
    always: set[str] = field(default_factory=set)  # tools the user allowed for the rest of the chat
    compact: bool | None = None  # --compact / --no-compact, over a loaded chat's own choice (None: not given)
    tools: bool = False  # --functions or --mcp: a model without a chat template is then refused, not said
    rag: Any = None  # --rag: the collection each message's excerpts come from (cli/options/rag.py Rag), or None
    held: Any = None  # the REPL's hold on the terminal between prompts (cli/chat/repl.py Between); None scripted

    def ask(self, question: str) -> str:
        """A question to the user on the terminal (scripted chats never ask: they need --yes); EOFError at Ctrl-D."""
        if self.console is None:
            raise EOFError
        terminal = self.held.terminal if self.held is not None else None
        if terminal is not None:  # the answer is typed as at a shell: echoed, its line edited, ended by Enter
            terminal.restore()
        self.console.print(question, markup=False, end="")
        try:
            return read_answer()
        except BaseException:  # Ctrl-D, Ctrl-C, a signal: the question's line ends, as Enter would end it
            with contextlib.suppress(OSError, ValueError):  # a terminal gone (EIO) never hides why the read ended
                self.console.print()
            raise
        finally:
            if terminal is not None:  # held again (a tool that runs then: a Ctrl-C's `^C` was glued to its notice)
                terminal.off()

    def __post_init__(self) -> None:
        if self.interactive:
            self.console = rich_console(highlight=False, no_color=self.plain, soft_wrap=False)

    def info(self, text: str) -> None:
        """A notice: dim on the terminal; stderr when scripted. Saved text it quotes (a system prompt, a summary,
        an excerpt) shows its control characters escaped on a terminal (output.visible)."""
        if self.console is not None:
            self.console.print(visible(text), style="dim", markup=False)
        else:
            self.err.line(text)

    def compaction(self, session: Any) -> bool:
        """Compaction on or off as --compact / --no-compact say, else as the conversation was saved; a flag given
        is saved with the conversation (a resumed chat goes on compacting)."""
        if self.compact is not None:
            session.compact = self.compact
        return bool(session.compact)

    def warning(self, text: str) -> None:
        """A warning the chat goes on after: yellow on the terminal; stderr when scripted."""
        if self.console is not None:
            self.console.print(visible(f"warning: {text}"), style="yellow", markup=False)
        else:
            self.err.warn(text)

    def error(self, message: str, hint: str | None = None) -> None:
        """An error the chat survives (on a terminal) or ends with (scripted)."""
        if self.console is not None:
            self.console.print(visible(f"error: {message}" + (f" ({hint})" if hint else "")), style="red",
                               markup=False)
        else:
            self.err.error(message, hint)


def summarized(session: Any) -> str:
    """What a resumed or loaded conversation's summary covers, for the line that says it goes on."""
    s = session.summary
    return f" ({covered(s)})" if s is not None else ""


def covered(s: Any) -> str:
    """What a summary stands for: the first N messages, or M of them where the oldest were left out."""
    if s.count < s.covers:
        return f"the first {s.covers:,}: {s.count:,} sent as a summary, the {s.covers - s.count:,} before left out"
    return f"the first {s.covers:,} sent as a summary"


WAKE_S = 0.1  # how often a wait for an answer lets Python run a signal's handler


def read_answer() -> str:
    """A line typed at the terminal, without its newline; EOFError at Ctrl-D. Waited for in slices (select): a
    signal that lands between the question and the read (a SIGTERM: the chat ends) is handled within WAKE_S, where
    input() handles it only once a line comes, its read already begun. Where stdin cannot be waited on (a Windows
    console), input()."""
    import select
    import sys

    try:
        fd = sys.stdin.fileno()
        while not select.select([fd], [], [], WAKE_S)[0]:
            pass
    except (AttributeError, OSError, ValueError):  # no stdin, or one select cannot wait on
        return input()
    line = sys.stdin.readline()
    if not line:
        raise EOFError
    return line.rstrip("\r\n")
