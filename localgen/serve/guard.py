"""What every request passes before a route, outermost first: the Host check (against DNS rebinding, while
serving on loopback), the Origin allow-list (a web page may use the server only from an allowed origin;
CORS headers for those), the API key, and for a request with a body to a route that takes it (another is the
router's 404 or 405, whatever its body): JSON's content type and a size bound.
Clients that are not browsers send no Origin and pass the origin check as they are. Ollama's API (/api/*)
also reads a body sent as a form, as text/plain or with no type as JSON, as Ollama does (`curl -d '{...}'`, a
page's fetch with a string body): a browser's form post or fetch, the cross-site request a JSON-only rule would
stop, carries an Origin, which is checked above."""

from __future__ import annotations

import asyncio
import functools
import hmac
import ipaddress
import re
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Match

from localgen.errors import UsageError
from localgen.serve.apierror import HTTPError, api_of, error_body, error_response
from localgen.serve.stalls import DEFAULT_READ_TIMEOUT_S, BodyClock

ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]

# Ollama's defaults: pages served from this machine, and the desktop shells that embed them.
LOOPBACK_ORIGINS = tuple(f"{scheme}://{host}{port}" for host in ("localhost", "127.0.0.1", "[::1]", "0.0.0.0")
                         for scheme in ("http", "https") for port in ("", ":*"))
APP_ORIGINS = ("app://*", "file://*", "tauri://*", "vscode-webview://*", "vscode-file://*")
DEFAULT_ORIGINS = LOOPBACK_ORIGINS + APP_ORIGINS
# What Ollama's documented `curl http://localhost:11434/api/generate -d '{...}'` sends (curl's -d is a form
# type), what a page's fetch(url, {method: "POST", body: JSON.stringify(x)}) sends (text/plain;charset=UTF-8),
# or a client that names no type; each body is read as JSON on /api/*, as Ollama reads any. A cross-site page
# can send these without a preflight, as it can a form type: its request carries an Origin (a browser sends one
# with every POST; `null` where it hides it), which the Origin check refuses unless allowed.
OLLAMA_BODY_TYPES = ("application/x-www-form-urlencoded", "text/plain", "")


# Headers a request may carry once: two Hosts would let the DNS-rebinding check read one while a proxy or
# the route reads the other; two Content-Types, a body checked as one type and read as another.
SINGLE_HEADERS = ("Host", "Content-Type", "Content-Length", "Content-Encoding")

# Methods whose body a route may read (Ollama's DELETE /api/delete reads JSON): each body is bounded by
# --max-body and --read-timeout here. A DELETE's type is not asked for: OpenAI's clients send none.
BODY_METHODS = ("POST", "PUT", "PATCH", "DELETE")

# The bytes of the bodies still arriving, all connections together, are at most this many times --max-body: past
# it a body is a 503, so that N clients each holding a body short of its end never hold N x --max-body.
BODIES_HELD = 4


@dataclass(frozen=True)
class Policy:
    """The server's gate: API key, allowed origins (patterns whose only wildcard is `*`; "*" alone: any),
    whether the Host header must name this machine, the largest request body, and the paths open without
    the key (they hold no data: /health, and `/` with the chat page's files)."""

    api_key: str | None = None
    origins: tuple[str, ...] = DEFAULT_ORIGINS
    check_host: bool = True
    names: tuple[str, ...] = ()  # names that mean this machine besides its own: serve --host's, where loopback
    max_body: int = 16 << 20
    read_timeout: float = DEFAULT_READ_TIMEOUT_S  # seconds a body may stall before a 408 (serve --read-timeout)
    open_paths: tuple[str, ...] = ("/health", "/")
    uploads: tuple[str, ...] = ()  # paths whose POST body is a file upload the route reads and bounds itself
    bodiless: tuple[str, ...] = ()  # patterns of paths whose POST reads no body: no Content-Type is asked for

    def origin_allowed(self, origin: str) -> bool:
        """Whether a page at this origin may use the server."""
        o = origin.strip().lower()
        return any(p == "*" or _origin_pattern(p.lower()).fullmatch(o) is not None for p in self.origins)


