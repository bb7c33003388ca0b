"""The responses `POST /v1/responses` stores (`store`, on unless false): each response's JSON and its
conversation (the chat messages that went in and the answer as messages), so `previous_response_id` can
continue it and `GET`/`DELETE /v1/responses/{id}` can find it. One SQLite file in the data dir (0600 in a
0700 folder), bounded: at most MAX_RESPONSES and MAX_BYTES, the oldest dropped first, none older than
MAX_AGE_S (all applied on each write; an expired one is never read). What a request may store beside its
conversation is bounded as OpenAI bounds it (check_metadata): `metadata` at most 16 keys of 64 characters,
each a string of at most 512, and `user` at most MAX_USER characters. The standard library's sqlite3, as the
log's writer (log/store.py): one table, no full-text index, so sqlite-utils would add only its import time.
Every call opens its own connection under one lock: the server calls these from worker threads
(asyncio.to_thread). A store another process has locked is waited for with the lock let go between tries (this
process's other requests go on meanwhile), then a 503 that says so. GET and DELETE /v1/responses/{id} are this
store over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localgen import paths
from localgen.serve.apierror import HTTPError
from localgen.serve.routing import by_method

MAX_RESPONSES = 1000
MAX_BYTES = 1 << 30  # the stored responses' JSON together (UTF-8): the oldest go first past it
MAX_AGE_S = 30 * 24 * 3600.0
BUSY_TIMEOUT_S = 10.0  # how long a request waits for a store another process has locked, before its 503
TRY_S = 0.1  # each try's wait for SQLite's lock, under this process's lock, which is then let go for as long
# a stored conversation's JSON, at most (serve's default body limit): a follow-up cannot grow one past it
MAX_CONVERSATION_CHARS = 16 << 20
# OpenAI's bounds on `metadata`; `user` (an end user's id) as long as any id is
MAX_METADATA_KEYS, MAX_METADATA_KEY, MAX_METADATA_VALUE, MAX_USER = 16, 64, 512, 256
T = TypeVar("T")


def check_metadata(metadata: Any, user: Any) -> None:
    """A 400 (serve/apierror.py's HTTPError, naming the field) for `metadata` or `user` outside OpenAI's bounds:
    what a stored response keeps beside its conversation stays small."""
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise HTTPError(400, "metadata must be an object", param="metadata")
        if len(metadata) > MAX_METADATA_KEYS:
            raise HTTPError(400, f"metadata has {len(metadata)} keys; at most {MAX_METADATA_KEYS}", param="metadata")
        for key, value in metadata.items():
            if len(key) > MAX_METADATA_KEY:
                raise HTTPError(400, f"a metadata key is {len(key):,} characters; at most {MAX_METADATA_KEY}",
                                param="metadata")
            if not isinstance(value, str):
                raise HTTPError(400, f"metadata[{key[:64]!r}] must be a string", param="metadata")
            if len(value) > MAX_METADATA_VALUE:
                raise HTTPError(400, f"metadata[{key[:64]!r}] is {len(value):,} characters; at most "
                                     f"{MAX_METADATA_VALUE}", param="metadata")
    if user is not None and (not isinstance(user, str) or len(user) > MAX_USER):
        raise HTTPError(400, f"user must be a string of at most {MAX_USER} characters", param="user")


@dataclass(frozen=True)
class Stored:
    """A stored response: its JSON as it was answered, and the conversation a follow-up continues."""

    response: dict[str, Any]
    conversation: list[dict[str, Any]]
    inputs: int = -1  # how many messages before the answer were the request's own input (-1: not known)
    given: list[dict[str, Any]] | None = None  # the input as sent, where truncation folded some of it away

    @property
    def input_messages(self) -> list[dict[str, Any]]:
        """The request's input, as messages: as it was sent where truncation folded some of it (serve/fitting.py);
        otherwise the conversation before the answer, without what it continued, nor a summary the server wrote in
        place of turns it folded, nor what came before that."""
        from localgen.compact import HEADING

        if self.given is not None:
            return self.given
        before = self.conversation[:-1]
        start = len(before) - self.inputs if 0 <= self.inputs <= len(before) else 0
        for i, m in enumerate(before):
            if m.get("role") == "system" and str(m.get("content", "")).startswith(HEADING):
                start = max(start, i + 1)
        return before[start:]


def default_path() -> Path:
    """Where the server keeps its stored responses."""
    return paths.data_dir() / "responses" / "responses.db"


class ResponseStore:
    """Stored responses by id, bounded in number and age."""

    def __init__(self, path: Path, most: int = MAX_RESPONSES, max_age_s: float = MAX_AGE_S,
                 clock: Callable[[], float] = time.time, max_bytes: int = MAX_BYTES) -> None:
        self.path, self.most, self.max_age_s, self.clock = path, most, max_age_s, clock
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._made = False

    def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """`work` done on a connection, in one transaction (tried again, whole, while another process holds the
        store's lock, for up to BUSY_TIMEOUT_S: then a 503 saying so); a store SQLite cannot use (a damaged file, a
        folder it cannot make) is a 500 that says so and what to do, and one line in the server's log (as the bench
        history, the log and collections say it), never a traceback."""
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                with self._open() as db:
                    return work(db)
            except sqlite3.OperationalError as e:
                if not _locked(e):
                    self._made = False
                    raise self._unusable(e) from None
                if time.monotonic() >= deadline:
                    raise self._locked() from None
            except (sqlite3.DatabaseError, OSError) as e:
                self._made = False  # moved aside: the next request makes a new one
                raise self._unusable(e) from None
            time.sleep(TRY_S)  # this process's lock let go: its other requests use the store meanwhile

    def _locked(self) -> HTTPError:
        what = (f"the Responses store {self.path} is locked by another process (another localgen serve with the "
                f"same data folder, or a program that has it open) and stayed so for {BUSY_TIMEOUT_S:g} s: try "
                "again, or send \"store\": false")
        return HTTPError(503, what, "server_error", logged=f"localgen serve: {what}")

    def _unusable(self, e: sqlite3.DatabaseError | OSError) -> HTTPError:
        if isinstance(e, sqlite3.OperationalError | OSError):  # the file may be fine: what is around it is not
            what = (f"the Responses store {self.path} cannot be used ({e}): check its folder's permissions and free "
                    "space and the server's limit of open files (ulimit -n), or send \"store\": false")
        else:
            what = (f"the Responses store {self.path} is damaged ({e}): move it aside (the next request starts a "
                    "new one), or send \"store\": false")
        return HTTPError(500, what, "server_error", logged=f"localgen serve: {what}")

    def check(self) -> None:
        """A store that cannot be used is a 500 now (HTTPError), before a request that would store is answered."""
        self._run(lambda db: db.execute("SELECT 1 FROM responses LIMIT 1").fetchall())

    @contextmanager
    def _open(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._made and not self.path.exists():  # removed while serving: made again as at first (0600,
                self._made = False  # its table), never an empty file sqlite3.connect would quietly make
            if not self._made:
                paths.private_file(self.path)
                with contextlib.suppress(OSError):  # one sqlite3 made in the instant the file was gone: private too
                    os.chmod(self.path, 0o600)
            db = sqlite3.connect(self.path, timeout=TRY_S)
            try:
                if not self._made:
                    db.execute("PRAGMA journal_mode=WAL")
                    _make_table(db)
                    self._made = True
                with db:  # one transaction
                    yield db
            finally:
                db.close()

    def save(self, ident: str, response: dict[str, Any], conversation: list[dict[str, Any]], inputs: int = -1,
             given: list[dict[str, Any]] | None = None) -> None:
        """Keep a response (replacing one of the same id), then drop the expired and those past the bound;
        `inputs`: how many of the conversation's messages before the answer were the request's input; `given`:
        that input as sent, where truncation folded some of it."""
        now = self.clock()
        # never a NaN or Infinity (a ValueError here, a 500 for this request): stored, it was a 500 on every read
        doc = json.dumps(response, ensure_ascii=False, allow_nan=False)
        said = json.dumps(conversation, ensure_ascii=False, allow_nan=False)
        sent = None if given is None else json.dumps(given, ensure_ascii=False, allow_nan=False)
        size = len(doc.encode()) + len(said.encode()) + (len(sent.encode()) if sent is not None else 0)
        def work(db: sqlite3.Connection) -> None:
            db.execute("INSERT OR REPLACE INTO responses (id, created, response, conversation, bytes, inputs, given) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?)", (ident, now, doc, said, size, inputs, sent))
            db.execute("DELETE FROM responses WHERE created < ?", (now - self.max_age_s,))
            db.execute("DELETE FROM responses WHERE id NOT IN (SELECT id FROM responses ORDER BY created DESC, "
                       "rowid DESC LIMIT ?)", (self.most,))
            db.execute("DELETE FROM responses WHERE id IN (SELECT id FROM (SELECT id, SUM(bytes) OVER (ORDER BY "
                       "created DESC, rowid DESC) AS upto FROM responses) WHERE upto > ?)", (self.max_bytes,))

        self._run(work)

    def load(self, ident: str) -> Stored | None:
        """The stored response, or None when it is unknown, deleted or expired. On a read-only or full disk, where
        SQLite cannot open the store to write, it is read as it is (GET and previous_response_id go on)."""
        def work(db: sqlite3.Connection) -> Any:
            return db.execute("SELECT response, conversation, inputs, given FROM responses WHERE id = ? AND "
                              "created >= ?", (ident, self.clock() - self.max_age_s)).fetchone()

        try:
            row = self._run(work)
        except HTTPError as e:
            row = self._read_only(work, e)
        return None if row is None else Stored(json.loads(row[0]), json.loads(row[1]), row[2],
                                               None if row[3] is None else json.loads(row[3]))

    def _read_only(self, work: Callable[[sqlite3.Connection], T], failed: HTTPError) -> T:
        """`work` on the store opened only to read (immutable), where its folder cannot be written (a read-only or
        full disk); else, or if that fails too, the error the store gave."""
        from localgen.sqlitedb import cannot_write, read_only

        if failed.status != 500 or not self.path.is_file() or not cannot_write(self.path.parent):
            raise failed
        try:
            db = read_only(self.path)
            try:
                return work(db)
            finally:
                db.close()
        except sqlite3.Error:
            raise failed from None

    def delete(self, ident: str) -> bool:
        """Forget a response; whether there was one to forget."""
        gone: int = self._run(lambda db: db.execute("DELETE FROM responses WHERE id = ? AND created >= ?",
                                                    (ident, self.clock() - self.max_age_s)).rowcount)
        return gone > 0


_COLUMNS = frozenset({"id", "created", "response", "conversation", "inputs", "given", "bytes"})


def _make_table(db: sqlite3.Connection) -> None:
    """The table, made or brought up to date in one write transaction: another process (a second `serve` on the
    same data folder) doing the same at once waits for it (a busy store, as any write), never adds a column twice. A
    store already up to date is only read here: a first read never waits for another process's write lock."""
    if {row[1] for row in db.execute("PRAGMA table_info(responses)")} >= _COLUMNS and db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = 'responses_created'").fetchone():
        return
    db.execute("BEGIN IMMEDIATE")
    db.execute("CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, created REAL NOT NULL, response TEXT NOT "
               "NULL, conversation TEXT NOT NULL, inputs INTEGER NOT NULL DEFAULT -1, given TEXT, bytes INTEGER NOT "
               "NULL DEFAULT 0)")
    db.execute("CREATE INDEX IF NOT EXISTS responses_created ON responses (created)")
    columns = [row[1] for row in db.execute("PRAGMA table_info(responses)")]
    if "inputs" not in columns:  # a store made before input_items: its rows' inputs not known
        db.execute("ALTER TABLE responses ADD COLUMN inputs INTEGER NOT NULL DEFAULT -1")
    if "given" not in columns:  # a store made before folded inputs were kept: none were
        db.execute("ALTER TABLE responses ADD COLUMN given TEXT")
    if "bytes" not in columns:  # a store made before the bound in bytes: its rows measured
        db.execute("ALTER TABLE responses ADD COLUMN bytes INTEGER NOT NULL DEFAULT 0")
        db.execute("UPDATE responses SET bytes = length(CAST(response AS BLOB)) + length(CAST(conversation AS BLOB))")
    db.commit()


