"""A `localgen serve` for one client (`localgen launch`): found already answering at an address, or started as a
child on a free loopback port with a fresh random key, waited for, and stopped again."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localgen import proxies
from localgen.errors import LocalgenError

STOP_WAIT_S = 30.0  # serve finishes the requests in flight (--drain-timeout, 4 s) and writes its prompt cache
TAIL_LINES = 15  # of a server's log, shown when it ends before it answers


class ServeExited(LocalgenError):
    """The started server ended before it answered: `tail`, the end of its log, says why."""

    def __init__(self, message: str, tail: str) -> None:
        super().__init__(message)
        self.tail = tail


def url_of(host: str, port: int) -> str:
    """http://host:port, an IPv6 address in brackets (once: `[::1]` is kept as it is)."""
    return f"http://{'[' + host + ']' if ':' in host and not host.startswith('[') else host}:{port}"


HEALTH_S = 10  # for a server's /health: one busy generating on every core (or a loaded machine) may take seconds


def running_at(url: str) -> bool | None:
    """Whether a localgen server answers /health at url (its `status` and `models`): True; nothing answers:
    False; something else answers: None. A 503 (a model's worker stopped) is an error rather than a server to
    use."""
    import httpx

    try:
        r = proxies.get(f"{url}/health", timeout=HEALTH_S)
    except (httpx.ReadTimeout, httpx.RemoteProtocolError):  # it listens, and gives no answer in time: no localgen
        return None
    except httpx.HTTPError:
        return False
    try:
        doc = r.json()
    except ValueError:
        return None
    if not (isinstance(doc, dict) and "status" in doc and "models" in doc):
        return None  # something else listens there
    if r.status_code != 200:
        raise LocalgenError(f"the localgen server at {url} answers /health with {r.status_code}: a model's worker "
                            "has stopped", hint="restart it, or give --own-server")
    return True


def default_model(url: str, key: str | None) -> str:
    """The model the server at url answers a request that names none (/v1/models marks it `default`)."""
    doc = _get(url, "/v1/models", key)
    names = [m.get("id") for m in doc.get("data", []) if isinstance(m, dict) and m.get("default")]
    if not names or not isinstance(names[0], str):
        raise LocalgenError(f"the server at {url} has no default model", hint="give -m MODEL")
    return names[0]


def check_model(url: str, key: str | None, model: str) -> dict[str, Any]:
    """The server at url offers `model` (by /v1/models/{id}): its entry there (a serve --endpoint model's names
    its server in `upstream`), else an error that says so."""
    from urllib.parse import quote

    return _get(url, f"/v1/models/{quote(model, safe='')}", key,
                missing=f"the server at {url} does not offer {model}")


def _get(url: str, path: str, key: str | None, missing: str | None = None) -> dict[str, Any]:
    import httpx

    headers = {b"Authorization": f"Bearer {key}".encode()} if key else {}
    try:
        r = proxies.get(f"{url}{path}", headers=headers, timeout=30)
    except httpx.HTTPError as e:
        raise LocalgenError(f"the server at {url} did not answer {path}: {e}") from None
    if r.status_code == 401:
        raise LocalgenError(f"the server at {url} needs an API key" if not key else
                            f"the server at {url} refused the API key given",
                            hint="give --api-key-file FILE (or set LOCALGEN_API_KEY), or --own-server")
    if r.status_code == 404 and missing:
        raise LocalgenError(missing, hint="localgen list shows the models here")
    if r.status_code != 200:
        raise LocalgenError(f"{url}{path} answered {r.status_code}: {r.text[:200]}")
    doc = r.json()
    return doc if isinstance(doc, dict) else {}


def free_port() -> int:
    """A loopback TCP port nothing listens on now."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _end_with_parent() -> None:
    """In the child, before serve starts (Linux): SIGTERM when the process that started it ends, however it
    ends (SIGKILL too), so that no server outlives its client."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


@dataclass
class ChildServer:
    """`localgen serve` started for one client: in its own session (Windows: process group), which a Ctrl-C typed
    at the client's terminal never reaches, its key in a pipe it inherits (no file holds it; Windows: a 0600 file
    in a private temporary folder, deleted once serve answers), its output in a log in a private temporary folder."""

    args: list[str]  # serve's own flags past the ones set here (-m, --ctx, ...)
    host: str = "127.0.0.1"
    port: int = 0
    key: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    folder: Path | None = None
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return url_of(self.host, self.port)

    @property
    def log(self) -> Path:
        assert self.folder is not None
        return self.folder / "serve.log"

    def start(self) -> None:
        """Start serve: the key travels in a pipe that serve inherits and reads as its --api-key-file /dev/fd/N
        (only that path is on its command line), so that nothing is left holding it however launch ends."""
        self.folder = Path(tempfile.mkdtemp(prefix="localgen-launch-"))  # 0700
        self.port = self.port or free_port()
        env = {k: v for k, v in os.environ.items() if k not in ("LOCALGEN_API_KEY", "LOCALGEN_HOST", "LOCALGEN_PORT")}
        fds: tuple[int, ...] = ()
        spawn: dict[str, Any]  # Popen's flags for a process of its own
        if sys.platform == "win32":  # no /dev/fd, no sessions: a process group of its own, which no Ctrl-C reaches
            key_file = str(self.folder / "key")
            fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(self.key)
            spawn = {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP}
        else:
            read, write = os.pipe()  # a key is far less than a pipe's buffer: the write never blocks
            os.write(write, self.key.encode())
            os.close(write)
            key_file, fds = f"/dev/fd/{read}", (read,)
            spawn = {"start_new_session": True, "preexec_fn": _end_with_parent, "pass_fds": fds}
        argv = [sys.executable, "-m", "localgen", "serve", "--host", self.host, "--port", str(self.port),
                "--api-key-file", key_file, *self.args]
        try:
            with open(self.log, "wb") as log:
                self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                                env=env, **spawn)
        finally:
            for fd in fds:
                os.close(fd)

    def wait_ready(self, tick: Callable[[float], None] | None = None) -> None:
        """Wait until the server answers /health (then, on Windows, its key file goes: serve read it at start).
        A server that exits first: an error with the end of its log."""
        import httpx

        assert self.process is not None
        began = time.monotonic()
        while True:
            code = self.process.poll()
            if code is not None:
                raise ServeExited(f"localgen serve exited with status {code} before it answered (its last lines "
                                  "are above)", tail=self.tail())
            try:
                if proxies.get(f"{self.url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if tick is not None:
                tick(time.monotonic() - began)
            time.sleep(0.2)
        assert self.folder is not None
        (self.folder / "key").unlink(missing_ok=True)

    def tail(self) -> str:
        """The last lines of the server's log."""
        try:
            lines = self.log.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-TAIL_LINES:]) or "(it wrote nothing)"

    def stop(self) -> None:
        """SIGTERM, then wait (SIGKILL past STOP_WAIT_S); the private folder and the key go with it."""
        p = self.process
        try:
            if p is not None and p.poll() is None:
                _end(p, hard=False)
                try:
                    p.wait(timeout=STOP_WAIT_S)
                except subprocess.TimeoutExpired:
                    _end(p, hard=True)
                    p.wait()
        finally:
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)


def _end(p: subprocess.Popen[bytes], hard: bool) -> None:
    """SIGTERM (hard: SIGKILL) to serve and anything it started (an MCP tool server), its session's process group;
    Windows has neither signal nor sessions: TerminateProcess, serve alone."""
    if sys.platform == "win32":
        if hard:
            p.kill()
        else:
            p.terminate()
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL if hard else signal.SIGTERM)
