"""One served model: a thread that owns its Engine and a ParallelContext with N slots, and runs the
continuous-batching loop over the jobs the HTTP handlers queue. Text goes back to each handler's asyncio
queue as it is decided; a job whose client went away is cancelled at the next step; the model unloads
after its keep-alive and loads again on the next job."""

from __future__ import annotations

import asyncio
import itertools
import queue
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from localgen.backend import Completion
from localgen.errors import LocalgenError
from localgen.types import GenerationRequest, LoadParams, ModelRef


class QueueFull(LocalgenError):
    """Every slot is busy and the queue is at its bound."""


@dataclass(eq=False)
class Job:
    """One HTTP request's generation. `events` receives ("text", str), then ("done", Completion) or
    ("error", status, message)."""

    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[tuple[Any, ...]] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    seed: int = field(default_factory=lambda: random.getrandbits(31))
    enqueued: float = field(default_factory=time.perf_counter)
    keep_alive: float | None = None  # seconds the model stays loaded after this job (Ollama's keep_alive)
    load_s: float = 0.0  # time spent loading the model for this job
    on_end: Callable[[], None] | None = None  # told once, when the job ends (done or error)

    def send(self, *event: Any) -> None:
        """Hand an event to the handler's event loop (from the worker thread)."""
        if event[0] in ("done", "error") and self.on_end is not None:
            end, self.on_end = self.on_end, None
            end()
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the server is shutting down: nobody is listening any more
            self.cancelled.set()


