"""Anthropic's Messages API as the adapter reads it (serve/anthropic.py), in process: blocks to chat messages,
tools and tool_choice to OpenAI's, thinking and effort to the template's switch, errors in Anthropic's shape.
The routes themselves, with the real `anthropic` SDK and a model: tests/test_serve.py and tests/test_tools_serve.py."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from localgen import loadsettings, settings
from localgen.serve import anthropic as a
from localgen.serve.apierror import ANTHROPIC, HTTPError, error_body
from localgen.serve.ask import Schema

ROOT = Path(__file__).resolve().parent.parent


def test_blocks_become_the_chat_messages_every_route_uses() -> None:
    msgs = a._chat_messages([{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}], [
        {"role": "user", "content": [{"type": "text", "text": "Look:"},
                                     {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                  "data": "iVBORw0KGgo="}}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "x"},
                                          {"type": "text", "text": "Calling."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"},
                                     {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
                                      "content": [{"type": "text", "text": "boom"}]},
                                     {"type": "text", "text": "Go on."}]},
    ])
    assert msgs[0] == {"role": "system", "content": "Be brief."}
    assert msgs[1]["content"][1] == {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    assert msgs[2] == {"role": "assistant", "content": [{"type": "text", "text": "Calling."}], "tool_calls": [
        {"id": "toolu_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]}
    assert msgs[3] == {"role": "tool", "tool_call_id": "toolu_1", "content": "42"}
    assert msgs[4] == {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: boom"}
    assert msgs[5] == {"role": "user", "content": [{"type": "text", "text": "Go on."}]}
    # a user message of tool results alone adds no empty user turn
    only = a._chat_messages(None, [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                                 "content": "x"}]}])
    assert [m["role"] for m in only] == ["tool"]
    url = a._chat_messages(None, [{"role": "user", "content": [{"type": "image", "source": {
        "type": "url", "url": "https://example.com/a.png"}}]}])
    assert url[0]["content"][0]["image_url"]["url"] == "https://example.com/a.png"


@pytest.mark.parametrize(("system", "messages", "words"), [
    (5, [{"role": "user", "content": "x"}], "system"),
    (None, [{"role": "user", "content": [{"type": "document", "source": {}}]}], "'document'"),
    (None, [{"role": "assistant", "content": [{"type": "tool_result"}]}], "'tool_result'"),
    (None, [{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}],
     "base64"),
    (None, [{"role": "user", "content": [{"type": "text"}]}], "text"),
])
def test_bad_blocks_are_400s(system: Any, messages: Any, words: str) -> None:
    with pytest.raises(HTTPError) as e:
        a._chat_messages(system, messages)
    assert e.value.status == 400 and words in e.value.message


def test_tools_and_tool_choice_as_openais() -> None:
    tools = a._tools([{"name": "f", "description": "d", "input_schema": {"type": "object"}}])
    assert tools == [{"type": "function", "function": {"name": "f", "description": "d",
                                                       "parameters": {"type": "object"}}}]
    assert a._choice({"type": "auto"}) == ("auto", None)
    assert a._choice({"type": "any", "disable_parallel_tool_use": True}) == ("required", False)
    assert a._choice({"type": "tool", "name": "f"}) == ({"type": "function", "function": {"name": "f"}}, None)
    assert a._choice({"type": "none"}) == ("none", None)
    for bad in ({"type": "tool"}, {"type": "sometimes"}, "auto"):
        with pytest.raises(HTTPError):
            a._choice(bad)


def test_thinking_and_effort_turn_the_templates_switch() -> None:
    assert a._thinking({"type": "enabled", "budget_tokens": 2048}) is True
    assert a._thinking({"type": "adaptive"}) is True
    assert a._thinking({"type": "disabled"}) is False
    assert a._thinking(None) is None
    assert a._output_config({"effort": "low"}) == (None, "low")  # a budget (pipeline.py's EFFORT_BUDGETS)
    assert a._output_config({"effort": "max"}) == (None, "max")
    body = {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]}
    for effort in ("low", "max"):  # an effort turns thinking on
        asked = asyncio.run(a.MESSAGES.parse({**body, "output_config": {"effort": effort}}))
        assert asked.thinking is True and asked.effort == effort
    off = asyncio.run(a.MESSAGES.parse({**body, "output_config": {"effort": "low"}, "thinking": {"type": "disabled"}}))
    assert off.thinking is False, "thinking: disabled wins over an effort"
    schema, _ = a._output_config({"format": {"type": "json_schema", "schema": {"type": "object"}}})
    assert schema == Schema({"type": "object"}, "output_config.format")
    for bad in ({"effort": "extreme"}, {"format": {"type": "json_object"}}):
        with pytest.raises(HTTPError):
            a._output_config(bad)


def test_errors_in_anthropics_shape() -> None:
    assert error_body(ANTHROPIC, HTTPError(404, "no")) == {"type": "error", "error": {"type": "not_found_error",
                                                                                       "message": "no"}}
    assert error_body(ANTHROPIC, HTTPError(503, "busy"))["error"]["type"] == "overloaded_error"
    assert error_body(ANTHROPIC, HTTPError(500, "x"))["error"]["type"] == "api_error"


def test_the_api_page_names_every_field_the_routes_read() -> None:
    """docs/api.md lists the sampling fields of /v1 and Ollama's options, and the load-time options ignored:
    each name the table gives a route is on the page."""
    page = (ROOT / "docs" / "api.md").read_text()
    named = set(re.findall(r"`([a-z0-9_]+)`", page))
    for api in ("openai", "anthropic", "responses", "ollama"):
        assert set(settings.spellings(api)) <= named, api
    assert named >= loadsettings.OLLAMA_LOAD_OPTIONS
