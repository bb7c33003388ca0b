"""Whether a host name can be looked up at all: what the system resolver is given is its IDNA form, and a name
with an empty label (`a..b`) or one over 63 characters cannot be written so (Python raises UnicodeError, not the
OSError a lookup gives); nor a name of characters IDNA 2008 refuses (httpx's check: a snowman, a zero-width
space)."""

from __future__ import annotations

import re


def host_fault(host: str) -> str | None:
    """What is wrong with `host`, to follow "has" in a message (a blank or a control character, an empty label or
    one over 63 characters), or None."""
    if not host or re.search(r"[\s\x00-\x1f\x7f]", host):
        return "no valid host name"
    if host.startswith("[") or ":" in host:  # an IPv6 address: urlsplit has checked it
        return None
    try:
        host.encode("idna")
    except UnicodeError as e:
        if host.isascii():
            return "a host name with an empty label or a label over 63 characters"
        return f"a host name IDNA cannot write ({str(e)[:80]})"
    if not host.isascii():  # httpx writes it by IDNA 2008 (the idna package), stricter than Python's codec
        import idna

        try:
            idna.encode(host.lower())
        except idna.IDNAError as e:
            return f"a host name IDNA cannot write ({str(e)[:80]})"
    return None
