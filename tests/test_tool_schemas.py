"""Tool schemas as real tools write them (pydantic v2 and the MCP SDK: `$defs`/`$ref`, `anyOf`, `allOf`,
`enum`, `const`, nullable types), recursion bounded, 1,000 tools; a repeated call stopped; the default model
(SmolLM2 with its own template, so the generic JSON format) through a whole tool round trip; and a
`--functions` result that JSON cannot hold. In-process for the grammars and the stream stage, `serve` and
`run --functions/--mcp` as a user drives them."""

from __future__ import annotations

import json
import re
import sys
import textwrap
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import httpx
import jsonschema
import pytest
from pydantic import BaseModel

from tests.conftest import CLI, ROOT, ScriptedGen
from tests.test_serve import Server


class Unit(StrEnum):
    C = "C"
    F = "F"


class Address(BaseModel):
    street: str
    city: str | None = None


class Person(BaseModel):
    name: str
    kind: Literal["friend", "colleague"]
    unit: Unit = Unit.C
    home: Address
    others: list[Address] = []


class Place(BaseModel):
    city: str
    country: str | None = None


class Visit(BaseModel):
    place: Place


class Node(BaseModel):
    value: int
    children: list[Node] = []


# what older generators (and hand-written MCP tools) send: `definitions`, allOf around a $ref, a type list,
# OpenAPI's `nullable`, a const, a title where the type should be (pydantic's `Any`)
HAND = {"type": "object", "definitions": {"Unit": {"type": "string", "enum": ["C", "F"]}},
        "properties": {"unit": {"allOf": [{"$ref": "#/definitions/Unit"}], "description": "the unit"},
                       "note": {"type": ["string", "null"]}, "count": {"type": "integer", "nullable": True},
                       "mode": {"const": "fast"}, "extra": {"title": "Extra"}},
        "required": ["unit", "mode"]}
SCHEMAS = {"pydantic": Person.model_json_schema(), "recursive": Node.model_json_schema(), "hand-written": HAND}


def _tool(name: str, params: dict[str, Any], description: str = "") -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


def test_pydantic_and_mcp_style_schemas_make_grammars_in_every_format(smollm2_engine: Any) -> None:
    from localgen.tools.formats import FORMATS, constraint
    from localgen.tools.spec import parse_tools

    tools = parse_tools([_tool(f"t_{k.replace('-', '_')}", s) for k, s in SCHEMAS.items()])
    for fmt in FORMATS.values():
        for forced in (False, True):
            c = constraint(fmt, tools, forced, True)
            if c is not None:
                smollm2_engine.check_grammar(c.grammar)  # llama.cpp's parser takes it
    from localgen.engine.grammar import grammar_from_json_schema
    from localgen.engine.schemaresolve import resolve_schema

    for schema in SCHEMAS.values():  # response_format and --json-schema take the same schemas
        smollm2_engine.check_grammar(grammar_from_json_schema(json.dumps(schema)))
        assert "$ref" not in json.dumps(resolve_schema(schema))
    plain = resolve_schema(HAND)["properties"]
    assert plain["unit"]["enum"] == ["C", "F"]
    assert plain["note"] == {"anyOf": [{"type": "string"}, {"type": "null"}]}
    assert {"type": "null"} in plain["count"]["anyOf"]


