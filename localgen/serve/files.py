"""OpenAI's Files API, for the Batch API (serve/batches.py): `POST /v1/files` (multipart: `file` and `purpose`,
which must be "batch"), `GET /v1/files` (newest first), `GET /v1/files/{id}`, `GET /v1/files/{id}/content` and
`DELETE /v1/files/{id}`. Each file is two files in the data dir's `batches/files/` (0600 in a 0700 folder):
its bytes (`ID.jsonl`) and its FileObject (`ID.json`), each written to a temporary name, synced and renamed, the
bytes first, so a file is listed only once it is whole. An upload is bounded before it is read: its declared
length, then its bytes as they arrive (MAX_BYTES, OpenAI's 200 MB), spooled to disk by Starlette's multipart
parser, never held in memory whole. What its lines hold is checked when a batch names it (serve/batches.py)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import json
import os
import re
import secrets
import shutil
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from pathlib import Path
from typing import IO, Any

from starlette.datastructures import FormData
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from localgen import paths
from localgen.serve.apierror import HTTPError, error_response
from localgen.serve.routing import by_method
from localgen.serve.stalls import BodyClock

MAX_BYTES = 200 * 1024 * 1024  # OpenAI's bound on a batch input file (209,715,200 bytes)
FORM_SLACK = 64 * 1024  # what a multipart body may hold besides the file: its boundaries, headers and `purpose`
PURPOSES = ("batch",)  # what may be uploaded; the batches' results are files of purpose "batch_output"
_ID = re.compile(r"file-[0-9a-f]{24}")
_ORDERED = re.compile(r"(?:file-|batch_)([0-9a-f]{16})[0-9a-f]{8}")  # an id new_id made: its time in ns, first
UPLOADS = ("/v1/files",)  # the gate lets these bodies through unread (serve/guard.py's Policy.uploads)
MAX_LIST = 10_000  # OpenAI's largest `limit` for GET /v1/files (and its default)
MAX_FILENAME = 255  # characters of an uploaded file's name (most file systems' bound on one)


def default_root() -> Path:
    """Where the server keeps its files."""
    return paths.data_dir() / "batches" / "files"


def write_atomic(path: Path, data: bytes) -> None:
    """`data` at `path`, whole or not at all: a temporary file (0600) synced, renamed, and the folder synced."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")  # writers in two threads: two names
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_BINARY", 0), 0o600)
        with open(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        paths.fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


_last_ns = 0


def new_id(prefix: str) -> str:
    """A new id of 24 hex digits after `prefix`, in the order ids are made: its time in ns (one more than the last
    id's where the clock has not moved on), then random ones. Lists sort objects of the same second by id."""
    global _last_ns
    _last_ns = max(time.time_ns(), _last_ns + 1)
    return f"{prefix}{_last_ns:016x}{secrets.token_hex(4)}"


class FileStore:
    """Files by id: their bytes and their FileObject, in one folder."""

    def __init__(self, root: Path, clock: Callable[[], float] = time.time) -> None:
        self.root = root
        self.clock = clock
        self.warn: Callable[[str], None] = lambda _line: None  # the server's log (batchrun.running sets it)
        self._said: set[Path] = set()  # the damaged files said in the log

    def _folder(self) -> Path:
        return paths.private_dir(self.root)

    def content(self, ident: str) -> Path:
        """Where a file's bytes are (the id checked first: it names a file in this folder and nothing else)."""
        if not _ID.fullmatch(ident):
            raise KeyError(ident)
        return self.root / f"{ident}.jsonl"

    def get(self, ident: str) -> dict[str, Any] | None:
        """A file's FileObject, or None when there is none of that id."""
        if not _ID.fullmatch(ident):
            return None
        path = self.root / f"{ident}.json"
        doc = self.read_object(path, "FileObject")
        if doc is not None and doc["id"] != ident:
            self.damaged(path, ValueError("not a FileObject"))
            return None
        return doc

    def read_object(self, path: Path, kind: str, what: str = "that file") -> dict[str, Any] | None:
        """The object (a `kind`: FileObject, Batch) saved at `path`, or None where there is none, or it is damaged
        (a disk's fault, a hand's edit: said once in the log, `what` not listed or served, the others still are)."""
        try:
            doc = json.loads(path.read_bytes())
        except (FileNotFoundError, NotADirectoryError):  # (a file where the folder goes: disk_fault's 507)
            return None
        except (OSError, ValueError) as e:
            self.damaged(path, e, what)
            return None
        if isinstance(doc, dict) and isinstance(doc.get("id"), str) and isinstance(doc.get("created_at"), int):
            return doc
        self.damaged(path, ValueError(f"not a {kind}"), what)
        return None

    def damaged(self, path: Path, e: Exception, what: str = "that file") -> None:
        """Said once per file in the server's log; the file is left as it is (the user's to look at)."""
        if path not in self._said:
            self._said.add(path)
            self.warn(f"localgen serve: {path} is damaged ({getattr(e, 'strerror', None) or e}): {what} is not "
                      "listed or served; move it away to quiet this")

    def add(self, source: IO[bytes], filename: str, purpose: str, ident: str | None = None) -> dict[str, Any]:
        """Copy `source` in as a new file (or as `ident`), its bytes first, then its FileObject."""
        ident = ident or new_id("file-")
        folder = self._folder()
        target = folder / f"{ident}.jsonl"
        tmp = folder / f".{ident}.{os.getpid()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_BINARY", 0), 0o600)
            with open(fd, "wb") as f:
                shutil.copyfileobj(source, f, 1 << 20)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return self._describe(ident, filename, purpose)

    def adopt(self, source: Path, ident: str, filename: str, purpose: str) -> dict[str, Any]:
        """Take a file written elsewhere in the data dir (a batch's results) in as `ident`: a second name for its
        bytes (a copy where the disk has no hard links), so the source stays whole until its batch's object says
        where the results went; again after a crash, what was taken already stays."""
        folder = self._folder()
        target = folder / f"{ident}.jsonl"
        if not target.exists():
            try:
                os.link(source, target)
            except FileExistsError:
                pass
            except OSError:  # a disk without hard links: a copy, whole or not at all
                tmp = folder / f".{ident}.{os.getpid()}.tmp"
                try:
                    shutil.copyfile(source, tmp)
                    os.replace(tmp, target)
                finally:
                    tmp.unlink(missing_ok=True)
            paths.fsync_dir(folder)
        found = self.get(ident)
        return found if found is not None else self._describe(ident, filename, purpose)

    def _describe(self, ident: str, filename: str, purpose: str) -> dict[str, Any]:
        target = self.root / f"{ident}.jsonl"
        doc = {"id": ident, "object": "file", "bytes": target.stat().st_size, "created_at": int(self.clock()),
               "filename": filename, "purpose": purpose, "status": "processed", "expires_at": None,
               "status_details": None}
        write_atomic(self.root / f"{ident}.json", json.dumps(doc).encode())
        return doc

    def listed(self) -> list[dict[str, Any]]:
        """Every file's FileObject, oldest first."""
        if not self.root.is_dir():
            return []
        found = [d for p in self.root.glob("file-*.json") if (d := self.get(p.stem)) is not None]
        return sorted(found, key=lambda d: (d["created_at"], d["id"]))

    def sweep(self) -> None:
        """Remove what a crash left behind, unlisted and unseen: temporary files (an upload cut short, up to its
        200 MB), and bytes whose object was never written or was deleted first (an upload not answered yet, a
        delete half done, a batch's results: its batch, not ended yet, takes them again). Only for the server
        that holds the folder, before it writes there."""
        try:
            found = list(self.root.iterdir())
        except OSError:  # none yet, or not readable: nothing to sweep
            return
        for path in found:
            left = path.name.startswith(".") and path.name.endswith(".tmp")
            orphan = path.suffix == ".jsonl" and _ID.fullmatch(path.stem) and not path.with_suffix(".json").exists()
            if left or orphan:
                with contextlib.suppress(OSError):  # a folder that cannot be written: left for a later start
                    path.unlink()

    def delete(self, ident: str) -> bool:
        """Forget a file: its FileObject first (it is unlisted at once), then its bytes; a damaged one too."""
        if not _ID.fullmatch(ident) or not (self.root / f"{ident}.json").is_file():  # (a damaged one too)
            return False
        (self.root / f"{ident}.json").unlink(missing_ok=True)
        self.content(ident).unlink(missing_ok=True)
        paths.fsync_dir(self.root)
        return True


