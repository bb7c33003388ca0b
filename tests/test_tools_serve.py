"""Tools and reasoning through `serve`, with the real clients: OpenAI's chat completions and Responses API,
Ollama's, Anthropic's Messages API (tool calls streamed and whole, tool results back through the template,
llama-server's calls for the same requests, reasoning kept out of content, a reasoning budget). SmolLM2 with
Qwen2.5's template (tools) or DeepSeek-R1's (thinking)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scripts.tools_reference import ADD, ASK_PARIS, TIME, WEATHER, calls_of, render
from tests.conftest import NO_GPU, ROOT
from tests.test_serve import Server
from tests.test_tools import ASK, QWEN, R1


def _serving(cli_env: dict[str, str], template: Path, slots: str) -> Iterator[Server]:
    s = Server(cli_env, "-np", slots, "--ctx", "2048", "--chat-template-file", str(template))
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def tool_server(cli_env: dict[str, str]) -> Iterator[Server]:
    # on the CPU, on any machine: test_tool_calls_match_llama_server compares with llama-server's CPU answers,
    # whose greedy calls a GPU's kernels change (an H200 parsed none where it made two)
    yield from _serving({**cli_env, **NO_GPU}, QWEN, "2")


def _client(server: Server) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")


def test_openai_client_gets_valid_tool_calls_streamed_and_whole(tool_server: Server) -> None:
    client = _client(tool_server)
    kw: dict[str, Any] = {"model": "smollm2:135m", "messages": ASK, "tools": [WEATHER, TIME], "temperature": 0,
                          "max_tokens": 120, "tool_choice": "required", "parallel_tool_calls": False}
    r = client.chat.completions.create(**kw)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls and len(calls) == 1 and calls[0].id.startswith("call_") and calls[0].type == "function"
    args = json.loads(calls[0].function.arguments)
    assert calls[0].function.name in ("get_weather", "get_time")
    assert (calls[0].function.name, set(args) - {"unit"}) in (("get_weather", {"city"}), ("get_time", {"zone"}))
    # streamed: deltas that the client accumulates into the same call
    name, arguments, finish = "", "", None
    for chunk in client.chat.completions.create(**kw, stream=True):
        delta = chunk.choices[0].delta
        assert not delta.content
        for tc in delta.tool_calls or []:
            assert tc.index == 0
            name += tc.function.name or ""
            arguments += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert (name, json.loads(arguments), finish) == (calls[0].function.name, args, "tool_calls")


def test_named_tool_choice_parallel_calls_and_tool_results(tool_server: Server) -> None:
    client = _client(tool_server)
    r = client.chat.completions.create(
        model="smollm2:135m", messages=ASK, tools=[WEATHER, TIME], temperature=0, max_tokens=200,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    calls = r.choices[0].message.tool_calls
    assert calls and all(c.function.name == "get_weather" for c in calls)
    assert all(isinstance(json.loads(c.function.arguments)["city"], str) for c in calls)
    assert len({c.id for c in calls}) == len(calls)
    # the call and its result go back through the template (role tool, tool_call_id)
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [calls[0].model_dump()]},
               {"role": "tool", "tool_call_id": calls[0].id, "content": "It is 21 C and sunny in Paris."}]
    r2 = client.chat.completions.create(model="smollm2:135m", messages=history, tools=[WEATHER], temperature=0,
                                        max_tokens=40, tool_choice="none")
    assert r2.choices[0].finish_reason in ("stop", "length") and r2.choices[0].message.content
    assert not r2.choices[0].message.tool_calls


def test_bad_tool_requests_are_400s(tool_server: Server) -> None:
    url = f"{tool_server.url}/v1/chat/completions"
    bad_schema = {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                             "properties": {"a": {"type": "nope"}}}}}
    for body, words in (({"tools": [bad_schema]}, "not a valid JSON Schema"),
                        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
                         "not among the tools"),
                        ({"tools": "get_weather"}, "must be a list"),
                        ({"tool_choice": "required"}, "tool_choice needs tools"),
                        ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "cannot be combined")):
        r = httpx.post(url, json={"model": "smollm2:135m", "messages": ASK, "max_tokens": 4, **body}, timeout=30)
        assert r.status_code == 400, body
        assert words in r.json()["error"]["message"]
    assert httpx.get(f"{tool_server.url}/health", timeout=5).status_code == 200


def test_responses_with_more_than_256_tools_of_any_type_is_a_400(tool_server: Server) -> None:
    """Hosted tools (which the server leaves out) count toward a request's 256 too: 257 of made-up types are a
    400 naming the limit, read no further."""
    body = {"model": "smollm2:135m", "input": "Hi", "max_output_tokens": 4,
            "tools": [{"type": f"made_up_{i}"} for i in range(257)]}
    r = httpx.post(f"{tool_server.url}/v1/responses", json=body, timeout=30)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "`tools` holds 257 tools; at most 256 in one request"
    assert "made_up" not in tool_server.log()
    assert httpx.get(f"{tool_server.url}/health", timeout=5).status_code == 200


def test_tool_calls_match_llama_server(tool_server: Server) -> None:
    """The requests of scripts/tools_reference.py, whose answers from llama-server --jinja (same vendored
    llama.cpp, same model, Qwen2.5's template, greedy) are stored in tests/data/llama_server_tools.json: the
    prompt we render is llama-server's, text for text, and the calls parsed from our answer are its calls
    (names and arguments). The script keeps only cases whose answers do not flip with prompt caching."""
    doc = json.loads((ROOT / "tests" / "data" / "llama_server_tools.json").read_text())
    assert doc["template"] == QWEN.name and len(doc["cases"]) >= 4
    assert any(len(c["tool_calls"]) > 1 for c in doc["cases"]) and any(not c["tool_calls"] for c in doc["cases"])
    client = _client(tool_server)
    for case in doc["cases"]:
        request = case["request"]
        assert render(request) == case["prompt"]
        r = client.chat.completions.create(model="smollm2:135m", **request, **doc["settings"])
        assert calls_of(r.choices[0].message) == case["tool_calls"], case["name"]
        assert r.choices[0].finish_reason == case["finish_reason"], case["name"]


def test_ollama_client_tool_calls(tool_server: Server) -> None:
    import ollama

    client = ollama.Client(host=tool_server.url)
    # auto, greedy: asked for a <tool_call> in so many words, with these tools, the model calls get_weather
    # (llama-server's "parallel calls" in tests/data/llama_server_tools.json); asked ASK, it answers in prose
    ask: list[dict[str, Any]] = [ASK_PARIS]
    r = client.chat(model="smollm2:135m", messages=ask, tools=[WEATHER, TIME, ADD],
                    options={"temperature": 0, "num_predict": 120})
    calls = r.message.tool_calls or []
    assert calls, f"no tool call: {r.message.content!r}"
    assert all(c.function.name == "get_weather" and isinstance(c.function.arguments["city"], str) for c in calls)
    # the call and its result go back through the template: the prompt is as long as the one OpenAI's route
    # renders for the same conversation (tests/data/llama_server_tools.json holds that route to llama-server's
    # prompts), and a longer result makes it longer by about the added words (not the answers: greedy text
    # at a near-tie can flip with the prefix a cache held). Sent as the client sends it (no `content` beside
    # the calls, the result's `tool_name`), but with the tools' schema keys in their order: the client
    # reorders them, and the schema's text is in the prompt.
    result = "It is 21 C and sunny in Paris."
    history = [*ASK, {"role": "assistant", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": result, "tool_name": "get_weather"}]

    def answer(messages: list[dict[str, Any]], n: int) -> dict[str, Any]:
        r = httpx.post(f"{tool_server.url}/api/chat", json={
            "model": "smollm2:135m", "messages": messages, "tools": [WEATHER], "stream": False,
            "options": {"temperature": 0, "num_predict": n}}, timeout=600)
        assert r.status_code == 200, r.text
        return dict(r.json())

    r2 = answer(history, 30)
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    same = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": result}]
    want = _client(tool_server).chat.completions.create(model="smollm2:135m", messages=same, tools=[WEATHER],
                                                        temperature=0, max_tokens=30)
    assert want.usage and r2["prompt_eval_count"] == want.usage.prompt_tokens
    assert r2["message"]["content"] or r2["message"].get("tool_calls")
    longer = answer([*history[:-1], {**history[-1], "content": result + " Tomorrow brings rain and wind."}], 1)
    assert longer["prompt_eval_count"] > r2["prompt_eval_count"] + 4, "the result's text is in the prompt"


def test_ollama_forced_call_through_raw_api(tool_server: Server) -> None:
    r = httpx.post(f"{tool_server.url}/api/chat", json={
        "model": "smollm2:135m", "messages": ASK, "tools": [WEATHER], "stream": False, "tool_choice": "required",
        "options": {"temperature": 0, "num_predict": 120}}, timeout=60)
    assert r.status_code == 200
    calls = r.json()["message"]["tool_calls"]
    assert calls and calls[0]["function"]["name"] == "get_weather"
    assert isinstance(calls[0]["function"]["arguments"]["city"], str)


@pytest.fixture(scope="module")
def reasoning_server(cli_env: dict[str, str]) -> Iterator[Server]:
    yield from _serving(cli_env, R1, "1")


def test_reasoning_never_leaks_into_content(reasoning_server: Server) -> None:
    """DeepSeek-R1's template opens <think> in the generation prompt; SmolLM2 never closes it, so the whole
    answer is reasoning: none of it may reach `content`, streamed or not, in either API."""
    client = _client(reasoning_server)
    kw: dict[str, Any] = {"model": "smollm2:135m", "messages": [{"role": "user", "content": "Why is the sky blue?"}],
                          "temperature": 0, "max_tokens": 24}
    whole = client.chat.completions.create(**kw).choices[0].message
    reasoning = whole.model_extra["reasoning_content"]
    assert reasoning and not whole.content
    streamed = {"content": "", "reasoning": ""}
    for chunk in client.chat.completions.create(**kw, stream=True):
        delta = chunk.choices[0].delta
        streamed["content"] += delta.content or ""
        streamed["reasoning"] += (delta.model_extra or {}).get("reasoning_content") or ""
    assert streamed == {"content": "", "reasoning": reasoning}
    raw = httpx.post(f"{reasoning_server.url}/v1/chat/completions", json={**kw, "reasoning_format": "none"},
                     timeout=60).json()["choices"][0]["message"]
    assert raw["content"] == reasoning and "reasoning_content" not in raw
    r = httpx.post(f"{reasoning_server.url}/api/chat", json={
        "model": "smollm2:135m", "messages": kw["messages"], "stream": False,
        "options": {"temperature": 0, "num_predict": 24}}, timeout=60).json()["message"]
    assert r["thinking"] == reasoning and r["content"] == ""
    g = httpx.post(f"{reasoning_server.url}/api/generate", json={
        "model": "smollm2:135m", "prompt": kw["messages"][0]["content"], "stream": False,
        "options": {"temperature": 0, "num_predict": 24}}, timeout=60).json()
    assert g["thinking"] == reasoning and g["response"] == "", "Ollama's /api/generate: the thinking apart"
    with httpx.stream("POST", f"{reasoning_server.url}/api/generate", json={
            "model": "smollm2:135m", "prompt": kw["messages"][0]["content"],
            "options": {"temperature": 0, "num_predict": 24}}, timeout=60) as lines:
        pieces = [json.loads(ln) for ln in lines.iter_lines() if ln]
    assert "".join(p.get("thinking", "") for p in pieces) == reasoning
    assert "".join(p["response"] for p in pieces) == ""


@pytest.mark.parametrize("api", ["openai", "anthropic", "responses", "ollama", "ollama-generate"])
def test_reasoning_format_none_reaches_every_api(reasoning_server: Server, api: str) -> None:
    """llama-server's `reasoning_format: "none"` leaves the thinking in the answer's text, in every API (the
    pipeline reads it once): R1's template opens <think>, so the whole answer is what would be reasoning."""
    client = _client(reasoning_server)
    ask = [{"role": "user", "content": "Why is the sky blue?"}]
    reasoning = client.chat.completions.create(model="smollm2:135m", messages=ask, temperature=0,
                                               max_tokens=24).choices[0].message.model_extra["reasoning_content"]
    base: dict[str, Any] = {"model": "smollm2:135m", "reasoning_format": "none", "temperature": 0, "stream": False}
    path, body, said = {
        "openai": ("/v1/chat/completions", {"messages": ask, "max_tokens": 24},
                   lambda d: (d["choices"][0]["message"]["content"],
                              d["choices"][0]["message"].get("reasoning_content"))),
        "anthropic": ("/v1/messages", {"messages": ask, "max_tokens": 24},
                      lambda d: ("".join(b.get("text", "") for b in d["content"]),
                                 [b["type"] for b in d["content"] if b["type"] != "text"] or None)),
        "responses": ("/v1/responses", {"input": ask[0]["content"], "max_output_tokens": 24},
                      lambda d: (d["output"][0]["content"][0]["text"],
                                 [o["type"] for o in d["output"] if o["type"] != "message"] or None)),
        "ollama": ("/api/chat", {"messages": ask, "options": {"num_predict": 24, "temperature": 0}},
                   lambda d: (d["message"]["content"], d["message"].get("thinking"))),
        "ollama-generate": ("/api/generate", {"prompt": ask[0]["content"],
                                              "options": {"num_predict": 24, "temperature": 0}},
                            lambda d: (d["response"], d.get("thinking"))),
    }[api]
    r = httpx.post(f"{reasoning_server.url}{path}", json={**base, **body}, timeout=120)
    assert r.status_code == 200, r.text
    assert said(r.json()) == (reasoning, None)


# ---- Anthropic's Messages API: tools and thinking ----------------------------------------------------------

def _anthropic_tool(spec: dict[str, Any]) -> dict[str, Any]:
    fn = spec["function"]
    return {"name": fn["name"], "description": fn.get("description", ""), "input_schema": fn["parameters"]}


def test_anthropic_client_tool_round_trip(tool_server: Server) -> None:
    """tool_choice any: a tool_use block (whole and streamed, the same call), stop_reason tool_use; the call and
    a tool_result go back, and the model answers in text."""
    import anthropic

    client = anthropic.Anthropic(base_url=tool_server.url, api_key="none")
    kw: dict[str, Any] = {"model": "smollm2:135m", "max_tokens": 120, "messages": ASK,
                          "tools": [_anthropic_tool(WEATHER), _anthropic_tool(TIME)],
                          "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
                          "extra_body": {"temperature": 0}}
    r = client.messages.create(**kw)
    assert r.stop_reason == "tool_use"
    uses = [b for b in r.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].id.startswith("toolu_") and uses[0].name in ("get_weather", "get_time")
    with client.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    streamed = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and [(b.name, b.input) for b in streamed] == [(uses[0].name, uses[0].input)]
    history = [*ASK, {"role": "assistant", "content": [u.model_dump() for u in uses]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                             "content": "It is 21 C and sunny in Paris."}]}]
    r2 = client.messages.create(**{**kw, "messages": history, "tool_choice": {"type": "none"}})
    assert r2.stop_reason in ("end_turn", "max_tokens") and r2.content[0].type == "text" and r2.content[0].text


