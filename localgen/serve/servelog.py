"""serve's log on stderr: one line per request (the access line) and one per model load, unload and eviction,
as plain text or, with `serve --log-format json`, as one JSON object per line: then every line serve writes
is one (its start, warnings, internal errors with their traceback, uvicorn's own lines), each with the same
members first (time, event, request_id, route, model, status: null where they do not apply). Each request
has an id (the client's X-Request-Id when it sends a usable one, else a fresh one) that its access line, its
error body and its X-Request-Id response header carry (serve/app.py's FrontDoor sets it, and apierror.py's
ERROR_EXTRA for the error bodies); `TRACE` holds the request's record for the code that fills it (a Job
takes it when made, its worker keeps the generation's token counts on the Job as it goes: Tally), and `LOG`
the server's log for what a request's own code must say there after its answer began (a stream cannot carry
an exception to app.py)."""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import json
import logging
import re
import secrets
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localgen.serve.arrivals import Arrival

MAX_ID = 128  # characters kept of a client's X-Request-Id
BATCH_CLIENT = "batch_"  # a batch's requests come from a client named by the batch's id (serve/batchrun.py)
MAX_MODEL_NAME = 200  # characters kept of a model's name as a request gives it
MAX_ONCE = 100  # warnings said once (ServeLog.once) in a server's life: far more than any client's tool types
_UNSAFE = re.compile(r"[^A-Za-z0-9._:/+=@~-]")  # what an id may hold: no spaces, quotes, control characters


def request_id(given: bytes | None) -> str:
    """The request's id: the client's X-Request-Id, its unsafe characters dropped and cut to MAX_ID, or a
    fresh one when none is left."""
    if given:
        text = _UNSAFE.sub("", given.decode("latin-1"))[:MAX_ID]
        if text:
            return text
    return "req_" + secrets.token_hex(12)


