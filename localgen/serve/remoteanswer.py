"""A remote model's answer as serve passes it on (serve --endpoint, serve/upstream.py): what its access line and
/metrics learn from it (the time to its first content, its usage), and the usage chunk serve asked the upstream
for on the client's behalf taken out again, so that the client gets what it asked for.

A stream is read event by event (an SSE event ends at a blank line): each complete event is sent on as soon as it
is complete, an unfinished one waits for its end. Until the first content, each event's JSON is read for it (a
delta with text, reasoning or a tool call; a completion's text: the role chunk, a keep-alive comment are not
content); after it, only an event that carries `usage`. A whole answer passes as it comes, its usage read from
its end. The endpoint's key, should the upstream repeat it (an error event that quotes the request's header),
never passes: each event, and a whole answer's bytes, pass with it replaced by *** (localgen/redact.py)."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from localgen.redact import scrubbed_bytes
from localgen.serve.servelog import Tally

MAX_EVENT = 4 << 20  # bytes of one unfinished event held: past that, the rest passes unread (and unstripped)
_TAIL = 4096  # bytes of a whole answer kept to read its usage from
_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")  # an SSE event's end: a blank line, in any of the line ends SSE allows
_COUNTS = re.compile(rb'"(prompt_tokens|completion_tokens|cached_tokens)":\s*(\d+)')
_FINISHED = re.compile(rb'"finish_reason":\s*"')  # a choice that ended (null while it goes on)


@dataclass
class RemoteAnswer:
    """One remote answer passing through: `feed` each piece as it arrives (what to send on comes back), `end` at
    its end; then `tally` (the access line's tokens and TTFT) and `seconds` (time to first content, and total,
    from when the request was sent on)."""

    stream: bool
    strip_usage: bool  # serve added stream_options.include_usage: the usage it brings is serve's, not the client's
    generation: bool = True  # a completion's (its tokens go to /metrics' generation series), not embeddings'
    sent: float = field(default_factory=time.perf_counter)  # when the request was sent on
    first_s: float | None = None  # to the first event with content (a stream's)
    total_s: float | None = None  # to the answer's end
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int = 0
    secret: str = ""  # the key serve sends the upstream: replaced by *** wherever the answer repeats it
    done: bool = False  # a stream's `data: [DONE]` has passed: the answer is whole (what follows is not sent)
    finished: bool = False  # a stream's choice said its finish_reason
    _pending: bytes = b""  # a stream's unfinished event
    _tail: bytes = b""  # a whole answer's last bytes
    _blind: bool = False  # an event grew past MAX_EVENT: the rest passes as it comes
    _carry: bytes = b""  # bytes passing as they come held back until the next ones: a key may span the two

    def feed(self, data: bytes) -> bytes:
        """What of `data` goes to the client now: a stream's complete events (less serve's usage), or a whole
        answer's bytes as they are."""
        if not self.stream:
            self._tail = (self._tail + data)[-_TAIL:]
            return self._unsplit(data)
        if self._blind:
            return self._unsplit(data)
        buffer = self._pending + data
        out: list[bytes] = []
        start = 0
        while not self.done and (end := _END.search(buffer, start)) is not None:
            out.append(self._event(buffer[start:end.end()]))
            start = end.end()
        self._pending = buffer[start:] if not self.done else b""
        passing = scrubbed_bytes(b"".join(out), self.secret)
        if len(self._pending) > MAX_EVENT:
            self._blind = True
            passing += self._unsplit(self._pending)
            self._pending = b""
        return passing

    def _unsplit(self, data: bytes) -> bytes:
        """Bytes that pass as they come, the key replaced: the last len(key) - 1 of them held back until more come
        (or the end), where a key cut between two pieces would pass unseen."""
        if not self.secret:
            return data
        data = scrubbed_bytes(self._carry + data, self.secret)
        cut = max(0, len(data) - (len(self.secret.encode()) - 1))
        self._carry = data[cut:]
        return data[:cut]

    def end(self) -> bytes:
        """The answer has ended: what is left to send (a last event with no blank line after it)."""
        if self.total_s is None:
            self.total_s = time.perf_counter() - self.sent
        carry, self._carry = self._carry, b""
        if not self.stream:
            self._counts(dict(_COUNTS.findall(self._tail)))
            return carry
        rest, self._pending = self._pending, b""
        return carry + scrubbed_bytes(self._event(rest) if rest.strip() else rest, self.secret)

    @property
    def tally(self) -> Tally | None:
        """The answer's tokens for the access line (None when it carried no usage and made no content)."""
        if self.prompt_tokens is None and self.completion_tokens is None and self.first_s is None:
            return None
        return Tally(self.prompt_tokens or 0, self.cached_tokens, self.completion_tokens or 0, self.first_s)

    def _event(self, event: bytes) -> bytes:
        """One complete event as the client gets it; what it says of content and usage noted."""
        if not self.finished and _FINISHED.search(event):
            self.finished = True
        if b'"usage"' not in event and b"[DONE]" not in event and self.first_s is not None:
            return event
        lines = event.splitlines(keepends=True)
        data = [line for line in lines if line.startswith(b"data:")]
        if not data:  # a comment (": ping"), an event with no data
            return event
        text = b"".join(line[5:].removeprefix(b" ").rstrip(b"\r\n") + b"\n" for line in data).rstrip(b"\n")
        if text.strip() == b"[DONE]":  # the stream's end (many clients close the connection once they read it)
            self.done = True
            self.total_s = time.perf_counter() - self.sent
            return event
        try:
            doc = json.loads(text)
        except ValueError:  # what the client will make of it
            return event
        if not isinstance(doc, dict):
            return event
        if self.first_s is None and _has_content(doc):
            self.first_s = time.perf_counter() - self.sent
        if "usage" not in doc:
            return event
        usage = doc["usage"]
        if isinstance(usage, dict):
            details = usage.get("prompt_tokens_details")
            self._counts({b"prompt_tokens": usage.get("prompt_tokens"),
                          b"completion_tokens": usage.get("completion_tokens"),
                          b"cached_tokens": details.get("cached_tokens") if isinstance(details, dict) else None})
        if not self.strip_usage:
            return event
        del doc["usage"]
        if not doc.get("choices"):  # the usage chunk itself: the client did not ask for it
            return b""
        kept = [line for line in lines if not line.startswith(b"data:")]
        ending = lines[-1][len(lines[-1].rstrip(b"\r\n")):] or b"\n"  # the event's line end, as it came
        return b"".join(kept[:-1] if kept and not kept[-1].strip() else kept) + b"data: " + \
            json.dumps(doc, ensure_ascii=False).encode() + ending + ending

    def _counts(self, found: dict[bytes, Any]) -> None:
        for key, value in found.items():
            try:
                n = int(value)
            except (TypeError, ValueError):
                continue
            if n < 0:
                continue
            if key == b"prompt_tokens":
                self.prompt_tokens = n
            elif key == b"completion_tokens":
                self.completion_tokens = n
            elif key == b"cached_tokens":
                self.cached_tokens = n


def _has_content(doc: dict[str, Any]) -> bool:
    """Whether a chunk carries generated output: a delta with anything but its role (text, reasoning, a tool
    call, a refusal), or a completion's text."""
    choices = doc.get("choices")
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        if isinstance(choice.get("text"), str) and choice["text"]:
            return True
        delta = choice.get("delta")
        if isinstance(delta, dict) and any(v not in (None, "", [], {}) for k, v in delta.items() if k != "role"):
            return True
    return False
