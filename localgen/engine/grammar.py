"""Grammars: JSON schemas turned into GBNF, and GBNF checked by llama.cpp's own parser before any work."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from localgen.errors import GrammarError


def grammar_from_json_schema(schema_text: str) -> str:
    """Convert a JSON schema to GBNF, or raise GrammarError."""
    import json

    try:
        json.loads(schema_text)
    except json.JSONDecodeError as e:
        raise GrammarError(f"the JSON schema is not valid JSON: {e}") from None
    from localgen.engine.lib import lib

    lib()
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        return str(json_schema_to_gbnf(schema_text))
    except Exception as e:  # the converter raises bare Exceptions of many kinds for schemas it cannot handle
        raise GrammarError(f"cannot turn the JSON schema into a grammar: {e}") from None


def check_grammar(lc: Any, vocab: Any, gbnf: str) -> None:
    """Parse a GBNF grammar natively, so a bad one is an error before any work (the bindings never check
    whether the parse failed; the parser's message goes straight to fd 2, and is captured from there)."""
    with _capture_fd2() as captured:
        sampler = lc.llama_sampler_init_grammar(vocab, gbnf.encode("utf-8"), b"root")
    if not sampler:
        why = next((ln.strip() for ln in captured() if "error" in ln), "")
        why = why.split("error parsing grammar:", 1)[-1].strip().rstrip(":")
        raise GrammarError("the grammar does not parse" + (f": {why}" if why else ""))
    lc.llama_sampler_free(sampler)


@contextlib.contextmanager
def _capture_fd2() -> Iterator[Any]:
    """Capture what native code writes straight to fd 2 (llama.cpp's grammar parser uses fprintf)."""
    import sys
    import tempfile

    lines: list[str] = []
    with tempfile.TemporaryFile() as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield lambda: lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines.extend(tmp.read().decode("utf-8", errors="replace").splitlines())
