"""The chat page (serve/webui/: index.html and its scripts and styles, plain files shipped in the package, no
build step): `/` for a browser, and its assets under /webui/. The page holds no data and uses only the API
routes any client uses, so the shell and assets load without the API key (as llama-server's), and every
call the page makes needs it. Each file goes out with a Content-Security-Policy that allows nothing inline
and nothing from another origin, and nosniff; a client that does not ask for HTML gets what `/` answered
before the page (Ollama's "is running")."""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Awaitable, Callable
from importlib import resources

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

PREFIX = "/webui/"
# Every file the page is made of, and its type: a name not here is a 404 (no path is ever read from a request).
FILES = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
         "api.js": "text/javascript; charset=utf-8", "markdown.js": "text/javascript; charset=utf-8",
         "store.js": "text/javascript; charset=utf-8", "tree.js": "text/javascript; charset=utf-8",
         "transcript.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8",
         "icon.svg": "image/svg+xml"}
ASSETS = tuple(PREFIX + name for name in FILES if name != "index.html")
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; "
       "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "X-Frame-Options": "DENY", "Cache-Control": "no-cache"}

Endpoint = Callable[[Request], Awaitable[Response]]


@functools.cache
def _file(name: str) -> tuple[bytes, str]:
    """A file of the page and its ETag, read from the package once."""
    body = resources.files("localgen.serve").joinpath("webui", name).read_bytes()
    return body, '"' + hashlib.sha256(body).hexdigest()[:16] + '"'


def _send(request: Request, name: str) -> Response:
    body, etag = _file(name)
    headers = {**HEADERS, "ETag": etag}
    if matches(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers=headers)
    # HEAD too: its Content-Length is GET's (RFC 9110); uvicorn sends no body for a HEAD
    return Response(body, headers=headers, media_type=FILES[name])


def matches(if_none_match: str | None, etag: str) -> bool:
    """Whether an If-None-Match header names this ETag (RFC 9110 §13.1.2): `*`, or a list of tags one of which is
    it by the weak comparison (W/"x" matches "x"), as a browser sends one back after a proxy weakened it."""
    if if_none_match is None:
        return False
    if if_none_match.strip() == "*":
        return True
    return etag.removeprefix("W/") in (tag.removeprefix("W/") for tag in _ETAG.findall(if_none_match))


_ETAG = re.compile(r'(?:W/)?"[^"]*"')  # an entity-tag: its opaque part may hold a comma, so it is matched, not split


def wants_html(request: Request) -> bool:
    """A browser navigating to the page: its Accept names text/html itself (a wildcard is not enough: curl,
    health checks and Ollama's clients send */* or nothing), with a q above 0 and at least that of the other
    answer, the plain text `/` gives otherwise (text/plain, named or through text/* or */*)."""
    weights = accepted(request.headers.get("accept", ""))
    html = weights.get("text/html", 0.0)
    plain = max(weights.get("text/plain", 0.0), weights.get("text/*", 0.0), weights.get("*/*", 0.0))
    return html > 0 and html >= plain


def accepted(header: str) -> dict[str, float]:
    """An Accept header as media range → q (RFC 9110 12.5.1): a range named twice keeps its highest q; a q
    that is not a number from 0 to 1, or a range that is not type/subtype, is left out."""
    out: dict[str, float] = {}
    for part in header.lower().split(",")[:64]:
        media, *params = (p.strip() for p in part.split(";"))
        kind, slash, sub = media.partition("/")
        if not slash or not kind or not sub or any(c.isspace() for c in media):
            continue
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip() == "q":
                try:
                    q = float(value.strip())
                except ValueError:
                    q = -1.0
        if 0.0 <= q <= 1.0:
            out[media] = max(q, out.get(media, 0.0))
    return out


def routes(root: Endpoint) -> list[Route]:
    """`/` (the page for a browser, else `root`: what `/` answers without the page) and the page's files."""

    async def index(request: Request) -> Response:
        response = _send(request, "index.html") if wants_html(request) else await root(request)
        response.headers.append("Vary", "Accept")  # one address, two answers: a cache in front must keep both
        return response

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in FILES or name == "index.html":
            raise HTTPException(404)
        return _send(request, name)

    return [Route("/", index, methods=["GET", "HEAD"]), Route(PREFIX + "{name}", asset, methods=["GET", "HEAD"])]