@functools.lru_cache(maxsize=256)
def _origin_pattern(pattern: str) -> re.Pattern[str]:
    """An origin pattern as a regex: `*` matches any run of characters, every other character only itself
    (fnmatch would read the brackets of `[::1]` as a character class, and `?` as a wildcard)."""
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")), re.DOTALL)


# An origin as a browser sends it (scheme://host[:port], no path), `*` standing for any run of characters
# in the scheme, the host or the port; or `*` alone, for any origin.
_ORIGIN = re.compile(r"\*|[a-z*][a-z0-9+.*-]*://(?:\[[0-9a-f:.*]+\]|[a-z0-9._~*-]+)(?::[0-9*]+)?", re.I)


def origins_from(extra: list[str] | None, env: str | None) -> tuple[str, ...]:
    """The default origins, widened by --cors (repeatable) and LOCALGEN_ORIGINS (comma-separated); a
    UsageError names one that is not an origin (a path, a space, a pattern without its scheme)."""
    more = [*(("--cors", o) for o in extra or []), *(("LOCALGEN_ORIGINS", o) for o in (env or "").split(","))]
    out = []
    for source, given in more:
        origin = given.strip().rstrip("/")
        if not origin and not given.strip():
            continue
        if _ORIGIN.fullmatch(origin) is None:
            raise UsageError(f"{source}: {given.strip()!r} is not an origin: give scheme://host[:port] (such as "
                             "https://chat.example.com, https://*.example.com or http://localhost:*), or * for any")
        out.append(origin)
    return DEFAULT_ORIGINS + tuple(out)


# A Host header as RFC 9110 allows it: a bracketed IPv6 address or a name (or IPv4 address), then an optional
# port; anything else ("localhost:1@evil.com", a path, a space) is refused whole, never cut at a separator.
_HOST = re.compile(r"(?:\[(?P<v6>[0-9a-f:.]+)\]|(?P<name>[a-z0-9._-]+))(?::(?P<port>[0-9]{1,5}))?")
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


# Where a home or office network names its machines, and no public DNS can answer: .local (mDNS, RFC 6762),
# .home.arpa (RFC 8375), .internal (ICANN, 2024), and .lan, .home and .localdomain, which the root zone never
# delegated (routers' and distributions' defaults). This machine's name under one is still this machine's.
PRIVATE_SUFFIXES = ("local", "home.arpa", "internal", "lan", "home", "localdomain")


def host_allowed(host: str, names: tuple[str, ...] = ()) -> bool:
    """A Host header that can only mean this machine: an IP address, localhost or a name under it, or this
    machine's own name (alone, or under a PRIVATE_SUFFIXES suffix: vm.local), each with an optional port. A DNS
    name an attacker controls that resolves to 127.0.0.1 is none of these. A name under .localhost
    (app.localhost) is accepted: RFC 6761 reserves it for loopback, browsers resolve it to loopback themselves and
    the root zone never delegates it, so no attacker can point one elsewhere, and local tools use such names for
    the same machine. `names`: more names that mean it (the name serve listens on, one that resolves to loopback
    only)."""
    text = host.strip().lower()
    if not text:
        return True  # HTTP/1.0 without Host: not a browser
    m = _HOST.fullmatch(text)
    if m is None or (m["port"] is not None and int(m["port"]) > 65535):
        return False
    name = m["v6"] or m["name"].removesuffix(".")
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        if m["v6"]:
            return False
    if own_name(name) or name in names:
        return True
    labels = name.split(".")
    return labels[-1] == "localhost" and all(_LABEL.fullmatch(label) for label in labels)


def own_name(name: str) -> bool:
    """Whether a host name is this machine's: its name as gethostname() gives it, or that name's first label
    followed by a PRIVATE_SUFFIXES suffix (vm.local, vm.lan, vm.home.arpa, vm.internal)."""
    import socket

    me = socket.gethostname().lower().removesuffix(".")
    if not me or name == me:
        return bool(me)
    first, _, rest = name.partition(".")
    return first == me.split(".")[0] and rest in PRIVATE_SUFFIXES  # not deeper: vm.x.lan may be a search
    # domain's fallback another machine answers


