"""`localgen run` stopped by Ctrl-C on a terminal that has fallen behind the answer (a busy machine, a slow link):
every byte of the answer written before the press reaches the screen, what is typed is not echoed into it, and
the keys typed before the press go, as a terminal drops them (docs/run.md, "Exit codes and errors").

At Ctrl-C a pty throws away the output it holds that the terminal has not read yet, unless NOFLSH is set; and a
write waiting on a full pty when Ctrl-C lands ends short, and an unbuffered Python (`python -u`,
PYTHONUNBUFFERED=1) dropped the rest of its text. The console script from the venv's bin/, as a user runs it, on
a real pty, in a shell's environment and with PYTHONUNBUFFERED=1. How far the terminal lags is counted in bytes
(/proc/PID/io, /proc/PID/syscall), never in time, so a busy machine makes no difference."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Any

import pexpect
import pytest

from tests import terminal
from tests.conftest import ROOT, SAFETY_NET_S
from tests.test_user_processes import BIN, as_user, user_env

ARGS = ["run", "--temperature", "0", "-n", "300", "--ignore-eos", "Write a long story about a river."]
# what a pty takes on before Ctrl-C can throw any of it away: the terminal's side reads it into a buffer of 4 KB
# (n_tty's), which Ctrl-C leaves alone; the test writes it, as the output the terminal has not read yet
BEHIND = 4096
PENDING = 400  # the answer's bytes written behind those before the press: some 90 tokens
MODES = {"a shell's environment": {}, "PYTHONUNBUFFERED=1": {"PYTHONUNBUFFERED": "1"}}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("run-ctrl-c")


@pytest.fixture(scope="module")
def answer(home: Path) -> str:
    """The whole answer, piped: at temperature 0 the run on the terminal writes the same, up to its Ctrl-C."""
    done = subprocess.run([str(BIN), *ARGS], env=user_env(home), cwd=home, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=SAFETY_NET_S, preexec_fn=as_user)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.encode()) > 2 * PENDING, done.stdout
    return done.stdout


def spawn(home: Path, mode: str, program: str, args: list[str]) -> tuple[Any, io.StringIO]:
    """`program ARGS` on a pty of 40 x 120, and the log of all it writes there."""
    env = user_env(home, TERM="xterm", **MODES[mode])
    child = pexpect.spawn(program, args, env=env, cwd=str(home), encoding="utf-8", timeout=SAFETY_NET_S,
                          dimensions=(40, 120), preexec_fn=as_user)
    child.logfile_read = log = io.StringIO()
    return child, log


def begins(answer: str) -> str:
    """The answer's first words, as the terminal shows them."""
    first = answer.split("\n")[0][:20]
    assert len(first) == 20, answer
    return first


def screen_text(log: io.StringIO) -> str:
    """What was written to the terminal, its line ends as written (a pty writes "\\n" as "\\r\\n"), without the
    NULs the test wrote into the pty itself, the styles of stderr's lines, and a `^C` a terminal echoing keys
    shows where Ctrl-C was pressed."""
    text = log.getvalue().replace("\r\n", "\n").replace("\0", "").replace("^C", "")
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def shown_answer(text: str, answer: str) -> str:
    """The answer on the screen, from its first words to the "interrupted" line, which is a prefix of the whole
    answer (and the line break `run` ends it with, taken off)."""
    shown = text[text.index(begins(answer)):text.index("interrupted\n")]
    if not answer.startswith(shown):
        assert shown.endswith("\n"), shown
        shown = shown[:-1]
    assert answer.startswith(shown), f"the screen shows other text than the answer:\n{shown!r}\n{answer!r}"
    return shown


def write_into(pid: int, data: bytes, nonblocking: bool = False) -> int:
    """Write `data` into the terminal of the process `pid` (its stdout), as if that process had: the output the
    terminal has not read yet."""
    fd = os.open(f"/proc/{pid}/fd/1", os.O_WRONLY | os.O_NOCTTY | (os.O_NONBLOCK if nonblocking else 0))
    try:
        return os.write(fd, data)
    finally:
        os.close(fd)


