"""`localgen ARGS` in a real pseudo-terminal (stdin, stdout and stderr all the TTY), driven with pexpect. Where
the session's fork server takes the environment (tests/forkserver.py), the process is forked from it with the
pty as its controlling terminal, as pexpect.spawn would start it, without an interpreter's start and imports
(some 0.4 s of CPU a terminal); otherwise, pexpect.spawn starts it."""

from __future__ import annotations

import contextlib
import fcntl
import os
import platform
import struct
import subprocess
import sys
import termios
from pathlib import Path
from typing import Any

import pytest
from pexpect import fdpexpect

from tests.conftest import ROOT, default_sigint, fork_server

# what a terminal's environment changes besides LOCALGEN_*: nothing the fork server preloads reads them
# (test_forkserver checks it)
TERMINAL_VARS = frozenset({"TERM", "NO_COLOR", "PROMPT_TOOLKIT_NO_CPR", "VISUAL", "EDITOR", "COLUMNS", "LINES"})


class ForkedTerminal(fdpexpect.fdspawn):  # type: ignore[misc]
    """pexpect over the pty of a child of the fork server, with what the tests use of pexpect.spawn besides
    fdspawn's expect and send: sendcontrol, sendintr, kill, and close() that waits for the child and sets exitstatus
    and signalstatus."""

    def __init__(self, master: int, process: Any, **kw: Any) -> None:
        super().__init__(master, **kw)
        self.process = process
        self.pid = process.pid
        self.exitstatus: int | None = None
        self.signalstatus: int | None = None

    def sendcontrol(self, char: str) -> int:
        return int(self.send(chr(ord(char.lower()) & 0x1F)))

    def sendintr(self) -> None:
        self.send(chr(termios.tcgetattr(self.child_fd)[6][termios.VINTR][0]))

    def kill(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def isalive(self) -> bool:
        return bool(self.process.poll() is None)

    def close(self, force: bool = True) -> None:
        if self.flag_eof:  # the child has closed its side: let it end before closing ours hangs its terminal up
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(60)
        if not self.closed:
            super().close()
        code = self.process.wait(60)
        self.exitstatus, self.signalstatus = (code, None) if code >= 0 else (None, -code)


def drained(primary: int, timeout: float) -> bytes:
    """What a pty's far side showed until the process there closed it (or nothing came for `timeout` seconds), read as
    it comes: a full pty would hold the run."""
    import select

    seen = b""
    while select.select([primary], [], [], timeout)[0]:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # the run has ended and closed its side
            break
        if not chunk:
            break
        seen += chunk
    return seen


def spawn(env: dict[str, str], args: list[str], timeout: float = 60, dimensions: tuple[int, int] = (24, 80),
          module: str = "localgen") -> Any:
    """`python -m MODULE ARGS` on a pseudo-terminal of `dimensions` (rows, columns), in `env`, from the
    repository root."""
    forks = fork_server(env)
    if forks is None or not forks.accepts(env, TERMINAL_VARS):
        import pexpect

        return pexpect.spawn(sys.executable, ["-m", module, *args], env=env, cwd=str(ROOT), encoding="utf-8",
                             timeout=timeout, dimensions=dimensions, preexec_fn=default_sigint)
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", dimensions[0], dimensions[1], 0, 0))
    try:
        process = forks.popen(args, env, stdin=slave, stdout=slave, stderr=slave, sigint=True, tty=True,
                              module=module)
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)
    return ForkedTerminal(master, process, timeout=timeout, encoding="utf-8")


def ends(child: Any, timeout: float = 30) -> None:
    """Waits for `child` to close the terminal (it ended). If it has not within `timeout`, the failure says where
    each of its threads waits (state, system call number, signals pending) and what it last wrote: a signal a test
    sent that ended nothing once left only pexpect's timeout to go on."""
    import pexpect

    try:
        child.expect(pexpect.EOF, timeout=timeout)
    except pexpect.TIMEOUT:
        raise AssertionError(f"still running after {timeout} s:\n{_threads(child.pid)}\n"
                             f"it last wrote: {str(child.before)[-400:]!r}") from None


