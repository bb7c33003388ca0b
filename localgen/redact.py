"""Keeping a secret out of what localgen says: an upstream server's text (an error message, a stream's error
event) that repeats the key it was sent has the key replaced by `***` before it is shown or stored, and so has
any run of its first or last PREFIX characters or more (a server that prints `sk-verys...`); a URL's query
string, which may carry a key (`?api_key=`), is hidden in messages."""

from __future__ import annotations

from urllib.parse import urlsplit

PREFIX = 8  # this many leading characters of a key, or more of it, are taken for the key


def scrubbed(text: str, key: str | None) -> str:
    """`text` with `key` replaced by `***`, and with it every run of at least its first or its last PREFIX
    characters (a server that shows the ends of a key it refused)."""
    if not key or not text:
        return text
    text = text.replace(key, "***")
    if len(key) < PREFIX:
        return text
    return _ends_scrubbed(_starts_scrubbed(text, key), key)


def scrubbed_bytes(data: bytes, key: str | None) -> bytes:
    """scrubbed() of bytes (the key's UTF-8; bytes that are no UTF-8 pass as they are)."""
    if not key or not data:
        return data
    return scrubbed(data.decode("utf-8", "surrogateescape"), key).encode("utf-8", "surrogateescape")


def _starts_scrubbed(text: str, key: str) -> str:
    """Every run of the key's first PREFIX characters or more replaced by ***."""
    head = key[:PREFIX]
    out: list[str] = []
    at = 0
    while (found := text.find(head, at)) >= 0:
        end = found + len(head)
        while end < len(text) and end - found < len(key) and text[end] == key[end - found]:
            end += 1
        out += [text[at:found], "***"]
        at = end
    return "".join(out) + text[at:]


def _ends_scrubbed(text: str, key: str) -> str:
    """Every run of the key's last PREFIX characters or more replaced by *** (the mirror of _starts_scrubbed)."""
    return _starts_scrubbed(text[::-1], key[::-1])[::-1]


def url_shown(url: str) -> str:
    """The URL for a message: user:password@ replaced by ***@, a ?query (or #fragment) by ?*** (#***)."""
    parts = urlsplit(url)
    if "@" in parts.netloc:
        parts = parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2])
    if parts.query:
        parts = parts._replace(query="***")
    if parts.fragment:
        parts = parts._replace(fragment="***")
    return parts.geturl()
