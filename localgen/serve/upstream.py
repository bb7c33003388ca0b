"""serve --endpoint: models that run on other OpenAI-compatible servers (vLLM, llama-server, Ollama's /v1, LM Studio,
another `localgen serve`), served beside the local ones under the names those servers give them.

A request naming one of them at /v1/chat/completions, /v1/completions or /v1/embeddings is sent on as it came (its
body unchanged, so tools, response_format and every field work as the upstream does them), once serve's own gate
(key, body size) let it in and a place in the model's lanes (serve/remotemodels.py: --parallel at once, --max-queue
waiting) is free; the upstream's answer comes back as it arrives, never held whole (serve/remoteanswer.py reads its
usage and time to first content on the way, a stream's usage asked for where the client did not ask and taken out
again; an upstream that refuses the stream_options so added gets the request again as the client sent it, and is
remembered). Its errors come back in OpenAI's shape with the upstream's status and the endpoint's name (never its
key); one it cannot reach is a 502, one silent past --endpoint-timeout a 504; a client that leaves closes the
upstream connection. The other APIs (Anthropic's, the Responses API, Ollama's) refuse a remote model with a 400 that
names these three routes (ServeState.worker asks `refusal`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from localgen.proxies import direct_mounts, tls
from localgen.remote.errortext import error_text
from localgen.serve.apierror import HTTPError, error_response
from localgen.serve.http10 import STREAM_HEADERS
from localgen.serve.jsonbody import read_json
from localgen.serve.remoteanswer import RemoteAnswer
from localgen.serve.remotemodels import ROUTES, Lane, RemoteModels
from localgen.serve.remotes import Remote, scrubbed
from localgen.serve.servelog import LOG, TRACE, named

CONNECT_S = 10.0  # to open a connection to an upstream
READ_S = 600.0  # the longest an upstream may go without sending a byte (a whole answer's wait included)
MAX_ERROR_BODY = 64 << 10  # bytes of an upstream's error body read for its message
STREAMED = ("/v1/chat/completions", "/v1/completions")  # the routes whose streams serve asks the usage of
DRAIN_S = 5.0  # how long an upstream's stream may take to end after its [DONE]
REFUSALS = (400, 422)  # the statuses of an upstream that refuses a field it does not know (stream_options)


@dataclass
class Upstreams(RemoteModels):
    """The remote models (RemoteModels), each request to one sent on (`wrap` puts the proxy in front of the local
    routes), and their counts in /metrics."""

    timeout: float = READ_S  # serve --endpoint-timeout: the longest an upstream may send nothing
    _client: Any = None
    _counter: Any = None
    _metrics: Any = None  # serve/metrics.py's Metrics: a remote answer's tokens and times, as a local one's
    _draining: set[asyncio.Future[None]] = field(default_factory=set)  # streams read to their end after [DONE]
    # the endpoints (by URL) that refused the stream_options serve added: their streams go as the client sent them
    no_stream_options: set[str] = field(default_factory=set)

    def bind(self, metrics: Any) -> None:
        """Count the remote requests in this app's metrics (serve/metrics.py's Metrics): by endpoint, model and
        status, and their tokens and times in the series a local model's fill."""
        from prometheus_client import Counter

        self._metrics = metrics
        self._counter = Counter("localgen_upstream_requests", "requests sent on to an upstream (serve --endpoint), "
                                "by endpoint, model and status", ["endpoint", "model", "status"],
                                registry=metrics.registry)

    async def aclose(self) -> None:
        """Close the connections (the app's shutdown), those still read to their end after [DONE] too."""
        for drain in list(self._draining):
            drain.cancel()
        await asyncio.gather(*self._draining, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def wrap(self, routes: list[Route]) -> list[Route]:
        """The routes, the three a remote model answers at put behind the proxy: a request naming a remote model
        goes upstream, any other to the route itself."""
        return [self._fronted(r) if r.path in ROUTES else r for r in routes]

    def _fronted(self, inner: Route) -> Route:
        local: Callable[[Request], Awaitable[Response]] = inner.endpoint

        async def endpoint(request: Request) -> Response:
            body = await read_json(request)  # the route reads it again: Starlette keeps the bytes
            remote = self.find(body.get("model"))
            if remote is None:
                return await local(request)
            name = str(body["model"])
            real = self.real[name]
            changes: dict[str, Any] = {} if real == name else {"model": real}
            opts = body.get("stream_options")
            # a stream's usage, for the access line and /metrics: asked for where the client did not ask, and
            # taken out of what it gets (serve/remoteanswer.py); not of an endpoint that refused the field
            strip = inner.path in STREAMED and body.get("stream") is True and (
                opts is None or (isinstance(opts, dict) and opts.get("include_usage") in (None, False))) and \
                not (opts is None and remote.endpoint.url in self.no_stream_options)
            # the body as the client sent it (the model's id on its server), should the upstream refuse the
            # stream_options serve added to it
            plain = json.dumps({**body, **changes}, ensure_ascii=False).encode() if changes else \
                await request.body()
            if strip:
                changes["stream_options"] = {**(opts or {}), "include_usage": True}
            content = json.dumps({**body, **changes}, ensure_ascii=False).encode() if strip else plain
            return await self.send(request, remote, name, ROUTES[inner.path], content, strip,
                                   plain if strip and opts is None else None)

        return Route(inner.path, endpoint, methods=["POST"])

    def _http(self) -> Any:
        import httpx

        if self._client is None:  # made on the app's loop, at the first remote request
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=32)
            self._client = httpx.AsyncClient(follow_redirects=False,
                                             timeout=httpx.Timeout(self.timeout, connect=CONNECT_S), limits=limits,
                                             verify=tls(), mounts=direct_mounts(
                                                 lambda: httpx.AsyncHTTPTransport(limits=limits, verify=tls())))
        return self._client

    async def send(self, request: Request, remote: Remote, model: str, suffix: str, content: bytes,
                   strip: bool = False, plain: bytes | None = None) -> Response:
        """The request sent on (`content`: its body, with the model's id on its server), its answer passed back as
        it arrives (errors in OpenAI's shape); `strip`: serve asked for the stream's usage, the client did not;
        `plain`: the body without the stream_options serve added, sent once more should the upstream refuse them
        (a 400 or 422 naming the field, as some OpenAI-compatible servers answer a field they do not know)."""
        lane = self.lanes[f"{remote.label}/{self.real[model]}"]
        model = self.shown(model)
        named(model)
        trace = TRACE.get()
        if trace is not None:
            trace.upstream = remote.label
        try:
            await lane.enter(model)
        except HTTPError as e:
            self._count(remote, model, e.status)
            raise
        status, handed = 499, False  # 499: cancelled (the client left, or the server stops)
        try:
            # its clock starts as the request is sent on
            answer = RemoteAnswer(stream=False, strip_usage=strip, generation=suffix != ROUTES["/v1/embeddings"],
                                  secret=remote.endpoint.key or "")
            response = await self._open(request, remote, suffix, content)
            status = response.status_code
            body: bytes | None = None
            if status in REFUSALS and plain is not None:
                body = await _error_body(response)
                if b"stream_options" in body:  # sent again as the client sent it; its tokens uncounted, as a
                    # stream's whose upstream sends no usage
                    self._refuses_stream_options(remote)
                    answer = RemoteAnswer(stream=False, strip_usage=False, secret=remote.endpoint.key or "")
                    response = await self._open(request, remote, suffix, plain)
                    status, body = response.status_code, None
            if status != 200:
                return await self._refused(request, remote, model, response, body)
            kind = response.headers.get("content-type", "")
            if "json" not in kind and "event-stream" not in kind:
                await response.aclose()
                raise HTTPError(502, f"{remote.label} answered with {kind or 'no content type'}, not an OpenAI "
                                     "answer (its URL should be the API base, e.g. http://host:8000/v1)",
                                "server_error")
            answer.stream = stream = "event-stream" in kind
            handed = True
            return StreamingResponse(self._passed(request, response, remote, model, lane, answer), status_code=200,
                                     media_type=kind, headers=STREAM_HEADERS if stream else None)
        except HTTPError as e:
            status = e.status
            raise
        finally:
            self._count(remote, model, status)
            if not handed:  # else the answer's end leaves the lane
                lane.leave()

    async def _open(self, request: Request, remote: Remote, suffix: str, content: bytes) -> Any:
        """The upstream's response (its headers; the body still to come), or a 502/504; a client that leaves
        while the upstream works on a whole answer closes the connection."""
        import httpx

        ep = remote.endpoint
        headers = {"Content-Type": "application/json", "Accept": request.headers.get("accept", "*/*"),
                   "Accept-Encoding": "identity", "User-Agent": "localgen"}
        if ep.key:
            headers["Authorization"] = f"Bearer {ep.key}"  # the client's own key was serve's: never sent on
        trace = TRACE.get()
        if trace is not None:
            headers["X-Request-Id"] = trace.id
        client = self._http()
        sent = asyncio.ensure_future(client.send(
            client.build_request("POST", ep.url + suffix, content=content, headers=headers), stream=True))
        gone = asyncio.ensure_future(_client_left(request))
        try:
            await asyncio.wait({sent, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not sent.done():  # the client left first: the upstream's connection is closed, its work stops
                sent.cancel()
                with contextlib.suppress(BaseException):
                    await sent
        if sent.cancelled():
            raise HTTPError(499, "the client closed the connection")
        try:
            return sent.result()
        except httpx.ConnectTimeout:
            raise HTTPError(504, f"{remote.label} did not accept the connection within {CONNECT_S:g} s",
                            "server_error") from None
        except httpx.TimeoutException:
            raise HTTPError(504, f"{remote.label} did not answer within {self.timeout:g} s (serve "
                                 "--endpoint-timeout)", "server_error") from None
        except httpx.ConnectError as e:
            raise HTTPError(502, f"cannot reach {remote.label}: {scrubbed(str(e) or 'connection refused', ep)}",
                            "server_error") from None
        except httpx.HTTPError as e:
            raise HTTPError(502, f"{remote.label}: {type(e).__name__}: {scrubbed(str(e), ep)}",
                            "server_error") from None

    def _refuses_stream_options(self, remote: Remote) -> None:
        """The endpoint refused the stream_options serve adds for a stream's usage: remembered for the server's
        life (its streams go as their clients sent them), and said once in the log."""
        if remote.endpoint.url in self.no_stream_options:
            return
        self.no_stream_options.add(remote.endpoint.url)
        LOG.get().warning(f"{remote.label} refuses stream_options: its streams are sent on without them, and "
                          "their tokens are not counted (its answers carry no usage)")

    async def _refused(self, request: Request, remote: Remote, model: str, response: Any,
                       body: bytes | None = None) -> Response:
        """An upstream's error answer as OpenAI's error, with its status (a redirect: 502, never followed);
        `body`: its body, where it was read already."""
        if body is None:
            body = await _error_body(response)
        status = response.status_code
        ep, where = remote.endpoint, remote.label
        said = scrubbed(error_text(body) or response.reason_phrase or "no message", ep)
        if 300 <= status < 400:
            raise HTTPError(502, f"{where} redirects elsewhere ({status}); serve does not follow redirects (the key "
                                 "stays with the URL given)", "server_error")
        if status == 401:  # not the client's key (serve's own, never sent on): the one serve sends
            which = "its api_key_env in endpoints.toml" if ep.name else "serve --api-key-env"
            message = f"{where} refused the request (401): {said}; the key refused is the one this server sends " \
                      f"{where} ({which}), not this request's"
        elif status == 403:
            message = f"{where} refused the request (403): {said}"
        elif status == 404:
            message = f"{where} has no model {model!r} or no such route (404): {said}"
        elif status in (429, 503):
            message = f"{where} is busy ({status}): {said}"
        else:
            message = f"{where} answered {status}: {said}"
        status = status if 400 <= status < 600 else 502
        e = HTTPError(status, message, _kind(body) or ("invalid_request_error" if status < 500 else "server_error"))
        after = response.headers.get("retry-after")
        return error_response(request, e, {"Retry-After": after} if after and status in (429, 503) else None)

    async def _passed(self, request: Request, response: Any, remote: Remote, model: str, lane: Lane,
                      answer: RemoteAnswer) -> AsyncIterator[bytes]:
        """The upstream's body, sent on as it arrives (a stream's events as each is complete); the upstream closed
        when it ends, breaks or the client leaves; what `answer` read of it kept for the access line and /metrics
        (the counts and times of an answer that ended, not of one cut short)."""
        import httpx

        pieces = response.aiter_bytes()
        gone = asyncio.ensure_future(_client_left(request))
        piece: asyncio.Future[bytes] | None = None
        ended = False
        try:
            while True:
                piece = asyncio.ensure_future(anext(pieces))
                await asyncio.wait({piece, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not piece.done():  # the client left: the upstream's stream is closed below, its work stops
                    piece.cancel()
                    with contextlib.suppress(BaseException):
                        await piece
                    return
                try:
                    data = piece.result()
                except StopAsyncIteration:
                    break
                except httpx.HTTPError as e:
                    timed_out = isinstance(e, httpx.TimeoutException)
                    broken = self._broken(remote, 504 if timed_out else 502,
                                          f"sent nothing for {self.timeout:g} s (serve --endpoint-timeout)"
                                          if timed_out else "broke off (its connection failed mid-answer)")
                    if answer.stream:
                        yield broken
                    return
                out = answer.feed(data)
                if out:
                    yield out
                if answer.done:  # [DONE]: the client has the whole answer, and may close at once
                    break
            rest = answer.end()
            if rest:
                yield rest
            if answer.stream and not answer.done and not answer.finished:  # closed before the answer's end
                yield self._broken(remote, 502, "ended before the answer did (no finish_reason, no [DONE])")
                return
            ended = True
        finally:  # also when Starlette cancels the stream (its client left)
            gone.cancel()
            if piece is not None:
                piece.cancel()
            if answer.done and not response.is_closed:  # the upstream's last bytes read apart: its connection kept
                drain = asyncio.ensure_future(_drained(pieces, response))
                self._draining.add(drain)
                drain.add_done_callback(self._draining.discard)
            else:
                with contextlib.suppress(BaseException):
                    await asyncio.shield(response.aclose())
            lane.leave()
            if ended or answer.done:
                self._observe(model, answer)

    def _broken(self, remote: Remote, status: int, why: str) -> bytes:
        """An answer that said 200 at its start and broke: its access line gets `status`; a stream's client gets an
        error event, then the stream's end, as for a local model's failure mid-stream (returned)."""
        error = HTTPError(status, f"the answer from {remote.label} {why}: it is partial", "server_error")
        trace = TRACE.get()
        if trace is not None:
            trace.fail(error)
        return _error_event(error) + b"data: [DONE]\n\n"

    def _observe(self, model: str, answer: RemoteAnswer) -> None:
        """An answer that ended: its tokens and time to first content on its access line, and in /metrics as a
        local model's generation is counted."""
        tally = answer.tally
        trace = TRACE.get()
        if trace is not None and tally is not None:
            trace.usage = tally
        if self._metrics is not None and answer.generation:  # as a local model's: embeddings count no tokens there
            self._metrics.remote(model, answer.prompt_tokens, answer.completion_tokens, answer.first_s,
                                 answer.total_s)

    def _count(self, remote: Remote, model: str, status: int) -> None:
        if self._counter is not None:
            self._counter.labels(remote.label, model, str(status)).inc()


async def _error_body(response: Any) -> bytes:
    """An upstream's error body, up to MAX_ERROR_BODY bytes (what came, should it break), the response closed."""
    import httpx

    body = b""
    try:
        async for part in response.aiter_bytes():
            body += part
            if len(body) > MAX_ERROR_BODY:
                break
    except httpx.HTTPError:  # what came is enough for the message
        pass
    finally:
        await response.aclose()
    return body


async def _drained(pieces: AsyncIterator[bytes], response: Any) -> None:
    """What an upstream sends after [DONE] (its body's end), read and dropped for DRAIN_S at most, then the
    response closed: its connection goes back to the pool instead of being cut."""
    with contextlib.suppress(BaseException):
        try:
            async with asyncio.timeout(DRAIN_S):
                async for _ in pieces:
                    pass
        finally:
            await response.aclose()


async def _client_left(request: Request) -> None:
    """Returns when the client disconnects (its body was read: nothing else comes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _error_event(e: HTTPError) -> bytes:
    from localgen.serve.apierror import OPENAI, error_body

    return b"data: " + json.dumps(error_body(OPENAI, e), ensure_ascii=False).encode() + b"\n\n"


def _kind(body: bytes) -> str | None:
    """An OpenAI error body's error.type."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    err = doc.get("error") if isinstance(doc, dict) else None
    kind = err.get("type") if isinstance(err, dict) else None
    return kind if isinstance(kind, str) and kind else None
