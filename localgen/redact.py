"""Keeping a secret out of what localgen says: an upstream server's text (an error message, a stream's error
event) that repeats the key it was sent has the key replaced by `***` before it is shown or stored, and so has
any piece of it from its first PREFIX characters on (a server that prints `sk-verys...`); a URL's query string,
which may carry a key (`?api_key=`), is hidden in messages."""

from __future__ import annotations

from urllib.parse import urlsplit

PREFIX = 8  # this many leading characters of a key, or more of it, are taken for the key


def scrubbed(text: str, key: str | None) -> str:
    """`text` with `key`, and every run of at least its first PREFIX characters, replaced by `***`."""
    if not key or not text:
        return text
    text = text.replace(key, "***")
    head = key[:PREFIX]
    if len(head) < PREFIX:
        return text
    out: list[str] = []
    at = 0
    while (found := text.find(head, at)) >= 0:
        end = found + len(head)
        while end < len(text) and end - found < len(key) and text[end] == key[end - found]:
            end += 1
        out += [text[at:found], "***"]
        at = end
    return "".join(out) + text[at:]


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
