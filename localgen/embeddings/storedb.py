"""The collections database (embeddings/store.py's): where it is (`path`), opened for reading or writing (`db`; a
read-only disk or file still read), made once under a file lock (`make_schema`), and its failures in words: one
that cannot be written (`unwritable`), one SQLite cannot use (`unusable`: damaged, or not localgen's, only when it
is)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from localgen import paths
from localgen.errors import LocalgenError, UsageError
from localgen.oslimits import limit_cause, sqlite_files


def path() -> Path:
    """Where collections are kept."""
    return paths.data_dir() / "embeddings" / "embeddings.db"


BUSY_TIMEOUT_S = 30.0  # how long a writer waits for another (several `embed --store` at once)
TABLES = ("collections", "embeddings")


def unusable(db_path: Path, e: sqlite3.Error) -> LocalgenError:
    """SQLite's failure as one error naming the file: "move it aside" only for a file that is damaged, never for
    one that cannot be written (a read-only or full disk) or that another process held."""
    from localgen.sqlitedb import DAMAGED, cannot_write

    said = str(e)
    limit = limit_cause(e, sqlite_files(db_path))
    if limit:
        return LocalgenError(f"the collections database {db_path} cannot be used: {limit}")
    if said in DAMAGED:
        return LocalgenError(f"the collections database {db_path} is unusable: {said}",
                             hint="move it aside and store the collections again with `localgen embed --store`")
    if cannot_write(db_path.parent):
        return unwritable(db_path)
    busy = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)  # its primary code: an extended one (BUSY_SNAPSHOT) is too
    if isinstance(e, sqlite3.OperationalError) and (e.sqlite_errorcode & 0xFF) in busy:
        return LocalgenError(f"the collections database {db_path} is busy: another process held its write lock for "
                             f"{BUSY_TIMEOUT_S:g} s",
                             hint="run it again once that process ends: another `localgen embed --store` or "
                                  "`collections rm`?")
    return LocalgenError(f"the collections database {db_path} is unusable: {said}")


def unwritable(db_path: Path, e: OSError | None = None) -> LocalgenError:
    """The error for a database that cannot be written (its folder read-only, or its disk full), which is read;
    for `e`, the OSError met, out of descriptors or past the file size limit, that limit's."""
    import os

    limit = limit_cause(e) if e is not None else None
    if limit:
        return LocalgenError(f"the collections database {db_path} cannot be used: {limit}")
    folder = db_path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    why = "its folder is read-only" if not os.access(folder, os.W_OK) else "no space is left on its disk"
    return LocalgenError(f"the collections database {db_path} cannot be written: {why}",
                         hint="the collections in it can still be read: similar, collections, run --rag")


def present() -> bool:
    """Whether there is a database with tables: a missing file, an empty one, or one whose making stopped before
    its first table (a full disk) holds no collections yet, and the next `embed --store` makes it anew. A file
    SQLite cannot read counts as there, for db to say why."""
    db_path = path()
    try:
        if db_path.stat().st_size == 0:
            return False
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        conn = sqlite3.connect(f"{db_path.absolute().as_uri()}?mode=ro", uri=True)
        try:
            return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table'").fetchone() is not None
        finally:
            conn.close()
    except sqlite3.Error:
        return True


def connect(db_path: Path, writes: bool) -> sqlite3.Connection:
    """A connection to the database; for a reader on a read-only or full disk (where WAL cannot make the file it
    reads beside the database), one that reads the file as it is."""
    from localgen.sqlitedb import cannot_write, read_only

    conn = sqlite3.connect(db_path, timeout=BUSY_TIMEOUT_S)
    try:
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
    except sqlite3.OperationalError:
        conn.close()
        if writes or not cannot_write(db_path.parent):
            raise
        conn = read_only(db_path)
    return conn


@contextmanager
def db(create: bool, write: bool = False) -> Iterator[Any]:
    """The database (its tables made first if `create`; an older one's missing column added where the caller
    writes, `create` or `write`, never by a reader); any SQLite failure, in here or in the caller's statements,
    is one LocalgenError naming the file. A reader on a read-only disk reads it as it is; a database with no
    table at all (empty, or its making stopped) holds no collections yet."""
    from localgen.sqlitedb import sqlite_utils_module

    sqlite_utils = sqlite_utils_module()

    db_path = path()
    if not db_path.exists():
        blocker = paths.in_the_way_of(db_path.parent)
        if blocker is not None:  # a file where its folder goes: not "no collections yet, make one" (that failed)
            raise LocalgenError(f"the collections database {db_path} cannot be opened: {paths.in_the_way(blocker)}",
                                hint="move it away, and the next `localgen embed --store` makes the folder")
        if not create:
            raise UsageError("there are no collections yet", hint="make one with `localgen embed --store NAME`")
        try:
            paths.private_file(db_path)
        except OSError as e:
            raise unwritable(db_path, e) from None
    conn = None
    try:
        conn = connect(db_path, create or write)
        db = sqlite_utils.Database(conn)
        names = db.table_names()
        missing = [t for t in TABLES if t not in names]
        if create and (missing or conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal"):
            make_schema(db_path)
        elif not names:
            raise UsageError("there are no collections yet", hint="make one with `localgen embed --store NAME`")
        elif missing:
            raise LocalgenError(f"the collections database {db_path} has no {' or '.join(missing)} table",
                                hint="it is damaged or not localgen's: move it aside and store the collections "
                                     "again with `localgen embed --store`")
        elif (create or write) and not {"written", "model_id"} <= db["collections"].columns_dict.keys():
            make_schema(db_path)  # made before removals counted, or before models' fingerprints were recorded
        yield db
    except sqlite3.Error as e:  # sqlite3.DatabaseError and kin: a damaged file, a lock held past the timeout
        raise unusable(db_path, e) from None
    except OSError as e:  # the lock file the tables are made under (a read-only folder), a module's import
        raise unwritable(db_path, e) from None
    finally:
        if conn is not None:
            conn.close()


def make_schema(db_path: Path) -> None:
    """WAL (readers never wait for a writer) and the tables, once, whoever gets there first (a file lock: the
    switch to WAL needs the database to itself)."""
    from filelock import FileLock

    from localgen.sqlitedb import sqlite_utils_module

    sqlite_utils = sqlite_utils_module()
    with FileLock(str(db_path) + ".lock", mode=0o600):
        conn = sqlite3.connect(db_path, timeout=BUSY_TIMEOUT_S)
        try:
            db = sqlite_utils.Database(conn)
            conn.execute("PRAGMA journal_mode=WAL")
            db.table("collections").create({"name": str, "model": str, "model_spec": str, "pooling": str,
                                            "dimensions": int, "normalized": int, "created": float,
                                            "written": float, "model_id": str}, pk="name", if_not_exists=True)
            for column, kind in (("written", float), ("model_id", str)):  # a database made before they were
                if column not in db["collections"].columns_dict:
                    db["collections"].add_column(column, kind)
            db.table("embeddings").create({"collection": str, "id": str, "content": str, "content_hash": str,
                                           "embedding": bytes, "updated": float}, pk=("collection", "id"),
                                          if_not_exists=True)
            conn.commit()
        finally:
            conn.close()
