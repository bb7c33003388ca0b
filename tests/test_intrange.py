"""Integer ranges in JSON schemas as grammars (native/intrange.py): llama.cpp's expected grammars, every number
near each bound checked against the rule, empty ranges refused, and SmolLM2 at temperature 1 held in range; the
other bounds (repetition counts and patterns, native/pattern.py) up to the documented 4,096, the escapes
pydantic writes in patterns, and bounds no value meets refused naming the part."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from localgen.engine.grammar import grammar_from_json_schema, schema_rules
from localgen.errors import GrammarError
from localgen.native.intrange import int_range, integer_rule
from tests.test_serve import Server

# llama.cpp's tests/test-json-schema-to-grammar.cpp: (minimum, maximum) and the root rule it expects (less the
# outer parentheses). Where native/intrange.py departs from it (its docstring says why), the case says so.
LLAMA_CPP_CASES = [
    (0, None, "[0] | [1-9] [0-9]{0,15}"),
    (1, None, "[1-9] [0-9]{0,15}"),
    (3, None, "[1-2] [0-9]{1,15} | [3-9] [0-9]{0,15}"),
    (9, None, "[1-8] [0-9]{1,15} | [9] [0-9]{0,15}"),
    (10, None, "[1] ([0-9]{1,15}) | [2-9] [0-9]{1,15}"),
    (25, None, "[1] [0-9]{2,15} | [2] ([0-4] [0-9]{1,14} | [5-9] [0-9]{0,14}) | [3-9] [0-9]{1,15}"),
    (None, 30, '"-" [1-9] [0-9]{0,15} | [0-9] | ([1-2] [0-9] | [3] "0")'),
    (-5, None, '"-" ([0-5]) | [0] | [1-9] [0-9]{0,15}'),
    (-123, None, '"-" ([0-9] | ([1-8] [0-9] | [9] [0-9]) | "1" ([0-1] [0-9] | [2] [0-3])) | [0] | [1-9] [0-9]{0,15}'),
    (None, -5, '"-" ([1-4] [0-9]{1,15} | [5-9] [0-9]{0,15})'),  # llama.cpp: [0-4], which lets "-05" and "-00" in
    (None, 1, '"-" [1-9] [0-9]{0,15} | [0-1]'),
    (None, 100, '"-" [1-9] [0-9]{0,15} | [0-9] | ([1-8] [0-9] | [9] [0-9]) | "100"'),
    (0, 23, "[0-9] | ([1] [0-9] | [2] [0-3])"),
    (15, 300, '([1] ([5-9]) | [2-9] [0-9]) | ([1-2] [0-9]{2} | [3] "00")'),
    (5, 30, '[5-9] | ([1-2] [0-9] | [3] "0")'),
    (-123, 42, '"-" ([0-9] | ([1-8] [0-9] | [9] [0-9]) | "1" ([0-1] [0-9] | [2] [0-3])) | [0-9] | '
               '([1-3] [0-9] | [4] [0-2])'),
    (-10, 10, '"-" ([0-9] | "10") | [0-9] | "10"'),
    (-12, 207, '"-" ([0-9] | "1" [0-2]) | [0-9] | ([1-8] [0-9] | [9] [0-9]) | ([1] [0-9]{2} | [2] "0" [0-7])'),
    (12, 207, '([1] ([2-9]) | [2-9] [0-9]) | ([1] [0-9]{2} | [2] "0" [0-7])'),
]


@pytest.mark.parametrize(("lo", "hi", "expected"), LLAMA_CPP_CASES)
def test_ranges_make_llama_cpps_grammars(lo: int | None, hi: int | None, expected: str) -> None:
    assert int_range(lo, hi) == expected


_TOKEN = re.compile(r'\s*("(?:[^"\\]|\\.)*"|\[[^\]]*\]|\{\d+(?:,\d*)?\}|[()|?*+]|[A-Za-z][\w-]*)')


def _regex(gbnf_body: str) -> re.Pattern[str]:
    """A range rule (literals, classes, groups, alternatives, repetitions; no rule names) as a Python regex:
    the subset of GBNF int_range writes, read token by token, so each number is checked against what it says."""
    out, at = [], 0
    while at < len(gbnf_body.rstrip()):
        m = _TOKEN.match(gbnf_body, at)
        assert m, f"not GBNF at {gbnf_body[at:]!r}"
        tok, at = m.group(1), m.end()
        out.append(re.escape(tok[1:-1]) if tok.startswith('"') else "(?:" if tok == "(" else tok)
    return re.compile("".join(out))


def _ranges() -> list[tuple[int | None, int | None]]:
    rng = random.Random(7)
    edges = [-1000, -205, -100, -11, -10, -9, -1, 0, 1, 9, 10, 11, 99, 100, 101, 205, 1005, 4096, 10**6]
    out: list[tuple[int | None, int | None]] = [(lo, hi) for lo in edges for hi in edges if lo <= hi]
    out += [(v, None) for v in edges] + [(None, v) for v in edges]
    for _ in range(200):
        a, b = sorted(rng.randint(-10 ** rng.randint(1, 7), 10 ** rng.randint(1, 7)) for _ in range(2))
        out.append((a, b))
    return out


@pytest.mark.parametrize(("lo", "hi"), _ranges())
def test_a_range_accepts_exactly_its_integers(lo: int | None, hi: int | None) -> None:
    rule = _regex(int_range(lo, hi))
    near = {v + d for v in (lo, hi, 0) if v is not None for d in range(-25, 26)}
    near |= {v * k for v in (lo, hi) if v is not None for k in (-10, -1, 10, 100)}
    near |= {10**15, -(10**15), 10**16 - 1, 12321, -1000000, 2890001644500000}
    for n in sorted(near):
        inside = (lo is None or n >= lo) and (hi is None or n <= hi) and len(str(abs(n))) <= 16
        assert bool(rule.fullmatch(str(n))) == inside, (lo, hi, n)
        if n > 0:  # a leading zero is no JSON number
            assert not rule.fullmatch(f"0{n}") and not rule.fullmatch(f"-0{n}"), (lo, hi, n)


def test_llama_cpps_parser_takes_every_range(smollm2_engine: Any) -> None:
    for lo, hi in _ranges():
        smollm2_engine.check_grammar(f"root ::= ({int_range(lo, hi)}) space\nspace ::= \" \"?")


def test_bounds_are_rounded_inwards_and_exclusive_ones_folded_in() -> None:
    def body(**bounds: Any) -> str | None:
        return integer_rule({"type": "integer", **bounds})

    assert body(minimum=2.5, maximum=7.5) == f"({int_range(3, 7)}) space"
    assert body(exclusiveMinimum=2, exclusiveMaximum=8) == f"({int_range(3, 7)}) space"
    assert body(exclusiveMinimum=2.5, exclusiveMaximum=7.5) == f"({int_range(3, 7)}) space"
    assert body(minimum=0, exclusiveMinimum=4) == f"({int_range(5, None)}) space"  # the tighter of the two
    assert body(minimum=3, exclusiveMinimum=True, maximum=9, exclusiveMaximum=True) == f"({int_range(4, 8)}) space"
    assert body(minimum=-1e300, maximum=1e300) is None  # past int64 on the far side: no bound, as llama.cpp
    assert body(minimum=-(2**70), maximum=9) == f"({int_range(None, 9)}) space"
    assert integer_rule({"type": "number", "minimum": 3}) is None  # llama.cpp leaves number ranges out too
    assert integer_rule({"type": "integer", "enum": [1, 99], "maximum": 5}) is None  # the converter's enum first


@pytest.mark.parametrize("bounds", [{"minimum": 10, "maximum": 5}, {"exclusiveMinimum": 3, "exclusiveMaximum": 4},
                                    {"minimum": 2.2, "maximum": 2.8}, {"minimum": 1e300}, {"maximum": -1e300}])
def test_a_range_without_integers_is_an_error(bounds: dict[str, float]) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", **bounds}}}
    with pytest.raises(GrammarError, match=r"^the JSON schema's part at properties/n has an integer with .*: "
                                          r"no integer is in that range$"):
        grammar_from_json_schema(json.dumps(schema))


def test_schemas_and_tools_get_the_range_as_its_own_rule() -> None:
    grammar = grammar_from_json_schema(json.dumps(
        {"type": "object", "properties": {"n": {"type": "integer", "minimum": 10, "maximum": 50},
                                          "integer": {"type": "integer", "maximum": -1}}, "required": ["n"]}))
    assert 'schema0-n ::= (([1-4] [0-9] | [5] "0")) space' in grammar
    assert "schema0-integer ::= " in grammar  # a property named after a primitive does not take its rule's name
    rules, _ = schema_rules([{"type": "object", "properties": {"k": {"type": "integer", "minimum": 5,
                                                                          "maximum": 9}}}], "targs")
    assert "targs0-k ::= ([5-9]) space" in rules.splitlines()


@pytest.fixture(scope="module")
def range_server(cli_env: dict[str, str]) -> Any:
    s = Server(cli_env, "-np", "1", "--ctx", "1024")
    yield s
    assert s.stop() == 0


def test_smollm2_at_temperature_1_answers_in_range(range_server: Server) -> None:
    """The red team's schema: SmolLM2 wrote {"n": 12321} and {"n":4} for 10..50 before."""
    schema: dict[str, Any] = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 10, "maximum": 50},
                                               "m": {"type": "integer", "minimum": -7, "exclusiveMaximum": -2}},
              "required": ["n", "m"]}
    body = {"model": "smollm2:135m", "messages": [{"role": "user", "content": "Give two big numbers as JSON."}],
            "max_tokens": 40, "temperature": 1,
            "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}}
    for seed in range(6):
        r = httpx.post(f"{range_server.url}/v1/chat/completions", timeout=120, json={**body, "seed": seed})
        assert r.status_code == 200, r.text
        answer = json.loads(r.json()["choices"][0]["message"]["content"])
        assert 10 <= answer["n"] <= 50 and -7 <= answer["m"] < -2, (seed, answer)
    schema["properties"]["n"] = {"type": "integer", "minimum": 10, "maximum": 5}
    r = httpx.post(f"{range_server.url}/v1/chat/completions", timeout=120, json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text
    assert r.json()["error"]["message"] == ("the JSON schema's part at properties/n has an integer with minimum 10, "
                                            "maximum 5: no integer is in that range")


_S, _I, _A = {"type": "string"}, {"type": "integer"}, {"type": "array", "items": {"type": "integer"}}
_O = {"type": "object", "properties": {"a": _I, "b": _I}}
# each keyword docs/api.md names: a schema with it, and the same schema without it
KEYWORDS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "type": (_S, {}), "properties": (_O, {"type": "object"}), "required": ({**_O, "required": ["a"]}, _O),
    "additionalProperties": ({**_O, "additionalProperties": True}, _O), "enum": ({**_S, "enum": ["x"]}, _S),
    "const": ({"const": "x"}, {}), "anyOf": ({"anyOf": [_S, _I]}, {}), "oneOf": ({"oneOf": [_S, _I]}, {}),
    "allOf": ({"allOf": [_S]}, {}), "items": (_A, {"type": "array"}),
    "prefixItems": ({"type": "array", "prefixItems": [_I]}, {"type": "array"}),
    "minItems": ({**_A, "minItems": 2}, _A), "maxItems": ({**_A, "maxItems": 2}, _A),
    "pattern": ({**_S, "pattern": "^a+$"}, _S), "minLength": ({**_S, "minLength": 2}, _S),
    "maxLength": ({**_S, "maxLength": 2}, _S), "integer": ({**_I, "minimum": 0}, _I),
    "minimum": ({**_I, "minimum": 0}, _I), "maximum": ({**_I, "maximum": 0}, _I),
    "exclusiveMinimum": ({**_I, "exclusiveMinimum": 0}, _I), "exclusiveMaximum": ({**_I, "exclusiveMaximum": 0}, _I),
    "number": ({"type": "number", "minimum": 0, "exclusiveMaximum": 1}, {"type": "number"}),
    "multipleOf": ({**_I, "multipleOf": 3}, _I), "uniqueItems": ({**_A, "uniqueItems": True}, _A),
    "minProperties": ({**_O, "minProperties": 1}, _O), "maxProperties": ({**_O, "maxProperties": 1}, _O),
    "patternProperties": ({"type": "object", "patternProperties": {"^a": _I}}, {"type": "object"}),
    "propertyNames": ({"type": "object", "additionalProperties": _I, "propertyNames": {"pattern": "^a"}},
                      {"type": "object", "additionalProperties": _I}),
    "contains": ({**_A, "contains": {"const": 3}}, _A), "not": ({**_S, "not": {"const": "a"}}, _S),
    "if": ({**_O, "if": {"required": ["a"]}, "then": {"required": ["b"]}}, _O),
    "dependentRequired": ({**_O, "dependentRequired": {"a": ["b"]}}, _O),
    **{f: ({**_S, "format": f}, _S) for f in ("date", "time", "date-time", "uuid", "email", "uri")},
}


def test_the_keywords_docs_say_the_grammar_holds_are_the_ones_it_holds() -> None:
    page = (Path(__file__).parents[1] / "docs" / "api.md").read_text()
    bullet = page.split("- **Structured output**", 1)[1].split("\n- ", 1)[0]
    held, dropped = bullet.split("holds the answer to:", 1)[1].split("It does not hold the answer to:")
    names = {True: set(re.findall(r"`([\w-]+)`", held)), False: set(re.findall(r"`([\w-]+)`", dropped))}
    assert len(names[True]) > 20 and len(names[False]) > 10 and not names[True] & names[False]
    for holds, keywords in names.items():
        for keyword in keywords:
            with_it, without = KEYWORDS[keyword]
            changed = grammar_from_json_schema(json.dumps(with_it)) != grammar_from_json_schema(json.dumps(without))
            assert changed == holds, keyword
    # the limits the page gives: minItems needs items beside it, minLength gives way to a pattern or
    # a format held, not to one left out
    same = [({"type": "array", "minItems": 2}, {"type": "array"}),
            ({**_S, "pattern": "^a+$", "minLength": 5}, {**_S, "pattern": "^a+$"}),
            ({**_S, "format": "date", "maxLength": 5}, {**_S, "format": "date"}),
            ({**_S, "format": "email", "maxLength": 5}, {**_S, "maxLength": 5})]
    assert all(grammar_from_json_schema(json.dumps(a)) == grammar_from_json_schema(json.dumps(b)) for a, b in same)


# ---- repetition counts and patterns (native/pattern.py) --------------------------------------------------------

@pytest.mark.parametrize("schema", [
    {"type": "string", "maxLength": 1001}, {"type": "string", "maxLength": 4096}, {"type": "string", "minLength": 4096},
    {"type": "array", "items": {"type": "integer"}, "minItems": 4096},
    {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4096},
    {"type": "string", "pattern": "^a{0,1001}$"}, {"type": "string", "pattern": "^a{4096}$"},
    {"type": "string", "pattern": "^(ab|[0-9]c?){100,4096}$"},
])
def test_repetition_counts_up_to_4096_make_grammars_llama_cpp_takes(schema: dict[str, Any]) -> None:
    """Counts past 1,000 were n nested optionals, which llama.cpp refuses past 1,000 levels (and past about
    17,000 overflows its stack on): they are flat `x{m,n}` now, parsed natively inside the conversion."""
    grammar = grammar_from_json_schema(json.dumps(schema))
    assert ")?)?" not in grammar.split("schema0 ::= ", 1)[1], grammar[:300]


@pytest.mark.parametrize(("pattern", "rules"), [
    (r"^\d{5}$", [r'schema0 ::= "\"" [0-9]{5} "\"" space']),  # pydantic's constr(pattern=r"^\d{5}$")
    (r"^[\w.-]+@[a-z]+$", [r'schema0 ::= "\"" [\x2D-.0-9A-Z_a-z]+ "@" [a-z]+ "\"" space']),
    (r"^(?:ab|\s)*?x$", [r'schema0 ::= "\"" (schema0-1* "x") "\"" space',  # \s's control characters as JSON
                         r'schema0-1 ::= "ab" | ([ ] | "\\t" | "\\n" | "\\u000b" | "\\f" | "\\r")']),  # escapes
    (r"^([a-z]\d?){3}|none$", [r'schema0 ::= "\"" (schema0-1{3} | "none") "\"" space',
                               r'schema0-1 ::= [a-z] [0-9]?']),
    (r'^a\\b"$', [r'schema0 ::= "\"" "a\\\\b\\\"" "\"" space']),  # the string a\b" as JSON writes it
])
def test_patterns_take_the_escapes_pydantic_writes(pattern: str, rules: list[str]) -> None:
    grammar = grammar_from_json_schema(json.dumps({"type": "string", "pattern": pattern}))
    assert [ln for ln in grammar.splitlines() if ln.startswith("schema0")] == rules


@pytest.mark.parametrize("pattern", [r"^.*$", r"^\S+$", r"^[^\d\s]{2,}$", r"^\$\.\D[\W]$", r"^[ -~]+$",
                                     r"^[\x00-\x7f]$"])
def test_a_pattern_never_writes_a_quote_a_backslash_or_a_control_character_raw(pattern: str) -> None:
    r"""Inside a JSON string a quote, a backslash and the control characters are escaped: `.`, \S, \D, \W, a negated
    class or a range over them wrote them raw (`^.*$` took `"ab"cd`, `^\s*$` a raw newline): they are their JSON
    escapes now, the rest a class."""
    import re

    grammar = grammar_from_json_schema(json.dumps({"type": "string", "pattern": pattern}))
    rules = "\n".join(ln for ln in grammar.splitlines() if ln.startswith("schema0"))
    for cls in re.findall(r"\[(\^?)((?:\\x[0-9A-F]{2}|[^\]])*)\]", rules):
        negated, body = cls
        if negated:  # every one of them excluded
            assert body.startswith(("\\x00-\\x1F", "\\x00- ")) and "\\x22" in body and "\\x5C" in body, rules
        else:  # none of them in it, alone or within a range
            chars = re.sub(r"\\x([0-9A-F]{2})", lambda m: chr(int(m.group(1), 16)), body)
            k, members = 0, []
            while k < len(chars):
                if k + 2 < len(chars) and chars[k + 1] == "-":
                    members.append((chars[k], chars[k + 2]))
                    k += 3
                else:
                    members.append((chars[k], chars[k]))
                    k += 1
            assert not any(lo <= c <= hi for lo, hi in members for c in '"\\' + "".join(map(chr, range(32)))), rules
    assert r'"\\\""' in rules and r'"\\\\"' in rules, rules  # a quote and a backslash, escaped


@pytest.mark.parametrize(("schema", "said"), [
    ({"type": "object", "properties": {"code": {"type": "string", "minLength": 4, "maxLength": 2}},
      "required": ["code"]},
     "the JSON schema's part at properties/code has minLength 4 above its maxLength 2: no string meets both"),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 1},
     "the JSON schema has minItems 3 above its maxItems 1: no array meets both"),
    ({"type": "object", "minProperties": 3, "maxProperties": 1},
     "the JSON schema has minProperties 3 above its maxProperties 1: no object meets both"),
    ({"type": "object", "properties": {"x": {"anyOf": [{"type": "number", "minimum": 3, "exclusiveMaximum": 3}]}}},
     "the JSON schema's part at properties/x/anyOf/0 has minimum 3, exclusiveMaximum 3: no number is in that range"),
    ({"type": "string", "pattern": "^a{1,20000}$"},
     "the JSON schema's pattern repeat {1,20000} is 20,000; at most 4,096"),
])
def test_bounds_no_value_meets_are_an_error_naming_the_part(schema: dict[str, Any], said: str) -> None:
    """minLength 4 with maxLength 2 made a grammar that wrote {"code":"1.1."}, which breaks the schema."""
    with pytest.raises(GrammarError) as e:
        grammar_from_json_schema(json.dumps(schema))
    assert e.value.message == said
    with pytest.raises(GrammarError) as e:  # as a tool's schema too (run's tools get no earlier check)
        schema_rules([{"type": "object"}, schema], "t")
    assert e.value.message == said and e.value.part == 1


def test_bounds_a_value_can_meet_or_that_do_not_apply_are_taken() -> None:
    for schema in ({"not": {"minLength": 4, "maxLength": 2}}, {"type": "integer", "minLength": 4, "maxLength": 2},
                   {"if": {"minItems": 3, "maxItems": 1}, "then": {"type": "array"}},
                   {"type": "string", "minLength": 2, "maxLength": 2}, {"type": "number", "minimum": 1, "maximum": 1}):
        grammar_from_json_schema(json.dumps(schema))
