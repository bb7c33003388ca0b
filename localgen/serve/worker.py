"""One served model: a thread that owns its Engine, a ParallelContext with N slots and the Scheduler over
them (engine/scheduler.py), and runs a short loop: take the jobs the HTTP handlers queue (generation,
embeddings, rerank) and the aborts of those whose client went away, step the scheduler, publish what came of
the step to each handler's event loop as typed events (serve/jobs.py). The model unloads after its
keep-alive (or when asked) and loads again on the next job. Only this thread touches the engine: loading,
decoding and unloading all happen here, so nothing frees a model under a running decode. One job that
fails, for any reason, fails alone; the thread keeps serving."""

from __future__ import annotations

import contextlib
import itertools
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from localgen.backend import Completion
from localgen.errors import LocalgenError
from localgen.serve.jobs import (
    INTERNAL,
    Done,
    EmbedJob,
    Event,
    Failed,
    Job,
    QueueFull,
    Text,
    failed,
    parse_duration,
)
from localgen.types import LoadParams, ModelRef

__all__ = ["INTERNAL", "Done", "EmbedJob", "Event", "Failed", "Job", "ModelWorker", "QueueFull", "Text",
           "parse_duration"]


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
        self._running: dict[int, Job | EmbedJob] = {}  # by scheduler job id
        self._aborting: set[int] = set()  # ids aborted in the scheduler, not ended yet
        self.sched: Any = None  # the Scheduler (engine/scheduler.py), made with the model's load
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
        """Take new jobs and aborts, step the scheduler, publish what came of it; idle, unload when due."""
        try:
            if self.pc is not None:  # preloaded in another thread: warm it here, where it will decode
                self._warm_template()
                self.pc.warm_up()
            while not self._stop.is_set():
                running = self.sched is not None and not self.sched.idle
                self._intake(wait=not running)
                if self.sched is not None and not self.sched.idle:
                    self._abort_cancelled()
                    self._step()
                    continue
                if self._unloads:
                    self._unload()
                    for req in self._unloads:
                        req.done.set()
                    self._unloads.clear()
                self._maybe_unload()
        except BaseException as e:  # the thread is going: say so, and fail whatever waits
            self.dead = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            self._internal(e, "the worker thread stopped")
            self._drain(Failed(500, f"{self.name}: the model's worker stopped"))
            raise

    def _intake(self, wait: bool) -> None:
        """Move queued jobs to the scheduler (loading the model first if it is not loaded); with `wait`
        (nothing runs) block a moment for the first."""
        while True:
            try:
                item = self.jobs.get(timeout=0.25) if wait else self.jobs.get_nowait()
            except queue.Empty:
                return
            wait = False
            if isinstance(item, _Unload):  # once nothing runs
                self._unloads.append(item)
                continue
            if item.cancelled.is_set():
                item.send(Failed(499, "the client went away"))
                continue
            if not self._load_for(item):
                continue
            job_id = next(self._ids)
            job = self._prepare(job_id, item) if isinstance(item, Job) else self._task(job_id, item)
            if job is not None:
                self._running[job_id] = item
                self.sched.add(job)

    def _abort_cancelled(self) -> None:
        """Abort in the scheduler each job whose client went away (it ends at the next step)."""
        for job_id, job in self._running.items():
            if job.cancelled.is_set() and job_id not in self._aborting:
                self._aborting.add(job_id)
                self.sched.abort(job_id)

    def _step(self) -> None:
        """One scheduler step and its outputs. A failed decode fails the jobs in flight alone: the slots
        start afresh and the model stays loaded."""
        from localgen.engine.scheduler import Finished, Piece

        try:
            outputs = self.sched.step()
        except Exception as e:  # a failed decode is the server's fault (500), with llama.cpp's reason
            if not isinstance(e, LocalgenError):
                self._internal(e, "decoding")
            self._drain_running(Failed(500, e.message) if isinstance(e, LocalgenError) else Failed(500, INTERNAL))
            self._reset_slots()
            return
        for out in outputs:
            job = self._running.get(out.id)
            if job is None:
                continue
            if isinstance(out, Piece):
                if isinstance(job, Job) and job.stream:
                    job.send(Text(out.text))
                continue
            del self._running[out.id]
            self._aborting.discard(out.id)
            if isinstance(out, Finished):
                self._finished(job, out.completion)
            elif out.error is not None:
                if not isinstance(out.error, LocalgenError):
                    self._internal(out.error, "embedding")
                job.send(failed(out.error))
            else:
                job.send(out.value)
        if self.sched.idle:
            self.idle_since = time.monotonic()

    def _finished(self, job: Any, c: Completion) -> None:
        if c.error is not None:
            job.send(failed(c.error))
        elif c.finish_reason == "cancelled":
            job.send(Failed(499, "cancelled"))
        else:
            job.send(Done(c))
        if job.keep_alive is not None:
            self.keep_alive = job.keep_alive

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

    def _task(self, job_id: int, job: EmbedJob) -> Any:
        """An embeddings or rerank job as a scheduler task (engine/embed.py), or None after telling the client
        why it cannot run."""
        from localgen.engine.embed import EmbedTask

        try:
            emb = self.backend.scorer() if job.query is not None else self.backend.embedder()
            return EmbedTask(job_id, emb, job.texts, True, job.dimensions, job.truncate, job.query)
        except Exception as e:
            if not isinstance(e, LocalgenError):
                self._internal(e, "embedding")
            job.send(failed(e))
            return None

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

    def _drain_running(self, event: Failed) -> None:
        for job in list(self._running.values()):
            job.send(event)
        self._running.clear()
        self._aborting.clear()
        if self.sched is not None:
            self.sched.close()

    def _reset_slots(self) -> None:
        """Forget every slot's cache after a failure: nothing half-done is reused."""
        pc = self.pc
        if pc is not None and pc.ctx:
            pc.clear()
            pc.slots.reset()

    def _prepare(self, job_id: int, job: Job) -> Any:
        """The job as a scheduler Request (tokenized here, in the thread that owns the engine), or None after
        telling the client why it cannot run."""
        from localgen.engine.batchseq import Request

        try:
            self.backend.check_generates()
            tokens = self.backend.tokens(job.request)
            if job.request.sampling.grammar:
                self.backend.engine.check_grammar(job.request.sampling.grammar)
        except Exception as e:
            if not isinstance(e, LocalgenError):
                self._internal(e, "preparing a request")
            job.send(failed(e))
            return None
        if len(tokens) >= self.pc.n_ctx_seq:
            job.send(Failed(413, f"the prompt is {len(tokens):,} tokens; each slot's context window is "
                                 f"{self.pc.n_ctx_seq:,}"))
            return None
        return Request(job_id, tokens, job.request.sampling, job.seed, job.request.logprobs,
                       exact=job.request.exact)

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
        from localgen.engine.scheduler import Scheduler

        self.backend, self.pc, self.mode = backend, pc, mode
        self.sched = Scheduler(pc, mode.exact, reuse=True, interleave=True)
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
            if self.sched is not None:
                self.sched.close()
                self.sched = None
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
