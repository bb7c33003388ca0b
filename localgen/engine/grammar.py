"""Grammars: JSON schemas turned into GBNF, and GBNF checked by llama.cpp's own parser before any work.

Schemas are first made self-contained (resolve_schema): local `$ref`s (`#/$defs/...`, `#/definitions/...`,
any JSON pointer) are inlined, a recursive one to REF_DEPTH levels and then as any JSON; `allOf` is merged,
nullable and multi-type nodes become unions, `true` becomes any JSON. llama-cpp-python's converter then sees
only what it handles well: its own `$ref` support fails on references nested below the root, on recursion at
the root, and on two definitions with one name.

One set of bounds for every schema and grammar, run's flags and serve's requests alike, checked before any work:
the converter expands repetition counts (minLength: 100000 gave 500 KB of grammar; 10^9 took 12 GB), and
llama.cpp parses a grammar in native code that Ctrl-C cannot reach (a 3 MB enum took minutes)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, TypeGuard
from urllib.parse import unquote

from localgen.errors import GrammarError

MAX_SCHEMA_CHARS = 64 * 1024  # a JSON schema, as text
MAX_GRAMMAR_CHARS = 128 * 1024  # a GBNF grammar, given or made from a schema
TOOL_GRAMMAR_CHARS = 1024  # a tool's share where many make one grammar (run takes 1,000 MCP tools of ~300 each)
MAX_REPEAT = 4096  # minLength/minItems/minProperties/minContains, and a pattern's {m,n}; a maxLength/maxItems/
# maxProperties/maxContains above it is left out of the grammar (the answer is bounded by its tokens anyway)
MAX_GRAMMAR_DEPTH = 1000  # groups in groups: llama.cpp's parser recurses on each, and overflows near 20,000
REPEAT_KEYS = ("minLength", "minItems", "minProperties", "minContains")
UPPER_KEYS = ("maxLength", "maxItems", "maxProperties", "maxContains")
REF_DEPTH = 3  # how often one $ref may be expanded inside itself before the rest is any JSON
MAX_NODES = 20_000  # subschemas after inlining: a schema whose references fan out is refused, not expanded
# keywords whose value is one subschema, a list of them, or a map of them; other values are data
_ONE = ("items", "additionalProperties", "not", "contains", "propertyNames", "unevaluatedProperties",
        "unevaluatedItems", "additionalItems", "if", "then", "else")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "patternProperties", "dependentSchemas")
# what a node must have for the converter to read it as more than any JSON
_SHAPE = ("type", "properties", "additionalProperties", "items", "prefixItems", "anyOf", "oneOf", "allOf",
          "const", "enum", "pattern")
_TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")
# a JSON string's character as llama.cpp's own converter writes it: the bindings' admits raw control characters
# (U+0000-U+001F), which JSON's text never holds (an answer with one is not JSON)
CHAR_RULE = r'char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})'
# any JSON value, in the converter's own words (it reads an empty schema as any *object*)
ANY: dict[str, Any] = {"type": "value"}


def resolve_schema(schema: Any) -> Any:
    """The schema with its local references inlined (recursion bounded by REF_DEPTH), `allOf` merged and
    nullable types spelled as unions; a GrammarError for a reference that leads nowhere or outside it."""
    count = [0]

    def lookup(ref: str) -> Any:
        if ref == "#":
            return schema
        if not ref.startswith("#/"):
            raise GrammarError(f"cannot follow the schema reference {ref!r}: only local ones "
                               "(#/$defs/..., #/definitions/...) are supported")
        node = schema
        for raw in ref[2:].split("/"):
            part = unquote(raw).replace("~1", "/").replace("~0", "~")
            if isinstance(node, list) and part.isascii() and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            elif isinstance(node, dict) and part in node:
                node = node[part]
            else:
                raise GrammarError(f"the schema reference {ref!r} points at nothing")
        return node

    def walk(node: Any, refs: tuple[str, ...]) -> Any:
        count[0] += 1
        if count[0] > MAX_NODES:
            raise GrammarError(f"the schema expands to more than {MAX_NODES:,} subschemas once its $refs are "
                               "inlined: define fewer or flatter types")
        if node is True or node == {}:
            return dict(ANY)
        if not isinstance(node, dict):
            return dict(ANY)  # false, or a value that is no schema: left to the validation after generation
        ref = node.get("$ref")
        if isinstance(ref, str):
            if refs.count(ref) >= REF_DEPTH:
                return dict(ANY)  # a recursive type, deep enough: any JSON from here on
            target = walk(lookup(ref), (*refs, ref))
            rest = {k: v for k, v in node.items() if k != "$ref"}
            if not any(k in rest for k in _SHAPE):  # title, description, default beside the $ref
                return target
            return _merged([target, walk(rest, refs)])
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in ("$defs", "definitions", "$schema", "$id", "$comment"):
                continue
            if key in _MAP and isinstance(value, dict):
                out[key] = {k: walk(v, refs) for k, v in value.items() if v is not False}
            elif key in _LIST and isinstance(value, list):
                out[key] = [walk(v, refs) for v in value]
            elif key in _ONE and isinstance(value, (dict, bool)):
                out[key] = value if key == "additionalProperties" and isinstance(value, bool) else walk(value, refs)
            else:
                out[key] = value
        return _plain(out)

    try:
        return walk(schema, ())
    except RecursionError:
        raise GrammarError("the schema nests too deeply to become a grammar") from None


def _plain(node: dict[str, Any]) -> dict[str, Any]:
    """One node in the forms the converter reads: allOf merged, nullable and multi-type as unions, an empty
    union dropped, a node with nothing the converter reads (only a title, say) as any JSON."""
    if isinstance(node.get("allOf"), list):
        node = _merged([{k: v for k, v in node.items() if k != "allOf"}, *node["allOf"]])
    for key in ("anyOf", "oneOf"):
        if node.get(key) == []:
            node = {k: v for k, v in node.items() if k != key}
    if node.get("enum") == []:
        raise GrammarError("the JSON schema has an `enum` with no values: no value could match it")
    if node.pop("nullable", False) is True:
        return {"anyOf": [_plain(node), {"type": "null"}]}
    kind = node.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k in _TYPES]
        if len(kinds) != 1:
            return {"anyOf": [_plain({**node, "type": k}) for k in kinds]} if kinds else dict(ANY)
        node = {**node, "type": kinds[0]}
    elif kind is not None and kind not in (*_TYPES, ANY["type"]):
        node = {k: v for k, v in node.items() if k != "type"}
    if not any(k in node for k in _SHAPE):
        return dict(ANY)
    return node


def _merged(parts: Sequence[Any]) -> dict[str, Any]:
    """allOf's parts as one schema: properties and required joined, other keywords from the first part
    that has them (exact intersection is left to the validation after generation)."""
    out: dict[str, Any] = {}
    for part in parts:
        if not isinstance(part, dict):
            continue
        for key, value in part.items():
            if key == "properties" and isinstance(value, dict):
                out["properties"] = {**out.get("properties", {}), **value}
            elif key == "required" and isinstance(value, list):
                out["required"] = [*out.get("required", []), *(v for v in value if v not in out.get("required", []))]
            elif key not in out:
                out[key] = value
    if "properties" in out and "type" not in out:
        out["type"] = "object"
    return _plain(out)


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


# a lower and an upper bound no value can meet, with the kind of value they bound
_PAIRS = (("minLength", "maxLength", "string"), ("minItems", "maxItems", "array"),
          ("minProperties", "maxProperties", "object"), ("minContains", "maxContains", "array"))


def check_bounds(schema: Any, path: str = "") -> None:
    """A GrammarError naming the part of a resolved schema whose bounds no value meets (minLength above
    maxLength, an empty number or integer range): a grammar for it would admit values that break it."""
    from localgen.native.intrange import integer_bounds

    if not isinstance(schema, dict):
        return
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds if isinstance(kinds, list) else None
    at = f"the JSON schema's part at {path.lstrip('/')}" if path else "the JSON schema"

    def applies(kind: str) -> bool:
        return kinds is None or kind in kinds or (kind == "number" and "integer" in kinds)

    for low, high, kind in _PAIRS:
        lo, hi = schema.get(low), schema.get(high)
        if _num(lo) and _num(hi) and lo > hi and applies(kind):
            raise GrammarError(f"{at} has {low} {lo} above its {high} {hi}: no {kind} meets "
                               "both")
    if kinds == ["integer"]:
        try:
            integer_bounds(schema)
        except GrammarError as e:
            raise GrammarError(e.message.replace("the JSON schema", at, 1)) from None
    elif applies("number"):
        lows = [(schema[k], k.startswith("excl")) for k in ("minimum", "exclusiveMinimum") if _num(schema.get(k))]
        highs = [(schema[k], k.startswith("excl")) for k in ("maximum", "exclusiveMaximum") if _num(schema.get(k))]
        if any(lo > hi or (lo == hi and (ex1 or ex2)) for lo, ex1 in lows for hi, ex2 in highs):
            given = ", ".join(f"{k} {schema[k]}" for k in ("minimum", "exclusiveMinimum", "maximum",
                                                           "exclusiveMaximum") if _num(schema.get(k)))
            raise GrammarError(f"{at} has {given}: no number is in that range")
    for key, child in _parts(schema):
        if key not in ("not", "if"):  # a part no value meets is what `not` wants, and an `if` may be false
            check_bounds(child, f"{path}/{key}")


def check_satisfiable(schema: Any, path: str = "") -> None:
    """A GrammarError naming the part of a schema (as given: before its allOf is merged) that no value meets: the
    schema false, `not: {}`, a type that none of its enum's values (or its const) has, an allOf whose parts allow
    no type in common, a required property whose schema is false. A grammar for it would admit values that break
    it; $refs are not followed, and `not` and `if` hold parts no value meets by design."""
    at = f"the JSON schema's part at {path.lstrip('/')}" if path else "the JSON schema"
    if schema is False:
        raise GrammarError(f"{at} is false: no value meets it")
    if not isinstance(schema, dict):
        return
    if schema.get("not") in ({}, True):
        raise GrammarError(f"{at} has not: {json.dumps(schema['not'])}, which every value meets: no value meets it")
    kinds = _kinds(schema.get("type"))
    all_of = schema.get("allOf")
    parts: list[Any] = all_of if isinstance(all_of, list) else []
    if any(part is False for part in parts):
        raise GrammarError(f"{at} has false in its allOf: no value meets it")
    for part in parts:
        theirs = _kinds(part.get("type")) if isinstance(part, dict) else None
        if theirs is not None:
            kinds = theirs if kinds is None else {k if k == m else "integer" for k in kinds for m in theirs
                                                  if k == m or {k, m} == {"integer", "number"}}
            if not kinds:
                raise GrammarError(f"{at} has an allOf whose parts allow no type in common: no value meets it")
    for node in (schema, *(p for p in parts if isinstance(p, dict))):
        if kinds is not None and "const" in node and not _has_kind(node["const"], kinds):
            raise GrammarError(f"{at} has const {_shown(node['const'])}, which is not of type "
                               f"{' or '.join(sorted(kinds))}: no value meets it")
        if kinds is not None and isinstance(node.get("enum"), list) and node["enum"] and \
                not any(_has_kind(v, kinds) for v in node["enum"]):
            raise GrammarError(f"{at} has an enum with no {' or '.join(sorted(kinds))} among its values: no value "
                               "meets it")
    props = schema.get("properties")
    required = schema.get("required")
    for name in required if isinstance(required, list) and isinstance(props, dict) else ():
        if isinstance(name, str) and isinstance(props, dict) and props.get(name) is False:
            raise GrammarError(f"{at} requires the property {name!r}, whose schema is false: no value meets it")
    # only the parts every value must meet: a property not required, additionalProperties, items, then/else or a
    # single anyOf branch that no value meets is how a schema says "never this" (zod's z.never() is not: {})
    for i, part in enumerate(parts):
        check_satisfiable(part, f"{path}/allOf/{i}")
    for name in required if isinstance(required, list) and isinstance(props, dict) else ():
        if isinstance(name, str) and isinstance(props, dict) and name in props:
            check_satisfiable(props[name], f"{path}/properties/{name}")
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if not isinstance(branches, list) or not branches:
            continue
        failed: list[GrammarError] = []
        for i, branch in enumerate(branches):
            try:
                check_satisfiable(branch, f"{path}/{key}/{i}")
            except GrammarError as e:
                failed.append(e)
        if len(failed) == len(branches):
            raise GrammarError(f"{at} has an {key} of which no part can be met ({failed[0].message})")


def _kinds(kind: Any) -> set[str] | None:
    """A schema's `type` as a set of type names (None: any type)."""
    if isinstance(kind, str):
        return {kind} if kind in _TYPES else None
    if isinstance(kind, list):
        return {k for k in kind if k in _TYPES} or None
    return None


