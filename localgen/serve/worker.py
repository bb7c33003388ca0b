"""One served model: a thread that owns its Engine and a ParallelContext with N slots, and runs the
continuous-batching loop over the jobs the HTTP handlers queue. Text goes back to each handler's asyncio
queue as typed events as it is decided; a job whose client went away is cancelled at the next step; the
model unloads after its keep-alive (or when asked) and loads again on the next job. Only this thread
touches the engine: loading, decoding and unloading all happen here, so nothing frees a model under a
running decode. One job that fails, for any reason, fails alone; the thread keeps serving."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import queue
import random
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from localgen.backend import Completion
from localgen.errors import LocalgenError
from localgen.types import GenerationRequest, LoadParams, ModelRef

INTERNAL = "internal error (the server's log has the details)"


class QueueFull(LocalgenError):
    """Every slot is busy and the queue is at its bound."""


@dataclass(frozen=True)
class Text:
    """A piece of the answer, as it is decided."""

    text: str


@dataclass(frozen=True)
class Done:
    """The job finished; its Completion carries the finish reason, counts and timings."""

    completion: Completion


@dataclass(frozen=True)
class Failed:
    """The job failed (before or after its first Text) with an HTTP status and a message for the client."""

    status: int
    message: str


Event = Text | Done | Failed


@dataclass(eq=False)
class Job:
    """One HTTP request's generation. `events` receives Text events (when it streams), then one Done or
    Failed."""

    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    seed: int = -1  # the request's seed, else a fresh one (set in __post_init__)
    enqueued: float = field(default_factory=time.perf_counter)
    keep_alive: float | None = None  # seconds the model stays loaded after this job (Ollama's keep_alive)
    load_s: float = 0.0  # time spent loading the model for this job
    on_end: Callable[[], None] | None = None  # told once, when the job ends (done or error)
    stream: bool = True  # False: no Text events, only the Done (its Completion has the whole text) or Failed
    outbox: _Outbox = field(init=False)  # the loop's, shared by its jobs (made on the loop's thread)

    def __post_init__(self) -> None:
        if self.seed < 0:
            s = self.request.sampling.seed
            self.seed = s if s is not None else random.getrandbits(31)
        self.outbox = _OUTBOXES.get(self.loop) or _OUTBOXES.setdefault(self.loop, _Outbox(self.loop))

    def send(self, event: Event) -> None:
        """Hand an event to the handler's event loop (from the worker thread)."""
        if isinstance(event, (Done, Failed)) and self.on_end is not None:
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
    result: asyncio.Future[Any] = field(init=False)
    on_end: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        self.result = self.loop.create_future()

    def send(self, value: Any) -> None:
        """Hand the result to the handler's event loop (from the worker thread)."""
        if self.on_end is not None:
            end, self.on_end = self.on_end, None
            end()
        with contextlib.suppress(RuntimeError):  # the server is shutting down
            self.loop.call_soon_threadsafe(self._settle, value)

    def _settle(self, value: Any) -> None:
        if not self.result.done():  # a handler cancelled meanwhile leaves a cancelled future
            self.result.set_result(value)


@dataclass(eq=False)
class _Unload:
    """A request to free the model, handled by the worker thread once nothing runs."""

    done: threading.Event = field(default_factory=threading.Event)


