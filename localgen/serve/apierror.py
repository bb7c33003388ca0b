"""An HTTP error and the shape each API gives it: OpenAI's `{"error": {message, type, param, code}}` (every
route but these two), Anthropic's `{"type": "error", "error": {type, message}}` under /v1/messages, Ollama's
`{"error": "..."}` under /api/. The one place an error body is written: in a whole answer, in a stream, and
for the gate's refusals and unknown routes. Its message never shows the server's own folders (without_paths):
the layers below name files, as the command line should on the user's own machine, but a client is told only
a file's name."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from localgen.serve.jobs import Failed
from localgen.serve.routing import ALIASES


class HTTPError(Exception):
    """An error with the status it answers with, and the request field at fault when one is. `logged`: a line
    for the server's log too (the server's own fault, said there in full: a damaged file and where it is)."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 logged: str | None = None, overflow: tuple[int, int] | None = None, chars: int | None = None,
                 messages: int | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.logged = logged
        self.overflow = overflow  # a prompt past the window: (its tokens, the window), worded as each API does
        self.chars = chars  # one refused by its characters before it was tokenized: how many (its tokens: 0, uncounted)
        self.messages = messages  # one refused by its count of messages before it was rendered (its tokens: 0)


def http_error(f: Failed) -> HTTPError:
    """A worker's Failed as the HTTPError it answers with (a client error below 500, else the server's)."""
    return HTTPError(f.status, f.message, "invalid_request_error" if f.status < 500 else "server_error", f.param,
                     overflow=f.overflow)


# Fields every error body carries besides its API's own (a request's id, say), as (name, value) pairs: set per
# request, read by error_body alone, so a whole answer, a stream's error event and the gate's refusals all carry them.
ERROR_EXTRA: ContextVar[tuple[tuple[str, Any], ...]] = ContextVar("localgen_error_extra", default=())

OPENAI, ANTHROPIC, OLLAMA = "openai", "anthropic", "ollama"

# error kinds by status, as Anthropic names them
ANTHROPIC_KINDS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
                   415: "invalid_request_error", 499: "invalid_request_error", 503: "overloaded_error"}


def api_of(path: str, headers: Mapping[str, str] | None = None) -> str:
    """Whose error shape a route answers in, by its path: Anthropic's, Ollama's, else OpenAI's. The model
    listings are both OpenAI's and Anthropic's: a request carrying anthropic-version (as Anthropic's clients
    send on every call) is answered in Anthropic's shape there."""
    if path.startswith(("/api/", "/v1/api/")):  # (the second: an Ollama client given /v1, for a route it lacks)
        return OLLAMA
    if path.startswith(("/v1/messages", "/v1/v1/messages")):
        return ANTHROPIC
    path = ALIASES.get(path, path)  # llama-server's GET /models is /v1/models: its errors too
    shared = path == "/v1/models" or path.startswith("/v1/models/")
    return ANTHROPIC if shared and headers is not None and "anthropic-version" in headers else OPENAI


def error_body(api: str, e: HTTPError) -> dict[str, Any]:
    """The error's body in an API's shape, with the request's extra fields (ERROR_EXTRA) at its top level."""
    extra = dict(ERROR_EXTRA.get())
    message = without_paths(bounded(e.message))
    if api == OLLAMA:
        return {"error": message, **extra}
    if api == ANTHROPIC:
        kind = ANTHROPIC_KINDS.get(e.status, "api_error")
        if e.overflow is not None:  # Anthropic's own words, which Claude Code reads to compact its context
            message = f"prompt is too long: {e.overflow[0]} tokens > {e.overflow[1]} maximum"
            if e.chars is not None:  # no token count was made: what was counted, its characters, in those words
                from localgen.text import CHARS_PER_TOKEN

                message = (f"prompt is too long: {e.chars} characters > {CHARS_PER_TOKEN * e.overflow[1]} maximum (a "
                           f"window of {e.overflow[1]} tokens holds at most {CHARS_PER_TOKEN} characters a token)")
            if e.messages is not None:
                message = (f"prompt is too long: {e.messages} messages > {e.overflow[1]} maximum (a window of "
                           f"{e.overflow[1]} tokens holds at most one message a token)")
        return {"type": "error", "error": {"type": kind, "message": message}, **extra}
    code: int | str = "context_length_exceeded" if e.overflow is not None else e.status  # OpenAI's, read by Codex
    return {"error": {"message": message, "type": e.kind, "param": e.param, "code": code}, **extra}


# An error's message names what the request sent (a model name, a block's type, an option): a word of it longer
# than LONGEST_WORD is cut, and the whole past LONGEST_MESSAGE, so that megabytes sent are never sent back.
LONGEST_WORD, LONGEST_MESSAGE = 200, 4000


def bounded(text: str) -> str:
    """The message with each run of more than LONGEST_WORD characters without a blank cut to its head and `…`,
    and the whole to LONGEST_MESSAGE."""
    if len(text) <= LONGEST_WORD:
        return text
    text = re.sub(rf"\S{{{LONGEST_WORD + 1},}}", lambda m: m.group(0)[:LONGEST_WORD // 2] + "…", text)
    return text if len(text) <= LONGEST_MESSAGE else text[:LONGEST_MESSAGE] + "…"


def without_paths(text: str) -> str:
    """A message for a client, each path in the server's own folders (localgen's data and cache, Hugging Face's
    cache, the Python environment, the home and temporary folders) cut to the file's name: a client learns
    which file, never where this machine keeps it."""
    if "/" not in text and os.sep not in text:
        return text
    roots = _roots()
    # a root, whole (not the head of a longer name), then the rest of the path up to a blank, quote or bracket
    found = re.compile(rf"(?<![\w.~-])(?:{'|'.join(map(re.escape, roots))})(?=[/\\\s'\"()]|$)"
                       rf"(?:[/\\][^\s'\"()]*)?")

    def name(m: re.Match[str]) -> str:
        path = m.group(0).rstrip("/\\")
        return "the server's folder" if path in roots else re.split(r"[/\\]", path)[-1]

    return found.sub(name, text)


def _roots() -> list[str]:
    """The server's folders, as text, longest first (read now: a server's environment sets some of them)."""
    from localgen import paths
    from localgen.errors import UsageError
    from localgen.models import hfcache

    found = {str(p) for p in (Path(sys.prefix), Path(sys.base_prefix), paths.user_home()) if p is not None}
    found |= _temp_folders()
    for folder in (paths.data_dir, paths.cache_dir, paths.config_dir, hfcache.hub_cache):
        with contextlib.suppress(UsageError):  # one that needs a home folder when there is none: nothing to hide
            found.add(str(folder()))
    found |= {os.path.realpath(p) for p in found}
    return sorted((p for p in found if len(p) > 1), key=len, reverse=True)


def _temp_folders() -> set[str]:
    """The temporary folders this process may use, named without touching the disk: tempfile.gettempdir() writes a
    file to find one, and raises where none can be written (a read-only container, `ulimit -f`), which would
    turn an error's answer into a 500."""
    named = {tempfile.tempdir} if tempfile.tempdir else {os.environ.get(k, "") for k in ("TMPDIR", "TEMP", "TMP")}
    return {os.path.abspath(p) for p in named | {"/tmp", "/var/tmp", "/usr/tmp"} if p}


def error_response(request: Request, e: HTTPError, headers: Mapping[str, str] | None = None,
                   path: str | None = None) -> Response:
    """The error as its route's API answers it (`path`'s, where the request meant another route: a 404's)."""
    return JSONResponse(error_body(api_of(path or request.url.path, request.headers), e), status_code=e.status,
                        headers=headers)
