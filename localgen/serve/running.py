"""A job on a model's thread, from the handler's side: queued (a full queue is a 503), its first event awaited
before any response starts (so an error still gets its status), its events read as they come, and cancelled
when the client leaves, whether queued, generating or reading a stream."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request

from localgen.backend import Completion
from localgen.errors import LocalgenError, ServeError
from localgen.serve.apierror import HTTPError, http_error
from localgen.serve.jobs import Done, EmbedJob, Event, Failed, Job, Text
from localgen.serve.served import Served
from localgen.tools.stream import AnswerStream
from localgen.tools.stream import Event as Said
from localgen.types import GenerationRequest, ModelRef


async def run_job(worker: Served, request: GenerationRequest, http: Request,
                  keep_alive: float | None = None) -> tuple[Job, Event]:
    """Queue a streamed job and wait for its first event (text, done or error): errors surface as HTTPError
    here, before any response starts. A client that disconnects meanwhile (queued, or waiting for its model
    to load) cancels the job."""
    job = submit(worker, Job(request, asyncio.get_running_loop(), keep_alive=keep_alive))
    return job, await first_event(job, http)


async def first_event(job: Job, http: Request) -> Event:
    """The job's first event, the job cancelled if its client leaves meanwhile (queued, or waiting for its model
    to load) or the handler is; a failure as its HTTPError."""
    watcher = asyncio.ensure_future(watch_disconnect(http, job))
    try:
        first = await job.events.get()
    except BaseException:  # the handler was cancelled
        job.cancelled.set()
        raise
    finally:
        watcher.cancel()
    if isinstance(first, Failed):
        raise http_error(first)
    return first


async def await_embed(worker: Served, job: EmbedJob, http: Request | None) -> list[Any] | Failed:
    """Queue an embeddings job and wait for its result (the vectors or scores, or its Failed), the job cancelled
    at its next slice if its client leaves (`http`) or the handler is cancelled; a full queue is an HTTPError."""
    try:
        worker.submit(job)
    except LocalgenError as e:
        raise refused(e) from None
    watcher = asyncio.ensure_future(watch_disconnect(http, job)) if http is not None else None
    try:
        return await job.result
    finally:
        if watcher is not None:
            watcher.cancel()
        job.cancelled.set()  # a no-op once done; stops the job when the handler was cancelled


async def run_whole(worker: Served, request: GenerationRequest, http: Request, keep_alive: float | None = None,
                    watch: AnswerStream | None = None, answers: bool = True) -> tuple[Job, Completion]:
    """A non-streamed answer: the job and its final Completion (whose text is the whole answer). The job
    sends no Text events, so no decoding step wakes the event loop for it; a client that disconnects while
    it waits (queued or generating) cancels the job; an error is an HTTPError. With `watch` (an answer
    stage of its own, for a request with tools), the text is read as it comes, and the job ends as soon as
    the model repeats a tool call it already made (what a small model does until max_tokens). `answers` False:
    work done for the request but not its answer (truncation's probes and summary): its tokens count nowhere."""
    job = submit(worker, Job(request, asyncio.get_running_loop(), keep_alive=keep_alive, stream=watch is not None,
                             answers=answers))
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


def watch_repeats(job: Job, answer: AnswerStream | None, text: str | None = None) -> list[Said]:
    """Feed the answer stage (if any) and end the job, as finished, once the model repeats a tool call it
    already made; the stage's events."""
    if answer is None:
        return []
    pieces = answer.feed(text) if text is not None else []
    if answer.repeats:
        job.finish.set()
    return list(pieces)


def submit(worker: Served, job: Job) -> Job:
    """Queue the job (a preset's system prompt and turns placed first); a 503 when it cannot be."""
    job.request = with_preset(worker.ref, job.request)
    try:
        worker.submit(job)
    except LocalgenError as e:
        raise refused(e) from None
    return job


def refused(e: LocalgenError) -> HTTPError:
    """A job the worker would not queue: a full queue or a worker that has stopped (a 503), a model being deleted
    or replaced (Retired: a 409)."""
    status = e.status if isinstance(e, ServeError) else 503
    return HTTPError(status, e.message, "server_error" if status >= 500 else "invalid_request_error")


def with_preset(ref: ModelRef, request: GenerationRequest) -> GenerationRequest:
    """A chat request to a preset (models/presets.py): its SYSTEM where the request gives none, then its
    MESSAGE turns before the conversation, as `run` and `chat` place them (cli/options/preset.py)."""
    if not request.messages or (ref.system is None and not ref.messages):
        return request
    from localgen.compact import HEADING

    msgs = list(request.messages)
    first = msgs[0]
    summary = isinstance(first.get("content"), str) and first["content"].startswith(HEADING)
    if first.get("role") == "system" and not (summary and ref.system):  # the request's own system message wins
        head = [msgs.pop(0)]
    elif first.get("role") == "system" and ref.system:  # the summary truncation wrote (serve/fitting.py) is the
        # server's, not the request's: the SYSTEM goes first, the summary after it in one message (as where the
        # template shows only one system message)
        head = [{"role": "system", "content": f"{ref.system}\n\n{msgs.pop(0)['content']}"}]
    else:
        head = [{"role": "system", "content": ref.system}] if ref.system else []
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
