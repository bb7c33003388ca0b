"""The ASGI app (Starlette, served by uvicorn): routes for OpenAI's and Ollama's APIs over the same model
workers, the API key check, and errors in each API's own shape (the shared pieces: serve/common.py)."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localgen.serve import ollama, openai
from localgen.serve.common import HTTPError, ServeState


def build(state: ServeState) -> Starlette:
    """The app: both APIs, the key check, errors in each API's shape."""
    async def health(request: Request) -> Response:
        """Liveness for load balancers and scripts, with each model's slots at a glance."""
        return JSONResponse({"status": "ok", "models": {name: w.status() for name, w in state.workers.items()}})

    routes = [Route("/health", health), *openai.routes(state), *ollama.routes(state)]

    async def on_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPError)
        return error_response(request, exc)

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        return error_response(request, HTTPError(500, f"internal error: {type(exc).__name__}: {exc}", "server_error"))

    app = Starlette(routes=routes, exception_handlers={HTTPError: on_error, Exception: on_unexpected})
    app.add_middleware(_KeyCheck, key=state.api_key)  # type: ignore[arg-type]
    return app


def error_response(request: Request, e: HTTPError) -> Response:
    """OpenAI's error object under /v1, Ollama's {"error": "..."} under /api."""
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": e.message}, status_code=e.status)
    return JSONResponse({"error": {"message": e.message, "type": e.kind, "param": e.param, "code": e.status}},
                        status_code=e.status)


class _KeyCheck:
    """With an API key, every route but /health needs `Authorization: Bearer KEY` (constant-time compare)."""

    def __init__(self, app: Callable[..., Awaitable[None]], key: str | None) -> None:
        self.app = app
        self.key = key.encode() if key else None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.key is None or scope["path"] in ("/health", "/"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"")
        given = auth[7:].strip() if auth[:7].lower() == b"bearer " else b""
        if not given or not hmac.compare_digest(given, self.key):
            request = Request(scope)
            kind = "authentication_error"
            response = error_response(request, HTTPError(401, "a valid API key is needed (Authorization: Bearer "
                                                               "KEY)", kind))
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
