"""A request's body as a JSON object of valid Unicode and finite numbers, bounded in depth, or a 400 (its size and
content type were checked by serve/guard.py before the route ran)."""

from __future__ import annotations

import json
import math
from typing import Any

from starlette.requests import Request

from localgen.serve.apierror import HTTPError

# A JSON body nested deeper than this is refused before anything walks it (json.loads itself recurses).
MAX_DEPTH = 64


class NotFinite(ValueError):
    """A JSON text's NaN, Infinity or number past a double's range (1e400), which Python's json reads but no answer
    can carry back (JSON has no such number): `where` it is, as a dotted path ("tools.0.parameters.maximum"; "" for
    the whole text)."""

    def __init__(self, where: str, literal: str):
        super().__init__(f"{where or 'the body'} is {literal}, not a finite number")
        self.where = where
        self.literal = literal


class _Odd:
    """A non-finite number as decoded, to be found and named where it is."""

    def __init__(self, literal: str):
        self.literal = literal if len(literal) <= 40 else literal[:37] + "..."


def decode(raw: bytes | str) -> Any:
    """JSON text decoded as json.loads does it (its errors too), with NotFinite for the first NaN, Infinity or
    number past a double's range: echoed into an answer, a stored response or a tool's schema, it made them
    invalid JSON (or the answer a 500 after the whole generation ran)."""
    odd: list[_Odd] = []

    def constant(literal: str) -> _Odd:
        odd.append(_Odd(literal))
        return odd[-1]

    def number(literal: str) -> float | _Odd:
        value = float(literal)
        return value if math.isfinite(value) else constant(literal)

    doc = json.loads(raw, parse_constant=constant, parse_float=number)
    if odd:
        where, found = _find(doc)
        raise NotFinite(where, found.literal)
    return doc


def _find(doc: Any) -> tuple[str, _Odd]:
    """Where in a decoded document its first _Odd is (iteratively, each node's path a link to its parent's: no
    recursion to exhaust, no path copied per node)."""
    todo: list[tuple[Any, Any]] = [(doc, None)]  # (node, its link: (its key, its parent's link), None at the top)
    while todo:
        node, link = todo.pop()
        if isinstance(node, _Odd):
            keys: list[str] = []
            while link is not None:
                keys.append(link[0])
                link = link[1]
            where = ".".join(reversed(keys))
            return (where if len(where) <= 200 else where[:197] + "..."), node
        children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        todo.extend(reversed([(child, (str(key), link)) for key, child in children]))
    raise AssertionError("no non-finite number in the document")


async def read_json(request: Request) -> dict[str, Any]:
    """The body as a JSON object of valid Unicode and finite numbers, or a 400."""
    try:
        body = decode(await request.body() or b"{}")
    except NotFinite as e:
        raise HTTPError(400, f"{e.where or 'the body'} is {e.literal}, not a finite number: JSON has no NaN or "
                             "Infinity, and a number must be within a double's range (about 1.8e308)",
                        param=e.where or None) from None
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
