"""What users run, as they run it: the `localgen` console script from the venv's bin/, not `python -m localgen`
from the fork server; in the environment a shell gives it (none of the suite's PYTHONUNBUFFERED, NO_COLOR or
HF_HUB_OFFLINE; only a home of its own through LOCALGEN_HOME, so a user's data is untouched); on every CPU of the
machine, not the one a test worker keeps to (tests/conftest.py), so llama.cpp decodes on several threads.

- `run` into a pipe and into a file streams the answer as it is generated (a block-buffered stdout would
  deliver it at exit, or in 8 KiB blocks), and on a merged `2>&1` pipe stderr's lines and stdout's text come in
  the order they were written;
- `chat` on a terminal stops an answer at Ctrl-C and goes on; `serve` stopped by SIGTERM exits 0, without a
  traceback, and frees its port;
- each command imports only what it needs (a structural budget, never a timing: scripts/bench_imports.py
  times them), and a command that needs no network opens no socket (an audit hook sees every socket Python
  makes; strace, where it can trace, every socket the process makes)."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CPUS, HF_PRIVATE, ROOT, SIZE_VARS

BIN = Path(sys.executable).parent / "localgen"  # the console script pip wrote into the venv
PROBE = ROOT / "tests" / "processprobe"  # its sitecustomize records sockets and imported modules
# what the suite's other processes are given and a user's shell does not give
FORCED = ("PYTHONUNBUFFERED", "NO_COLOR", "FORCE_COLOR", "HF_HUB_OFFLINE", "PYTHONPATH", "PYTHONPROFILEIMPORTTIME")
STORY = "Write a long story about a lighthouse keeper and a storm."
ANSWER_TOKENS = "32"  # enough to see it arrive in pieces (~130 bytes), far below one 8 KiB buffer
SAFETY_NET_S = 300

# What each command must not import: what it does not use, and the heavy libraries behind those
# (docs/ARCHITECTURE.md, "Heavy imports inside functions"). `run` has its fuller list in tests/test_startup.py.
EVERYWHERE = ("llama_cpp.llama", "huggingface_hub", "gguf", "mcp", "openai", "pandas", "torch",
              "localgen.tools.mcp", "localgen.remote.client", "localgen.remote.stream", "localgen.remote.backend")
NOT_IMPORTED = {
    "--version": ("typer", "click", "llama_cpp", "numpy", "uvicorn", "starlette", "httpx", "jinja2", "rich",
                  "prompt_toolkit",
                  "sqlite_utils", "localgen.engine", "localgen.native", "localgen.models", "localgen.serve"),
    "list": ("llama_cpp", "numpy", "uvicorn", "starlette", "httpx", "jinja2", "prompt_toolkit", "sqlite_utils",
             "localgen.engine", "localgen.native", "localgen.serve", "localgen.chat"),
    "run": ("numpy", "uvicorn", "starlette", "httpx", "rich", "prompt_toolkit", "pydantic", "sqlite_utils",
            "localgen.serve", "localgen.chat", "localgen.bench", "localgen.engine.batch"),
    "chat": ("uvicorn", "starlette", "httpx", "rich", "prompt_toolkit", "pydantic", "localgen.serve",
             "localgen.bench", "localgen.engine.batch"),
    "embed": ("uvicorn", "starlette", "httpx", "jinja2", "rich", "prompt_toolkit", "pydantic", "localgen.serve",
              "localgen.chat", "localgen.bench", "localgen.tools"),
    "serve": ("rich", "prompt_toolkit", "localgen.chat", "localgen.cli.chat", "localgen.bench",
              "localgen.tools.loop"),
}
# what each must import, so that an empty or wrong record cannot pass: the command ran as far as its work
IMPORTED = {
    "--version": ("localgen.cli.main",),  # and nothing of Typer: main answers it before importing the app
    "list": ("localgen.models.installed",),
    "run": ("localgen.engine.llama", "llama_cpp.llama_cpp"),
    "chat": ("localgen.chat.session", "llama_cpp.llama_cpp"),
    "embed": ("localgen.engine.embed", "llama_cpp.llama_cpp"),
    "serve": ("localgen.serve.app", "uvicorn", "llama_cpp.llama_cpp"),
}
ARGS = {
    "--version": ["--version"],
    "list": ["list"],
    "run": ["run", "-p", "Say hi.", "-n", "4", "--temperature", "0"],
    "chat": ["chat", "-n", "4", "--temperature", "0"],
    "embed": ["embed"],
}
STDIN = {"chat": "Hello!\n", "embed": "a line to embed\n"}


def user_env(home: Path, **extra: str) -> dict[str, str]:
    """The test's environment less what the suite forces (and anything of localgen's, pytest's or a Hub
    token), with `home` as LOCALGEN_HOME."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LOCALGEN_", "PYTEST_")) and k not in FORCED and k not in HF_PRIVATE
           and k not in SIZE_VARS}
    return {**env, "LOCALGEN_HOME": str(home), **extra}


