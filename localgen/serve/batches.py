"""OpenAI's Batch API: `POST /v1/batches` (an uploaded file of requests, one JSON line each, for one endpoint),
`GET /v1/batches` (newest first), `GET /v1/batches/{id}` and `POST /v1/batches/{id}/cancel`; the Files API
beside it (serve/files.py) holds the input and the results. Each batch is a folder in the data dir's
`batches/runs/`: `batch.json` (OpenAI's Batch object, written atomically at each change of status),
`output.jsonl` and `errors.jsonl` (one line appended and synced per request answered: a 2xx answer to the
output, any other to the errors). Those two files are what has been done: a `serve` started again counts them
(a line cut short by a crash is dropped), and serve/batchrun.py's runner goes on with the requests they do not
answer yet, so a finished request is never run twice or lost.

A batch's lines are all checked before any runs (serve/batchinput.py); a file that is not so makes the batch
`failed`, with OpenAI's `errors.data`.
Only one server runs a data dir's batches: the first to use them holds `batches/lock` while it runs; another
answers these routes with 503."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localgen import paths
from localgen.serve import files
from localgen.serve.apierror import HTTPError
from localgen.serve.batchinput import MAX_LINE, input_gone, validate
from localgen.serve.jsonbody import read_json
from localgen.serve.responsestore import check_metadata
from localgen.serve.routing import by_method
from localgen.serve.stalls import DEFAULT_READ_TIMEOUT_S

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
WINDOWS = ("24h",)  # OpenAI's only completion_window; here a batch runs until it is done or cancelled
RUNNING = ("validating", "in_progress", "finalizing", "cancelling")  # the statuses of a batch not ended
STATUSES = (*RUNNING, "completed", "failed", "cancelled")  # OpenAI's, but "expired": nothing expires here
MAX_BATCHES_LISTED = 100  # GET /v1/batches' largest `limit` (its default: 20)
UPLOADS = files.UPLOADS  # the paths whose bodies the gate leaves to the route (serve/guard.py)
BODILESS = (r"/v1/batches/[^/]+/cancel",)  # a POST that reads no body: the gate asks for no JSON type


def default_root() -> Path:
    """Where the server keeps its batches and their files."""
    return paths.data_dir() / "batches"


def answered(path: Path, repair: bool = True) -> Iterator[dict[str, Any]]:
    """The records of a results file, whole ones only, read one line at a time (an embeddings batch's answers may
    be gigabytes): a line a crash cut short is first removed from the file (with `repair`; without, it is
    skipped: a data folder that cannot be written), so the next record starts on a line of its own."""
    if not path.exists():
        return
    with open(path, "rb+" if repair else "rb") as f:
        size = end = f.seek(0, os.SEEK_END)
        while end > 0:  # back from the end to the last newline: a torn line is all that follows it
            step = min(end, 1 << 16)
            f.seek(end - step)
            found = f.read(step).rfind(b"\n")
            if found >= 0:
                end = end - step + found + 1
                break
            end -= step
        if end < size and repair:
            f.truncate(end)
            f.flush()
            os.fsync(f.fileno())
        f.seek(0)
        for raw in f:
            if not raw.endswith(b"\n"):  # the torn line left (not repaired)
                break
            with contextlib.suppress(ValueError):
                doc = json.loads(raw)
                if isinstance(doc, dict) and isinstance(doc.get("custom_id"), str):
                    yield doc


def usage_of(body: Any) -> tuple[int, int, int, int]:
    """A 2xx answer's tokens as the Batch object counts them: input, cached input, output, reasoning (the usage
    of chat and text completions, embeddings and responses alike)."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return 0, 0, 0, 0

    def number(doc: Any, *names: str) -> int:
        for name in names:
            value = doc.get(name) if isinstance(doc, dict) else None
            if isinstance(value, int):
                return value
        return 0

    cached = number(usage.get("prompt_tokens_details") or usage.get("input_tokens_details"), "cached_tokens")
    reasoning = number(usage.get("completion_tokens_details") or usage.get("output_tokens_details"),
                       "reasoning_tokens")
    return (number(usage, "prompt_tokens", "input_tokens"), cached, number(usage, "completion_tokens",
                                                                             "output_tokens"), reasoning)


