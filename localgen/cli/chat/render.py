"""How an answer appears while it streams: the answer stage's events (tools/stream.py) shown, thinking
dimmed and apart (or hidden), tool calls and their results as notices, the answer as live Markdown.

Live Markdown cost stays flat as the answer grows: finished blocks (text before a blank line outside
a code fence) are printed once, for good; only the block being written is re-rendered, at most 12
times a second, cropped to the screen, so tall answers never leave duplicated frames behind. Each block
is spaced from the one before it as the whole answer rendered at once would space it (a blank line between
two paragraphs, none between two items of a list): it is rendered after the last block printed, and shown
from where that block's own lines end.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO


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


def chat_markdown(text: str) -> Any:
    """An answer as Markdown on the terminal, its single line breaks kept as breaks (a poem's lines, an address,
    steps written one per line), as chat pages show them (and ours: serve/webui/markdown.js) where plain
    Markdown would run them together into one line; a blank line still ends a paragraph. What looks like HTML
    (`List<String>`, `<div>x</div>`) is shown as the text it is, as our chat page shows it: Rich's Markdown drops
    HTML, and the terminal showed `List` and nothing."""
    from markdown_it.token import Token
    from rich.markdown import Markdown

    md = Markdown(text, code_theme="monokai")

    def as_shown(tokens: list[Any]) -> list[Any]:
        out = []
        for token in tokens:
            if token.type == "softbreak":
                token.type = "hardbreak"
            elif token.type == "html_inline":
                token.type = "text"
            elif token.type == "html_block":  # a paragraph of its text, its lines kept
                inline = Token("inline", "", 0, content=token.content, children=[
                    Token("text", "", 0, content=token.content.rstrip("\n"))])
                out += [Token("paragraph_open", "p", 1), inline, Token("paragraph_close", "p", -1)]
                continue
            if token.children:
                token.children = as_shown(token.children)
            out.append(token)
        return out

    md.parsed = as_shown(md.parsed)
    return md


class PlainView:
    """Plain text: for pipes, --plain and NO_COLOR. Thinking is shown between markers, or hidden; calls and
    results go to `notice` (stderr when scripted)."""

    def __init__(self, out: TextIO, show_think: bool, notice: Callable[[str], None] | None = None) -> None:
        self.out = out
        self.show_think = show_think
        self.notice = notice
        self.mode = ""
        self.last = ""
        from localgen.cli.output import is_terminal

        self.visible = is_terminal(out)  # --plain on a terminal: control characters show escaped; piped, untouched

    def show(self, event: Any) -> None:
        """Write one event of the answer stage."""
        kind, text = _kind(event)
        if kind == "think" and not self.show_think:
            return
        if kind == "line":
            self._close()
            if self.last and self.last != "\n":
                self._w("\n")
            if self.notice is not None:
                self.notice(text)
            else:
                self._w(text + "\n")
            return
        if kind != self.mode:
            if kind == "think":
                self._w("[thinking]\n")
            else:
                self._close()
            self.mode = kind
        self._w(text)

    def _close(self) -> None:
        if self.mode == "think":
            self._w("\n[/thinking]\n")
        self.mode = ""

    def _w(self, s: str) -> None:
        if s:
            from localgen.cli.output import visible

            self.out.write(visible(s) if self.visible else s)
            self.out.flush()
            self.last = s[-1]

    def abort(self) -> None:
        """llama.cpp ends the process mid-answer (native/lib.py last_words): the answer's line ends before the error
        line (which was glued to it)."""
        self.out.write("\n")
        self.out.flush()

    def finish(self) -> None:
        """End of the answer."""
        self._close()
        if self.last and self.last != "\n":
            self._w("\n")
        self.last = ""


def _kind(event: Any) -> tuple[str, str]:
    """("think" | "answer" | "line", text) for an event: a Piece, a ToolCall or a ToolResult."""
    from localgen.cli.output import call_line, result_line
    from localgen.tools.loop import ToolResult
    from localgen.tools.stream import Piece

    if isinstance(event, Piece):
        return ("think" if event.kind == "reasoning" else "answer"), event.text
    if isinstance(event, ToolResult):
        return "line", result_line(event)
    return "line", call_line(event)


class RichView:
    """A terminal: thinking streams dimmed in the live region and is folded to one line once the answer
    begins (`/think` shows it whole); the answer is rendered as Markdown as it streams."""

    REFRESH_S = 1 / 12

    def __init__(self, console: Any, show_think: bool, markdown: bool = True) -> None:
        from rich.live import Live

        self.console = console
        self.show_think = show_think
        self.markdown = markdown
        self.answer = ""  # the block being written (finished blocks are already printed)
        self.before = ""  # the last block printed, right above: the next one is spaced from it as Markdown spaces them
        self._above: tuple[str, int, list[str]] = ("", 0, [])  # `before` rendered (its text, the width, its lines)
        self.thinking = False
        self.reasoning = ""  # this block of thinking, shown live until it is folded
        self.live = Live(console=console, auto_refresh=False, transient=True, vertical_overflow="crop")
        self.live._live_render = _frame(console, self.live.get_renderable())  # (Rich's own, which reflow misleads)
        self.live.start()
        self.last_refresh = 0.0

    def show(self, event: Any) -> None:
        """Show one event of the answer stage."""
        from localgen.cli.output import visible

        kind, text = _kind(event)
        text = visible(text)  # a model's ESC shows as \x1b, never acts on the terminal
        if kind == "line":
            self._flush()
            self.live.console.print(text, style="yellow", markup=False, highlight=False)
        else:
            self._part(kind, text)
        now = time.monotonic()
        if now - self.last_refresh >= self.REFRESH_S:
            self._refresh()
            self.last_refresh = now

    def _part(self, kind: str, piece: str) -> None:
        if kind == "think":
            if self.show_think:
                self.thinking = True
                self.reasoning += piece
            return
        self._fold()
        self.answer += piece
        done, self.answer = split_blocks(self.answer)
        if done.strip():
            self._print(done)

    def _print(self, blocks: str) -> None:
        """Print finished blocks for good, below those printed before."""
        self.live.console.print(self._after(blocks))
        self.before = split_blocks(self.before + blocks)[1] if self.markdown else ""

    def _after(self, text: str) -> Any:
        """`text` rendered as it shows below the last block printed: the two rendered together, from where the
        last block's lines end (so that the space between them is the one Markdown puts there)."""
        if not self.before:
            return self._renderable(text)
        from rich.segment import SegmentLines

        options = self.console.options
        if self._above[:2] != (self.before, options.max_width):  # rendered once per block, not at every refresh
            lines = self.console.render_lines(self._renderable(self.before), options, pad=False)
            self._above = (self.before, options.max_width, [_plain(line) for line in lines])
        above = self._above[2]
        both = self.console.render_lines(self._renderable(self.before + text), options, pad=False)
        if [_plain(line) for line in both[:len(above)]] != above:
            return self._renderable(text)  # the new text changed how the block above renders (a rare reference link)
        return SegmentLines(both[len(above):], new_lines=True)

    def _renderable(self, text: str) -> Any:
        if self.markdown:
            return chat_markdown(text)
        from rich.text import Text

        return Text(text)

    def _fold(self) -> None:
        """The thinking so far becomes one dim line."""
        if self.thinking:
            words = len(self.reasoning.split())
            self.live.update("", refresh=True)
            self.live.console.print(f"▸ thought ({words:,} words) · /think shows it", style="dim italic",
                                    markup=False, highlight=False)
            self.thinking, self.reasoning, self.before = False, "", ""

    def _refresh(self) -> None:
        if self.thinking:
            from rich.text import Text

            height = max(4, self.console.size.height - 2)
            tail = "\n".join(self.reasoning.splitlines()[-(height - 1):])
            self.live.update(Text("thinking…\n" + tail, style="dim"), refresh=True)
            return
        if not self.answer.strip():
            self.live.update("", refresh=True)
            return
        # Show only the tail that fits the screen; earlier lines of a tall block appear when it ends.
        height = max(4, self.console.size.height - 2)
        lines = self.answer.splitlines()
        if len(lines) > height:
            self.live.update(self._renderable("\n".join(lines[-height:])), refresh=True)
        else:
            self.live.update(self._after(self.answer), refresh=True)

    def _flush(self) -> None:
        """Fold the thinking, and print the block being written for good (a notice follows it)."""
        self._fold()
        if self.answer.strip():
            self._print(self.answer)
        self.answer, self.before = "", ""
        self.live.update("", refresh=True)

    def abort(self) -> None:
        """llama.cpp ends the process mid-answer (native/lib.py last_words; on whichever thread it aborts): the block
        being written stays drawn as far as it came, the cursor goes below it, shown again, and the error line that
        follows reaches the terminal there. The live region holds stdout and stderr (Rich's redirection): the line
        was printed above the block, the block drawn again under it, and the process ended with the cursor hidden."""
        from rich.file_proxy import FileProxy

        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if isinstance(stream, FileProxy):
                setattr(sys, name, stream.rich_proxied_file)
        try:
            self._refresh()
        finally:
            self.console.file.write("\n")
            self.console.show_cursor(True)
            self.console.file.flush()

    def finish(self) -> None:
        """Print the last block for good and leave the live region."""
        self._fold()
        self.live.update("", refresh=True)
        self.live.stop()
        if self.answer.strip():
            self.console.print(self._after(self.answer))
        self.answer, self.before = "", ""


