"""Memory bandwidth, measured, to put generation rates against their limit: decoding one token reads
every weight once, so tokens/s cannot exceed bandwidth / model bytes (on CPU and unified memory)."""

from __future__ import annotations

import time


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
