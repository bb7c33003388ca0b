"""Connections that stall (slow-loris): uvicorn closes a connection idle between requests (its keep-alive
timeout) but waits forever for a request's headers, whether none came or half of them. `HeaderDeadline`, uvicorn's
HTTP protocol for serve, closes a connection whose next request's headers are not complete within the read timeout
of its opening or of the previous response's end. (A stalled body is serve/guard.py's: a 408, by stalls.BodyClock.)
httptools, which serve's uvicorn uses, bounds neither the request line nor a header, and builds each at a cost
quadratic in its length on the event loop: a request's head (its line and headers) past `MAX_HEAD` bytes is
answered 431 and the connection closed, counted as bytes arrive, before the parser sees more of them. Requests
pipelined on a connection are parsed one at a time: the bytes after a whole request wait unparsed (and past
MAX_HEAD of them the connection is not read) until its answer has gone; uvicorn parsed every one that came and
queued it, without bound, and answered a malformed one 400 before the answers of those ahead of it. A client that
half-closes its side once it has asked still has its answers written (uvicorn closed the connection at its end of
file), save where a handler waits to hear that its client left (a generation): the two look alike. A connection
whose answers have waited --read-timeout seconds for its client to read them (the transport's buffer past its
high-water mark) is closed, its request in hand as one whose client left: uvicorn has no write timeout. Past `cap`
connections open at once (serve/descriptors.py), a new one closes the one that has waited longest for a
request's headers or for its client to read (none: the new one is closed): a flood of idle connections holds
none of the server's descriptors for long, and never those of a request in hand that its client reads. A
connection closed after an answer while its client may still be sending (an answer before the request's body all
came: a 408; a 431) lingers (`Lingering`): closed with bytes unread, the kernel answered RST, which could reach
the client before it had read the answer ("connection reset", the answer lost)."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from localgen.serve.stalls import DEFAULT_READ_TIMEOUT_S

MAX_HEAD = 64 << 10  # bytes of a request's line and headers together (llama-server's and nginx's are of this order)
# where a request's head (or a chunked body, its last chunk and trailers) may end: a line with nothing on it
HEAD_END = re.compile(rb"\n\r?\n")
TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
             b"connection: close\r\ncontent-length: %d\r\n\r\n%s")


def _blank_line(tail: bytes, held: bytearray, within: int) -> int | None:
    """Where, in `held`'s first `within` bytes, the first blank line ends (its bytes counted from held's start), the
    one that begins in `tail` (the 2 bytes before held) too; None where there is none. Searched in place: a copy of
    what is held at each blank line made a chunked body of blank lines quadratic."""
    across = HEAD_END.search(tail + bytes(held[:min(2, within)]))  # (a blank line is at most 3 bytes)
    if across is not None and across.start() < len(tail):
        return across.end() - len(tail)
    found = HEAD_END.search(held, 0, within)
    return None if found is None else found.end()


LINGER_S = 2.0  # seconds a connection closed as its client still sends reads on (dropping it) before it closes


class Lingering:
    """A connection's transport whose close(), while `unread()` (its client may still be sending), half-closes
    instead (the answer written, then its end of file) and reads on, dropping what comes, until the client closes
    its side or LINGER_S pass; then it closes. It is closing meanwhile (is_closing). Where the transport cannot
    half-close (TLS), it closes at once. Everything else is the transport's."""

    def __init__(self, transport: Any, unread: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._unread = unread
        self._loop = loop
        self.lingering = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self.lingering or bool(self._transport.is_closing())

    def close(self) -> None:
        t = self._transport
        if self.lingering or t.is_closing() or not self._unread() or not t.can_write_eof():
            t.close()
            return
        self.lingering = True
        t.write_eof()  # after what is written (the answer)
        if not t.is_reading():
            t.resume_reading()  # (flow control may have paused it): what the client sends is read, and dropped
        self._loop.call_later(LINGER_S, t.close)


class HeldFlow(FlowControl):
    """uvicorn's flow control of a connection, which reads on at each answer's end and at each receive() of
    a handler: not while `full()` (the requests held unparsed are past MAX_HEAD bytes)."""

    def __init__(self, transport: Any, full: Any) -> None:
        super().__init__(transport)
        self.full = full

    def resume_reading(self) -> None:
        if not self.full():
            super().resume_reading()


class HeaderDeadline(HttpToolsProtocol):  # type: ignore[misc]
    """uvicorn's httptools protocol, closing a connection that takes longer than `seconds` to send a request's
    headers, and answering 431 to one whose request line and headers pass `MAX_HEAD` bytes; past `cap`
    connections open, the one idle longest (or the new one) is closed. An Upgrade (websocket, h2c) is answered as
    HTTP/1.1, as RFC 9110 §7.8 lets a server: serve has no WebSocket routes (ws="none"), and uvicorn's two warnings
    per such request told the operator to install a WebSocket library. `with_header_deadline` makes one with its
    `seconds` and `cap`."""

    seconds = DEFAULT_READ_TIMEOUT_S  # serve --read-timeout
    cap: int | None = None  # connections open at once (serve/descriptors.py); None: no cap
    _since: float | None = None  # when the wait for the next request's headers began (None: one is in hand)
    _seen: Any = None  # the request in hand when last looked at
    _timer: asyncio.TimerHandle | None = None
    _head: int | None = 0  # bytes read of the request's head so far (None: its headers are complete)
    _held: bytearray  # bytes come and not yet parsed: those after a whole request, until it is answered
    _tail = b""  # the last bytes of a head parsed (where its blank line began)
    _left: int | None = None  # bytes of the body still to come, by its Content-Length (None: chunked)
    _eof = False  # the client has closed its side (half-closed: it may still read the answers)
    _full = False  # reading is paused for the bytes held
    _stuck: float | None = None  # since when the answers have waited for the client to read (None: they don't)
    _closing: float | None = None  # since when, closing, it has waited for the client to read what is left
    _linger: Lingering  # its transport, which lingers as it closes while its client sends
    _refused = False  # answered 431 (its head too large), the rest of it perhaps on its way
    _stopping = False  # the server stops (uvicorn's shutdown): no close lingers

    def _unsupported_upgrade_warning(self) -> None:
        pass

    def connection_made(self, transport: Any) -> None:
        self._linger = Lingering(transport, self._may_send, self.loop)
        super().connection_made(self._linger)  # type: ignore[arg-type]  # (a Transport, by delegation)
        self._held = bytearray()
        self.flow = HeldFlow(self.transport, lambda: len(self._held) > MAX_HEAD)
        self._since = time.monotonic()
        self._timer = self.loop.call_later(self.seconds, self._check)
        if self.cap is not None and len(self.connections) > self.cap and \
                sum(not c.transport.is_closing() for c in self.connections) > self.cap:  # (closing: not counted)
            self._make_room()

    def _idle(self) -> bool:
        """Whether it waits for a request's headers (none in hand), or for its client to read, still open."""
        return not self.transport.is_closing() and (self._stuck is not None or (self._since is not None and (
            self.cycle is None or self.cycle.response_complete)))

    def _waited(self) -> float:
        """Since when it has waited for its client (for a request, or to read the answers)."""
        return min(t for t in (self._since, self._stuck, time.monotonic()) if t is not None)

    def _make_room(self) -> None:
        """Past the cap: close the connection that has waited longest for its client, else this one."""
        mine: list[Any] = [c for c in self.connections if isinstance(c, HeaderDeadline)]  # (all of them are)
        idle = [c for c in mine if c is not self and c._idle()]
        oldest = min(idle, key=lambda c: c._waited(), default=self)
        if oldest._stuck is not None:
            oldest.transport.abort()  # (close() would wait for the answers it holds to be read)
        else:
            oldest.transport.close()

    def _answering(self) -> bool:
        """Whether a request has all come and its answer has not all gone (or one waits behind it): the
        bytes after it wait, unparsed, so that a client pipelining requests it never reads the answers of
        queues none of them in the server."""
        return bool(self.pipeline) or (self.cycle is not None and not self.cycle.response_complete
                                       and not self.cycle.more_body)

    def _may_send(self) -> bool:
        """Whether a close now comes after an answer written while the client may still be sending: a 431 (its
        head not whole), or an answer whose request's body has not all come; the client has not closed its side.
        Not a close of uvicorn's own (a malformed request, its handler still at work: it must hear that its client
        left), nor one of a connection idle or evicted (a half-sent head: it would hold its descriptor on)."""
        if self._eof or self._stopping:  # (the server stopping: its exit waits for every connection to close)
            return False
        return self._refused or (self.cycle is not None and self.cycle.response_complete and self.cycle.more_body)

    def data_received(self, data: bytes) -> None:
        if self._linger.lingering:
            return  # answered and closing: what the client still sends is dropped
        self._held += data
        self._pump()
        if len(self._held) > MAX_HEAD:  # (a body's bytes never wait here: the parser takes them)
            self._full = True
            self.flow.pause_reading()  # until the answers have taken the requests held below it

    def _pump(self) -> None:
        """Parse the bytes held, up to the end of a whole request, then the next once it is answered."""
        while self._held and not self.transport.is_closing() and not self._answering():
            held = self._held
            if self._head is not None:  # a head's bytes are fed only up to the bound: the parser never
                room = MAX_HEAD - self._head  # holds more of one
                if room <= 0:
                    self._too_large()
                    return
                end = _blank_line(self._tail, held, room)
                size = min(len(held), room) if end is None else end
                self._head += size
            elif self._left is not None:  # a body: the Gate's --max-body bounds it
                end = None
                size = min(len(held), self._left) or len(held)
                self._left -= min(size, self._left)
            else:  # a chunked one: it can end only at a blank line (its last chunk, "0", then the trailers')
                end = _blank_line(self._tail, held, len(held))
                size = len(held) if end is None else end
            part = bytes(held[:size])
            del held[:size]
            self._tail = b"" if end is not None else (self._tail + part)[-2:]
            super().data_received(part)
            if self.cycle is not None and self.cycle is not self._seen:  # a request's headers are complete
                self._seen, self._since = self.cycle, None
        if self._full and len(self._held) <= MAX_HEAD:
            self._full = False
            self.flow.resume_reading()
        if self._eof and not self._answering() and not self.transport.is_closing():
            self.transport.close()  # a half-closed client has had every answer

    def on_headers_complete(self) -> None:
        self._head = None
        coding = any(k == b"transfer-encoding" for k, _ in self.headers)
        length = next((v for k, v in self.headers if k == b"content-length"), b"0")
        self._left = None if coding else int(length) if length.strip().isdigit() else 0
        before = self.cycle
        super().on_headers_complete()
        if self.cycle is not before:  # a request's (not an upgrade's): read by its task when it starts, after this
            self.cycle.receive = self._watched(self.cycle.receive)  # type: ignore[method-assign]

    def _watched(self, receive: Any) -> Any:
        """A request's receive that, once its body has all been read and the client has half-closed, says the
        client left: a handler that waits for that (a generation) stops as for one that left (the two look
        alike), while one that answers without waiting has its answer written."""
        read = False  # the handler has had the body's end

        async def receiving() -> Any:
            nonlocal read
            if read and self._eof:
                self.transport.close()  # its client left: what uvicorn's receive then says
            message = await receive()
            read = read or message["type"] != "http.request" or not message.get("more_body", False)
            return message

        return receiving

    def eof_received(self) -> bool | None:  # type: ignore[override]  # (asyncio's: True keeps the transport open)
        if self._linger.lingering or self.cycle is None or (self.cycle.response_complete and not self._held):
            return None  # (uvicorn's answer: the transport closes)
        self._eof = True  # the answers to the requests that came are still written, then it closes
        self.cycle.message_event.set()  # a handler waiting on receive() asks again, and hears the client left
        self._pump()
        return True

    def on_message_complete(self) -> None:
        self._head, self._tail = 0, b""  # the next request's head begins (its bytes may already be here)
        super().on_message_complete()

    def _too_large(self) -> None:
        self._refused = True  # (its close lingers: the rest of the head may be on its way)
        body = (b'{"error":{"message":"the request line and headers are over the limit of %d bytes",'
                b'"type":"invalid_request_error","param":null,"code":null}}' % MAX_HEAD)
        self.transport.write(TOO_LARGE % (len(body), body))
        self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._since = time.monotonic()  # the next request's headers are due (unless one was pipelined)
        if self._held or self._eof:
            self.loop.call_soon(self._pump)  # the requests held behind it (after the answer's last send)

    def shutdown(self) -> None:
        """uvicorn's, as the server stops: a close from now on is at once (one that lingered held up the exit past
        --drain-timeout: "timeout graceful shutdown exceeded")."""
        self._stopping = True
        super().shutdown()

    def pause_writing(self) -> None:
        super().pause_writing()  # the answers fill the buffers: the client reads nothing
        self._stuck = time.monotonic() if self._stuck is None else self._stuck

    def resume_writing(self) -> None:
        super().resume_writing()
        self._stuck = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)

    def _check(self) -> None:
        self._timer = None
        now = time.monotonic()
        if self.transport.is_closing():  # close() waits for the answers written to be read, however long:
            if not self.transport.get_write_buffer_size():  # a client that reads none is cut off
                return
            self._closing = now if self._closing is None else self._closing
            if now - self._closing >= self.seconds:
                self.transport.abort()
            else:
                self._timer = self.loop.call_later(self.seconds - (now - self._closing), self._check)
            return
        if self.cycle is not None and not self.cycle.response_complete:  # a request in hand (pipelined too)
            self._seen, self._since = self.cycle, None
        if self._stuck is not None and now - self._stuck >= self.seconds:  # a client that reads no answer: its
            self.transport.abort()  # request in hand is one whose client left (close() would wait for it)
            return
        waited = 0.0 if self._since is None else now - self._since
        if waited >= self.seconds:
            self.transport.close()
            return
        stuck = 0.0 if self._stuck is None else now - self._stuck
        self._timer = self.loop.call_later(self.seconds - max(waited, stuck), self._check)


def with_header_deadline(seconds: float, cap: int | None = None) -> type[HeaderDeadline]:
    """The protocol class of a server whose read timeout is `seconds` and whose connections are capped at `cap`."""
    return type("HeaderDeadline", (HeaderDeadline,), {"seconds": seconds, "cap": cap})