@dataclass
class Progress:
    """What a running batch has answered: its custom_ids, counts and tokens, and the results files it appends to."""

    folder: Path
    done: set[str] = field(default_factory=set)
    completed: int = 0
    failed: int = 0
    tokens: list[int] = field(default_factory=lambda: [0, 0, 0, 0])  # input, cached, output, reasoning
    appending: threading.Lock = field(default_factory=threading.Lock)  # one write() at a time: see there

    @classmethod
    def read(cls, folder: Path, repair: bool = True) -> Progress:
        """The progress its results files hold (a torn last line dropped: see answered())."""
        progress = cls(folder)
        for ok, name in ((True, "output.jsonl"), (False, "errors.jsonl")):
            for record in answered(folder / name, repair):
                progress.count(record, ok)
        return progress

    def count(self, record: dict[str, Any], ok: bool) -> None:
        """An answered request counted (on the event loop, which reads the counts)."""
        self.done.add(record["custom_id"])
        if ok:
            self.completed += 1
            body = (record.get("response") or {}).get("body")
            self.tokens = [a + b for a, b in zip(self.tokens, usage_of(body), strict=True)]
        else:
            self.failed += 1

    def write(self, record: dict[str, Any], ok: bool) -> None:
        """One answered request, appended to its file and synced (in a thread: it waits for the disk); then
        count() it. The batch's requests end in threads of their own: one appends at a time, so a short write's
        rest cannot land after another's record, nor a full disk's truncation take another's record with it."""
        line = (json.dumps(record) + "\n").encode()  # ASCII: a custom_id's lone surrogate stays an escape
        with self.appending:
            self._append("output.jsonl" if ok else "errors.jsonl", line)

    def _append(self, name: str, line: bytes) -> None:
        fd = os.open(self.folder / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_BINARY", 0), 0o600)
        try:
            start = os.fstat(fd).st_size
            try:
                view = memoryview(line)
                while view:  # one append (O_APPEND); a short write goes on where it stopped
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            except OSError:  # a full disk: no torn record left for the next one to follow on its line
                os.ftruncate(fd, start)
                raise
        finally:
            os.close(fd)

    def shown(self, doc: dict[str, Any]) -> None:
        """Its counts and tokens in the batch's object."""
        doc["request_counts"] = {"total": doc["request_counts"]["total"], "completed": self.completed,
                                 "failed": self.failed}
        given, cached, made, reasoning = self.tokens
        doc["usage"] = {"input_tokens": given, "input_tokens_details": {"cached_tokens": cached},
                        "output_tokens": made, "output_tokens_details": {"reasoning_tokens": reasoning},
                        "total_tokens": given + made}


class Desk:
    """The data dir's batches: their objects (read when this server first uses them), each running one's
    Progress, and the files; `wake` tells the runner (serve/batchrun.py) that there is work."""

    def __init__(self, root: Path | None = None, clock: Callable[[], float] = time.time) -> None:
        self.root = root or default_root()
        self.clock = clock
        self.files = files.FileStore(self.root / "files", clock)
        self.batches: dict[str, dict[str, Any]] | None = None  # by id, in order of creation; None: not owned yet
        self.progress: dict[str, Progress] = {}
        self.checking: set[str] = set()  # the batches POST /v1/batches is validating: the runner leaves them be
        self.wake = asyncio.Event()
        self.read_timeout = DEFAULT_READ_TIMEOUT_S  # serve --read-timeout, for an upload's parts
        self.max_line = MAX_LINE  # serve --max-body: a longer line could not be sent, and is not read whole
        self._lock: Any = None
        self._saving = threading.Lock()

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    def tally(self) -> tuple[dict[str, int], dict[str, int]]:
        """For /metrics: the batches by status, and their requests (total, completed, failed, and pending: those
        of batches still running not answered yet). Nothing before this server holds the data dir's batches."""
        by_status = dict.fromkeys(STATUSES, 0)
        lines = dict.fromkeys(("total", "completed", "failed", "pending"), 0)
        for doc in list((self.batches or {}).values()):  # a copy: the table changes on the event loop
            by_status[doc["status"]] = by_status.get(doc["status"], 0) + 1
            progress = self.progress.get(doc["id"])
            counts = doc["request_counts"]
            done = (progress.completed, progress.failed) if progress is not None else (counts["completed"],
                                                                                      counts["failed"])
            lines["total"] += counts["total"]
            lines["completed"] += done[0]
            lines["failed"] += done[1]
            if doc["status"] in RUNNING:
                lines["pending"] += max(0, counts["total"] - sum(done))
        return by_status, lines

    def owner(self) -> None:
        """Hold the data dir's batches (a 503 when another server does), and read them the first time: their unfinished
        ones go on at once (at start, or at the first request that takes them from a server that let them go)."""
        if self.batches is not None:
            return
        from filelock import FileLock, Timeout

        lock = FileLock(paths.private_dir(self.root) / "lock", timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise HTTPError(503, "another localgen serve on this machine runs the Batch API with the same data "
                                 "folder: send batches and files to that server", "server_error") from None
        try:
            self.files.sweep()
        except BaseException:  # (an OSError): the lock let go, so that the next request reads them all again
            lock.release()
            raise
        self._lock = lock
        # self.batches set once all are read: set before, a failure left them unread
        self.batches = self._read(self.progress, sweep=True)
        self.wake.set()  # the runner found no batches before: the unfinished ones go on at once

    def _read(self, progress: dict[str, Progress], sweep: bool) -> dict[str, dict[str, Any]]:
        """The batches on disk by id, oldest first, each running one's Progress put in `progress`; with `sweep`,
        what a crash left half-written is removed (and a torn last answer: see answered())."""
        found: dict[str, Any] = {}
        for folder in self.runs.glob("batch_*") if self.runs.is_dir() else []:
            for left in folder.glob(".*.tmp") if sweep else []:  # an object a crash left half-written
                with contextlib.suppress(OSError):
                    left.unlink()
            doc = self._batch(folder / "batch.json")
            if doc is None:  # never written (a crash as it was made), or damaged: said in the log, not hidden
                continue
            with contextlib.suppress(OSError, ValueError):
                if doc.get("status") in RUNNING:
                    progress[doc["id"]] = done = Progress.read(folder, repair=sweep)
                    done.shown(doc)
                found[doc["id"]] = doc
        return dict(sorted(found.items(), key=lambda kv: (kv[1]["created_at"], kv[0])))

    def reading(self) -> bool:
        """owner(), for a route that only reads: False where the data folder cannot be written (read-only, full: the
        lock cannot be made), and the route reads what is on disk as it is, without holding it (nothing runs; the
        next request tries to hold it again). docs/batch.md: only the routes that write answer 507 then."""
        try:
            self.owner()
        except OSError as e:
            if files.disk_fault(e) is None:
                raise
            return False
        return True

    def view(self) -> dict[str, dict[str, Any]]:
        """The batches by id, oldest first, for a route that only reads (see reading())."""
        if self.reading() and self.batches is not None:
            return self.batches
        return self._read({}, sweep=False)

    def release(self) -> None:
        """Let another server hold the batches (at shutdown)."""
        if self._lock is not None:
            self._lock.release()

    def pending(self) -> bool:
        """Whether a batch is left to run, from an earlier start: this server takes the batches at once then."""
        if not self.runs.is_dir():
            return False
        return any((doc := self._batch(path)) is not None and doc.get("status") in RUNNING
                   for path in self.runs.glob("batch_*/batch.json"))

    def _batch(self, path: Path) -> dict[str, Any] | None:
        """A batch's object, as FileStore reads a file's (None: none, or damaged, said once in the log)."""
        return self.files.read_object(path, "Batch object", "that batch")

    def save(self, doc: dict[str, Any], **changes: Any) -> None:
        """A batch's object, written atomically (its counts brought up to date first), with `changes` made to it
        once they are on disk. Saves come from threads (a cancel's request, the runner): one at a time, each of
        the object as it is then, so a slow one never lands after a later one."""
        with self._saving:
            if doc["id"] in self.progress:
                self.progress[doc["id"]].shown(doc)
            files.write_atomic(self.runs / doc["id"] / "batch.json", json.dumps({**doc, **changes}).encode())
            doc.update(changes)

    def next(self) -> dict[str, Any] | None:
        """The oldest batch not ended and not being validated by its request, or None."""
        return next((d for d in (self.batches or {}).values()
                     if d["status"] in RUNNING and d["id"] not in self.checking), None)

    def in_use(self, file_id: str) -> str | None:
        """The running batch that reads this file, if one does."""
        return next((d["id"] for d in (self.batches or {}).values()
                     if d["status"] in RUNNING and d["input_file_id"] == file_id), None)

    def now(self) -> int:
        return int(self.clock())

    def create(self, input_file_id: str, endpoint: str, window: str, metadata: Any) -> dict[str, Any]:
        """A new batch, `validating`, made durable before anything else (the caller lists it)."""
        ident = files.new_id("batch_")  # in order of creation: listed so after a restart too
        doc = {"id": ident, "object": "batch", "endpoint": endpoint, "errors": None, "input_file_id": input_file_id,
               "completion_window": window, "status": "validating", "output_file_id": None, "error_file_id": None,
               "created_at": self.now(), "in_progress_at": None, "expires_at": None, "finalizing_at": None,
               "completed_at": None, "failed_at": None, "expired_at": None, "cancelling_at": None,
               "cancelled_at": None, "request_counts": {"total": 0, "completed": 0, "failed": 0},
               "metadata": metadata, "model": None, "usage": None}
        paths.private_dir(self.runs / ident)
        self.save(doc)
        return doc

    def forget(self, ident: str) -> None:
        """Remove a batch that was not made after all (its folder, so a later start does not run it)."""
        self.progress.pop(ident, None)
        shutil.rmtree(self.runs / ident, ignore_errors=True)

    def validate(self, doc: dict[str, Any]) -> None:
        """Check a `validating` batch's input: `in_progress` with its count, or `failed` with its faults."""
        source = self.files.content(doc["input_file_id"])
        if not source.exists():
            total, model, errors = 0, None, [input_gone(doc)]
        else:
            total, model, errors = validate(source, doc["endpoint"], self.max_line)
        doc["request_counts"] = {"total": total, "completed": 0, "failed": 0}
        doc["model"] = model
        if doc["status"] != "cancelling":  # one cancelled while it was checked ends as cancelled
            if errors:
                doc.update(status="failed", failed_at=self.now(), errors={"object": "list", "data": errors})
            else:
                doc.update(status="in_progress", in_progress_at=self.now())
        if not errors:
            self.progress[doc["id"]] = Progress.read(self.runs / doc["id"])
        self.save(doc)

    def finish(self, doc: dict[str, Any]) -> None:
        """End a batch whose lines are done (or were cancelled): `finalizing`, its results as files, then
        `completed` or `cancelled` (or `failed`, with its `errors`, when its input went missing). Run again after a
        crash, it ends the same way."""
        cancelled = doc["status"] == "cancelling"
        failed = not cancelled and doc.get("errors") is not None  # its input went missing (serve/batchrun.py)
        if doc["status"] == "in_progress" and not failed:
            self.save(doc, status="finalizing", finalizing_at=self.now())
        folder = self.runs / doc["id"]
        progress = self.progress.get(doc["id"]) or Progress.read(folder)
        for key, name, what, count in (("output_file_id", "output.jsonl", "output", progress.completed),
                                       ("error_file_id", "errors.jsonl", "error", progress.failed)):
            if count:
                # the same id when run again after a crash: its time is the results' last write (files list by id
                # within a second), then a digest of the batch's id
                written = (folder / name).stat().st_mtime_ns
                ident = f"file-{written:016x}" + hashlib.sha256(f"{doc['id']}:{what}".encode()).hexdigest()[:8]
                self.files.adopt(folder / name, ident, f"{doc['id']}_{what}.jsonl", "batch_output")
                doc[key] = ident
        ended = ({"status": "cancelled", "cancelled_at": self.now()} if cancelled else
                 {"status": "failed", "failed_at": self.now()} if failed else
                 {"status": "completed", "completed_at": self.now()})
        self.save(doc, **ended)  # on disk first: a full disk leaves the batch to end again (serve/batchrun.py)
        self.progress.pop(doc["id"], None)
        for name in ("output.jsonl", "errors.jsonl"):  # the results' files hold them now, and the object says so
            (folder / name).unlink(missing_ok=True)


def routes(desk: Desk) -> list[Route]:
    """The Batch API's routes, and the Files API's (serve/files.py) over the same desk."""

    def owned() -> dict[str, dict[str, Any]]:
        desk.owner()
        assert desk.batches is not None
        return desk.batches

    def found(ident: str, reads: bool = False) -> dict[str, Any]:
        doc = (desk.view() if reads else owned()).get(ident)
        if doc is None:
            raise HTTPError(404, f"No batch found with id '{ident[:100]}'.", "invalid_request_error", "batch_id")
        return doc

    async def create(request: Request) -> Response:
        owned()
        body = await read_json(request)
        file_id, endpoint, window = body.get("input_file_id"), body.get("endpoint"), body.get("completion_window")
        if not isinstance(file_id, str):
            said = "is required" if file_id is None else f"must be a string (got {json.dumps(file_id)[:60]})"
            raise HTTPError(400, f"input_file_id {said}: the id of a file uploaded with purpose \"batch\"",
                            param="input_file_id")
        if endpoint not in ENDPOINTS:
            raise HTTPError(400, f"endpoint must be one of {', '.join(ENDPOINTS)} (got {str(endpoint)[:60]!r})",
                            param="endpoint")
        if window not in WINDOWS:
            raise HTTPError(400, f"completion_window must be \"24h\" (got {str(window)[:20]!r})",
                            param="completion_window")
        check_metadata(body.get("metadata"), None)
        known = await asyncio.to_thread(desk.files.get, file_id)
        if known is None:
            raise HTTPError(400, f"No such File object: {file_id[:100]}", param="input_file_id")
        if known["purpose"] != "batch":
            raise HTTPError(400, f"{file_id} has purpose {known['purpose']!r}: a batch's input needs a file uploaded "
                                 "with purpose \"batch\"", param="input_file_id")
        doc = await asyncio.to_thread(desk.create, file_id, str(endpoint), str(window), body.get("metadata"))
        desk.checking.add(doc["id"])
        owned()[doc["id"]] = doc  # listed from now on (the table changes on the event loop only)
        try:
            await asyncio.to_thread(desk.validate, doc)
        except OSError:  # its 507 (a full disk) says nothing was made: a client that sends it again makes one batch
            owned().pop(doc["id"], None)
            await asyncio.to_thread(desk.forget, doc["id"])
            raise
        finally:  # checked: the runner takes it from here
            desk.checking.discard(doc["id"])
            desk.wake.set()
        return JSONResponse(doc)

    async def listed(request: Request) -> Response:
        docs = list(reversed(desk.view().values()))
        query = request.query_params
        limit = files.limit_param(query.get("limit"), 20, MAX_BATCHES_LISTED)
        return JSONResponse(files.page([_shown(d) for d in docs], query.get("after"), limit))

    async def retrieve(request: Request) -> Response:
        return JSONResponse(_shown(found(request.path_params["id"], reads=True)))

    async def cancel(request: Request) -> Response:
        doc = found(request.path_params["id"])
        if doc["status"] in ("validating", "in_progress"):
            # the object changes once saved: a 507 (no room to save it) leaves the batch as it was, and running
            await asyncio.to_thread(desk.save, doc, status="cancelling", cancelling_at=desk.now())
            desk.wake.set()
        elif doc["status"] not in ("cancelling", "cancelled"):
            raise HTTPError(409, f"Cannot cancel a batch with status {doc['status']!r}.", param="batch_id")
        return JSONResponse(_shown(doc))

    def _shown(doc: dict[str, Any]) -> dict[str, Any]:
        progress = desk.progress.get(doc["id"])
        if progress is not None:
            progress.shown(doc)
        return doc

    on_disk = files.on_disk  # a full or read-only data folder: a 507 saying so
    return [by_method("/v1/batches", POST=on_disk(create), GET=on_disk(listed)),
            by_method("/v1/batches/{id}", GET=on_disk(retrieve)),
            by_method("/v1/batches/{id}/cancel", POST=on_disk(cancel)),
            *files.routes(desk.files, desk.owner, desk.reading, desk.in_use, lambda: desk.read_timeout)]
