"""The ASGI app (Starlette, served by uvicorn): routes for OpenAI's and Ollama's APIs over the same model
workers, the API key check, errors in each API's own shape (the shared pieces: serve/common.py), and at
shutdown a 503 for the requests still running before uvicorn would cancel them."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

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
        with _on_exit_signals(asyncio.get_running_loop(), lambda: _fail_all(state)):
            yield

    app = Starlette(routes=routes, exception_handlers={HTTPError: on_error, Exception: on_unexpected},
                    lifespan=lifespan)
    app.add_middleware(Gate, policy=policy or Policy(api_key=state.api_key))  # type: ignore[arg-type]
    return app


def _fail_all(state: ServeState) -> None:
    for w in state.workers.values():
        w.fail_all(Failed(503, f"{w.name}: {STOPPING}"))


@contextlib.contextmanager
def _on_exit_signals(loop: asyncio.AbstractEventLoop, stop_jobs: Callable[[], None]) -> Iterator[None]:
    """Run `stop_jobs` on the loop DRAIN_S after SIGINT or SIGTERM (at once on a second one); the handler that
    was there (uvicorn's, which starts its graceful shutdown) still runs."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may handle signals (an app served from another thread: no hook)
        return
    timer: asyncio.TimerHandle | None = None

    def on_loop() -> None:
        nonlocal timer
        if timer is None:
            timer = loop.call_later(DRAIN_S, stop_jobs)
        else:
            timer.cancel()
            stop_jobs()

    def handler(sig: int, frame: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed
            loop.call_soon_threadsafe(on_loop)
        previous = before[sig]
        if callable(previous):
            previous(sig, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(sig, previous)
            signal.raise_signal(sig)

    signals = (signal.SIGINT, signal.SIGTERM)
    before: dict[int, Any] = {sig: signal.getsignal(sig) for sig in signals}
    for sig in signals:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig in signals:
            if signal.getsignal(sig) is handler:
                signal.signal(sig, before[sig])