def test_anthropic_thinking_blocks(reasoning_server: Server) -> None:
    """The model's reasoning is a thinking block (whole) and thinking_delta events (streamed), never text."""
    import anthropic

    client = _client(reasoning_server)
    kw: dict[str, Any] = {"model": "smollm2:135m", "messages": [{"role": "user", "content": "Why is the sky blue?"}],
                          "temperature": 0, "max_tokens": 24}
    reasoning = client.chat.completions.create(**kw).choices[0].message.model_extra["reasoning_content"]
    a = anthropic.Anthropic(base_url=reasoning_server.url, api_key="none")
    akw: dict[str, Any] = {"model": "smollm2:135m", "messages": kw["messages"], "max_tokens": 24,
                           "thinking": {"type": "adaptive"}, "extra_body": {"temperature": 0}}
    r = a.messages.create(**akw)
    assert [b.type for b in r.content] == ["thinking"] and r.content[0].thinking == reasoning
    kinds, thought = [], ""
    with a.messages.stream(**akw) as stream:
        for event in stream:
            if event.type == "content_block_delta":
                kinds.append(event.delta.type)
                thought += getattr(event.delta, "thinking", "") or ""
    assert thought == reasoning and set(kinds) <= {"thinking_delta", "signature_delta"}


# ---- OpenAI's Responses API: function calls and reasoning items --------------------------------------------

