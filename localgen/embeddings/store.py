"""Collections: named sets of embeddings with their ids and texts, in one SQLite database in the data dir
(through sqlite-utils; mode 0600 in a 0700 folder). A collection remembers the model, pooling and size it
was made with, so every later text and query is embedded the same way; a text whose SHA-256 is unchanged
is not embedded again (as `llm embed-multi` does)."""

from __future__ import annotations

import hashlib
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localgen import paths
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


def path() -> Path:
    """Where collections are kept."""
    return paths.data_dir() / "embeddings" / "embeddings.db"


def _db(create: bool) -> Any:
    from localgen.sqlitedb import sqlite_utils_module

    sqlite_utils = sqlite_utils_module()

    db_path = path()
    if not db_path.exists():
        if not create:
            raise UsageError("there are no collections yet", hint="make one with `localgen embed --store NAME`")
        paths.private_file(db_path)
    try:
        db = sqlite_utils.Database(db_path)
        db.conn.execute("PRAGMA busy_timeout = 30000")
        if create and "collections" not in db.table_names():
            db.conn.execute("PRAGMA journal_mode=WAL")
            db.table("collections").create({"name": str, "model": str, "model_spec": str, "pooling": str,
                                      "dimensions": int, "normalized": int, "created": float}, pk="name",
                                     if_not_exists=True)
            db.table("embeddings").create({"collection": str, "id": str, "content": str, "content_hash": str,
                                     "embedding": bytes, "updated": float}, pk=("collection", "id"),
                                    if_not_exists=True)
        return db
    except Exception as e:  # sqlite3.DatabaseError and kin: a damaged file
        raise LocalgenError(f"the collections database {db_path} is unusable: {e}") from None


def get(name: str) -> Collection:
    """A collection by name; an error naming the ones there are."""
    db = _db(create=False)
    rows = list(db.table("collections").rows_where("name = ?", [name])) if "collections" in db.table_names() else []
    if not rows:
        names = [r["name"] for r in db["collections"].rows] if "collections" in db.table_names() else []
        raise UsageError(f"no collection named {name!r}" + (f" (there are: {', '.join(names)})" if names else ""))
    r = rows[0]
    return Collection(r["name"], r["model"], r["model_spec"], r["pooling"], int(r["dimensions"]),
                      bool(r["normalized"]))


def ensure(c: Collection) -> None:
    """Create the collection, or check that it was made the same way."""
    db = _db(create=True)
    rows = list(db.table("collections").rows_where("name = ?", [c.name]))
    if not rows:
        db.table("collections").insert({"name": c.name, "model": c.model, "model_spec": c.model_spec,
                                        "pooling": c.pooling, "dimensions": c.dimensions,
                                        "normalized": int(c.normalized), "created": time.time()})
        return
    r = rows[0]
    if (r["model"], r["pooling"], int(r["dimensions"])) != (c.model, c.pooling, c.dimensions):
        raise UsageError(f"collection {c.name!r} holds {r['model']} vectors ({r['pooling']} pooling, "
                         f"{r['dimensions']} dimensions), not {c.model} ({c.pooling}, {c.dimensions})",
                         hint=f"use -m {r['model_spec'] or r['model']}, or another collection name")


def content_hash(text: str) -> str:
    """The hash that says whether a text changed."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def unchanged(name: str, items: Iterable[tuple[str, str]]) -> set[str]:
    """Of (id, text) pairs, the ids stored with the same text already."""
    db = _db(create=True)
    stored = {r["id"]: r["content_hash"] for r in db.query(
        "SELECT id, content_hash FROM embeddings WHERE collection = ?", [name])}
    return {i for i, text in items if stored.get(i) == content_hash(text)}


def put(name: str, rows: list[tuple[str, str, list[float]]]) -> None:
    """Store (id, text, vector) rows, replacing what the ids held."""
    db = _db(create=True)
    now = time.time()
    db.table("embeddings").upsert_all(
        [{"collection": name, "id": i, "content": text, "content_hash": content_hash(text), "embedding": pack(vec),
          "updated": now} for i, text, vec in rows], pk=("collection", "id"))


def vectors(name: str) -> list[tuple[str, str, bytes]]:
    """Every (id, text, packed vector) of a collection."""
    db = _db(create=False)
    return [(r["id"], r["content"], r["embedding"]) for r in db.query(
        "SELECT id, content, embedding FROM embeddings WHERE collection = ?", [name])]


def pack(vec: list[float]) -> bytes:
    """float32, little-endian (what OpenAI's base64 encoding holds too)."""
    return struct.pack(f"<{len(vec)}f", *vec)


def b64(vec: list[float]) -> str:
    """A vector as OpenAI's API sends it with encoding_format base64: packed float32, base64."""
    import base64

    return base64.b64encode(pack(vec)).decode()
