"""Which models stay loaded (#43): before a model loads, its worker asks for room. The room is a count of
models (--max-models) and a memory budget (--max-memory) set against each model's footprint, estimated from
its GGUF header (models/footprint.py: weights, KV cache for its slots, compute and output buffers). When the
model does not fit beside those loaded, the least recently used idle one that was not pinned with -m is
unloaded; a model with jobs queued or running is never evicted: the load waits for one to finish (up to
`wait_s`, then a 503), and meanwhile that model takes no new jobs (a fair swap: below). A model that could not
fit even alone is an error naming what it needs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from localgen.errors import Cancelled, LocalgenError
from localgen.serve.servelog import STDERR_LOG, ServeLog
from localgen.units import format_bytes


class Tenant(Protocol):
    """A model's worker, as the residency sees it: what it weighs when making room, and how it asks a model
    to make room."""

    @property
    def name(self) -> str: ...

    @property
    def pinned(self) -> bool: ...  # never unloaded to make room (serve -m)

    @property
    def last_used(self) -> float: ...  # the last job's arrival (time.monotonic): the least recent goes first

    @property
    def evictable(self) -> bool: ...  # unloading it now costs no request

    def yield_to(self, name: str) -> None:
        """Take no new jobs until resume(name): `name` waits for this model's room. The jobs it had already run
        (those waiting for its own load among them), then it is evictable."""

    def resume(self, name: str) -> None:
        """Take jobs again."""

    def request_unload(self, reason: str = "asked", evicted_for: str | None = None) -> threading.Event:
        """Free the model once no job runs; the event is set once it has."""


class NoRoom(LocalgenError):
    """No model can make room now: each loaded one is pinned or busy (a 503: try again)."""


class Abandoned(Cancelled):
    """Every client that asked for a load left while it waited for room (a 499: nobody reads the answer)."""


class TooBig(LocalgenError):
    """The model needs more than the whole budget."""


@dataclass
class Residency:
    """The loaded models' footprints, and the rules for making room. Loads are admitted first come, first
    served: a model waiting for room is not passed by one asked for later. While the first waits, the least
    recently used unpinned model that is busy takes no new requests (they wait behind the swap, in its
    queue) and is evicted as soon as the requests it had already end (a model asked while it loads runs those
    that waited for its load): traffic to a loaded model cannot starve a request for another (a fair swap)."""

    budget: int  # bytes for every loaded model together
    max_models: int
    wait_s: float = 120.0  # how long a load waits for a busy model to become evictable
    log: ServeLog = STDERR_LOG
    loads: int = 0
    evictions: int = 0
    unloads: int = 0  # models freed other than to make room (idle, asked, a preset replaced or deleted)
    swaps_waited: int = 0  # loads that waited for a busy model to yield
    _loaded: dict[Tenant, int] = field(default_factory=dict)  # worker → its estimated bytes
    _waiting: list[Tenant] = field(default_factory=list)  # workers waiting for room, first come first
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def admit(self, worker: Tenant, need: int, wanted: Callable[[], bool] = lambda: True,
              patient: bool = True) -> float:
        """Block until `worker` (about to load, needing `need` bytes) has room, unloading idle models to make
        it (and asking a busy one to yield: fair swaps); NoRoom after wait_s with every other model busy or
        pinned (at once when not `patient` and every other is pinned: serve's start, where -m pins every model
        it loads and nothing would ever make room), TooBig when it never could fit, Abandoned as soon as
        `wanted()` is false (every client that asked for the load has left), before anything more is evicted
        for it. The seconds it waited."""
        if need > self.budget:
            raise TooBig(f"{worker.name} needs about {format_bytes(need)} (weights, KV cache and buffers); the "
                         f"budget for loaded models is {format_bytes(self.budget)}",
                         hint="raise serve's --max-memory, or lower --ctx or --parallel")
        t0 = time.monotonic()
        deadline = t0 + self.wait_s
        yielding: Tenant | None = None  # the busy model asked to yield its room to this one
        with self._cond:
            self._waiting.append(worker)
        try:
            while True:
                if not wanted():
                    raise Abandoned(f"nobody waits for {worker.name} any more: its clients left before it had room")
                with self._cond:
                    first = self._waiting[0] is worker
                    if first and self._fits(need):
                        self._loaded[worker] = need
                        self.loads += 1
                        return time.monotonic() - t0
                    victim = self._victim(worker) if first else None
                    if victim is None:
                        if first and yielding is None:
                            yielding = self._yielder(worker)
                            if yielding is None and not patient:
                                pinned = ", ".join(w.name for w in self._loaded)
                                raise NoRoom(f"no room to load {worker.name} beside {pinned}: -m pins each model "
                                             f"it names, and {self._most} or "
                                             f"{format_bytes(self.budget)} is the most held at once",
                                             hint="raise --max-models or --max-memory, or name fewer models "
                                                  "with -m")
                        left = deadline - time.monotonic()
                        if left <= 0:
                            busy = ", ".join(w.name for w in self._loaded)
                            raise NoRoom(f"no room to load {worker.name}: the models loaded ({busy}) are pinned "
                                         f"or busy, and {self._most} or {format_bytes(self.budget)} "
                                         "is the most held at once")
                        self._cond.wait(min(left, 0.25))
                        continue
                if yielding is not victim:  # it takes no new job meanwhile: one that came would delay the unload
                    victim.yield_to(worker.name)
                    if yielding is not None:
                        yielding.resume(worker.name)
                    yielding = victim
                unloaded = victim.request_unload("evicted", worker.name)
                while not unloaded.wait(timeout=min(0.25, max(0.0, deadline - time.monotonic()))):
                    if time.monotonic() >= deadline or not wanted():
                        break
        finally:
            with self._cond:
                self._waiting.remove(worker)
                self._cond.notify_all()
            if yielding is not None:
                yielding.resume(worker.name)

    def grow(self, worker: Tenant, more: int, wanted: Callable[[], bool] = lambda: True) -> float:
        """A loaded `worker` needs `more` bytes than it was admitted with (an embeddings context made on demand):
        room made by the rules of admit, for what it holds and the more together, and the same errors (the
        worker keeps what it held when it cannot grow). The seconds it waited."""
        with self._cond:
            held = self._loaded.pop(worker, None)
            if held is None:
                return 0.0
            self.loads -= 1  # admit counts a load: this is none
        try:
            return self.admit(worker, held + more, wanted)
        except BaseException:
            with self._cond:
                self._loaded[worker] = held
                self.loads += 1
            raise

    def room_for(self, need: int) -> bool:
        """Whether a model of `need` bytes would load now without unloading another (none waits before it)."""
        with self._cond:
            return not self._waiting and self._fits(need)

    @property
    def _most(self) -> str:
        """The most models held at once, in words ("1 model", "3 models")."""
        return f"{self.max_models} model{'' if self.max_models == 1 else 's'}"

    def _fits(self, need: int) -> bool:
        return len(self._loaded) < self.max_models and sum(self._loaded.values()) + need <= self.budget

    def _victim(self, asking: Tenant) -> Tenant | None:
        """The least recently used loaded model that is not pinned and has no job queued or running (or, asked
        to yield, none running)."""
        idle = [w for w in self._loaded if w is not asking and not w.pinned and w.evictable]
        return min(idle, key=lambda w: w.last_used) if idle else None

    def _yielder(self, asking: Tenant) -> Tenant | None:
        """Ask the least recently used unpinned loaded model to take no new jobs, so that its running ones end
        and it can be evicted for `asking` (None when every loaded model is pinned). Logged."""
        busy = [w for w in self._loaded if w is not asking and not w.pinned]
        if not busy:
            return None
        w = min(busy, key=lambda w: w.last_used)
        w.yield_to(asking.name)
        self.swaps_waited += 1
        self.log.event("swap", asking.name, f"{asking.name} waits for room: {w.name} takes no new requests "
                       f"until its running ones end, then unloads (at most {self.wait_s:g} s)",
                       yielding=w.name, wait_limit_s=self.wait_s)
        return w

    def released(self, worker: Tenant, evicted: bool = False, failed: bool = False) -> None:
        """The worker has freed its model (`evicted`: to make room for another), or its load failed (`failed`:
        it never was a load). Each load ends once: loads = loaded + evictions + unloads."""
        with self._cond:
            if self._loaded.pop(worker, None) is not None:
                if failed:
                    self.loads -= 1
                elif evicted:
                    self.evictions += 1
                else:
                    self.unloads += 1
                self._cond.notify_all()

    def status(self) -> dict[str, Any]:
        """For /health: the budget, what is held, and the counts."""
        with self._cond:
            held = sum(self._loaded.values())
            return {"max_models": self.max_models, "budget_bytes": self.budget, "held_bytes": held,
                    "loaded": sorted(w.name for w in self._loaded), "loads": self.loads, "evictions": self.evictions,
                    "unloads": self.unloads,
                    "waiting": [w.name for w in self._waiting], "swaps_waited": self.swaps_waited}


def default_budget(offload: bool) -> int:
    """--max-memory's default: this machine's memory (RAM, and with offload its GPUs'), less a tenth for the
    rest of the system; on Apple Silicon with offload, no more than Metal may use (hardware.metal_budget)."""
    from localgen import hardware

    total = hardware.total_ram_bytes() or 0
    gpus = hardware.gpus() if offload else []
    total += sum(g.total or 0 for g in gpus if not g.unified)  # unified memory is the RAM
    metal = [g.total for g in gpus if g.unified and g.total]
    return min([int(total * 0.9), *metal])
