"""Ctrl-C at any moment of a command's start (while Typer, Rich and the command's modules are imported, the model
loaded): one "interrupted" line and exit 130, never a traceback (README's exit codes; docs/run.md). A press before
the entry module is imported (Python's own start-up, some 40 ms) is Python's, outside localgen's reach: each
process here says on a descriptor of its own when main() has begun, and the presses come after that."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, default_sigint

# the console script's own two lines, with a byte on descriptor READY_FD once main() has begun (a press between the
# byte and main's first line, when the byte was written before the call, was this script's, not localgen's)
SCRIPT = ("import os, sys\nimport localgen.cli.main as entry\nfd = int(os.environ.pop('READY_FD'))\n"
          "real = entry._main\n"
          "def began(argv):\n    os.write(fd, b'.')\n    os.close(fd)\n    return real(argv)\n"
          "entry._main = began\nsys.exit(entry.main())\n")
DELAYS = (0.0, 0.005, 0.01, 0.02, 0.04, 0.07, 0.1, 0.15, 0.2, 0.3, 0.5)  # after the import


@pytest.mark.parametrize("delay", DELAYS)
def test_ctrl_c_during_start_is_one_line_and_exit_130(cli_env: dict[str, str], delay: float) -> None:
    ready_r, ready_w = os.pipe()
    p = subprocess.Popen([sys.executable, "-c", SCRIPT, "run", "-p", "Write a long story.", "-n", "200",
                          "--temperature", "0"], env={**cli_env, "READY_FD": str(ready_w)}, cwd=str(ROOT),
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         pass_fds=(ready_w,), preexec_fn=default_sigint)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b".", "the process ended before it imported localgen.cli.main"
    finally:
        os.close(ready_r)
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert p.returncode == 130, (p.returncode, err)
    assert err.strip() == "interrupted", err


# a press whose KeyboardInterrupt is raised inside a weakref callback: as one of importlib's module locks going away
# while a module is imported (a fresh clone's CI once saw it, at 0.02 s)
LOST_IN_CALLBACK = ("import os, signal, sys, weakref\nfrom localgen.cli.signals import keep_ctrl_c\n"
                    "if sys.argv[1] == 'kept':\n    keep_ctrl_c()\n"
                    "class Box:\n    pass\nbox = Box()\n"
                    "def gone(ref):\n    os.kill(os.getpid(), signal.SIGINT)\n    sum(range(100000))\n"
                    "ref = weakref.ref(box, gone)\n"
                    "try:\n    del box\n    sum(range(10000000))\n    print('went on')\n"
                    "except KeyboardInterrupt:\n    print('taken')\n")


@pytest.mark.parametrize("kept", [True, False])
def test_a_press_raised_inside_a_weakref_callback_reaches_the_command(kept: bool) -> None:
    p = subprocess.run([sys.executable, "-c", LOST_IN_CALLBACK, "kept" if kept else "python's own"], cwd=str(ROOT),
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, preexec_fn=default_sigint)
    if kept:
        assert (p.stdout, p.stderr, p.returncode) == ("taken\n", "", 0)
    else:  # what Python does alone: the press is printed as "ignored", and the program goes on
        assert p.stdout == "went on\n" and "Exception ignored" in p.stderr and "KeyboardInterrupt" in p.stderr
