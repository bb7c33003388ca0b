"""JSON schemas made self-contained, in the forms llama-cpp-python's converter reads well (engine/grammar.py
then turns them into GBNF): local `$ref`s (`#/$defs/...`, `#/definitions/...`, any JSON pointer) are inlined, a
recursive one to REF_DEPTH levels and then as any JSON; `allOf` is merged, nullable and multi-type nodes become
unions, `true` becomes any JSON. The converter's own `$ref` support fails on references nested below the root,
on recursion at the root, and on two definitions with one name."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote

from localgen.errors import GrammarError

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
# JSON Schema's type names
JSON_TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")
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
            if key == "items" and _tuple_first(node):
                walk(value, refs)  # left out, but a reference in it that points at nothing is said all the same
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


def _tuple_first(node: dict[str, Any]) -> bool:
    """Whether an array's `items` gives way to its `prefixItems`: the converter reads `items` first and then never
    `prefixItems`, so a tuple with `items: false` (nothing after it) answered any JSON array, and one with an items
    schema held its first positions to that schema alone. The tuple alone is what the schema allows, its later
    items left out; unless `minItems` asks for more items than the tuple has, where `items` is kept."""
    prefix = node.get("prefixItems")
    least = node.get("minItems", 0)
    return isinstance(prefix, list) and bool(prefix) and not (isinstance(least, int) and least > len(prefix))


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
        kinds = [k for k in kind if k in JSON_TYPES]
        if len(kinds) != 1:
            return {"anyOf": [_plain({**node, "type": k}) for k in kinds]} if kinds else dict(ANY)
        node = {**node, "type": kinds[0]}
    elif kind is not None and kind not in (*JSON_TYPES, ANY["type"]):
        node = {k: v for k, v in node.items() if k != "type"}
    if not any(k in node for k in _SHAPE):
        return dict(ANY)
    return node


def _merged(parts: Sequence[Any]) -> dict[str, Any]:
    """allOf's parts as one schema: properties and required joined, const and enum as the values they all allow,
    other keywords from the first part that has them."""
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
    shared = common_values(parts)
    if shared is not None:  # the values every part's const and enum allow, not the first part's alone
        out.pop("const", None)
        out["enum"] = shared
    return _plain(out)


def common_values(nodes: Sequence[Any]) -> list[Any] | None:
    """The values that every node's `const` and `enum` allow together, in the first list's order (None: fewer
    than two of them, nothing to intersect; an enum of no values alone is said where the grammar is built). Equal
    as JSON: 1 and 1.0 are one value, true and 1 two."""
    lists: list[list[Any]] = []
    for node in nodes:
        if isinstance(node, dict):
            if "const" in node:
                lists.append([node["const"]])
            if isinstance(node.get("enum"), list):
                lists.append(node["enum"])
    if len(lists) < 2:
        return None
    keys = [{_json_key(v) for v in values} for values in lists[1:]]
    return [v for v in lists[0] if all(_json_key(v) in k for k in keys)]


def _json_key(value: Any) -> Any:
    """A value as a hashable key that JSON's equality holds to (a bool is not a number; 1 == 1.0)."""
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, int | float):
        return ("number", value)
    if isinstance(value, list):
        return ("array", tuple(_json_key(v) for v in value))
    if isinstance(value, dict):
        return ("object", tuple(sorted((str(k), _json_key(v)) for k, v in value.items())))
    return ("string", value)


def subschemas(node: Any) -> list[tuple[str, Any]]:
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