def test_a_schema_error_under_a_named_tool_choice_counts_every_tool() -> None:
    """With tool_choice naming one tool only it is converted: its schema's error said tools[0] for tools[1]."""
    from localgen.errors import GrammarError
    from localgen.tools.plan import make_plan
    from localgen.tools.spec import parse_tools

    tools = parse_tools([_tool("ok", {"type": "object"}),
                         _tool("bad", {"type": "object", "properties": {"x": {"enum": []}}})])
    template = (ROOT / "tests" / "data" / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
    with pytest.raises(GrammarError) as e:
        make_plan(template, tools, {"type": "function", "function": {"name": "bad"}})
    assert e.value.part == 1


def test_recursive_references_are_bounded_not_a_recursion_error() -> None:
    from localgen.engine.grammar import grammar_from_json_schema
    from localgen.engine.schemaresolve import REF_DEPTH, resolve_schema
    from localgen.errors import GrammarError

    tree = resolve_schema(Node.model_json_schema())
    depth, node = 0, tree
    while "properties" in node:  # value, children: [Node ...], down to any JSON
        node, depth = node["properties"]["children"]["items"], depth + 1
    assert depth == REF_DEPTH and node == {"type": "value"}
    itself = {"type": "object", "properties": {"next": {"$ref": "#"}, "a": {"$ref": "#/$defs/A"}},
              "$defs": {"A": {"anyOf": [{"$ref": "#/$defs/B"}, {"type": "null"}]},
                        "B": {"type": "array", "items": {"$ref": "#/$defs/A"}}}}
    assert "root ::=" in grammar_from_json_schema(json.dumps(itself))
    fan: dict[str, Any] = {"$defs": {f"D{i}": {"type": "object", "properties": {
        "x": {"$ref": f"#/$defs/D{i + 1}"}, "y": {"$ref": f"#/$defs/D{i + 1}"}}} for i in range(30)},
        "$ref": "#/$defs/D0"}
    fan["$defs"]["D30"] = {"type": "string"}
    with pytest.raises(GrammarError, match="subschemas once its \\$refs are inlined"):
        resolve_schema(fan)  # 2**30 nodes if expanded
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(5000):
        deep = {"type": "array", "items": deep}
    with pytest.raises(GrammarError, match="nests too deeply"):
        resolve_schema(deep)
    for ref in ("#/$defs/Missing", "https://example.com/schema.json", "#anchor"):
        with pytest.raises(GrammarError, match="reference"):
            resolve_schema({"type": "object", "properties": {"a": {"$ref": ref}}})


def test_a_thousand_tools_make_a_grammar_that_grows_with_them(smollm2_engine: Any) -> None:
    from localgen.tools.plan import make_plan
    from localgen.tools.spec import ToolSpec

    tools = tuple(ToolSpec(f"tool_{i}", f"Tool {i}", {"type": "object", "properties": {
        "city": {"type": "string"}, "n": {"type": "integer"}}, "required": ["city"]}) for i in range(1000))
    for template in (None, "tools <tool_call>", "tools [TOOL_CALLS]", "tools <|python_tag|>"):
        plan = make_plan(template, tools, "required")
        assert plan.constraint is not None
        assert len(plan.constraint.grammar) < 400 * len(tools), "rules shared, not repeated per tool"
        smollm2_engine.check_grammar(plan.constraint.grammar)


def _events(fmt: str, text: str, step: int) -> tuple[Any, list[Any]]:
    from localgen.tools.formats import FORMATS
    from localgen.tools.stream import AnswerStream

    stream = AnswerStream(FORMATS[fmt])
    out: list[Any] = []
    for i in range(0, len(text), step):
        out += stream.feed(text[i:i + step])
    return stream, out + stream.finish()


CALL = {"name": "get_time", "arguments": {}}
REPEATED = {  # each format's answer when the model writes the same call until max_tokens cuts it off
    "generic": '{"tool_calls": [' + ", ".join([json.dumps(CALL)] * 6) + ', {"name": "get_ti',
    "hermes": ("<tool_call>\n" + json.dumps(CALL) + "\n</tool_call>\n") * 4 + '<tool_call>\n{"name": "get',
    "mistral": "[TOOL_CALLS][" + ", ".join([json.dumps(CALL)] * 5) + ', {"name": "g',
    "llama3": "; ".join(json.dumps({"name": "get_time", "parameters": {}}) for _ in range(4)) + '; {"na',
}


@pytest.mark.parametrize("fmt", sorted(REPEATED))
def test_a_call_repeated_until_max_tokens_is_one_call_and_no_text(fmt: str) -> None:
    from localgen.tools.spec import ToolCall

    for step in (1, 5, 10_000):
        stream, events = _events(fmt, REPEATED[fmt], step)
        calls = [e for e in events if isinstance(e, ToolCall)]
        assert [(c.name, c.arguments) for c in calls] == [("get_time", "{}")], (fmt, step)
        assert stream.content == "" and stream.repeats >= 3, (fmt, step)
    if fmt == "generic":  # the first call is given as soon as its object closes, so a repeat stops generation
        stream, events = _events(fmt, REPEATED[fmt][:60], 60)
        assert [e.name for e in events if isinstance(e, ToolCall)] == ["get_time"]


def test_a_call_repeated_inside_one_open_block_is_seen_as_it_closes() -> None:
    """Hermes's parallel grammar (llama-server's) lets one `<tool_call>` hold comma-separated calls, and SmolLM2
    under a forced choice writes the same call there until the tokens run out, never closing the block (the
    MCP example in docs/tools.md took 3,755 tokens and a minute): the repeat counts as soon as its copy closes,
    with the block still open, so the loop stops the generation; two different calls are no repeat."""
    from localgen.tools.formats import FORMATS
    from localgen.tools.spec import ToolCall
    from localgen.tools.stream import AnswerStream

    one, other = json.dumps(CALL), json.dumps({"name": "get_time", "arguments": {"tz": "UTC"}})
    for step in (1, 7, 10_000):
        stream, counts = AnswerStream(FORMATS["hermes"]), []
        text = "<tool_call>\n" + one + ",\n" + other + ",\n" + one
        for i in range(0, len(text), step):
            stream.feed(text[i:i + step])
            counts.append(stream.repeats)
        assert counts[-1] == 1 and (step > 1 or counts[-2] == 0), (step, counts[-3:])
        calls = [e for e in stream.finish() if isinstance(e, ToolCall)]
        assert [(c.name, c.arguments) for c in calls] == [("get_time", "{}"), ("get_time", '{"tz": "UTC"}')], step
        assert stream.content == "", step


_Gen = ScriptedGen


def _functions(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "fns.py"
    path.write_text(textwrap.dedent(source))
    return path


WEATHER_FN = '''
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return f"It is 21 C and sunny in {city}."
'''


def test_run_s_tools_are_bounded_as_their_grammar_is_built() -> None:
    """run's and chat's tools (MCP's, --functions) had no bound: 1,000 MCP tools each spelling out 480 enum values
    made 4.5 MB of grammar (20 s for 20 tokens), and $refs that fan out 2 ways for 12 levels 1.2 MB a tool.
    The converter stops once the grammar passes its bound (131,072 characters, or 1,024 a tool), the tool
    named; a thousand plain tools still fit."""
    from localgen.errors import GrammarError
    from localgen.tools.loop import Toolbox, plan_for
    from localgen.tools.spec import ToolSpec

    defs: dict[str, Any] = {f"n{i}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/n{i + 1}"},
                                                                      "b": {"$ref": f"#/$defs/n{i + 1}"}},
                                      "required": ["a", "b"]} for i in range(12)}
    defs["n12"] = {"type": "integer"}
    fan = {"type": "object", "$defs": defs, "properties": {"x": {"$ref": "#/$defs/n0"}}, "required": ["x"]}
    enums = {"type": "object", "properties": {f"p{j}": {"enum": [f"v{k}" for k in range(60)]} for j in range(8)}}
    plain = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    for schema, n, said in ((fan, 3, "tool f0: the JSON schemas make a grammar of more than 131,072 characters"),
                            (enums, 1000, "the JSON schemas make a grammar of more than 1,025,024 characters"),
                            (plain, 1000, None)):
        box = Toolbox()
        for i in range(n):
            box._add(ToolSpec(f"f{i}", "d", schema), lambda args: "", "mcp: evil")
        if said is None:
            plan = plan_for(None, box)
            assert plan is not None and plan.constraint is not None and len(plan.constraint.grammar) > 131_072
            continue
        with pytest.raises(GrammarError) as e:
            plan_for(None, box)
        assert said in e.value.message and e.value.message.startswith("the MCP server evil's tool f"), e.value.message


