"""The terminal while an answer streams: typed keys are not echoed, and Ctrl-C does not throw away output.

The terminal echoes Ctrl-C as `^C` (and any key as itself) where the cursor is; after a full-width line of the
answer's live region that moves the cursor to the next row, the region is then redrawn one row too low, and its
last frame stays on the screen above the answer. Keys typed meanwhile still reach the next prompt; only their
echo is held back. Carriage returns are kept as they are typed, as the prompt's own raw mode keeps them: the
terminal's cooked mode would turn CR into LF (ICRNL), and Alt-Enter (ESC CR) typed ahead would reach the prompt as
ESC LF, which it reads as Enter.

At Ctrl-C a terminal also discards what the program wrote that it has not shown yet (unless NOFLSH): a terminal
that has fallen behind (a busy machine, a slow link) loses frames of the live region and paragraphs printed for
good, and the region's next redraw, which counts the rows it drew last, then erases rows of the answer above it
or leaves rows of an old frame. NOFLSH keeps all of it; the keys typed before Ctrl-C, which the terminal drops
with it, are dropped by drop_typed() instead, from the chat's Ctrl-C handler."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, TextIO


class EchoOff:
    """off() turns the echo of the terminal on `stream` (stdin by default) off, its CR-to-LF mapping, and its
    discarding of output at Ctrl-C; restore() puts them back as they were. Nothing happens where `stream` is not
    a terminal, or the platform has no termios."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream
        self.fd = -1  # the terminal, once off() has changed it
        self.saved: list[Any] | None = None  # the terminal's attributes from before off(), while the echo is off

    def off(self) -> None:
        """Stop echoing keys (a no-op while it is off already)."""
        if self.saved is not None:
            return
        try:
            import termios
        except ImportError:  # no termios (Windows): nothing to turn off
            return
        try:
            fd = (self.stream or sys.stdin).fileno()
            if not os.isatty(fd):
                return
            saved = termios.tcgetattr(fd)
            quiet = list(saved)
            quiet[3] = (saved[3] & ~(termios.ECHO | termios.ECHONL)) | termios.NOFLSH
            quiet[0] = saved[0] & ~(termios.ICRNL | termios.INLCR | termios.IGNCR)  # as the prompt's raw mode
            termios.tcsetattr(fd, termios.TCSANOW, quiet)  # TCSANOW: keys typed ahead are kept
        except (OSError, ValueError, termios.error):  # no descriptor, or the terminal refused: the echo stays on
            return
        self.fd, self.saved = fd, saved

    def drop_typed(self) -> None:
        """At Ctrl-C: drop the keys typed and not yet read, as the terminal does where NOFLSH is off (off() set it,
        so the terminal kept them). Called from a signal handler: it may come just after restore(), when the
        terminal has dropped them itself; dropping what came since costs at most keys typed in that instant."""
        if self.fd < 0:
            return
        import termios

        with contextlib.suppress(OSError, termios.error):  # the terminal is gone: nothing left to drop
            termios.tcflush(self.fd, termios.TCIFLUSH)

    def restore(self) -> None:
        """Echo keys again, as the terminal did before off()."""
        if self.saved is None:
            return
        import termios

        saved, self.saved = self.saved, None
        with contextlib.suppress(OSError, termios.error):  # the terminal is gone: nothing to put back
            termios.tcsetattr(self.fd, termios.TCSANOW, saved)
