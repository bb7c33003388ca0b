"""The chat page (serve/webui/: index.html and its scripts and styles, plain files shipped in the package, no
build step): `/` for a browser, and its assets under /webui/. The page holds no data and uses only the API
routes any client uses, so the shell and assets load without the API key (as llama-server's), and every
call the page makes needs it. Each file goes out with a Content-Security-Policy that allows nothing inline
and nothing from another origin, and nosniff; a client that does not ask for HTML gets what `/` answered
before the page (Ollama's "is running")."""

from __future__ import annotations

import functools
import hashlib
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
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    return Response(body if request.method == "GET" else b"", headers=headers, media_type=FILES[name])


def wants_html(request: Request) -> bool:
    """A browser navigating to the page (its Accept names HTML); curl, health checks and Ollama's clients do not."""
    return "text/html" in request.headers.get("accept", "").lower()


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
