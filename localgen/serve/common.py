"""What both APIs share: the HTTP error, the server's state, request parsing (through the same settings
validation as flags and JSONL lines), sampling from request fields, and running a job on a worker while
its text comes back as it is decided. No generation logic here."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from localgen import settings
from localgen.backend import Completion
from localgen.errors import LocalgenError, UsageError
from localgen.serve.jobs import Done, EmbedJob, Event, Failed, Job, Text
from localgen.serve.servelog import with_request_id
from localgen.serve.worker import ModelWorker
from localgen.types import GenerationRequest, ModelRef, SamplingParams


class HTTPError(Exception):
    """An error with the status it answers with."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param


def http_error(f: Failed) -> HTTPError:
    """A worker's Failed as the HTTPError it answers with (a client error below 500, else the server's)."""
    return HTTPError(f.status, f.message, "invalid_request_error" if f.status < 500 else "server_error", f.param)


# error kinds by status, as Anthropic names them
ANTHROPIC_ERRORS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 499: "invalid_request_error",
               503: "overloaded_error"}


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error object."""
    return {"type": "error", "error": {"type": ANTHROPIC_ERRORS.get(status, "api_error"), "message": message}}


def error_response(request: Request, e: HTTPError) -> Response:
    """OpenAI's error object under /v1, Anthropic's under /v1/messages, Ollama's {"error": "..."} under /api."""
    from starlette.responses import JSONResponse

    if request.url.path.startswith("/api/"):
        return JSONResponse(with_request_id({"error": e.message}), status_code=e.status)
    if request.url.path.startswith("/v1/messages"):
        return JSONResponse(with_request_id(anthropic_error(e.status, e.message)), status_code=e.status)
    return JSONResponse(with_request_id({"error": {"message": e.message, "type": e.kind, "param": e.param,
                                                   "code": e.status}}), status_code=e.status)


@dataclass
class ServeState:
    """What the routes share: the workers by model name, the API key, the defaults from the flags."""

    workers: dict[str, ModelWorker]
    api_key: str | None = None
    flag_sampling: dict[str, Any] = field(default_factory=dict)  # the sampling flags `serve` was given
    allow_image_urls: bool = False  # fetch http(s) image URLs (else only data: URIs: no server-side requests)
    started: float = field(default_factory=time.time)
    default: str | None = None  # the model of a request that names none (serve's one -m model, or the default)
    on_demand: Any = None  # serve/ondemand.py: installed models beside the workers, made when asked for
    residency: Any = None  # serve/residency.py: which models stay loaded
    on_completion: Any = None  # serve/metrics.py's: each finished generation, given to every worker asked for
    offline: bool = False  # serve --offline: /api/pull is refused
    store: Any = None  # engine/prefixstore.py: the prompt cache on disk (None: --cache-disk 0)
    pulls: set[Any] = field(default_factory=set)  # serve/manage.py's pulls under way (stopped at shutdown)

    def worker(self, name: Any) -> ModelWorker:
        """The worker for a request's `model`: one served, or an installed model (its worker made now); the
        default model when none is named."""
        w = self._worker(name)
        w.on_completion = self.on_completion  # every request passes here: pinned and on-demand workers alike
        return w

    def _worker(self, name: Any) -> ModelWorker:
        if name is None or name == "":
            name = self.default
            if name is None and len(self.workers) == 1:
                name = next(iter(self.workers))
        if isinstance(name, str) and name in self.workers:
            return self.workers[name]
        if isinstance(name, str) and self.on_demand is not None:
            w = self.on_demand.worker(name, self.workers)
            if w is not None:
                self.workers.setdefault(w.name, w)
                return self.workers[w.name]
        offered = ", ".join(self.names()[:20])
        raise HTTPError(404, f"model {name!r} is not served here (served: {offered})", "not_found_error", "model")

    def names(self) -> list[str]:
        """Every model a request may name: those served now, then (on demand) the others on disk."""
        served = list(self.workers)
        return self.on_demand.names(served) if self.on_demand is not None else served

    def offered(self) -> list[tuple[str, ModelRef, ModelWorker | None]]:
        """What the listings show: each worker's model, then each model on disk without one yet."""
        out: list[tuple[str, ModelRef, ModelWorker | None]] = [(n, w.ref, w) for n, w in self.workers.items()]
        if self.on_demand is not None:
            out += [(n, ref, None) for n, ref in self.on_demand.refs(self.workers)]
        return out

    def window(self, ref: ModelRef, worker: ModelWorker | None) -> int:
        """A slot's window: the loaded model's, else the context it will load with."""
        if worker is not None:
            return int(worker.n_ctx)
        n_ctx = int(self.on_demand.load.n_ctx) if self.on_demand is not None else 0
        if ref.context is not None and not (self.on_demand is not None and self.on_demand.ctx_given):
            n_ctx = ref.context  # a preset's num_ctx
        return min(n_ctx, ref.summary.context_length) if ref.summary.context_length else n_ctx


