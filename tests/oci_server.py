"""A loopback OCI registry serving models as Docker Model Runner packages them (Docker Hub's ai/ namespace): GET
/v2/REPO/manifests/REF (REPO of any number of parts; REF a tag or sha256:HEX) and /v2/REPO/blobs/sha256:HEX with byte
ranges, the distribution spec's JSON errors. With `token` set, as Docker Hub does, every /v2/ request without
`Authorization: Bearer TOKEN` is a 401 with a `WWW-Authenticate: Bearer realm=...,service=...,scope=...` challenge,
and the realm (GET /token on the second host, 127.0.0.2, as auth.docker.io is another host) hands out TOKEN for the
right service and scope. Blob GETs can answer 307 to that second host (the CDN), which logs whether a token came
with them. Faults on demand: dropped connections at byte offsets (once each), answers of a given status, a token
refused from a blob's byte offset on (as a registry that revokes a token mid-pull: a 401 with error="invalid_token"),
and the realm's answers of a given status, one per token asked for (0: a token, as usual)."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

from tests import hub_server, registry_server
from tests.hub_server import HubFile

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
CONFIG = "application/vnd.docker.ai.model.config.v0.1+json"
GGUF = "application/vnd.docker.ai.gguf.v3"
MMPROJ = "application/vnd.docker.ai.mmproj"
TEMPLATE = "application/vnd.docker.ai.chat.template.jinja"
LICENSE = "application/vnd.docker.ai.license"
SAFETENSORS = "application/vnd.docker.ai.safetensors"
TOKEN = "t0k3n-for-tests"
SERVICE = "oci.test"


def descriptor(media: str, data: HubFile) -> dict[str, object]:
    return {"mediaType": media, "digest": "sha256:" + data.sha256, "size": data.size}


def config_blob(**config: object) -> HubFile:
    """A Docker model config blob (format, quantization, parameters, size, context_size, ...)."""
    return HubFile(json.dumps({"config": {"format": "gguf", **config}, "descriptor": {},
                               "rootfs": {"type": "rootfs", "diff_ids": []}}).encode())


@dataclass
class FakeOci:
    """What the tests set and read: manifests by REPO:REF (bytes, media type), blobs by digest, faults, the token
    rule, and logs of the requests: (path, Range, Accept, Authorization), the CDN's (path, Range, Authorization) and the
    realm's query strings."""

    manifests: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    blobs: dict[str, HubFile] = field(default_factory=dict)
    drop_after: dict[str, list[int]] = field(default_factory=dict)
    fail_statuses: list[int] = field(default_factory=list)
    refuse_from: dict[str, int] = field(default_factory=dict)  # digest -> a GET of it from this byte on is a 401
    token_statuses: list[int] = field(default_factory=list)  # the realm's next answers (0: a token)
    requests: list[tuple[str, str, str, str]] = field(default_factory=list)
    cdn_requests: list[tuple[str, str, str]] = field(default_factory=list)
    token_requests: list[dict[str, list[str]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    port: int = 0
    cdn_port: int = 0
    token: bool = True
    token_key: str = "token"  # or access_token, as some realms answer
    redirect_blobs: bool = False

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def reset(self) -> None:
        with self.lock:
            for d in (self.manifests, self.blobs, self.drop_after, self.refuse_from):
                d.clear()
            for x in (self.fail_statuses, self.token_statuses, self.requests, self.cdn_requests, self.token_requests):
                x.clear()
            self.token, self.token_key, self.redirect_blobs = True, "token", False

    def add(self, repo: str, tag: str, layers: list[tuple[str, HubFile]], config: HubFile | None = None,
            media: str = OCI_MANIFEST) -> bytes:
        """Serve REPO:TAG (and REPO@its digest) made of these (media type, bytes) layers; returns its bytes."""
        config = config or config_blob(quantization="Q4_1", parameters="135M", size="94MB", architecture="llama")
        doc = {"schemaVersion": 2, "mediaType": media, "config": descriptor(CONFIG, config),
               "layers": [descriptor(m, d) for m, d in layers]}
        raw = json.dumps(doc).encode()
        with self.lock:
            self.manifests[f"{repo}:{tag}"] = (raw, media)
            self.manifests[f"{repo}:sha256:{hashlib.sha256(raw).hexdigest()}"] = (raw, media)
            for data in [config, *(d for _, d in layers)]:
                self.blobs.setdefault("sha256:" + data.sha256, data)
        return raw

    def add_index(self, repo: str, tag: str, entries: list[tuple[bytes, dict[str, object]]]) -> bytes:
        """Serve REPO:TAG as an image index of these manifests (each with its entry's extra fields)."""
        doc = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
            {"mediaType": OCI_MANIFEST, "digest": "sha256:" + hashlib.sha256(raw).hexdigest(), "size": len(raw),
             **extra} for raw, extra in entries]}
        raw = json.dumps(doc).encode()
        with self.lock:
            self.manifests[f"{repo}:{tag}"] = (raw, OCI_INDEX)
        return raw

    def blob_requests(self, digest: str) -> list[str]:
        return [r for p, r, _, _ in self.requests if p.endswith("/blobs/" + digest)]