def test_a_call_repeated_in_the_next_round_makes_that_round_answer(tmp_path: Path) -> None:
    """SmolLM2 given a tool's result asks for the same call again; the loop does not run it again but
    makes the model answer (the generic format: a grammar that admits only {"response": ...})."""
    from localgen.tools.loop import Toolbox, plan_for, run_turn
    from localgen.types import GenerationRequest, SamplingParams

    call = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'
    gens = [_Gen([call]), _Gen([call[:40], call[40:]]), _Gen(['{"response": "It is sunny."}'])]
    grammars: list[str] = []

    def generate(request: Any) -> _Gen:
        grammars.append(request.sampling.grammar)
        return gens.pop(0)

    box = Toolbox.open([_functions(tmp_path, WEATHER_FN)], [])
    turn = run_turn(SimpleNamespace(generate=generate),
                    GenerationRequest(messages=({"role": "user", "content": "Weather in Paris?"},),
                                      sampling=SamplingParams(temperature=0)),
                    plan_for(None, box), box, lambda c: True, lambda e: None, 8, 5.0, None)
    assert [r.text for r in turn.results] == ["It is 21 C and sunny in Paris."]
    assert turn.text == "It is sunny."
    assert grammars[2].startswith("root ::= reply\n")
    assert [m["role"] for m in turn.messages] == ["assistant", "tool", "assistant"]