def _responses_tool(spec: dict[str, Any]) -> dict[str, Any]:
    fn = spec["function"]
    return {"type": "function", "name": fn["name"], "description": fn.get("description", ""),
            "parameters": fn["parameters"], "strict": False}


def test_responses_client_function_call_round_trip(tool_server: Server) -> None:
    """tool_choice required: a function_call item (whole and streamed, the call chat completions makes); its
    function_call_output goes back, after previous_response_id or with the call as items, and the model
    answers in text."""
    client = _client(tool_server)
    kw: dict[str, Any] = {"model": "smollm2:135m", "input": ASK[0]["content"], "temperature": 0,
                          "tools": [_responses_tool(WEATHER), _responses_tool(TIME)], "tool_choice": "required",
                          "parallel_tool_calls": False, "max_output_tokens": 120}
    want = client.chat.completions.create(model="smollm2:135m", messages=ASK, tools=[WEATHER, TIME], temperature=0,
                                          max_tokens=120, tool_choice="required", parallel_tool_calls=False)
    wanted = want.choices[0].message.tool_calls[0].function
    r = client.responses.create(**kw)
    calls = [o for o in r.output if o.type == "function_call"]
    assert r.status == "completed" and len(calls) == 1 and calls[0].id.startswith("fc_")
    assert (calls[0].name, json.loads(calls[0].arguments)) == (wanted.name, json.loads(wanted.arguments))
    events = list(client.responses.create(**kw, stream=True))
    streamed = [e.item for e in events if e.type == "response.output_item.done"]
    assert [(c.type, c.name, c.arguments) for c in streamed] == [("function_call", calls[0].name, calls[0].arguments)]
    assert events[-1].type == "response.completed"
    result = {"type": "function_call_output", "call_id": calls[0].call_id, "output": "It is 21 C and sunny in Paris."}
    after: dict[str, Any] = {**kw, "tool_choice": "none", "max_output_tokens": 40}
    r2 = client.responses.create(**{**after, "previous_response_id": r.id, "input": [result]})
    assert r2.status in ("completed", "incomplete") and r2.output[-1].type == "message" and r2.output_text
    items = [ASK[0], calls[0].model_dump(exclude_none=True), result]
    r3 = client.responses.create(**{**after, "input": items, "store": False})
    assert r3.usage is not None and r2.usage is not None and r3.usage.input_tokens == r2.usage.input_tokens


