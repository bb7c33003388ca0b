"""Writers for stdout (the answer, nothing else) and stderr (status, warnings, stats)."""

from __future__ import annotations

import os
import sys
from typing import TextIO

from localgen.types import Stats


class TextWriter:
    """Streams text to stdout, flushing each chunk; notices a closed pipe instead of raising."""

    def __init__(self, stream: TextIO, enabled: bool = True) -> None:
        self.stream = stream
        self.enabled = enabled
        self.wrote = ""

    def write(self, text: str) -> bool:
        """Write and flush; False once the reader has gone away."""
        if not self.enabled or not text:
            return True
        try:
            self.stream.write(text)
            self.stream.flush()
        except BrokenPipeError:
            silence_stdout()
            return False
        self.wrote = (self.wrote + text)[-1:]
        return True

    def end(self) -> None:
        """End the answer with a newline if it did not end with one."""
        if self.enabled and self.wrote and self.wrote != "\n":
            self.write("\n")


def silence_stdout() -> None:
    # Python flushes stdout again at exit; point it at /dev/null so that flush cannot fail.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def format_stats(s: Stats) -> str:
    """One human line: tokens, rates, time to first token, load and total time, why it stopped."""
    prompt = f"{s.prompt_tokens} prompt tokens"
    if s.cached_tokens:
        prompt += f" ({s.cached_tokens} cached)"
    parts = [prompt, f"{s.completion_tokens} generated"]
    if s.prefill_tps:
        parts.append(f"prefill {s.prefill_tps:,.1f} tok/s")
    if s.decode_tps:
        parts.append(f"decode {s.decode_tps:,.1f} tok/s")
    if s.ttft_s is not None:
        parts.append(f"first token {s.ttft_s:.2f} s")
    parts.append(f"load {s.load_s:.2f} s")
    parts.append(f"total {s.total_s:.2f} s")
    if s.drafted is not None:
        rate = f" ({(s.accepted or 0) / s.drafted:.0%})" if s.drafted else ""
        parts.append(f"drafted {s.drafted}, accepted {s.accepted}{rate}")
    parts.append(f"stop: {s.finish_reason}")
    return " · ".join(parts)


class ErrWriter:
    """stderr: styled on a terminal (unless NO_COLOR), plain text otherwise."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._console = None
        if self.tty:
            from rich.console import Console

            self._console = Console(file=self.stream, highlight=False, soft_wrap=True)

    def _print(self, text: str, style: str | None = None) -> None:
        try:
            if self._console is not None:
                self._console.print(text, style=style, markup=False)
            else:
                print(text, file=self.stream, flush=True)
        except (BrokenPipeError, ValueError):
            pass

    def status(self, text: str) -> None:
        """Progress chatter ("loading ..."): shown only on a terminal, so pipelines stay quiet."""
        if self.tty:
            self._print(text, "dim")

    def line(self, text: str) -> None:
        """A plain informational line."""
        self._print(text, "dim")

    def warn(self, text: str) -> None:
        """A warning, always shown."""
        self._print(f"warning: {text}", "yellow")

    def stats(self, s: Stats) -> None:
        """The stats line."""
        self._print(format_stats(s), "dim")
