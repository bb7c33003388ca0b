"""A served model's record of its internal errors: each a bug or a fault of the server, never the client's (a
client's error is only its answer: serve/jobs.py's `failed`). Each is counted, the last one named for /health,
and logged with its traceback to the server's log (serve/servelog.py). The worker and its Residence report
to the one record of their model."""

from __future__ import annotations

import contextlib
import traceback

from localgen.errors import LocalgenError
from localgen.serve.jobs import EmbedJob, Job, failed
from localgen.serve.servelog import ServeLog


class Faults:
    """One model's internal errors: how many, the last, each logged."""

    def __init__(self, name: str, log: ServeLog) -> None:
        self.name = name
        self.log = log
        self.count = 0  # internal errors (/health's failed_jobs)
        self.last: str | None = None  # the last one: where, and its type

    def internal(self, e: BaseException, where: str) -> None:
        """An error that is a bug or a fault, not the client's: counted, and logged with its traceback."""
        self.count += 1
        self.last = f"{where}: {type(e).__name__}"
        text = "".join(traceback.format_exception(e)).rstrip()
        with contextlib.suppress(OSError, ValueError):  # no stderr left to log to
            self.log.error(f"localgen serve: {self.name}: internal error while {where}", text, self.name)

    def fail(self, job: Job | EmbedJob, e: BaseException, where: str) -> None:
        """The job fails alone with `e`; an error other than a LocalgenError is a fault, recorded too."""
        if not isinstance(e, LocalgenError):
            self.internal(e, where)
        job.send(failed(e))