def _threads(pid: int) -> str:
    rows = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        with contextlib.suppress(OSError):
            stat = (task / "stat").read_text()
            status = dict(line.split(":\t", 1) for line in (task / "status").read_text().splitlines()
                          if ":\t" in line)
            call = (task / "syscall").read_text().split(" ", 1)[0]
            rows.append(f"  thread {task.name} ({status.get('Name', '?')}): state {stat.rsplit(')', 1)[1].split()[0]},"
                        f" in system call {call}, pending {status.get('SigPnd', '?')}"
                        f" (process {status.get('ShdPnd', '?')}), blocked {status.get('SigBlk', '?')}")
    return "\n".join(rows) or f"  (no /proc/{pid}/task)"


class Screen:
    """What a terminal of `dimensions` (rows, columns) shows of what a program wrote to it: pyte, a VT100 emulator,
    fed the bytes as they come (pass it as a child's logfile_read), so that a test asserts on the screen a user
    sees rather than on the escape sequences that drew it."""

    def __init__(self, dimensions: tuple[int, int] = (24, 80), onlcr: bool = False) -> None:
        import pyte

        self.screen = pyte.Screen(dimensions[1], dimensions[0])
        self.stream = pyte.Stream(self.screen)
        self.onlcr = onlcr  # written to directly (a console's file), not through a pty: "\n" made "\r\n" as a pty does
        self.written = ""  # all that was fed, as it came

    def write(self, data: str) -> None:
        data = data.replace("\n", "\r\n") if self.onlcr else data
        self.written += data
        self.stream.feed(data)

    def flush(self) -> None:
        pass

    def rows(self) -> list[str]:
        """Each row of the screen, right-stripped."""
        return [row.rstrip() for row in self.screen.display]


WRITE = {"x86_64": 1, "aarch64": 64}.get(platform.machine())  # write(2)'s number, as /proc/PID/syscall says it


def waiting_to_write(pid: int) -> bytes | None:
    """What the process `pid` waits to write to its stdout (write(2) on descriptor 1, as /proc/PID/syscall and
    /proc/PID/mem say it), or None while it is not waiting there: a terminal's pty holds some 20 KB that it has
    not shown; a program writing more waits in write(2) until the terminal reads. Skips the test where /proc does
    not say it (no procfs, another architecture, no right to read another process's state)."""
    try:
        fields = Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError as e:
        pytest.skip(f"no /proc/PID/syscall to see the process wait to write: {e}")
    if WRITE is None:
        pytest.skip(f"write(2)'s number on {platform.machine()} is not known here")
    if fields[:2] != [str(WRITE), "0x1"]:
        return None
    with open(f"/proc/{pid}/mem", "rb") as mem:
        mem.seek(int(fields[2], 16))
        return mem.read(int(fields[3], 16))


def written(pid: int) -> int:
    """The bytes the process `pid` has written so far, to any file (/proc/PID/io's wchar); skips the test where
    /proc does not say it."""
    try:
        io = Path(f"/proc/{pid}/io").read_text()
    except OSError as e:
        pytest.skip(f"no /proc/PID/io to count what the process writes: {e}")
    return int(dict(line.split(": ") for line in io.splitlines())["wchar"])


def wait_for_local_modes(child: Any, flags: int, timeout: float = 60) -> None:
    """Reads what `child` writes until its terminal (its stdin) has every local mode of `flags` set (termios'
    lflag): chat holds its terminal with NOFLSH from Enter to the next prompt (cli/echo.py), and its prompt's raw
    mode clears ISIG, so NOFLSH | ISIG says the prompt has ended, and a test can type ahead during an answer on
    that signal rather than after a guessed sleep. What is read
    meanwhile is dropped (a program whose output nobody reads waits in write(2) once the pty is full). Skips the
    test where /proc does not name the terminal."""
    import time

    import pexpect

    try:
        fd = os.open(f"/proc/{child.pid}/fd/0", os.O_RDWR | os.O_NOCTTY)
    except OSError as e:
        pytest.skip(f"no /proc/PID/fd to find the process's terminal: {e}")
    try:
        deadline = time.monotonic() + timeout
        while termios.tcgetattr(fd)[3] & flags != flags:
            assert time.monotonic() < deadline, f"the terminal's local modes never had {flags:#o} in {timeout} s"
            assert child.expect([pexpect.TIMEOUT, pexpect.EOF], timeout=0.05) == 0, "the program ended"
    finally:
        os.close(fd)
