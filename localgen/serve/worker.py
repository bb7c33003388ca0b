"""One served model: a thread that owns its Residence (serve/residence.py: the model loaded or not, its
slots and the Scheduler over them), in a short loop: take the handlers' jobs and the aborts of those whose
client left, step the scheduler, publish each step's outputs as typed events (serve/jobs.py). Only this
thread loads, decodes and unloads (a media thread makes prompts with images or audio: serve/prepare.py), so
nothing frees a model under a running decode; a job that fails, for any reason, fails alone. The jobs it has
taken and not ended are one table, by id, each in its State (serve/jobs.py): which jobs wait, run or are
live is read from it, and from nothing else (serve/livejobs.py); its internal errors go to its Faults
(serve/faults.py)."""

from __future__ import annotations

import dataclasses
import functools
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from localgen.backend import Completion
from localgen.errors import Cancelled, LocalgenError
from localgen.serve.arrivals import Bursts
from localgen.serve.faults import Faults
from localgen.serve.jobs import (
    IN_SLOTS,
    INTERNAL,
    WAITING,
    Done,
    EmbedJob,
    Failed,
    Job,
    QueueFull,
    Retired,
    State,
    Text,
    Unload,
    advance,
    failed,
    finishing,
)
from localgen.serve.livejobs import LiveJobs, left
from localgen.serve.model import warm_template
from localgen.serve.prepare import MediaPrep, has_media, request, task
from localgen.serve.residence import Residence
from localgen.serve.residency import Abandoned, NoRoom
from localgen.serve.servelog import STDERR_LOG, ServeLog, Tally
from localgen.types import LoadParams, ModelRef

if TYPE_CHECKING:
    from localgen.engine.scheduler import Scheduler

STOP_WRITE_S = 60.0  # the most a stopping worker is given to write its prefixes (a decode step may be under way)


class Counts(Protocol):
    """What a worker's thread reports to serve/metrics.py (Metrics): each finished generation, each decoding step
    (the tokens it evaluated, prompts' and sampled ones, and its time)."""

    def observe(self, model: str, c: Completion) -> None: ...

    def stepped(self, model: str, tokens: int, seconds: float) -> None: ...