def test_responses_reasoning_items(reasoning_server: Server) -> None:
    """The model's reasoning is a reasoning item (whole) and response.reasoning_text events (streamed), never
    output_text."""
    client = _client(reasoning_server)
    kw: dict[str, Any] = {"model": "smollm2:135m", "messages": [{"role": "user", "content": "Why is the sky blue?"}],
                          "temperature": 0, "max_tokens": 24}
    reasoning = client.chat.completions.create(**kw).choices[0].message.model_extra["reasoning_content"]
    rkw: dict[str, Any] = {"model": "smollm2:135m", "input": "Why is the sky blue?", "temperature": 0,
                           "max_output_tokens": 24, "reasoning": {"effort": "high"}}
    r = client.responses.create(**rkw)
    assert [o.type for o in r.output] == ["reasoning"] and r.output[0].content[0].text == reasoning
    assert r.output_text == ""
    events = list(client.responses.create(**rkw, stream=True))
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert thought == reasoning and not any(e.type == "response.output_text.delta" for e in events)


def test_ollama_think_takes_a_level(reasoning_server: Server) -> None:
    """Ollama's think: true, false, or "low"/"medium"/"high" (each turns the thinking on); anything else is a 400."""
    url = f"{reasoning_server.url}/api/chat"
    body: dict[str, Any] = {"model": "smollm2:135m", "messages": [{"role": "user", "content": "Hi"}], "stream": False,
                            "options": {"num_predict": 2, "temperature": 0}}
    for think in (True, False, "low", "high"):
        assert httpx.post(url, json={**body, "think": think}, timeout=120).status_code == 200, think
    r = httpx.post(url, json={**body, "think": "sometimes"}, timeout=120)
    assert r.status_code == 400 and "think" in r.json()["error"]


