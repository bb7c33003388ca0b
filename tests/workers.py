"""serve's model worker for tests that drive it in-process (a Starlette TestClient in front of it)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def running_worker(path: Path, parallel: int) -> Iterator[Any]:
    """serve's ModelWorker for the model at `path` (a 1,024-token window per slot), loaded and its thread
    started; stopped on the way out."""
    from localgen.models.resolve import resolve
    from localgen.serve.worker import ModelWorker
    from localgen.types import LoadParams

    worker = ModelWorker(resolve(str(path)), LoadParams(n_ctx=1024), parallel=parallel, keep_alive=-1, max_queue=8)
    worker.preload()
    worker.start()
    try:
        yield worker
    finally:
        worker.stop()
