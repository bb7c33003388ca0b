"""Ctrl-C for long measurements (`tune`, `bench`): the first press is only noted, and the measuring code
acts on it between two measurements, so no exception lands inside a model load or a context's freeing (one
that did crashed the process with SIGSEGV now and then). A second press interrupts at once."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

from localgen.cli.output import ctrl_c_pressed


class Stopped(Exception):
    """Ctrl-C was pressed: raised by the check at the next point between two measurements."""


@contextlib.contextmanager
def stop_on_sigint() -> Iterator[Callable[[], None]]:
    """Yields the check to call between two measurements: it raises Stopped once Ctrl-C was pressed."""
    presses = 0
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(signum: int, frame: Any) -> None:
        nonlocal presses
        presses += 1
        if presses == 1:
            ctrl_c_pressed()
        if presses > 1:
            logs = sys.modules.get("localgen.native.logs")
            if logs is not None and logs.defer_interrupt(frame):
                return  # raised once llama.cpp returns (native/logs.py)
            raise KeyboardInterrupt

    def check() -> None:
        if presses:
            raise Stopped

    try:
        signal.signal(signal.SIGINT, on_sigint)
    except ValueError:  # not the main thread: Ctrl-C keeps its default behaviour
        yield check
        return
    try:
        yield check
    finally:
        signal.signal(signal.SIGINT, previous)