def not_found(ident: str, param: str = "file_id") -> HTTPError:
    """OpenAI's 404 for a file id it does not know."""
    return HTTPError(404, f"No such File object: {ident[:100]}", "invalid_request_error", param)


def routes(store: FileStore, owner: Callable[[], None], reader: Callable[[], bool],
           in_use: Callable[[str], str | None], read_timeout: Callable[[], float]) -> list[Route]:
    """The Files API's routes over `store`. `owner()` is called first by each that writes (serve/batches.py: this
    server holds the data dir's batches, or a 503), `reader()` by each that only reads (the same, but a data folder
    that cannot be written is read as it is); `in_use(id)` names the batch still reading a file, which may not be
    deleted meanwhile."""

    async def create(request: Request) -> Response:
        owner()
        kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if kind != "multipart/form-data":
            raise HTTPError(415, "upload a file as multipart/form-data, with the fields file and purpose "
                                 f"(got {kind or 'no content type'!r})", param="file")
        declared = request.headers.get("content-length", "")
        if declared.isascii() and declared.isdigit() and int(declared) > MAX_BYTES + FORM_SLACK:
            raise too_big()
        return JSONResponse(await _upload(request, store, read_timeout()))

    async def listed(request: Request) -> Response:
        reader()
        query = request.query_params
        purpose = query.get("purpose")
        limit = limit_param(query.get("limit"), MAX_LIST, MAX_LIST)
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise HTTPError(400, f"order must be asc or desc (got {order[:20]!r})", param="order")
        docs = await asyncio.to_thread(store.listed)
        docs = [d for d in docs if purpose is None or d["purpose"] == purpose]
        if order == "desc":
            docs.reverse()
        return JSONResponse(page(docs, query.get("after"), limit, order == "desc"))

    async def retrieve(request: Request) -> Response:
        reader()
        ident = request.path_params["id"]
        doc = await asyncio.to_thread(store.get, ident)
        if doc is None:
            raise not_found(ident)
        return JSONResponse(doc)

    async def content(request: Request) -> Response:
        reader()
        ident = request.path_params["id"]
        if await asyncio.to_thread(store.get, ident) is None:
            raise not_found(ident)
        path = store.content(ident)
        if not await asyncio.to_thread(path.is_file):  # its bytes removed by hand from the data dir
            raise HTTPError(404, f"The content of {ident} is gone from the data dir", "invalid_request_error",
                            "file_id")
        return _Content(path, ident)

    async def delete(request: Request) -> Response:
        owner()
        ident = request.path_params["id"]
        user = in_use(ident)
        if user is not None:
            raise HTTPError(409, f"{ident} is the input of {user}, which is still running: cancel it first, or "
                                 "wait for its end", param="file_id")
        if not await asyncio.to_thread(store.delete, ident):
            raise not_found(ident)
        return JSONResponse({"id": ident, "object": "file", "deleted": True})

    return [by_method("/v1/files", POST=on_disk(create), GET=on_disk(listed)),
            by_method("/v1/files/{id}", GET=on_disk(retrieve), DELETE=on_disk(delete)),
            by_method("/v1/files/{id}/content", GET=on_disk(content))]



