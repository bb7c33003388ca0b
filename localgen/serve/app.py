"""The ASGI app (Starlette, served by uvicorn): routes for OpenAI's and Ollama's APIs over the same model
workers, the API key check, and errors in each API's own shape (the shared pieces: serve/common.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localgen.serve import ollama, openai
from localgen.serve.common import HTTPError, ServeState, error_response
from localgen.serve.guard import Gate, Policy
from localgen.serve.worker import INTERNAL


def build(state: ServeState, policy: Policy | None = None) -> Starlette:
    """The app: both APIs behind the gate (host, origin, key, body), errors in each API's shape."""
    async def health(request: Request) -> Response:
        """Liveness for load balancers and scripts, with each model's slots at a glance: 503 when a model's
        worker has stopped."""
        models = {name: w.status() for name, w in state.workers.items()}
        ok = all(m["alive"] for m in models.values())
        return JSONResponse({"status": "ok" if ok else "error", "models": models}, status_code=200 if ok else 503)

    routes = [Route("/health", health), *openai.routes(state), *ollama.routes(state)]

    async def on_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPError)
        return error_response(request, exc)

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        # the traceback goes to the server's log (Starlette re-raises it to uvicorn), never to the client
        return error_response(request, HTTPError(500, INTERNAL, "server_error"))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # load anyio's asyncio backend now: a streamed response's task group would import it (~35 ms here)
        # inside the first request's time to first token
        async with anyio.create_task_group():
            pass
        yield

    app = Starlette(routes=routes, exception_handlers={HTTPError: on_error, Exception: on_unexpected},
                    lifespan=lifespan)
    app.add_middleware(Gate, policy=policy or Policy(api_key=state.api_key))  # type: ignore[arg-type]
    return app
