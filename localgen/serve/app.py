"""The ASGI app (Starlette, served by uvicorn): routes for OpenAI's, Anthropic's, the Responses and Ollama's
APIs over the same model workers, the API key check, errors in each API's own shape (serve/apierror.py; an
unknown route or method too), one access line per request, the pool that fetches image URLs, and at shutdown
a 503 for the requests still running before uvicorn would cancel them."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localgen.fetch import FetchPool
from localgen.serve import (
    anthropic,
    batches,
    batchrun,
    embeds,
    listings,
    manage,
    ollama,
    openai,
    page,
    responses,
    servertools,
    transcribe,
    vectorstores,
)
from localgen.serve.apierror import ERROR_EXTRA, HTTPError, error_response
from localgen.serve.arrivals import ARRIVALS
from localgen.serve.guard import Gate, Policy
from localgen.serve.http10 import Http10
from localgen.serve.incoming import INCOMING, Incoming
from localgen.serve.jobs import INTERNAL, Failed
from localgen.serve.metrics import Metrics
from localgen.serve.routing import aliased, aliases_of
from localgen.serve.servelog import LOG, STDERR_LOG, TRACE, ServeLog, Trace, request_id
from localgen.serve.state import ServeState

# After SIGTERM or Ctrl-C, uvicorn waits the drain time + 1 s for the requests in flight (cli/serve/command.py's
# timeout_graceful_shutdown), then cancels them: a stream cut with no error event, a plain-text 500. Our jobs
# still running after the drain time (serve --drain-timeout; at once on a second signal) end first, as each
# API's 503.
DRAIN_S = 4.0
STOPPING = "the server is shutting down"


def _health(state: ServeState) -> Callable[[Request], Awaitable[Response]]:
    async def health(request: Request) -> Response:
        """Liveness for load balancers and scripts, with each model's slots at a glance: 503 when a model's
        worker has stopped. Each worker is looked at first, as the listings do (a preset changed on disk: taken
        away); those taken away that have not stopped yet are under `unloading`."""
        held = await asyncio.to_thread(state.current_workers)
        models = {name: w.status() for name, w in held.items()}
        ok = all(m["alive"] for m in models.values())
        doc: dict[str, Any] = {"status": "ok" if ok else "error", "models": models}
        gone = state.unloading()
        if gone:
            doc["unloading"] = [{"name": w.name, **w.status()} for w in gone]
        if state.residency is not None:
            doc["residency"] = state.residency.status()
        if state.store is not None:  # the prompt cache on disk: its files, bytes and what was read back
            doc["prefix_store"] = await asyncio.to_thread(state.store.status)
        return JSONResponse(doc, status_code=200 if ok else 503)

    return health


def build(state: ServeState, policy: Policy | None = None, webui: bool = True) -> Starlette:
    """The app: every API behind the gate (host, origin, key, body), errors in each API's shape; with `webui`,
    the chat page at `/` for browsers (serve/page.py), its files open without the key as `/` is."""
    desk = batches.Desk()  # the Batch and Files APIs (serve/batches.py; its runner: serve/batchrun.py)
    if state.tool_threads is None:
        state.tool_threads = servertools.ToolThreads()
    given = policy or Policy(api_key=state.api_key)
    uploads = batches.UPLOADS + transcribe.PATHS
    gate = dataclasses.replace(given, uploads=uploads + aliases_of(uploads), bodiless=batches.BODILESS,
                               open_paths=given.open_paths + aliases_of(given.open_paths))
    routes = _api_routes(state, desk, gate)
    policy = gate
    desk.read_timeout, desk.max_line = policy.read_timeout, policy.max_body
    if webui:
        root = next(r for r in routes if r.path == "/")  # Ollama's "is running", for clients that are not browsers
        routes = [*page.routes(root.endpoint), *(r for r in routes if r is not root)]
        policy = dataclasses.replace(policy, open_paths=policy.open_paths + page.ASSETS)
    metrics = Metrics(state, routes, desk)
    routes.append(Route("/metrics", metrics.endpoint))
    state.counts = metrics
    if state.upstreams is not None:
        state.upstreams.bind(metrics)
    # the routes whose tokens no worker counts (embeddings, rerank): their access line reads the response's usage
    counted = tuple(r.path for r in embeds.routes(state))
    front = Front(metrics=metrics, usage_paths=frozenset(counted + aliases_of(counted)))
    drain = Drain(state, front)
    app = Starlette(routes=routes, exception_handlers=_error_handlers(front, routes),
                    lifespan=_lifespan(state, desk, policy, front, drain))
    # `/health/` is the API's 404, not Starlette's redirect to a URL built from the Host header
    app.router.redirect_slashes = False
    app.state.drain = drain
    app.state.front = front  # cli/serve/command.py sets its fetch pool and access log from the flags
    # each added outside the ones before it: FrontDoor, UpgradeWithBody, the Gate, Unhandled, then Http10 around
    # the routes
    app.add_middleware(Http10)  # type: ignore[arg-type]  # a 1.0 client's stream held whole
    app.add_middleware(Unhandled)  # type: ignore[arg-type]
    app.add_middleware(Gate, policy=policy, routes=routes)  # type: ignore[arg-type]
    app.add_middleware(UpgradeWithBody)  # type: ignore[arg-type]
    app.add_middleware(FrontDoor, front=front)  # type: ignore[arg-type]
    return app


def _api_routes(state: ServeState, desk: batches.Desk, gate: Policy) -> list[Route]:
    """Every API's routes, a remote model's wrapped to go to its server, each also under llama-server's path
    without /v1."""
    routes = [Route("/health", _health(state)), *listings.routes(state), *openai.routes(state),
              *anthropic.routes(state), *responses.routes(state), *ollama.routes(state), *embeds.routes(state),
              *manage.routes(state),
              *batches.routes(desk), *servertools.routes(state.toolbox, state.tool_timeout, state.tool_threads),
              *transcribe.routes(state, lambda: (gate.max_body, gate.read_timeout)), *vectorstores.routes(state)]
    if state.upstreams is not None:  # serve --endpoint: a remote model's requests go to its server
        routes = state.upstreams.wrap(routes)
    return aliased(routes)  # llama-server's paths without /v1 (serve/routing.py), after the wrap: remote too


_Handler = Callable[[Request, Exception], Awaitable[Response]]


def _error_handlers(front: Front, routes: list[Route]) -> dict[Any, _Handler]:
    """Starlette's exception handlers: each error in its API's shape, the server's faults in its log."""
    async def on_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPError)
        if exc.logged:  # the server's fault, one line in its log (no traceback: it says what to do)
            front.log.error(exc.logged)
        return error_response(request, exc)

    async def on_routing(request: Request, exc: Exception) -> Response:
        """Starlette's own refusals (no such route, a method the route does not take) in the API's shape."""
        assert isinstance(exc, HTTPException)
        where = f"{request.method} {request.url.path}"[:200]
        meant = _meant(request.url.path, routes) if exc.status_code == 404 else None
        message = {404: f"Invalid URL ({where})" + (f": did you mean {meant[0]}? ({meant[1]})" if meant else ""),
                   405: f"Method not allowed ({where}; it takes "
                   f"{(exc.headers or {}).get('Allow', 'another method')})"}.get(exc.status_code, str(exc.detail))
        # in the shape of the API of the route meant: the one its client speaks
        return error_response(request, HTTPError(exc.status_code, message, "invalid_request_error"), exc.headers,
                              meant[0] if meant else None)

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        # the traceback goes to the server's log (FrontDoor writes it once this 500 is sent), never to the client
        return error_response(request, HTTPError(500, INTERNAL, "server_error"))

    return {HTTPError: on_error, HTTPException: on_routing, Exception: on_unexpected}