@dataclass(frozen=True)
class Tally:
    """One generation's tokens as its access line counts them: its worker replaces it at each decoding step
    and, once the generation has finished, with the finished counts; so a request ended from the event loop
    (the server's stop, a client gone past SETTLE_S) is logged with what was made for it, waiting on nothing."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_s: float | None


@dataclass
class Trace:
    """One request, as its access line reports it: its id and client, then what its handler and worker learn
    (the model, and its generation jobs, each with its Tally: their sums are the request's tokens, the first
    that made a token gives the time to first token)."""

    id: str
    client: str
    model: str | None = None
    jobs: list[Any] = field(default_factory=list)  # its generation jobs (a client that left waits for their counts)
    failed: int | None = None  # the status of an error that ended its stream after the stream began
    error: Any = None  # that error (an HTTPError): an HTTP/1.0 client, sent the stream whole, gets it instead
    upstream: str | None = None  # the endpoint a remote model's request was sent on to (serve/upstream.py)
    usage: Tally | None = None  # that request's tokens, from the usage its answer ended with
    arrival: Arrival | None = None  # its place among the requests being read (serve/arrivals.py): a POST's

    @property
    def batch(self) -> bool:
        """Whether a batch sent it (serve/batchrun.py: its client is the batch's id), not a client."""
        return self.client.startswith(BATCH_CLIENT)

    def fail(self, error: Any) -> None:
        """An error event ended its stream (an HTTPError): its access line says its status, not the 200 it began
        with."""
        self.failed, self.error = error.status, error

    def arrived(self) -> None:
        """The request is no longer being read: handed to a model, or answering (serve/arrivals.py)."""
        if self.arrival is not None:
            self.arrival.done()

    def counted(self) -> Tally | None:
        """The request's tokens now: its jobs' tallies (each read once: the worker may replace it meanwhile)
        summed, None when no job counted any."""
        tallies = [t for job in self.jobs if (t := job.tally) is not None]
        if not tallies:
            return self.usage
        return Tally(sum(t.prompt_tokens for t in tallies), sum(t.cached_tokens for t in tallies),
                     sum(t.completion_tokens for t in tallies),
                     next((t.ttft_s for t in tallies if t.completion_tokens), None))


TRACE: contextvars.ContextVar[Trace | None] = contextvars.ContextVar("localgen_trace", default=None)


def named(model: object) -> None:
    """The model a request names (or the one it was given), for its access line: a request refused before any
    generation (a 404, an unload, a delete) still says which model it was about."""
    trace = TRACE.get()
    if trace is not None and isinstance(model, str) and model:
        trace.model = model[:MAX_MODEL_NAME]


def current_id() -> str | None:
    """The id of the request being handled (None outside one)."""
    trace = TRACE.get()
    return trace.id if trace is not None else None


def _stderr(line: str) -> None:
    """A plain line-buffered write: cheap per request, and a closed stderr never fails one."""
    with contextlib.suppress(BrokenPipeError, ValueError, OSError):
        sys.stderr.write(line + "\n")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class ServeLog:
    """Where serve's lines go and in which format (`json`), and whether requests get an access line."""

    def __init__(self, json_lines: bool = False, access: bool = True,
                 write: Callable[[str], None] = _stderr) -> None:
        self.json = json_lines
        self.access_on = access
        self.write = write
        self._said: set[str] = set()  # the keys of warnings said once (once())

    def access(self, method: str, path: str, route: str, status: int, seconds: float, trace: Trace,
               counts: dict[str, int]) -> None:
        """A request has ended (status 0: no response began). `counts`: token counts read from the response
        body, for requests no worker counted (embeddings). The text line ends with `id=` and the request's id
        (its characters are request_id's: no blank can end it early)."""
        if not self.access_on:
            return
        tally = trace.counted()
        prompt = tally.prompt_tokens if tally is not None else counts.get("prompt")
        made = tally.completion_tokens if tally is not None else counts.get("completion")
        ttft = tally.ttft_s if tally is not None else None
        if self.json:
            self.write(json_line("request", request_id=trace.id, route=route, model=trace.model,
                                 status=status or None, method=method, path=path, prompt_tokens=prompt,
                                 cached_tokens=tally.cached_tokens if tally is not None else None,
                                 completion_tokens=made, ttft_ms=None if ttft is None else round(ttft * 1000, 1),
                                 total_ms=round(seconds * 1000, 1), client=trace.client,
                                 **({"upstream": trace.upstream} if trace.upstream else {})))
            return
        shown = path if path.isprintable() else repr(path)  # %0A in a path: no forged lines
        via = f" via {_UNSAFE.sub('_', trace.upstream)}" if trace.upstream else ""  # a remote model's endpoint
        self.write(f"{method} {shown} {status or '-'}{_tokens(prompt, made)} {seconds * 1000:.0f} ms{via} "
                   f"id={trace.id}")

    def event(self, kind: str, model: str | None, text: str, **fields: Any) -> None:
        """A model's load, unload, eviction or wait for room, the server's start: `text` is the plain line,
        `fields` the JSON object's other members."""
        if self.json:
            self.write(json_line(kind, model=model, message=text, **fields))
        else:
            self.write(f"localgen serve: {text}")

    def line(self, text: str) -> None:
        """A plain informational line (JSON: an "info" event)."""
        self.write(json_line("info", message=text) if self.json else text)

    def warning(self, text: str) -> None:
        """A warning, always shown."""
        self.write(json_line("warning", message=text) if self.json else f"warning: {text}")

    def once(self, key: str, text: str) -> None:
        """A warning said once in the server's life, for `key`: what every request of a client would repeat
        (an agent that sends a hosted tool with every turn). Past MAX_ONCE keys, which clients choose (a tool's
        type), no more are said: the log and the memory that remembers them stay bounded."""
        if key not in self._said and len(self._said) < MAX_ONCE:
            self._said.add(key)
            self.warning(text)

    def error(self, text: str, detail: str = "", model: str | None = None) -> None:
        """An internal error: `text`, then `detail` (a traceback) on the lines below it, or in JSON one
        member."""
        if self.json:
            self.write(json_line("error", model=model, message=text, traceback=detail or None))
        else:
            self.write(text + (f"\n{detail}" if detail else ""))

    def fatal(self, text: str, hint: str | None, exit_code: int) -> None:
        """The error that stops serve, as JSON's "error" event with its hint and exit status (in text, the CLI
        prints it as it prints every command's)."""
        self.write(fatal_line(text, hint, exit_code))


def fatal_line(text: str, hint: str | None, exit_code: int = 1) -> str:
    """ServeLog.fatal's JSON line (also llama.cpp's abort, written from native/lib.py's handler)."""
    return json_line("error", message=text, hint=hint, exit_code=exit_code)


def json_line(event: str, request_id: str | None = None, route: str | None = None, model: str | None = None,
              status: int | None = None, **fields: Any) -> str:
    """One log line as JSON: the members every line has, then the event's own."""
    return json.dumps({"time": _now(), "event": event, "request_id": request_id, "route": route, "model": model,
                       "status": status, **fields}, ensure_ascii=False)


class JsonFormatter(logging.Formatter):
    """uvicorn's log records (its errors, a request's unexpected exception with its traceback) as serve's JSON
    lines (uvicorn_log_config)."""

    def format(self, record: logging.LogRecord) -> str:
        detail = self.formatException(record.exc_info) if record.exc_info else None
        return json_line("server", level=record.levelname.lower(), message=record.getMessage(), traceback=detail)


def uvicorn_log_config(json_lines: bool) -> dict[str, Any] | None:
    """uvicorn's logging configuration for --log-format json (None: uvicorn's own, for text)."""
    if not json_lines:
        return None
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}
    return {"version": 1, "disable_existing_loggers": False,
            "formatters": {"json": {"()": "localgen.serve.servelog.JsonFormatter"}},
            "handlers": {"default": handler},
            "loggers": {"uvicorn": {"handlers": ["default"], "level": "INFO", "propagate": False},
                        "uvicorn.error": {"level": "INFO"},
                        "uvicorn.access": {"handlers": ["default"], "level": "INFO", "propagate": False}}}


def _tokens(prompt: int | None, made: int | None) -> str:
    if prompt is not None and made is not None:
        return f" {prompt}+{made} tokens"
    if prompt is not None or made is not None:
        return f" {prompt if prompt is not None else made} tokens"
    return ""


# what an app or a worker made without one logs: its events and errors as text on stderr, no access lines
STDERR_LOG = ServeLog(access=False)
# the log of the server handling the request (FrontDoor sets it)
LOG: contextvars.ContextVar[ServeLog] = contextvars.ContextVar("localgen_log", default=STDERR_LOG)