def _frame(console: Any, renderable: Any) -> Any:
    """Rich's live region (LiveRender), which also knows how many rows its last frame takes once the window has
    narrowed. A terminal that rewraps its lines then (most do: tmux, GNOME Terminal, Konsole, kitty, iTerm2, Windows
    Terminal) turns each line of the frame wider than the new width into several rows; Rich, moving up as many rows
    as it drew lines to redraw the frame, left the rows above as a stale copy of the block. Growing the window rewraps
    nothing that Rich drew (its lines end in line breaks). xterm and the Linux console cut the lines instead: there
    the frame keeps its rows."""
    import os

    from rich.control import Control
    from rich.live_render import LiveRender
    from rich.segment import ControlType, Segment

    rewraps = bool(os.environ.get("TMUX")) or not (os.environ.get("XTERM_VERSION") or os.environ.get("TERM") == "linux")

    class Frame(LiveRender):  # type: ignore[misc]
        drawn: tuple[int, list[int]] = (0, [])  # the width the frame on the screen was drawn at, and its lines' cells

        def __rich_console__(self, console: Any, options: Any) -> Any:
            cells = [0]
            for segment in super().__rich_console__(console, options):
                if isinstance(segment, Segment) and segment.text == "\n" and not segment.control:
                    cells.append(0)
                elif isinstance(segment, Segment):
                    cells[-1] += segment.cell_length
                yield segment
            self.drawn = (options.max_width, cells)

        def position_cursor(self) -> Any:
            width, (drawn, cells) = console.width, self.drawn
            if not rewraps or width >= drawn or not cells:
                return super().position_cursor()
            rows = sum(max(1, -(-n // width)) for n in cells)  # each line as the terminal rewrapped it
            return Control(ControlType.CARRIAGE_RETURN, (ControlType.ERASE_IN_LINE, 2),
                           *(((ControlType.CURSOR_UP, 1), (ControlType.ERASE_IN_LINE, 2)) * (rows - 1)))

    return Frame(renderable, vertical_overflow="crop")


def _plain(line: list[Any]) -> str:
    """A rendered line's text."""
    return "".join(segment.text for segment in line)


def make_view(console: Any | None, plain: bool, show_think: bool,
              notice: Callable[[str], None] | None = None) -> Any:
    """RichView on a terminal with rendering on; PlainView otherwise."""
    if console is None or plain:
        return PlainView(sys.stdout, show_think, notice)
    return RichView(console, show_think)
