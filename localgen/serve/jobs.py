"""What passes between serve's HTTP handlers and a model's worker thread: the jobs a handler queues
(`Job` for generation, `EmbedJob` for embeddings and rerank), each with its one lifecycle (`State`, moved on
only by `advance`, and to DONE by its last event), the events that come back (`Text`, `Done`, `Failed`),
handed to the handler's event loop one wake-up per step, and `failed`, the one place where an error becomes
an HTTP status."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import random
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from localgen.backend import Completion
from localgen.errors import LocalgenError, ModelLoadError, Overloaded, ServeError
from localgen.media_headers import MediaError
from localgen.serve.servelog import TRACE, Tally, Trace
from localgen.types import GenerationRequest

INTERNAL = "internal error (the server's log has the details)"


class QueueFull(Overloaded):
    """Every slot is busy and the queue is at its bound."""


class Retired(ServeError):
    """The model is being deleted or replaced (serve/manage.py): its worker takes no more jobs (a 409)."""

    status = 409


@dataclass(frozen=True)
class Text:
    """A piece of the answer, as it is decided, and the prompt's tokens (evaluated before any text comes), of
    which `cached` a slot's cache already held (an API that reports them as its stream opens reads them here)."""

    text: str
    prompt_tokens: int = 0
    cached: int = 0


@dataclass(frozen=True)
class Done:
    """The job finished; its Completion carries the finish reason, counts and timings."""

    completion: Completion


@dataclass(frozen=True)
class Failed:
    """The job failed (before or after its first Text) with an HTTP status and a message for the client."""

    status: int
    message: str
    param: str | None = None  # the request field at fault, when one is
    overflow: tuple[int, int] | None = None  # a prompt too long: its tokens and the window (each API words it)
    item: int | None = None  # which of the request's texts is at fault, when one is (an embeddings input)


Event = Text | Done | Failed


class State(enum.Enum):
    """Where a job is in its worker: QUEUED (submitted) → HELD (taken while its model yields its room to
    another; it waits for the model to load again) → PREPARING (its prompt with images or audio made in the
    media thread) → RUNNING (in the scheduler) → ABORTING (its client left: the scheduler ends it at its next
    step) → DONE (its last event sent). Each step may be skipped, none taken back; a job ends from any state."""

    QUEUED = 0
    HELD = 1
    PREPARING = 2
    RUNNING = 3
    ABORTING = 4
    DONE = 5


WAITING = (State.QUEUED, State.HELD)  # not taken into the model yet
IN_SLOTS = (State.RUNNING, State.ABORTING)  # in the scheduler


def advance(job: Job | EmbedJob, to: State) -> None:
    """The one place a job's state moves on (to DONE: its last event, in send). Forward only; a job that has
    ended stays ended (the server's stop may end it from the event loop's thread while its worker takes it)."""
    if job.state is State.DONE:
        return
    if to.value < job.state.value:
        raise AssertionError(f"a job cannot go from {job.state.name} back to {to.name}")
    job.state = to


@dataclass(eq=False)
class Job:
    """One HTTP request's generation. `events` receives Text events (when it streams), then one Done or
    Failed."""

    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    # the handler has what it needs (a model repeating a tool call it already made): end the job now, as
    # finished; its Done carries what was generated
    finish: threading.Event = field(default_factory=threading.Event)
    seed: int = -1  # the request's seed, else a fresh one (set in __post_init__)
    enqueued: float = field(default_factory=time.perf_counter)
    keep_alive: float | None = None  # seconds the model stays loaded after this job (Ollama's keep_alive)
    load_s: float = 0.0  # time spent loading the model for this job
    on_end: Callable[[], None] | None = None  # told once, when the job ends (done or error)
    stream: bool = True  # False: no Text events, only the Done (its Completion has the whole text) or Failed
    answers: bool = True  # False for a load (serve/loadnow.py) and a fold's probes and summary (fitting.py): its tokens
    # count on no access line and in no token counter
    trace: Trace | None = field(default_factory=TRACE.get)  # the HTTP request's record (serve/servelog.py)
    tally: Tally | None = None  # its tokens so far, for the access line (its worker replaces it as it goes)
    outbox: _Outbox = field(init=False)  # the loop's, shared by its jobs (made on the loop's thread)
    state: State = State.QUEUED
    id: int = 0  # its worker's number for it (the scheduler's job id), set as it is submitted

    def __post_init__(self) -> None:
        if self.seed < 0:
            s = self.request.sampling.seed
            self.seed = s if s is not None else random.getrandbits(31)
        self.outbox = _OUTBOXES.get(self.loop) or _OUTBOXES.setdefault(self.loop, _Outbox(self.loop))
        if self.trace is not None:
            self.trace.jobs.append(self)

    def send(self, event: Event) -> None:
        """Hand an event to the handler's event loop (from the worker thread)."""
        if isinstance(event, (Done, Failed)):
            advance(self, State.DONE)
            if self.on_end is not None:
                end, self.on_end = self.on_end, None
                end()
        try:
            self.outbox.put(self.events, event)
        except RuntimeError:  # the server is shutting down: nobody is listening any more
            self.cancelled.set()


