"""How an answer appears while it streams: thinking dimmed and apart, the answer as live Markdown.

Live Markdown cost stays flat as the answer grows: finished blocks (text before a blank line outside
a code fence) are printed once, for good; only the block being written is re-rendered, at most 12
times a second, cropped to the screen, so tall answers never leave duplicated frames behind.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


class ThinkSplitter:
    """Splits streamed text into ("think", text) and ("answer", text) parts, tags never emitted."""

    def __init__(self) -> None:
        self.state = "start"  # start -> think | answer
        self.pending = ""

    def feed(self, text: str) -> list[tuple[str, str]]:
        """Parts for the new text; a possible partial tag is held back until known."""
        self.pending += text
        out: list[tuple[str, str]] = []
        while self.pending:
            if self.state == "start":
                stripped = self.pending.lstrip()
                if stripped.startswith(THINK_OPEN):
                    self.pending = stripped[len(THINK_OPEN):]
                    self.state = "think"
                elif THINK_OPEN.startswith(stripped):
                    break  # maybe the tag, not yet complete
                else:
                    self.state = "answer"
            elif self.state == "think":
                i = self.pending.find(THINK_CLOSE)
                if i >= 0:
                    if i:
                        out.append(("think", self.pending[:i]))
                    self.pending = self.pending[i + len(THINK_CLOSE):].lstrip("\n")
                    self.state = "answer"
                    continue
                keep = _partial_tail(self.pending, THINK_CLOSE)
                if len(self.pending) > keep:
                    out.append(("think", self.pending[: len(self.pending) - keep]))
                    self.pending = self.pending[len(self.pending) - keep:]
                break
            else:
                out.append(("answer", self.pending))
                self.pending = ""
        return out

    def flush(self) -> list[tuple[str, str]]:
        """Whatever is held back, at the end of the stream."""
        text, self.pending = self.pending, ""
        if not text:
            return []
        return [("think" if self.state == "think" else "answer", text)]


def _partial_tail(text: str, tag: str) -> int:
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def split_blocks(text: str) -> tuple[str, str]:
    """(finished Markdown blocks, the block still being written): split at the last blank line that is
    outside a code fence."""
    in_fence = False
    cut = 0
    pos = 0
    for line in text.splitlines(keepends=True):
        pos += len(line)
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
        elif not in_fence and not line.strip() and pos < len(text):
            cut = pos
    return text[:cut], text[cut:]


class PlainView:
    """Plain text: for pipes, --plain and NO_COLOR. Thinking is shown between markers, or hidden."""

    def __init__(self, out: TextIO, show_think: bool) -> None:
        self.out = out
        self.show_think = show_think
        self.splitter = ThinkSplitter()
        self.mode = ""
        self.last = ""

    def feed(self, text: str) -> None:
        """Write a streamed piece."""
        self._write_parts(self.splitter.feed(text))

    def _write_parts(self, parts: list[tuple[str, str]]) -> None:
        for kind, piece in parts:
            if kind == "think" and not self.show_think:
                continue
            if kind != self.mode:
                if kind == "think":
                    self._w("[thinking]\n")
                elif self.mode == "think":
                    self._w("\n[/thinking]\n")
                self.mode = kind
            self._w(piece)

    def _w(self, s: str) -> None:
        if s:
            self.out.write(s)
            self.out.flush()
            self.last = s[-1]

    def finish(self) -> None:
        """End of the answer."""
        self._write_parts(self.splitter.flush())
        if self.mode == "think":
            self._w("\n[/thinking]\n")
        if self.last and self.last != "\n":
            self._w("\n")


class RichView:
    """A terminal: thinking dimmed, the answer rendered as Markdown as it streams."""

    REFRESH_S = 1 / 12

    def __init__(self, console: Any, show_think: bool, markdown: bool = True) -> None:
        from rich.live import Live

        self.console = console
        self.show_think = show_think
        self.markdown = markdown
        self.splitter = ThinkSplitter()
        self.answer = ""  # the block being written (finished blocks are already printed)
        self.thinking = False
        self.live = Live(console=console, auto_refresh=False, transient=True, vertical_overflow="crop")
        self.live.start()
        self.last_refresh = 0.0

    def feed(self, text: str) -> None:
        """Show a streamed piece."""
        for kind, piece in self.splitter.feed(text):
            self._part(kind, piece)
        now = time.monotonic()
        if now - self.last_refresh >= self.REFRESH_S:
            self._refresh()
            self.last_refresh = now

    def _part(self, kind: str, piece: str) -> None:
        if kind == "think":
            if self.show_think:
                if not self.thinking:
                    self.live.console.print("thinking…", style="dim italic")
                    self.thinking = True
                self.live.console.print(piece, style="dim", end="", markup=False, highlight=False)
            return
        if self.thinking:
            self.live.console.print()
            self.thinking = False
        self.answer += piece
        done, self.answer = split_blocks(self.answer)
        if done.strip():
            self.live.console.print(self._renderable(done))

    def _renderable(self, text: str) -> Any:
        if self.markdown:
            from rich.markdown import Markdown

            return Markdown(text, code_theme="monokai")
        from rich.text import Text

        return Text(text)

    def _refresh(self) -> None:
        if not self.answer.strip():
            self.live.update("", refresh=True)
            return
        # Show only the tail that fits the screen; earlier lines of a tall block appear when it ends.
        height = max(4, self.console.size.height - 2)
        lines = self.answer.splitlines()
        shown = "\n".join(lines[-height:]) if len(lines) > height else self.answer
        self.live.update(self._renderable(shown), refresh=True)

    def finish(self) -> None:
        """Print the last block for good and leave the live region."""
        for kind, piece in self.splitter.flush():
            self._part(kind, piece)
        self.live.update("", refresh=True)
        self.live.stop()
        if self.thinking:
            self.console.print()
        if self.answer.strip():
            self.console.print(self._renderable(self.answer))
        self.answer = ""


def make_view(console: Any | None, plain: bool, show_think: bool) -> Any:
    """RichView on a terminal with rendering on; PlainView otherwise."""
    if console is None or plain:
        return PlainView(sys.stdout, show_think)
    return RichView(console, show_think)
