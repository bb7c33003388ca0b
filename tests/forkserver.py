"""A fork server for the tests' `localgen` processes. A Python that has already imported the libraries the CLI
uses (Typer, Click, Rich, Jinja2, prompt-toolkit, httpx, huggingface_hub, llama.cpp's ctypes layer) and the
modules on the paths of `run`, `serve` and `chat` (PRELOAD) forks a fresh process for each `cli(...)` call.
That process then runs `python -m localgen ARGS` as a started interpreter would: its own pid, the caller's
pipes as stdin, stdout and stderr, the caller's environment, directory and CPUs, its exit code, atexit
handlers and signals (tests/test_forkserver.py checks each against a started interpreter). What it saves is
the interpreter's start and those imports (docs/benchmarks.md, "The test suite"; scripts/bench_forkserver.py
measures it).

The environment may differ from the server's own (the first caller's) only in LOCALGEN_* variables:
libraries read some of the rest when they are imported (huggingface_hub's HF_HUB_OFFLINE and paths, Typer's
terminal settings), so a call in any other environment starts an interpreter. numpy, and what imports it
(gguf, llama_cpp.llama, sqlite-utils), stays out: localgen chooses its greedy path by whether numpy is
imported (native/sampler.py).

    python -m tests.forkserver SOCKET        the server; prints "ready" when it listens

The protocol, one connection per call: the client sends a JSON request (argv, environment, cwd, CPUs) with
the three file descriptors for stdin, stdout and stderr; the server answers a line with the child's pid, then
one with its exit status as subprocess reports it (negative: killed by that signal); or one line
`refused: WHY` when it has another thread (`other_threads`) and so will not fork."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

MAX_REQUEST = 1 << 20


# What a child would import anyway: the libraries the CLI uses, then localgen's modules on `run`'s path (the
# command most tests start). Import is all the server does with them: no function of localgen runs there, and
# none of these modules reads a file or the environment when it is imported.
PRELOAD = (
    "click", "httpx", "huggingface_hub", "jinja2.ext", "jinja2.sandbox", "prompt_toolkit", "rich.console",
    "rich.markdown", "rich.table", "typer", "typer.main",
    "localgen.cli.main", "localgen.cli.signals", "localgen.cli.usage", "localgen.cli.app", "localgen.cli.helpall",
    "localgen.cli.run.command",
    "localgen.cli.run.execute", "localgen.cli.output", "localgen.engine.local", "localgen.log.store",
    # and on `serve`'s and `chat`'s, the next most started (some 60 ms a server start), and the MCP SDK's client
    # (some 0.45 s a `run` or `chat` with --mcp)
    "anyio.to_thread", "uvicorn", "uvicorn.protocols.http.httptools_impl", "localgen.cli.serve.command",
    "localgen.serve.app", "localgen.cli.chat.command", "localgen.cli.chat.loop", "localgen.cli.chat.message",
    "mcp", "mcp.client.stdio", "mcp.client.streamable_http",
)


def preload() -> None:
    """The imports a child would otherwise repeat; none of them imports numpy."""
    import importlib

    from localgen._compat import llama_cpp_ctypes_layer

    llama_cpp_ctypes_layer()  # the bindings' ctypes layer and llama.cpp's libraries, as localgen loads them
    for name in PRELOAD:
        importlib.import_module(name)
    assert "numpy" not in sys.modules, "a preloaded module imported numpy"


def other_threads() -> str | None:
    """Why this process must not fork now, or None: a thread besides this one, in Python or (on Linux, in
    /proc/self/task) a native one, such as an OpenMP pool a library started. A fork copies only the calling
    thread, so a lock another thread held (the allocator's, the interpreter's import lock) stays held in the
    child for ever, and the child hangs or crashes at random."""
    if threading.active_count() != 1:
        return f"{threading.active_count()} Python threads"
    try:
        tasks = len(os.listdir("/proc/self/task"))
    except OSError:  # not Linux: Python's own count is what there is
        return None
    return f"{tasks} threads in /proc/self/task" if tasks != 1 else None


def serve(path: str) -> dict[str, Any]:
    """Accepts calls until killed; returns (in a forked child only) the request that child is to run. One
    thread: each child is watched through a pidfd, and its exit status goes back on its connection."""
    import selectors

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    if (why := other_threads()) is not None:  # the preloading started one: no child could be trusted
        raise RuntimeError(f"the fork server has {why} after preloading; it forks only with one")
    watch = selectors.DefaultSelector()
    watch.register(listener, selectors.EVENT_READ)
    gc.freeze()  # the preloaded objects stay out of the children's collections (no copy of their pages)
    print("ready", flush=True)
    while True:
        for key, _ in watch.select():
            if key.fileobj is listener:
                conn, _ = listener.accept()
                data, fds = read_request(conn)
                why = other_threads()
                if why is not None:
                    for fd in fds:
                        os.close(fd)
                    with conn, contextlib.suppress(OSError):
                        conn.sendall(f"refused: the fork server has {why}; it forks only with one\n".encode())
                    continue
                pid = os.fork()
                if pid == 0:
                    watch.close()
                    listener.close()
                    conn.close()
                    return start_child(json.loads(data), fds)
                for fd in fds:
                    os.close(fd)
                with contextlib.suppress(OSError):
                    conn.sendall(f"{pid}\n".encode())
                watch.register(os.pidfd_open(pid), selectors.EVENT_READ, (pid, conn))
            else:
                pid, conn = key.data
                watch.unregister(key.fileobj)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                with conn, contextlib.suppress(OSError):  # a caller that went without waiting for it
                    conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())


def read_request(conn: socket.socket) -> tuple[bytes, list[int]]:
    """A request whole: its first piece carries the descriptors, and a long one (a large argument) comes in
    several pieces, up to the caller's half-close."""
    data, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 3)
    while data and len(data) <= MAX_REQUEST and (more := conn.recv(MAX_REQUEST)):
        data += more
    return data, fds


