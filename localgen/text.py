"""Text at the input boundary: every prompt, system prompt and stop string that reaches a tokenizer is
valid Unicode. Bytes that are not UTF-8 (which Python keeps as lone surrogates in argv and stdin) and JSON's
lone-surrogate escapes are refused with a message that says where, never passed on. Stdlib only."""

from __future__ import annotations

from localgen.errors import UsageError


def problem(text: str) -> str | None:
    """What makes `text` invalid Unicode (the first offender and where), or None when it is valid."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        code = ord(text[e.start])
        if 0xDC80 <= code <= 0xDCFF:  # a byte that did not decode, kept by Python's surrogateescape
            return f"byte 0x{code - 0xDC00:02x} at character {e.start + 1} is not UTF-8"
        return f"a lone surrogate (\\u{code:04x}) at character {e.start + 1}"
    return None


def checked(text: str, what: str) -> str:
    """`text` unchanged if it is valid Unicode; a UsageError naming `what` otherwise."""
    why = problem(text)
    if why is not None:
        raise UsageError(f"{what} is not valid UTF-8 text: {why}")
    return text