def test_functions_with_pydantic_parameters_and_results_json_cannot_hold(tmp_path: Path) -> None:
    from localgen.errors import ToolError
    from localgen.tools.loop import Toolbox
    from localgen.tools.plan import make_plan
    from localgen.tools.spec import ToolCall

    path = _functions(tmp_path, '''
        from __future__ import annotations
        from pydantic import BaseModel

        class Street(BaseModel):
            name: str

        class Place(BaseModel):
            city: str
            streets: list[Street] = []

        class Opaque:
            def __str__(self) -> str:
                raise RuntimeError("no text")

        def visit(place: Place) -> str:
            """Visit a place."""
            return f"{type(place).__name__} {place.city} {[s.name for s in place.streets]}"

        def numbers() -> set[int]:
            """Some numbers."""
            return {3, 1, 2}

        def cycle() -> list[object]:
            """A list that holds itself."""
            a: list[object] = []
            a.append(a)
            return a

        def tuple_keys() -> dict[tuple[int, int], int]:
            """Keys JSON cannot have."""
            return {(1, 2): 3}

        def opaque() -> Opaque:
            """An object with no text."""
            return Opaque()
    ''')
    box = Toolbox.open([path], [])
    try:
        visit = next(t for t in box.specs if t.name == "visit")
        assert visit.parameters["properties"]["place"]["properties"]["city"] == {"title": "City", "type": "string"}
        assert "Street" in visit.parameters["$defs"]  # the nested model's $ref resolves in the tool's schema
        make_plan(None, box.specs)
        args = {"place": {"city": "Oslo", "streets": [{"name": "Karl Johans gate"}]}}
        jsonschema.validate(args, visit.parameters)
        assert box.call(ToolCall("visit", json.dumps(args)), 5) == "Place Oslo ['Karl Johans gate']"
        assert box.call(ToolCall("numbers", "{}"), 5) == "{1, 2, 3}"
        assert box.call(ToolCall("cycle", "{}"), 5) == "[[...]]"
        assert box.call(ToolCall("tuple_keys", "{}"), 5) == "{(1, 2): 3}"
        with pytest.raises(ToolError, match="opaque returned a Opaque that cannot be shown as text"):
            box.call(ToolCall("opaque", "{}"), 5)
    finally:
        box.close()