def test_a_reasoning_budget_closes_the_thinking_in_serve(reasoning_server: Server) -> None:
    """R1's template opens <think>, which SmolLM2 never closes: with a budget the block is closed for it and an
    answer follows, in /v1 (reasoning_budget), Anthropic's API (llama-server's reasoning_budget beside thinking
    `adaptive`: budget_tokens is 1,024 at least there, as Anthropic's, which test_serve_fields.py holds) and Ollama's
    (a think level sets the budget, not tested for length here: 1,024 tokens)."""
    import anthropic

    client = _client(reasoning_server)
    kw: dict[str, Any] = {"model": "smollm2:135m", "messages": [{"role": "user", "content": "Why is the sky blue?"}],
                          "temperature": 0, "max_tokens": 24}
    free = client.chat.completions.create(**kw).choices[0].message
    bounded = client.chat.completions.create(**kw, extra_body={"reasoning_budget": 5}).choices[0].message
    assert not free.content and bounded.content
    assert len(bounded.model_extra["reasoning_content"]) < len(free.model_extra["reasoning_content"])
    a = anthropic.Anthropic(base_url=reasoning_server.url, api_key="none")
    r = a.messages.create(model="smollm2:135m", messages=kw["messages"], max_tokens=24,
                          thinking={"type": "adaptive"}, extra_body={"temperature": 0, "reasoning_budget": 5})
    kinds = [b.type for b in r.content]
    assert kinds == ["thinking", "text"] and r.content[0].thinking.strip() == \
        bounded.model_extra["reasoning_content"].strip() and r.content[1].text.strip() == bounded.content.strip()


