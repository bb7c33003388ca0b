"""A loopback stand-in for Ollama's registry (a Docker v2 registry's read side, as `ollama pull` uses it):
GET /v2/NAMESPACE/MODEL/manifests/TAG and GET /v2/NAMESPACE/MODEL/blobs/sha256:HEX with byte ranges, 404s with
the registry's JSON errors. Faults on demand: dropped connections (at byte offsets, once each), a blob whose bytes
are not its digest's, answers of a given status. Like registry.ollama.ai, whose blobs are a redirect to a CDN,
blob GETs can answer 307 to a second host (127.0.0.2), which logs what it is sent. Binds to loopback only and
stops with the session."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from tests import hub_server
from tests.hub_server import HubFile

MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
OLLAMA = "application/vnd.ollama.image."


def layer(media: str, data: HubFile) -> dict[str, object]:
    """A manifest's entry for a blob (`media`: model, params, system, ... or a whole media type)."""
    return {"mediaType": media if "/" in media else OLLAMA + media, "digest": "sha256:" + data.sha256,
            "size": data.size}


@dataclass
class FakeRegistry:
    """State the tests set and read: manifests by NAMESPACE/MODEL:TAG (their exact bytes), blobs by digest, faults,
    and a log of the requests (method, path, Range, Accept)."""

    manifests: dict[str, bytes] = field(default_factory=dict)
    blobs: dict[str, HubFile] = field(default_factory=dict)  # "sha256:HEX" -> bytes served
    drop_after: dict[str, list[int]] = field(default_factory=dict)  # digest -> offsets to drop at, once each
    fail_statuses: list[int] = field(default_factory=list)  # the next answers, used once each
    requests: list[tuple[str, str, str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    port: int = 0
    redirect_blobs: bool = False  # blob GETs answer 307 to the CDN
    cdn_port: int = 0
    cdn_requests: list[tuple[str, str]] = field(default_factory=list)  # (path, Range)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def reset(self) -> None:
        with self.lock:
            self.manifests.clear()
            self.blobs.clear()
            self.drop_after.clear()
            self.fail_statuses.clear()
            self.requests.clear()
            self.redirect_blobs = False
            self.cdn_requests.clear()

    def add(self, name: str, layers: list[tuple[str, HubFile]], config: HubFile | None = None) -> bytes:
        """Serve a model NAMESPACE/MODEL:TAG made of these (media, bytes) layers; returns its manifest's bytes."""
        config = config or HubFile(json.dumps({"model_format": "gguf", "model_family": "llama"}).encode())
        doc = {"schemaVersion": 2, "mediaType": MANIFEST_TYPE,
               "config": layer("application/vnd.docker.container.image.v1+json", config),
               "layers": [layer(media, data) for media, data in layers]}
        raw = json.dumps(doc).encode()
        with self.lock:
            self.manifests[name] = raw
            for data in [config, *(d for _, d in layers)]:
                self.blobs.setdefault("sha256:" + data.sha256, data)
        return raw

    def blob_requests(self, digest: str) -> list[str]:
        """The Range headers of the GETs of one blob, in order ("" for none)."""
        return [r for m, p, r, _ in self.requests if m == "GET" and p.endswith("/blobs/" + digest)]


def wrong(data: HubFile) -> HubFile:
    """Bytes of `data`'s size and digest that are not its bytes (one byte flipped in the middle)."""
    return HubFile(data.source, data.sha256, corrupt_at=data.size // 2)


def sha256(data: bytes | Path) -> str:
    return HubFile(data).sha256 if isinstance(data, Path) else hashlib.sha256(data).hexdigest()


def _handler(reg: FakeRegistry, cdn: bool = False) -> type[BaseHTTPRequestHandler]:
    route = re.compile(r"^/v2/([^/]+)/([^/]+)/(manifests|blobs)/([^/]+)$")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _error(self, status: int, code: str, message: str) -> None:
            body = json.dumps({"errors": [{"code": code, "message": message}]}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if status == 429:
                self.send_header("Retry-After", "1")  # as a registry that limits its rate says when to come back
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            path = unquote(urlparse(self.path).path)
            with reg.lock:
                if cdn:
                    reg.cdn_requests.append((path, self.headers.get("Range", "")))
                else:
                    reg.requests.append(("GET", path, self.headers.get("Range", ""), self.headers.get("Accept", "")))
                status = reg.fail_statuses.pop(0) if reg.fail_statuses and not cdn else None
            if status:
                return self._error(status, "INJECTED", f"injected {status}")
            m = route.match(path)
            if m is None:
                return self._error(404, "NOT_FOUND", "no such endpoint")
            ns, model, kind, ref = m.groups()
            if kind == "manifests":
                raw = reg.manifests.get(f"{ns}/{model}:{ref}")
                if raw is None:
                    return self._error(404, "MANIFEST_UNKNOWN", "manifest unknown")
                self.send_response(200)
                self.send_header("Content-Type", MANIFEST_TYPE)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)
                return None
            data = reg.blobs.get(ref)
            if data is None:
                return self._error(404, "BLOB_UNKNOWN", "blob unknown to registry")
            if reg.redirect_blobs and not cdn:
                self.send_response(307)
                self.send_header("Location", f"http://127.0.0.2:{reg.cdn_port}{self.path}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            return self._blob(ref, data)

        def _blob(self, digest: str, f: HubFile) -> None:
            send_blob(self, reg.lock, reg.drop_after, digest, f, self._error)

    return Handler


def start() -> tuple[FakeRegistry, ThreadingHTTPServer]:
    """Start the fake registry on a free loopback port, and its CDN on 127.0.0.2 (stopped with it)."""
    reg = FakeRegistry()
    return reg, hub_server.with_cdn(reg, _handler)


def send_blob(h: Any, lock: threading.Lock, drop_after: dict[str, list[int]], digest: str, f: HubFile,
              error: Callable[[int, str, str], None]) -> None:
    """A blob's bytes as a registry sends them, from its Range on (206), or an `error` 416 past its end; the
    connection cut at the first offset of drop_after[digest] the bytes reach (each offset once)."""
    start, end, status = 0, f.size, 200
    m = re.match(r"bytes=(\d+)-(\d*)$", h.headers.get("Range", ""))
    if m:
        start = int(m.group(1))
        end = min(f.size, int(m.group(2)) + 1) if m.group(2) else f.size
        if start >= f.size:
            return error(416, "RANGE", "Range Not Satisfiable")
        status = 206
    h.send_response(status)
    h.send_header("Content-Type", "application/octet-stream")
    h.send_header("Accept-Ranges", "bytes")
    h.send_header("Content-Length", str(end - start))
    if status == 206:
        h.send_header("Content-Range", f"bytes {start}-{end - 1}/{f.size}")
    h.end_headers()
    pos = start
    while pos < end:
        n = min(1 << 20, end - pos)
        with lock:
            drops = drop_after.get(digest, [])
            cut = next((d for d in drops if pos <= d < pos + n), None)
            if cut is not None:
                drops.remove(cut)
        if cut is not None:
            h.wfile.write(f.read(pos, cut))
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(2)
            return None
        try:
            h.wfile.write(f.read(pos, pos + n))
        except (BrokenPipeError, ConnectionResetError):
            return None
        pos += n
    return None