# A JSON body nested deeper than this is refused before anything walks it (json.loads itself recurses).
MAX_DEPTH = 64


async def read_json(request: Request) -> dict[str, Any]:
    """The body as a JSON object of valid Unicode, or a 400 (the size and content type were checked by
    serve/guard.py before the route ran)."""
    try:
        body = json.loads(await request.body() or b"{}")
    except RecursionError:
        raise HTTPError(400, f"the request body is nested too deeply (at most {MAX_DEPTH} levels)") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise HTTPError(400, f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise HTTPError(400, "the request body must be a JSON object")
    if _depth(body) > MAX_DEPTH:
        raise HTTPError(400, f"the request body is nested too deeply (at most {MAX_DEPTH} levels)")
    try:  # JSON's \ud800 escapes decode to lone surrogates, which no tokenizer can take
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        raise HTTPError(400, "the request body holds invalid Unicode (a lone surrogate, "
                             f"\\u{ord(e.object[e.start]):04x}): send UTF-8 text") from None
    return body


def _depth(doc: Any) -> int:
    """How deeply a decoded JSON document nests (iteratively: no recursion to exhaust)."""
    deepest, todo = 0, [(doc, 1)]
    while todo:
        node, d = todo.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, d)
            if d <= MAX_DEPTH:
                todo.extend((child, d + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


# An effort level as a reasoning budget in tokens: the lower levels bound the thinking, the higher leave it
# unbounded (none and minimal turn it off, through the template's switch)
EFFORT_BUDGETS = {"low": 1024, "medium": 4096}


def effort_budget(values: dict[str, Any], effort: Any) -> None:
    """The reasoning budget an effort level sets (engine/budget.py), unless the request set one itself."""
    if isinstance(effort, str) and effort in EFFORT_BUDGETS:
        values.setdefault("reasoning_budget", EFFORT_BUDGETS[effort])


def sampling(state: ServeState, worker: ModelWorker, values: dict[str, Any],
             grammar: str | None = None) -> SamplingParams:
    """The request's settings over the flags `serve` was given over the model's recommended ones, all
    through the one validation (settings.py)."""
    try:
        base = settings.apply(SamplingParams(), worker.ref.sampling_defaults)
        base = settings.apply(base, state.flag_sampling)
        chosen = settings.apply(base, {k: v for k, v in values.items() if v is not None})
    except UsageError as e:
        raise HTTPError(400, e.message) from None
    return dataclasses.replace(chosen, grammar=grammar)


# A JSON schema's text, and the grammar made from it, are bounded: the converter expands repetition counts
# (minLength: 100000 gave 500 KB of grammar), and the worker parses the grammar between decoding steps.
MAX_SCHEMA_CHARS = 64 * 1024
MAX_GRAMMAR_CHARS = 128 * 1024
MAX_REPEAT = 4096  # minLength/maxLength/minItems/maxItems/minProperties/maxProperties


async def schema_grammar(schema: Any, param: str = "response_format") -> str:
    """A JSON schema (an object, or "json" for any JSON object) as a grammar, built off the event loop and
    bounded in size; a 400 for a schema that cannot be one."""
    import asyncio

    from localgen.engine.grammar import grammar_from_json_schema

    if schema not in ("json", None, True) and not isinstance(schema, dict):
        raise HTTPError(400, "the schema must be a JSON object", param=param)
    text = bounded_schema({"type": "object"} if schema in ("json", None, True) else schema, param,
                          "the JSON schema")
    try:
        grammar = await asyncio.to_thread(grammar_from_json_schema, text)
    except RecursionError:
        raise HTTPError(400, "the JSON schema nests or refers to itself too deeply", param=param) from None
    except LocalgenError as e:
        raise HTTPError(400, e.message, param=param) from None
    check_grammar_size(grammar, param, "the JSON schema")
    return grammar


def bounded_schema(schema: Any, param: str, what: str) -> str:
    """A schema (or tools) as JSON text, or a 400 when it is too long or repeats too much for a grammar."""
    text = json.dumps(schema)
    if len(text) > MAX_SCHEMA_CHARS:
        raise HTTPError(400, f"{what} is {len(text):,} characters; at most {MAX_SCHEMA_CHARS:,}", param=param)
    big = _big_repeat(schema)
    if big:
        raise HTTPError(400, f"{what}'s {big[0]} is {big[1]:,}; at most {MAX_REPEAT:,} here", param=param)
    return text


def check_grammar_size(grammar: str, param: str, what: str) -> None:
    """A 400 for a grammar too large for the worker to parse between decoding steps."""
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise HTTPError(400, f"{what} makes a grammar of {len(grammar):,} characters; at most "
                             f"{MAX_GRAMMAR_CHARS:,}", param=param)


def _big_repeat(schema: Any) -> tuple[str, int] | None:
    """The first repetition bound in a schema over MAX_REPEAT, as (keyword, value)."""
    keys = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties", "minContains",
            "maxContains")
    todo = [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            for k in keys:
                v = node.get(k)
                if isinstance(v, (int, float)) and not isinstance(v, bool) and v > MAX_REPEAT:
                    return k, int(v)
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return None


def exact_field(where: dict[str, Any], name: str) -> bool:
    """localgen's request extension `exact` (OpenAI: top level; Ollama: options.exact): true asks for the
    answer this prompt gives alone, even where the server batches for throughput."""
    value = where.get("exact", False)
    if not isinstance(value, bool):
        raise HTTPError(400, f"`{name}` must be true or false", param=name)
    return value


CHARS_PER_TOKEN = 32


def check_prompt_size(worker: ModelWorker, texts: list[str]) -> None:
    """A 413 for text that cannot fit a slot's window whatever the tokenizer does, before tokenizing it
    (no vocabulary here averages anywhere near CHARS_PER_TOKEN characters a token)."""
    from localgen.media import text_of

    chars = sum(len(text_of(t)) for t in texts)
    most = CHARS_PER_TOKEN * worker.n_ctx
    if chars > most:
        raise HTTPError(413, f"the prompt is {chars:,} characters; a slot's window of {worker.n_ctx:,} tokens "
                             f"takes at most {most:,} here", param="prompt")


async def run_job(worker: ModelWorker, request: GenerationRequest,
                  keep_alive: float | None = None) -> tuple[Job, Event]:
    """Queue a streamed job and wait for its first event (text, done or error): errors surface as HTTPError
    here, before any response starts."""
    job = _submit(worker, Job(request, asyncio.get_running_loop(), keep_alive=keep_alive))
    try:
        first = await job.events.get()
    except BaseException:  # the handler was cancelled (the client left while queued)
        job.cancelled.set()
        raise
    if isinstance(first, Failed):
        raise http_error(first)
    return job, first


async def run_whole(worker: ModelWorker, request: GenerationRequest, http: Request,
                    keep_alive: float | None = None, watch: Any = None) -> tuple[Job, Completion]:
    """A non-streamed answer: the job and its final Completion (whose text is the whole answer). The job
    sends no Text events, so no decoding step wakes the event loop for it; a client that disconnects while
    it waits (queued or generating) cancels the job; an error is an HTTPError. With `watch` (an answer
    stage of its own, for a request with tools), the text is read as it comes, and the job ends as soon as
    the model repeats a tool call it already made (what a small model does until max_tokens)."""
    job = _submit(worker, Job(request, asyncio.get_running_loop(), keep_alive=keep_alive, stream=watch is not None))
    watcher = asyncio.ensure_future(watch_disconnect(http, job))
    try:
        event = await job.events.get()
        while isinstance(event, Text):
            watch_repeats(job, watch, event.text)
            event = await job.events.get()
    finally:
        watcher.cancel()
        job.cancelled.set()  # a no-op once done; stops generation at once when the handler was cancelled
    if isinstance(event, Done):
        return job, event.completion
    if isinstance(event, Failed):
        raise http_error(event)
    raise AssertionError("a job that does not stream sends only its Done or Failed")


def watch_repeats(job: Job, answer: Any, text: str | None = None) -> list[Any]:
    """Feed the answer stage (if any) and end the job, as finished, once the model repeats a tool call it
    already made; the stage's events."""
    if answer is None:
        return []
    pieces = answer.feed(text) if text is not None else []
    if answer.repeats:
        job.finish.set()
    return list(pieces)


def _submit(worker: ModelWorker, job: Job) -> Job:
    job.request = with_preset(worker.ref, job.request)
    try:
        worker.submit(job)
    except LocalgenError as e:  # a full queue, or a worker that has stopped
        raise HTTPError(503, e.message, "server_error") from None
    return job


def with_preset(ref: ModelRef, request: GenerationRequest) -> GenerationRequest:
    """A chat request to a preset (models/presets.py): its SYSTEM where the request gives none, then its
    MESSAGE turns before the conversation, as `run` and `chat` place them (cli/presetflow.py)."""
    if not request.messages or (ref.system is None and not ref.messages):
        return request
    msgs = list(request.messages)
    head = [msgs.pop(0)] if msgs[0].get("role") == "system" else (
        [{"role": "system", "content": ref.system}] if ref.system else [])
    return dataclasses.replace(request, messages=(*head, *(dict(m) for m in ref.messages), *msgs))


async def events(job: Job, first: Event) -> AsyncIterator[Event]:
    """The job's events from the first on, ending with its Done or Failed; cancels the job if the client
    goes away mid-stream."""
    event = first
    try:
        while True:
            yield event
            if not isinstance(event, Text):
                return
            event = await job.events.get()
    finally:
        job.cancelled.set()  # a no-op once done; stops generation at once when the client left


async def watch_disconnect(request: Request, job: Job | EmbedJob) -> None:
    """Cancel the job when the client disconnects (the body has been read: the next message is that)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancelled.set()
            return


def timings(c: Any) -> dict[str, Any]:
    """llama-server's `timings` object."""
    prompt_n = max(0, c.prompt_tokens - c.cached_tokens)
    prompt_ms = c.prompt_s * 1000
    predicted_ms = c.decode_s * 1000
    return {
        "cache_n": c.cached_tokens, "prompt_n": prompt_n, "prompt_ms": round(prompt_ms, 3),
        "prompt_per_token_ms": round(prompt_ms / prompt_n, 3) if prompt_n else None,
        "prompt_per_second": round(prompt_n / c.prompt_s, 2) if c.prompt_s > 0 and prompt_n else None,
        "predicted_n": c.completion_tokens, "predicted_ms": round(predicted_ms, 3),
        "predicted_per_token_ms": round(predicted_ms / c.completion_tokens, 3) if c.completion_tokens else None,
        "predicted_per_second": round(c.completion_tokens / c.decode_s, 2) if c.decode_s > 0 else None,
    }
