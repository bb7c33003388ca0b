"""llama.cpp's grammar pieces: the bindings' JSON-schema converter, and GBNF checked by llama.cpp's own parser
before any work (engine/grammar.py makes the schemas and grammars)."""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Iterator
from typing import Any

from localgen.errors import GrammarError


def schema_converter(limit: int | None = None, what: str = "the JSON schema makes") -> Any:
    """The bindings' SchemaConverter (llama_cpp.llama_grammar), set as localgen uses it (_compat: its strings
    escaped as GBNF reads them), with integer ranges (minimum, maximum, ...) made rules as llama.cpp's own
    converter makes them (native/intrange.py), and patterns and repetition counts written flat
    (native/pattern.py). `limit`: a GrammarError ("{what} a grammar of more than {limit} characters") as soon as
    its rules pass that many characters, so a schema whose references fan out stops early rather than building
    megabytes of grammar."""
    from localgen import _compat
    from localgen.native.lib import lib

    lib()
    from llama_cpp.llama_grammar import PRIMITIVE_RULES, RESERVED_NAMES, STRING_FORMAT_RULES

    from localgen.native.intrange import integer_rule
    from localgen.native.pattern import pattern_rule, repetition

    class Converter(_compat.schema_converter_class()):  # type: ignore[misc]
        chars = 0  # the rules' characters so far, as format_grammar writes them

        def _add_rule(self, name: str, rule: str) -> Any:
            before = len(self._rules)
            key = super()._add_rule(name, rule)
            if limit is not None and len(self._rules) > before:  # a rule of its own, not one already there
                self.chars += len(key) + len(rule) + 6
                if self.chars > limit:
                    raise GrammarError(f"{what} a grammar of more than {limit:,} characters, the most one may have",
                                       hint="define fewer or flatter types")
            return key

        def visit(self, schema: Any, name: str) -> Any:
            rule = integer_rule(schema)
            if rule is None:
                rule = self._repeated(schema, name)
            if rule is None:
                return super().visit(schema, name)
            return self._add_rule(name + "-" if name in RESERVED_NAMES else name or "root", rule)

        def _repeated(self, schema: Any, name: str) -> str | None:
            """A string's minLength/maxLength and an array's minItems/maxItems as flat repetitions
            (native/pattern.py), where the bindings would nest optionals; None for any other schema."""
            if not isinstance(schema, dict) or any(k in schema for k in ("$ref", "oneOf", "anyOf", "const", "enum")):
                return None
            kind = schema.get("type")
            if kind == "string" and "pattern" not in schema and ("minLength" in schema or "maxLength" in schema):
                fmt = str(schema.get("format") or "")
                if re.match(r"^uuid[1-5]?$", fmt) or f"{fmt}-string" in STRING_FORMAT_RULES:
                    return None
                char = self._add_primitive("char", PRIMITIVE_RULES["char"])
                lo, hi = _count(schema.get("minLength"), 0) or 0, _count(schema.get("maxLength"), None)
                return '"\\"" ' + repetition(char, lo, hi) + ' "\\"" space'
            items = schema.get("items")
            if kind == "array" and isinstance(items, dict) and "prefixItems" not in schema:
                item = self.visit(items, f"{name}{'-' if name else ''}item")
                lo, hi = _count(schema.get("minItems"), 0) or 0, _count(schema.get("maxItems"), None)
                return '"[" space ' + repetition(item, lo, hi, sep='"," space') + ' "]" space'
            return None

        def _visit_pattern(self, pattern: str, name: str) -> Any:
            return self._add_rule(name, pattern_rule(pattern, name, self._add_rule))

    return Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)


