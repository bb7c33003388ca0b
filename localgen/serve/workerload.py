"""A served model's residence: loading it (after serve's residency made room), its warm reloads, and
unloading it when idle or asked. Part of ModelWorker (serve/worker.py), whose thread alone calls these, so
nothing frees a model under a running decode."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from localgen.types import LoadParams, ModelRef


class Residence:
    """ModelWorker's loading and unloading; the attributes are ModelWorker's (set in its __init__)."""

    ref: ModelRef
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
    warm_dir: Any
    warm_restored: int
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
        if self.residency is not None:
            self.residency.admit(self, self.need)
        try:
            backend, pc, mode = open_model(self.ref, self.load, self.parallel, self.exact, self.share_prefixes,
                                           self.cache_ram, self.warn, warm=threading.current_thread() is self.thread)
        except BaseException:
            if self.residency is not None:
                self.residency.released(self)
            raise
        self.backend, self.pc, self.mode = backend, pc, mode
        self.sched = Scheduler(pc, mode.exact, reuse=True, interleave=True)
        self.n_ctx = backend.engine.n_ctx
        self._warm(lambda folder: setattr(self, "warm_restored", pc.slots.restore(folder)))
        self.vram_bytes = backend.engine.gpu_weight_bytes()
        self.placement = backend.engine.load_report.record()
        self.idle_since = time.monotonic()

    def _warm(self, act: Callable[[Any], Any]) -> None:
        """Warm reloads: `act` on this model's folder (its prompt cache written there as it unloads, read back
        as it loads again); a failure is logged and costs only the warmth."""
        if self.warm_dir is None or self.backend is None:
            return
        import hashlib
        from pathlib import Path

        try:
            key = f"{self.backend.engine.identity}|{self.parallel}|{self.n_ctx}"
            act(Path(self.warm_dir) / hashlib.sha256(key.encode()).hexdigest()[:24])
        except Exception as e:
            self._internal(e, "keeping the prompt cache across a reload")

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
                pc = self.pc
                self._warm(lambda folder: pc.slots.persist(folder))
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
            self.residency.released(self)
