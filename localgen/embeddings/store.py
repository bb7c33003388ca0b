"""Collections: named sets of embeddings with their ids and texts, in one SQLite database in the data dir (through
sqlite-utils; mode 0600 in a 0700 folder; WAL, a busy timeout, and the tables made once under a file lock, so
several `embed --store` processes can write at once). A collection remembers the model (its name, and its
`fingerprint`: the file's content, not its name), pooling and size it was made with (`check`, before a run embeds
anything; `put`, as it stores), so every later text and query is embedded the same way; a text whose SHA-256 is
unchanged is not embedded again (as `llm embed-multi` does), nor is a document's chunk whose text another id holds
(`reusable`: its vector is stored again). A text given without an id (embed's arguments) gets its content's
(text_id), so writers in several processes never replace each other's texts. Collections are listed (`listing`),
shown entry by entry (`described`, `entries`) and removed whole or by id (`remove`, `remove_ids`); `put` makes a new
collection's record with its first texts, so a first run that fails leaves no collection; `put(..., keep=...)`
stores a run's texts and removes the ids it did not give in one transaction, so a failed run removes nothing, and
`put(..., files=...)` removes the chunks (FILE#N) a document stored again no longer yields, in that transaction
too. A writer that finds another holding the write lock says so (`waiting`) before it waits. `written` says cheaply
when a collection last changed."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from localgen.embeddings import storedb
from localgen.embeddings.storedb import path as path  # where the collections are (the CLI names it)
from localgen.errors import LocalgenError, UsageError


@dataclass(frozen=True)
class Collection:
    """How a collection's vectors were made."""

    name: str
    model: str  # the model's name as shown
    model_spec: str | None  # what -m said (None: the default), to load it again for `similar`
    pooling: str
    dimensions: int
    normalized: bool
    model_id: str | None = None  # the model's fingerprint(); None in a collection made before it was recorded


@dataclass(frozen=True)
class Listed:
    """A collection as `localgen collections` shows it."""

    name: str
    model: str
    pooling: str
    dimensions: int
    normalized: bool
    entries: int
    created: float  # seconds since the epoch
    last_written: float  # when an entry was last stored or removed (created, before any was)


Waiting = Callable[[str], None]  # where a writer says that it waits for another (the CLI's stderr)


def get(name: str) -> Collection:
    """A collection by name; an error naming the ones there are."""
    with storedb.db(create=False) as db:
        rows = list(db.table("collections").rows_where("name = ?", [name]))
        names = sorted(r["name"] for r in db["collections"].rows) if not rows else []
    if not rows:
        raise UsageError(f"no collection named {name!r}" + (f" (there are: {', '.join(names)})" if names else ""))
    r = rows[0]
    return Collection(r["name"], r["model"], r["model_spec"], r["pooling"], int(r["dimensions"]),
                      bool(r["normalized"]), r.get("model_id"))


FINGERPRINT_HEAD = 1 << 20  # a file's first bytes read whole: a GGUF's header and more
FINGERPRINT_BLOCK = 64 << 10
FINGERPRINT_BLOCKS = 16  # blocks read spread over the rest of the file, the last one at its end