def test_a_call_cut_by_max_tokens_ends_as_length_in_every_api(tool_server: Server) -> None:
    """OpenAI says `length` when the token budget ends the answer, a complete call before it or not (it said
    `tool_calls`); so Anthropic's max_tokens and the Responses API's incomplete. The cut call is not given."""
    import anthropic

    client = _client(tool_server)
    kw: dict[str, Any] = {"model": "smollm2:135m", "messages": ASK, "tools": [WEATHER, TIME], "temperature": 0,
                          "tool_choice": "required"}
    whole = client.chat.completions.create(**kw, max_tokens=200)
    calls = whole.choices[0].message.tool_calls or []
    assert len(calls) >= 2 and whole.choices[0].finish_reason == "tool_calls", whole
    assert whole.usage is not None
    budget = whole.usage.completion_tokens - 8  # inside the last call's arguments
    kept = [(c.function.name, c.function.arguments) for c in calls[:-1]]
    r = client.chat.completions.create(**kw, max_tokens=budget)
    assert r.choices[0].finish_reason == "length", r
    assert [(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls or []] == kept
    names, finish = [], None
    for chunk in client.chat.completions.create(**kw, max_tokens=budget, stream=True):
        names += [tc.function.name for tc in chunk.choices[0].delta.tool_calls or [] if tc.function.name]
        finish = chunk.choices[0].finish_reason or finish
    assert (names, finish) == ([name for name, _ in kept], "length")
    m = anthropic.Anthropic(base_url=tool_server.url, api_key="none").messages.create(
        model="smollm2:135m", max_tokens=budget, messages=ASK, tools=[_anthropic_tool(WEATHER), _anthropic_tool(TIME)],
        tool_choice={"type": "any"}, extra_body={"temperature": 0})
    assert m.stop_reason == "max_tokens" and len([b for b in m.content if b.type == "tool_use"]) < len(calls), m
    resp = client.responses.create(model="smollm2:135m", input=ASK, temperature=0, max_output_tokens=budget,
                                   tool_choice="required", tools=[{"type": "function", **t["function"]}
                                                                  for t in (WEATHER, TIME)])
    assert resp.status == "incomplete" and resp.incomplete_details is not None
    assert len([i for i in resp.output if i.type == "function_call"]) < len(calls), resp


def test_a_tool_result_for_a_call_never_made_is_a_400_in_every_api(tool_server: Server) -> None:
    """OpenAI's, Anthropic's and the Responses API answer a tool result whose id no call of the conversation has
    with a 400 (it was a 200, the result read as if some call had made it), naming the id and the field."""
    url = tool_server.url
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    r = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={"max_tokens": 1, "messages": [
        *ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_wrong", "content": "sunny"}]})
    assert r.status_code == 400, r.text
    assert "'call_wrong'" in r.json()["error"]["message"] and r.json()["error"]["param"] == "messages.[2].tool_call_id"
    r = httpx.post(f"{url}/v1/messages", timeout=60, json={"model": "smollm2:135m", "max_tokens": 1, "messages": [
        *ASK, {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                 "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_WRONG", "content": "sunny"}]}]})
    assert r.status_code == 400 and r.json()["type"] == "error", r.text
    assert "tool_use_id" in r.json()["error"]["message"] and "'toolu_WRONG'" in r.json()["error"]["message"]
    first = httpx.post(f"{url}/v1/responses", timeout=300, json={"input": "Hi", "max_output_tokens": 1})
    assert first.status_code == 200, first.text
    r = httpx.post(f"{url}/v1/responses", timeout=60, json={
        "previous_response_id": first.json()["id"], "max_output_tokens": 1,
        "input": [{"type": "function_call_output", "call_id": "call_wrong", "output": "sunny"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input", r.text
    assert "'call_wrong'" in r.json()["error"]["message"]
    # the same results with their calls' ids are answered
    r = httpx.post(f"{url}/v1/chat/completions", timeout=300, json={"max_tokens": 1, "messages": [
        *ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]})
    assert r.status_code == 200, r.text
    r = httpx.post(f"{url}/v1/chat/completions", timeout=300, json={"max_tokens": 1, "messages": [  # "": no id,
        *ASK, {"role": "assistant", "content": None, "tool_calls": [call]},  # left to the template (api.md)
        {"role": "tool", "tool_call_id": "", "content": "sunny"}]})
    assert r.status_code == 200, r.text
    r = httpx.post(f"{url}/v1/messages", timeout=300, json={"model": "smollm2:135m", "max_tokens": 1, "messages": [
        *ASK, {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                 "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_2", "name": "get_weather",
                                           "input": {"city": "Rome"}}]},  # a call of an earlier turn answered too
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2", "content": "rain"}]}]})
    assert r.status_code == 200, r.text


# ---- the requests coding agents send, as they send them (trimmed) ------------------------------------------

# Claude Code 2.1.197: a system prompt in blocks, a system message after the user's, and a tool whose schema
# bounds a string at 512 KiB (its Workflow tool's script)
CLAUDE_CODE = {"model": "smollm2:135m", "max_tokens": 8, "stream": False, "temperature": 0,
               "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.123;"},
                          {"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}}],
               "messages": [{"role": "user", "content": [{"type": "text", "text": "say hi",
                                                          "cache_control": {"type": "ephemeral"}}]},
                            {"role": "system", "content": "Available agent types for the Agent tool: none."}],
               "tools": [{"name": "Workflow", "description": "Run a workflow script.", "input_schema": {
                   "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
                   "properties": {"script": {"type": "string", "maxLength": 524288},
                                  "args": {"type": "array", "items": {"type": "string"}, "maxItems": 100000}},
                   "additionalProperties": False}}, _anthropic_tool(TIME)]}

# Codex 0.171.0: its function tools beside a namespace of tools and a web_search it turned off
CODEX = {"model": "smollm2:135m", "max_output_tokens": 8, "temperature": 0, "stream": False, "store": False,
         "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "say hi"}]},
                   # an output of a namespace's tool, with no call_id, that Codex adds after a turn's call
                   {"type": "function_call_output", "id": "fco_1", "name": "goal_objective", "namespace": "agent",
                    "output": "say hi"}],
         "tools": [{"type": "function", "name": "exec_command", "description": "Runs a command.", "strict": False,
                    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}},
                   {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.",
                    "tools": [{"type": "function", "name": "spawn_agent", "description": "Spawn one.",
                               "strict": False, "parameters": {"type": "object", "properties": {}}}]},
                   {"type": "web_search", "external_web_access": False}],
         "tool_choice": "auto", "parallel_tool_calls": False}


def test_the_agents_requests_as_they_send_them_are_answered(tool_server: Server) -> None:
    """Claude Code's system message among its messages was a 400 (each message needs a role), and its tool's
    maxLength 524,288 another (at most 4,096, no tool named); Codex's namespace and web_search tools were a 400
    on every turn. Now each is answered: the system message joins the system prompt, an upper bound past the
    grammar's limit is left out of the grammar, a tool the server cannot run is left out of what is offered, and
    so is a namespace's tool's output (Codex's second turn was a 400: it has no call_id); the tools' 64 KiB
    bound counts their schemas, not their descriptions (Claude Code's were refused)."""
    h = {"x-api-key": "none"}
    r = httpx.post(f"{tool_server.url}/v1/messages", headers=h, timeout=120, json=CLAUDE_CODE)
    assert r.status_code == 200, r.text
    assert r.json()["type"] == "message" and r.json()["stop_reason"] in ("end_turn", "max_tokens", "tool_use")
    n = httpx.post(f"{tool_server.url}/v1/messages/count_tokens", headers=h, timeout=60, json={
        k: v for k, v in CLAUDE_CODE.items() if k in ("model", "system", "messages", "tools")})
    assert n.status_code == 200 and n.json()["input_tokens"] > 0, n.text
    r = httpx.post(f"{tool_server.url}/v1/responses", timeout=120, json=CODEX)
    assert r.status_code == 200 and r.json()["status"] in ("completed", "incomplete"), r.text
    # tools whose descriptions are long (Claude Code's: 74,619 characters in all) are not held to the schemas'
    # 64 KiB: here the prompt is too long for this slot's window, in Anthropic's words, and no more
    wordy = {**CLAUDE_CODE, "tools": [{**t, "description": "Run it. " * 9000} for t in CLAUDE_CODE["tools"]]}
    r = httpx.post(f"{tool_server.url}/v1/messages", headers=h, timeout=120, json=wordy)
    assert r.status_code == 400 and "prompt is too long" in r.json()["error"]["message"], r.text
    # a lower bound past the limit would make the grammar itself huge: still a 400, naming the tool
    big = {**CLAUDE_CODE, "tools": [{"name": "Pad", "input_schema": {
        "type": "object", "properties": {"s": {"type": "string", "minLength": 100000}}}}]}
    r = httpx.post(f"{tool_server.url}/v1/messages", headers=h, timeout=60, json=big)
    assert r.status_code == 400 and "tools[0] (Pad)" in r.json()["error"]["message"], r.text
    assert "minLength is 100,000; at most 4,096" in r.json()["error"]["message"]


def test_a_property_named_as_a_keyword_loses_its_huge_maximum_too() -> None:
    """A maximum above 4,096 is left out of the grammar at every level, also inside a property called `const`,
    `enum`, `default` or `examples` (a name there, not a keyword, whose schema was passed over whole, and
    `char{0,10000000}` reached the grammar); a real `const` or `enum` keeps its value as it is."""
    from localgen.engine.grammar import loosen

    schema = {"type": "object", "properties": {
        "const": {"type": "string", "maxLength": 10_000_000},
        "enum": {"type": "array", "maxItems": 9_999, "items": {"type": "string", "maxLength": 5}},
        "mode": {"enum": [{"maxLength": 10_000_000}]}}}
    assert loosen(schema) == {"type": "object", "properties": {
        "const": {"type": "string"},
        "enum": {"type": "array", "items": {"type": "string", "maxLength": 5}},
        "mode": {"enum": [{"maxLength": 10_000_000}]}}}
