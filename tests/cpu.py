"""Which CPU kernels made an output of llama.cpp's tools kept in tests/data (scripts/mtmd_reference.py records it
with each case; tests/conftest.py compares greedy text exactly only on such a CPU)."""

from __future__ import annotations

from pathlib import Path


def cpu_simd() -> str:
    """The widest vector instructions this CPU has, as llama.cpp's kernels choose by them: "avx512", "avx2", or
    "other" (another architecture, or no /proc/cpuinfo)."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text(errors="replace").split())
    except OSError:
        return "other"
    return "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "other"