def test_functions_that_are_async_take_null_or_have_defaults_json_cannot_hold(tmp_path: Path) -> None:
    """An `async def` runs (its result was `<coroutine object ...>` and its body never ran); `int | None` takes
    null (its schema said integer, so null failed the call); a default JSON cannot hold is given in its JSON form
    where pydantic has one (a date's ISO text, an enum's value) and left out where none is (it was said to be
    null)."""
    from localgen.tools.loop import Toolbox
    from localgen.tools.plan import make_plan
    from localgen.tools.spec import ToolCall

    path = _functions(tmp_path, '''
        import asyncio
        import datetime
        import enum

        class Color(enum.Enum):
            RED = "red"

        async def fetch(url: str) -> str:
            """Fetch a URL."""
            await asyncio.sleep(0)
            return "fetched " + url

        def dflt(when: datetime.date = datetime.date(2020, 1, 1), n: int | None = None, c: Color = Color.RED,
                 o: object = object(), s: str | int | None = None, x: float = float("inf")) -> str:
            """Defaults."""
            return f"{when!r} {n!r} {c!r} {s!r}"
    ''')
    box = Toolbox.open([path], [])
    try:
        assert box.call(ToolCall("fetch", '{"url": "x"}'), 5) == "fetched x"
        props = next(t for t in box.specs if t.name == "dflt").parameters["properties"]
        assert props["n"] == {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None}
        assert props["s"]["anyOf"][-1] == {"type": "null"}
        assert props["when"]["default"] == "2020-01-01" and props["c"]["default"] == "red"
        assert "default" not in props["o"] and "default" not in props["x"]  # inf is no JSON (GET /tools: a 500)
        make_plan(None, box.specs)  # (a grammar is made from them)
        assert box.call(ToolCall("dflt", '{"n": null, "s": null}'), 5) == \
            "datetime.date(2020, 1, 1) None <Color.RED: 'red'> None"
        assert box.call(ToolCall("dflt", '{"n": 3, "when": "2021-02-03"}'), 5) == \
            "datetime.date(2021, 2, 3) 3 <Color.RED: 'red'> None"
    finally:
        box.close()


def test_functions_keep_the_constraints_their_annotations_give(tmp_path: Path) -> None:
    """docs/tools.md: `Annotated[str, Field(pattern=...)]` (and min_length, max_length, ge, le, description) keeps its
    constraints in the tool's schema (the type hints were read without Annotated's: the schema said only
    `"type": "string"`), so the grammar holds them and a call that breaks one is refused; a Literal is an enum; a
    `:param` line is a parameter's description, over Field's."""
    from localgen.errors import ToolError
    from localgen.tools.loop import Toolbox
    from localgen.tools.plan import make_plan
    from localgen.tools.spec import ToolCall

    path = _functions(tmp_path, '''
        from __future__ import annotations
        from typing import Annotated, Literal
        from pydantic import Field

        def book(city: Annotated[str, Field(pattern=r"^[a-z]+$", min_length=2, max_length=20)],
                 nights: Annotated[int, Field(ge=1, le=14)] = 1,
                 note: Annotated[str, Field(description="for the desk")] = "",
                 unit: Literal["C", "F"] = "C", pets: Annotated[int, Field(ge=0)] | None = None,
                 floor: Annotated[int, Field(description="from Field")] = 0) -> str:
            """Book a room.

            :param floor: from the docstring
            """
            return f"{city} {nights} {note!r} {unit} {pets}"
    ''')
    box = Toolbox.open([path], [])
    try:
        props = box.specs[0].parameters["properties"]
        assert props["city"] == {"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 20}
        assert props["nights"] == {"type": "integer", "minimum": 1, "maximum": 14, "default": 1}
        assert props["note"] == {"type": "string", "description": "for the desk", "default": ""}
        assert props["unit"] == {"enum": ["C", "F"], "default": "C"}
        assert props["floor"] == {"type": "integer", "description": "from the docstring", "default": 0}
        assert props["pets"] == {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}], "default": None}
        make_plan(None, box.specs)  # (a grammar is made from them)
        assert box.call(ToolCall("book", '{"city": "oslo", "nights": 2, "pets": 1}'), 5) == "oslo 2 '' C 1"
        for bad, why in (('{"city": "Oslo"}', "'Oslo' does not match '^[a-z]+$'"), ('{"city": "oslo", "nights": 15}',
                                                                             "15 is greater than the maximum of 14")):
            with pytest.raises(ToolError, match=re.escape(f"the model's arguments for book fail its schema: {why}")):
                box.call(ToolCall("book", bad), 5)
    finally:
        box.close()