def _lifespan(state: ServeState, desk: batches.Desk, policy: Policy, front: Front,
              drain: Drain) -> Callable[[Starlette], AbstractAsyncContextManager[None]]:
    """The app's start-up and shutdown: the batches' runner for its whole life, the remote clients closed after."""
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # load anyio's asyncio backend now: a streamed response's task group would import it inside the first
        # request's time to first token (its cost: docs/benchmarks.md, Costs noted in the code)
        async with anyio.create_task_group():
            pass
        drain.loop = asyncio.get_running_loop()
        front.stopped = asyncio.Event()  # this loop's: an app started again on another loop gets its own
        for text in getattr(state.toolbox, "left_out", ()):  # (the log is the flags' by now: JSON or text)
            front.log.warning(text)
        async with batchrun.running(desk, state, app, policy.api_key, lambda: drain.stopping, front.log.error):
            yield
        if state.upstreams is not None:
            await state.upstreams.aclose()

    return lifespan


class UpgradeWithBody:
    """Pure ASGI, outside the Gate: a request that asks to Upgrade (websocket, h2c: serve takes none, and answers
    such a request over HTTP/1.1) and has a body is a 400, its connection closed. The HTTP parser (httptools) takes
    all that follows an upgrading request's head for the new protocol's bytes: the route read an empty body, and
    the body's later packets were read as requests of their own (where a proxy that passes Upgrade on saw one)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and _upgrade_with_body(scope["headers"]):
            refused = HTTPError(400, "a request that asks to Upgrade (to another protocol: websocket, h2c) cannot "
                                     "have a body here: send it without the Upgrade header")
            await error_response(Request(scope), refused, {"Connection": "close"})(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _upgrade_with_body(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a request's headers ask to Upgrade (Upgrade, and Connection naming it, as the parser reads them) and
    declare a body (a Content-Length other than 0, or a Transfer-Encoding)."""
    named = {name.lower(): value for name, value in headers}
    tokens = {token.strip().lower() for token in named.get(b"connection", b"").split(b",")}
    length = named.get(b"content-length", b"0").strip()
    return b"upgrade" in named and b"upgrade" in tokens and (
        b"transfer-encoding" in named or not (length.isdigit() and int(length) == 0))


