"""The jobs a model's worker has taken and not ended: one table, by id in order of arrival, each job in its
State (serve/jobs.py). Which jobs wait, run or are held is read from it, and from nothing else. The handlers'
threads add to it, the worker's thread reads it, and a job's end (on whichever thread sends its last event)
takes it out."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

from localgen.serve.jobs import WAITING, EmbedJob, Job, State


def left(job: Job | EmbedJob) -> bool:
    """A job whose client left while it waited for a slot: its worker ends it at its next step (a 499), but it no
    longer holds a place in the queue (the bound on it, its depth in /metrics and /health)."""
    return job.state in WAITING and job.cancelled.is_set()


class LiveJobs:
    """The live jobs of one worker, numbered as they come (the number is the scheduler's job id)."""

    def __init__(self) -> None:
        self._jobs: dict[int, Job | EmbedJob] = {}  # by id: a dict keeps the order of arrival
        self._lock = threading.Lock()  # the handlers' threads, the worker's and the event loop's (fail_all)
        self._ids = itertools.count(1)

    def add(self, job: Job | EmbedJob, bound: int) -> bool:
        """Number the job and take it in, unless `bound` jobs hold a place already, or twice `bound` are live
        (jobs whose client left stay here until the worker's next step, each holding its request: False, and no
        number)."""
        with self._lock:
            if len(self._jobs) >= 2 * bound or (len(self._jobs) >= bound and self._holding() >= bound):
                return False
            job.id = next(self._ids)
            self._jobs[job.id] = job
            return True

    def end(self, job: Job | EmbedJob, when_empty: Callable[[], None]) -> None:
        """Take out a job that has ended; `when_empty` is told, before another job can come in, if it was the
        last."""
        with self._lock:
            self._jobs.pop(job.id, None)
            if not self._jobs:
                when_empty()

    def get(self, job_id: int) -> Job | EmbedJob | None:
        """The live job of that id, if it has not ended."""
        with self._lock:
            return self._jobs.get(job_id)

    def of(self, *states: State) -> list[Job | EmbedJob]:
        """The live jobs in these states (every live one with none), in order of arrival."""
        with self._lock:
            return [j for j in self._jobs.values() if not states or j.state in states]

    def __len__(self) -> int:
        return len(self._jobs)

    def holding(self) -> int:
        """The live jobs that hold a place: running, or waiting for a client still there (not `left`)."""
        with self._lock:
            return self._holding()

    def _holding(self) -> int:  # (the lock held)
        return sum(not left(j) for j in self._jobs.values())
