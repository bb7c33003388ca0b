"""Whether a host name can be looked up at all: what the system resolver is given is its IDNA form, and a name
with an empty label (`a..b`) or one over 63 characters cannot be written so (Python raises UnicodeError, not the
OSError a lookup gives)."""

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
    except UnicodeError:
        return "a host name with an empty label or a label over 63 characters"
    return None