class Unhandled:
    """Pure ASGI, inside the Gate and FrontDoor: an exception no handler answered, raised before the response
    began (a 1.0 client's stream too, which Http10 holds until its end), is the route's API's 500, "internal
    error", sent within the request's context: its request_id, X-Request-Id, CORS headers and an access line
    with the status sent (Starlette's own last handler sits outside every middleware). The exception goes on,
    for its traceback in the server's log; raised mid-stream, it can only cut the stream."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = False

        async def sending(message: dict[str, Any]) -> None:
            nonlocal began
            began = began or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception:
            if not began:
                await error_response(Request(scope), HTTPError(500, INTERNAL, "server_error"))(scope, receive, send)
            raise


@dataclass
class Front:
    """What FrontDoor gives each request: the pool that fetches its image URLs, the server's log
    (its access line, and the format: serve/servelog.py), and the metrics that count it."""

    pool: FetchPool = field(default_factory=FetchPool)
    log: ServeLog = STDERR_LOG
    metrics: Metrics | None = None
    usage_paths: frozenset[str] = frozenset()  # POST routes whose response's usage is their access line's tokens
    stopped: asyncio.Event = field(default_factory=asyncio.Event)  # the drain has ended (Drain.fail_all)


# a response's token counts, from the usage it ends with (OpenAI's usage, Ollama's eval counts), for the
# requests whose tokens no worker counted (embeddings: Front.usage_paths; never another route's body, such as a
# file of batch results downloaded)
_COUNTS = re.compile(rb'"(prompt_tokens|completion_tokens|prompt_eval_count|eval_count)":\s*(\d+)')
_KIND = {b"prompt_tokens": "prompt", b"prompt_eval_count": "prompt", b"completion_tokens": "completion",
         b"eval_count": "completion"}
_TAIL = 2048
SETTLE_S = 5.0  # how long a request whose client left waits for its jobs' counts before its access line


class FrontDoor:
    """Pure ASGI, outside everything: each request's Incoming and Trace (its id: the client's
    X-Request-Id, sanitized, or a fresh one, sent back as X-Request-Id) in context; when it ends, its count in the
    metrics by route and status, and its access line (serve/servelog.py): method, path, status, tokens,
    milliseconds and id, or in JSON also its route, model, cached tokens, time to first token and client."""

    def __init__(self, app: Any, front: Front) -> None:
        self.app = app
        self.front = front

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope.get("headers", ()) if k == b"x-request-id"), None)
        client = scope.get("client")
        trace = Trace(request_id(given), f"{client[0]}:{client[1]}" if client else "-")
        token = INCOMING.set(Incoming(self.front.pool, receive))
        traced = TRACE.set(trace)
        logged = LOG.set(self.front.log)
        extra = ERROR_EXTRA.set((("request_id", trace.id),))  # every error body of this request carries its id
        try:
            await self._observed(scope, receive, send, trace)
        finally:
            ERROR_EXTRA.reset(extra)
            LOG.reset(logged)
            TRACE.reset(traced)
            INCOMING.reset(token)

    async def _observed(self, scope: dict[str, Any], receive: Any, send: Any, trace: Trace) -> None:
        log, metrics = self.front.log, self.front.metrics
        start = time.perf_counter()
        status = 0
        ended = left = False  # the response's last byte was sent; the client left before it
        whole = False  # the request's body has all arrived (or its client left)
        counts: dict[str, int] = {}
        scraped = log.access_on and scope["method"] == "POST" and scope["path"] in self.front.usage_paths
        header = (b"x-request-id", trace.id.encode("latin-1"))

        async def receiving() -> dict[str, Any]:
            nonlocal left, whole
            message: dict[str, Any] = await receive() if whole else await _unless_stopped(receive, self.front.stopped)
            whole = whole or message["type"] != "http.request" or not message.get("more_body", False)
            left = left or (message["type"] == "http.disconnect" and not ended)
            return message

        async def sending(message: dict[str, Any]) -> None:
            nonlocal status, ended
            if message["type"] == "http.response.start":
                trace.arrived()
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), header]}
            elif message["type"] == "http.response.body":
                ended = ended or (not message.get("more_body", False) and not left)
                tail = message.get("body", b"")[-_TAIL:]
                if scraped and (b'_tokens"' in tail or b'eval_count"' in tail):
                    counts.update((_KIND[k], int(v)) for k, v in _COUNTS.findall(tail))
            await send(message)

        if scope["method"] == "POST":  # a model's burst waits for it until it is handed on (serve/arrivals.py)
            trace.arrival = ARRIVALS.enter()
        try:
            await self.app(scope, receiving, sending)
        except Exception:
            if not ended:  # a stream cut short, or no answer yet: uvicorn answers or closes the connection
                raise
            # the 500 is sent whole (Starlette's handler re-raises after it): its traceback goes to the log here,
            # since uvicorn closes a keep-alive connection on an exception after its answer (the client's next
            # request on that connection was reset)
            import traceback

            log.error(f"internal error in {scope['method']} {scope['path']} (request {trace.id})",
                      traceback.format_exc().rstrip())
        finally:
            trace.arrived()
            if left:  # mid-body, queued or mid-stream: a client that left is a 499, with the tokens made for it
                status = 499
                await _settled(trace)
            elif status < 400 and trace.failed is not None:  # a stream its error event ended (a 503 at shutdown)
                status = trace.failed
            seconds = time.perf_counter() - start
            route = metrics.route(scope) if metrics is not None else scope["path"]
            if metrics is not None:
                metrics.request(scope, status, seconds, route)
            log.access(scope["method"], scope["path"], route, status, seconds, trace, counts)


async def _unless_stopped(receive: Any, stopped: asyncio.Event) -> dict[str, Any]:
    """The next part of a body still arriving, or, once the drain has ended, the 503 the reader answers with: a
    wait left to uvicorn's cancel (a second later) was a traceback in the log and a plain-text 500."""
    part, stop = asyncio.ensure_future(receive()), asyncio.ensure_future(stopped.wait())
    try:
        await asyncio.wait((part, stop), return_when=asyncio.FIRST_COMPLETED)
        if stop.done() and isinstance(stop.exception(), RuntimeError):  # the event is another loop's (an app
            return dict(await part)  # run again on a new loop without its lifespan, a TestClient without `with`)
    finally:
        stop.cancel()
        if not part.done():
            part.cancel()
    if part.done() and not part.cancelled():  # preferred: a part already here (a GET's empty body) is read
        return dict(part.result())
    raise HTTPError(503, STOPPING, "server_error")


