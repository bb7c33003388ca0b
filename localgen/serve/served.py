"""What a request's handler may use of a served model (serve/worker.py's ModelWorker implements it): its
name, model and window, a job queued on its thread, how long it stays loaded, and an unload asked for.
Handlers see this, never the worker's thread, slots or scheduler."""

from __future__ import annotations

import threading
from typing import Protocol

from localgen.serve.jobs import EmbedJob, Job
from localgen.types import ModelRef


class Served(Protocol):
    """A model being served, as its handlers see it."""

    keep_alive: float  # seconds it stays loaded once idle (< 0: never unloaded); Ollama's keep_alive sets it

    @property
    def name(self) -> str: ...

    @property
    def ref(self) -> ModelRef: ...

    @property
    def n_ctx(self) -> int: ...  # a slot's window in tokens (the loaded model's, else the one it will load with)

    @property
    def busy(self) -> bool: ...  # a job runs or waits

    @property
    def loaded(self) -> bool: ...  # the model is in memory now

    def submit(self, job: Job | EmbedJob) -> None:
        """Queue a job on the model's thread (QueueFull, Retired while its model is being deleted or replaced, or a
        LocalgenError when the worker has stopped)."""

    def request_unload(self, reason: str = "asked", evicted_for: str | None = None,
                       by_keep_alive: float | None = None) -> threading.Event:
        """Free the model once no job runs; the event is set once it has. `by_keep_alive`: asked by a request's
        keep_alive 0 at that time (time.perf_counter), which a later request's keep-alive takes back."""
