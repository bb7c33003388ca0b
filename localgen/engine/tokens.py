"""Token sequences: common prefixes, and where a prefix may end without cutting a media span."""

from __future__ import annotations

from typing import Any

from localgen.native.prompt import Prompt


def common_prefix(a: Any, b: Any) -> int:
    """Length of the common leading run of two token sequences."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def starts_with(seq: Any, prefix: Any) -> bool:
    """Whether token sequence `seq` begins with `prefix`."""
    return len(seq) >= len(prefix) and seq[:len(prefix)] == prefix


def safe_prefix(prompt: Prompt, n: int) -> int:
    """`n` moved back to the start of a media span of `prompt` it would cut (a span is evaluated whole or not
    at all); `n` itself for a prompt of text alone."""
    for start, span in prompt.spans.items():
        if start < n < start + span.n_pos:
            return int(start)
    return n