class _Outbox:
    """Events from the worker thread to one event loop, handed over together: one wake-up of the loop per
    decoding step (every stream's text in it), not one per token and stream. Each wake-up is a write to the
    loop's self-pipe and a pass of the loop on a core that the decoding threads are using."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.lock = threading.Lock()
        self.items: list[tuple[asyncio.Queue[Event], Event]] = []

    def put(self, events: asyncio.Queue[Event], event: Event) -> None:
        with self.lock:
            self.items.append((events, event))
            if len(self.items) > 1:  # a hand-over is already scheduled and has not run yet
                return
        try:
            self.loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:
            with self.lock:
                self.items.clear()
            raise

    def _deliver(self) -> None:
        with self.lock:
            items, self.items = self.items, []
        for events, event in items:
            events.put_nowait(event)


# one outbox per event loop, looked up only on that loop's thread (as a Job is made); gone with the loop
_OUTBOXES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Outbox] = weakref.WeakKeyDictionary()


@dataclass(eq=False)
class EmbedJob:
    """Texts to embed (or, with a query, to score) on the worker's model; `result` gets the Embeddings (or
    (score, tokens) pairs), or a Failed."""

    texts: list[str]
    loop: asyncio.AbstractEventLoop
    dimensions: int | None = None
    truncate: bool = False
    query: str | None = None  # set: score each text as a document for this query (a reranker)
    keep_alive: float | None = None  # seconds the model stays loaded after this job (Ollama's keep_alive)
    enqueued: float = field(default_factory=time.perf_counter)
    pooling: str | None = None  # the pooling the model's embeddings must have (a collection's), else the job fails
    load_s: float = 0.0  # time spent loading the model for this job
    result: asyncio.Future[list[Any] | Failed] = field(init=False)  # Embeddings or (score, tokens) pairs
    on_end: Callable[[], None] | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)  # the client left: stop between slices
    trace: Trace | None = field(default_factory=TRACE.get)
    state: State = State.QUEUED
    id: int = 0

    def __post_init__(self) -> None:
        self.result = self.loop.create_future()

    def send(self, value: list[Any] | Failed) -> None:
        """Hand the result to the handler's event loop (from the worker thread)."""
        advance(self, State.DONE)
        if self.on_end is not None:
            end, self.on_end = self.on_end, None
            end()
        with contextlib.suppress(RuntimeError):  # the server is shutting down
            self.loop.call_soon_threadsafe(self._settle, value)

    def _settle(self, value: list[Any] | Failed) -> None:
        if not self.result.done():  # a handler cancelled meanwhile leaves a cancelled future
            self.result.set_result(value)


@dataclass(eq=False)
class Unload:
    """A request to free the model, handled by the worker thread once nothing runs: `reason` is "asked" (a
    client, or a preset replaced), or "evicted" for `evicted_for` (serve/residency.py made room)."""

    reason: str = "asked"
    evicted_for: str | None = None
    done: threading.Event = field(default_factory=threading.Event)
    by_keep_alive: bool = False  # a request's keep_alive 0: a request that came after it with another
    # keep-alive withdraws it (the last one wins, as in Ollama)
    asked: float = field(default_factory=time.perf_counter)  # when (Job.enqueued's clock)


def finishing(job: Job | EmbedJob) -> bool:
    """Whether a job's handler asked it to end now as finished (Job.finish)."""
    return isinstance(job, Job) and job.finish.is_set()


def failed(e: BaseException) -> Failed:
    """An error as the Failed a client gets: a typed ServeError's own status (errors.py), 400 naming the
    conversation for media found corrupt as they were decoded, 500 for a file of the server's that would not load
    (a projector replaced or removed since it started: no fault of the request), 400 for any other LocalgenError
    (the request asked for something this model cannot do), else an internal 500 whose details stay in the
    server's log."""
    if isinstance(e, ServeError):
        tokens, window = getattr(e, "tokens", None), getattr(e, "window", None)
        return Failed(e.status, e.message, e.param, (tokens, window) if tokens and window else None,
                      getattr(e, "item", None))
    if isinstance(e, MediaError):  # an image or clip that decoding found corrupt: the conversation's field
        return Failed(400, e.message, "messages")
    if isinstance(e, ModelLoadError):  # the server's own file (a projector loaded at the first picture) failed
        return Failed(500, e.message)
    if isinstance(e, LocalgenError):
        return Failed(400, e.message)
    return Failed(500, INTERNAL)


# Longer than this is "never" (Ollama's keep_alive takes any duration; a date past year 9999 is an error).
NEVER_AFTER = 100 * 365 * 86400.0


def parse_duration(value: Any) -> float:
    """Ollama's keep_alive: seconds as a number, or "10m", "1h30m", "45s"; negative (or over a century):
    never unload. Not a number, infinite or NaN is an error."""
    import math
    import re

    if isinstance(value, bool):
        raise LocalgenError(f"bad duration {'true' if value else 'false'}: use seconds, or e.g. 10m, 1h30m, -1 for "
                            "never")
    if isinstance(value, (int, float)):
        from localgen.settings import as_float

        seconds = as_float(value)  # an integer past a float's range: inf, refused below
    else:
        text = str(value).strip().lower()
        try:
            seconds = float(text)
        except ValueError:
            m = re.fullmatch(r"(-)?((?:\d+(?:\.\d+)?(?:h|m|s|ms))+)", text)
            if not m:
                raise LocalgenError(f"bad duration {str(value)[:40]!r}: use seconds, or e.g. 10m, 1h30m, -1 for "
                                    "never") from None
            seconds = 0.0
            for amount, unit in re.findall(r"(\d+(?:\.\d+)?)(h|ms|m|s)", m.group(2)):
                seconds += float(amount) * {"h": 3600, "m": 60, "s": 1, "ms": 0.001}[unit]
            seconds = -seconds if m.group(1) else seconds
    if not math.isfinite(seconds):
        raise LocalgenError(f"bad duration {str(value)[:40]!r}: it must be finite (-1 for never)")
    return -1.0 if seconds > NEVER_AFTER else seconds