def start_child(request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
    """In the forked child: the caller's pipes as stdin, stdout and stderr, and the caller's directory,
    environment and CPUs. Its signal handlers are the server's, which started as a child of the caller's process, as
    an interpreter the caller started would (SIGINT ignored where the test session ignores it)."""
    if request.get("tty"):
        os.setsid()  # a session of its own, whose controlling terminal is the pty given as its stdin
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    if request.get("tty"):
        import fcntl
        import termios

        fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # as pexpect's children: Ctrl-C on the pty is its SIGINT
    os.chdir(request["cwd"])
    os.sched_setaffinity(0, request["cpus"])  # the caller's CPUs, which a child it started would inherit
    os.environ.clear()  # through putenv and unsetenv: llama.cpp's getenv sees the caller's environment too
    os.environ.update(request["env"])
    if request["sigint"]:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return request


def run_module(request: dict[str, Any]) -> None:
    """What `python -m MODULE ARGS` does once the interpreter has started (sys.argv[0] the module's file)."""
    import runpy

    sys.argv = list(request["argv"])
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)


# The signals' state the test session started with (its main thread, as conftest imports this module): the server
# starts with it, whichever thread or test starts it. It would otherwise pass on what that thread had at that moment
# (a signal mask survives exec, and so does SIG_IGN) to every child it forks for the rest of the run.
WATCHED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_SESSION_MASK = signal.pthread_sigmask(signal.SIG_BLOCK, [])
_SESSION_IGNORED = frozenset(s for s in WATCHED if signal.getsignal(s) is signal.SIG_IGN)


def as_the_session_started() -> None:
    """preexec_fn: the session's starting signal mask, and SIGINT, SIGTERM and SIGHUP as it had them."""
    signal.pthread_sigmask(signal.SIG_SETMASK, _SESSION_MASK)
    for sig in WATCHED:
        signal.signal(sig, signal.SIG_IGN if sig in _SESSION_IGNORED else signal.SIG_DFL)


