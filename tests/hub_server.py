"""A loopback stand-in for the Hugging Face Hub, enough for huggingface_hub and localgen's transfers:
GET /api/models/{repo}[/revision/{rev}] (with siblings and LFS SHA-256s), GET /api/models/{repo}/tree/{rev},
HEAD/GET /{repo}/resolve/{rev}/{file} with X-Repo-Commit, X-Linked-Etag, X-Linked-Size and byte ranges,
X-Error-Code on 4xx. Faults on demand: dropped connections, wrong bytes, 5xx and 429 (with a Retry-After), gated
repos, slow transfers, and
answers that are not the file (a captive portal's 200, a 206 of the wrong range or of none said, a redirect loop).
Like the real Hub's LFS and Xet files, file downloads can answer with a redirect to a second host (a "CDN"
on 127.0.0.2), which records the headers it is sent. Both bind to loopback only and stop with the session."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse


@dataclass
class HubFile:
    """A file the fake Hub serves: bytes from a path (optionally corrupted), advertised size and SHA-256."""

    source: Path | bytes
    sha256: str = ""
    corrupt_at: int | None = None  # flip one byte here while serving (same size, wrong bytes)

    def __post_init__(self) -> None:
        if not self.sha256:
            h = hashlib.sha256()
            if isinstance(self.source, bytes):
                h.update(self.source)
            else:
                with open(self.source, "rb") as f:
                    while block := f.read(1 << 22):
                        h.update(block)
            self.sha256 = h.hexdigest()

    @property
    def size(self) -> int:
        return len(self.source) if isinstance(self.source, bytes) else self.source.stat().st_size

    def read(self, start: int, end: int) -> bytes:
        if isinstance(self.source, bytes):
            data = self.source[start:end]
        else:
            with open(self.source, "rb") as f:
                f.seek(start)
                data = f.read(end - start)
        if self.corrupt_at is not None and start <= self.corrupt_at < end:
            i = self.corrupt_at - start
            data = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
        return data


@dataclass
class HubRepo:
    commit: str
    files: dict[str, HubFile]
    gated: bool = False  # the API and the files need a token
    gated_files: bool = False  # the API answers; the files need a token (the real Hub's gated repos)


@dataclass
class FakeHub:
    """State the tests set and read: repos, faults, and a log of what was sent."""

    repos: dict[str, HubRepo] = field(default_factory=dict)
    drop_after: dict[str, list[int]] = field(default_factory=dict)  # file -> byte offsets to drop at, used once each
    fail_statuses: list[int] = field(default_factory=list)  # next API/resolve answers, used once each
    fail_listings: list[int] = field(default_factory=list)  # next /api/models/ answers (the listing), once each
    fail_downloads: list[int] = field(default_factory=list)  # next file GETs (the download loop), used once each
    retry_after: str | None = None  # the Retry-After header each injected failure (above) is sent with
    delay_per_mb: float = 0.0
    sent: dict[str, int] = field(default_factory=dict)  # file -> bytes sent in total
    requests: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    port: int = 0
    redirect_files: bool = False  # resolve answers 302 to the CDN host
    cdn_port: int = 0
    cdn_requests: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Authorization header)
    hub_auth: list[str | None] = field(default_factory=list)  # Authorization headers the Hub itself saw
    # file -> the next GETs' wrong answers, used once each: "portal" (200, a 55-byte HTML page), "from0" (206 of
    # the file from byte 0 whatever was asked, its Content-Range saying so), "norange" (206 with no Content-Range:
    # the file's first 64 KiB whatever was asked), "loop" (302 to itself), "streamed" (200, the whole file with no
    # Content-Length, to the connection's close, as a proxy streams it), "streamedpage" (a page sent that way)
    answers: dict[str, list[str]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reset(self) -> None:
        with self.lock:
            self.repos.clear()
            self.drop_after.clear()
            self.fail_statuses.clear()
            self.fail_downloads.clear()
            self.fail_listings.clear()
            self.retry_after = None
            self.delay_per_mb = 0.0
            self.sent.clear()
            self.requests.clear()
            self.redirect_files = False
            self.cdn_requests.clear()
            self.hub_auth.clear()
            self.answers.clear()


def _handler(hub: FakeHub, cdn: bool = False) -> type[BaseHTTPRequestHandler]:
    api = re.compile(r"^/api/models/([^/]+/[^/]+)(?:/revision/([^/]+)|/tree/([^/]+))?/?$")
    resolve = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _error(self, status: int, code: str | None, message: str, injected: bool = False) -> None:
            body = json.dumps({"error": message}).encode()
            self.send_response(status)
            if injected and hub.retry_after is not None:
                self.send_header("Retry-After", hub.retry_after)
            if code:
                self.send_header("X-Error-Code", code)
                self.send_header("X-Error-Message", message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _fault(self) -> bool:
            with hub.lock:
                status = hub.fail_statuses.pop(0) if hub.fail_statuses else None
            if status:
                self._error(status, None, f"injected {status}", injected=True)
                return True
            return False

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            path = unquote(urlparse(self.path).path)
            with hub.lock:
                if cdn:
                    hub.cdn_requests.append((path, self.headers.get("Authorization")))
                else:
                    hub.requests.append(f"{self.command} {path} {self.headers.get('Range', '')}")
                    hub.hub_auth.append(self.headers.get("Authorization"))
            if not cdn and self._fault():
                return
            m = api.match(path)
            if m:
                with hub.lock:
                    failure = hub.fail_listings.pop(0) if hub.fail_listings else None
                if failure:
                    return self._error(failure, None, f"injected {failure} into the listing", injected=True)
                return self._api(m.group(1), m.group(2) or m.group(3) or "main", tree=m.group(3) is not None)
            m = resolve.match(path)
            if m:
                return self._resolve(m.group(1), m.group(2), m.group(3))
            self._error(404, "EntryNotFound", "no such endpoint")

        def _repo(self, repo_id: str, revision: str, file: bool = False) -> HubRepo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(401, "RepoNotFound", "Repository not found")
                return None
            gated = repo.gated or (file and repo.gated_files and not cdn)
            if gated and "authorization" not in {k.lower() for k in self.headers}:
                self._error(401, "GatedRepo", "Access to this repo is restricted")
                return None
            if revision not in ("main", repo.commit):
                self._error(404, "RevisionNotFound", "Revision not found")
                return None
            return repo

        def _api(self, repo_id: str, revision: str, tree: bool) -> None:
            repo = self._repo(repo_id, revision)
            if repo is None:
                return
            if tree:
                doc: object = [
                    {"type": "file", "path": n, "size": f.size, "oid": f.sha256[:40],
                     "lfs": {"oid": f.sha256, "size": f.size, "pointerSize": 134}}
                    for n, f in repo.files.items()
                ]
            else:
                doc = {
                    "id": repo_id, "modelId": repo_id, "sha": repo.commit, "private": False, "gated": repo.gated,
                    "siblings": [
                        {"rfilename": n, "size": f.size, "blobId": f.sha256[:40],
                         "lfs": {"sha256": f.sha256, "size": f.size, "pointerSize": 134}}
                        for n, f in repo.files.items()
                    ],
                }
            body = json.dumps(doc).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _resolve(self, repo_id: str, revision: str, name: str) -> None:
            repo = self._repo(repo_id, revision, file=True)
            if repo is None:
                return
            f = repo.files.get(name)
            if f is None:
                self._error(404, "EntryNotFound", "Entry not found")
                return
            if hub.redirect_files and not cdn:
                self.send_response(302)
                self.send_header("Location", f"http://127.0.0.2:{hub.cdn_port}{self.path}")
                self.send_header("X-Repo-Commit", repo.commit)
                self.send_header("X-Linked-Etag", f'"{f.sha256}"')
                self.send_header("X-Linked-Size", str(f.size))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            with hub.lock:
                failure = hub.fail_downloads.pop(0) if self.command == "GET" and hub.fail_downloads else None
                wrong = hub.answers.get(name, [])
                answer = wrong.pop(0) if self.command == "GET" and wrong else None
            if failure:
                self._error(failure, None, f"injected {failure} into the download", injected=True)
                return
            if answer:  # ("": the file itself, this once)
                return self._wrong(answer, f)
            start, end = 0, f.size
            rng = self.headers.get("Range")
            status = 200
            if rng:
                m = re.match(r"bytes=(\d+)-(\d*)$", rng)
                if m:
                    start = int(m.group(1))
                    end = min(f.size, int(m.group(2)) + 1) if m.group(2) else f.size
                    if start >= f.size:
                        self._error(416, None, "Range Not Satisfiable")
                        return
                    status = 206
            self.send_response(status)
            self.send_header("X-Repo-Commit", repo.commit)
            self.send_header("X-Linked-Etag", f'"{f.sha256}"')
            self.send_header("ETag", f'"{f.sha256}"')
            self.send_header("X-Linked-Size", str(f.size))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(end - start))
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{f.size}")
            self.end_headers()
            if self.command == "HEAD":
                return
            pos = start
            while pos < end:
                n = min(1 << 20, end - pos)
                with hub.lock:
                    drops = hub.drop_after.get(name, [])
                    cut = next((d for d in drops if pos <= d < pos + n), None)
                    if cut is not None:
                        drops.remove(cut)
                if cut is not None:
                    if cut > pos:
                        self.wfile.write(f.read(pos, cut))
                        with hub.lock:
                            hub.sent[name] = hub.sent.get(name, 0) + cut - pos
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                try:
                    self.wfile.write(f.read(pos, pos + n))
                except (BrokenPipeError, ConnectionResetError):
                    return
                with hub.lock:
                    hub.sent[name] = hub.sent.get(name, 0) + n
                pos += n
                if hub.delay_per_mb:
                    time.sleep(hub.delay_per_mb)

        def _wrong(self, answer: str, f: HubFile) -> None:
            """An answer that is not the file, or not the part asked for (FakeHub.answers)."""
            if answer == "loop":
                self.send_response(302)
                self.send_header("Location", self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if answer in ("streamed", "streamedpage"):
                page = answer == "streamedpage"
                self.send_response(200)
                self.send_header("Content-Type", "text/html" if page else "application/octet-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(b"<html>proxy error</html>" if page else f.read(0, f.size))
                return
            if answer == "portal":
                body = b"<html><body>Captive portal: please log in</body></html>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
            else:
                body = f.read(0, f.size if answer == "from0" else 1 << 16)
                self.send_response(206)
                self.send_header("Content-Type", "application/octet-stream")
                if answer == "from0":
                    self.send_header("Content-Range", f"bytes 0-{f.size - 1}/{f.size}")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                return
            with hub.lock:
                hub.sent[self.path] = hub.sent.get(self.path, 0) + len(body)

    return Handler


def start() -> tuple[FakeHub, ThreadingHTTPServer]:
    """Start the fake Hub on a free loopback port, and its CDN on 127.0.0.2."""
    hub = FakeHub()
    return hub, with_cdn(hub, _handler)


def with_cdn(state: Any, handler: Any) -> ThreadingHTTPServer:
    """Serve `handler(state)` on a free loopback port and `handler(state, cdn=True)` on 127.0.0.2 (the server's
    `cdn`, stopped with it), each in a thread; their ports go to state.port and state.cdn_port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(state))
    server.daemon_threads = True
    state.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cdn = ThreadingHTTPServer(("127.0.0.2", 0), handler(state, cdn=True))
    cdn.daemon_threads = True
    state.cdn_port = cdn.server_address[1]
    threading.Thread(target=cdn.serve_forever, daemon=True).start()
    server.cdn = cdn  # type: ignore[attr-defined]  (stopped with the server)
    return server
