"""The ASGI app (Starlette, served by uvicorn): routes for OpenAI's and Ollama's APIs over the same model
workers, the API key check, errors in each API's own shape (the shared pieces: serve/common.py), and at
shutdown a 503 for the requests still running before uvicorn would cancel them."""

from __future__ import annotations

import asyncio
import contextlib
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
from localgen.serve.worker import INTERNAL, Failed

# After SIGTERM or Ctrl-C, uvicorn waits DRAIN_S + 1 s for the requests in flight (cli/serve.py's
# timeout_graceful_shutdown), then cancels them: a stream cut with no error event, a plain-text 500. Our jobs
# still running this long after the signal (at once on a second signal) end first, as each API's 503.
DRAIN_S = 4.0
STOPPING = "the server is shutting down"


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
        drain.loop = asyncio.get_running_loop()
        yield

    drain = Drain(state)
    app = Starlette(routes=routes, exception_handlers={HTTPError: on_error, Exception: on_unexpected},
                    lifespan=lifespan)
    app.state.drain = drain
    app.add_middleware(Gate, policy=policy or Policy(api_key=state.api_key))  # type: ignore[arg-type]
    return app


class Drain:
    """Ends our jobs still running DRAIN_S after the server's first exit signal, at once on a second one.
    The server (cli/serve.py's uvicorn.Server, which owns the signals) calls `signal` from its handle_exit;
    the timer runs on the app's loop, noted at start-up."""

    def __init__(self, state: ServeState) -> None:
        self.state = state
        self.loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None

    def signal(self) -> None:
        """An exit signal came (from a signal handler: only hand over to the loop)."""
        if self.loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed
                self.loop.call_soon_threadsafe(self._on_loop)

    def _on_loop(self) -> None:
        if self._timer is None and self.loop is not None:
            self._timer = self.loop.call_later(DRAIN_S, self.fail_all)
        else:
            if self._timer is not None:
                self._timer.cancel()
            self.fail_all()

    def fail_all(self) -> None:
        """Every job of every model ends now, as its API's 503."""
        for w in self.state.workers.values():
            w.fail_all(Failed(503, f"{w.name}: {STOPPING}"))
