"""Memory bandwidth, measured, to put generation rates against their limit: decoding one token reads each
weight it uses once, so tokens/s cannot exceed bandwidth / the bytes a token reads (on CPU and unified memory):
every weight, but of the token embedding's table one row, and of a mixture of experts' expert tensors only the
experts its router picks (bytes_per_token)."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localgen.types import GGUFSummary

REMEMBERED_S = 24 * 3600  # a measurement is reused for a day on the same machine


def bytes_per_token(path: str, s: GGUFSummary) -> int:
    """The weights one decoded token reads, from the GGUF header: every tensor, but of the token embedding's table
    one row (unless it is tied, and read whole as the output matrix), and of a mixture of experts' expert tensors
    the share its router picks for a token (expert_used_count of expert_count)."""
    from localgen.models import footprint

    w = footprint.layout(path)
    read = w.total
    if not w.tied and w.embedding:
        read -= w.embedding - w.embedding // max(1, s.vocab_size or 1)
    n, used = (s.metadata.get(f"{s.architecture}.{k}") for k in ("expert_count", "expert_used_count"))
    if w.moe and isinstance(n, int) and isinstance(used, int) and 0 < used < n:
        experts = sum(w.experts)
        read -= experts - experts * used // n
    return read


def measure(megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes per second of a large array copy (read + write counted), best of a few runs."""
    import numpy as np

    n = megabytes * (1 << 20) // 8
    src = np.ones(n, dtype=np.float64)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best


def measure_isolated() -> float | None:
    """measure() in a child process: a 1 GB copy in the benchmark's own process leaves its heap in a state
    that slowed later token decoding by 12-15 % here."""
    import subprocess
    import sys

    code = "from localgen.bench.bandwidth import measure; print(measure())"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
        return float(out.stdout.strip())
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def machine() -> list[object]:
    """What a measurement belongs to: this host, its architecture, CPUs and memory."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    return [platform.node(), platform.machine(), os.cpu_count(), memory]


def remembered() -> float | None:
    """measure_isolated(), kept for a day per machine in the cache dir: each measurement allocates and copies
    1 GB in a child process, a cost every `bench` would otherwise pay before its first test."""
    from localgen import paths

    path = paths.cache_dir() / "bandwidth.json"
    try:
        doc = json.loads(path.read_text())
        if doc["machine"] == machine() and 0 <= time.time() - float(doc["at"]) < REMEMBERED_S:
            return float(doc["bytes_per_s"])
    except (OSError, ValueError, TypeError, KeyError):
        pass
    measured = measure_isolated()
    if measured is not None:
        with contextlib.suppress(OSError):  # a cache that cannot be written costs the next bench a measurement
            paths.replace_text(path, json.dumps({"machine": machine(), "at": time.time(), "bytes_per_s": measured}))
    return measured
