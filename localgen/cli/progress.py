"""Download progress on stderr: a Rich bar (bytes, rate, ETA) on a terminal, a few plain lines otherwise. A SIGTERM
or SIGHUP while the bar shows (`timeout 1.5 localgen quantize ...`) shows the cursor again, then ends the command
by that signal as before (exit 143 or 129)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from localgen.cli.signals import RestoreOnTerm
from localgen.units import format_bytes


class BarProgress:
    """Rich progress bar."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, DownloadColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn
        from rich.text import Text

        from localgen.cli.output import rich_console

        class Rate(ProgressColumn):
            """The transfer rate in binary units (Rich's own column has decimal MB/s only)."""

            def render(self, task: Any) -> Text:
                speed = task.finished_speed or task.speed
                return Text(f"{format_bytes(speed)}/s" if speed else "?", style="progress.data.speed")

        # sizes and rates in MiB, as every other size localgen prints
        self._p = Progress(
            # a file's name as it is: no Rich markup ([...]) or emoji codes (:x:) read in it
            TextColumn("{task.description}", markup=False), BarColumn(), DownloadColumn(binary_units=True), Rate(),
            TimeRemainingColumn(), console=rich_console(stderr=True), transient=False,
        )
        self._task: Any = None
        self._term = RestoreOnTerm(lambda: cursor_back(self._p.console))

    def start(self, name: str, total: int, done: int) -> None:
        if self._task is None:
            self._term.install()  # before the bar hides the cursor
            self._p.start()
        self._task = self._p.add_task(name, total=total, completed=done)

    def advance(self, n: int) -> None:
        if self._task is not None:
            self._p.advance(self._task, n)

    def finish(self) -> None:
        self._p.stop()
        self._term.uninstall()
        self._task = None

    def note(self, text: str) -> None:
        self._p.console.print(text, style="dim", markup=False)


def cursor_guard(console: Any) -> RestoreOnTerm:
    """A RestoreOnTerm, installed, that shows a Rich bar's cursor again on a SIGTERM or SIGHUP (cursor_back): made
    before the bar starts (which hides the cursor), uninstalled once it stops."""
    term = RestoreOnTerm(lambda: cursor_back(console))
    term.install()
    return term


def cursor_back(console: Any) -> None:
    """A Rich bar (or another live display) cut off by a SIGTERM or SIGHUP (`timeout`, a kill, the terminal closed):
    the cursor it hid is shown again, on the line below it, so the shell's terminal is not left without one (its own
    stop() cannot run there). For RestoreOnTerm (cli/signals.py), which then ends the command as the signal did."""
    if console.is_terminal:
        os.write(console.file.fileno(), b"\n\x1b[?25h")


class LineProgress:
    """Plain lines: the start, every quarter, the end."""

    def __init__(self, say: Callable[[str], None] | None = None) -> None:
        self.name = ""
        self.total = 0
        self.done = 0
        self.next_mark = 25
        self.say = say  # where each line goes (serve's JSON log); None: stderr

    def _line(self, text: str) -> None:
        if self.say is not None:
            self.say(text)
        else:
            print(text, file=sys.stderr, flush=True)

    def start(self, name: str, total: int, done: int) -> None:
        self.name, self.total, self.done = name, total, done
        pct = done * 100 // total if total else 100
        self.next_mark = (pct // 25 + 1) * 25
        if not done:  # a resumed download has said so already, where it resumes and the size (its note)
            self._line(f"{name}: {format_bytes(total)}")

    def advance(self, n: int) -> None:
        self.done += n
        pct = self.done * 100 // self.total if self.total else 100
        while pct >= self.next_mark and self.next_mark < 100:
            self._line(f"{self.name}: {self.next_mark}%")
            self.next_mark += 25

    def finish(self) -> None:
        if self.total and self.done >= self.total:
            self._line(f"{self.name}: done")

    def note(self, text: str) -> None:
        self._line(text)


def make_progress() -> Any:
    """The right progress display for stderr."""
    return BarProgress() if sys.stderr.isatty() else LineProgress()
