"""The tests' fork server (tests/forkserver.py) starts a process as an interpreter started by the test would
be: the same arguments, directory, CPUs, environment (in Python and in C), stdin, stdout and stderr kept
apart, SIGINT handler, atexit handlers and exit status, and subprocess.run's timeout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.forkserver import ForkServer


@pytest.fixture(scope="module")
def forks(cli_env: dict[str, str]) -> Iterator[ForkServer]:
    server = ForkServer(cli_env, ROOT, Path(tempfile.mkdtemp(prefix="localgen-forks-")))
    yield server
    server.close()


def started(env: dict[str, str], *args: str, input: str = "", timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tests.forkprobe", *args], input=input, capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=timeout)


def seen(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    facts: dict[str, object] = json.loads(done.stdout)
    facts["argv"] = facts["argv"][1:] if isinstance(facts["argv"], list) else facts["argv"]  # [0]: the file
    return facts


@pytest.mark.parametrize("how", ["0", "3", "TERM"])
def test_a_forked_child_is_what_a_started_interpreter_is(forks: ForkServer, cli_env: dict[str, str],
                                                         how: str) -> None:
    env = {**cli_env, "LOCALGEN_PROBE": "probe value"}
    assert forks.accepts(env)
    forked = forks.run([how], env, "line one\r\nline two\n", 60, module="tests.forkprobe")
    real = started(env, how, input="line one\r\nline two\n")
    assert forked.returncode == real.returncode == {"0": 0, "3": 3, "TERM": -15}[how]
    assert seen(forked) == seen(real)
    assert seen(forked)["env"] == seen(forked)["c_env"] == "probe value"
    assert seen(forked)["stdin"] == "line one\r\nline two\n"
    assert json.loads(forked.stdout)["argv"][0] == str(ROOT / "tests" / "forkprobe.py")
    assert forked.stderr == real.stderr == ("" if how == "TERM" else "atexit ran\n")


def test_a_long_argument_reaches_the_forked_child_whole(forks: ForkServer, cli_env: dict[str, str]) -> None:
    """A request larger than one socket read (a 300,000-character argument, as a long `-p`) arrives whole."""
    long = "word " * 60_000
    forked = forks.run(["0", long], cli_env, "", 60, module="tests.forkprobe")
    assert forked.returncode == 0, forked.stderr
    assert seen(forked)["argv"] == ["0", long]


def test_a_forked_child_has_the_callers_cpus(forks: ForkServer, cli_env: dict[str, str]) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, cpus[:1])
    try:
        forked = forks.run(["0"], cli_env, "", 60, module="tests.forkprobe")
    finally:
        os.sched_setaffinity(0, cpus)
    assert seen(forked)["cpus"] == cpus[:1]


def test_a_timeout_kills_the_forked_child(forks: ForkServer, cli_env: dict[str, str]) -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        forks.run(["sleep"], cli_env, "", 1.0, module="tests.forkprobe")
    assert forks.run(["0"], cli_env, "", 60, module="tests.forkprobe").returncode == 0  # the server goes on


# a fork server (no preloading: it serves tests.forkprobe, which needs none) that starts a second thread on
# SIGUSR1, or before it serves with "early"; a "python" thread, or a "native" one, which Python's threading does
# not count (only /proc/self/task does)
THREADED_SERVER = """
import _thread, signal, sys, threading
from tests import forkserver

def start_thread(*_):
    if sys.argv[2] == "python":
        threading.Thread(target=threading.Event().wait, daemon=True).start()
    else:
        lock = _thread.allocate_lock()
        lock.acquire()
        _thread.start_new_thread(lock.acquire, ())

signal.signal(signal.SIGUSR1, start_thread)
if sys.argv[3] == "early":
    start_thread()