def same_origin(origin: str, host: str, names: tuple[str, ...] = ()) -> bool:
    """A page this server served, calling it back: its origin names the Host the request came to, and that
    Host can only mean this machine (an address, localhost, its name, alone or under a private suffix). The chat
    page opened at http://192.168.1.5:11435/ or http://vm.local:11435/ is so; a public DNS name (rebinding) never
    is; nor is the name serve listens on (`names`: one that resolves to loopback only)."""
    authority = origin.strip().lower().partition("://")[2]
    return bool(authority) and authority == host.strip().lower() and host_allowed(host, names)


class Gate:
    """The ASGI middleware that applies a Policy (Starlette's CORSMiddleware sits inside it for the headers
    and preflights of allowed origins)."""

    def __init__(self, app: ASGIApp, policy: Policy, routes: Sequence[BaseRoute] | None = None) -> None:
        self.app = app
        self.policy = policy
        self.routes = routes  # None: every request is taken to reach a route (an app that answers 404s itself)
        self.key = policy.api_key.encode() if policy.api_key else None
        self.cors = _cors(self._after_origin, policy)
        self.arriving = 0  # bytes of the bodies being read, not all come yet (BODIES_HELD)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        doubled = next((name for name in SINGLE_HEADERS if len(headers.getlist(name)) > 1), None)
        if doubled is not None:  # which one counts would differ from proxy to proxy: neither does
            await _refuse(scope, receive, send, HTTPError(400, f"the request has more than one {doubled} header",
                                                          "invalid_request_error"))
            return
        coding = headers.get("transfer-encoding")
        if coding is not None and coding.strip().lower() != "chunked":  # gzip, chunked: read as plain (RFC 9112: 501)
            await _refuse(scope, receive, send, HTTPError(
                501, f"the request's Transfer-Encoding {coding[:100]!r} is not one the server decodes: send the body "
                     "as it is, with a Content-Length or chunked", "invalid_request_error"), {"Connection": "close"})
            return
        if self.policy.check_host and not host_allowed(headers.get("host", ""), self.policy.names):
            await _refuse(scope, receive, send, HTTPError(
                403, f"Host {headers.get('host', '')[:100]!r} is not this machine's name: a server on loopback "
                     "answers only to localhost or an IP address (a guard against DNS rebinding)",
                "permission_error"))
            return
        origin = headers.get("origin")
        if (origin is not None and not self.policy.origin_allowed(origin)
                and not same_origin(origin, headers.get("host", ""), self.policy.names)):
            cure = (f"start serve with --cors {origin[:100]} (or set LOCALGEN_ORIGINS)"
                    if _ORIGIN.fullmatch(origin.strip().rstrip("/")) else  # as --cors takes it
                    "that names no origin --cors takes (a sandboxed frame or a local file sends null): only "
                    "--cors '*' (any page) allows it")
            await _refuse(scope, receive, send, HTTPError(
                403, f"requests from web pages at {origin[:100]} are not allowed: {cure}", "permission_error"))
            return
        await self.cors(scope, receive, send)

    async def _after_origin(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = Headers(scope=scope)
        path = scope["path"]
        if self.key is not None and path not in self.policy.open_paths:
            auth = headers.get("authorization", "").encode("latin-1", "replace")
            given = auth[7:].strip() if auth[:7].lower() == b"bearer " else b""
            given = given or headers.get("x-api-key", "").strip().encode("latin-1", "replace")  # Anthropic's
            if not given or not hmac.compare_digest(given, self.key):
                await _refuse(scope, receive, send, HTTPError(
                    401, "a valid API key is needed (Authorization: Bearer KEY, or x-api-key: KEY)",
                    "authentication_error"))
                return
        if scope["method"] not in BODY_METHODS or not self._routed(scope):
            await self.app(scope, receive, send)  # a path no route serves, a method it does not take: 404, 405
            return
        if path in self.policy.uploads:  # multipart, up to its route's own bound (serve/files.py), read as it comes
            coding = headers.get("content-encoding", "").strip().lower()
            if coding not in ("", "identity"):  # (it was read as multipart as it came: a misleading 400, or stored)
                await _refuse(scope, receive, send, HTTPError(
                    415, f"Content-Encoding {coding[:40]} is not supported on an upload: send the file as it is"),
                    {"Connection": "close"})
                return
            await self.app(scope, receive, send)
            return
        kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        typed = scope["method"] == "DELETE" or kind == "application/json" \
            or (path.startswith("/api/") and kind in OLLAMA_BODY_TYPES)
        if not typed and not any(re.fullmatch(p, path) for p in self.policy.bodiless):  # `curl -X POST .../cancel`
            await _refuse(scope, receive, send, HTTPError(
                415, f"the body must be JSON, sent with Content-Type: application/json (got {kind or 'none'!r}; "
                     "with curl, use --json or -H 'Content-Type: application/json')"))
            return
        limit = self.policy.max_body
        declared = headers.get("content-length", "")
        too_big = HTTPError(413, f"the request body is over the limit of {limit:,} bytes (serve --max-body)")
        if declared.isascii() and declared.isdigit() and int(declared) > limit:
            await _refuse(scope, receive, send, too_big)
            return
        body = bytearray()
        try:
            refused = await self._read(body, receive, too_big)
        finally:
            self.arriving -= len(body)
        if refused is not None:
            if refused.status != 499:  # (a body cut short is not read on: closed, but for one over the size)
                await _refuse(scope, receive, send, refused, {"Connection": "close"} if refused.status != 413 else None)
            return
        encoding = headers.get("content-encoding", "").strip().lower()
        if encoding not in ("", "identity"):
            try:
                body = bytearray(await asyncio.to_thread(decoded, bytes(body), encoding, limit))
            except HTTPError as e:
                await _refuse(scope, receive, send, e)
                return
            scope = {**scope, "headers": [(k, v) for k, v in scope["headers"]
                                          if k.lower() not in (b"content-encoding", b"content-length")]
                     + [(b"content-length", str(len(body)).encode())]}
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return dict(await receive())

        await self.app(scope, replay, send)

    async def _read(self, body: bytearray, receive: Any, too_big: HTTPError) -> HTTPError | None:
        """Read a request's body into `body`, counted, so no route sees one over the limit (Starlette would read it
        all too); the error to answer instead, where one is due (499: the client left, nothing is)."""
        clock = BodyClock(self.policy.read_timeout)
        while True:
            try:
                message = await asyncio.wait_for(receive(), clock.wait())
            except TimeoutError:  # a stalled or trickled body (slow-loris) holds a connection and a task: closed
                return clock.late("the request body")
            except HTTPError as e:  # the server is stopping (serve/app.py's FrontDoor): a 503 before uvicorn's cancel
                return e
            if message["type"] == "http.disconnect":
                return HTTPError(499, "the client left")
            part = message.get("body", b"")
            if self.arriving + len(part) > BODIES_HELD * self.policy.max_body:
                return HTTPError(503, f"the server is reading too many request bodies at once (over {BODIES_HELD} x "
                                      "--max-body, all connections together): try again shortly", "server_error")
            body += part
            self.arriving += len(part)
            clock.took(part)
            if len(body) > self.policy.max_body:
                return too_big
            if not message.get("more_body", False):
                return None

    def _routed(self, scope: dict[str, Any]) -> bool:
        """Whether a route takes this path and method: the body's type and size are checked only then, so a
        POST to a path no route serves is a 404 and one to a route that takes no POST a 405, whatever its body."""
        return self.routes is None or any(r.matches(scope)[0] is Match.FULL for r in self.routes)


SLICE = 64 << 10  # a compressed body is decoded this much at a time
MAX_MEMBERS = 1000  # gzip members in one body (`cat a.gz b.gz` has two; a million empty ones are an attack)


def decoded(body: bytes, encoding: str, limit: int) -> bytes:
    """A body sent with Content-Encoding gzip (or deflate), as OpenAI's and Anthropic's APIs take it, decoded
    within `limit` bytes (a few KB of gzip can hold gigabytes: a 413, never the memory); a 415 for another
    coding. Gzip of several members (RFC 1952: `cat a.gz b.gz`) is their contents one after the other."""
    import zlib

    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise HTTPError(415, f"Content-Encoding {encoding[:40]} is not supported: send the body as it is, or with "
                             "gzip or deflate")
    out, view, at, members = bytearray(), memoryview(body), 0, 0
    while True:  # fed in slices: each member's leftover (unused_data) is a copy of at most one slice
        members += 1
        if members > MAX_MEMBERS:
            raise HTTPError(400, f"the request body is not valid {encoding} data: more than {MAX_MEMBERS:,} gzip "
                                 "members")
        inflate = zlib.decompressobj(zlib.MAX_WBITS | 16 if "gzip" in encoding else zlib.MAX_WBITS)
        while at < len(view) and not inflate.eof:
            piece = view[at:at + SLICE]
            try:
                out += inflate.decompress(piece, limit + 1 - len(out))  # (at least 1: 0 would be no bound)
            except zlib.error:
                raise HTTPError(400, f"the request body is not valid {encoding} data (Content-Encoding: "
                                     f"{encoding})") from None
            if len(out) > limit:  # (what max_length left undone is past the limit too)
                raise HTTPError(413, f"the request body is over the limit of {limit:,} bytes (serve --max-body) "
                                     "once decompressed")
            at += len(piece) - len(inflate.unused_data)
        if not inflate.eof or at >= len(view) or "gzip" not in encoding:
            break
    if not inflate.eof or at < len(view):
        raise HTTPError(400, f"the request body is not valid {encoding} data: it is cut short or has bytes after "
                             "its end")
    return bytes(out)


async def _refuse(scope: dict[str, Any], receive: Any, send: Any, e: HTTPError,
                  headers: dict[str, str] | None = None) -> None:
    response = error_response(Request(scope), e, headers)
    await response(scope, receive, send)


def _cors(app: ASGIApp, policy: Policy) -> ASGIApp:
    """Starlette's CORSMiddleware, matching origins by the policy's patterns. An allowed origin's preflight may
    ask to reach a private network (Chrome's Private Network Access: a public page calling this loopback or LAN
    server); a foreign origin was refused before (403)."""
    from starlette.middleware.cors import CORSMiddleware

    class Cors(CORSMiddleware):
        def is_allowed_origin(self, origin: str) -> bool:
            return policy.origin_allowed(origin)

        def preflight_response(self, request_headers: Any) -> Response:
            """Starlette's, but a refusal (a method or headers not allowed) is the route's API error, not a line
            of plain text; its CORS headers kept, so that the page's script can read it."""
            response = super().preflight_response(request_headers)
            if response.status_code < 400:
                return response
            what = bytes(response.body).decode("utf-8", "replace").removeprefix("Disallowed CORS ")
            asked = request_headers.get("access-control-request-method", "")[:100]
            message = (f"the CORS preflight asks for the method {asked}, which serve does not take (it takes "
                       f"{', '.join(self.allow_methods)})" if "method" in what.split(", ") else
                       f"the CORS preflight asks for what serve does not allow: {what}")
            e = HTTPError(response.status_code, message)
            kept = {k: v for k, v in response.headers.items() if k not in ("content-length", "content-type")}
            body = error_body(api_of(self._path.get(), request_headers), e)
            return JSONResponse(body, status_code=e.status, headers=kept)

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            token = self._path.set(scope.get("path", ""))
            try:
                await super().__call__(scope, receive, send)
            finally:
                self._path.reset(token)

        _path: ContextVar[str] = ContextVar("localgen_preflight_path", default="")

    return Cors(app, allow_methods=["GET", "POST", "DELETE", "OPTIONS", "HEAD"],  # type: ignore[arg-type]
                allow_headers=["*"], max_age=600, allow_private_network=True)