def test_a_pattern_no_grammar_can_hold_is_checked_at_the_call_and_loads(tmp_path: Path) -> None:
    """pydantic searches with a pattern (`^[A-Z]{2}\\d+` is a prefix check); a grammar needs ^...$. Such a pattern,
    or one with \\b, stays out of the schema and so out of the grammar, and the call is still checked against it (once
    Annotated's constraints reached the schema, one such parameter stopped run, chat and serve with exit 2)."""
    from localgen.errors import ToolError
    from localgen.tools.loop import Toolbox
    from localgen.tools.plan import make_plan
    from localgen.tools.spec import ToolCall

    path = _functions(tmp_path, '''
        from __future__ import annotations
        from typing import Annotated
        from pydantic import BaseModel, Field

        class Item(BaseModel):
            sku: str = Field(pattern=r"\\bX")

        def lookup(code: Annotated[str, Field(pattern=r"^[A-Z]{2}\\d+")], item: Item | None = None,
                   kind: Annotated[str, Field(pattern=r"^(a|b)$")] = "a") -> str:
            """Look a code up."""
            return f"{code} {kind} {item.sku if item else '-'}"
    ''')
    box = Toolbox.open([path], [])
    try:
        spec = box.specs[0]
        props = spec.parameters["properties"]
        assert props["code"] == {"type": "string"}
        assert props["kind"] == {"type": "string", "pattern": "^(a|b)$", "default": "a"}  # a grammar holds this one
        assert "pattern" not in json.dumps(props["item"])  # a model's field, \\b: left out too
        make_plan(None, box.specs)  # a grammar is made (GrammarError before)
        called = box.call(ToolCall("lookup", '{"code": "AB12 and more", "item": {"sku": "a X"}}'), 5)
        assert called == "AB12 and more a a X"
        for bad, arg in (('{"code": "ab12"}', "code"), ('{"code": "AB12", "item": {"sku": "aX"}}', "item")):
            with pytest.raises(ToolError, match=f"lookup: argument {arg} does not fit its type: .*should match"):
                box.call(ToolCall("lookup", bad), 5)
    finally:
        box.close()


# ---- run ----------------------------------------------------------------------------------------------------

def _run(cli: CLI, *args: str) -> Any:
    return cli("run", "-m", "smollm2:135m", "--temperature", "0", *args)


def test_the_default_model_finishes_a_function_round_trip(cli: CLI, tmp_path: Path) -> None:
    r = _run(cli, "--functions", str(_functions(tmp_path, WEATHER_FN)), "--yes", "-n", "64", "--json",
             "What is the weather in Paris?")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [c["name"] for c in doc["tool_calls"]] == ["get_weather"]
    assert doc["text"].strip() and not doc["text"].lstrip().startswith("{"), "an answer, not a call as text"
    assert "still calling tools" not in r.stderr


def test_a_function_returning_a_set_gives_its_text(cli: CLI, tmp_path: Path) -> None:
    path = _functions(tmp_path, '''
        def numbers() -> set[int]:
            """Some numbers."""
            return {1, 2, 3}
    ''')
    r = _run(cli, "--functions", str(path), "--yes", "--tool-choice", "numbers", "-n", "48", "--json",
             "Give me the numbers.")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tool_calls"][0]["result"] == "{1, 2, 3}"
    assert "Traceback" not in r.stderr