class _Unsatisfiable(Exception):
    """A Range none of whose ranges begins within the file (RFC 9110 §14.1.1): a 416."""

    def __init__(self, size: int):
        super().__init__(size)
        self.size = size


class _Content(FileResponse):
    """A file's bytes, with Range read as RFC 9110 §14 has it (Starlette's FileResponse answered a range unit it
    does not know, or a range it cannot read, with a plain-text 400; one past the end with a plain-text 416): an
    unknown unit or an invalid range is ignored (the whole file, 200); one no part of which is in the file is a
    416 in the API's error shape, with Content-Range: bytes */SIZE."""

    def __init__(self, path: Path, ident: str):
        super().__init__(path, media_type="application/octet-stream")
        self.ident = ident

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except _Unsatisfiable as e:  # raised as the ranges are read, before anything is sent
            refused = HTTPError(416, f"The range asked for is past the end of {self.ident}, which has {e.size:,} "
                                     "bytes")
            await error_response(Request(scope), refused, {"Content-Range": f"bytes */{e.size}"})(scope, receive,
                                                                                                 send)

    @classmethod
    def _parse_range_header(cls, http_range: str, file_size: int) -> list[tuple[int, int]]:
        """The byte ranges to send, as (start, end) past its last, sorted and merged; none for the whole file."""
        return byte_ranges(http_range, file_size, cls.max_ranges)