def as_user() -> None:
    """In the child before it runs: every CPU of the machine (a test worker keeps to one, and its children
    inherit that), and SIGINT's default (a shell running the suite in the background ignores it)."""
    os.sched_setaffinity(0, CPUS)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(home: Path, *args: str, env: dict[str, str] | None = None, **kw: Any) -> subprocess.Popen[bytes]:
    kw.setdefault("stdin", subprocess.DEVNULL)  # a terminal's stdin is not read by `run -p`; an empty one neither
    return subprocess.Popen([str(BIN), *args], env=env or user_env(home), cwd=home, preexec_fn=as_user, **kw)


@pytest.fixture(scope="module")
def user_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home as a user's after a first answer: the log made (the first run creates it with sqlite-utils,
    which imports numpy, once per home)."""
    home = tmp_path_factory.mktemp("user-home")
    done = subprocess.run([str(BIN), "run", "-p", "Hi.", "-n", "1"], env=user_env(home), cwd=home,
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=SAFETY_NET_S, preexec_fn=as_user)
    assert done.returncode == 0, done.stderr
    return home


def test_the_console_script_is_the_venvs() -> None:
    assert BIN.is_file() and os.access(BIN, os.X_OK), f"no console script at {BIN}: scripts/install.sh makes it"
    assert BIN.read_text().splitlines()[0] == f"#!{sys.executable}"


def test_a_run_uses_the_machines_cores(user_home: Path) -> None:
    """No CPU pinning reaches a user's process: llama.cpp gets the threads this machine's defaults give
    (docs/configuration.md: one per physical core for generation, every usable CPU for prompts)."""
    done = subprocess.run([str(BIN), "run", "-p", "Hi.", "-n", "2", "--json"], env=user_env(user_home),
                          cwd=user_home, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=SAFETY_NET_S, preexec_fn=as_user)
    assert done.returncode == 0, done.stderr
    load = json.loads(done.stdout)["load"]
    rules = subprocess.run([sys.executable, "-c", "from localgen import hardware as h; "
                            "print(h.physical_cores(), h.usable_cores(), len(__import__('os').sched_getaffinity(0)))"],
                           capture_output=True, text=True, preexec_fn=as_user, timeout=60, cwd=ROOT)
    physical, usable, allowed = map(int, rules.stdout.split())
    assert allowed == len(CPUS)
    assert (load["n_threads"], load["n_threads_batch"]) == (physical, usable)
    if len(CPUS) >= 2 and usable >= 2:  # a machine that has two threads to give gives them
        assert load["n_threads_batch"] >= 2


def test_run_into_a_pipe_streams_the_answer(user_home: Path) -> None:
    """`localgen run -p ... | cat`: the answer arrives in pieces while the process runs, not all at its exit."""
    proc = start(user_home, "run", "-p", STORY, "-n", ANSWER_TOKENS, "--ignore-eos", "--temperature", "0",
                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    reads: list[tuple[bytes, bool]] = []  # each read, and whether the process was still running after it
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + SAFETY_NET_S
    try:
        while time.monotonic() < deadline:
            if not select.select([fd], [], [], 5)[0]:
                continue
            block = os.read(fd, 65536)
            if not block:
                break
            reads.append((block, proc.poll() is None))
    finally:
        proc.kill() if proc.poll() is None else None
        proc.wait()
    answer = b"".join(b for b, _ in reads)
    assert proc.returncode == 0 and answer.strip(), "no answer"
    # Buffered, the answer (a few hundred bytes, one write at the exit) is one read. Streamed, it is a read per
    # token or few (fewer when this reader waits for a CPU: the bar is low so that a busy machine passes)
    first, running = reads[0]
    assert running, "the first text came only as the process ended"
    assert len(reads) >= 2 and len(first) < len(answer), f"the answer came in {len(reads)} read(s): buffered"


def test_closed_or_full_standard_streams_are_one_line_or_nothing_never_a_traceback(user_home: Path) -> None:
    """A shell's `>&-`, `2>&-`, `> /dev/full` and a reader gone before `--version` printed (its own fast path, ahead of
    the app's error handling): one error line where a line can go, else a quiet exit. An answer into a closed stdout
    is an error, as into /dev/full (docs/run.md)."""
    def closing(fd: int) -> Any:
        def child() -> None:
            as_user()
            os.close(fd)
        return child

    closed_out = subprocess.run([str(BIN), "run", "-p", "hi", "-n", "3"], env=user_env(user_home), cwd=user_home,
                                stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=closing(1),
                                timeout=SAFETY_NET_S)
    assert closed_out.returncode == 1, closed_out.stderr  # it was a traceback, then exit 0 with the answer lost
    assert closed_out.stderr == b"localgen: error: stdout is closed: the output has nowhere to go\n", closed_out.stderr
    closed_in = subprocess.run([str(BIN), "chat", "-n", "3"], env=user_env(user_home), cwd=user_home,
                               capture_output=True, preexec_fn=closing(0), timeout=SAFETY_NET_S)
    assert closed_in.returncode == 0 and closed_in.stderr == b"", closed_in.stderr  # a scripted chat of no message
    closed_err = subprocess.run([str(BIN), "list"], env=user_env(user_home), cwd=user_home, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, preexec_fn=closing(2), timeout=SAFETY_NET_S)
    assert closed_err.returncode == 0 and closed_err.stdout.startswith(b"NAME"), closed_err  # it printed nothing, 1
    with open("/dev/full", "w") as full:
        r = subprocess.run([str(BIN), "--version"], env=user_env(user_home), stdout=full, stderr=subprocess.PIPE,
                           timeout=SAFETY_NET_S)
    assert r.returncode == 1 and r.stderr == b"localgen: error: cannot write to stdout: No space left on device\n", \
        r.stderr
    read, write = os.pipe()
    os.close(read)  # the reader has gone before it writes
    try:
        r = subprocess.run([str(BIN), "--version"], env=user_env(user_home), stdout=write, stderr=subprocess.PIPE,
                           timeout=SAFETY_NET_S)
    finally:
        os.close(write)
    assert r.returncode == 0 and r.stderr == b"", r.stderr


@pytest.mark.parametrize(("sig", "lead"), [(signal.SIGTERM, ""), (signal.SIGHUP, ""), (signal.SIGTERM, "//")],
                         ids=["SIGTERM", "SIGHUP", "SIGTERM-slashes"])
def test_chat_stopped_by_a_signal_keeps_the_turn_under_way(user_home: Path, sig: int, lead: str) -> None:
    """docs/chat.md: a kill or a closed terminal mid-answer saves the message and the partial answer (both were
    lost) and ends the chat with 128 + the signal. A message written with `//` (one that begins with /) too: it
    was taken for a command there, and the signal ended the chat at once, the turn unsaved."""
    name = f"stopped-{sig}-{len(lead)}"
    proc = start(user_home, "chat", name, "-n", "400", "--ignore-eos", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(lead.encode() + STORY.encode() + b"\n")
    proc.stdin.flush()
    fd = proc.stdout.fileno()
    assert select.select([fd], [], [], SAFETY_NET_S)[0] and os.read(fd, 64), "the answer began"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=SAFETY_NET_S)
    assert proc.returncode == 128 + sig, err.decode()[-2000:]
    assert b"Traceback" not in err, err.decode()[-2000:]
    saved = json.loads((user_home / "data" / "chats" / f"{name}.json").read_text())
    assert [m["role"] for m in saved["messages"]] == ["user", "assistant"] and saved["messages"][1]["content"]


def test_a_chat_under_nohup_goes_on_at_sighup(user_home: Path) -> None:
    """docs/chat.md: SIGHUP ignored as `nohup` sets it stays ignored: the answer under way goes on to its end."""
    def ignoring_hup() -> None:
        as_user()
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    proc = subprocess.Popen([str(BIN), "chat", "nohup-chat", "-n", "40", "--ignore-eos"], env=user_env(user_home),
                            cwd=user_home, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=ignoring_hup)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(STORY.encode() + b"\n")
    proc.stdin.flush()
    assert select.select([proc.stdout.fileno()], [], [], SAFETY_NET_S)[0], "the answer began"
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=SAFETY_NET_S)  # stdin closed: the chat ends after this answer
    assert proc.returncode == 0, err.decode()[-2000:]
    saved = json.loads((user_home / "data" / "chats" / "nohup-chat.json").read_text())
    assert saved["messages"][1]["content"] and "stopped" not in err.decode()


def test_run_into_a_file_writes_as_it_goes(user_home: Path, tmp_path: Path) -> None:
    """`localgen run -p ... > answer.txt`: the file grows while the answer is generated (`tail -f` shows it)."""
    target = tmp_path / "answer.txt"
    with target.open("wb") as out:
        proc = start(user_home, "run", "-p", STORY, "-n", ANSWER_TOKENS, "--ignore-eos", "--temperature", "0",
                     stdout=out, stderr=subprocess.DEVNULL)
    sizes: set[int] = set()  # sizes seen while the process was still running
    deadline = time.monotonic() + SAFETY_NET_S
    while proc.poll() is None and time.monotonic() < deadline:
        size = target.stat().st_size
        if size and proc.poll() is None:
            sizes.add(size)
        time.sleep(0.01)
    assert proc.wait(SAFETY_NET_S) == 0
    final = target.stat().st_size
    assert final > 0
    assert len(sizes) >= 2, f"the file had {sorted(sizes)} bytes before the exit and {final} after: not streamed"


def test_doctor_into_a_pipe_shows_each_line_as_it_is_known(user_home: Path) -> None:
    """`localgen doctor | cat`: the machine's lines arrive before the model check that follows them has run (a
    block-buffered stdout would hold every line until the exit)."""
    proc = start(user_home, "doctor", stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    first = os.read(proc.stdout.fileno(), 65536)  # what is there as soon as anything is
    rest = proc.stdout.read()
    assert proc.wait(SAFETY_NET_S) == 0
    assert first.startswith(b"localgen "), first
    assert b"check " not in first, "the lines came all at once, at the end: buffered"
    assert b"\ncheck " in rest  # the model check (a load and a generation) came later


def test_merged_stdout_and_stderr_keep_their_order(user_home: Path) -> None:
    """`... 2>&1 | less`: lines come in the order they were written. With --each-line a failed line's error (on
    stderr) sits between the answers before and after it (stdout), and --stats's line comes last."""
    lines = 'Say hello.\n{"prompt": "x", "top_k": 3.5}\nSay goodbye.\n'
    proc = start(user_home, "run", "--each-line", "-n", "6", "--temperature", "0", "--stats",
                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, _ = proc.communicate(lines.encode(), timeout=SAFETY_NET_S)
    assert proc.returncode == 1, out  # one line failed
    got = out.decode().split("\n")
    assert got[0].strip() and not got[0].startswith("localgen:"), got  # line 1's answer
    assert got[1] == "localgen: error: line 2: top_k must be an integer, not 3.5", got
    assert got[2] == "", got  # line 2's output line: blank
    assert got[3].strip() and not got[3].startswith("localgen:"), got  # line 3's answer
    assert got[4].startswith("2 prompts · ") and "1 failed" in got[4], got
    assert got[5:] == [""], got


@pytest.mark.parametrize("way", [(), ("--beams", "2")], ids=["stream", "beams"])
def test_run_answer_comes_before_its_stats_on_a_merged_pipe(user_home: Path, way: tuple[str, ...]) -> None:
    """--beams's stats line came before its answer."""
    proc = start(user_home, "run", "-p", "Say hi.", "-n", "8", "--temperature", "0", "--stats", *way,
                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, _ = proc.communicate(timeout=SAFETY_NET_S)
    assert proc.returncode == 0, out
    lines = out.decode().split("\n")
    if len(lines) > 2 and lines[-2].startswith("weights: "):  # layers on a GPU: where the weights sit (run.md)
        del lines[-2]
    answer, stats, end = "\n".join(lines).rsplit("\n", 2)
    assert answer.strip() and "prompt tokens" not in answer, out
    assert stats.startswith(tuple("0123456789")) and "stop: length" in stats and end == "", out


def test_chat_on_a_terminal_stops_an_answer_at_ctrl_c(user_home: Path) -> None:
    """The console script on a real terminal (a pty, as a terminal emulator holds one): Ctrl-C pressed as soon as
    a message is sent (the answer not begun, or just begun) and Ctrl-C pressed while the answer streams each
    stop it, and chat goes on; Ctrl-D then leaves with 0."""
    import pexpect

    env = user_env(user_home, TERM="xterm")
    child = pexpect.spawn(str(BIN), ["chat", "ctrlc", "-n", "3000", "--temperature", "0", "--ignore-eos"],
                          env=env, cwd=str(user_home), encoding="utf-8", timeout=120, dimensions=(40, 120),
                          preexec_fn=as_user)
    try:
        child.expect("ready in")
        child.expect_exact(">>>")
        child.sendline("Tell me about the sea.")
        cooked(child)  # the prompt has let go of the terminal: Enter was taken
        child.sendcontrol("c")
        child.expect(r"stopped before the answer began; the message was taken back|stopped; the partial answer is kept")
        child.expect_exact(">>>")
        child.sendline("Write a very long essay about the history of rivers.")
        cooked(child)
        child.expect_exact("\x1b[?2004l")  # the prompt's last word to the terminal: what follows is the answer
        child.expect(r"[A-Za-z]{2,}\W+[A-Za-z]{2,}\W+[A-Za-z]{2,}")  # streaming (3,000 tokens take far longer)
        child.sendcontrol("c")
        child.expect("stopped; the partial answer is kept")
        child.expect_exact(">>>")
        child.sendcontrol("d")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0, child.before
    assert "Traceback" not in str(child.before)
    saved = json.loads((user_home / "data" / "chats" / "ctrlc.json").read_text())
    assert saved["messages"][-2]["content"] == "Write a very long essay about the history of rivers."
    assert saved["messages"][-1]["role"] == "assistant" and saved["messages"][-1]["content"]


def cooked(child: Any) -> None:
    """Wait until the terminal is out of the prompt's raw mode (ISIG on: Ctrl-C is a signal, not a key). The
    prompt redraws the line it read before it lets go, so text on the screen alone does not say it has."""
    import termios

    tty = os.open(f"/proc/{child.pid}/fd/0", os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
    try:
        deadline = time.monotonic() + SAFETY_NET_S
        while not termios.tcgetattr(tty)[3] & termios.ISIG:
            assert time.monotonic() < deadline, "the terminal stayed in raw mode"
            time.sleep(0.01)
    finally:
        os.close(tty)


def probed(home: Path, out: Path, *args: str, stdin: str = "") -> tuple[subprocess.CompletedProcess[str], Any]:
    """`localgen ARGS` with the probe (tests/processprobe/sitecustomize.py) recording into `out`."""
    env = user_env(home, PYTHONPATH=str(PROBE), LOCALGEN_PROBE_OUT=str(out))
    done = subprocess.run([str(BIN), *args], env=env, cwd=home, input=stdin, capture_output=True, text=True,
                          timeout=SAFETY_NET_S, preexec_fn=as_user)
    return done, json.loads(out.read_text()) if out.exists() else None


def among(modules: list[str], names: tuple[str, ...]) -> list[str]:
    """The modules of `modules` that are one of `names` or inside one of them."""
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


@pytest.mark.quick  # no model: cheap enough for scripts/test --quick, where a heavy import at the top would show
@pytest.mark.parametrize("command", ["--version", "list"])
def test_version_and_list_import_only_what_they_need_and_open_no_socket(tmp_path: Path, command: str) -> None:
    assert_within_budget(tmp_path, tmp_path, command)


@pytest.mark.slow  # a model loads (in the helpers, where conftest does not look)
@pytest.mark.parametrize("command", ["run", "chat", "embed"])
def test_each_model_command_imports_only_what_it_needs_and_opens_no_socket(user_home: Path, tmp_path: Path,
                                                                           command: str) -> None:
    assert_within_budget(user_home, tmp_path, command)


def assert_within_budget(home: Path, tmp_path: Path, command: str) -> None:
    """`localgen COMMAND` in `home` did its work, imported none of what it must not, and made no socket."""
    done, seen = probed(home, tmp_path / "probe.json", *ARGS[command], stdin=STDIN.get(command, ""))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), "it printed nothing: it did not do its work"
    assert seen is not None, "the probe wrote nothing (is tests/processprobe on the path?)"
    assert set(IMPORTED[command]) <= set(seen["modules"]), "the probe did not see the command's own modules"
    assert among(seen["modules"], EVERYWHERE + NOT_IMPORTED[command]) == []
    assert seen["sockets"] == [], "a command that needs no network made a socket"


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_a_run_makes_no_socket_even_in_native_code(user_home: Path, tmp_path: Path) -> None:
    """The audit hook sees Python's sockets; strace sees the process's (llama.cpp's, a library's C code)."""
    log = tmp_path / "strace.log"
    if subprocess.run(["strace", "-o", os.devnull, "true"], capture_output=True).returncode != 0:
        pytest.skip("strace cannot trace here (ptrace is not permitted)")
    done = subprocess.run(["strace", "-f", "-qq", "-e", "trace=socket,connect", "-o", str(log), str(BIN), "run", "-p",
                           "Say hi.", "-n", "4"], env=user_env(user_home), cwd=user_home, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=SAFETY_NET_S, preexec_fn=as_user)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr
    assert log.read_text() == ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, body: dict[str, Any] | None = None) -> Any:
    """A GET (or a POST of `body`) straight to a local server (no proxy); its JSON."""
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with direct.open(req, timeout=120) as r:
        return json.loads(r.read())


@pytest.fixture
def served(user_home: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, Path, Path]]:
    """`localgen serve` on a free loopback port with the probe, answering: the process, its URL, the probe's
    record and its stderr's file. Killed at the end if a test left it running. docs/serve.md: the start line is
    written once the port takes connections, so a script may connect as it sees the line."""
    port = free_port()
    out, err = tmp_path / "probe.json", tmp_path / "serve.err"
    env = user_env(user_home, PYTHONPATH=str(PROBE), LOCALGEN_PROBE_OUT=str(out))
    with err.open("wb") as f:
        proc = start(user_home, "serve", "--port", str(port), env=env, stdout=subprocess.DEVNULL, stderr=f)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SAFETY_NET_S
        while f" on {url} · " not in err.read_text():
            assert proc.poll() is None, err.read_text()
            assert time.monotonic() < deadline, "serve wrote no start line"
            time.sleep(0.01)
        assert get(f"{url}/health")["status"] == "ok"  # at once, no retry
        yield proc, url, out, err
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.mark.slow
def test_serve_stops_at_sigterm_cleanly_and_frees_its_port(served: Any) -> None:
    proc, url, out, err = served
    answer = get(f"{url}/v1/chat/completions", {"model": "smollm2:135m", "max_tokens": 4, "temperature": 0,
                                                "messages": [{"role": "user", "content": "Hi"}]})
    assert answer["choices"][0]["message"]["content"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(SAFETY_NET_S) == 0, err.read_text()
    assert "Traceback" not in err.read_text(), err.read_text()
    port = int(url.rsplit(":", 1)[1])
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):
        s.connect(("127.0.0.1", port))  # nothing listens
    with socket.socket() as s:  # and a new server can listen there at once, as `serve` would (SO_REUSEADDR: the
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # closed connections' TIME_WAIT stays a while)
        s.bind(("127.0.0.1", port))
        s.listen(1)
    seen = json.loads(out.read_text())
    assert set(IMPORTED["serve"]) <= set(seen["modules"])
    assert among(seen["modules"], EVERYWHERE + NOT_IMPORTED["serve"]) == []
    # its sockets: the listener on loopback, and Unix socket pairs (asyncio's self-pipe); nothing dialled out
    for event, *args in seen["sockets"]:
        if event == "socket.__new__":
            assert args[0] in (str(int(socket.AF_UNIX)), str(int(socket.AF_INET))), args
        else:
            assert event == "socket.bind" and args[0].startswith("('127.0.0.1', "), (event, args)
    assert any(e == "socket.bind" for e, *_ in seen["sockets"])


