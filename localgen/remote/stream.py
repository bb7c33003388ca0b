"""Reading an OpenAI-compatible answer (remote/client.py's RemoteGeneration): an SSE stream as real servers send
it (`:` keep-alive comments, a first chunk with only the role, no usage chunk, an error event mid-stream, a last
event without its blank line), or one whole JSON answer from a server that ignored `stream: true`, into
(text, finish reason) pieces, with the usage, server timings and logprobs kept on the answer. Every line, event
and body is bounded (MAX_LINE): a longer one is a RemoteError naming the endpoint, not unbounded memory."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from typing import Any, Protocol

from localgen.errors import RemoteError
from localgen.remote.errortext import error_text
from localgen.types import FinishReason


class RemoteGeneration(Protocol):
    """What the parser reads and fills of remote/client.py's RemoteGeneration (a protocol: the client imports this
    module, not the other way)."""

    n: int  # content pieces received
    logprobs: list[Any]
    server_timings: dict[str, Any] | None
    usage: dict[str, Any] | None

    @property
    def stopped(self) -> bool: ...

MAX_LINE = 16 * 2**20  # a stream's line (or event), a whole JSON answer, a model list: past this, an error
URL_HINT = "check the URL: it should be the API base, e.g. http://host:8000/v1"
_EOL = re.compile(rb"\r\n|\r|\n")


def events(response: Any, where: str, gen: RemoteGeneration) -> Iterator[tuple[str, FinishReason | None]]:
    """(text, finish reason) from an SSE stream (or one JSON body) from `where` (the endpoint's label), keeping
    usage and timings on `gen`."""
    import httpx

    if "json" in response.headers.get("content-type", "") and "event-stream" not in \
            response.headers.get("content-type", ""):
        try:
            text = bounded(response, f"the answer from {where}").decode("utf-8", "replace")
        except httpx.HTTPError as e:
            if gen.stopped:
                return
            raise RemoteError(f"the answer from {where} broke ({said(e)})", down=True) from None
        yield from _whole(_json(text, where, gen), where, gen)
        return
    finished, seen = False, False  # seen: an SSE field (not a comment) has arrived
    event, data = "message", list[str]()  # one SSE event: its type and its data lines (joined by "\n")
    size = 0  # the event's data so far, bounded as a line is
    try:
        # a stream that ends without a blank line still ends its last event
        for line in itertools.chain(_lines(response.iter_bytes(), where, gen), [""]):
            if not line:
                pending, kind = data, event
                event, data, size = "message", [], 0  # the next event starts afresh
                if pending:
                    text = "\n".join(pending)
                    if text.strip() == "[DONE]":
                        finished = True
                        break
                    doc = _json(text, where, gen)
                    if kind == "error" or "error" in doc:
                        raise RemoteError(f"{where} reported an error mid-answer: {error_text(doc)}"
                                          + (f" (after {pieces(gen.n)}; the answer is partial)" if gen.n else ""),
                                          partial=gen.n > 0)
                    for piece, finish in _chunk(doc, where, gen):
                        finished = finished or finish is not None
                        yield piece, finish
                continue
            if line.startswith(":"):  # keep-alive comments
                continue
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if not seen and field not in ("data", "event", "id", "retry"):  # an HTML page, say
                raise RemoteError(f"{where} answered with text/event-stream that is not an OpenAI stream: "
                                  f"{line[:80]!r}", hint=URL_HINT, down=True)
            seen = True
            if field == "event":
                event = value
            elif field == "data":
                size += len(value)
                if size > MAX_LINE:
                    raise _too_long(where, gen)
                data.append(value)
            # id:, retry: and unknown fields are ignored, as the SSE spec says
    except httpx.HTTPError as e:
        if gen.stopped:  # cancel() ended a read that waited (gen.cancel), or close() the stream: no fault of its
            return
        raise RemoteError(f"the stream from {where} broke after {pieces(gen.n)} ({said(e)})"
                          + ("; the answer is partial" if gen.n else ""), down=True, partial=gen.n > 0) from None
    if not finished and not gen.stopped:
        raise RemoteError(f"the stream from {where} ended without finishing the answer"
                          + (f" (after {pieces(gen.n)}; the answer is partial)" if gen.n else ""),
                          down=True, partial=gen.n > 0)


def _chunk(doc: dict[str, Any], where: str, gen: RemoteGeneration) -> Iterator[tuple[str, FinishReason | None]]:
    if isinstance(doc.get("usage"), dict) and doc["usage"]:  # another shape is no usage (its counts unknown)
        gen.usage = doc["usage"]
    if isinstance(doc.get("timings"), dict):
        gen.server_timings = doc["timings"]
    choices = doc.get("choices")
    if not isinstance(choices, list):
        if doc.get("usage") or doc.get("timings"):
            return
        raise _bad(f"{where} sent a chunk without choices: {json.dumps(doc)[:200]}", gen)
    for choice in choices[:1]:
        if not isinstance(choice, dict):
            raise _bad(f"{where} sent a malformed choice: {json.dumps(choice)[:200]}", gen)
        delta = choice.get("delta") if "delta" in choice else choice.get("message")
        if delta is not None and not isinstance(delta, dict):
            raise _bad(f"{where} sent a malformed delta: {json.dumps(delta)[:200]}", gen)
        text = choice.get("text") if "text" in choice else (delta or {}).get("content")
        if text is not None and not isinstance(text, str):
            raise _bad(f"{where} sent non-text content: {json.dumps(text)[:200]}", gen)
        try:
            _take_logprobs(choice.get("logprobs"), gen)
        except (TypeError, ValueError):
            raise _bad(f"{where} sent malformed logprobs: {json.dumps(choice.get('logprobs'))[:200]}",
                       gen) from None
        yield text or "", _finish(choice.get("finish_reason"))


def _whole(doc: dict[str, Any], where: str, gen: RemoteGeneration) -> Iterator[tuple[str, FinishReason | None]]:
    """A server that ignored stream: true and sent the whole answer at once."""
    if "error" in doc:
        raise RemoteError(f"{where}: {error_text(doc)}")
    got = list(_chunk(doc, where, gen))
    if not got:
        raise RemoteError(f"{where} sent an answer without choices")
    yield got[0][0], got[0][1] or "stop"


def _take_logprobs(lp: Any, gen: RemoteGeneration) -> None:
    from localgen.types import TokenLogprob

    if not isinstance(lp, dict) or not isinstance(lp.get("content"), list):
        return
    for item in lp["content"]:
        if isinstance(item, dict) and isinstance(item.get("token"), str):
            listed = item.get("top_logprobs")
            alts = [t for t in (listed if isinstance(listed, list) else [])
                    if isinstance(t, dict) and isinstance(t.get("token"), str)]
            top = tuple((t["token"], float(t.get("logprob", 0.0))) for t in alts)
            raws = [_raw(t) for t in alts]  # the server's bytes of a token that is part of a character
            kept = tuple(r for r in raws if r is not None) if None not in raws else ()
            gen.logprobs.append(TokenLogprob(item["token"], -1, float(item.get("logprob", 0.0)), top, _raw(item), kept))


def _raw(item: dict[str, Any]) -> bytes | None:
    """An OpenAI logprob's `bytes` (a list of 0-255), or None where it has none or another thing."""
    got = item.get("bytes")
    if isinstance(got, list) and all(isinstance(b, int) and not isinstance(b, bool) and 0 <= b < 256 for b in got):
        return bytes(got)
    return None


def _finish(reason: Any) -> FinishReason | None:
    if reason is None:
        return None
    return "length" if reason == "length" else "stop"


def _json(text: str, where: str, gen: RemoteGeneration) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except ValueError:
        raise _bad(f"{where} sent something that is not JSON: {text[:120]!r}", gen) from None
    if not isinstance(doc, dict):
        raise _bad(f"{where} sent JSON that is not an object: {text[:120]!r}", gen)
    return doc


def _bad(message: str, gen: RemoteGeneration) -> RemoteError:
    """A malformed part of the answer: the error says, when text had arrived before it, that the answer is
    partial (run keeps that part on stdout and in --json)."""
    if gen.n:
        return RemoteError(f"{message} (after {pieces(gen.n)}; the answer is partial)", partial=True)
    return RemoteError(message)


def _lines(chunks: Iterator[bytes], where: str, gen: RemoteGeneration) -> Iterator[str]:
    """A stream's lines (ended by CRLF, LF or CR, as the SSE spec says), each held only up to MAX_LINE bytes: a
    longer one is an error naming the endpoint, not unbounded memory."""
    buf = bytearray()
    scanned = 0  # buf[:scanned] holds no line end
    for piece in chunks:
        buf += piece
        at = 0
        while (m := _EOL.search(buf, max(at, scanned))) is not None:
            if m.group() == b"\r" and m.end() == len(buf):  # perhaps the first half of \r\n: wait for more
                break
            yield buf[at:m.start()].decode("utf-8", "replace")
            at = m.end()
        del buf[:at]
        scanned = len(buf) - (1 if buf.endswith(b"\r") else 0)
        if len(buf) > MAX_LINE:
            raise _too_long(where, gen)
    if buf:
        yield buf.rstrip(b"\r").decode("utf-8", "replace")


def _too_long(where: str, gen: RemoteGeneration) -> RemoteError:
    return RemoteError(f"{where} sent a stream line over {MAX_LINE // 2**20} MiB (localgen reads lines up to that)"
                       + (f" after {pieces(gen.n)}; the answer is partial" if gen.n else ""),
                       down=True, partial=gen.n > 0)


def bounded(r: Any, what: str, within: float | None = None) -> bytes:
    """A whole body, up to MAX_LINE bytes and, given `within`, all of it within that many seconds (a read timeout
    bounds each wait, not a body that drips): past either, a RemoteError naming `what`, read no further."""
    import time

    deadline = None if within is None else time.monotonic() + within
    body = bytearray()
    for piece in r.iter_bytes():
        body += piece
        if len(body) > MAX_LINE:
            r.close()
            raise RemoteError(f"{what} is over {MAX_LINE // 2**20} MiB (localgen reads up to that)", down=True)
        if deadline is not None and time.monotonic() > deadline:
            r.close()
            raise RemoteError(f"{what} did not arrive within {within:g} s", down=True)
    return bytes(body)


def said(e: Exception) -> str:
    """What went wrong with a connection, in words (no Python class names)."""
    import httpx

    if isinstance(e, httpx.TimeoutException):
        return "nothing arrived in time"
    text = str(e).strip()
    return text[:1].lower() + text[1:] if text else "the connection broke"


def pieces(n: int) -> str:
    """`n pieces`, for an answer's errors."""
    return f"{n} piece{'' if n == 1 else 's'}"