_RANGE_SPEC = re.compile(r"([0-9]+)-([0-9]*)|-([0-9]+)")


def byte_ranges(header: str, size: int, most: int) -> list[tuple[int, int]]:
    """A Range header's byte ranges within a file of `size` bytes as (start, end) past its last, sorted and merged;
    none (the whole file) for a unit other than bytes, which a server must ignore, for an invalid range set (one
    not bytes=FIRST-[LAST] or bytes=-SUFFIX, or with LAST before FIRST), which it may ignore, for more than `most`
    ranges, and for an empty file; _Unsatisfiable where no range has a byte of the file (RFC 9110 §14.1.2-3)."""
    unit, eq, spec = header.partition("=")
    if not eq or unit.strip().lower() != "bytes" or size == 0:
        return []
    parts = [part.strip() for part in spec.split(",") if part.strip()]  # a list's empty elements are ignored
    if not parts or len(parts) > most:
        return []
    ranges: list[tuple[int, int]] = []
    for part in parts:
        found = _RANGE_SPEC.fullmatch(part)
        if found is None:
            return []
        first, last, suffix = found.groups()
        if suffix is not None:
            if _number(suffix) > 0:
                ranges.append((max(size - _number(suffix), 0), size))
        elif last and _number(last) < _number(first):
            return []
        elif _number(first) < size:
            ranges.append((_number(first), min(_number(last) + 1, size) if last else size))
    if not ranges:
        raise _Unsatisfiable(size)
    ranges.sort()
    merged = [ranges[0]]
    for start, end in ranges[1:]:
        if start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _number(digits: str) -> int:
    """A range's position (past any file's size where it has more digits than int() will read)."""
    return int(digits) if len(digits) <= 30 else 10 ** 30


async def read_form(request: Request, body: AsyncGenerator[bytes, None], max_fields: int, what: str) -> FormData:
    """A multipart form of one file and at most `max_fields` text fields, read from `body`; a bad part is a 400
    that says what is wrong with it (`what`: "the upload", "the request"), never a bare "invalid multipart"."""
    parser = _Form(request.headers, body, max_files=1, max_fields=max_fields)
    try:
        return await parser.parse()
    except MultiPartException as e:
        raise HTTPError(400, parser.explain(e, what), param="file") from None
    except OSError as e:  # a file part past 1 MB is spooled to the temporary folder, not the data folder
        if e.errno not in DISK_ERRNOS:
            raise
        raise HTTPError(507, f"the server's temporary folder (TMPDIR) cannot be written ({e.strerror or e}): free "
                             "some space there, or start serve with TMPDIR set to a folder with room, then send it "
                             "again", "server_error") from None


