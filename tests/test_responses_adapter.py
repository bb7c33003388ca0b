"""OpenAI's Responses API as the adapter reads it (serve/responses.py, serve/responseitems.py), in process:
input items to chat messages, tools and tool_choice to chat completions', text.format and reasoning.effort,
the response object and stream events as the `openai` SDK's own types validate them, and the store
(serve/responsestore.py).
The routes themselves, with the real `openai` SDK and a model: tests/test_serve.py and tests/test_tools_serve.py."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from localgen.serve import responseitems as items_
from localgen.serve import responses as r
from localgen.serve.apierror import HTTPError
from localgen.serve.ask import Schema
from localgen.serve.responsestore import MAX_AGE_S, MAX_BYTES, MAX_RESPONSES, ResponseStore
from localgen.tools.spec import ToolCall
from localgen.tools.stream import AnswerStream, Piece
from localgen.types import GenerationRequest, SamplingParams


def test_input_items_become_the_chat_messages_every_route_uses() -> None:
    assert r._input_messages("Hi") == [{"role": "user", "content": "Hi"}]
    msgs = r._input_messages([
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Look "},
            {"type": "input_image", "image_url": "data:image/png;base64,iVBO"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Calling.",
                                                               "annotations": []}]},
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": '{"a": 1}'},
        {"type": "function_call", "call_id": "call_2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "42"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "7"}]},
    ])
    assert msgs[0] == {"role": "developer", "content": "Be brief."}
    assert msgs[1]["content"] == [{"type": "text", "text": "Look "},
                                  {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}}]
    assert msgs[2] == {"role": "assistant", "content": "Calling.", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
        {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]}
    assert msgs[3] == {"role": "tool", "tool_call_id": "call_1", "content": "42", "name": "f"}
    assert msgs[4] == {"role": "tool", "tool_call_id": "call_2", "content": "7", "name": "g"}
    url = r._input_messages([{"role": "user", "content": [{"type": "input_image",
                                                            "image_url": "https://example.com/a.png"}]}])
    assert url[0]["content"] == [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]
    # an output answering a call made in the conversation it continues is named too
    earlier = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_9", "type": "function", "function": {"name": "h", "arguments": "{}"}}]}]
    assert r._input_messages([{"type": "function_call_output", "call_id": "call_9", "output": "ok"}], earlier) == [
        {"role": "tool", "tool_call_id": "call_9", "content": "ok", "name": "h"}]
    # a function call with no assistant message before it is an assistant message of its own
    alone = r._input_messages([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}])
    assert alone == [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]


@pytest.mark.parametrize(("raw", "words"), [
    ([], "input"),
    (5, "input"),
    ([{"type": "item_reference", "id": "x"}], "'item_reference'"),
    ([{"role": "tool", "content": "x"}], "role"),
    ([{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}], "'input_file'"),
    ([{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}], "image_url"),
    ([{"type": "function_call", "name": "f", "arguments": "{}"}], "call_id"),
    ([{"type": "function_call_output", "call_id": "c"}], "output"),
    # a call_id of another type (a red team's: a list or an object was hashed first, a TypeError and a 500)
    ([{"type": "function_call_output", "call_id": {}, "output": "x"}], "call_id"),
    ([{"type": "function_call", "call_id": ["a"], "name": "f", "arguments": "{}"}], "call_id"),
])
def test_bad_input_items_are_400s_that_name_the_field(raw: Any, words: str) -> None:
    with pytest.raises(HTTPError) as e:
        r._input_messages(raw)
    assert e.value.status == 400 and e.value.param == "input" and words in e.value.message


def test_a_tool_left_out_is_said_once_for_each_type_in_the_servers_log() -> None:
    """A hosted tool or a namespace is left out of what the model is offered (agents send them with every turn):
    serve's log says so once for each type, not at each request, and never for function or file_search tools."""
    from localgen.serve.servelog import LOG, ServeLog

    lines: list[str] = []
    token = LOG.set(ServeLog(write=lines.append))
    try:
        for _ in range(3):
            r._tools([{"type": "web_search"}, {"type": "namespace", "name": "n", "tools": []},
                      {"type": "file_search"}, {"type": "function", "name": "f"}])
    finally:
        LOG.reset(token)
    assert lines == ["warning: /v1/responses leaves out tools of type 'web_search': the model is offered only "
                     "function, file_search and mcp tools",
                     "warning: /v1/responses leaves out tools of type 'namespace': the model is offered only "
                     "function, file_search and mcp tools"]