class ModelWorker:
    """A model, its slots and its thread."""

    def __init__(self, ref: ModelRef, load: LoadParams, parallel: int, keep_alive: float, max_queue: int,
                 warn: Callable[[str], None] = lambda s: None, exact: bool | None = None,
                 share_prefixes: bool = True, cache_ram: int = 0) -> None:
        self.ref = ref
        self.name = ref.name
        self.load = load
        self.parallel = parallel
        self.keep_alive = keep_alive  # seconds; < 0 never unload
        self.max_queue = max_queue
        self.warn = warn
        self.exact = exact
        self.share_prefixes = share_prefixes
        self.cache_ram = cache_ram  # bytes for slot states saved in host memory (-1 no limit, 0 off)
        self.jobs: queue.Queue[Job | EmbedJob | _Unload] = queue.Queue()
        self.backend: Any = None
        self.pc: Any = None
        self.n_ctx = load.n_ctx
        self.idle_since = time.monotonic()
        self.expires_at: float | None = None
        self.failures = 0  # jobs failed by an internal error
        self.last_error: str | None = None
        self.dead: str | None = None  # why the thread stopped, if it stopped other than by stop()
        self.vram_bytes = 0  # bytes of weights llama.cpp placed on GPUs (from its load log)
        self.mode: Any = None  # the batching Mode (engine/batch.py), known once the model has loaded
        self._stop = threading.Event()
        self._ids = itertools.count(1)
        self._running: dict[int, Job] = {}
        self._unloads: list[_Unload] = []  # asked for while jobs ran
        self.calls = self.rows = 0  # decode calls and rows of contexts already unloaded
        self.outstanding = 0  # jobs queued or running
        self._open: set[Job | EmbedJob] = set()  # those jobs (for fail_all)
        self._count_lock = threading.Lock()
        self.thread = threading.Thread(target=self._serve, name=f"localgen-{self.name}", daemon=True)
        self.lock = threading.Lock()  # guards backend/pc for readers on other threads (/api/ps)

    # ---- from the HTTP side -----------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread (the model loads on the first job, or now with `preload`)."""
        self.thread.start()

    def preload(self) -> None:
        """Load now, in the caller's thread, before the worker thread starts (so `serve` reports a broken
        model before it listens)."""
        assert not self.thread.is_alive()
        with self.lock:
            self._ensure_loaded()

    def submit(self, job: Job | EmbedJob) -> None:
        """Queue a job; QueueFull when every slot is busy and `max_queue` jobs already wait."""
        if not self.alive:
            raise LocalgenError(f"{self.name}: the model's worker has stopped ({self.dead or 'shutting down'})")
        with self._count_lock:
            if self.outstanding >= self.parallel + self.max_queue:
                raise QueueFull(f"{self.name}: all {self.parallel} slots are busy and {self.max_queue} requests "
                                "wait")
            self.outstanding += 1
            self._open.add(job)
        job.on_end = lambda: self._ended(job)
        self.jobs.put(job)

    def request_unload(self) -> threading.Event:
        """Ask the worker thread to free the model as soon as no job runs; the event is set once it has."""
        req = _Unload()
        if not self.thread.is_alive():
            req.done.set()
        else:
            self.jobs.put(req)
        return req.done

    @property
    def busy(self) -> bool:
        """Whether a job runs or waits."""
        return self.outstanding > 0

    def _ended(self, job: Job | EmbedJob) -> None:
        with self._count_lock:
            if job in self._open:  # once, though fail_all and this thread may both end it
                self._open.discard(job)
                self.outstanding -= 1

    def fail_all(self, event: Failed) -> None:
        """Take no more jobs and end every one queued or running with `event` now (the server is stopping),
        told from the event loop's thread, so that a decoding step slow to come cannot delay the answers; the
        worker's thread drops the jobs at its next step (their later events find nobody reading)."""
        self._stop.set()
        with self._count_lock:
            jobs = list(self._open)
        for job in jobs:
            if isinstance(job, Job):
                job.cancelled.set()
            job.send(event)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop after the running jobs (cancelled if they outlast `timeout`), and free the model."""
        deadline = time.monotonic() + timeout
        self._stop.set()
        while self.thread.is_alive() and time.monotonic() < deadline:
            self.thread.join(0.1)
        for job in list(self._running.values()):
            job.cancelled.set()
        self.thread.join(5)

    @property
    def alive(self) -> bool:
        """Whether the thread serves (or will, once started)."""
        return self.dead is None and not self._stop.is_set()

    def status(self) -> dict[str, Any]:
        """Slots, queue, batching counters and failures (for /health)."""
        pc = self.pc
        return {"alive": self.alive, "loaded": self.loaded, "slots": self.parallel, "running": len(self._running),
                "queued": self.jobs.qsize(), "decode_calls": self.calls + (pc.steps if pc else 0),
                "rows": self.rows + (pc.rows if pc else 0), "shared_prompt_tokens": pc.slots.shared if pc else 0,
                "prompt_cache": pc.slots.host.status() if pc and pc.slots.host else None,
                "batching": self.mode.name if self.mode else None, "failed_jobs": self.failures,
                "last_error": self.dead or self.last_error, "settings": self.settings}

    @property
    def settings(self) -> dict[str, Any] | None:
        """The loaded model's tunable load settings: each one's value and where it came from (flag, tuning
        record, rule); None while nothing is loaded."""
        backend = self.backend
        if backend is None:
            return None
        from localgen.tuning import TUNABLE

        eng = backend.engine
        return {k: {"value": getattr(eng.params, k), "from": eng.origins.get(k, "default")} for k in TUNABLE}

    @property
    def loaded(self) -> bool:
        """Whether the model is in memory now."""
        return self.backend is not None

    # ---- the thread -------------------------------------------------------------------------------

    def _serve(self) -> None:
        item: Job | EmbedJob | _Unload | None = None
        try:
            if self.pc is not None:  # preloaded in another thread: warm it here, where it will decode
                self._warm_template()
                self.pc.warm_up()
            while not self._stop.is_set():
                item = None
                try:
                    item = self.jobs.get(timeout=0.25)
                except queue.Empty:
                    self._maybe_unload()
                    continue
                if isinstance(item, _Unload):
                    self._unload()
                    item.done.set()
                    continue
                if isinstance(item, EmbedJob):
                    if self._load_for(item):
                        self._embed(item)
                    self.idle_since = time.monotonic()
                    continue
                if self._load_for(item):
                    self._batch(item)
                self._after_batch()
        except BaseException as e:  # the thread is going: say so, and fail whatever waits
            self.dead = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            self._internal(e, "the worker thread stopped")
            stopped = Failed(500, f"{self.name}: the model's worker stopped")
            if isinstance(item, (Job, EmbedJob)):
                item.send(stopped)
            self._drain(stopped)
            raise

    def _warm_template(self) -> None:
        """Compile now what the first chat request would: the chat template (with jinja's import), and the check
        whether its generation prompt opens a thinking block (cached for the event loop, which asks it of every
        request). SmolLM2, 2 cores: the first chat request's time to first token fell from 152 to 109 ms, as
        llama-server's 110 (scripts/bench_first_request.py)."""
        from localgen.tools.plan import thinking_opened_by

        try:
            template = self.backend.engine.template
        except LocalgenError:
            return  # a base model (raw prompts only), or a broken template that each chat request reports
        thinking_opened_by(template.source)

    def _load_for(self, job: Job | EmbedJob) -> bool:
        """Load the model if it is not loaded; False (the job failed) when it cannot be."""
        try:
            with self.lock:
                t0 = time.perf_counter()
                was_loaded = self.loaded
                self._ensure_loaded()
                if isinstance(job, Job):
                    job.load_s = 0.0 if was_loaded else time.perf_counter() - t0
            return True
        except LocalgenError as e:
            job.send(Failed(500, f"cannot load {self.name}: {e.message}"))
        except Exception as e:
            self._internal(e, "loading the model")
            job.send(Failed(500, f"cannot load {self.name}: {INTERNAL}"))
        return False

    def _embed(self, job: EmbedJob) -> None:
        """Embed in this thread (between decoding steps when streams run): the Embeddings, or a Failed."""
        from localgen.engine.embed import ContextTooSmall

        try:
            if job.query is not None:
                job.send(self.backend.rerank(job.query, job.texts, job.truncate))
            else:
                job.send(self.backend.embed(job.texts, None, True, job.dimensions, job.truncate))
        except ContextTooSmall as e:
            job.send(Failed(413, e.message))
        except LocalgenError as e:
            job.send(Failed(400, e.message))
        except Exception as e:
            self._internal(e, "embedding")
            job.send(Failed(500, INTERNAL))

    def _after_batch(self) -> None:
        self.idle_since = time.monotonic()
        if self._unloads:
            self._unload()
            for req in self._unloads:
                req.done.set()
            self._unloads.clear()

    def _drain(self, event: Failed) -> None:
        """Fail the jobs in flight and every job still queued."""
        self._drain_running(event)
        while True:
            try:
                item = self.jobs.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Unload):
                item.done.set()
            else:
                item.send(event)

    def _internal(self, e: BaseException, where: str) -> None:
        """An error that is a bug or a fault, not the client's: counted, and logged with its traceback."""
        self.failures += 1
        self.last_error = f"{where}: {type(e).__name__}"
        text = "".join(traceback.format_exception(e)).rstrip()
        with contextlib.suppress(OSError, ValueError):  # no stderr left to log to
            print(f"localgen serve: {self.name}: internal error while {where}\n{text}", file=sys.stderr, flush=True)

    def _batch(self, first: Job) -> None:
        """Run the continuous-batching loop until the queue has been empty for a moment."""
        from localgen.engine.batchseq import END, Request

        waiting = [first]

        def take(wait: bool) -> Any:
            while True:
                if waiting:
                    item: Job | EmbedJob | _Unload = waiting.pop()
                else:
                    try:
                        item = self.jobs.get(timeout=0.05) if wait else self.jobs.get_nowait()
                    except queue.Empty:
                        return END if wait or self._stop.is_set() else None
                if isinstance(item, _Unload):  # handled once this loop ends
                    self._unloads.append(item)
                    return END if wait else None
                if isinstance(item, EmbedJob):  # quick: done here, between two decoding steps
                    self._embed(item)
                    continue
                return self._prepare(item, Request) or None

        def done(c: Completion) -> None:
            job = self._running.pop(c.index, None)
            if job is None:
                return
            if c.finish_reason == "cancelled":
                job.send(Failed(499, "cancelled"))
            elif c.finish_reason.startswith("error: "):
                job.send(Failed(413 if "longer than the context" in c.finish_reason else 400,
                                c.finish_reason[len("error: "):]))
            else:
                job.send(Done(c))
            if job.keep_alive is not None:
                self.keep_alive = job.keep_alive

        try:
            self.pc.run(take, done, exact=self.mode.exact, reuse=True, interleave=True)
        except LocalgenError as e:  # a failed decode: every job in flight fails, the model stays usable
            self._drain_running(Failed(500, e.message))
        except Exception as e:  # a bug or a fault: the jobs in flight fail, the slots start afresh
            self._internal(e, "decoding")
            self._drain_running(Failed(500, INTERNAL))
            self._reset_slots()

    def _drain_running(self, event: Failed) -> None:
        for job in list(self._running.values()):
            job.send(event)
        self._running.clear()

    def _reset_slots(self) -> None:
        """Forget every slot's cache after an unexpected failure: nothing half-done is reused."""
        pc = self.pc
        if pc is not None and pc.ctx:
            pc.clear()
            pc.slots.reset()

    def _prepare(self, job: Job, request_type: Any) -> Any:
        """The job as a batch Request (tokenized here, in the thread that owns the engine), or None after
        telling the client why it cannot run."""
        if job.cancelled.is_set():
            job.send(Failed(499, "the client went away"))
            return None
        try:
            self.backend.check_generates()
            tokens = self.backend.tokens(job.request)
            if job.request.sampling.grammar:
                self.backend.engine.check_grammar(job.request.sampling.grammar)
        except LocalgenError as e:
            job.send(Failed(400, e.message))
            return None
        except Exception as e:
            self._internal(e, "preparing a request")
            job.send(Failed(500, INTERNAL))
            return None
        if len(tokens) >= self.pc.n_ctx_seq:
            job.send(Failed(413, f"the prompt is {len(tokens):,} tokens; each slot's context window is "
                                 f"{self.pc.n_ctx_seq:,}"))
            return None
        index = next(self._ids)
        self._running[index] = job
        # a job that does not stream gets no Text events: each would wake the event loop, a step's
        # hand-over that costs the decoding thread ~0.2 ms of a 10 ms token on 2 cores (SmolLM2)
        on_text = (lambda text: job.send(Text(text))) if job.stream else None
        return request_type(index, tokens, job.request.sampling, job.seed, job.request.logprobs,
                            on_text=on_text, cancelled=job.cancelled.is_set, exact=job.request.exact)

    def _ensure_loaded(self) -> None:
        if self.backend is not None:
            return
        from localgen.engine.batch import ParallelContext
        from localgen.engine.batchmode import batching_mode
        from localgen.engine.local import LocalBackend
        from localgen.models.load import open_engine

        engine = open_engine(self.ref, self.load, warn=self.warn, kv_tokens=self.parallel * self.load.n_ctx)
        engine.release_context()  # the slots have their own
        backend = LocalBackend(engine, warn=self.warn)
        pc = None
        try:
            mode = batching_mode(engine, self.exact)
            pc = ParallelContext(engine, self.parallel, engine.n_ctx, pooled=mode.throughput,
                                 share_prefixes=self.share_prefixes, cache_ram=self.cache_ram)
            if threading.current_thread() is self.thread:
                # only in the thread that decodes from now on: llama.cpp's CPU backend (OpenMP) keeps a
                # team of threads per calling thread, and a warm-up decode in the loading thread made every
                # later step in the worker thread ~60 % slower (Gemma 3 270M, 2 cores); `_serve` warms a
                # preloaded model. A job waits for this load: it need not pay for ignore_eos's token scan
                pc.warm_up(eog=False)
        except BaseException:
            if pc is not None:
                pc.close()
            backend.close()  # a failed load holds nothing: the next job loads again
            raise
        self.backend, self.pc, self.mode = backend, pc, mode
        self.n_ctx = engine.n_ctx
        self.vram_bytes = engine.gpu_weight_bytes()
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
            self._unload()

    def _unload(self) -> None:
        """Free the model (it loads again on the next job). Only the worker thread calls this."""
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
            self.vram_bytes = 0


# Longer than this is "never" (Ollama's keep_alive takes any duration; a date past year 9999 is an error).
NEVER_AFTER = 100 * 365 * 86400.0


def parse_duration(value: Any) -> float:
    """Ollama's keep_alive: seconds as a number, or "10m", "1h30m", "45s"; negative (or over a century):
    never unload. Not a number, infinite or NaN is an error."""
    import math
    import re

    if isinstance(value, bool):
        raise LocalgenError(f"bad duration {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
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
