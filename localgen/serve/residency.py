"""Which models stay loaded (#43): before a model loads, its worker asks for room. The room is a count of
models (--max-models) and a memory budget (--max-memory) set against each model's footprint, estimated from
its GGUF header (models/footprint.py: weights, KV cache for its slots, compute and output buffers). When the
model does not fit beside those loaded, the least recently used idle one that was not pinned with -m is
unloaded; a model with jobs queued or running is never evicted: the load waits for one to finish (up to
`wait_s`, then a 503). A model that could not fit even alone is an error naming what it needs."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from localgen.errors import LocalgenError
from localgen.units import format_bytes


class NoRoom(LocalgenError):
    """No model can make room now: each loaded one is pinned or busy (a 503: try again)."""


class TooBig(LocalgenError):
    """The model needs more than the whole budget."""


@dataclass
class Residency:
    """The loaded models' footprints, and the rules for making room."""

    budget: int  # bytes for every loaded model together
    max_models: int
    wait_s: float = 120.0  # how long a load waits for a busy model to become evictable
    loads: int = 0
    evictions: int = 0
    _loaded: dict[Any, int] = field(default_factory=dict)  # worker → its estimated bytes
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def admit(self, worker: Any, need: int) -> None:
        """Block until `worker` (about to load, needing `need` bytes) has room, unloading idle models to make
        it; NoRoom after wait_s with every other model busy or pinned, TooBig when it never could fit."""
        if need > self.budget:
            raise TooBig(f"{worker.name} needs about {format_bytes(need)} (weights, KV cache and buffers); the "
                         f"budget for loaded models is {format_bytes(self.budget)}",
                         hint="raise serve's --max-memory, or lower --ctx or --parallel")
        deadline = time.monotonic() + self.wait_s
        while True:
            with self._cond:
                if self._fits(need):
                    self._loaded[worker] = need
                    self.loads += 1
                    return
                victim = self._victim(worker)
                if victim is None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        busy = ", ".join(w.name for w in self._loaded)
                        raise NoRoom(f"no room to load {worker.name}: the models loaded ({busy}) are pinned or "
                                     f"busy, and {self.max_models} model(s) or {format_bytes(self.budget)} is the "
                                     "most held at once")
                    self._cond.wait(min(left, 0.5))
                    continue
            if victim.request_unload().wait(timeout=max(0.0, deadline - time.monotonic())):
                with self._cond:
                    self.evictions += 1

    def _fits(self, need: int) -> bool:
        return len(self._loaded) < self.max_models and sum(self._loaded.values()) + need <= self.budget

    def _victim(self, asking: Any) -> Any:
        """The least recently used loaded model that is not pinned and has no job queued or running."""
        idle = [w for w in self._loaded if w is not asking and not w.pinned and not w.busy]
        return min(idle, key=lambda w: w.last_used) if idle else None

    def released(self, worker: Any) -> None:
        """The worker has freed its model."""
        with self._cond:
            if self._loaded.pop(worker, None) is not None:
                self._cond.notify_all()

    def status(self) -> dict[str, Any]:
        """For /health: the budget, what is held, and the counts."""
        with self._cond:
            held = sum(self._loaded.values())
            return {"max_models": self.max_models, "budget_bytes": self.budget, "held_bytes": held,
                    "loaded": sorted(w.name for w in self._loaded), "loads": self.loads, "evictions": self.evictions}


def default_budget(offload: bool) -> int:
    """--max-memory's default: this machine's memory (RAM, and with offload its GPUs'), less a tenth for the
    rest of the system."""
    from localgen import hardware

    total = hardware.total_ram_bytes() or 0
    if offload:
        total += sum(g.total for g in hardware.gpus() if not g.unified)  # unified memory is the RAM
    return int(total * 0.9)