def _count(value: Any, default: int | None) -> int | None:
    """A repetition bound as a whole number (a schema may write 3.0), or `default` where it has none."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return default
    return max(0, int(value)) if value != float("inf") else default


def check_grammar(vocab: Any, gbnf: str) -> None:
    """Parse a GBNF grammar natively, so a bad one is an error before any work (the bindings never check
    whether the parse failed; the parser's message goes straight to fd 2, and is captured from there). `vocab`
    None: no model's (the vocabulary is read only for token references, `<[id]>`, which a grammar made from a
    schema never holds)."""
    from localgen.native.lib import lib

    lc = lib()
    with _capture_fd2(gbnf) as captured:
        sampler = lc.llama_sampler_init_grammar(vocab, gbnf.encode("utf-8"), b"root")
    if not sampler:
        why = next((ln.strip() for ln in captured() if "error" in ln), "")
        why = why.split("error parsing grammar:", 1)[-1].strip().rstrip(":")
        if why.endswith(" at"):  # the parser quotes the text from where it stopped: none, at the end
            why += " the end of the grammar"
        why = why or _logged_why()
        raise GrammarError("the grammar does not parse" + (f": {why}" if why else ""))
    try:
        if vocab is not None and not _admits_a_token(lc, vocab, sampler):
            raise GrammarError("the grammar admits no token of this model at its start (a literal holding NUL, a "
                               "character class that matches nothing, a token the model lacks): no answer can "
                               "follow it")
    finally:
        lc.llama_sampler_free(sampler)


def _admits_a_token(lc: Any, vocab: Any, sampler: Any) -> bool:
    """Whether a grammar's sampler, fresh, allows any of the vocabulary's tokens (end-of-generation ones among
    them): the grammar applied to the first FIRST_TOKENS (single bytes and the commonest pieces, where a grammar
    that admits anything mostly finds a token), then, only if none is allowed there, to the rest."""
    import ctypes

    import numpy as np

    n = int(lc.llama_vocab_n_tokens(vocab))
    for lo, hi in ((0, min(n, FIRST_TOKENS)), (FIRST_TOKENS, n)):
        if hi <= lo:
            continue
        buf = np.zeros(hi - lo, dtype=[("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
        buf["id"] = np.arange(lo, hi, dtype=np.int32)
        arr = lc.llama_token_data_array(buf.ctypes.data_as(ctypes.POINTER(lc.llama_token_data)), hi - lo, -1, False)
        lc.llama_sampler_apply(sampler, ctypes.byref(arr))
        if np.isfinite(buf["logit"]).any():
            return True
    return n <= 0


FIRST_TOKENS = 2048  # tokens a grammar is tried on first (all of a large vocabulary cost a request too much)


def _logged_why() -> str:
    """Why llama.cpp refused a grammar that parsed, from its log (the checks after the parse log, not print)."""
    from localgen.native import logs

    for line in reversed(logs.lines(5)):
        if "left recursion" in line:
            return ("a rule is left-recursive (it can begin with itself, as in x ::= x \"a\"), which llama.cpp "
                    "cannot follow")
        if "does not contain a 'root' symbol" in line:
            return "it has no root rule (root ::= ...), where the answer starts"
    return ""


# fd 2 is the process's: two captures at once (a server's worker and a request's schema) would each restore
# the other's file as stderr
_FD2 = threading.Lock()


@contextlib.contextmanager
def _capture_fd2(gbnf: str) -> Iterator[Any]:
    """Capture what native code writes straight to fd 2 while llama.cpp parses `gbnf` (its parser uses fprintf),
    through a pipe drained by a thread: no temporary file, so a machine with no folder to write to (a read-only
    container, `ulimit -f`) parses grammars all the same. The parser's own error (its line, then the grammar) is
    kept for the caller; whatever else came meanwhile (another thread's log lines: a server's access log) is
    written on to the real stderr."""
    import sys

    lines: list[str] = []
    chunks: list[bytes] = []
    with _FD2:
        fds = _pipe_and_saved_fd2()
        if fds is None:  # out of descriptors: parse all the same, a bad grammar's error without the parser's why
            yield lambda: lines
            return
        read_end, write_end, saved = fds

        def drain() -> None:
            try:
                while chunk := os.read(read_end, 65536):
                    chunks.append(chunk)
            finally:
                os.close(read_end)

        reader = threading.Thread(target=drain, name="localgen-fd2", daemon=True)
        reader.start()
        sys.stderr.flush()
        os.dup2(write_end, 2)
        os.close(write_end)
        try:
            yield lambda: lines
        finally:
            os.dup2(saved, 2)  # the pipe's last writer closed: the reader sees its end
            os.close(saved)
            reader.join(timeout=5)  # a process started meanwhile holds the pipe as its stderr: what came is enough
            own, rest = _parser_output(b"".join(chunks), gbnf)
            lines.extend(own.decode("utf-8", errors="replace").splitlines())
            if rest:
                with contextlib.suppress(OSError):
                    _write_all(2, rest)


def _parser_output(data: bytes, gbnf: str) -> tuple[bytes, bytes]:
    """Captured bytes split into the grammar parser's error (its "error parsing grammar" line, then a blank line
    and the grammar it was given) and the rest, in order."""
    mark = data.find(b"error parsing grammar:")
    if mark < 0:
        return b"", data
    start = data.rfind(b"\n", 0, mark) + 1
    end = data.find(b"\n", mark)
    end = len(data) if end < 0 else end + 1
    echoed = b"\n" + gbnf.encode("utf-8") + b"\n"
    if data.startswith(echoed, end):
        end += len(echoed)
    return data[start:end], data[:start] + data[end:]


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _pipe_and_saved_fd2() -> tuple[int, int, int] | None:
    """A pipe's read and write ends and a copy of fd 2, or None when the process has no descriptors left."""
    try:
        read_end, write_end = os.pipe()
    except OSError:
        return None
    try:
        return read_end, write_end, os.dup(2)
    except OSError:
        os.close(read_end)
        os.close(write_end)
        return None
