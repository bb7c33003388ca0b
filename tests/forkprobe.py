"""What a process sees of how it was started, for tests/test_forkserver.py: `python -m tests.forkprobe CODE`
prints its argv, directory, CPUs, LOCALGEN_PROBE, stdin and SIGINT's handler as JSON, writes a line to
stderr from an atexit handler, and exits with CODE (or, for "TERM", kills itself with SIGTERM; for "sleep",
sleeps a minute first; for "tty", see on_a_terminal)."""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import time


def c_getenv(name: str) -> str | None:
    """The C library's view of the environment (what llama.cpp's getenv reads)."""
    import ctypes

    getenv = ctypes.CDLL(None).getenv
    getenv.restype = ctypes.c_char_p
    value = getenv(name.encode())
    return None if value is None else value.decode()


def on_a_terminal() -> None:
    """`tty`: what a process on a pseudo-terminal sees of it, then a prompt, waiting for Ctrl-C (exit 130)."""
    print(json.dumps({"ttys": [os.isatty(fd) for fd in range(3)], "size": tuple(os.get_terminal_size()),
                      "foreground": os.tcgetpgrp(0) == os.getpgrp(), "leader": os.getsid(0) == os.getpid()}))
    try:  # not input(): a SIGINT that lands between its prompt and its read() is only seen after a line comes
        print("> ", end="", flush=True)  # inside: Ctrl-C sent on seeing "> " can land before print returns
        while True:
            time.sleep(0.05)
    except KeyboardInterrupt:
        print("interrupted")
        sys.exit(130)


if sys.argv[1] == "tty":
    on_a_terminal()
atexit.register(lambda: print("atexit ran", file=sys.stderr))
print(json.dumps({
    "argv": sys.argv, "cwd": os.getcwd(), "cpus": sorted(os.sched_getaffinity(0)),
    "env": os.environ.get("LOCALGEN_PROBE"), "c_env": c_getenv("LOCALGEN_PROBE"), "stdin": sys.stdin.read(),
    "sigint": repr(signal.getsignal(signal.SIGINT)), "path0": sys.path[0], "main": __name__,
}))
how = sys.argv[1]
if how == "TERM":
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGTERM)
if how == "sleep":
    time.sleep(60)
sys.exit(int(how))
