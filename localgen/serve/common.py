"""What both APIs share: the HTTP error, the server's state, request parsing (through the same settings
validation as flags and JSONL lines), sampling from request fields, and running a job on a worker while
its text comes back as it is decided. No generation logic here."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from localgen import settings
from localgen.errors import LocalgenError, UsageError
from localgen.serve.worker import Job, ModelWorker, QueueFull
from localgen.types import GenerationRequest, SamplingParams


class HTTPError(Exception):
    """An error with the status it answers with."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param


@dataclass
class ServeState:
    """What the routes share: the workers by model name, the API key, the defaults from the flags."""

    workers: dict[str, ModelWorker]
    api_key: str | None = None
    flag_sampling: dict[str, Any] = field(default_factory=dict)  # the sampling flags `serve` was given
    started: float = field(default_factory=time.time)

    def worker(self, name: Any) -> ModelWorker:
        """The worker for a request's `model` (the only one when a single model is served and none is named)."""
        if (name is None or name == "") and len(self.workers) == 1:
            return next(iter(self.workers.values()))
        if not isinstance(name, str) or name not in self.workers:
            raise HTTPError(404, f"model {name!r} is not served here (served: {', '.join(self.workers)})",
                            "not_found_error", "model")
        return self.workers[name]


async def read_json(request: Request) -> dict[str, Any]:
    """The body as a JSON object, or a 400."""
    try:
        body = json.loads(await request.body() or b"{}")
    except (ValueError, UnicodeDecodeError) as e:
        raise HTTPError(400, f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise HTTPError(400, "the request body must be a JSON object")
    return body


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


def schema_grammar(schema: Any) -> str:
    """A JSON schema (an object, or "json" for any JSON object) as a grammar."""
    from localgen.engine.grammar import grammar_from_json_schema

    text = json.dumps({"type": "object"} if schema in ("json", None, True) else schema)
    try:
        return grammar_from_json_schema(text)
    except LocalgenError as e:
        raise HTTPError(400, e.message, param="response_format") from None


def messages(raw: Any) -> tuple[dict[str, str], ...]:
    """Chat messages with string content (OpenAI's text parts are joined); anything else is a 400."""
    if not isinstance(raw, list) or not raw:
        raise HTTPError(400, "`messages` must be a non-empty list", param="messages")
    out = []
    for m in raw:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "developer"):
            raise HTTPError(400, "each message needs a role: system, user or assistant", param="messages")
        content = m.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise HTTPError(400, "only text content is supported", param="messages")
            content = "".join(str(p.get("text", "")) for p in content)
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise HTTPError(400, "message content must be a string or text parts", param="messages")
        role = "system" if m["role"] == "developer" else m["role"]
        out.append({"role": role, "content": content})
    return tuple(out)


async def run_job(state: ServeState, worker: ModelWorker, request: GenerationRequest,
                  keep_alive: float | None = None) -> tuple[Job, tuple[Any, ...]]:
    """Queue a job and wait for its first event (text, done or error): errors surface as HTTPError here,
    before any response starts."""
    import asyncio

    job = Job(request, asyncio.get_running_loop(), keep_alive=keep_alive)
    try:
        worker.submit(job)
    except QueueFull as e:
        raise HTTPError(503, e.message, "server_error") from None
    first = await job.events.get()
    if first[0] == "error":
        raise HTTPError(first[1], first[2], "invalid_request_error" if first[1] < 500 else "server_error")
    return job, first


async def events(job: Job, first: tuple[Any, ...]) -> AsyncIterator[tuple[Any, ...]]:
    """The job's events from the first on; cancels the job if the client goes away mid-stream."""
    event = first
    try:
        while True:
            yield event
            if event[0] != "text":
                return
            event = await job.events.get()
    finally:
        job.cancelled.set()  # a no-op once done; stops generation at once when the client left


async def collect(job: Job, first: tuple[Any, ...]) -> tuple[str, Any]:
    """A non-streamed answer: the whole text and the final Completion."""
    text = ""
    final = None
    async for event in events(job, first):
        if event[0] == "text":
            text += event[1]
        else:
            final = event[1]
    assert final is not None
    return text, final


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
