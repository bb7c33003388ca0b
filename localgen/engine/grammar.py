"""Grammars: JSON schemas turned into GBNF, and GBNF checked by llama.cpp's own parser before any work.

Schemas are first made self-contained (engine/schemaresolve.py), so that llama-cpp-python's converter sees only
what it handles well, and refused where no value could meet them (engine/satisfiable.py).

One set of bounds for every schema and grammar, run's flags and serve's requests alike, checked before any work:
the converter expands repetition counts (minLength: 100000 gave 500 KB of grammar; 10^9 took 12 GB), and
llama.cpp parses a grammar in native code that Ctrl-C cannot reach (a 3 MB enum took minutes)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from localgen.engine.satisfiable import check_bounds, check_satisfiable
from localgen.engine.schemaresolve import resolve_schema, subschemas
from localgen.errors import GrammarError

MAX_SCHEMA_CHARS = 64 * 1024  # a JSON schema, as text
MAX_GRAMMAR_CHARS = 128 * 1024  # a GBNF grammar, given or made from a schema
TOOL_GRAMMAR_CHARS = 1024  # a tool's share where many make one grammar (run takes 1,000 MCP tools of ~300 each)
MAX_REPEAT = 4096  # minLength/minItems/minProperties/minContains, and a pattern's {m,n}; a maxLength/maxItems/
# maxProperties/maxContains above it is left out of the grammar (the answer is bounded by its tokens anyway)
MAX_GRAMMAR_DEPTH = 1000  # groups in groups: llama.cpp's parser recurses on each, and overflows near 20,000
REPEAT_KEYS = ("minLength", "minItems", "minProperties", "minContains")
UPPER_KEYS = ("maxLength", "maxItems", "maxProperties", "maxContains")
# a JSON string's character as llama.cpp's own converter writes it: the bindings' admits raw control characters
# (U+0000-U+001F), which JSON's text never holds (an answer with one is not JSON)
CHAR_RULE = r'char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})'


def grammar_from_json_schema(schema_text: str) -> str:
    """Convert a JSON schema to GBNF, or raise GrammarError (a schema or grammar past its bound among them)."""
    if len(schema_text) > MAX_SCHEMA_CHARS:
        raise GrammarError(f"the JSON schema is {len(schema_text):,} characters; at most {MAX_SCHEMA_CHARS:,}")
    try:
        schema = json.loads(schema_text)
    except json.JSONDecodeError as e:
        raise GrammarError(f"the JSON schema is not valid JSON: {e}") from None
    except RecursionError:
        raise GrammarError("the JSON schema nests too deeply to become a grammar") from None
    big = big_repeat(schema)
    if big:
        raise GrammarError(f"the JSON schema's {big[0]} is {big[1]:,}; at most {MAX_REPEAT:,}")
    check_json_schema(schema)
    # named, not `root`: the converter gives a top-level property the bare name, which can be a rule of its
    # own ("value", "string") and then stands for the wrong thing
    rules, names = schema_rules([schema], "schema")
    grammar = f"root ::= {names[0]}\n{rules}"
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"the JSON schema makes a grammar of {len(grammar):,} characters; at most "
                           f"{MAX_GRAMMAR_CHARS:,}")
    return grammar


def grammar_limit(schemas: int) -> int:
    """The most characters a grammar made from `schemas` schemas together (a request's or a run's tools) may
    have: MAX_GRAMMAR_CHARS, or TOOL_GRAMMAR_CHARS a schema where there are more (serve's 256 tools fit
    MAX_GRAMMAR_CHARS; a run's 1,000 MCP tools get 1 MB, and 4.5 MB of enums is refused)."""
    return max(MAX_GRAMMAR_CHARS, TOOL_GRAMMAR_CHARS * schemas)


def check_grammar_size(grammar: str, what: str = "the grammar", limit: int = MAX_GRAMMAR_CHARS) -> None:
    """A GrammarError for a GBNF grammar past `limit` characters or nested past MAX_GRAMMAR_DEPTH (llama.cpp would
    parse it where Ctrl-C cannot reach, and recurses on each group: 20,000 overflow its stack)."""
    if len(grammar) > limit:
        raise GrammarError(f"{what} is {len(grammar):,} characters; at most {limit:,}")
    check_grammar_depth(grammar, what)


def check_grammar_depth(grammar: str, what: str = "the grammar") -> None:
    """A GrammarError for a GBNF grammar nested past MAX_GRAMMAR_DEPTH, before llama.cpp parses it."""
    depth = grammar_depth(grammar)
    if depth > MAX_GRAMMAR_DEPTH:
        raise GrammarError(f"{what} nests groups {depth:,} deep; at most {MAX_GRAMMAR_DEPTH:,}")


def grammar_depth(grammar: str) -> int:
    """How deep a GBNF grammar's parentheses nest (those in literals, classes and comments left out)."""
    deepest = depth = 0
    i, n = 0, len(grammar)
    while i < n:
        c = grammar[i]
        if c in "\"[":
            close = '"' if c == '"' else "]"
            i += 1
            while i < n and grammar[i] != close:
                i += 2 if grammar[i] == "\\" else 1
        elif c == "#":
            while i < n and grammar[i] not in "\r\n":
                i += 1
        elif c == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif c == ")":
            depth -= 1
        i += 1
    return deepest


_NAMED = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")  # keys there are names


def loosen(schema: Any, names: bool = False) -> Any:
    """The schema with each upper repetition bound above MAX_REPEAT (a tool's `maxLength: 524288`) left out: the
    converter would spell out every place up to it, and the answer is bounded by its tokens anyway. `names`: a
    mapping of names to schemas (properties), whose keys are never keywords (a property called `const`)."""
    if isinstance(schema, list):
        return [loosen(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    if names:
        return {k: loosen(v) for k, v in schema.items()}
    return {k: v if k in ("const", "enum", "default", "examples") else loosen(v, names=k in _NAMED)
            for k, v in schema.items()
            if not (k in UPPER_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool) and v > MAX_REPEAT)}


def big_repeat(schema: Any) -> tuple[str, int] | None:
    """The first lower repetition bound in a schema over MAX_REPEAT, as (keyword, value); a `pattern`'s `{m,n}`
    counts (as "pattern repeat {m,n}"). Upper bounds over it are left out of the grammar (loosen)."""
    from localgen.native.pattern import pattern_repeats

    todo = [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            for k in REPEAT_KEYS:
                v = node.get(k)
                if isinstance(v, (int, float)) and not isinstance(v, bool) and v > MAX_REPEAT:
                    return k, int(v) if v < float("inf") else MAX_REPEAT + 1
            if isinstance(node.get("pattern"), str):
                big = next(((f"pattern repeat {text}", n) for text, n in pattern_repeats(node["pattern"])
                            if n > MAX_REPEAT), None)
                if big:
                    return big
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return None


def check_json_schema(schema: Any) -> None:
    """A GrammarError unless `schema` is valid against the JSON Schema metaschema it names (2020-12 when it
    names none): the converter takes `{"type": "objekt"}` or a nested `"strng"` for "anything"."""
    import jsonschema

    if not isinstance(schema, (dict, bool)):  # validator_for looks for "$schema" inside: a number has no inside
        shown = json.dumps(schema)
        raise GrammarError(f"the JSON schema is not valid: {shown if len(shown) <= 80 else shown[:77] + '...'} is not "
                           "of type 'object', 'boolean'")
    try:
        jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    except jsonschema.SchemaError as e:
        path = "/".join(str(p) for p in e.absolute_path)
        raise GrammarError(f"the JSON schema is not valid{f' at {path}' if path else ''}: {e.message}") from None
    except RecursionError:
        raise GrammarError("the JSON schema nests too deeply to become a grammar") from None


def schema_rules(schemas: Sequence[Any], prefix: str) -> tuple[str, list[str]]:
    """GBNF for several schemas at once, sharing their common rules: the rules' text, and the name of each
    schema's rule. `prefix` names the rules (schema i's is `{prefix}{i}`); "" gives one schema's grammar,
    rooted at `root`."""
    from localgen.native.grammar import schema_converter

    # bounded as it builds: a schema whose $refs fan out (2 per level, 12 levels) made 46 MB for llama.cpp to parse
    converter = schema_converter(grammar_limit(len(schemas)), "the JSON schemas make" if len(schemas) > 1 else
                                 "the JSON schema makes")
    names: list[str] = []
    try:
        for i, schema in enumerate(schemas):
            try:
                big = big_repeat(schema)  # before any of it is converted: tools come here unchecked
                if big:
                    raise GrammarError(f"the JSON schema's {big[0]} is {big[1]:,}; at most {MAX_REPEAT:,}")
                check_satisfiable(schema)
                resolved = resolve_schema(loosen(schema))
                check_bounds(resolved)
                names.append(str(converter.visit(resolved, f"{prefix}{i}")))
            except GrammarError as e:
                raise GrammarError(e.message, e.hint, part=i) from None
        rules = re.sub(r"^char\s*::=.*$", lambda m: CHAR_RULE, str(converter.format_grammar()), count=1,
                       flags=re.MULTILINE)
        grammar = f"root ::= {' | '.join(names)}\n{rules}"
        check_grammar_depth(grammar, "the grammar made from the JSON schema")
        if not _parses(grammar):
            raise _unconvertible(schemas)
        return rules, names
    except GrammarError:
        raise
    except RecursionError:
        raise GrammarError("the JSON schema nests too deeply to become a grammar") from None
    except MemoryError:
        raise GrammarError("cannot turn the JSON schema into a grammar: it needs more memory than this process "
                           "may take") from None
    except OSError:  # the machine's, not the schema's fault (no descriptors left): not a usage error
        raise
    except Exception as e:  # the converter raises bare Exceptions of many kinds for schemas it cannot handle
        raise GrammarError(f"cannot turn the JSON schema into a grammar: {str(e) or type(e).__name__}") from None


def _parses(gbnf: str) -> bool:
    """Whether llama.cpp's parser takes a grammar (one made from a schema: no model's vocabulary needed)."""
    from localgen.native.grammar import check_grammar

    try:
        check_grammar(None, gbnf)
    except GrammarError:
        return False
    return True


def _converts(schema: Any) -> bool:
    """Whether a resolved schema alone becomes a grammar that parses."""
    from localgen.native.grammar import schema_converter

    converter = schema_converter()
    try:
        name = converter.visit(schema, "s")
        return _parses(f"root ::= {name}\n{converter.format_grammar()}")
    except Exception:  # the converter's own refusals: this part cannot become a grammar either
        return False


def _unconvertible(schemas: Sequence[Any]) -> GrammarError:
    """What in `schemas` the converter made a grammar llama.cpp cannot parse from, in the schema's words: the
    innermost part that fails alone, by its path. Only run on failure (it converts parts again)."""
    for i, schema in enumerate(schemas):
        node, path = resolve_schema(schema), ""
        if _converts(node):
            continue
        while True:
            inner = next(((f"{path}/{key}", child) for key, child in subschemas(node) if not _converts(child)), None)
            if inner is None:
                break
            path, node = inner
        shown = json.dumps(node)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        at = path.lstrip("/") or "the top"
        return GrammarError(f"cannot turn the JSON schema into a grammar: its part at {at}, {shown}, cannot be "
                            "expressed as one", part=i)
    return GrammarError("cannot turn the JSON schema into a grammar: its parts together cannot be expressed as one")