def test_run_calls_a_function_within_its_annotated_pattern(cli: CLI, tmp_path: Path) -> None:
    """A `--functions` parameter `Annotated[str, Field(pattern=r"^[a-z]+$")]`: the default model's call, forced,
    writes its city in the pattern (it wrote "Paris", the pattern gone from the schema and the grammar)."""
    path = _functions(tmp_path, '''
        from typing import Annotated
        from pydantic import Field

        def get_weather(city: Annotated[str, Field(pattern=r"^[a-z]+$", max_length=12)]) -> str:
            """Get the current weather in a city."""
            return f"It is 21 C and sunny in {city}."
    ''')
    r = _run(cli, "--functions", str(path), "--yes", "--tool-choice", "get_weather", "-n", "48", "--json",
             "What is the weather in Paris?")
    assert r.returncode == 0, r.stderr
    call = json.loads(r.stdout)["tool_calls"][0]
    assert call["name"] == "get_weather" and re.fullmatch(r"[a-z]{1,12}", call["arguments"]["city"]), call


MCP_SERVER = '''
    from pydantic import BaseModel
    from mcp.server.mcpserver import MCPServer

    app = MCPServer("schemas")

    class Address(BaseModel):
        city: str
        street: str | None = None

    @app.tool()
    def locate(address: Address) -> str:
        """Find an address."""
        return f"found {address.city}"

    app.run()
'''


def test_mcp_tools_with_refs_work(cli: CLI, tmp_path: Path) -> None:
    server = tmp_path / "mcp_schemas.py"
    server.write_text(textwrap.dedent(MCP_SERVER))
    r = _run(cli, "--mcp", f"{sys.executable} {server}", "--yes", "--tool-choice", "locate", "-n", "64",
             "--json", "Where is Paris?")
    assert r.returncode == 0, r.stderr
    calls = json.loads(r.stdout)["tool_calls"]
    assert calls[0]["name"] == "locate"
    assert calls[0]["result"] == f"found {calls[0]['arguments']['address']['city']}"


PATTERN_SERVER = '''
    import sys
    from typing import Annotated
    from pydantic import Field
    from mcp.server.mcpserver import MCPServer

    app = MCPServer("zips")

    @app.tool()
    def zip_lookup(zip: Annotated[str, Field(pattern=r"^\\d{5}$")]) -> str:
        """Look up a US zip code."""
        return f"zip {zip} is in Springfield"

    if sys.argv[1:] == ["--boundary"]:
        @app.tool()
        def odd(code: Annotated[str, Field(pattern=r"^\\bA\\w*$")]) -> str:
            """A tool whose pattern no grammar holds."""
            return code

    app.run()
'''


def test_an_mcp_tool_with_pydantic_s_d_pattern_is_called_in_its_pattern(cli: CLI, tmp_path: Path) -> None:
    """pydantic writes constr(pattern=r"^\\d{5}$") with \\d, which the converter did not take: every tool of the run
    was refused over one. The call's zip is five digits now; a pattern no grammar holds names its server's tool."""
    server = tmp_path / "zips.py"
    server.write_text(textwrap.dedent(PATTERN_SERVER))
    r = _run(cli, "--mcp", f"{sys.executable} {server}", "--yes", "--tool-choice", "zip_lookup", "-n", "48",
             "--json", "Look up the zip code 12345.")
    assert r.returncode == 0, r.stderr
    call = json.loads(r.stdout)["tool_calls"][0]
    assert call["name"] == "zip_lookup" and re.fullmatch(r"[0-9]{5}", call["arguments"]["zip"]), call
    r = _run(cli, "--mcp", f"{sys.executable} {server} --boundary", "--yes", "-n", "8", "hi")
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("localgen: error: the MCP server ") and r.stderr.endswith(
        "'s tool odd: the JSON schema's pattern /^\\bA\\w*$/ uses \\b, which a grammar cannot hold: it cannot become "
        "a grammar\n"), r.stderr