async def _settled(trace: Trace) -> None:
    """The request's jobs cancelled and, briefly, awaited: their counts reach the access line (a job ends at its
    worker's next step)."""
    from localgen.serve.jobs import State

    for job in trace.jobs:
        job.cancelled.set()
    deadline = time.monotonic() + SETTLE_S
    while any(job.state is not State.DONE for job in trace.jobs) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


class Drain:
    """Ends our jobs still running `seconds` after the server's first exit signal, at once on a forced one (a
    second Ctrl-C; a repeated SIGTERM is not). The server (cli/serve/command.py's uvicorn.Server, which owns the
    signals) calls `signal` from its handle_exit; the timer runs on the app's loop, noted at start-up."""

    def __init__(self, state: ServeState, front: Front) -> None:
        self.state = state
        self.front = front
        self.loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.seconds = DRAIN_S  # serve --drain-timeout
        self.stopping = False  # an exit signal came (the batches' runner starts nothing more)

    def signal(self, force: bool = False) -> None:
        """An exit signal came; `force`: end the jobs now (from a signal handler: only hand over to the loop)."""
        if self.loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed
                self.loop.call_soon_threadsafe(self._on_loop, force)

    def _on_loop(self, force: bool) -> None:
        self.stopping = True
        self.front.pool.close()  # a request still fetching its image would not finish in time: it ends now
        if force:
            if self._timer is not None:
                self._timer.cancel()
            self.fail_all()
        elif self._timer is None and self.loop is not None:  # the first: a repeat changes nothing
            self._timer = self.loop.call_later(self.seconds, self.fail_all)

    def fail_all(self) -> None:
        """Every job of every model ends now, as its API's 503, and every pull, with its error line; so does every
        request whose body is still arriving (FrontDoor's receive)."""
        self.front.stopped.set()
        # the workers taken away and not stopped yet too (a preset changed on disk: their jobs still run)
        for w in dict.fromkeys([*self.state.workers.values(), *list(self.state.stopping)]):
            w.fail_all(Failed(503, f"{w.name}: {STOPPING}"))
        for pull in list(self.state.pulls):
            pull.end(f"{STOPPING}: the download stops here, and the next pull of this model resumes it")
        if self.state.tool_threads is not None:  # its thread runs on, abandoned: it does not hold up the exit
            for name in self.state.tool_threads.end_all():
                self.front.log.warning(f"the tool call {name} is abandoned, still running: {STOPPING}")


def _meant(path: str, routes: list[Any]) -> tuple[str, str] | None:
    """For a path that is a route but for its /v1 (a client's base URL given with /v1 where it adds it itself,
    as Anthropic's and Ollama's clients do, or without it, or with /api, where it does not, as OpenAI's): which
    route it meant, and why."""
    if path.startswith("/v1/api/"):  # an Ollama client given the OpenAI base URL
        alt, why = path[3:], "an Ollama client's host has no /v1: http://HOST:PORT"
    elif path.startswith("/v1/v1/"):
        alt, why = path[3:], "the client adds /v1 itself: give its base URL without /v1"
    elif path.startswith("/api/"):  # an OpenAI client given Ollama's /api (or /api/v1)
        alt, why = "/v1" + path.removeprefix("/api").removeprefix("/v1"), "an OpenAI client's base URL ends in /v1"
    elif path.startswith("/v1/"):
        return None
    else:
        alt, why = "/v1" + path, "an OpenAI client's base URL ends in /v1"
    if alt.startswith("/v1/messages"):  # Anthropic's route: its client's rule
        why = "an Anthropic client's base URL is http://HOST:PORT, with no /v1: it adds /v1 itself"
    return (alt, why) if alt in {getattr(r, "path", None) for r in routes} else None
