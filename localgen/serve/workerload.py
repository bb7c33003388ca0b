"""A served model's residence: loading it (after serve's residency made room), its prompt cache kept on disk
(engine/prefixstore.py: written at an unload, a clean stop and while idle, read back at a load), and
unloading it when idle or asked, each load and unload logged. Part of ModelWorker (serve/worker.py), whose
thread alone calls these, so nothing frees a model under a running decode."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from localgen.types import LoadParams, ModelRef
from localgen.units import format_bytes

KEEP_EVERY_S = 60.0  # while idle, what the slots hold is written to the prefix store at most this often


class Residence:
    """ModelWorker's loading and unloading; the attributes are ModelWorker's (set in its __init__)."""

    ref: ModelRef
    name: str
    load: LoadParams
    parallel: int
    exact: bool | None
    share_prefixes: bool
    cache_ram: int
    warn: Callable[[str], None]
    residency: Any
    thread: threading.Thread
    lock: threading.Lock
    keep_alive: float
    need: int
    backend: Any
    pc: Any
    mode: Any
    sched: Any
    n_ctx: int
    store: Any
    warm_restored: int
    log: Any
    outstanding: int
    _kept_at: float
    disk_hits_before: int
    disk_hit_tokens_before: int
    vram_bytes: int
    placement: dict[str, Any]
    idle_since: float
    expires_at: float | None
    calls: int
    rows: int

    def _internal(self, e: BaseException, where: str) -> None:
        raise NotImplementedError  # ModelWorker's: logged, counted

    def _ensure_loaded(self) -> None:
        if self.backend is not None:
            return
        from localgen.engine.scheduler import Scheduler
        from localgen.serve.model import footprint, open_model

        self.need = footprint(self.ref, self.load, self.parallel)
        waited = self.residency.admit(self, self.need) if self.residency is not None else 0.0
        t0 = time.perf_counter()
        try:
            backend, pc, mode = open_model(self.ref, self.load, self.parallel, self.exact, self.share_prefixes,
                                           self.cache_ram, self.warn, warm=threading.current_thread() is self.thread)
        except BaseException:
            if self.residency is not None:
                self.residency.released(self, failed=True)
            raise
        self.backend, self.pc, self.mode = backend, pc, mode
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
        self.log.event("load", self.name, f"loaded {self.name} in {seconds:.1f} s (about {format_bytes(self.need)}"
                       f"{waited_text}; {restored} stored prefix{'es' * (restored != 1)} read back)",
                       seconds=round(seconds, 3), bytes=self.need, waited_s=round(waited, 3),
                       prefixes_restored=restored)

    def _with_store(self, act: Callable[[Any, str, str], Any]) -> Any:
        """`act(store, key, identity)` on this model's part of the prefix store (--cache-disk): None when the
        store is off or nothing is loaded; a failure is logged and costs only the prefixes."""
        if self.store is None or self.backend is None:
            return None
        import hashlib

        try:
            identity = f"{self.backend.engine.identity}|{self.parallel}|{self.n_ctx}"
            return act(self.store, hashlib.sha256(identity.encode()).hexdigest()[:24], identity)
        except Exception as e:
            self._internal(e, "keeping the prompt cache on disk")
            return None

    def _keep_prefixes(self, final: bool = False) -> None:
        """Write what the slots and the prompt cache hold to the prefix store: at a clean stop (`final`), and
        while idle at most every KEEP_EVERY_S, so that a crash loses little."""
        if self.pc is None or self.store is None:
            return
        if not final and time.monotonic() - self._kept_at < KEEP_EVERY_S:
            return
        self._kept_at = time.monotonic()
        pc = self.pc
        with self.lock:
            written = self._with_store(lambda store, key, ident: pc.slots.keep(store, key, ident)) or 0
        if final and written:
            self.log.event("prefixes", self.name, f"{self.name}: wrote {format_bytes(written)} of prefixes for the "
                           "next start", bytes=written)

    def expires(self) -> float | None:
        """When the model unloads if no request comes (a Unix time), None for never (keep-alive -1); while
        requests run, at least the keep-alive from now."""
        if self.keep_alive < 0:
            return None
        if self.expires_at is not None and self.outstanding == 0:
            return self.expires_at
        return time.time() + self.keep_alive

    def _maybe_unload(self) -> None:
        if self.backend is None:
            self.expires_at = None
            return
        if self.keep_alive < 0:
            self.expires_at = None
            return
        self.expires_at = time.time() + self.keep_alive - (time.monotonic() - self.idle_since)
        if time.monotonic() - self.idle_since >= self.keep_alive:
            self._unload("idle")

    def _unload(self, reason: str = "asked", evicted_for: str | None = None) -> None:
        """Free the model (it loads again on the next job), its prefixes written to the store first (warm
        reloads). Only the worker thread calls this (or anyone, once that thread has ended). `reason`:
        "idle" (keep-alive), "asked", "evicted" (for `evicted_for`)."""
        with self.lock:
            was_loaded = self.backend is not None
            if self.sched is not None:
                self.sched.close()
                self.sched = None
            if self.pc is not None:
                pc = self.pc
                self._with_store(lambda store, key, ident: pc.slots.keep(store, key, ident))
                if pc.slots.host is not None:  # what its prompt cache counted goes on in the worker's totals
                    self.disk_hits_before += pc.slots.host.disk_loads
                    self.disk_hit_tokens_before += pc.slots.host.disk_loaded_tokens
                self.calls += self.pc.steps
                self.rows += self.pc.rows
                self.pc.close()
                self.pc = None
            if self.backend is not None:
                self.backend.close()
                self.backend = None
            self.expires_at = None
            self.vram_bytes = 0
        if self.residency is not None:
            self.residency.released(self, evicted=reason == "evicted")
        if not was_loaded:
            return
        if reason == "evicted":
            self.log.event("evict", self.name, f"unloaded {self.name} to make room for {evicted_for}",
                           reason=reason, evicted_for=evicted_for)
        else:
            why = "idle for its keep-alive" if reason == "idle" else "asked"
            self.log.event("unload", self.name, f"unloaded {self.name} ({why})", reason=reason)