class ModelWorker:
    """A model, its slots and its thread."""

    def __init__(self, ref: ModelRef, load: LoadParams, parallel: int, keep_alive: float, max_queue: int,
                 warn: Callable[[str], None] = lambda s: None, exact: bool | None = None) -> None:
        self.ref = ref
        self.name = ref.name
        self.load = load
        self.parallel = parallel
        self.keep_alive = keep_alive  # seconds; < 0 never unload
        self.max_queue = max_queue
        self.warn = warn
        self.exact = exact
        self.jobs: queue.Queue[Job] = queue.Queue()
        self.backend: Any = None
        self.pc: Any = None
        self.n_ctx = load.n_ctx
        self.idle_since = time.monotonic()
        self.expires_at: float | None = None
        self._stop = threading.Event()
        self._ids = itertools.count(1)
        self._running: dict[int, Job] = {}
        self.calls = self.rows = 0  # decode calls and rows of contexts already unloaded
        self.outstanding = 0  # jobs queued or running
        self._count_lock = threading.Lock()
        self.thread = threading.Thread(target=self._serve, name=f"localgen-{self.name}", daemon=True)
        self.lock = threading.Lock()  # guards backend/pc for readers on other threads (/api/ps, tokenize)

    # ---- from the HTTP side -----------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread (the model loads on the first job, or now with `preload`)."""
        self.thread.start()

    def preload(self) -> None:
        """Load now, in the caller's thread (so `serve` reports a broken model before it listens)."""
        with self.lock:
            self._ensure_loaded()

    def submit(self, job: Job) -> None:
        """Queue a job; QueueFull when every slot is busy and `max_queue` jobs already wait."""
        with self._count_lock:
            if self.outstanding >= self.parallel + self.max_queue:
                raise QueueFull(f"{self.name}: all {self.parallel} slots are busy and {self.max_queue} requests "
                                "wait")
            self.outstanding += 1
        job.on_end = self._ended
        self.jobs.put(job)

    def _ended(self) -> None:
        with self._count_lock:
            self.outstanding -= 1

    def stop(self, timeout: float = 5.0) -> None:
        """Stop after the running jobs (cancelled if they outlast `timeout`), and free the model."""
        deadline = time.monotonic() + timeout
        self._stop.set()
        while self.thread.is_alive() and time.monotonic() < deadline:
            self.thread.join(0.1)
        for job in list(self._running.values()):
            job.cancelled.set()
        self.thread.join(5)

    def status(self) -> dict[str, Any]:
        """Slots, queue and batching counters (for /health)."""
        pc = self.pc
        return {"loaded": self.loaded, "slots": self.parallel, "running": len(self._running),
                "queued": self.jobs.qsize(), "decode_calls": self.calls + (pc.steps if pc else 0),
                "rows": self.rows + (pc.rows if pc else 0)}

    @property
    def loaded(self) -> bool:
        """Whether the model is in memory now."""
        return self.backend is not None

    # ---- the thread -------------------------------------------------------------------------------

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                job = self.jobs.get(timeout=0.25)
            except queue.Empty:
                self._maybe_unload()
                continue
            try:
                with self.lock:
                    t0 = time.perf_counter()
                    was_loaded = self.loaded
                    self._ensure_loaded()
                    job.load_s = 0.0 if was_loaded else time.perf_counter() - t0
            except LocalgenError as e:
                job.send("error", 500, f"cannot load {self.name}: {e.message}")
                continue
            self._batch(job)
            self.idle_since = time.monotonic()

    def _batch(self, first: Job) -> None:
        """Run the continuous-batching loop until the queue has been empty for a moment."""
        from localgen.engine.batch import END, Request

        waiting = [first]

        def take(wait: bool) -> Any:
            if waiting:
                job = waiting.pop()
            else:
                try:
                    job = self.jobs.get(timeout=0.05) if wait else self.jobs.get_nowait()
                except queue.Empty:
                    return END if wait or self._stop.is_set() else None
            return self._prepare(job, Request) or None

        def done(c: Completion) -> None:
            job = self._running.pop(c.index, None)
            if job is None:
                return
            if c.finish_reason == "cancelled":
                job.send("error", 499, "cancelled")
            elif c.finish_reason.startswith("error: "):
                job.send("error", 413 if "longer than the context" in c.finish_reason else 400,
                         c.finish_reason[len("error: "):])
            else:
                job.send("done", c)
            if job.keep_alive is not None:
                self.keep_alive = job.keep_alive

        try:
            self.pc.run(take, done, exact=self.exact, reuse=True, interleave=True)
        except LocalgenError as e:  # a failed decode: every job in flight fails, the model stays usable
            for job in list(self._running.values()):
                job.send("error", 500, e.message)
            self._running.clear()

    def _prepare(self, job: Job, request_type: Any) -> Any:
        """The job as a batch Request (tokenized here, in the thread that owns the engine), or None after
        telling the client why it cannot run."""
        if job.cancelled.is_set():
            job.send("error", 499, "the client went away")
            return None
        try:
            tokens = self.backend.tokens(job.request)
            if job.request.sampling.grammar:
                self.backend.engine.check_grammar(job.request.sampling.grammar)
        except LocalgenError as e:
            job.send("error", 400, e.message)
            return None
        if len(tokens) >= self.pc.n_ctx_seq:
            job.send("error", 413, f"the prompt is {len(tokens):,} tokens; each slot's context window is "
                                   f"{self.pc.n_ctx_seq:,}")
            return None
        index = next(self._ids)
        self._running[index] = job
        return request_type(index, tokens, job.request.sampling, job.seed, job.request.logprobs,
                            on_text=lambda text: job.send("text", text), cancelled=job.cancelled.is_set)

    def _ensure_loaded(self) -> None:
        if self.backend is not None:
            return
        from localgen.engine.batch import ParallelContext
        from localgen.engine.local import LocalBackend
        from localgen.models.load import open_engine

        engine = open_engine(self.ref, self.load, warn=self.warn, kv_tokens=self.parallel * self.load.n_ctx)
        engine.release_context()  # the slots have their own
        self.backend = LocalBackend(engine, warn=self.warn)
        self.n_ctx = engine.n_ctx
        self.pc = ParallelContext(engine, self.parallel, engine.n_ctx)
        self.idle_since = time.monotonic()

    def _maybe_unload(self) -> None:
        if self.backend is None:
            self.expires_at = None
            return
        if self.keep_alive < 0:
            self.expires_at = None
            return
        self.expires_at = time.time() + self.keep_alive - (time.monotonic() - self.idle_since)
        if time.monotonic() - self.idle_since >= self.keep_alive:
            self.unload()

    def unload(self) -> None:
        """Free the model (it loads again on the next job)."""
        with self.lock:
            if self.pc is not None:
                self.calls += self.pc.steps
                self.rows += self.pc.rows
                self.pc.close()
                self.pc = None
            if self.backend is not None:
                self.backend.close()
                self.backend = None
            self.expires_at = None


def parse_duration(value: Any) -> float:
    """Ollama's keep_alive: seconds as a number, or "10m", "1h30m", "45s"; negative: never unload."""
    import re

    if isinstance(value, bool):
        raise LocalgenError(f"bad duration {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip().lower()
    try:
        return float(text)
    except ValueError:
        pass
    m = re.fullmatch(r"(-)?((?:\d+(?:\.\d+)?(?:h|m|s|ms))+)", text)
    if not m:
        raise LocalgenError(f"bad duration {value!r}: use seconds, or e.g. 10m, 1h30m, -1 for never")
    total = 0.0
    for amount, unit in re.findall(r"(\d+(?:\.\d+)?)(h|ms|m|s)", m.group(2)):
        total += float(amount) * {"h": 3600, "m": 60, "s": 1, "ms": 0.001}[unit]
    return -total if m.group(1) else total