def test_tools_of_made_up_types_are_bounded_in_a_request_and_in_the_servers_log() -> None:
    """Every tool counts toward the 256 of a request, whatever its type, before any is read; and types never
    seen before, request after request, are said at most MAX_ONCE times in the server's life (each key said
    once is remembered: they stay bounded too)."""
    from localgen.serve.servelog import LOG, MAX_ONCE, ServeLog

    with pytest.raises(HTTPError) as e:
        r._tools([{"type": f"made_up_{i}"} for i in range(257)])
    assert e.value.status == 400 and e.value.param == "tools"
    assert e.value.message == "`tools` holds 257 tools; at most 256 in one request"
    lines: list[str] = []
    log = ServeLog(write=lines.append)
    token = LOG.set(log)
    try:
        for n in range(4):
            assert r._tools([{"type": f"made_up_{n}_{i}"} for i in range(256)]) is None
    finally:
        LOG.reset(token)
    assert len(lines) == MAX_ONCE < 4 * 256 and len(log._said) == MAX_ONCE
    assert lines[0].startswith("warning: /v1/responses leaves out tools of type 'made_up_0_0'")


def test_function_tools_and_tool_choice_as_chat_completions() -> None:
    tools = r._tools([{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"},
                       "strict": True}])
    assert tools == [{"type": "function", "function": {"name": "f", "description": "d",
                                                       "parameters": {"type": "object"}}}]
    assert r._choice("required") == "required" and r._choice(None) is None
    assert r._choice({"type": "function", "name": "f"}) == {"type": "function", "function": {"name": "f"}}
    # a tool the server cannot run, or a namespace (Codex sends both by default): left out, the request answered
    for other in ({"type": "web_search", "external_web_access": False}, {"type": "code_interpreter"},
                  {"type": "namespace", "name": "multi_agent_v1", "tools": [{"type": "function", "name": "g"}]}):
        assert r._tools([other]) is None
        assert r._tools([other, {"type": "function", "name": "f"}]) == [
            {"type": "function", "function": {"name": "f", "description": "", "parameters": {
                "type": "object", "properties": {}}}}]
    for other in ("custom", "local_shell"):  # run by the client, not as a function: refused, not dropped unawares
        with pytest.raises(HTTPError) as e:
            r._tools([{"type": other, "name": "apply_patch"}])
        assert e.value.param == "tools" and f"not {other!r}" in e.value.message
    for bad in ({"name": "f"}, 5):
        with pytest.raises(HTTPError) as e:
            r._tools([bad])
        assert e.value.param == "tools[0].type" and "needs a type" in e.value.message
    # file_search is the server's own (serve/filesearch.py): no tool for the model; beside functions, the functions
    assert r._tools([{"type": "file_search", "vector_store_ids": ["notes"]}]) is None
    assert r._tools([{"type": "file_search"}, {"type": "function", "name": "f"}]) == [
        {"type": "function", "function": {"name": "f", "description": "", "parameters": {"type": "object",
                                                                                       "properties": {}}}}]
    for bad in ("sometimes", {"type": "allowed_tools"}, {"type": "function"}):
        with pytest.raises(HTTPError) as e:
            r._choice(bad)
        assert e.value.param == "tool_choice"


def test_text_format_is_a_grammar_and_effort_the_templates_switch() -> None:
    from localgen.serve.schema import schema_grammar

    assert r._text_format({"format": {"type": "text"}}) is None
    assert r._text_format({"format": {"type": "json_object"}}) == Schema("json", "text.format")
    schema = {"type": "object", "properties": {"colour": {"type": "string"}}}
    made = r._text_format({"format": {"type": "json_schema", "name": "c", "schema": schema}})
    assert made == Schema(schema, "text.format.schema")
    assert "colour" in asyncio.run(schema_grammar(made.value, made.param))
    for bad, param in (({"format": {"type": "json_schema"}}, "text.format.schema"),
                       ({"format": {"type": "grammar"}}, "text.format"), ("json", "text")):
        with pytest.raises(HTTPError) as e:
            r._text_format(bad)
        assert e.value.param == param
    assert r._effort({"effort": "none"}) is False and r._effort({"effort": "minimal"}) is False
    assert all(r._effort({"effort": e}) is True for e in ("low", "medium", "high", "xhigh", "max"))
    assert r._effort(None) is None and r._effort({"summary": "auto"}) is None
    with pytest.raises(HTTPError) as e:
        r._effort({"effort": "huge"})
    assert e.value.param == "reasoning.effort"


