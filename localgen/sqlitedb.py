"""SQLite helpers shared by the log (log/store.py) and embedding collections (embeddings/store.py)."""

from __future__ import annotations

from typing import Any


def sqlite_utils_module() -> Any:
    """sqlite_utils, imported without pandas (the patch and its reasons: localgen/_compat.py)."""
    from localgen._compat import sqlite_utils_module as imported

    return imported()