class ForkServer:
    """The client side: starts the server and runs calls through it, as subprocess.run would."""

    def __init__(self, env: dict[str, str], cwd: Path, folder: Path) -> None:
        self.env, self.cwd = dict(env), cwd
        self.path = str(folder / "fork.sock")  # the folder is the server's: close() removes it
        self.log = folder / "forkserver.log"
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.forkserver", self.path], env=self.env,
                                     cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self.log.open("w"), preexec_fn=as_the_session_started)
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        if ready != b"ready\n":
            self.proc.kill()
            raise RuntimeError(f"the fork server did not start: {self.log.read_text()[-2000:]}")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(Path(self.path).parent, ignore_errors=True)

    def accepts(self, env: dict[str, str], also: frozenset[str] = frozenset()) -> bool:
        """Whether a child in `env` is what an interpreter started in it would be: it differs from the
        server's own environment in localgen's variables only (and those in `also`), which nothing preloaded
        reads (tests/test_forkserver.py checks what the preloading reads)."""
        differ = {k for k in env.keys() | self.env.keys() if env.get(k) != self.env.get(k)}
        return all(k.startswith("LOCALGEN_") or k in also for k in differ)

    def request(self, argv: list[str], env: dict[str, str], fds: tuple[int, int, int],
                sigint: bool = False, tty: bool = False, cwd: Path | None = None) -> tuple[socket.socket, Any]:
        """Asks for a child running `python -m ARGV` with `fds` as its stdin, stdout and stderr (the caller
        closes its own copies; with `tty`, the one pseudo-terminal that becomes its controlling terminal), in
        `cwd` (default: the server's directory); the connection, and its replies with the child's pid read off
        them."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.path)
            request = {"argv": argv, "env": env, "cwd": str(cwd or self.cwd), "cpus": sorted(os.sched_getaffinity(0)),
                       "sigint": sigint, "tty": tty}
            payload = json.dumps(request).encode()
            sent = socket.send_fds(conn, [payload], list(fds))
            conn.sendall(payload[sent:])  # a long request does not go in one piece
            conn.shutdown(socket.SHUT_WR)  # the request ends here; the replies still come back
        except BaseException:
            conn.close()
            raise
        return conn, conn.makefile("rb", buffering=0)  # unbuffered: nothing read ahead of a select()

    def popen(self, args: list[str], env: dict[str, str], stderr: Any = None, stdin: Any = subprocess.DEVNULL,
              stdout: Any = subprocess.PIPE, text: bool = False, bufsize: int = -1,
              module: str = "localgen", sigint: bool = False, tty: bool = False,
              cwd: Path | None = None) -> ForkedProcess:
        """`python -m MODULE ARGS` left running, as subprocess.Popen starts it: each of stdin, stdout and stderr is the
        caller's own (None), DEVNULL, PIPE (a file object on the ForkedProcess, text or bytes as `text` and
        `bufsize` say) or a descriptor. By default stdin is /dev/null and stdout a pipe. With `sigint`, SIGINT
        raises KeyboardInterrupt in the child even where the session ignores it (Popen's preexec_fn resetting it
        before an interpreter starts does as much). With `tty`, the descriptor given for all three is a pseudo-terminal
        that becomes the child's controlling terminal (tests/terminal.py). It runs in `cwd` (default: the server's
        directory)."""
        theirs: list[int] = []  # the child's ends, closed here once it has them
        ours: list[Any] = []  # the caller's ends of pipes: (fd, reading)
        for i, want in enumerate((stdin, stdout, stderr)):
            if want == subprocess.PIPE:
                r, w = os.pipe()
                theirs.append(r if i == 0 else w)
                ours.append((w, False) if i == 0 else (r, True))
                continue
            ours.append(None)
            if want is None:
                theirs.append(os.dup(i))
            elif want == subprocess.DEVNULL:
                theirs.append(os.open(os.devnull, os.O_RDWR))
            else:
                theirs.append(os.dup(want if isinstance(want, int) else want.fileno()))
        try:
            conn, replies = self.request([module, *args], env, (theirs[0], theirs[1], theirs[2]), sigint, tty, cwd)
        except BaseException:
            for end in ours:
                if end is not None:
                    os.close(end[0])
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        files = [None if end is None else _pipe_file(*end, text=text, bufsize=bufsize) for end in ours]
        return ForkedProcess(conn, replies, files[1], stdin=files[0], stderr=files[2])

    def run(self, args: list[str], env: dict[str, str], input: str, timeout: float,
            module: str = "localgen", cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """`python -m MODULE ARGS` with `input` on stdin, as subprocess.run(text=True, timeout=...) runs it:
        the text of stdout and stderr once both close, the exit status, TimeoutExpired (the child killed)."""
        argv = [module, *args]
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        ours, theirs = (in_w, out_r, err_r), (in_r, out_w, err_w)  # theirs: the child's stdin, stdout, stderr
        try:
            conn, replies = self.request(argv, env, theirs, cwd=cwd)
        except BaseException:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        pid = status(replies)
        stdin, stdout, stderr = ours
        chunks: dict[int, list[bytes]] = {stdout: [], stderr: []}

        def feed() -> None:
            with contextlib.suppress(BrokenPipeError), open(stdin, "wb") as f:  # a child that reads no stdin
                f.write(input.encode())

        def drain(fd: int) -> None:
            with open(fd, "rb", buffering=0) as f:
                while block := f.read(65536):
                    chunks[fd].append(block)

        threads = [threading.Thread(target=feed, daemon=True)]
        threads += [threading.Thread(target=drain, args=(fd,), daemon=True) for fd in (stdout, stderr)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout
        with conn, replies:
            for t in threads[1:]:
                t.join(max(0.0, deadline - time.monotonic()))
                if t.is_alive():
                    os.kill(pid, signal.SIGKILL)
                    status(replies)  # reaped
                    raise subprocess.TimeoutExpired(argv, timeout)
            code = status(replies)
        return subprocess.CompletedProcess(argv, code, text(b"".join(chunks[stdout])),
                                           text(b"".join(chunks[stderr])))


class ForkedProcess:
    """A child of the fork server left running, with what the tests use of a Popen: pid, poll, wait,
    send_signal, kill, and stdin, stdout and stderr (a file object where it is a pipe, else None)."""

    def __init__(self, conn: socket.socket, replies: Any, stdout: Any, stdin: Any = None, stderr: Any = None) -> None:
        self._conn, self._replies = conn, replies
        self.stdin: Any = stdin
        self.stdout: Any = stdout
        self.stderr: Any = stderr
        self.pid = status(replies)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._conn], [], [], 0)[0]:
            self.wait(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(["localgen"], timeout or 0)
            self.returncode = status(self._replies)  # as Popen's: negative for a signal
            self._replies.close()
            self._conn.close()
        return self.returncode

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:
        """As Popen's: `input` written to stdin and stdin closed, stdout and stderr read to their ends (those
        that are pipes; None for the others), and the exit waited for; TimeoutExpired past `timeout`."""
        got: dict[str, Any] = {}
        readers = [threading.Thread(target=lambda n=n, f=f: got.__setitem__(n, f.read()), daemon=True)
                   for n, f in (("out", self.stdout), ("err", self.stderr)) if f is not None]
        for t in readers:
            t.start()
        if self.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                if input:
                    self.stdin.write(input)
                self.stdin.close()
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in readers:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                raise subprocess.TimeoutExpired(["localgen"], timeout or 0)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return got.get("out"), got.get("err")

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # still unreaped: the pid is this child's
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _pipe_file(fd: int, reading: bool, text: bool, bufsize: int) -> Any:
    """The caller's end of a pipe as subprocess.Popen makes it: binary with `bufsize`, or text in the locale's
    encoding (stdin written through, line-buffered when bufsize is 1)."""
    import io

    # text with bufsize 1 is line-buffered text over a default binary buffer (as Popen makes it): a binary
    # file cannot buffer by lines
    raw = open(fd, "rb" if reading else "wb", -1 if text and bufsize == 1 else bufsize)  # noqa: SIM115
    if not text:
        return raw
    if reading:
        return io.TextIOWrapper(raw)
    return io.TextIOWrapper(raw, write_through=True, line_buffering=bufsize == 1)


def status(replies: Any) -> int:
    """The server's next line: a pid, or an exit status."""
    line = replies.readline()
    if not line:
        raise RuntimeError("the fork server closed the connection (see its log)")
    if line.startswith(b"refused: "):
        raise RuntimeError(line.decode().strip())
    return int(line)


def text(data: bytes) -> str:
    """subprocess's text mode: the locale's encoding and universal newlines."""
    import locale

    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


if __name__ == "__main__":
    preload()
    run_module(serve(sys.argv[1]))
