"""What an upstream server's error says, in one line: the one description run, chat, bench (remote/client.py)
and serve --endpoint (serve/upstream.py, serve/remotes.py) give of it. Standard library only, so that serve
imports it at start-up without the client (httpx and the stream parser)."""

from __future__ import annotations

import json
from typing import Any

MAX_ERROR_TEXT = 300  # characters of a server's error message shown (run, chat, bench and serve --endpoint alike)


def error_text(body: bytes | str | dict[str, Any]) -> str:
    """What a server's error body says, as run, chat, bench and serve --endpoint show it: OpenAI's error.message,
    Ollama's error, else the body's first line; MAX_ERROR_TEXT characters at most, a longer one cut with "…"
    ('' for an empty body)."""
    doc: Any = body
    if not isinstance(body, dict):
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        try:
            doc = json.loads(text)
        except ValueError:
            lines = text.strip().splitlines()
            return _cut(lines[0].strip()) if lines else ""
    err = doc.get("error", doc) if isinstance(doc, dict) else doc
    if isinstance(err, dict) and err.get("message"):
        err = err["message"]
    return _cut(err if isinstance(err, str) else json.dumps(err, ensure_ascii=False))


def _cut(text: str) -> str:
    return text if len(text) <= MAX_ERROR_TEXT else text[:MAX_ERROR_TEXT - 1] + "…"
