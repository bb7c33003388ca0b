"""A request's body as a JSON object of valid Unicode, bounded in depth, or a 400 (its size and content type
were checked by serve/guard.py before the route ran)."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from localgen.serve.apierror import HTTPError

# A JSON body nested deeper than this is refused before anything walks it (json.loads itself recurses).
MAX_DEPTH = 64


async def read_json(request: Request) -> dict[str, Any]:
    """The body as a JSON object of valid Unicode, or a 400."""
    try:
        body = json.loads(await request.body() or b"{}")
    except RecursionError:
        raise HTTPError(400, f"the request body is nested too deeply (at most {MAX_DEPTH} levels)") from None
    except json.JSONDecodeError as e:  # where, in our words: Python's own message is no client's business
        raise HTTPError(400, f"the request body is not valid JSON at line {e.lineno}, column {e.colno}") from None
    except UnicodeDecodeError as e:
        raise HTTPError(400, f"the request body is not valid UTF-8 at byte {e.start + 1}: send JSON as UTF-8 "
                             "text") from None
    except ValueError:  # a number of more than 4,300 digits, say
        raise HTTPError(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise HTTPError(400, "the request body must be a JSON object")
    if _depth(body) > MAX_DEPTH:
        raise HTTPError(400, f"the request body is nested too deeply (at most {MAX_DEPTH} levels)")
    try:  # JSON's \ud800 escapes decode to lone surrogates, which no tokenizer can take
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        raise HTTPError(400, "the request body holds invalid Unicode (a lone surrogate, "
                             f"\\u{ord(e.object[e.start]):04x}): send UTF-8 text") from None
    return body


def _depth(doc: Any) -> int:
    """How deeply a decoded JSON document nests (iteratively: no recursion to exhaust)."""
    deepest, todo = 0, [(doc, 1)]
    while todo:
        node, d = todo.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, d)
            if d <= MAX_DEPTH:
                todo.extend((child, d + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest
