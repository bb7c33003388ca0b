"""Whether a host name can be looked up at all: what the system resolver is given is its IDNA form, and a name
with an empty label (`a..b`) or one over 63 characters cannot be written so (Python raises UnicodeError, not the
OSError a lookup gives); nor a name of characters IDNA 2008 refuses (httpx's check: a snowman, a zero-width
space). And an http(s) URL checked as a whole, the same way wherever one is typed (`--endpoint`, `--mcp`)."""

from __future__ import annotations

import re
from urllib.parse import SplitResult, urlsplit

from localgen.errors import UsageError


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


def checked_url(url: str, where: str, example: str) -> SplitResult:
    """`url` split, or a UsageError where it cannot be an http(s) URL to reach: a bracket left open, a port of
    letters, 0 or past 65535, another scheme or no host, a host name with a blank or an empty label. `where` names
    where it came from (`--mcp`, `LOCALGEN_ENDPOINT`, `FILE: [box] url`) and begins the message; the URL is shown
    without its password or query; `example` is a good URL of that kind, for the hint."""
    from localgen.redact import url_shown

    bare = re.sub(r"//[^/?#]*@", "//***@", re.split(r"[?#]", url, maxsplit=1)[0])  # urlsplit may refuse it
    try:
        parts = urlsplit(url)
    except ValueError as e:  # an unclosed [, a bracketed host that is not an IPv6 address
        hint = "an IPv6 address goes in brackets: " + re.sub(r"//[^/]*", "//[::1]:8000", example, count=1)
        raise UsageError(f"{where}: {bare!r} is not a valid URL ({str(e)[:1].lower() + str(e)[1:]})",
                         hint=hint if "[" in bare else None) from None
    try:
        port = parts.port
    except ValueError:  # letters, or past 65535
        port = 0
    if port == 0:
        raise UsageError(f"{where} {bare}: the port must be 1 to 65535")
    shown = url_shown(url)
    if parts.scheme not in ("http", "https"):
        raise UsageError(f"{where} needs an http:// or https:// URL, not {shown!r}")
    if fault := host_fault(parts.hostname or ""):
        raise UsageError(f"{where}: {shown!r} has {fault}", hint=f"e.g. {example}")
    return parts


def lookup_fault(host: str, e: OSError) -> str:
    """A failed name lookup of `host` (a socket.gaierror), to follow "cannot ... WHERE: " in a message: a lookup that
    failed for now (no answer from DNS, EAI_AGAIN), which a retry or an address may get past, apart from a name the
    resolver does not know, apart from any other failure of the name service. `temporary_lookup(e)` tells the first."""
    if temporary_lookup(e):
        return f"{host} could not be resolved right now (a temporary failure of the name lookup)"
    if unknown_name(e):
        return f"no such host: {host} is not found"
    return f"{host} could not be resolved: {e.strerror or e}"


def temporary_lookup(e: OSError) -> bool:
    """Whether a failed lookup failed for now (EAI_AGAIN): the name may well exist."""
    import socket

    return e.errno == socket.EAI_AGAIN


def unknown_name(e: OSError) -> bool:
    """Whether a failed lookup says the name does not exist (or has no address): EAI_NONAME, NODATA, ADDRFAMILY."""
    import socket

    return e.errno in {getattr(socket, n) for n in ("EAI_NONAME", "EAI_NODATA", "EAI_ADDRFAMILY") if hasattr(socket, n)}