class ModelWorker:
    """A model's thread and its jobs; the model itself, loaded or not, is its Residence (serve/residence.py)."""

    def __init__(self, ref: ModelRef, load: LoadParams, parallel: int, keep_alive: float, max_queue: int,
                 warn: Callable[[str], None] = lambda s: None, exact: bool | None = None, lookup: int = 0,
                 share_prefixes: bool = True, cache_ram: int = 0, residency: Any = None, pinned: bool = True,
                 store: Any = None, log: ServeLog = STDERR_LOG, draft: ModelRef | None = None) -> None:
        self.ref = ref
        self.name = ref.name
        self.parallel = parallel
        self.max_queue = max_queue
        self.pinned = pinned  # never unloaded to make room for another model (serve -m)
        self.last_used = time.monotonic()  # the last job's arrival: the least recently used goes first
        self.client_used: float | None = None  # a client's job (not a batch's) last came or ended (monotonic)
        self.log = log  # serve/servelog.py: its warnings
        self.faults = Faults(self.name, log)  # its internal errors: counted, the last named, each logged
        self.residence = Residence(self, ref, load, parallel, keep_alive, fault=self.faults.internal, warn=warn,
                                   exact=exact, lookup=lookup, share_prefixes=share_prefixes, cache_ram=cache_ram,
                                   residency=residency, store=store, log=log, draft=draft)
        self._yield_to: list[str] = []  # models waiting for its room: it takes no new jobs (fair swaps)
        self._yield_mark = 0  # the last job that came before it was asked to yield: those up to it still run
        self._yield_lock = threading.Lock()  # guards _yield_to (the residency's threads and this one)
        self._live = LiveJobs()  # the jobs submitted and not ended
        self.inbox: queue.Queue[Unload | None] = queue.Queue()  # unloads asked for; None wakes the thread
        self.prep = MediaPrep(lambda: self.inbox.put(None))  # prompts with images or audio, made off this thread
        self.aborted = 0  # jobs stopped before their end because their client left
        self.dead: str | None = None  # why the thread stopped, if it stopped other than by stop()
        self.counts: Counts | None = None  # serve/metrics.py's counts of generations and steps
        self._stop = threading.Event()
        self._closed: str | None = None  # why it takes no more jobs: its model is being taken away (close)
        self.bursts = Bursts()  # a burst's first step waits for the jobs still coming (serve/arrivals.py)
        self.thread = threading.Thread(target=self._serve, name=f"localgen-{self.name}", daemon=True)

    # ---- from the HTTP side -----------------------------------------------------------------------

    def start(self) -> None:  # the thread (the model loads on the first job, or now with `preload`)
        self.thread.start()

    def preload(self) -> None:
        """Load now, in the caller's thread, before the worker thread starts (so `serve` reports a broken
        model before it listens)."""
        assert not self.thread.is_alive()
        with self.residence.lock:
            self.residence.ensure(warm=False, patient=False)  # at start nothing would make room: say so now

    def submit(self, job: Job | EmbedJob) -> None:
        """Queue a job; QueueFull when every slot is busy and `max_queue` jobs already wait, Retired once closed."""
        if self._closed is not None:
            raise Retired(f"{self._closed}: try again once that ends")
        if not self.alive:
            raise LocalgenError(f"{self.name}: the model's worker has stopped ({self.dead or 'shutting down'})")
        if job.trace is not None:
            job.trace.model = self.name
        # the last job's end starts the keep-alive there and then: /api/ps may ask before this step's end
        client = job.trace is not None and not job.trace.batch

        def ended() -> None:
            if client:
                self.client_used = time.monotonic()
            self._live.end(job, when_empty=self.residence.rested)

        job.on_end = ended
        if not self._live.add(job, self.parallel + self.max_queue):
            if self._live.holding() < self.parallel + self.max_queue:  # the hard cap (LiveJobs.add)
                raise QueueFull(f"{self.name}: busy: the requests of clients that left wait for the model's next "
                                "step")
            raise QueueFull(f"{self.name}: all {self.parallel} slots are busy and {self.max_queue} requests wait")
        self.last_used = time.monotonic()
        if client:
            self.client_used = self.last_used
        if job.trace is not None:  # no longer counted among the requests being read (serve/arrivals.py)
            job.trace.arrived()
        self.bursts.came(others=len(self._live) > 1)
        self.inbox.put(None)

    def close(self, why: str) -> None:
        """Take no more jobs (Retired, saying `why`): its model is being deleted or replaced (serve/manage.py);
        once stopped, it frees the model (whatever it holds is no longer counted as loaded)."""
        self._closed = why

    def request_unload(self, reason: str = "asked", evicted_for: str | None = None,
                       by_keep_alive: float | None = None) -> threading.Event:
        """Ask the worker thread to free the model as soon as no job runs; the event is set once it has (at
        once when the thread has ended: nothing else can be using the model then). `by_keep_alive`: when a
        request asked it with keep_alive 0 (Job.enqueued's clock): a request after it with another keep-alive
        takes it back."""
        req = Unload(reason, evicted_for)
        if by_keep_alive is not None:
            req.by_keep_alive, req.asked = True, by_keep_alive
        if not self.thread.is_alive():
            self.residence.unload(reason, evicted_for)
            req.done.set()
        else:
            self.inbox.put(req)
        return req.done

    @property
    def outstanding(self) -> int:
        """Jobs queued or running (not those whose client left while they waited: serve/livejobs.py's `left`)."""
        return self._live.holding()

    @property
    def running(self) -> int:
        """Jobs in slots: those the scheduler holds, less those it has not begun (they wait for a slot)."""
        sched = self.residence.sched
        return max(0, len(self._live.of(*IN_SLOTS)) - (sched.queued if sched is not None else 0))

    @property
    def busy(self) -> bool:  # whether a job runs or waits
        return bool(self._live)

    @property
    def keep_alive(self) -> float:
        """Seconds the model stays loaded once idle (< 0: never unloaded)."""
        return self.residence.keep_alive

    @keep_alive.setter
    def keep_alive(self, seconds: float) -> None:
        """A request's keep-alive, now: see keep_for."""
        self.keep_for(seconds, time.perf_counter())

    def keep_for(self, seconds: float, since: float) -> None:
        """The keep-alive of a request that came at `since` (Job.enqueued's clock): it takes back the unloads
        that requests before it asked for with keep_alive 0 while jobs ran (the last request's keep-alive wins,
        as in Ollama)."""
        self.residence.keep_alive = seconds
        self.residence.withdraw_keep_alive_unloads(since)

    @property
    def n_ctx(self) -> int:
        """A slot's window in tokens: the loaded model's, else the one it will load with."""
        return self.residence.n_ctx

    @property
    def loaded(self) -> bool:  # whether the model is in memory now
        return self.residence.loaded

    def expires(self) -> float | None:
        """When the model unloads if no request comes (a Unix time), None for never."""
        return self.residence.expires(self.busy)

    @property
    def evictable(self) -> bool:
        """Whether unloading it now costs no request: nothing queued or running, or (asked to yield its room)
        nothing running and nothing waiting that came before it was asked; what it holds back waits for the model
        to load again."""
        if not self.busy:
            return True
        return bool(self._yield_to) and not any(j.state not in WAITING or (j.id <= self._yield_mark
                                                                           and j.state is not State.HELD)
                                                for j in self._live.of(State.PREPARING, *IN_SLOTS, *WAITING))

    def yield_to(self, name: str) -> None:
        """A model waits for this one's room (serve/residency.py): take no new jobs until resume(name). The jobs
        that came before still run, those waiting for this model's own load among them (asked while it loads,
        it runs them in this load, and unloads once they end)."""
        with self._yield_lock:
            if not self._yield_to:
                self._yield_mark = max((j.id for j in self._live.of()), default=0)
            self._yield_to.append(name)

    @property
    def yielding_to(self) -> list[str]:
        """The models waiting for its room: it unloads once the jobs that came before them end."""
        with self._yield_lock:
            return list(self._yield_to)

    def resume(self, name: str) -> None:
        """That model has its room now, or gave up: take jobs again (those held back first)."""
        with self._yield_lock:
            if name in self._yield_to:
                self._yield_to.remove(name)
        self.inbox.put(None)  # wake the thread

    def fail_all(self, event: Failed) -> None:
        """Take no more jobs and end every one queued or running with `event` now (the server is stopping),
        told from the event loop's thread, so that a decoding step slow to come cannot delay the answers; the
        worker's thread drops the jobs at its next step (their later events find nobody reading)."""
        self._stop.set()
        for job in self._live.of():
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
        for job in self._live.of(*IN_SLOTS):
            job.cancelled.set()
        self.thread.join(STOP_WRITE_S)

    @property
    def failures(self) -> int:
        """Its internal errors so far (its Faults' count: /health's failed_jobs)."""
        return self.faults.count

    @property
    def alive(self) -> bool:
        """Whether the thread serves (or will, once started)."""
        return self.dead is None and not self._stop.is_set()

    def status(self) -> dict[str, Any]:
        """Slots, queue, batching counters and failures (for /health)."""
        res = self.residence
        pc, mode = res.pc, res.mode
        # serve --lookup or --draft, on a model that drafts (or did, until its draft model failed)
        drafting = pc if pc is not None and (pc.draft_max or pc.draft_off) else None
        calls, rows = res.steps()
        states = [j.state for j in self._live.of() if not left(j)]
        running = self.running
        return {"alive": self.alive, "loaded": self.loaded, "slots": self.parallel, "running": running,
                "queued": states.count(State.QUEUED) + sum(s in IN_SLOTS for s in states) - running,
                "decode_calls": calls, "rows": rows,
                "shared_prompt_tokens": pc.slots.shared if pc else 0,
                "prompt_cache": host.status() if (host := pc.slots.host if pc else None) is not None else None,
                "batching": mode.name if mode else None, "batching_why": mode.why if mode else None,
                "drafted": drafting.drafted if drafting else None,
                "accepted": drafting.accepted if drafting else None,
                "draft_row_cost": round(drafting.costs.row, 3) if drafting and drafting.costs.row is not None
                else None,
                "draft_model_cost": round(drafting.costs.draft_step, 3) if drafting and drafting.drafter is not None
                and drafting.costs.steps else None,
                "drafting": bool(drafting.draft_max) if drafting else None,
                "drafting_off": drafting.draft_off if drafting else None,
                "kv_unified": pc.one_pool if pc else None,
                "failed_jobs": self.failures,
                "aborted_jobs": self.aborted, "last_error": self.dead or self.faults.last, "settings": res.settings(),
                "warm_restored": res.warm_restored, "disk_hits": res.disk_hits()[0],
                "yielding_to": list(self._yield_to), "held": states.count(State.HELD)}

    # ---- the thread -------------------------------------------------------------------------------

    def _serve(self) -> None:
        """Take new jobs and aborts, step the scheduler, publish what came of it; idle, unload when due."""
        res = self.residence
        try:
            if res.pc is not None:  # preloaded in another thread: warm it here, where it will decode
                warm_template(res.backend)
                res.pc.warm_up()
            while not self._stop.is_set():
                if res.sched is None or res.sched.idle:
                    self.bursts.rested()  # the next jobs begin a burst (serve/arrivals.py)
                self._intake(wait=res.sched is None or res.sched.idle)
                self._admit_prepared()
                if res.sched is not None and not res.sched.idle:
                    self._abort_cancelled(res.sched)
                    if self.bursts.hold(res.sched.fresh and res.sched.pc.pooled, res.sched.policy.waiting):
                        continue  # a burst's first step waits for the jobs still coming (serve/arrivals.py)
                    self._step(res.sched)
                    continue
                if self._live.of(State.PREPARING):
                    continue
                res.idle()
            res.keep_prefixes(final=True)  # a clean stop: what its slots hold is written for the next start
            self._left()
        except BaseException as e:  # the thread is going: say so, and fail whatever waits
            self.dead = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            self.faults.internal(e, "the worker thread stopped")
            self._drain(Failed(500, f"{self.name}: the model's worker stopped"))
            raise
        finally:
            self.prep.close()

    def _left(self) -> None:
        """At a clean stop, every job not answered yet is (a 409 when the model was being taken away, else the
        server is stopping: a 503); a model closed is freed, so the residency no longer counts it."""
        if self._live.of():
            self._drain(Failed(409, f"{self._closed}: try again once that ends") if self._closed is not None
                        else Failed(503, f"{self.name}: the server is shutting down"))
        if self._closed is not None:
            self.residence.unload("taken", why=self._closed)

    def _intake(self, wait: bool) -> None:
        """Take the unloads asked for, and move waiting jobs to the scheduler (loading the model first if it is
        not loaded); with `wait` (nothing runs) block a moment for the first. While another model waits for
        this one's room (fair swaps), the jobs that came after it asked are held back, in order, and taken first
        once it has loaded again."""
        try:
            while True:
                block = wait and not self._live.of(State.QUEUED)  # held jobs wait for resume(), which wakes it
                item = self.inbox.get(timeout=0.25) if block else self.inbox.get_nowait()
                wait = False
                if isinstance(item, Unload):  # once nothing runs
                    self.residence.ask(item)
        except queue.Empty:
            pass
        for job in self._live.of(*WAITING):
            if job.state is State.DONE:  # ended meanwhile (a load that failed fails those held with it)
                continue
            if job.cancelled.is_set():
                self.aborted += 1
                job.send(Failed(499, "the client went away"))
            elif bool(self._yield_to) and self.loaded and (job.id > self._yield_mark or isinstance(job, EmbedJob)):
                advance(job, State.HELD)  # came after the ask; or embeddings, whose context may need more room
                # (Residency.grow), which would wait behind the model this one yields to, its own jobs stopped
            elif (failure := self._load_for(job)) is not None:  # those held back fail the same way, rather
                for held in (job, *(h for h in self._live.of(State.HELD) if h is not job)):  # than each wait again
                    self.aborted += failure.status == 499  # a load abandoned: every client had left
                    held.send(failure)
            elif isinstance(job, EmbedJob):
                self._admit(job, functools.partial(task, self.residence.backend, job.id, job))
            elif has_media(job):  # its prompt is made in the media thread (_admit_prepared takes it on)
                try:
                    self.prep.submit(job.id, job, self.residence.backend)
                    advance(job, State.PREPARING)
                except Exception as e:
                    self.faults.fail(job, e, "preparing a request")
            else:
                self._admit(job, functools.partial(request, self.residence.backend, self.residence.pc, job.id, job))

    def _admit(self, job: Job | EmbedJob, make: Callable[[], Any]) -> None:
        """Into the scheduler: the work `make` turns the job into (serve/prepare.py), or the job fails alone."""
        try:
            work = make()
        except Exception as e:
            self.faults.fail(job, e, "preparing a request")
            return
        assert self.residence.sched is not None, "admitted once loaded"
        advance(job, State.RUNNING)
        self.residence.sched.add(work)

    def _admit_prepared(self) -> None:
        """Jobs whose prompt the media thread has made."""
        for _id, job, prompt, error in self.prep.ready():
            if job.cancelled.is_set():
                self.aborted += 1
                job.send(Failed(499, "the client went away"))
            elif error is not None:
                self.faults.fail(job, error, "preparing a request")
            else:
                self._admit(job, functools.partial(request, self.residence.backend, self.residence.pc, job.id, job,
                                                   prompt))

    def _abort_cancelled(self, sched: Scheduler) -> None:
        """Abort in the scheduler each job whose client went away (it ends at the next step)."""
        for job in self._live.of(State.RUNNING):
            if job.cancelled.is_set() or finishing(job):
                advance(job, State.ABORTING)
                sched.abort(job.id)

    def _step(self, sched: Scheduler) -> None:
        """One scheduler step and its outputs. A failed decode fails the jobs in flight alone: the slots
        start afresh and the model stays loaded."""
        from localgen.engine.scheduler import Finished, Piece

        t0, evaluated = time.perf_counter(), sched.pc.evaluated
        try:
            outputs = sched.step()
        except Exception as e:  # a failed decode is the server's fault: counted, and llama.cpp's reason logged
            self.faults.internal(e, "decoding")
            self._drain_running(Failed(500, INTERNAL))
            return
        finally:
            self._draft_failure()
            self._cache_failure()
        self._stepped(sched.pc.evaluated - evaluated, time.perf_counter() - t0)
        for out in outputs:
            job = self._live.get(out.id)
            if job is None or job.state not in IN_SLOTS:
                continue
            if isinstance(out, Piece):
                if isinstance(job, Job) and job.answers:  # the access line's tokens if it ends before its Done
                    job.tally = Tally(out.prompt_tokens, out.cached, out.made, out.ttft_s)
                if isinstance(job, Job) and job.stream:
                    job.send(Text(out.text, out.prompt_tokens, out.cached))
                continue
            stopped = isinstance(out, Finished) and out.completion.finish_reason == "cancelled" and \
                job.cancelled.is_set()  # its client left while its prompt was evaluated: stopped inside the step
            if job.state is State.ABORTING or stopped or isinstance(getattr(out, "error", None), Cancelled):
                self.aborted += 0 if finishing(job) else 1
            if isinstance(out, Finished):
                assert isinstance(job, Job), "a generation's end"
                self._finished(job, out.completion)
            elif out.error is not None:
                self.faults.fail(job, out.error, "embedding")
            else:
                assert isinstance(job, EmbedJob), "a task's result"
                job.send(out.value)
                self._keep(job)
        if sched.idle:
            self.residence.rested()

    def _stepped(self, tokens: int, seconds: float) -> None:
        """Count a step that decoded `tokens` (a step that only sliced a task or ended jobs decoded none)."""
        if self.counts is not None and tokens:
            try:
                self.counts.stepped(self.name, tokens, seconds)
            except Exception as e:  # as _finished's count
                self.faults.internal(e, "counting metrics")

    def _draft_failure(self) -> None:
        """Say once that the draft model failed and drafting is off (engine/batch.py, stop_drafting)."""
        pc = self.residence.pc
        if pc is None or pc.draft_error is None:
            return
        e, pc.draft_error = pc.draft_error, None
        self.log.warning(f"{self.name}: the draft model failed ({pc.draft_off}); drafting is off, the requests go "
                         "on without drafts")
        if not isinstance(e, LocalgenError):  # a bug: its traceback
            self.faults.internal(e, "drafting")

    def _cache_failure(self) -> None:
        """Say once that the prompt cache in host memory failed and is off (engine/slots.py, _host_failed)."""
        pc = self.residence.pc
        if pc is None or pc.slots.host_error is None:
            return
        e, pc.slots.host_error = pc.slots.host_error, None
        self.log.warning(f"{self.name}: the prompt cache in host memory failed; it is off, the requests go on "
                         "without it")
        self.faults.internal(e, "caching a prompt")

    def _finished(self, job: Job, c: Completion) -> None:
        """A generation job's end as its event: Done, or why it did not finish."""
        counted = c.error is None and job.answers  # a load (serve/loadnow.py) answers nothing: no usage
        if counted:  # its access line's tokens and time to first token, final now
            job.tally = Tally(c.prompt_tokens, c.cached_tokens, c.completion_tokens, c.ttft_s)
        if self.counts is not None and counted:  # counted before the client can ask /metrics
            try:
                self.counts.observe(self.name, c)
            except Exception as e:  # a metrics fault is logged, and never fails the request
                self.faults.internal(e, "counting metrics")
        self._keep(job)  # before the client has its answer, so its next /api/ps shows this keep-alive
        if c.error is not None:
            job.send(failed(c.error))
        elif c.finish_reason == "cancelled" and not finishing(job):
            job.send(Failed(499, "cancelled"))
        else:  # it ended by itself, or on its handler's word (Job.finish)
            job.send(Done(c if c.finish_reason != "cancelled" else dataclasses.replace(c, finish_reason="stop")))

    def _keep(self, job: Job | EmbedJob) -> None:
        """A job's keep-alive, once it has ended: 0 unloads the model once nothing runs (its keep-alive stays
        for when it loads again); another sets it."""
        if job.keep_alive == 0:
            self.request_unload(by_keep_alive=job.enqueued)
        elif job.keep_alive is not None:
            self.keep_for(job.keep_alive, job.enqueued)

    def _load_for(self, job: Job | EmbedJob) -> Failed | None:
        """Load the model if it is not loaded; why it cannot be, as the job's event (not sent yet)."""
        try:
            with self.residence.lock:
                t0 = time.perf_counter()
                was_loaded = self.loaded
                self.residence.ensure(warm=threading.current_thread() is self.thread, wanted=self._wanted,
                                      embeddings=isinstance(job, EmbedJob))
                job.load_s = 0.0 if was_loaded else time.perf_counter() - t0
            return None
        except NoRoom as e:
            return Failed(503, e.message)
        except Abandoned:  # counted with each job it fails (_intake)
            return Failed(499, "the client went away")
        except LocalgenError as e:
            if was_loaded:  # room for its embeddings context, which could never fit (TooBig)
                return Failed(500, f"no room for {self.name}'s embeddings context: {e.message}")
            return Failed(500, f"cannot load {self.name}: {e.message}")
        except Exception as e:
            self.faults.internal(e, "loading the model")
            return Failed(500, f"cannot load {self.name}: {INTERNAL}")

    def _wanted(self) -> bool:
        """Whether a client still waits for this model's load: a job not taken in yet whose client is there."""
        return any(not job.cancelled.is_set() for job in self._live.of(*WAITING))

    def _drain(self, event: Failed) -> None:  # the jobs in flight and every job still queued
        self._drain_running(event)
        self.prep.clear()
        for job in self._live.of():
            job.send(event)
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, Unload):
                item.done.set()

    def _drain_running(self, event: Failed) -> None:
        """Fail the jobs in flight, and forget every slot's cache: nothing half-done is reused."""
        for job in self._live.of(*IN_SLOTS):
            job.send(event)
        res = self.residence
        if res.sched is not None:
            res.sched.close()
        if res.pc is not None and res.pc.ctx:
            res.pc.clear()
            res.pc.slots.reset()
