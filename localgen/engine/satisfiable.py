"""Schemas no value meets, found before a grammar is made for them (engine/grammar.py): a grammar for such a
schema would admit values that break it. Each refusal is a GrammarError naming the part of the schema."""

from __future__ import annotations

import json
from typing import Any, TypeGuard

from localgen.engine.schemaresolve import JSON_TYPES, common_values, subschemas
from localgen.errors import GrammarError

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
    for key, child in subschemas(schema):
        if key not in ("not", "if"):  # a part no value meets is what `not` wants, and an `if` may be false
            check_bounds(child, f"{path}/{key}")


def check_satisfiable(schema: Any, path: str = "") -> None:
    """A GrammarError naming the part of a schema (as given: before its allOf is merged) that no value meets: the
    schema false, `not: {}`, a type that none of its enum's values (or its const) has, an allOf whose parts allow
    no type in common, const and enum values (its own and its allOf's) with none in common, a required property
    whose schema is false or that additionalProperties: false forbids. A grammar for it would admit values that
    break it; $refs are not followed, and `not` and `if` hold parts no value meets by design."""
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
    if common_values([schema, *parts]) == []:
        raise GrammarError(f"{at} has no value that its const and enum (its allOf's parts' too) all allow: no value "
                           "meets it")
    props = schema.get("properties")
    required = schema.get("required")
    for name in required if isinstance(required, list) and isinstance(props, dict) else ():
        if isinstance(name, str) and isinstance(props, dict) and props.get(name) is False:
            raise GrammarError(f"{at} requires the property {name!r}, whose schema is false: no value meets it")
    listed = props if isinstance(props, dict) else {}
    if schema.get("additionalProperties") is False and "patternProperties" not in schema:
        for name in required if isinstance(required, list) else ():
            if isinstance(name, str) and name not in listed:
                raise GrammarError(f"{at} requires the property {name!r}, which additionalProperties: false forbids "
                                   "(it is not among its properties): no value meets it")
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
        return {kind} if kind in JSON_TYPES else None
    if isinstance(kind, list):
        return {k for k in kind if k in JSON_TYPES} or None
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


def _num(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