class _Form(MultiPartParser):
    """Starlette's multipart parser, checking each part's name and file name as its headers end, and knowing which
    header a part's header bound stopped."""

    def on_headers_finished(self) -> None:
        from python_multipart.multipart import parse_options_header

        _, options = parse_options_header(self._current_part.content_disposition)
        if b"name" not in options:
            raise MultiPartException("a part has no name (its header must say Content-Disposition: form-data; "
                                     "name=\"file\")")
        raw = options.get(b"filename")
        if raw is not None:
            if self._current_files >= self.max_files:
                raise MultiPartException("the form has more than one file: send one, as the field `file`")
            name = raw.decode(self._charset or "utf-8", "replace")
            if len(name) > MAX_FILENAME:
                raise MultiPartException(f"the file name is too long: {len(name):,} characters, over the "
                                         f"{MAX_FILENAME} a file name may have")
            if any(c in name for c in "/\\"):
                raise MultiPartException(f"the file name {name[:60]!r} has a path in it (/ or \\): send the "
                                         "file's name alone")
            if any(ord(c) < 32 or ord(c) == 127 for c in name):
                raise MultiPartException(f"the file name {name[:60]!r} has a control character in it (a NUL, a "
                                         "line break, ...)")
        elif self._current_fields >= self.max_fields:
            raise MultiPartException(f"the form has more than {self.max_fields} text fields")
        super().on_headers_finished()

    def explain(self, e: MultiPartException, what: str) -> str:
        """What a MultiPartException means for the client, in one sentence."""
        from python_multipart.multipart import DEFAULT_MAX_HEADER_COUNT, DEFAULT_MAX_HEADER_SIZE

        cause = str(e.__cause__ or "")
        if cause.startswith("Maximum header size"):  # python-multipart's bound on one header line of a part
            header = self._current_partial_header_name.decode("latin-1")  # its name came whole, before the value
            if header.lower() == "content-disposition":
                return (f"the file name is too long: its part's Content-Disposition header is over "
                        f"{DEFAULT_MAX_HEADER_SIZE:,} bytes, and a file name may have at most {MAX_FILENAME} "
                        "characters")
            named = f" ({header[:40]})" if header else ""
            return f"a part's header{named} is over {DEFAULT_MAX_HEADER_SIZE:,} bytes, the most one may have"
        if cause.startswith("Maximum header count"):
            return f"a part has more than {DEFAULT_MAX_HEADER_COUNT} headers, the most one may have"
        return f"{what} is not a valid multipart form: {(cause or e.message)[:200]}"


async def _upload(request: Request, store: FileStore, read_timeout: float) -> dict[str, Any]:
    """An upload's form read within its bounds (a body that stalls past `read_timeout` ends it), its fields
    checked, and its file added to `store`."""
    from starlette.datastructures import UploadFile

    form = await read_form(request, bounded_body(request, read_timeout), 8, "the upload")
    try:
        file, purpose = form.get("file"), form.get("purpose")
        if isinstance(file, str):  # a part with no filename (curl's -F 'file=<in.jsonl') is a text field
            raise HTTPError(400, "the field `file` came as text, with no filename: send it as a file (curl -F "
                                 "file=@requests.jsonl)", param="file")
        if not isinstance(file, UploadFile):
            raise HTTPError(400, "the form has no file: send it as the field `file`", param="file")
        if purpose is None:
            raise HTTPError(400, "the form has no `purpose`: send purpose=batch (this server keeps files for the "
                                 "Batch API only)", param="purpose")
        if purpose not in PURPOSES:
            raise HTTPError(400, f"purpose must be \"batch\" (got {str(purpose)[:40]!r}): this server keeps "
                                 "files for the Batch API only", param="purpose")
        if file.size is not None and file.size > MAX_BYTES:
            raise too_big()
        name = file.filename or "upload.jsonl"  # checked as the form was read (_Form): no path, no control
        return await asyncio.to_thread(store.add, file.file, name, str(purpose))
    finally:
        await form.close()

DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG, errno.ENOTDIR}


def disk_fault(e: OSError) -> HTTPError | None:
    """The 507 of a data folder that cannot be written (full, read-only, not ours, a file where a folder of it
    goes), or None for another fault."""
    if e.errno not in DISK_ERRNOS:
        return None
    where = f": {e.filename}" if e.filename and e.errno != errno.ENOTDIR else ""  # (paths.make_dirs' names the
    fix = "move that file away" if e.errno == errno.ENOTDIR else "free some space or fix its rights"  # file in the way)
    return HTTPError(507, f"the server's data folder cannot be written ({e.strerror or e}{where}): {fix}, then send "
                          "it again", "server_error")


def on_disk(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """A route whose disk faults (a full or read-only data folder) are a 507 that says so, not a 500."""
    @functools.wraps(handler)
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except OSError as e:
            fault = disk_fault(e)
            if fault is None:
                raise
            raise fault from None

    return wrapped


def too_big() -> HTTPError:
    """The 413 of a file over MAX_BYTES."""
    return HTTPError(413, f"the file is over the limit of {MAX_BYTES:,} bytes (200 MB, as OpenAI's): split it into "
                          "several batches", param="file")


async def bounded_body(request: Request, timeout: float, limit: int | None = None,
                       over: HTTPError | None = None) -> AsyncGenerator[bytes, None]:
    """The request's body as it arrives, `over` (a 413) once it passes `limit` (nothing past it is read; by
    default a file of MAX_BYTES and its form), a 408 when a part stalls for `timeout` seconds (serve
    --read-timeout) or the whole comes too slowly (serve/stalls.py's BodyClock), a 499 when the client leaves."""
    bound = MAX_BYTES + FORM_SLACK if limit is None else limit
    clock = BodyClock(timeout)
    chunks = request.stream().__aiter__()
    while True:
        try:
            chunk = await asyncio.wait_for(chunks.__anext__(), clock.wait())
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise clock.late("the upload") from None
        except ClientDisconnect:  # (a 499, one line in the log: it was a traceback)
            raise HTTPError(499, "the client went away") from None
        clock.took(chunk)
        if clock.got > bound:
            raise over or too_big()
        yield chunk


def limit_param(text: str | None, default: int, most: int) -> int:
    """A list's `limit` query parameter, checked."""
    if text is None:
        return default
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= most:  # "²" is a digit int() refuses
        raise HTTPError(400, f"limit must be a whole number from 1 to {most:,} (got {text[:20]!r})", param="limit")
    return int(text)


def page(docs: list[dict[str, Any]], after: str | None, limit: int, descending: bool = True) -> dict[str, Any]:
    """OpenAI's cursor page of `docs` (listed by created_at then id, newest first unless not `descending`): those
    after the id `after`, at most `limit`. An `after` no longer listed (a file deleted while a client pages through
    them, as a clean-up loop does) keeps its place by the time its id begins with (new_id)."""
    if after is not None:
        at = next((i for i, d in enumerate(docs) if d["id"] == after), None)
        if at is not None:
            docs = docs[at + 1:]
        elif (made := _ORDERED.fullmatch(after)) is None or not 1_577_836_800 <= (
                second := int(made[1], 16) // 1_000_000_000) <= time.time() + 86_400:  # 2020 to now: a time
            docs = []
        else:
            docs = [d for d in docs if ((d["created_at"], d["id"]) < (second, after)) == descending]
    shown = docs[:limit]
    return {"object": "list", "data": shown, "first_id": shown[0]["id"] if shown else None,
            "last_id": shown[-1]["id"] if shown else None, "has_more": len(docs) > limit}