# ---- serve --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def plain_server(cli_env: dict[str, str]) -> Iterator[Server]:
    """SmolLM2 with its own template, which renders no tools: the generic format."""
    s = Server(cli_env, "-np", "2", "--ctx", "4096")
    yield s
    assert s.stop() == 0


ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = _tool("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
                "Get the current weather in a city.")


def _chat(server: Server, **body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/chat/completions",
                      json={"messages": ASK, "temperature": 0, "max_tokens": 96, **body}, timeout=600)


def test_serve_takes_ref_tools_and_the_default_model_calls_them(plain_server: Server) -> None:
    visit = _tool("plan_visit", Visit.model_json_schema(), "Plan a visit to a place.")
    assert "$ref" in json.dumps(visit)
    for tools, choice in (([WEATHER], "auto"), ([visit], "required")):
        r = _chat(plain_server, tools=tools, tool_choice=choice)
        assert r.status_code == 200, r.text
        choice_ = r.json()["choices"][0]
        assert choice_["finish_reason"] == "tool_calls" and not choice_["message"]["content"], choice_
        for call in choice_["message"]["tool_calls"]:
            name = call["function"]["name"]
            schema = next(t["function"]["parameters"] for t in tools if t["function"]["name"] == name)
            jsonschema.validate(json.loads(call["function"]["arguments"]), schema)
    tree = {"type": "json_schema", "json_schema": {"name": "tree", "schema": Node.model_json_schema()}}
    r = _chat(plain_server, response_format=tree, max_tokens=48,
              messages=[{"role": "user", "content": "A tree of numbers as JSON."}])
    assert r.status_code == 200, r.text
    remote = _tool("f", {"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}})
    r = _chat(plain_server, tools=[remote], max_tokens=4)
    assert r.status_code == 400 and "only local ones" in r.json()["error"]["message"]
    many = [_tool(f"tool_{i}", {"type": "object", "properties": {}}) for i in range(1000)]
    r = _chat(plain_server, tools=many, max_tokens=4)
    assert r.status_code == 400 and "1,000 tools; at most" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "tools"


def test_serve_gives_a_call_repeated_until_max_tokens_once(plain_server: Server) -> None:
    """SmolLM2 forced to call a tool with no arguments writes the same call until max_tokens: the answer is
    that call once, whole or streamed, the first time (prompt not cached) and the second (cached), and serve
    stops generating at the first repeat (as the CLI does), well before max_tokens."""
    clock = _tool("get_time", {"type": "object", "properties": {}}, "The current time.")
    body = {"tools": [clock], "tool_choice": "required", "max_tokens": 160}
    for _ in range(2):
        r = _chat(plain_server, **body).json()
        message = r["choices"][0]["message"]
        assert r["choices"][0]["finish_reason"] == "tool_calls" and not message["content"], r
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == \
            [("get_time", "{}")]
        assert r["usage"]["completion_tokens"] < 80, "stopped at the first repeat, not at max_tokens"
    with httpx.stream("POST", f"{plain_server.url}/v1/chat/completions", timeout=600,
                      json={"messages": ASK, "temperature": 0, "stream": True, **body,
                            "stream_options": {"include_usage": True}}) as s:
        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    assert chunks[-1]["usage"]["completion_tokens"] < 80, "the stream stopped at the first repeat too"
    chunks = chunks[:-1]  # the usage chunk has no choices
    deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
    assert not "".join(d.get("content") or "" for d in deltas)
    assert [d["tool_calls"][0]["function"]["name"] for d in deltas if d.get("tool_calls")
            and "name" in d["tool_calls"][0]["function"]] == ["get_time"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
