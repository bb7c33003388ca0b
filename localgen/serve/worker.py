"""One served model: a thread that owns its Engine, a ParallelContext with N slots and the Scheduler over
them (engine/scheduler.py), in a short loop: take the handlers' jobs and the aborts of those whose client
left, step the scheduler, publish each step's outputs as typed events (serve/jobs.py). Only this thread
loads, decodes and unloads (a media thread makes prompts with images or audio: serve/prepare.py), so
nothing frees a model under a running decode; a job that fails, for any reason, fails alone."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import queue
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from localgen.backend import Completion
from localgen.errors import Cancelled, LocalgenError
from localgen.serve.jobs import INTERNAL, Done, EmbedJob, Failed, Job, QueueFull, Text, Unload, failed, finishing
from localgen.serve.model import warm_template
from localgen.serve.prepare import MediaPrep, has_media, request, task
from localgen.serve.residency import NoRoom
from localgen.serve.servelog import STDERR_LOG, ServeLog
from localgen.serve.workerload import Residence
from localgen.types import LoadParams, ModelRef

STOP_WRITE_S = 60.0  # the most a stopping worker is given to write its prefixes (a decode step may be under way)


class ModelWorker(Residence):
    """A model, its slots and its thread (loading and unloading it: serve/workerload.py)."""

    def __init__(self, ref: ModelRef, load: LoadParams, parallel: int, keep_alive: float, max_queue: int,
                 warn: Callable[[str], None] = lambda s: None, exact: bool | None = None,
                 share_prefixes: bool = True, cache_ram: int = 0, residency: Any = None, pinned: bool = True,
                 store: Any = None, log: ServeLog = STDERR_LOG) -> None:
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
        self.residency = residency  # serve/residency.py: asked for room before each load (None: no limits)
        self.pinned = pinned  # never unloaded to make room for another model (serve -m)
        self.last_used = time.monotonic()  # the last job's arrival: the least recently used goes first
        self.need = 0  # bytes the model takes loaded, by its estimate (serve/model.py's footprint)
        self.store = store  # engine/prefixstore.py: its prompt cache on disk (None: --cache-disk 0)
        self.warm_restored = 0  # prefixes its loads found there
        self.log = log  # serve/servelog.py: its loads, unloads and evictions
        self._yield_to: list[str] = []  # models waiting for its room: it takes no new jobs (fair swaps)
        self._held: list[Job | EmbedJob] = []  # the jobs that came meanwhile, in order
        self._kept_at = time.monotonic()  # when the prefix store last had what the slots hold
        self.disk_hits_before = self.disk_hit_tokens_before = 0  # prefixes from disk used by earlier loads
        self.jobs: queue.Queue[Job | EmbedJob | Unload | None] = queue.Queue()  # None: a prompt is ready
        self.prep = MediaPrep(lambda: self.jobs.put(None))  # prompts with images or audio, made off this thread
        self.backend: Any = None
        self.pc: Any = None
        self.n_ctx = load.n_ctx
        self.idle_since = time.monotonic()
        self.expires_at: float | None = None
        self.failures = 0  # jobs failed by an internal error
        self.aborted = 0  # jobs stopped before their end because their client left
        self.last_error: str | None = None
        self.dead: str | None = None  # why the thread stopped, if it stopped other than by stop()
        self.vram_bytes = 0  # bytes of weights llama.cpp placed on GPUs (from its load log)
        self.placement: dict[str, Any] = {}  # what went where (native/report.py's LoadReport.record)
        self.mode: Any = None  # the batching Mode (engine/batch.py), known once the model has loaded
        self.on_completion: Callable[[str, Completion], None] | None = None  # serve/metrics.py's count
        self._stop = threading.Event()
        self._ids = itertools.count(1)
        self._running: dict[int, Job | EmbedJob] = {}  # by scheduler job id
        self._aborting: set[int] = set()  # ids aborted in the scheduler, not ended yet
        self.sched: Any = None  # the Scheduler (engine/scheduler.py), made with the model's load
        self._unloads: list[Unload] = []  # asked for while jobs ran
        self.calls = self.rows = 0  # decode calls and rows of contexts already unloaded
        self.outstanding = 0  # jobs queued or running
        self._open: set[Job | EmbedJob] = set()  # those jobs (for fail_all)
        self._count_lock = threading.Lock()
        self.thread = threading.Thread(target=self._serve, name=f"localgen-{self.name}", daemon=True)
        self.lock = threading.Lock()  # guards backend/pc for readers on other threads (/api/ps)

    # ---- from the HTTP side -----------------------------------------------------------------------

    def start(self) -> None:  # the thread (the model loads on the first job, or now with `preload`)
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
            self.last_used = time.monotonic()
        if job.trace is not None:
            job.trace.model = self.name
        job.on_end = lambda: self._ended(job)
        self.jobs.put(job)

    def request_unload(self, reason: str = "asked", evicted_for: str | None = None) -> threading.Event:
        """Ask the worker thread to free the model as soon as no job runs; the event is set once it has (at
        once when the thread has ended: nothing else can be using the model then)."""
        req = Unload(reason, evicted_for)
        if not self.thread.is_alive():
            self._unload(reason, evicted_for)
            req.done.set()
        else:
            self.jobs.put(req)
        return req.done

    @property
    def busy(self) -> bool:  # whether a job runs or waits
        return self.outstanding > 0

    @property
    def evictable(self) -> bool:
        """Whether unloading it now costs no request: nothing queued or running, or (asked to yield its room)
        nothing running; what it holds back waits for the model to load again."""
        if not self.busy:
            return True
        return bool(self._yield_to) and not self._running and not self.prep.pending

    def yield_to(self, name: str) -> None:
        """A model waits for this one's room (serve/residency.py): take no new jobs until resume(name)."""
        with self._count_lock:
            self._yield_to.append(name)

    def resume(self, name: str) -> None:
        """That model has its room now, or gave up: take jobs again (those held back first)."""
        with self._count_lock:
            if name in self._yield_to:
                self._yield_to.remove(name)
        self.jobs.put(None)  # wake the thread
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
        """Stop after the running jobs (cancelled if they outlast `timeout`); the thread writes what its slots
        hold to the prefix store (--cache-disk) before it ends, given up to STOP_WRITE_S for that."""
        deadline = time.monotonic() + timeout
        self._stop.set()
        while self.thread.is_alive() and time.monotonic() < deadline:
            self.thread.join(0.1)
        for job in list(self._running.values()):
            job.cancelled.set()
        self.thread.join(STOP_WRITE_S)

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
                "aborted_jobs": self.aborted, "last_error": self.dead or self.last_error, "settings": self.settings,
                "warm_restored": self.warm_restored, "disk_hits": self.disk_hits()[0],
                "yielding_to": list(self._yield_to), "held": len(self._held)}

    def disk_hits(self) -> tuple[int, int]:
        """Requests that started from a prefix read back from disk, and the prompt tokens it spared them, over
        every load of this model."""
        pc = self.pc
        host = pc.slots.host if pc is not None else None
        return ((host.disk_loads if host else 0) + self.disk_hits_before,
                (host.disk_loaded_tokens if host else 0) + self.disk_hit_tokens_before)

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
    def loaded(self) -> bool:  # whether the model is in memory now
        return self.backend is not None

    # ---- the thread -------------------------------------------------------------------------------

    def _serve(self) -> None:
        """Take new jobs and aborts, step the scheduler, publish what came of it; idle, unload when due."""
        try:
            if self.pc is not None:  # preloaded in another thread: warm it here, where it will decode
                warm_template(self.backend)
                self.pc.warm_up()
            while not self._stop.is_set():
                running = self.sched is not None and not self.sched.idle
                self._intake(wait=not running)
                self._admit_prepared()
                if self.sched is not None and not self.sched.idle:
                    self._abort_cancelled()
                    self._step()
                    continue
                if self.prep.pending:
                    continue
                if self._unloads:
                    evicted = next((u for u in self._unloads if u.reason == "evicted"), None)
                    self._unload("evicted" if evicted else "asked", evicted.evicted_for if evicted else None)
                    for req in self._unloads:
                        req.done.set()
                    self._unloads.clear()
                self._maybe_unload()
                self._keep_prefixes()
            self._keep_prefixes(final=True)  # a clean stop: what its slots hold is written for the next start
        except BaseException as e:  # the thread is going: say so, and fail whatever waits
            self.dead = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            self._internal(e, "the worker thread stopped")
            self._drain(Failed(500, f"{self.name}: the model's worker stopped"))
            raise
        finally:
            self.prep.close()

    def _intake(self, wait: bool) -> None:
        """Move queued jobs to the scheduler (loading the model first if it is not loaded); with `wait`
        (nothing runs) block a moment for the first. While another model waits for this one's room (fair
        swaps), new jobs are held back, in order, and taken first once it has loaded."""
        self._drop_cancelled_held()
        while True:
            yielding = bool(self._yield_to) and self.loaded
            if self._held and not yielding:
                item: Job | EmbedJob | Unload | None = self._held.pop(0)
            else:
                try:
                    item = self.jobs.get(timeout=0.25) if wait else self.jobs.get_nowait()
                except queue.Empty:
                    return
            wait = False
            if item is None:  # the media thread made a prompt (_admit_prepared takes it), or a wake-up
                continue
            if isinstance(item, Unload):  # once nothing runs
                self._unloads.append(item)
                continue
            if item.cancelled.is_set():
                self.aborted += 1
                item.send(Failed(499, "the client went away"))
                continue
            if yielding:
                self._held.append(item)
                continue
            failure = self._load_for(item)
            if failure is not None:  # the jobs held back with it fail the same way, rather than each wait again
                for job in (item, *self._held):
                    job.send(failure)
                self._held.clear()
                continue
            job_id, backend = next(self._ids), self.backend
            if isinstance(item, EmbedJob):
                self._admit(job_id, item, functools.partial(task, backend, job_id, item))
            elif has_media(item):  # its prompt is made in the media thread (_admit_prepared takes it on)
                try:
                    self.prep.submit(job_id, item, backend)
                except Exception as e:
                    self._fail(item, e, "preparing a request")
            else:
                self._admit(job_id, item, functools.partial(request, backend, self.pc, job_id, item))

    def _drop_cancelled_held(self) -> None:
        """Held-back jobs whose client went away end now."""
        for job in [j for j in self._held if j.cancelled.is_set()]:
            self._held.remove(job)
            self.aborted += 1
            job.send(Failed(499, "the client went away"))

    def _admit(self, job_id: int, job: Job | EmbedJob, make: Callable[[], Any]) -> None:
        """Into the scheduler: the work `make` turns the job into (serve/prepare.py), or the job fails alone."""
        try:
            work = make()
        except Exception as e:
            self._fail(job, e, "preparing a request")
            return
        self._running[job_id] = job
        self.sched.add(work)

    def _admit_prepared(self) -> None:
        """Jobs whose prompt the media thread has made."""
        for job_id, job, prompt, error in self.prep.ready():
            if job.cancelled.is_set():
                self.aborted += 1
                job.send(Failed(499, "the client went away"))
            elif error is not None:
                self._fail(job, error, "preparing a request")
            else:
                self._admit(job_id, job, functools.partial(request, self.backend, self.pc, job_id, job, prompt))

    def _abort_cancelled(self) -> None:
        """Abort in the scheduler each job whose client went away (it ends at the next step)."""
        for job_id, job in self._running.items():
            if (job.cancelled.is_set() or finishing(job)) and job_id not in self._aborting:
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
            if out.id in self._aborting or isinstance(getattr(out, "error", None), Cancelled):
                self._aborting.discard(out.id)
                self.aborted += 0 if finishing(job) else 1
            if isinstance(out, Finished):
                self._finished(job, out.completion)
            elif out.error is not None:
                self._fail(job, out.error, "embedding")
            else:
                job.send(out.value)
        if self.sched.idle:
            self.idle_since = time.monotonic()

    def _finished(self, job: Any, c: Completion) -> None:
        """A generation job's end as its event: Done, or why it did not finish."""
        if job.trace is not None and c.error is None:  # its access line's tokens and time to first token
            job.trace.completed(self.name, c)
        if self.on_completion is not None and c.error is None:  # counted before the client can ask /metrics
            try:
                self.on_completion(self.name, c)
            except Exception as e:  # a metrics fault is logged, and never fails the request
                self._internal(e, "counting metrics")
        if c.error is not None:
            job.send(failed(c.error))
        elif c.finish_reason == "cancelled" and not finishing(job):
            job.send(Failed(499, "cancelled"))
        else:  # it ended by itself, or on its handler's word (Job.finish)
            job.send(Done(c if c.finish_reason != "cancelled" else dataclasses.replace(c, finish_reason="stop")))
        if job.keep_alive is not None:
            self.keep_alive = job.keep_alive

    def _load_for(self, job: Job | EmbedJob) -> Failed | None:
        """Load the model if it is not loaded; why it cannot be, as the job's event (not sent yet)."""
        try:
            with self.lock:
                t0 = time.perf_counter()
                was_loaded = self.loaded
                self._ensure_loaded()
                if isinstance(job, Job):
                    job.load_s = 0.0 if was_loaded else time.perf_counter() - t0
            return None
        except NoRoom as e:
            return Failed(503, e.message)
        except LocalgenError as e:
            return Failed(500, f"cannot load {self.name}: {e.message}")
        except Exception as e:
            self._internal(e, "loading the model")
            return Failed(500, f"cannot load {self.name}: {INTERNAL}")

    def _drain(self, event: Failed) -> None:  # the jobs in flight and every job still queued
        self._drain_running(event)
        for job in self.prep.clear():
            job.send(event)
        while self._held:
            self._held.pop(0).send(event)
        while True:
            try:
                item = self.jobs.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, Unload):
                item.done.set()
            elif item is not None:
                item.send(event)

    def _fail(self, job: Job | EmbedJob, e: BaseException, where: str) -> None:  # a fault not the client's: logged
        if not isinstance(e, LocalgenError):
            self._internal(e, where)
        job.send(failed(e))

    def _internal(self, e: BaseException, where: str) -> None:
        """An error that is a bug or a fault, not the client's: counted, and logged with its traceback."""
        self.failures += 1
        self.last_error = f"{where}: {type(e).__name__}"
        text = "".join(traceback.format_exception(e)).rstrip()
        with contextlib.suppress(OSError, ValueError):  # no stderr left to log to
            self.log.error(f"localgen serve: {self.name}: internal error while {where}", text, self.name)

    def _drain_running(self, event: Failed) -> None:
        """Fail the jobs in flight, and forget every slot's cache: nothing half-done is reused."""
        for job in list(self._running.values()):
            job.send(event)
        self._running.clear()
        self._aborting.clear()
        if self.sched is not None:
            self.sched.close()
        if self.pc is not None and self.pc.ctx:
            self.pc.clear()
            self.pc.slots.reset()