@pytest.mark.parametrize(("body", "param"), [
    ({"truncation": "sideways"}, "truncation"),
    ({"include": ["everything"]}, "include"),
    ({"metadata": "x"}, "metadata"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),  # OpenAI's bounds: 16 keys,
    ({"metadata": {"k" * 65: "v"}}, "metadata"),  # keys of 64 characters,
    ({"metadata": {"k": "v" * 513}}, "metadata"),  # values of 512
    ({"metadata": {"k": 1}}, "metadata"),  # that are strings
    ({"metadata": {"k": "v" * 12_000_000}}, "metadata"),  # the red team's 12 MB
    ({"reasoning": {"summary": "x" * 15_000_000}}, "reasoning.summary"),  # the red team's echoed fields:
    ({"reasoning": {"generate_summary": "long"}}, "reasoning.generate_summary"),  # OpenAI's enums,
    ({"text": {"verbosity": "x" * 15_000_000}}, "text.verbosity"),
    ({"text": {"notes": "x"}}, "text.notes"),  # no field of its own,
    ({"text": {"format": {"type": "json_object", "extra": "x"}}}, "text.format.extra"),
    ({"text": {"format": {"type": "json_schema", "name": "n" * 65, "schema": {}}}}, "text.format.name"),
    ({"text": {"format": {"type": "json_object", "strict": "yes"}}}, "text.format.strict"),
    ({"user": "u" * 257}, "user"),
    ({"user": 7}, "user"),
    ({"background": True}, "background"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
])
def test_options_this_server_cannot_honour_are_400s(body: dict[str, Any], param: str) -> None:
    with pytest.raises(HTTPError) as e:
        r._check_options(body)
    assert e.value.status == 400 and e.value.param == param


def test_known_options_are_accepted() -> None:
    r._check_options({"truncation": "disabled", "include": ["reasoning.encrypted_content"], "metadata": {"a": "b"}})
    r._check_options({"metadata": {f"{i:064d}": "v" * 512 for i in range(16)}, "user": "u" * 256})  # at the bounds
    r._check_options({"reasoning": {"effort": "low", "summary": "detailed"}, "text": {
        "verbosity": "high", "format": {"type": "json_schema", "name": "n" * 64, "schema": {}, "strict": True}}})


def _shape(body: dict[str, Any] | None = None) -> items_.Encoder:
    request = GenerationRequest(messages=({"role": "user", "content": "x"},), sampling=SamplingParams())
    return items_.Encoder({"model": "m", "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
                     **(body or {})}, "m", request, None, [])


def _done(finish: str = "eos") -> Any:
    return SimpleNamespace(finish_reason=finish, prompt_tokens=10, cached_tokens=4, completion_tokens=3)


def test_the_response_object_is_the_sdks() -> None:
    from openai.types.responses import Response

    answer = AnswerStream()
    answer.reasoning, answer.content = "thought", "Paris."
    answer.calls = [ToolCall("f", '{"a": 1}', "call_1")]
    shape = _shape({"instructions": "Be brief.", "metadata": {"a": "b"}, "max_output_tokens": 9,
                  "tool_choice": {"type": "function", "name": "f"}})
    doc = asyncio.run(shape.whole(_done(), None, answer))
    parsed = Response.model_validate(doc)
    assert parsed.metadata == {"a": "b"} and parsed.max_output_tokens == 9 and parsed.tools[0].name == "f"
    assert parsed.tool_choice.type == "function"  # type: ignore[union-attr]
    assert [o.type for o in parsed.output] == ["reasoning", "message", "function_call"]
    assert parsed.output_text == "Paris." and parsed.status == "completed" and parsed.instructions == "Be brief."
    assert parsed.usage is not None and parsed.usage.total_tokens == 13
    assert parsed.usage.input_tokens_details.cached_tokens == 4
    cut = Response.model_validate(asyncio.run(_shape().whole(_done("length"), None, AnswerStream())))
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens" and cut.output_text == ""


def test_stream_events_are_the_sdks_in_order() -> None:
    """Every event validates as the SDK's ResponseStreamEvent, sequence numbers count up, and each output
    item opens, streams and closes before the next."""
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    items = _shape()
    raw = [items.event("response.created", response=items.response("in_progress", []))]
    raw += items.said([Piece("reasoning", "hm"), Piece("reasoning", "m"), Piece("content", "Pa"),
                         Piece("content", "ris"), ToolCall("f", '{"a": 1}', "call_1")])
    raw += items.close("completed")
    raw.append(items.event("response.completed", response=items.response("completed", items.output,
                                                                                items_.usage(_done()))))
    adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    events = []
    for chunk in raw:
        head, data = chunk.decode().rstrip("\n").split("\n")
        doc = json.loads(data.removeprefix("data: "))
        assert head == f"event: {doc['type']}"
        events.append(adapter.validate_python(doc))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events] == [
        "response.created",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    final = events[-1].response
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call"]
    assert final.output_text == "Paris" and final.output[0].content[0].text == "hmm"
    assert [e.output_index for e in events if e.type == "response.output_item.done"] == [0, 1, 2]


def test_an_error_after_the_stream_began_is_response_failed() -> None:
    from openai.types.responses import ResponseFailedEvent

    from localgen.serve.jobs import Failed, Text

    async def run() -> list[bytes]:
        job = SimpleNamespace(events=asyncio.Queue(), cancelled=threading.Event(), finish=threading.Event())
        job.events.put_nowait(Failed(503, "the server is shutting down"))
        from localgen.serve.pipeline import _stream

        return [chunk async for chunk in _stream(job, Text("Hi"), AnswerStream(), _shape())]  # type: ignore[arg-type]

    chunks = asyncio.run(run())
    last = json.loads(chunks[-1].decode().split("data: ", 1)[1])
    failed = ResponseFailedEvent.model_validate(last)
    assert failed.response.status == "failed" and failed.response.error is not None
    assert failed.response.error.code == "server_error" and "shutting down" in failed.response.error.message
    assert failed.response.output_text == "Hi"


def test_the_store_keeps_loads_deletes_expires_and_bounds(tmp_path: Path) -> None:
    now = [1000.0]
    store = ResponseStore(tmp_path / "responses" / "responses.db", most=3, max_age_s=100, clock=lambda: now[0])
    convo = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    store.save("resp_1", {"id": "resp_1"}, convo)
    found = store.load("resp_1")
    assert found is not None and found.response == {"id": "resp_1"} and found.conversation == convo
    assert (tmp_path / "responses" / "responses.db").stat().st_mode & 0o777 == 0o600
    assert store.delete("resp_1") and store.load("resp_1") is None and not store.delete("resp_1")
    for i in range(2, 6):  # at most 3: the oldest goes first
        now[0] += 1
        store.save(f"resp_{i}", {"id": f"resp_{i}"}, [])
    assert store.load("resp_2") is None and all(store.load(f"resp_{i}") for i in (3, 4, 5))
    now[0] += 99.5  # resp_3 (saved at 1002) is past 100 s old, resp_5 (at 1004) is not
    assert store.load("resp_3") is None and store.load("resp_5") is not None
    store.save("resp_6", {"id": "resp_6"}, [])  # a write drops the expired rows
    import sqlite3

    with sqlite3.connect(tmp_path / "responses" / "responses.db") as db:
        kept = sorted(row[0] for row in db.execute("SELECT id FROM responses"))
    assert kept == ["resp_5", "resp_6"]
    assert MAX_RESPONSES == 1000 and MAX_AGE_S == 30 * 24 * 3600  # the bounds docs/api.md gives
    assert MAX_BYTES == 1 << 30


def test_the_store_is_bounded_in_bytes_the_oldest_going_first(tmp_path: Path) -> None:
    """A few large conversations cannot fill the disk: past max_bytes (their JSON, UTF-8) the oldest go, however
    few the responses are; a store made before the bound counts the rows it holds."""
    import sqlite3

    now = [1000.0]
    path = tmp_path / "responses.db"
    with sqlite3.connect(path) as db:  # as an earlier version made it: no bytes column
        db.execute("CREATE TABLE responses (id TEXT PRIMARY KEY, created REAL NOT NULL, response TEXT NOT NULL, "
                   "conversation TEXT NOT NULL)")
        db.execute("INSERT INTO responses VALUES ('resp_0', 999, '{}', ?)", (json.dumps(["é" * 300_000]),))
    store = ResponseStore(path, clock=lambda: now[0], max_bytes=1_000_000)
    big = [{"role": "user", "content": "é" * 150_000}]  # 300,000 bytes in UTF-8, 150,000 characters
    for i in range(1, 5):
        now[0] += 1
        store.save(f"resp_{i}", {"id": f"resp_{i}"}, big)
    with sqlite3.connect(path) as db:
        kept = sorted(row[0] for row in db.execute("SELECT id FROM responses"))
        total = db.execute("SELECT SUM(bytes) FROM responses").fetchone()[0]
    assert kept == ["resp_2", "resp_3", "resp_4"] and total <= 1_000_000, (kept, total)


def test_input_items_of_calls_results_and_a_store_made_before_them(tmp_path: Path) -> None:
    """A conversation's calls and results as function_call and function_call_output items; a row stored before
    input_items were kept (no count) lists everything before its answer."""
    import sqlite3

    from localgen.serve.responsestore import ResponseStore, as_items

    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
    convo = [{"role": "user", "content": "Add."}, {"role": "assistant", "content": "", "tool_calls": [call]},
             {"role": "tool", "tool_call_id": "call_1", "content": "2"}, {"role": "assistant", "content": "Two."}]
    items = as_items(convo[:3], "abc")
    assert [i["type"] for i in items] == ["message", "function_call", "function_call_output"]
    assert items[1] | {"id": ""} == {"id": "", "type": "function_call", "call_id": "call_1", "name": "add",
                                     "arguments": '{"a": 1}', "status": "completed"}
    assert items[2]["output"] == "2" and items[2]["call_id"] == "call_1"
    path = tmp_path / "responses.db"
    with sqlite3.connect(path) as db:  # the table as an older localgen made it, one row in it
        db.execute("CREATE TABLE responses (id TEXT PRIMARY KEY, created REAL NOT NULL, response TEXT NOT NULL, "
                   "conversation TEXT NOT NULL, bytes INTEGER NOT NULL DEFAULT 0)")
        db.execute("INSERT INTO responses VALUES (?, ?, ?, ?, 0)", ("resp_old", time.time(), "{}", json.dumps(convo)))
    store = ResponseStore(path)
    old = store.load("resp_old")
    assert old is not None and old.inputs == -1 and old.input_messages == convo[:3]
    store.save("resp_new", {}, convo, inputs=1)
    new = store.load("resp_new")
    assert new is not None and new.input_messages == [convo[2]]


def test_the_output_of_a_namespace_call_left_out_goes_with_it() -> None:
    """A namespace's tools are left out of what the model is offered, and so are its calls in the input: the output
    answering one by its call_id, with no namespace of its own (the Responses shape), goes too, where it was a 400
    ("No tool call found for function call output with call_id")."""
    from localgen.serve import responses as r

    msgs = r._input_messages([
        {"role": "user", "content": "Plan it."},
        {"type": "function_call", "call_id": "c1", "name": "spawn", "namespace": "multi_agent_v1", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "spawned"},
        {"role": "user", "content": "Go on."},
    ])
    assert [(m["role"], m["content"]) for m in msgs] == [("user", "Plan it."), ("user", "Go on.")]


def test_the_store_never_keeps_a_number_json_has_not(tmp_path: Path) -> None:
    """A NaN or an infinity kept in a stored response made every GET of it a 500 until it was deleted: it is
    refused as it is saved (that request's fault), and nothing is kept."""
    store = ResponseStore(tmp_path / "responses.db")
    for odd in (float("nan"), float("inf")):
        with pytest.raises(ValueError):
            store.save("resp_odd", {"id": "resp_odd", "tools": [{"maximum": odd}]}, [])
        with pytest.raises(ValueError):
            store.save("resp_odd", {"id": "resp_odd"}, [{"role": "user", "content": "hi", "x": odd}])
    assert store.load("resp_odd") is None
