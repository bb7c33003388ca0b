"""SQLite helpers shared by the log (log/store.py) and embedding collections (embeddings/store.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def sqlite_utils_module() -> Any:
    """sqlite_utils, imported without pandas (the patch and its reasons: localgen/_compat.py)."""
    from localgen._compat import sqlite_utils_module as imported

    return imported()


def cannot_write(folder: Path) -> bool:
    """Whether nothing can be written in a database's folder: read-only, or no room left on its disk (SQLite's
    WAL then cannot make the file beside the database that even a reader needs)."""
    import os
    import shutil

    try:
        return not os.access(folder, os.W_OK) or shutil.disk_usage(folder).free < 1 << 20
    except OSError:
        return False


def read_only(path: Path) -> Any:
    """A sqlite3 connection that only reads `path` as it is (immutable: no WAL file beside it is made or read),
    for a database on a read-only or full disk, which no one can write either."""
    import sqlite3

    return sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro&immutable=1", uri=True)


DAMAGED = ("file is not a database", "database disk image is malformed")  # SQLite's words for a damaged file


def damaged(said: str) -> bool:
    """Whether SQLite's words `said` tell of a damaged file: DAMAGED's, or a virtual table that cannot be opened
    (a damaged page of an FTS5 index's tables: `vtable constructor failed: NAME`; its format record: `invalid fts5
    file format (found 99, expected 4) - run 'rebuild'`)."""
    return said in DAMAGED or said.startswith(("vtable constructor failed", "invalid fts5 file format"))