def fingerprint(model: str, adapters: Iterable[tuple[str, float]] = ()) -> str:
    """What a collection knows its model by: the SHA-256 of the model file's size and of its content sampled (its
    first MiB, and blocks spread over the rest to its end: a few MB read, whatever the model's size), and of each
    LoRA adapter's with its scale. The same file moved, copied or downloaded again is the same model; another file
    of the same name (another model, or other weights) is not."""
    h = hashlib.sha256()
    for file, scale in ((model, None), *adapters):
        try:
            with open(file, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                h.update(struct.pack("<Q", size) + repr(scale).encode())
                h.update(f.read(FINGERPRINT_HEAD))
                for i in range(1, FINGERPRINT_BLOCKS + 1):
                    f.seek(max(0, size * i // FINGERPRINT_BLOCKS - FINGERPRINT_BLOCK))
                    h.update(f.read(FINGERPRINT_BLOCK))
        except OSError as e:
            raise LocalgenError(f"cannot read {file}: {e.strerror or e}") from None
    return "sha256-sampled:" + h.hexdigest()


def check(c: Collection) -> None:
    """Before anything is embedded: a collection of that name made another way (model, pooling, size) is the
    error ensure() gives; none yet is no error (nothing is created: ensure() does that once the texts are
    embedded). A database that cannot be written is said now, before the texts are embedded."""
    from localgen.sqlitedb import cannot_write

    folder = path().parent
    while not folder.exists() and folder != folder.parent:  # (the folders are made as it is stored)
        folder = folder.parent
    if cannot_write(folder):
        raise storedb.unwritable(path())
    if not storedb.present():
        return
    with storedb.db(create=False) as db:
        rows = list(db.table("collections").rows_where("name = ?", [c.name]))
    if rows:
        _same_way(rows[0], c)


def _same_model(r: Any, c: Collection) -> bool:
    """Whether the stored collection `r` was made with c's model: the same fingerprint (whatever its name now);
    for a collection made before fingerprints were recorded, the same name (all it knows)."""
    stored = r.get("model_id")
    if stored is not None and c.model_id is not None:
        return bool(stored == c.model_id)
    return bool(r["model"] == c.model)


def _same_way(r: Any, c: Collection) -> None:
    """A usage error when the stored collection `r` was made another way than `c`."""
    same = _same_model(r, c)
    if not same and r["model"] == c.model:  # another file of the same name: said so, not "bert.gguf, not bert.gguf"
        spec = r["model_spec"] or r["model"]  # (`-m` as typed then: the same words name another file now)
        relative = not os.path.isabs(os.path.expanduser(spec)) and ("/" in spec or spec.endswith(".gguf"))
        here = c.model_spec is not None and _where(spec) == _where(c.model_spec)  # the very file, changed since
        raise UsageError(f"collection {c.name!r} holds vectors of another {r['model']} (a file of that name with "
                         f"other content), not of this one",
                         hint=f"{spec} was a relative path, read from the current folder: store from the folder it "
                              "was stored from, or use another collection name" if relative else
                              f"{spec} has changed since it was stored: put back the file it was, or use another "
                              "collection name" if here else
                              f"use {_same_as(r, c)}, or another collection name")
    if not same or (r["pooling"], int(r["dimensions"])) != (c.pooling, c.dimensions):
        raise UsageError(f"collection {c.name!r} holds {r['model']} vectors ({r['pooling']} pooling, "
                         f"{r['dimensions']} dimensions), not {c.model} ({c.pooling}, {c.dimensions})",
                         hint=f"use {_same_as(r, c)}, or another collection name")
    if bool(r["normalized"]) != c.normalized:  # its vectors would be of two kinds, and `normalized` wrong for some
        raise UsageError(f"collection {c.name!r} holds {'' if r['normalized'] else 'un'}normalised vectors, not "
                         f"{'' if c.normalized else 'un'}normalised ones",
                         hint=f"use {'--normalize' if r['normalized'] else '--no-normalize'}, or another collection "
                              "name")


def _where(spec: str) -> str:
    """Where a model path given leads (a name of a model, not a path, stays as it is)."""
    return os.path.realpath(os.path.expanduser(spec)) if spec.lower().endswith(".gguf") else spec


def _same_as(stored: Any, c: Collection) -> str:
    """The flags that embed as the collection was embedded: the model when it differs (its pooling and size
    follow from it), else the pooling and size that differ."""
    if not _same_model(stored, c):
        return f"-m {stored['model_spec'] or stored['model']}"
    flags = [f"--pooling {stored['pooling']}"] if stored["pooling"] != c.pooling else []
    if int(stored["dimensions"]) != c.dimensions:
        flags.append(f"--dimensions {stored['dimensions']}")
    return " ".join(flags)


def content_hash(text: str) -> str:
    """The hash that says whether a text changed."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


TEXT_ID_DIGITS = 16  # 64 bits of SHA-256: two different texts sharing an id is out of reach


def text_id(text: str) -> str:
    """The id of a text given without one (embed's arguments): its content's, so the same in every process
    and different for different texts."""
    return content_hash(text)[:TEXT_ID_DIGITS]


def unchanged(name: str, items: Iterable[tuple[str, str]], any_id: bool = False) -> set[str]:
    """Of (id, text) pairs, the ids stored with the same text already; with `any_id`, under whatever id (a
    collection stored before text ids were content-derived holds its argument texts under 1, 2, ...)."""
    with storedb.db(create=True) as db:
        stored = {r["id"]: r["content_hash"] for r in db.query(
            "SELECT id, content_hash FROM embeddings WHERE collection = ?", [name])}
    held = set(stored.values()) if any_id else set()
    return {i for i, text in items if stored.get(i) == content_hash(text) or content_hash(text) in held}


def reusable(name: str, items: Iterable[tuple[str, str]]) -> dict[str, bytes]:
    """Of (id, text) pairs whose id does not hold that text, the ones whose text the collection holds under
    another id: each id's stored vector (packed), to store under it without embedding the text again (a line
    added at the top of a document moves its chunks to other ids)."""
    import json

    wanted: dict[str, list[str]] = {}
    with storedb.db(create=True) as db:
        stored = {r["id"]: r["content_hash"] for r in db.query(
            "SELECT id, content_hash FROM embeddings WHERE collection = ?", [name])}
        held = set(stored.values())
        for i, text in items:
            h = content_hash(text)
            if stored.get(i) != h and h in held:
                wanted.setdefault(h, []).append(i)
        if not wanted:
            return {}
        found = {h: v for h, v in db.conn.execute(
            "SELECT content_hash, embedding FROM embeddings WHERE collection = ? AND content_hash IN "
            "(SELECT value FROM json_each(?)) GROUP BY content_hash", (name, json.dumps(sorted(wanted))))}
    return {i: found[h] for h, ids in wanted.items() if h in found for i in ids}


def put(c: Collection, rows: list[tuple[str, str, list[float] | bytes]], keep: Iterable[str] | None = None,
        waiting: Waiting | None = None, files: Iterable[str] = (), given: Iterable[str] = ()) -> int:
    """Store (id, text, vector) rows (a vector as floats, or packed as stored) in the collection `c`, replacing
    what the ids held; with `keep` (every id of the run, stored now or unchanged), then remove the collection's
    other ids; with `files` (documents stored in chunks, ids FILE#1, FILE#2, ...), remove each file's chunk ids
    that are not in `given` (every id of the run). One transaction, taken before anything is read (BEGIN
    IMMEDIATE: it waits for other writers): the collection's record where it is new (else a check that it was made
    the same way: several processes may make it at once, and the first stays), every row and the removals, or
    nothing (a first run that fails leaves no collection). A collection made before fingerprints were recorded
    takes c's, its model's name being the same; one stored with the same file by another name (moved, copied)
    records that name, which `similar` loads. How many were removed."""
    import json

    now = time.time()
    name = c.name
    with storedb.db(create=True) as db:
        conn = db.conn
        with _writing(conn, waiting):
            conn.execute("INSERT OR IGNORE INTO collections (name, model, model_spec, pooling, dimensions, normalized, "
                         "created, model_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                         (name, c.model, c.model_spec, c.pooling, c.dimensions, int(c.normalized), now, c.model_id))
            stored = next(iter(db.table("collections").rows_where("name = ?", [name])))
            _same_way(stored, c)
            if c.model_id is not None and stored.get("model_id") in (None, c.model_id) and \
                    stored["model_spec"] != c.model_spec:  # (None: one made before fingerprints takes c's, below)
                # the same file by another name (moved, copied, downloaded again): `similar` and --rag load it as
                # this run named it, the name the collection had may be gone
                conn.execute("UPDATE collections SET model_spec = ? WHERE name = ?", (c.model_spec, name))
            if c.model_id is not None:
                conn.execute("UPDATE collections SET model_id = ? WHERE name = ? AND model_id IS NULL",
                             (c.model_id, name))
            conn.executemany(
                "INSERT OR REPLACE INTO embeddings (collection, id, content, content_hash, embedding, updated) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [(name, i, text, content_hash(text), vec if isinstance(vec, bytes) else pack(vec), now)
                 for i, text, vec in rows])
            gone = 0
            if keep is not None:
                gone = conn.execute(
                    "DELETE FROM embeddings WHERE collection = ? AND id NOT IN (SELECT value FROM json_each(?))",
                    (name, json.dumps(sorted(set(keep))))).rowcount
            stale = _stale_chunks(conn, name, files, set(given))
            if stale:
                gone += conn.execute(
                    "DELETE FROM embeddings WHERE collection = ? AND id IN (SELECT value FROM json_each(?))",
                    (name, json.dumps(stale))).rowcount
            if rows or gone:
                _written(conn, name, now)
            return gone


def copies(name: str, files: Iterable[str]) -> dict[str, list[str]]:
    """Of documents stored in chunks (ids FILE#N), each one whose every chunk's text the collection also holds
    under other documents' ids, and those documents, sorted (the same file stored by another path: `notes/a.md`
    and `a.md`, which are two documents to the collection; or two files of equal text)."""
    wanted = set(files)
    if not wanted:
        return {}
    hashes: dict[str, set[str]] = {}  # document → its chunks' texts
    holders: dict[str, set[str]] = {}  # text → the documents holding it
    with storedb.db(create=True) as db:  # called after a store: it is there
        for ident, h in db.conn.execute(
                "SELECT id, content_hash FROM embeddings WHERE collection = ? AND instr(id, '#') > 0", (name,)):
            doc = ident.rpartition("#")[0]
            hashes.setdefault(doc, set()).add(h)
            holders.setdefault(h, set()).add(doc)
    out = {}
    for doc in sorted(wanted & hashes.keys()):
        others = set.intersection(*(holders[h] - {doc} for h in hashes[doc]))
        if others:
            out[doc] = sorted(others)
    return out


def _stale_chunks(conn: sqlite3.Connection, name: str, files: Iterable[str], given: set[str]) -> list[str]:
    """The ids FILE#N (N digits) of these files that are not in `given`: chunks a file no longer yields."""
    wanted = set(files)
    if not wanted:
        return []
    stale = []
    for (ident,) in conn.execute("SELECT id FROM embeddings WHERE collection = ? AND instr(id, '#') > 0", (name,)):
        head, _, n = ident.rpartition("#")
        if head in wanted and n.isdigit() and n.isascii() and ident not in given:
            stale.append(ident)
    return stale


def _written(conn: sqlite3.Connection, name: str, now: float) -> None:
    """Mark the collection written now (entries stored or removed)."""
    conn.execute("UPDATE collections SET written = ? WHERE name = ?", (now, name))


@contextmanager
def _writing(conn: sqlite3.Connection, waiting: Waiting | None = None) -> Iterator[None]:
    """One write transaction, the write lock taken first (a read then a write in WAL mode fails at once when
    another writer committed in between, instead of waiting); committed at the end, rolled back on any error
    or interruption. When another process holds the lock, `waiting` hears so before the wait (up to
    storedb.BUSY_TIMEOUT_S)."""
    conn.execute("PRAGMA busy_timeout = 0")
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as e:
        if e.sqlite_errorcode != sqlite3.SQLITE_BUSY:
            raise
        if waiting is not None:
            waiting(f"waiting for another process writing {path()} (at most {storedb.BUSY_TIMEOUT_S:.0f} s)")
        conn.execute(f"PRAGMA busy_timeout = {int(storedb.BUSY_TIMEOUT_S * 1000)}")
        conn.execute("BEGIN IMMEDIATE")
    conn.execute(f"PRAGMA busy_timeout = {int(storedb.BUSY_TIMEOUT_S * 1000)}")
    try:
        yield
    except BaseException:
        conn.rollback()
        raise
    conn.commit()


def listing() -> list[Listed]:
    """Every collection with its entry count and when it was last written, by name; none without a database."""
    if not storedb.present():
        return []
    with storedb.db(create=False) as db:
        rows = db.conn.execute(_listing(db, "") + " ORDER BY c.name").fetchall()
    return [_listed(r) for r in rows]


def _listing(db: Any, where: str) -> str:
    """Every collection (or one, `where`) with its count of entries and its last write: a removal's or a store's
    (`written`), or an entry's own time in a database made before removals counted (read as it is: a listing
    never changes the file)."""
    written = "coalesce(c.written, c.created)" if "written" in db["collections"].columns_dict else "c.created"
    return ("SELECT c.name, c.model, c.pooling, c.dimensions, c.normalized, c.created, count(e.id), "
            f"max({written}, coalesce(max(e.updated), 0)) "
            f"FROM collections c LEFT JOIN embeddings e ON e.collection = c.name {where} GROUP BY c.name")


def _listed(r: Any) -> Listed:
    return Listed(r[0], r[1], r[2], int(r[3]), bool(r[4]), int(r[6]), float(r[5]), float(r[7]))


def described(name: str) -> Listed:
    """One collection as `localgen collections` lists it; an error naming the ones there are."""
    if not storedb.present():
        raise UsageError(f"no collection named {name!r}: there are no collections yet")
    with storedb.db(create=False) as db:
        rows = db.conn.execute(_listing(db, "WHERE c.name = ?"), (name,)).fetchall()
        error = None if rows else _missing(db.conn, [name])
    if error is not None:
        raise error
    return _listed(rows[0])


def entries(name: str, chars: int) -> Iterator[tuple[str, str, int]]:
    """Each entry of a collection in the order stored: its id, the first `chars` characters of its text and the
    text's length (the texts and vectors are never read whole, but for the length of one holding a NUL)."""
    import codecs

    # SQLite's substr() and length() on TEXT stop at a NUL: the start is cut from the bytes (a character is at most
    # 4), and a text holding a NUL is measured here
    with storedb.db(create=False) as db:
        for rowid, ident, head, length in db.conn.execute(
                "SELECT rowid, id, substr(CAST(content AS BLOB), 1, ?), CASE WHEN instr(CAST(content AS BLOB), "
                "x'00') THEN NULL ELSE length(content) END FROM embeddings WHERE collection = ? ORDER BY rowid",
                (chars * 4, name)):
            if length is None:
                length = len(db.conn.execute("SELECT content FROM embeddings WHERE rowid = ?", (rowid,)).fetchone()[0])
            yield ident, codecs.getincrementaldecoder("utf-8")().decode(head, final=False)[:chars], length


def _missing(conn: sqlite3.Connection, names: list[str]) -> UsageError | None:
    """The error for the names that are not collections, or None: a usage error (exit 2), as get's is."""
    have = [r[0] for r in conn.execute("SELECT name FROM collections ORDER BY name")]
    unknown = [n for n in dict.fromkeys(names) if n not in have]
    if not unknown:
        return None
    which = ", ".join(repr(n) for n in unknown)
    there = f" (there are: {', '.join(have)})" if have else " (there are none)"
    return UsageError(f"no collection named {which}{there}" if len(unknown) == 1
                      else f"no collections named {which}{there}")


def remove(names: list[str], waiting: Waiting | None = None) -> dict[str, int]:
    """Remove whole collections (their entries and their record), each name's entry count; every name is checked
    first, in the same transaction, and an unknown one removes nothing."""
    if not storedb.present():
        raise UsageError(f"no collection named {names[0]!r}: there are no collections yet")
    with storedb.db(create=False, write=True) as db:
        conn = db.conn
        with _writing(conn, waiting):
            error = _missing(conn, names)
            if error is not None:
                raise error
            removed = {}
            for n in dict.fromkeys(names):
                removed[n] = conn.execute("DELETE FROM embeddings WHERE collection = ?", (n,)).rowcount
                conn.execute("DELETE FROM collections WHERE name = ?", (n,))
        return removed


ID_LIST_MAX = 5  # unknown ids named in an error, at most


def remove_ids(name: str, ids: list[str], waiting: Waiting | None = None) -> tuple[int, int]:
    """Remove some entries of one collection (it stays, even empty); every id is checked first, in the same
    transaction, and an unknown one removes nothing. How many were removed, and how many are left."""
    import json

    if not storedb.present():
        raise UsageError(f"no collection named {name!r}: there are no collections yet")
    wanted = sorted(set(ids))
    with storedb.db(create=False, write=True) as db:
        conn = db.conn
        with _writing(conn, waiting):
            error = _missing(conn, [name])
            if error is not None:
                raise error
            held = {r[0] for r in conn.execute(
                "SELECT id FROM embeddings WHERE collection = ? AND id IN (SELECT value FROM json_each(?))",
                (name, json.dumps(wanted)))}
            unknown = [i for i in wanted if i not in held]
            if unknown:
                shown = ", ".join(repr(i) for i in unknown[:ID_LIST_MAX])
                more = f" and {len(unknown) - ID_LIST_MAX:,} more" if len(unknown) > ID_LIST_MAX else ""
                raise LocalgenError(f"collection {name!r} has no entry {shown}{more}; nothing was removed")
            removed: int = conn.execute(
                "DELETE FROM embeddings WHERE collection = ? AND id IN (SELECT value FROM json_each(?))",
                (name, json.dumps(wanted))).rowcount
            _written(conn, name, time.time())
            left: int = conn.execute("SELECT count(*) FROM embeddings WHERE collection = ?", (name,)).fetchone()[0]
        return removed, left


def written(name: str) -> float | None:
    """When the collection was last written (an entry stored or removed; made, before any was), read cheaply
    (its one record); None when there is no such collection. A search that keeps the vectors in memory (a
    chat's) reads them again when this changes."""
    if not storedb.present():
        return None
    with storedb.db(create=False) as db:
        if "written" in db["collections"].columns_dict:
            row = db.conn.execute("SELECT coalesce(written, created) FROM collections WHERE name = ?",
                                  (name,)).fetchone()
            return None if row is None else float(row[0])
        row = db.conn.execute("SELECT c.created, max(e.updated) FROM collections c LEFT JOIN embeddings e ON "
                              "e.collection = c.name WHERE c.name = ? GROUP BY c.name", (name,)).fetchone()
    return None if row is None else max(float(row[0]), float(row[1] or 0))


def stored_bytes(name: str) -> int:
    """What a collection's texts and vectors take in the database (their bytes, without SQLite's overhead)."""
    with storedb.db(create=False) as db:
        row = db.conn.execute("SELECT coalesce(sum(length(CAST(content AS BLOB)) + length(embedding)), 0) "
                              "FROM embeddings WHERE collection = ?", (name,)).fetchone()
    return int(row[0])


def vectors(name: str) -> list[tuple[str, str, bytes]]:
    """Every (id, text, packed vector) of a collection."""
    with storedb.db(create=False) as db:
        return [(r["id"], r["content"], r["embedding"]) for r in db.query(
            "SELECT id, content, embedding FROM embeddings WHERE collection = ?", [name])]


def pack(vec: list[float]) -> bytes:
    """float32, little-endian (what OpenAI's base64 encoding holds too)."""
    return struct.pack(f"<{len(vec)}f", *vec)


def b64(vec: list[float]) -> str:
    """A vector as OpenAI's API sends it with encoding_format base64: packed float32, base64."""
    import base64

    return base64.b64encode(pack(vec)).decode()