forkserver.run_module(forkserver.serve(sys.argv[1]))
"""


@pytest.mark.parametrize("thread", ["python", "native"])
def test_a_fork_server_with_another_thread_refuses_to_fork(cli_env: dict[str, str], tmp_path: Path,
                                                           thread: str) -> None:
    """A fork copies only the calling thread: a lock another thread holds stays held in the child. The server
    checks before each fork and refuses, saying why, instead of forking; and one with a second thread before it
    serves (the preloading started one) does not start."""
    path = str(tmp_path / "fork.sock")
    server = subprocess.Popen([sys.executable, "-c", THREADED_SERVER, path, thread, "late"], env=cli_env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline() == "ready\n"
        client = ForkServer.__new__(ForkServer)  # a client of that server (__init__ would start its own)
        client.env, client.cwd, client.path = dict(cli_env), ROOT, path
        assert client.run(["0"], cli_env, "", 60, module="tests.forkprobe").returncode == 0  # one thread: it forks
        server.send_signal(signal.SIGUSR1)
        with pytest.raises(RuntimeError, match=r"refused: the fork server has 2 (Python )?threads"):
            for _ in range(100):  # the handler runs once the server's select wakes: at the latest, this call's
                client.run(["0"], cli_env, "", 60, module="tests.forkprobe")
        assert server.poll() is None, "the server goes on"
    finally:
        server.kill()
        server.wait()
    early = subprocess.run([sys.executable, "-c", THREADED_SERVER, path + "2", thread, "early"], env=cli_env,
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert early.returncode == 1 and early.stdout == ""
    assert "RuntimeError: the fork server has 2" in early.stderr


def test_the_lone_thread_check_sees_none_where_there_is_one_thread() -> None:
    done = subprocess.run([sys.executable, "-c", "from tests import forkserver; print(forkserver.other_threads())"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.stdout == "None\n", done.stderr


def test_only_localgens_variables_may_differ_from_the_servers(forks: ForkServer, cli_env: dict[str, str]) -> None:
    assert forks.accepts({**cli_env, "LOCALGEN_HOME": "/elsewhere"})
    assert not forks.accepts({**cli_env, "HF_HUB_OFFLINE": "0"})  # huggingface_hub reads it on import
    assert not forks.accepts({k: v for k, v in cli_env.items() if k != "PYTHONUNBUFFERED"})


def test_a_forked_child_left_running_has_popens_pipes(forks: ForkServer, cli_env: dict[str, str]) -> None:
    """ForkServer.popen (CLI.popen where it can): stdin, stdout and stderr as pipes, in text, with communicate()
    and the exit status, as subprocess.Popen gives them."""
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    env = {**cli_env, "LOCALGEN_PROBE": "popen"}
    forked = forks.popen(["3", "x"], env, module="tests.forkprobe", **pipes)
    real = subprocess.Popen([sys.executable, "-m", "tests.forkprobe", "3", "x"], env=env, cwd=ROOT, **pipes)
    (f_out, f_err), (r_out, r_err) = forked.communicate("lines\nin\n", 60), real.communicate("lines\nin\n", 60)
    assert (forked.returncode, f_err) == (real.returncode, r_err) == (3, "atexit ran\n")
    facts = [seen(subprocess.CompletedProcess([], 3, out, "")) for out in (f_out, r_out)]
    assert facts[0] == facts[1] and facts[0]["stdin"] == "lines\nin\n" and facts[0]["env"] == "popen"


def test_the_cli_through_the_fork_server_answers_as_a_started_one(forks: ForkServer,
                                                                  cli_env: dict[str, str]) -> None:
    for args in (["--version"], ["run", "-m", "no-such-model.gguf", "-p", "hi"], ["run", "--no-such-flag"]):
        forked = forks.run(args, cli_env, "", 120)
        real = subprocess.run([sys.executable, "-m", "localgen", *args], input="", capture_output=True, text=True,
                              env=cli_env, cwd=ROOT, timeout=120)
        assert (forked.returncode, forked.stdout, forked.stderr) == (real.returncode, real.stdout, real.stderr)
    assert forked.returncode == 2 and "no-such-flag" in forked.stderr


# Every key a module reads from os.environ while the fork server preloads, but for wsgiref.handlers' copy of the
# whole environment (uvicorn imports it; it serves WSGI applications only, and localgen's server is ASGI).
READS = """
import os, sys
class Recording(os._Environ):
    read = set()
    def __getitem__(self, key):
        frame = sys._getframe(1)
        while frame is not None and "wsgiref" not in frame.f_code.co_filename:
            frame = frame.f_back
        if frame is None:
            Recording.read.add(key)
        return super().__getitem__(key)
e = os.environ
os.environ = Recording(e._data, e.encodekey, e.decodekey, e.encodevalue, e.decodevalue)
from tests.forkserver import preload
preload()
print(" ".join(sorted(Recording.read)))
"""


def test_what_the_preloading_reads_of_the_environment(cli_env: dict[str, str]) -> None:
    """The variables a terminal changes (tests/terminal.py) are read by nothing the fork server imports, so a child
    forked in a terminal's environment is what an interpreter started in it would be. Typer reads TYPER_USE_RICH as
    it is imported: the check sees reads."""
    from tests.terminal import TERMINAL_VARS

    done = subprocess.run([sys.executable, "-c", READS], capture_output=True, text=True, env=cli_env, cwd=ROOT,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    read = set(done.stdout.split())
    assert "TYPER_USE_RICH" in read and not read & TERMINAL_VARS, sorted(read)
    assert not [k for k in read if k.startswith("LOCALGEN_")], sorted(read)  # they may differ in every child


def test_a_forked_terminal_is_what_pexpect_starts(cli_env: dict[str, str]) -> None:
    """tests/terminal.py: a child on a pty that is its controlling terminal, as pexpect.spawn starts one: stdin,
    stdout and stderr the pty, of the size asked for, the child a session leader in the foreground (so Ctrl-C is
    its SIGINT), its exit status read on close; an environment the fork server cannot take gets pexpect.spawn."""
    import pexpect

    from tests import terminal

    env = {k: v for k, v in cli_env.items() if k != "NO_COLOR"} | {"TERM": "xterm"}
    seen = []
    for how in (env, {**env, "HF_HUB_OFFLINE": "0"}):  # forked; started by pexpect
        child = terminal.spawn(how, ["tty"], dimensions=(33, 99), module="tests.forkprobe")
        assert isinstance(child, terminal.ForkedTerminal) == (how is env)
        child.expect_exact("> ")
        facts = json.loads(str(child.before).strip())
        child.sendintr()
        child.expect_exact("interrupted")
        child.expect(pexpect.EOF)
        child.close()
        seen.append((facts, child.exitstatus, child.signalstatus))
    assert seen[0] == seen[1]
    assert seen[0] == ({"ttys": [True] * 3, "size": [99, 33], "foreground": True, "leader": True}, 130, None)
