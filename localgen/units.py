"""The one byte formatter. Stdlib only."""

from __future__ import annotations

_LARGE = ("GiB", "TiB", "PiB", "EiB")  # 2^30 and on (an int64 of bytes ends at 8 EiB)


def format_bytes(n: float | None, llama_bench: bool = False) -> str:
    """Sizes as people read them, labelled as the binary multiples they are: "1.5 TiB", "1.2 GiB", "94 MiB",
    "512 KiB", "100 bytes" (under a MiB it would round to 0 or 1 MiB); with `llama_bench`, that tool's own style
    ("92.10 MiB", "4.58 GiB"), so our tables read like its tables."""
    if not n:
        return "-"
    if llama_bench:
        return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 28 else f"{n / (1 << 20):.2f} MiB"
    if n >= 1 << 30:  # a 2 TiB server's RAM is "2.0 TiB", not "2,048.0 GiB"; the unit is the one its tenths fit under
        k = 0
        while k + 1 < len(_LARGE) and round(n / (1 << (30 + 10 * k)), 1) >= 1024:
            k += 1
        return f"{n / (1 << (30 + 10 * k)):,.1f} {_LARGE[k]}"
    if n >= 1 << 20:  # (1.5 MiB is not "2 MiB": under 10 a tenth shows)
        mib = n / (1 << 20)
        return f"{mib:,.0f} MiB" if mib >= 9.95 or round(mib, 1).is_integer() else f"{mib:.1f} MiB"
    return f"{n / 1024:,.0f} KiB" if n >= 1024 else f"{n:,.0f} bytes"


def format_amount(n: int) -> str:
    """format_bytes for an amount that may be none at all (the space left on a full disk, what a removal freed):
    "0 bytes" there, where a table's "-" would read as a missing value in a sentence."""
    return format_bytes(n) if n else "0 bytes"


def parse_bytes(text: str) -> int:
    """A size as people type it: 16M, 512k, 1G, 1.5MB, 2TiB, or plain bytes (binary multiples); ValueError
    otherwise."""
    import re

    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgtp]?)(?:i?b)?\s*", text.lower())  # ASCII digits: "٢٤G" is none
    if not m:
        raise ValueError(f"bad size {text!r}: use bytes, or e.g. 512k, 16M, 1G, 2T")
    return int(float(m.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
                                    "p": 1 << 50}[m.group(2)])
