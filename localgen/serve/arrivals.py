"""Bursts of requests, evaluated together. llama-server's C++ threads read a burst of requests at once;
serve's event loop reads them one after another, so a burst's first step began with the first one or two, and
the rest were evaluated in the next steps while the first streams waited: their second token came only after
the others' prompts (docs/benchmarks.md, "A burst of requests").

So a model's thread, about to begin a burst (the throughput scheduler holds requests and has run nothing since
it was last idle), waits a moment, at most BURST_S from the first step it could have taken, while:
- requests are being read (Arrivals: a POST counts from the moment serve/app.py's FrontDoor takes it until the
  first of: its first job is submitted to a model, its response begins, it ends, BURST_S has passed); the count
  is the whole server's, so a request for another model, or one that is slow to hand on (an upload, a remote
  model's answer), delays a burst only if it came in the last BURST_S;
- or bursts come to this model (the last one had company: more than one request waiting at its first step, or
  a job that came within BURST_S after that step while the model had others) and its last job came less than
  QUIET_S ago: requests still on their way through the event loop are not counted yet. A lone request after a
  burst waits QUIET_S once; after it, none wait, nor do a client's requests sent one after another.
A model that is already working never waits: requests queued behind full slots start as slots free up."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

BURST_S = 0.1  # the longest a burst's first step waits for the requests still coming
QUIET_S = 0.01  # with bursts coming, a burst begins once no job has come for this long


class Arrivals:
    """The requests being read and not yet handed to a model, each with when it came (thread-safe)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.cond = threading.Condition()  # notified whenever one is handed on (Bursts waits on it)
        self.clock = clock
        self._since: dict[Arrival, float] = {}

    def enter(self) -> Arrival:
        """A request being read from now on."""
        arrival = Arrival(self)
        with self.cond:
            self._since[arrival] = self.clock()
        return arrival

    @property
    def coming(self) -> int:
        """How many came less than BURST_S ago and are still being read."""
        with self.cond:
            now = self.clock()
            return sum(now - t < BURST_S for t in self._since.values())

    @property
    def held(self) -> int:
        """How many are being read, however long ago they came."""
        return len(self._since)

    def _leave(self, arrival: Arrival) -> None:
        with self.cond:
            if self._since.pop(arrival, None) is not None:
                self.cond.notify_all()


class Arrival:
    """One request's place in the count; `done` gives it up (once, whoever calls it first)."""

    def __init__(self, arrivals: Arrivals) -> None:
        self._arrivals = arrivals

    def done(self) -> None:
        self._arrivals._leave(self)


ARRIVALS = Arrivals()  # the server's (one `serve` a process; servers made in tests share it: a bounded wait)


class Bursts:
    """One model's bursts: `came` for each job submitted (any thread), `hold` before each step (its thread)."""

    def __init__(self, arrivals: Arrivals = ARRIVALS, clock: Callable[[], float] = time.monotonic) -> None:
        self.arrivals = arrivals
        self.clock = clock
        self.company = False  # the last burst had more than one job: the next is waited for too
        self.resting = True  # no step since the scheduler was last idle: its next step begins a burst
        self.began: float | None = None  # the waiting burst's first `hold`
        self.stepped = float("-inf")  # when the last burst's first step began
        self.last_job = float("-inf")  # when the last job came

    def came(self, others: bool) -> None:
        """A job was submitted; `others`: the model had other jobs then. One that came while others ran, less
        than BURST_S after a burst began, says that burst had company (not a client's next request, sent once
        its last had ended)."""
        with self.arrivals.cond:
            now = self.clock()
            self.last_job = now
            if others and now - self.stepped < BURST_S:
                self.company = True
            self.arrivals.cond.notify_all()

    def rested(self) -> None:
        """The scheduler is idle: its next step begins a burst (the model's thread)."""
        self.resting = True

    def hold(self, fresh: bool, jobs: int) -> bool:
        """Whether to wait before this step (and waits a little: at most until QUIET_S after the last job, a
        poll's 0.01 s, or the burst's end); then the caller takes the jobs that came and asks again. `fresh`:
        the scheduler runs nothing (Scheduler.fresh); `jobs`: the requests waiting in it."""
        if not fresh or not self.resting:  # running, or slots that all ended in one step: no burst begins
            self.began = None
            return False
        with self.arrivals.cond:
            now = self.clock()
            if self.began is None:
                self.began = now
            end = self.began + BURST_S
            quiet = self.last_job + QUIET_S if self.company else float("-inf")
            coming = self.arrivals.coming
            if now < end and (coming or now < quiet):
                until = min(end, now + 0.01) if coming else min(end, quiet)
                self.arrivals.cond.wait(until - now)
                return True
            self.began = None
            self.resting = False
            self.stepped = now
            self.company = jobs > 1
            return False
