"""Connections that stall (slow-loris): uvicorn closes a connection idle between requests (its keep-alive
timeout) but waits forever for a request's headers, whether none came or half of them. `with_header_deadline`
makes uvicorn's HTTP protocol close a connection whose next request's headers are not complete within the
read timeout of its opening or of the previous response's end. (A stalled body is serve/guard.py's: a 408.)"""

from __future__ import annotations

import asyncio
import time
from typing import Any

DEFAULT_READ_TIMEOUT_S = 30.0  # serve --read-timeout: headers, and each part of a body, within this


def with_header_deadline(base: type[asyncio.Protocol], seconds: float) -> type[asyncio.Protocol]:
    """uvicorn's protocol class `base` (its h11 or httptools one: both keep the request in hand as `cycle`),
    closing a connection that takes longer than `seconds` to send a request's headers."""

    class HeaderDeadline(base):  # type: ignore[valid-type,misc]
        _since: float | None = None  # when the wait for the next request's headers began (None: one is in hand)
        _seen: Any = None  # the request in hand when last looked at
        _timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._since = time.monotonic()
            self._timer = self.loop.call_later(seconds, self._check)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.cycle is not None and self.cycle is not self._seen:  # a request's headers are complete
                self._seen, self._since = self.cycle, None

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._since = time.monotonic()  # the next request's headers are due (unless one was pipelined)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            super().connection_lost(exc)

        def _check(self) -> None:
            self._timer = None
            if self.transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete:  # a request in hand (pipelined too)
                self._seen, self._since = self.cycle, None
            waited = 0.0 if self._since is None else time.monotonic() - self._since
            if waited >= seconds:
                self.transport.close()
                return
            self._timer = self.loop.call_later(seconds - waited, self._check)

    return HeaderDeadline
