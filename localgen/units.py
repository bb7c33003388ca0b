"""The one byte formatter. Stdlib only."""

from __future__ import annotations


def format_bytes(n: float | None, llama_bench: bool = False) -> str:
    """Sizes as people read them: "1.2 GB", "94 MB" (binary multiples); with `llama_bench`, that tool's
    own style ("92.10 MiB", "4.58 GiB"), so our tables read like its tables."""
    if not n:
        return "-"
    if llama_bench:
        return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 28 else f"{n / (1 << 20):.2f} MiB"
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GB"
    return f"{n / (1 << 20):,.0f} MB"
