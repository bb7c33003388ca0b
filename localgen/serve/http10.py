"""An HTTP/1.0 client's answers, sent whole. HTTP/1.0 has no chunked encoding (RFC 9112, section 6.1: a server
sends none to such a client), yet uvicorn frames every response without a Content-Length in chunks, whatever the
request's version; a 1.0 client (nginx's proxy_pass by default, ApacheBench, old tools) reads the chunks' sizes as
part of the body. So a response without a length, to a 1.0 request, is gathered and sent with its length: a stream
reaches that client whole, at its end; one that fails before its end has sent that client nothing yet, so it is
answered as a failure before any stream is: an exception as serve/app.py's Unhandled answers one, an error event
(a 503 at shutdown) as that error, in the API's shape with its status."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from localgen.serve.apierror import error_response
from localgen.serve.servelog import TRACE

STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # a stream's: no cache, no proxy buffer
BODILESS = (*range(100, 200), 204, 304)  # statuses that carry no body, and so no length (RFC 9110, section 8.6)


class Http10:
    """Pure ASGI: for an HTTP/1.0 request (not HEAD), a response without Content-Length (one that may have a
    body) is held until its last part and sent with one. Innermost of the middleware, so that the layers outside
    it (the access line's status, the answer to an exception) see what leaves."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("http_version") != "1.0" or scope["method"] == "HEAD":
            await self.app(scope, receive, send)
            return
        start: dict[str, Any] | None = None
        held: list[bytes] = []

        async def sending(message: dict[str, Any]) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] not in BODILESS and not any(
                    k.lower() in (b"content-length", b"transfer-encoding") for k, _ in message.get("headers", ())):
                start = message
                return
            if start is not None and message["type"] == "http.response.body":
                held.append(message.get("body", b""))
                if message.get("more_body", False):
                    return
                trace = TRACE.get()
                if trace is not None and trace.error is not None:  # an error event ended the stream: it, not a 200
                    await error_response(Request(scope), trace.error)(scope, receive, send)
                    return
                body = b"".join(held)
                await send({**start, "headers": [*start.get("headers", ()),
                                                 (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
            await send(message)

        await self.app(scope, receive, sending)
