"""The texts `localgen embed` and `localgen rerank` read: their arguments, a --file or stdin lines, each line a text or
a JSON line with its id; bounded before they are read, checked as UTF-8 text, an id on two lines refused for --store."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from localgen.cli.documents import BOM, MAX_INPUT, controls
from localgen.cli.inputfile import file_source, shown_input
from localgen.cli.output import plural
from localgen.errors import UsageError

NAMED_LINES = 5  # of a repeated id's lines, named in its error


def read_texts(texts: list[str] | None, file: Path | None, by_content: bool = False,
               verb: str = "embed", unique: bool = False) -> list[tuple[str, str]]:
    """(id, text) pairs: the arguments (numbered, or with `by_content` each its content's id), else --file,
    else stdin lines (the line number, or a JSON line's "id"); blank lines are skipped, a blank argument is a
    usage error. Lines end at "\n" alone (a JSON line's text may hold U+2028 or a form feed). `verb`: what the
    command does with them, for its errors (embed, rerank). `unique` (--store, one text an id): an id on two
    lines is a usage error naming them; a text given twice as an argument is taken once."""
    import json

    from localgen.embeddings.store import text_id
    from localgen.text import checked

    if texts:
        if file:
            raise UsageError("give texts as arguments or with --file, not both")
        what = "document" if verb == "rerank" else "text"
        for i, t in enumerate(texts, 1):
            if not t.strip():  # an empty variable in a script, not a text
                raise UsageError(f"{what} {i} is empty{'' if not t else ' or only whitespace'}",
                                 hint=f"give the {what}, or leave the argument out")
        given = [checked(t, f"text {i}") for i, t in enumerate(texts, 1)]
        pairs = [(text_id(t) if by_content else str(i), t) for i, t in enumerate(given, 1)]
        return list(dict(pairs).items()) if unique and by_content else pairs
    if file:
        from localgen.text import decode

        shown = shown_input(file)  # --file - is stdin, named so
        with file.open("rb") as stream:
            data = stream.read(MAX_INPUT + 1)  # only one byte past the bound (a huge file, /dev/zero)
        _bounded(len(data), shown, verb)
        lines = decode(data, shown).removeprefix(BOM).split("\n")
        source = file_source(file)
    elif sys.stdin is not None and not sys.stdin.isatty():
        text = sys.stdin.read(MAX_INPUT + 1)
        _bounded(len(text), "stdin", verb)
        lines = text.removeprefix(BOM).split("\n")
        source = "stdin"
    else:
        what = "documents" if verb == "rerank" else "texts"
        raise UsageError(f"nothing to {verb}: give {what} as arguments, --file, or lines on stdin")
    out = []
    seen: dict[str, list[int]] = {}  # each id's lines
    for n, line in enumerate(lines, 1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        ident, text = str(n), line
        if line.lstrip().startswith("{"):
            try:
                doc = json.loads(line)
                text = doc.get("text", doc.get("content"))
                if not isinstance(text, str):
                    raise ValueError('needs a "text" string')
                if not text.strip():  # as an empty argument: a field left empty, not a text (a blank line is
                    raise ValueError(f'its "text" is empty{"" if not text else " or only whitespace"}')  # skipped)
                ident = _id(doc.get("id", n))
            except (ValueError, AttributeError) as e:
                raise UsageError(f"line {n}: bad JSON line: {e}") from None
        out.append((ident, checked(text, f"line {n}")))
        seen.setdefault(ident, []).append(n)
    if not out:
        raise UsageError(f"nothing to {verb}: {source} is empty" if not "\n".join(lines) else
                         f"nothing to {verb}: every line of {source} is blank")
    if unique:
        _unique_ids(seen)
    return out


def _unique_ids(seen: dict[str, list[int]]) -> None:
    """A usage error naming the first id that more than one line gives (with --store, the later text would replace
    the earlier)."""
    repeated = [(ident, lines) for ident, lines in seen.items() if len(lines) > 1]
    if not repeated:
        return
    ident, lines = repeated[0]
    named = [f"{n:,}" for n in lines[:NAMED_LINES]]
    where = (", ".join(named[:-1]) + " and " + named[-1]) if len(lines) <= NAMED_LINES else ", ".join(named) + " ..."
    more = f" (and {plural(len(repeated) - 1, 'other id')} repeated)" if len(repeated) > 1 else ""
    raise UsageError(f"the id {ident!r} is on lines {where}{more}: a collection holds one text an id",
                     hint="give each text its own id")


def _id(value: Any) -> str:
    """A JSON line's "id" as its entry's id: a string (one line, not empty, valid Unicode) or a whole number; a
    ValueError otherwise (null, true, an object would be stored as the words None, True, {...})."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if value == "":  # "" is a string on one line: the rule below would not say what is wrong with it
        raise ValueError('its "id" is empty: give a string on one line, or a whole number, or leave "id" out')
    if not isinstance(value, str) or controls(value):
        raise ValueError('its "id" must be a string on one line, or a whole number')
    from localgen.text import problem

    why = problem(value)  # a lone surrogate escape (\udc80): no UTF-8 holds it, to print or to store
    if why is not None:
        raise ValueError(f'its "id" is not valid UTF-8 text: {why}')
    return value


def _bounded(size: int, what: str, verb: str) -> None:
    if size > MAX_INPUT:
        raise UsageError(f"{what} is larger than {MAX_INPUT >> 20} MiB: {verb} it in parts")