def _locked(e: sqlite3.OperationalError) -> bool:
    """Whether SQLite could not take the store's lock (another connection holds it: here, another process)."""
    return getattr(e, "sqlite_errorcode", None) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) \
        or "locked" in str(e)


def routes(store: ResponseStore) -> list[Route]:
    """GET /v1/responses/{id} (a stored response) and DELETE (forget it): a 404 when it is unknown, deleted or
    expired."""

    def not_found(ident: str) -> HTTPError:
        return HTTPError(404, f"Response with id '{ident}' not found.", "invalid_request_error", "response_id")

    async def retrieve(request: Request) -> Response:
        found = await asyncio.to_thread(store.load, request.path_params["id"])
        if found is None:
            raise not_found(request.path_params["id"])
        return JSONResponse(found.response)

    async def delete(request: Request) -> Response:
        ident = request.path_params["id"]
        if not await asyncio.to_thread(store.delete, ident):
            raise not_found(ident)
        return JSONResponse({"id": ident, "object": "response.deleted", "deleted": True})

    async def input_items(request: Request) -> Response:
        ident = request.path_params["id"]
        found = await asyncio.to_thread(store.load, ident)
        if found is None:
            raise not_found(ident)
        items = as_items(found.input_messages, ident.removeprefix("resp_"))
        query = request.query_params
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise HTTPError(400, f"order must be asc or desc (got {order[:20]!r})", param="order")
        text = query.get("limit", "20")
        if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 100:
            raise HTTPError(400, f"limit must be a whole number from 1 to 100 (got {text[:20]!r})", param="limit")
        if order == "desc":
            items.reverse()
        ids = [item["id"] for item in items]
        start = 0
        if "after" in query:
            if query["after"] not in ids:
                raise HTTPError(400, f"after: no item {query['after'][:100]!r} in this response's input",
                                param="after")
            start = ids.index(query["after"]) + 1
        page = items[start:start + int(text)]
        return JSONResponse({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                             "last_id": page[-1]["id"] if page else None,
                             "has_more": start + len(page) < len(items)})

    return [by_method("/v1/responses/{id}", GET=retrieve, DELETE=delete),
            by_method("/v1/responses/{id}/input_items", GET=input_items)]


def as_items(messages: list[dict[str, Any]], tag: str) -> list[dict[str, Any]]:
    """Chat messages as the Responses API's input items: a message item per message (its text as input_text,
    an assistant's as output_text, pictures as input_image), an assistant's calls as function_call items, a
    tool's result as a function_call_output item; each with an id made from the response's (`tag`) and its
    place."""
    out: list[dict[str, Any]] = []

    def add(kind: str, prefix: str, **fields: Any) -> None:
        out.append({"id": f"{prefix}_{tag}{len(out):04d}", "type": kind, **fields})

    for m in messages:
        if m.get("role") == "tool":
            add("function_call_output", "fco", call_id=m.get("tool_call_id", ""), output=str(m.get("content") or ""),
                status="completed")
            continue
        role = m.get("role", "user")
        text_kind = "output_text" if role == "assistant" else "input_text"
        content = m.get("content")
        parts: list[dict[str, Any]] = []
        pieces: list[dict[str, Any]] = content if isinstance(content, list) else [
            {"type": "text", "text": content or ""}]
        for p in pieces:
            if p.get("type") == "image_url":
                parts.append({"type": "input_image", "image_url": p["image_url"]["url"], "detail": "auto"})
            elif p.get("type") == "text":
                parts.append({"type": text_kind, "text": p.get("text", ""),
                              **({"annotations": []} if role == "assistant" else {})})
            else:  # audio, a part of another API's kind: kept as it is
                parts.append(p)
        if parts != [{"type": text_kind, "text": "", **({"annotations": []} if role == "assistant" else {})}] \
                or not m.get("tool_calls"):
            add("message", "msg", role=role, status="completed", content=parts)
        for call in m.get("tool_calls") or ():
            add("function_call", "fc", call_id=call.get("id", ""), name=call["function"]["name"],
                arguments=call["function"].get("arguments", "{}"), status="completed")
    return out