@pytest.mark.parametrize("mode", MODES)
def test_ctrl_c_shows_all_of_the_answer_a_lagging_terminal_had_not_shown(home: Path, answer: str,
                                                                          mode: str) -> None:
    """The terminal reads nothing more once the answer streams, and falls behind by 4 KB and then PENDING bytes of
    the answer: Ctrl-C, and all of it still reaches the screen (the pty threw those bytes away: the answer on the
    screen ended where the terminal had stopped reading). Keys typed meanwhile are not echoed into the answer, and
    the shell, reading next, does not get those typed before the press."""
    script = 'trap : INT; "$@"; echo "exit $?"; IFS= read -r line; echo "read next: [$line]"'
    child, log = spawn(home, mode, "/bin/sh", ["-c", script, "sh", str(BIN), *ARGS])
    try:
        child.expect_exact(begins(answer))  # it streams; from here on the terminal reads nothing
        run = int(Path(f"/proc/{child.pid}/task/{child.pid}/children").read_text().split()[0])
        read = screen_text(log)
        seen = len(read[read.index(begins(answer)):].encode())
        assert write_into(run, b"\0" * BEHIND) == BEHIND
        start = terminal.written(run)
        while terminal.written(run) - start < PENDING:  # only the answer is written while it streams
            assert child.isalive(), "the answer ended before the terminal fell behind"
            time.sleep(0.05)
        child.send("typed")
        child.sendintr()
        child.expect_exact("exit 130")
        child.sendline("after")
        child.expect(r"read next: \[(.*)\]")
        typed = child.match.group(1)
        child.expect(pexpect.EOF)
    finally:
        child.close()
    text = screen_text(log)
    shown = shown_answer(text, answer)
    assert len(shown.encode()) >= seen + PENDING, f"{len(shown.encode())} bytes shown of {seen + PENDING} written"
    assert "\ninterrupted\nexit 130\n" in text, text[-200:]
    assert typed == "after", "the keys typed before Ctrl-C reached the shell"
    assert "typed" not in text and "^C" not in log.getvalue(), text[-200:]


@pytest.mark.parametrize("mode", MODES)
def test_ctrl_c_while_the_answer_waits_on_a_full_terminal_shows_what_it_was_writing(home: Path, answer: str,
                                                                                    mode: str) -> None:
    """The terminal falls so far behind that the pty takes no more, and the answer's next piece waits to be written:
    Ctrl-C, and that piece reaches the screen too, after all the answer before it (unbuffered, the write that Ctrl-C
    ended short dropped it)."""
    child, log = spawn(home, mode, str(BIN), ARGS)
    try:
        child.expect_exact(begins(answer))
        while True:  # the terminal's backlog until the pty is full (it may take a little more once it has moved some)
            try:
                write_into(child.pid, b"\0" * 65536, nonblocking=True)
            except BlockingIOError:
                if (waiting := terminal.waiting_to_write(child.pid)) is not None:
                    break
            assert child.isalive(), "the answer ended before the terminal was full"
            time.sleep(0.05)
        child.sendintr()
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 130, child.signalstatus
    shown = shown_answer(screen_text(log), answer)
    assert waiting and shown.endswith(waiting.decode()), f"{waiting!r} was not shown: ...{shown[-80:]!r}"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_sigterm_or_sighup_mid_answer_gives_the_terminal_its_echo_back(home: Path, signum: int) -> None:
    """`timeout 12 localgen run ...` on a terminal: the answer turns the terminal's echo off while it streams, and a
    SIGTERM (or SIGHUP) then ended the run with the echo still off, so the shell took keys unseen. It is put back;
    the run still ends by the signal."""
    child = pexpect.spawn(sys.executable, ["-m", "localgen", "run", "--temperature", "0", "-n", "3000", "--ignore-eos",
                                           "Write a long essay about rivers."],
                          env=user_env(home, TERM="xterm", PYTHONPATH=str(ROOT)), cwd=str(home), encoding="utf-8",
                          timeout=SAFETY_NET_S, dimensions=(40, 120), preexec_fn=as_user)
    fd = child.child_fd
    try:
        while termios.tcgetattr(fd)[3] & termios.ECHO:  # until the answer streams (its echo off), reading what comes
            child.expect([pexpect.TIMEOUT, r"\S"], timeout=0.2)
        child.kill(signum)
        child.expect(pexpect.EOF)
        echo = termios.tcgetattr(fd)[3] & termios.ECHO
    finally:
        child.close()
    assert echo, "the terminal was left with its echo off"
    assert child.signalstatus == signum, (child.exitstatus, child.signalstatus)