def json_objects(text: str) -> list[dict[str, Any]]:
    """Each line a terminal showed, as the JSON object it must be."""
    lines = [line for line in text.replace("\r\n", "\n").split("\n") if line.strip()]
    assert lines, "nothing was written"
    return [json.loads(line) for line in lines]


@pytest.mark.slow
def test_serve_log_format_json_on_a_terminal_writes_only_json(user_home: Path) -> None:
    """docs/serve.md, The log: with --log-format json every line serve writes is a JSON object, on a terminal too
    (no "loading ..." line there), --verbose's uvicorn lines included, and so is the error that stops a second
    serve on the same port (an `error` event with its hint and exit status, which stays 1)."""
    import pexpect

    env = user_env(user_home, TERM="xterm")
    port = str(free_port())
    first = pexpect.spawn(str(BIN), ["serve", "--log-format", "json", "--verbose", "-m", "smollm2:135m", "--port",
                                     port], env=env, cwd=str(user_home), encoding="utf-8", timeout=SAFETY_NET_S,
                          dimensions=(40, 120), preexec_fn=as_user)
    try:
        first.expect("Uvicorn running on")
        said = first.before + first.after
        first.expect("\n")
        said += first.before + first.after
        second = pexpect.spawn(str(BIN), ["serve", "--log-format", "json", "-m", "smollm2:135m", "--port", port],
                               env=env, cwd=str(user_home), encoding="utf-8", timeout=SAFETY_NET_S,
                               dimensions=(40, 120), preexec_fn=as_user)
        second.expect(pexpect.EOF)
        second.close()
        first.kill(signal.SIGTERM)
        first.expect(pexpect.EOF)
        said += first.before
    finally:
        first.close()
    assert first.exitstatus == 0, said
    events = [d["event"] for d in json_objects(said)]
    # the load's event (no "loading ..."), uvicorn's lines as it starts listening, then the start line
    assert events[0] == "load" and "start" in events and "server" in events, events
    assert set(events[1:events.index("start")]) <= {"server"}, events
    [error] = json_objects(second.before)
    assert second.exitstatus == 1 and error["exit_code"] == 1, second.before
    assert error["event"] == "error" and error["message"].startswith(f"cannot listen on 127.0.0.1:{port}"), error
    assert error["hint"] and {"time", "request_id", "route", "model", "status"} <= set(error), error


@pytest.mark.quick
def test_the_probe_sees_a_socket_and_an_import(tmp_path: Path) -> None:
    """The probe that the budgets above rely on records what it must: a connection's socket and address, and a
    module imported late."""
    out = tmp_path / "probe.json"
    env = {**user_env(tmp_path), "PYTHONPATH": str(PROBE), "LOCALGEN_PROBE_OUT": str(out)}
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        code = f"import socket, colorsys; socket.create_connection(('127.0.0.1', {port})).close()"
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    seen = json.loads(out.read_text())
    assert "colorsys" in seen["modules"]
    assert ["socket.connect", f"('127.0.0.1', {port})"] in seen["sockets"]