def _has_kind(value: Any, kinds: set[str]) -> bool:
    """Whether a JSON value is of one of the types (an integer is a number; 1.0 an integer)."""
    if value is None:
        return "null" in kinds
    if isinstance(value, bool):
        return "boolean" in kinds
    if isinstance(value, (int, float)):
        return "number" in kinds or ("integer" in kinds and (isinstance(value, int) or value.is_integer()))
    return (isinstance(value, str) and "string" in kinds) or (isinstance(value, list) and "array" in kinds) or \
        (isinstance(value, dict) and "object" in kinds)


def _shown(value: Any) -> str:
    shown = json.dumps(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def _raw_parts(node: dict[str, Any]) -> list[tuple[str, Any]]:
    """A schema's subschemas as given (its $defs left out: one is checked where a $ref uses it), each with its
    key path below the node."""
    out: list[tuple[str, Any]] = []
    for key, value in node.items():
        if key in _MAP and isinstance(value, dict):
            out += [(f"{key}/{name}", v) for name, v in value.items()]
        elif key in _LIST and isinstance(value, list):
            out += [(f"{key}/{j}", v) for j, v in enumerate(value)]
        elif key in _ONE:
            out.append((key, value))
    return [(k, v) for k, v in out if isinstance(v, dict)]  # false: an empty array's items, say (allOf's: above)


def _num(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


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
            inner = next(((f"{path}/{key}", child) for key, child in _parts(node) if not _converts(child)), None)
            if inner is None:
                break
            path, node = inner
        shown = json.dumps(node)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        at = path.lstrip("/") or "the top"
        return GrammarError(f"cannot turn the JSON schema into a grammar: its part at {at}, {shown}, cannot be "
                            "expressed as one", part=i)
    return GrammarError("cannot turn the JSON schema into a grammar: its parts together cannot be expressed as one")


def _parts(node: Any) -> list[tuple[str, Any]]:
    """A resolved schema's subschemas, each with its key path below the node."""
    out: list[tuple[str, Any]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _MAP and isinstance(value, dict):
                out += [(f"{key}/{name}", v) for name, v in value.items() if isinstance(v, dict)]
            elif key in _LIST and isinstance(value, list):
                out += [(f"{key}/{j}", v) for j, v in enumerate(value) if isinstance(v, dict)]
            elif key in _ONE and isinstance(value, dict):
                out.append((key, value))
    return out
