"""SQLite helpers shared by the log (log/store.py) and embedding collections (embeddings/store.py)."""

from __future__ import annotations

from typing import Any


def sqlite_utils_module() -> Any:
    """sqlite_utils, imported without pandas: it imports pandas (and so pyarrow) at import time when they are
    installed, only to map pandas.Timestamp, which we never store. That costs a data-science venv half a second,
    and on a CUDA machine pyarrow's import after llama.cpp's libraries aborted the process (free(): invalid
    pointer, H100 image of 2026-11-23)."""
    import sys

    if "sqlite_utils" in sys.modules or "pandas" in sys.modules:
        import sqlite_utils

        return sqlite_utils
    sys.modules["pandas"] = None  # type: ignore[assignment]  # `import pandas` raises ImportError meanwhile
    try:
        import sqlite_utils
    finally:
        del sys.modules["pandas"]
    return sqlite_utils
