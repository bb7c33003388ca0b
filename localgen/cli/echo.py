"""The terminal while an answer streams (`chat`'s turns, `run`'s answer): typed keys are not echoed, and Ctrl-C
does not throw away output.

The terminal echoes Ctrl-C as `^C` (and any key as itself) where the cursor is: in chat, after a full-width line of
the answer's live region that moves the cursor to the next row, the region is then redrawn one row too low, and
its last frame stays on the screen above the answer; in `run`, a key lands inside the answer's text. Keys typed
meanwhile still reach what reads the terminal next (chat's prompt, the shell); only their echo is held back.

At Ctrl-C a terminal also discards what the program wrote that it has not shown yet (unless NOFLSH): a terminal
that has fallen behind (a busy machine, a slow link) loses the text of the answer written last, and in chat frames
of the live region and paragraphs printed for good, whose next redraw, which counts the rows it drew last, then
erases rows of the answer above it or leaves rows of an old frame. NOFLSH keeps all of it; the keys typed before
Ctrl-C, which the terminal drops with it, are dropped by drop_typed() instead, from the command's Ctrl-C handling.
(With echo on, the `^C` echo would also come after all the text pending, or inside the rest of a write the
Ctrl-C interrupted.)

For chat (`for_prompt`), the keys typed during an answer reach its next prompt as they were typed: the terminal's
line editing (ICANON) is off too. In cooked mode, Ctrl-D typed during the answer is an end-of-file the terminal
keeps for the next read; the prompt, which reads in raw mode, then gets a NUL in its place (a key that does
nothing), and a user who pressed Ctrl-D to leave once the answer ends finds the chat still open. With ICANON off,
Ctrl-D stays the key Ctrl-D, and the prompt takes it as it takes Ctrl-D pressed there: on an empty line, the chat
ends. (Ctrl-C still stops the answer: ISIG is left on.) The terminal marks pastes meanwhile (bracketed paste, as the
prompt has it), so a paste typed ahead reaches the prompt as one paste, its newlines kept."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, TextIO

from localgen.cli.signals import RestoreOnTerm


class EchoOff:
    """off() turns the echo of the terminal on `stream` (stdin by default) off, and its discarding of output at
    Ctrl-C; restore() puts them back as they were. With `for_prompt`, keys are kept as they are typed, as chat's
    prompt reads them in its raw mode: carriage returns (the terminal's cooked mode would turn CR into LF (ICRNL),
    and Alt-Enter (ESC CR) typed ahead would reach the prompt as ESC LF, which it reads as Enter), and Ctrl-D,
    Backspace and the other keys cooked mode edits the line with (ICANON: see the module's docstring). Nothing
    happens where `stream` is not a terminal, the process is not in its foreground (a background job would be stopped by
    SIGTTOU), or the platform has no termios. As a context manager: off() on entry, restore() on exit. While it is
    off, a SIGTERM or SIGHUP that would end the command where it is (no handler of the command's own takes it: `run`)
    puts the terminal back first, then ends it as before (exit 143 or 129; cli/signals.py RestoreOnTerm)."""

    def __init__(self, stream: TextIO | None = None, for_prompt: bool = False) -> None:
        self.stream = stream
        self.for_prompt = for_prompt
        self.fd = -1  # the terminal, once off() has changed it
        self.saved: list[Any] | None = None  # the terminal's attributes from before off(), while the echo is off
        self._term = RestoreOnTerm(self.restore)  # SIGTERM, SIGHUP: restore(), then the end they make as before

    def __enter__(self) -> EchoOff:
        self.off()
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

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
            if not os.isatty(fd) or os.tcgetpgrp(fd) != os.getpgrp():
                return
            saved = termios.tcgetattr(fd)
            quiet = list(saved)
            quiet[3] = (saved[3] & ~(termios.ECHO | termios.ECHONL)) | termios.NOFLSH
            if self.for_prompt:
                quiet[0] = saved[0] & ~(termios.ICRNL | termios.INLCR | termios.IGNCR)
                quiet[3] &= ~termios.ICANON
                quiet[6] = list(saved[6])
                quiet[6][termios.VMIN], quiet[6][termios.VTIME] = 1, 0  # (VMIN may share VEOF's slot in cooked mode)
            termios.tcsetattr(fd, termios.TCSANOW, quiet)  # TCSANOW: keys typed ahead are kept
        except (OSError, ValueError, AttributeError, termios.error):  # no descriptor, or the terminal refused
            return
        self.fd, self.saved = fd, saved
        self._term.install()  # a SIGTERM or SIGHUP now would leave the shell's terminal without its echo
        if self.for_prompt:
            _bracketed_paste(fd, True)

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
        self._term.uninstall()
        if self.for_prompt:
            _bracketed_paste(self.fd, False)
        with contextlib.suppress(OSError, termios.error):  # the terminal is gone: nothing to put back
            if os.tcgetpgrp(self.fd) == os.getpgrp():  # put in the background since (Ctrl-Z, bg): the shell's now
                termios.tcsetattr(self.fd, termios.TCSANOW, saved)


def _bracketed_paste(fd: int, on: bool) -> None:
    """Ask the terminal `fd` to mark pastes (ESC[200~ ... ESC[201~) or not. Chat's prompt asks for it while it reads,
    and while an answer streams the held terminal asks for it too: a paste made then reaches the next prompt marked,
    as one message with its newlines, not as a line sent at each of them. Not on a terminal that says it takes no
    escape codes (TERM=dumb: Emacs' shell, a serial console), where they show as text."""
    if os.environ.get("TERM") == "dumb":
        return
    with contextlib.suppress(OSError):
        os.write(fd, b"\x1b[?2004h" if on else b"\x1b[?2004l")
