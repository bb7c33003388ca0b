"""A request body's deadlines (`BodyClock`): each part within serve --read-timeout of the one before, and the
whole at a least rate (a trickled body is a 408, serve/guard.py's and serve/files.py's). A stalled request head,
and connections at large, are serve/connection.py's: this module is read by `serve --help` (its default read
timeout), which must not import uvicorn."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localgen.serve.apierror import HTTPError

DEFAULT_READ_TIMEOUT_S = 30.0  # serve --read-timeout: headers, and each part of a body, within this
# bytes a second a body must average past its first --read-timeout seconds (Apache's mod_reqtimeout MinRate):
# a body trickled a byte every few seconds is never idle for --read-timeout, yet holds its connection for ever.
# What comes faster is no credit for later past --read-timeout seconds ahead: 16 MB sent at once, then a byte every
# 29 s, held its 16 MB for nine hours.
MIN_BODY_RATE = 500
TIE = 0.05  # seconds: a whole body's deadline this close to a stall's is said as a stall


class BodyClock:
    """A request body's deadlines: each part within `seconds` of the one before (a stall), and the whole within
    `seconds` plus one second for each MIN_BODY_RATE bytes that came (a trickle), that deadline never more than
    `seconds` ahead of the last part. A body on a slow link of a few KB/s is never cut, whatever its size within
    --max-body; one a slow-loris trickles is a 408, sent fast first or not."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.start = time.monotonic()
        self.due = self.start + seconds  # the whole body's deadline, as it stands
        self.got = 0  # bytes received so far
        self.whole = False  # whether the last wait was cut short by the whole body's deadline (not a stall's)

    def wait(self) -> float:
        """Seconds the next part may take."""
        left = self.due - time.monotonic()
        # where the two deadlines are within TIE of each other (a body that sent nothing, or its first bytes with
        # its headers, and no more), no byte came for about --read-timeout: a stall
        self.whole = left < self.seconds - TIE
        return max(0.0, min(self.seconds, left))

    def took(self, part: bytes) -> None:
        """A part came."""
        self.got += len(part)
        self.due = min(self.due + len(part) / MIN_BODY_RATE, time.monotonic() + self.seconds)

    def late(self, what: str) -> HTTPError:
        """The 408 of a body that missed its deadline: `what` ("the request body") stalled or came too slowly,
        by the deadline that bounded the last wait, not by the time now (an event loop's timer may fire a little
        before or after its deadline: uvloop's caches the loop's time)."""
        from localgen.serve.apierror import HTTPError  # starlette's: not for `serve --help` (cli/serve/options.py)

        taken = time.monotonic() - self.start
        if not self.whole:
            return HTTPError(408, f"{what} stalled: no byte came for {self.seconds:g} s (serve --read-timeout)")
        return HTTPError(408, f"{what} came too slowly: {self.got:,} bytes in {taken:.0f} s (a body has "
                              f"--read-timeout seconds, {self.seconds:g}, and one more for each {MIN_BODY_RATE} "
                              "bytes that come, never more than --read-timeout seconds ahead)")
