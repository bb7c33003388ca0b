"""A Batch API batch's input file (serve/batches.py), its lines all checked before any runs (validate): each a JSON
object with `custom_id` (unique), `method` POST, `url` the batch's endpoint and a `body` object that does not stream
and names the same `model` as the others (OpenAI's rule), at most MAX_LINES; a file that is not so makes the batch
`failed`, with OpenAI's `errors.data` (code, line, message, param). The runner (serve/batchrun.py) reads the same
lines again as it goes (read_lines, parse)."""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localgen.serve.jsonbody import NotFinite, decode

MAX_LINES = 50_000  # OpenAI's bound on the requests of one batch
MAX_ERRORS = 100  # the input's faults a failed batch lists (errors.data), the first ones
MAX_LINE = 16 << 20  # a line's bound in bytes: the server's --max-body (serve/guard.py's Policy), set by the app


@dataclass(frozen=True)
class Line:
    """A request of a batch's input: its line number (from 1), custom_id, url and body."""

    number: int
    custom_id: str
    url: str
    body: dict[str, Any]


def read_lines(path: Path, bound: int) -> Generator[tuple[int, bytes | None], None, None]:
    """The input's lines that are not blank, with their numbers (from 1), read one at a time; a line over `bound`
    bytes (the server's --max-body: no request may be larger) is None, skipped without being held whole."""
    with open(path, "rb") as f:
        for number in itertools.count(1):
            raw = f.readline(bound + 1)
            if not raw:
                return
            if len(raw) > bound and not raw.endswith(b"\n"):
                while (rest := f.readline(1 << 20)) and not rest.endswith(b"\n"):
                    pass
                yield number, None
            elif raw.strip():
                yield number, raw


def parse(number: int, raw: bytes | None, endpoint: str) -> Line | dict[str, Any]:
    """One input line as a Line, or its fault as an entry of OpenAI's errors.data (None: a line over the bound)."""
    def fault(code: str, message: str, param: str | None = None) -> dict[str, Any]:
        return {"code": code, "line": number, "message": message, "param": param}

    if raw is None:
        return fault("invalid_request", "This line is longer than a request's body may be (serve --max-body).",
                     "body")
    try:
        doc = decode(raw)
    except NotFinite as e:  # as a request's body with one is a 400 (serve/jsonbody.py)
        return fault("invalid_json_line", f"This line's {e.where or 'value'} is {e.literal}, not a finite number: "
                     "JSON has no NaN or Infinity, and a number must be within a double's range.", e.where or None)
    except (ValueError, RecursionError):  # bad JSON or UTF-8, a number too long, nesting too deep
        return fault("invalid_json_line", "This line is not parseable as valid JSON.")
    if not isinstance(doc, dict):
        return fault("invalid_json_line", "This line is not a JSON object.")
    for name in ("custom_id", "method", "url", "body"):
        if name not in doc:
            return fault("missing_required_parameter", f"Missing required parameter: '{name}'.", name)
    custom_id, method, url, body = doc["custom_id"], doc["method"], doc["url"], doc["body"]
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > 512:
        return fault("invalid_request", "custom_id must be a string of 1 to 512 characters.", "custom_id")
    if method != "POST":
        return fault("invalid_request", f"method must be POST (got {str(method)[:20]!r}).", "method")
    if url != endpoint:
        return fault("url_mismatch", f"The url {str(url)[:100]!r} does not match the batch's endpoint "
                                     f"{endpoint!r}.", "url")
    if not isinstance(body, dict):
        return fault("invalid_request", "body must be a JSON object.", "body")
    if body.get("stream") not in (None, False):
        return fault("invalid_request", "A batch request cannot stream: leave stream out or false.", "body.stream")
    return Line(number, custom_id, url, body)


NO_MODEL = object()  # the batch's model before its first request is read


def validate(path: Path, endpoint: str, bound: int = MAX_LINE) -> tuple[int, str | None, list[dict[str, Any]]]:
    """The input's requests counted and checked before any runs: their number, their model (OpenAI's rule: every
    request of a batch names the same one, or here every one none, for the server's default), and the faults
    found (the first MAX_ERRORS; more lines than MAX_LINES is one fault, and reading stops there)."""
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    total, model = 0, NO_MODEL
    for number, raw in read_lines(path, bound):
        total += 1
        if total > MAX_LINES:
            errors.append({"code": "too_many_tasks", "line": number, "message": f"The batch has more than "
                           f"{MAX_LINES:,} requests: split it into several.", "param": None})
            break
        found = parse(number, raw, endpoint)
        if isinstance(found, dict):
            errors.append(found)
            with contextlib.suppress(ValueError, RecursionError, KeyError, TypeError):
                seen.add(json.loads(raw or b"")["custom_id"])  # a later line may not take it either
        elif found.custom_id in seen:
            errors.append({"code": "duplicate_custom_id", "line": number, "message": "The custom_id "
                           f"{found.custom_id[:100]!r} is used by an earlier line.", "param": "custom_id"})
        else:
            seen.add(found.custom_id)
            named = found.body.get("model")
            if model is NO_MODEL:
                model = named
            elif named != model:
                errors.append({"code": "mismatched_model", "line": number, "message": f"The provided model "
                               f"{_model_text(named)} does not match the model for the rest of the batch "
                               f"({_model_text(model)}): all requests in a batch must use the same model.",
                               "param": "body.model"})
    if total == 0:
        errors.append({"code": "empty_file", "line": None, "message": "The input file has no requests.",
                       "param": None})
    return min(total, MAX_LINES), model if isinstance(model, str) else None, errors[:MAX_ERRORS]


def _model_text(model: Any) -> str:
    """A request's `model` as an error names it: quoted, cut short, or "none" when it names none."""
    return "none (the server's default)" if model is None else repr(str(model)[:100])


def input_gone(doc: dict[str, Any]) -> dict[str, Any]:
    """The fault of a batch whose input file is no longer there, as an entry of errors.data."""
    return {"code": "file_not_found", "line": None, "param": "input_file_id",
            "message": f"The input file {doc['input_file_id']} was deleted before the batch's requests had all run."}