def _handler(reg: FakeOci, cdn: bool = False) -> type[BaseHTTPRequestHandler]:
    route = re.compile(r"^/v2/(.+)/(manifests|blobs)/([^/]+)$")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for k, v in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def _error(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
            body = json.dumps({"errors": [{"code": code, "message": message}]}).encode()
            self._send(status, body, {"Content-Type": "application/json", **(headers or {})})

        def do_GET(self) -> None:
            url = urlparse(self.path)
            path = unquote(url.path)
            auth = self.headers.get("Authorization", "")
            if cdn and path == "/token":
                query = parse_qs(url.query)
                with reg.lock:
                    reg.token_requests.append(query)
                    status = reg.token_statuses.pop(0) if reg.token_statuses else 0
                if status:
                    return self._error(status, "DENIED", f"injected {status}")
                if query.get("service") != [SERVICE]:
                    return self._error(400, "BAD_SERVICE", "unknown service")
                return self._send(200, json.dumps({reg.token_key: TOKEN, "expires_in": 300}).encode(),
                                  {"Content-Type": "application/json"})
            with reg.lock:
                if cdn:
                    reg.cdn_requests.append((path, self.headers.get("Range", ""), auth))
                else:
                    reg.requests.append((path, self.headers.get("Range", ""), self.headers.get("Accept", ""), auth))
                status = reg.fail_statuses.pop(0) if reg.fail_statuses and not cdn else None
            m = route.match(path)
            if m is None:
                return self._error(404, "NOT_FOUND", "no such endpoint")
            repo, kind, ref = m.groups()
            if not cdn and reg.token and auth != f"Bearer {TOKEN}":
                challenge = (f'Bearer realm="http://127.0.0.2:{reg.cdn_port}/token",service="{SERVICE}",'
                             f'scope="repository:{repo}:pull"')
                return self._error(401, "UNAUTHORIZED", "authentication required", {"WWW-Authenticate": challenge})
            start = re.match(r"bytes=(\d+)-", self.headers.get("Range", ""))
            with reg.lock:
                refused = kind == "blobs" and int(start.group(1) if start else 0) >= reg.refuse_from.get(ref, 1 << 62)
            if refused:
                challenge = (f'Bearer realm="http://127.0.0.2:{reg.cdn_port}/token",service="{SERVICE}",'
                             f'scope="repository:{repo}:pull",error="invalid_token"')
                return self._error(401, "UNAUTHORIZED", "token revoked", {"WWW-Authenticate": challenge})
            if status:
                return self._error(status, "INJECTED", f"injected {status}",
                                   {"Retry-After": "Thu, 01 Jan 1970 00:00:00 GMT"} if status in (429, 503) else None)
            if kind == "manifests":
                found = reg.manifests.get(f"{repo}:{ref}")
                if found is None:
                    return self._error(404, "MANIFEST_UNKNOWN", "manifest unknown")
                return self._send(200, found[0], {"Content-Type": found[1]})
            data = reg.blobs.get(ref)
            if data is None:
                return self._error(404, "BLOB_UNKNOWN", "blob unknown to registry")
            if reg.redirect_blobs and not cdn:
                return self._send(307, b"", {"Location": f"http://127.0.0.2:{reg.cdn_port}{self.path}"})
            return self._blob(ref, data)

        def _blob(self, digest: str, f: HubFile) -> None:
            registry_server.send_blob(self, reg.lock, reg.drop_after, digest, f, self._error)

    return Handler


def start() -> tuple[FakeOci, ThreadingHTTPServer]:
    """Start the registry on a free loopback port, and its CDN and token realm on 127.0.0.2."""
    reg = FakeOci()
    return reg, hub_server.with_cdn(reg, _handler)
