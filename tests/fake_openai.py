"""A small OpenAI-compatible server for the protocol's edges (Starlette on uvicorn, in a thread, on a
loopback port). The model name picks the behaviour; every request's headers are kept for the tests."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route


def _chunk(content: str | None = None, role: str | None = None, finish: str | None = None) -> str:
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    doc = {"id": "x", "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(doc)}\n\n"


class FakeServer:
    """Behaviours by model id:
    - plain: ": ping" comments, a role-only first chunk, "Hello" " world", no usage chunk, [DONE]
    - usage: as plain, with a usage chunk and llama-server timings
    - error-mid: "Hel", then an `event: error` with a message
    - broken: "Hel", then the connection ends with no [DONE]
    - garbage: a data line that is not JSON
    - busy-once: 429 (Retry-After: 0) on the first request, then as plain
    - busy: always 503
    - redirect: 307 to `redirect_to`
    - html: a 200 text/html page (a wrong URL)
    - slow: "tick " every 50 ms, 200 times
    - multiline: one event's JSON split over many `data:` lines (the SSE spec joins them with newlines)
    - bad-delta-once: a chunk whose delta is a string on the first request, then as plain
    - endless: "tok " chunks without end, whatever max_tokens says
    - garbage-after: "Hel", then a data line that is not JSON
    - number-after: "Hel", then a chunk whose content is a number
    - echo-key: "your key is <the bearer key> ok", the key cut in two between chunks
    GET /v1/models lists `plain`; with `models_mode` "drip", a space every 50 ms without end; "huge", a 17 MiB list;
    "html", a web page; "redirect", a 302 to /elsewhere.
    """

    def __init__(self, redirect_to: str = "") -> None:
        self.requests: list[dict[str, Any]] = []
        self.redirect_to = redirect_to
        self.busy_once_seen = 0
        self.bad_delta_seen = 0
        self.models_mode = ""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        app = Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"]),
                                Route("/v1/models", self.models)])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error",
                                                    lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(5)

    async def models(self, request: Request) -> Response:
        if self.models_mode == "drip":
            async def drip() -> AsyncIterator[bytes]:
                while True:
                    yield b" "
                    await asyncio.sleep(0.05)

            return StreamingResponse(drip(), media_type="application/json")
        if self.models_mode == "huge":
            async def huge() -> AsyncIterator[bytes]:
                yield b'{"object": "list", "data": [{"id": "plain"}], "pad": "'
                for _ in range(17):
                    yield b"a" * 2**20
                yield b'"}'

            return StreamingResponse(huge(), media_type="application/json")
        if self.models_mode == "html":
            return HTMLResponse("<html><body>Welcome</body></html>")
        if self.models_mode == "redirect":
            return Response(status_code=302, headers={"Location": f"{self.url}/elsewhere"})
        return JSONResponse({"object": "list", "data": [{"id": "plain", "object": "model"}]})

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append({"headers": dict(request.headers), "body": body})
        model = body.get("model")
        if model == "redirect":
            return RedirectResponse(self.redirect_to + "/v1/chat/completions", status_code=307)
        if model == "busy":
            return JSONResponse({"error": {"message": "overloaded"}}, status_code=503, headers={"Retry-After": "0"})
        if model == "busy-once":
            self.busy_once_seen += 1
            if self.busy_once_seen == 1:
                return JSONResponse({"error": {"message": "slow down"}}, status_code=429, headers={"Retry-After": "0"})
        if model == "html":
            return PlainTextResponse("<html>hi</html>", media_type="text/html")

        async def stream() -> AsyncIterator[str]:
            yield ": ping\n\n"
            yield _chunk(role="assistant")
            if model == "error-mid":
                yield _chunk("Hel")
                yield 'event: error\ndata: {"error": {"message": "the GPU fell over"}}\n\n'
                return
            if model == "broken":
                yield _chunk("Hel")
                await asyncio.sleep(0.05)
                raise ConnectionResetError("cut")
            if model == "slow":
                for _ in range(200):
                    yield _chunk("tick ")
                    await asyncio.sleep(0.05)
            if model == "multiline":
                doc = json.dumps({"id": "x", "object": "chat.completion.chunk", "choices": [
                    {"index": 0, "delta": {"content": "Hello world"}, "finish_reason": "stop"}]}, indent=1)
                yield "".join(f"data:{line}\n" for line in doc.splitlines()) + "\ndata: [DONE]\n\n"
                return
            if model == "bad-delta-once":
                self.bad_delta_seen += 1
                if self.bad_delta_seen == 1:
                    yield "data: " + json.dumps({"choices": [{"index": 0, "delta": "oops"}]}) + "\n\n"
                    return
            if model == "endless":
                while True:
                    yield _chunk("tok ")
                    await asyncio.sleep(0.001)
            if model == "garbage-after":
                yield _chunk("Hel")
                yield "data: this is not json\n\n"
                return
            if model == "number-after":
                yield _chunk("Hel")
                yield 'data: {"choices": [{"index": 0, "delta": {"content": 42}}]}\n\n'
                return
            if model == "echo-key":
                key = request.headers.get("authorization", "").removeprefix("Bearer ")
                yield _chunk("your key is " + key[:5])
                yield _chunk(key[5:] + " ok")
                yield _chunk(finish="stop")
                yield "data: [DONE]\n\n"
                return
            if model == "garbage":
                yield "data: <<not json>>\n\n"
                return
            yield _chunk("Hello")
            yield ": keep-alive\n\n"
            yield _chunk(" world")
            yield _chunk(finish="stop")
            if model == "usage":
                yield ("data: " + json.dumps({"choices": [], "usage": {
                    "prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9},
                    "timings": {"cache_n": 3, "prompt_n": 4, "prompt_per_second": 100.0}}) + "\n\n")
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")


class StrictServer(FakeServer):
    """An upstream that refuses a field it does not know, as some OpenAI-compatible servers do: a request with
    stream_options is a 400 naming it (at /v1/chat/completions; a 422 in pydantic's shape at /v1/completions);
    model `picky` refuses every request with a 400 that names another field, `wordy` with one whose message is
    WORDY, 1,213 characters long."""

    WORDY = "bad request: " + "field " * 200

    def __init__(self) -> None:
        super().__init__()
        self.server.config.app.routes.append(Route("/v1/completions", self.completions, methods=["POST"]))

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "plain"}, {"id": "picky"}, {"id": "wordy"}]})

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        if "stream_options" in body:
            self.requests.append({"headers": dict(request.headers), "body": body})
            return JSONResponse({"error": {"message": "Unrecognized request argument supplied: stream_options",
                                           "type": "invalid_request_error"}}, status_code=400)
        if body.get("model") in ("picky", "wordy"):
            self.requests.append({"headers": dict(request.headers), "body": body})
            said = "temperature must be at most 2" if body["model"] == "picky" else self.WORDY
            return JSONResponse({"error": {"message": said, "type": "invalid_request_error"}}, status_code=400)
        return await super().chat(request)

    async def completions(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append({"headers": dict(request.headers), "body": body})
        if "stream_options" in body:
            return JSONResponse({"detail": [{"type": "extra_forbidden", "loc": ["body", "stream_options"],
                                             "msg": "Extra inputs are not permitted"}]}, status_code=422)

        async def stream() -> AsyncIterator[str]:
            for text, finish in (("Hello", None), (" world", "stop")):
                yield "data: " + json.dumps({"id": "t", "object": "text_completion", "choices": [
                    {"index": 0, "text": text, "finish_reason": finish}]}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")


class GatheringServer(FakeServer):
    """Records how many requests it holds at once (`most`): each request waits until `target` have been in flight
    together (or GATHER_S, a safety net), then answers as `plain` (a whole answer where not asked to stream); after
    that, none waits. A client that sends
    one request at a time never brings `most` past 1."""

    GATHER_S = 3.0

    def __init__(self, target: int) -> None:
        self.target = target
        self.in_flight = 0
        self.most = 0
        super().__init__()

    async def chat(self, request: Request) -> Response:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            deadline = time.monotonic() + self.GATHER_S
            while self.most < self.target and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            if not (await request.json()).get("stream"):  # a whole answer (a batch's line)
                return JSONResponse({"id": "g", "object": "chat.completion", "model": "plain", "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "Hello world"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}})
            response = await super().chat(request)
            assert isinstance(response, StreamingResponse)
            body = b"".join([part if isinstance(part, bytes) else part.encode()
                             async for part in response.body_iterator])
            return Response(body, media_type="text/event-stream")
        finally:
            self.in_flight -= 1
