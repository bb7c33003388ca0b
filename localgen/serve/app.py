"""The ASGI app (Starlette, served by uvicorn): routes for OpenAI's and Ollama's APIs over the same model
workers, the API key check, errors in each API's own shape (the shared pieces: serve/common.py), one access
line per request, the pool that fetches image URLs, and at shutdown a 503 for the requests still running
before uvicorn would cancel them."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localgen.fetch import FetchPool
from localgen.serve import anthropic, ollama, openai, responses
from localgen.serve.common import HTTPError, ServeState, error_response
from localgen.serve.guard import Gate, Policy
from localgen.serve.jobs import INTERNAL, Failed

# After SIGTERM or Ctrl-C, uvicorn waits the drain time + 1 s for the requests in flight (cli/serve.py's
# timeout_graceful_shutdown), then cancels them: a stream cut with no error event, a plain-text 500. Our jobs
# still running after the drain time (serve --drain-timeout; at once on a second signal) end first, as each
# API's 503.
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

    routes = [Route("/health", health), *openai.routes(state), *anthropic.routes(state), *responses.routes(state),
              *ollama.routes(state)]

    async def on_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPError)
        return error_response(request, exc)

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        # the traceback goes to the server's log (Starlette re-raises it to uvicorn), never to the client
        return error_response(request, HTTPError(500, INTERNAL, "server_error"))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # load anyio's asyncio backend now: a streamed response's task group would import it inside the first
        # request's time to first token (its cost: docs/benchmarks.md, Costs noted in the code)
        async with anyio.create_task_group():
            pass
        drain.loop = asyncio.get_running_loop()
        yield

    front = Front()
    drain = Drain(state, front)
    app = Starlette(routes=routes, exception_handlers={HTTPError: on_error, Exception: on_unexpected},
                    lifespan=lifespan)
    app.state.drain = drain
    app.state.front = front  # cli/serve.py sets its fetch pool and access log from the flags
    app.add_middleware(Gate, policy=policy or Policy(api_key=state.api_key))  # type: ignore[arg-type]
    app.add_middleware(FrontDoor, front=front)  # type: ignore[arg-type]  # outermost: added last
    return app


@dataclass
class Front:
    """What the outermost layer gives each request: the pool that fetches its image URLs, and where its
    access line goes (None: no access log)."""

    pool: FetchPool = field(default_factory=FetchPool)
    log: Callable[[str], None] | None = None


@dataclass(frozen=True)
class Incoming:
    """The request being answered, as fetch_media needs it: the pool for its URLs, and its ASGI receive
    (whose next message, once the body is read, says that the client left)."""

    pool: FetchPool
    receive: Callable[[], Awaitable[dict[str, Any]]]


INCOMING: ContextVar[Incoming | None] = ContextVar("localgen_incoming", default=None)


def _media_urls(raw: list[Any]) -> list[str]:
    """The http(s) URLs of a request's image parts (and Ollama's `images`), each once."""
    urls = []
    for m in raw:
        if not isinstance(m, dict):
            continue
        content, images = m.get("content"), m.get("images")
        for p in content if isinstance(content, list) else []:
            inner = p.get("image_url") if isinstance(p, dict) and p.get("type") == "image_url" else None
            urls.append(inner.get("url") if isinstance(inner, dict) else inner)
        urls.extend(images if isinstance(images, list) else [])
    return list(dict.fromkeys(u for u in urls if isinstance(u, str) and u[:8].lower().startswith(("http://",
                                                                                                   "https://"))))


async def fetch_media(raw: list[Any]) -> dict[str, Any] | None:
    """The Media at each http(s) URL of a request's messages (serve/common.py's read_messages), fetched at once
    in the request's pool: None when there are none, a 400 saying why one failed, a 503 when the pool is full
    or closing; every fetch stops when one fails or the client leaves."""
    import functools

    from localgen import media
    from localgen.fetch import FetchBusy, FetchError, default_pool

    urls = _media_urls(raw)
    if not urls:
        return None
    incoming = INCOMING.get()
    pool = incoming.pool if incoming is not None else default_pool()

    async def one(url: str) -> Any:
        try:
            return await pool.run(functools.partial(media.fetch, url, pool.fetcher))
        except FetchError as e:  # the pool's own: busy, closing, past the deadline
            if isinstance(e, FetchBusy):
                raise
            raise media.MediaError(f"cannot fetch {url}: {e.message}") from None

    tasks = {url: asyncio.ensure_future(one(url)) for url in urls}
    gone = asyncio.ensure_future(_client_left(incoming.receive)) if incoming is not None else None
    waiting: set[asyncio.Future[Any]] = {*tasks.values(), *([gone] if gone else [])}
    try:
        while not all(t.done() for t in tasks.values()):
            done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if gone is not None and gone in done:
                raise HTTPError(499, "the client went away")
            for t in done:
                t.result()  # the first failure ends them all
    except FetchBusy as e:
        raise HTTPError(503, e.message, "server_error") from None
    except media.MediaError as e:
        raise HTTPError(400, e.message, param="messages") from None
    finally:
        for t in (*tasks.values(), *([gone] if gone else [])):
            t.cancel()  # a fetch told to stop stops reading within fetch.POLL_S
    return {url: t.result() for url, t in tasks.items()}


async def _client_left(receive: Any) -> None:
    """Returns when the client disconnects (the body has been read: nothing else comes)."""
    while (await receive())["type"] != "http.disconnect":
        pass


# a response's token counts, from the usage it ends with (OpenAI's usage, Ollama's eval counts)
_COUNTS = re.compile(rb'"(prompt_tokens|completion_tokens|prompt_eval_count|eval_count)":\s*(\d+)')
_TAIL = 2048


class FrontDoor:
    """Pure ASGI, outermost: each request's Incoming in context, and when the access log is on, one line
    per request when it ends: method, path, status, tokens when the body says, milliseconds."""

    def __init__(self, app: Any, front: Front) -> None:
        self.app = app
        self.front = front

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = INCOMING.set(Incoming(self.front.pool, receive))
        log = self.front.log
        try:
            if log is None:
                await self.app(scope, receive, send)
            else:
                await self._logged(log, scope, receive, send)
        finally:
            INCOMING.reset(token)

    async def _logged(self, log: Callable[[str], None], scope: dict[str, Any], receive: Any, send: Any) -> None:
        start = time.perf_counter()
        status = 0
        counts: dict[bytes, int] = {}

        async def sending(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                tail = message.get("body", b"")[-_TAIL:]
                if b'_tokens"' in tail or b'eval_count"' in tail:
                    counts.update((k, int(v)) for k, v in _COUNTS.findall(tail))
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            ms = (time.perf_counter() - start) * 1000
            path = scope["path"] if scope["path"].isprintable() else repr(scope["path"])  # %0A: no forged lines
            log(f"{scope['method']} {path} {status or '-'}{_tokens(counts)} {ms:.0f} ms")


def _tokens(counts: dict[bytes, int]) -> str:
    prompt = counts.get(b"prompt_tokens", counts.get(b"prompt_eval_count"))
    made = counts.get(b"completion_tokens", counts.get(b"eval_count"))
    if prompt is not None and made is not None:
        return f" {prompt}+{made} tokens"
    if prompt is not None or made is not None:
        return f" {prompt if prompt is not None else made} tokens"
    return ""


class Drain:
    """Ends our jobs still running `seconds` after the server's first exit signal, at once on a second one.
    The server (cli/serve.py's uvicorn.Server, which owns the signals) calls `signal` from its handle_exit;
    the timer runs on the app's loop, noted at start-up."""

    def __init__(self, state: ServeState, front: Front) -> None:
        self.state = state
        self.front = front
        self.loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.seconds = DRAIN_S  # serve --drain-timeout

    def signal(self) -> None:
        """An exit signal came (from a signal handler: only hand over to the loop)."""
        if self.loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed
                self.loop.call_soon_threadsafe(self._on_loop)

    def _on_loop(self) -> None:
        self.front.pool.close()  # a request still fetching its image would not finish in time: it ends now
        if self._timer is None and self.loop is not None:
            self._timer = self.loop.call_later(self.seconds, self.fail_all)
        else:
            if self._timer is not None:
                self._timer.cancel()
            self.fail_all()

    def fail_all(self) -> None:
        """Every job of every model ends now, as its API's 503."""
        for w in self.state.workers.values():
            w.fail_all(Failed(503, f"{w.name}: {STOPPING}"))
