"""A served model's residence: the model in memory or not. It loads the model (after serve's residency made
room), keeps its prompt cache on disk (engine/prefixstore.py: written at an unload, a clean stop and while idle,
read back at a load), and unloads it when idle past its keep-alive or when asked, each load and unload logged.
The worker (serve/worker.py) owns one and calls it only from its thread, so nothing frees a model under a
running decode; the residence reaches back only through what it was given: the worker as the residency sees it
(a Tenant), and `fault`, the worker's record of an internal error."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from localgen.serve.jobs import Unload
from localgen.serve.servelog import STDERR_LOG, ServeLog
from localgen.types import LoadParams, ModelRef
from localgen.units import format_bytes

if TYPE_CHECKING:
    from localgen.engine.batch import ParallelContext
    from localgen.engine.batchmode import Mode
    from localgen.engine.local import LocalBackend
    from localgen.engine.prefixstore import PrefixStore
    from localgen.engine.scheduler import Scheduler
    from localgen.serve.residency import Residency, Tenant

KEEP_EVERY_S = 60.0  # while idle, what the slots hold is written to the prefix store at most this often

T = TypeVar("T")


class Residence:
    """Whether a served model is in memory, and everything that comes with it loaded: its backend, slots
    (ParallelContext), batching mode and scheduler; its keep-alive; its prefixes on disk."""

    def __init__(self, tenant: Tenant, ref: ModelRef, load: LoadParams, parallel: int, keep_alive: float, *,
                 fault: Callable[[BaseException, str], None], warn: Callable[[str], None] = lambda s: None,
                 exact: bool | None = None, lookup: int = 0, share_prefixes: bool = True, cache_ram: int = 0,
                 residency: Residency | None = None, store: PrefixStore | None = None,
                 log: ServeLog = STDERR_LOG, draft: ModelRef | None = None) -> None:
        self.tenant = tenant  # what the residency is asked for room on behalf of
        self.ref, self.load, self.parallel = ref, load, parallel
        self.keep_alive = keep_alive  # seconds; < 0 never unload
        self._fault = fault
        self._warn = warn
        self._exact = exact
        self._lookup = lookup  # tokens drafted per step at most, by prompt lookup or the draft model (0: none)
        self.draft = draft  # serve --draft: the model that drafts (loaded and unloaded with this one)
        self._share_prefixes = share_prefixes
        self._cache_ram = cache_ram  # bytes for slot states saved in host memory (-1 no limit, 0 off)
        self._residency = residency  # serve/residency.py: asked for room before each load (None: no limits)
        self._store = store  # its prompt cache on disk (None: --cache-disk 0)
        self._log = log
        self._told_gone: object = None  # the backend whose model file was found gone (said once)
        self.lock = threading.Lock()  # guards what is loaded for readers on other threads (/api/ps)
        self.backend: LocalBackend | None = None
        self.pc: ParallelContext | None = None
        self.mode: Mode | None = None  # the batching Mode, known once the model has loaded
        self.sched: Scheduler | None = None  # made with each load
        self.n_ctx = load.n_ctx
        self.loading = False  # room made, the model being loaded (/api/ps lists it so)
        self.need = 0  # bytes the model takes loaded, by its estimate (serve/model.py's footprint), its embeddings too
        self.embeddings = 0  # of `need`: its embeddings context's bytes, once counted (0: not yet)
        self.warm_restored = 0  # prefixes its loads found in the store
        self.vram_bytes = 0  # bytes of weights llama.cpp placed on GPUs (from its load log)
        self.placement: dict[str, Any] = {}  # what went where (native/report.py's LoadReport.record)
        self.idle_since = time.monotonic()
        self._kept_at = time.monotonic()  # when the prefix store last had what the slots hold
        self._calls = self._rows = 0  # decode calls and rows of contexts already unloaded
        self._disk_hits = self._disk_hit_tokens = 0  # prefixes from disk used by earlier loads
        self._asked: list[Unload] = []  # unloads asked for while jobs ran
        self._asked_lock = threading.Lock()  # a request's keep-alive takes some back from another thread

    @property
    def name(self) -> str:
        return self.ref.name

    @property
    def loaded(self) -> bool:  # whether the model is in memory now
        return self.backend is not None

    def need_now(self) -> int | None:
        """The bytes a load of the model now would take, by its estimate (it reads the model's file and the
        machine: not for the event loop); None where it is loaded, or no residency bounds loads."""
        if self.backend is not None or self._residency is None:
            return None
        from localgen.serve.model import footprint

        return footprint(self.ref, self.load, self.parallel, self.draft if self._exact is not True else None) + \
            self.embeddings

    def room_for(self, need: int) -> bool:
        """Whether a load of `need` bytes (need_now) would unload no other model now."""
        return self._residency is None or bool(self._residency.room_for(need))

    def ensure(self, warm: bool, wanted: Callable[[], bool] = lambda: True, patient: bool = True,
               embeddings: bool = False) -> None:
        """Load the model unless it is loaded, once the residency has room for it (NoRoom, TooBig, Abandoned
        once `wanted()` turns false while it waits, or the load's own error otherwise). `warm`: decode a
        warm-up now (the caller is the thread that decodes); not `patient`: no waiting for pinned models
        (Residency.admit). `embeddings`: an embeddings or rerank job waits, whose context the room must hold
        too (an embedding model's is counted from its load on; another's once a job asks for it)."""
        from localgen.serve.model import embeddings_footprint, embeds

        if self.backend is not None:
            if embeddings and not self.embeddings:
                self._room_for_embeddings(embeddings_footprint(self.ref, self.load, self.n_ctx), wanted)
            return
        from localgen.engine.scheduler import Scheduler
        from localgen.serve.model import footprint, open_model

        # the draft model's bytes only where it loads: not with --exact, under which nothing drafts
        self.need = footprint(self.ref, self.load, self.parallel, self.draft if self._exact is not True else None)
        self.embeddings = embeddings_footprint(self.ref, self.load) if embeddings or embeds(self.ref) else 0
        self.need += self.embeddings
        waited = self._residency.admit(self.tenant, self.need, wanted, patient) if self._residency is not None else 0.0
        t0 = time.perf_counter()
        self.loading = True
        try:
            backend, pc, mode = open_model(self.ref, self.load, self.parallel, self._exact, self._share_prefixes,
                                           self._cache_ram, self._warn, warm=warm, lookup=self._lookup,
                                           draft=self.draft)
        except BaseException:
            if self._residency is not None:
                self._residency.released(self.tenant, failed=True)
            raise
        finally:
            self.loading = False
        self.backend, self.pc, self.mode = backend, pc, mode
        _import_decode_path()
        self.sched = Scheduler(pc, mode.exact, reuse=True, interleave=True)
        self.n_ctx = backend.engine.n_ctx
        restored = self._with_store(lambda store, key, ident: pc.slots.restore(store, key, ident)) or 0
        self.warm_restored += restored
        self.vram_bytes = backend.engine.gpu_weight_bytes()
        self.placement = backend.engine.load_report.record()
        self.idle_since = time.monotonic()
        self._kept_at = time.monotonic()
        seconds = time.perf_counter() - t0
        waited_text = f", after waiting {waited:.1f} s for room" if waited >= 0.05 else ""
        self._log.event("load", self.name, f"loaded {self.name} in {seconds:.1f} s (about {format_bytes(self.need)}"
                        f"{waited_text}; {restored} stored prefix{'es' * (restored != 1)} read back)",
                        seconds=round(seconds, 3), bytes=self.need, waited_s=round(waited, 3),
                        prefixes_restored=restored)

    def _room_for_embeddings(self, more: int, wanted: Callable[[], bool]) -> None:
        """Count the embeddings context a loaded model is about to make (`more` bytes) in its footprint, once the
        residency has made room for it beside the others (NoRoom, TooBig, Abandoned as for a load). Logged."""
        waited = self._residency.grow(self.tenant, more, wanted) if self._residency is not None else 0.0
        self.embeddings = more  # (the caller holds self.lock, as for a load)
        self.need += more
        waited_text = f", after waiting {waited:.1f} s for room" if waited >= 0.05 else ""
        self._log.event("embeddings", self.name, f"{self.name} makes its embeddings context (about "
                        f"{format_bytes(more)} more, {format_bytes(self.need)} in all{waited_text})",
                        bytes=more, waited_s=round(waited, 3))

    def ask(self, req: Unload) -> None:
        """An unload asked for while jobs may run: done at the next idle() (its `done` set then)."""
        with self._asked_lock:
            self._asked.append(req)

    def withdraw_keep_alive_unloads(self, since: float) -> None:
        """Take back the unloads that a request's keep_alive 0 asked for before `since` while jobs ran: a
        request that came after it set another keep-alive (their waiters are told at once: the model stays)."""
        with self._asked_lock:
            withdrawn = [u for u in self._asked if u.by_keep_alive and u.asked < since]
            self._asked = [u for u in self._asked if u not in withdrawn]
        for req in withdrawn:
            req.done.set()

    def rested(self) -> None:
        """The last job has ended: the keep-alive counts from now."""
        self.idle_since = time.monotonic()

    def idle(self) -> None:
        """Nothing runs (the worker's thread, between its waits for jobs): the unloads asked for, an unload
        once idle past the keep-alive, and what the slots hold written to the prefix store now and then."""
        with self._asked_lock:
            asked, self._asked = self._asked, []
        if asked:
            evicted = next((u for u in asked if u.reason == "evicted"), None)
            self.unload("evicted" if evicted else "asked", evicted.evicted_for if evicted else None)
            for req in asked:
                req.done.set()
        self._maybe_unload()
        self.keep_prefixes()

    def _with_store(self, act: Callable[[PrefixStore, str, str], T]) -> T | None:
        """`act(store, key, identity)` on this model's part of the prefix store (--cache-disk): None when the
        store is off or nothing is loaded; a failure is told to `fault` and costs only the prefixes."""
        if self._store is None or self.backend is None:
            return None
        if self.backend.engine.file_gone:  # removed (localgen rm) or replaced while loaded: said once a load
            if self._told_gone is not self.backend:
                self._told_gone = self.backend
                self._log.warning(f"{self.name}: its model file is gone or changed since it loaded: its prefixes "
                                  "are not kept on disk until it loads again")
            return None
        import hashlib

        try:
            # a slot's saved state holds its KV layout's streams: llama.cpp refuses it in the other layout
            # (--kv-unified makes the throughput scheduler's slots one pool; --exact keeps a stream per slot)
            pool = "|one pool" if self.pc is not None and self.pc.one_pool else ""
            identity = f"{self.backend.engine.identity}|{self.parallel}|{self.n_ctx}{pool}"
            key = hashlib.sha256(identity.encode("utf-8", "surrogateescape")).hexdigest()[:24]  # a path not UTF-8 too
            return act(self._store, key, identity)
        except Exception as e:
            self._fault(e, "keeping the prompt cache on disk")
            return None

    def keep_prefixes(self, final: bool = False) -> None:
        """Write what the slots and the prompt cache hold to the prefix store: at a clean stop (`final`), and
        while idle at most every KEEP_EVERY_S, so that a crash loses little."""
        if self.pc is None or self._store is None:
            return
        if not final and time.monotonic() - self._kept_at < KEEP_EVERY_S:
            return
        self._kept_at = time.monotonic()
        pc = self.pc
        with self.lock:
            written = self._with_store(lambda store, key, ident: pc.slots.keep(store, key, ident)) or 0
        if final and written:
            self._log.event("prefixes", self.name, f"{self.name}: kept {format_bytes(written)} of prefixes for "
                            "the next start", bytes=written)

    def expires(self, busy: bool) -> float | None:
        """When the model unloads if no request comes (a Unix time), None for never (keep-alive -1): the
        keep-alive from the last request's end, read now (not at the last idle tick: a request that ended since,
        or set another keep-alive, counts); while requests run (`busy`), the keep-alive from now."""
        if self.keep_alive < 0:
            return None
        idle = 0.0 if busy else time.monotonic() - self.idle_since
        return time.time() + self.keep_alive - idle

    def _maybe_unload(self) -> None:
        if self.backend is not None and 0 <= self.keep_alive <= time.monotonic() - self.idle_since:
            self.unload("idle")

    def unload(self, reason: str = "asked", evicted_for: str | None = None, why: str | None = None) -> None:
        """Free the model (it loads again on the next job), its prefixes written to the store first (warm
        reloads). Only the worker's thread calls this (or anyone, once that thread has ended). `reason`:
        "idle" (keep-alive), "asked", "evicted" (for `evicted_for`), "taken" (taken away: `why`, "NAME changed on
        disk")."""
        with self.lock:
            was_loaded = self.backend is not None
            if self.sched is not None:
                self.sched.close()
                self.sched = None
            if self.pc is not None:
                pc = self.pc
                self._with_store(lambda store, key, ident: pc.slots.keep(store, key, ident))
                if pc.slots.host is not None:  # what its prompt cache counted goes on in the totals
                    self._disk_hits += pc.slots.host.disk_loads
                    self._disk_hit_tokens += pc.slots.host.disk_loaded_tokens
                self._calls += pc.steps
                self._rows += pc.rows
                pc.close()
                self.pc = None
            if self.backend is not None:
                self.backend.close()
                self.backend = None
            self.vram_bytes = 0
            self.embeddings = 0  # counted again with the next load that needs it
        if self._residency is not None:
            self._residency.released(self.tenant, evicted=reason == "evicted")
        if not was_loaded:
            return
        if reason == "evicted":
            self._log.event("evict", self.name, f"unloaded {self.name} to make room for {evicted_for}",
                            reason=reason, evicted_for=evicted_for)
        else:
            said = "idle for its keep-alive" if reason == "idle" else why if reason == "taken" and why else "asked"
            self._log.event("unload", self.name, f"unloaded {self.name} ({said})", reason=reason)

    def steps(self) -> tuple[int, int]:
        """Decode calls and the rows they carried, over every load of this model."""
        pc = self.pc
        return self._calls + (pc.steps if pc else 0), self._rows + (pc.rows if pc else 0)

    def disk_hits(self) -> tuple[int, int]:
        """Requests that started from a prefix read back from disk, and the prompt tokens it spared them, over
        every load of this model."""
        pc = self.pc
        host = pc.slots.host if pc is not None else None
        return ((host.disk_loads if host else 0) + self._disk_hits,
                (host.disk_loaded_tokens if host else 0) + self._disk_hit_tokens)

    def settings(self) -> dict[str, Any] | None:
        """The loaded model's tunable load settings: each one's value and where it came from (flag, tuning
        record, rule); None while nothing is loaded."""
        backend = self.backend
        if backend is None:
            return None
        from localgen.tuning import TUNABLE

        eng = backend.engine
        return {k: {"value": getattr(eng.params, k), "from": eng.origins.get(k, "default")} for k in TUNABLE}


def _import_decode_path() -> None:
    """Import now, at a load, the modules that decoding imports on first use (the pick's logits view, drafting,
    a slot's context): a first request that imported one while a flood of connections had taken every file
    descriptor failed with a 500 (`Too many open files` on a module's file)."""
    import numpy.ctypeslib  # noqa: F401  (native/lib.py's logits_row: np.ctypeslib.as_array)

    import localgen.engine.speculative
    import localgen.native.context  # noqa: F401
