"""A final assistant message is continued on every chat route (docs/api.md): the prompt is the conversation up
to that message's text, without the end of turn, and the answer is the continuation alone. Through the real
routes with SmolLM2 (its own template) and Gemma 3 270M (Gemma 3's template), each answer compared with a raw
completion of the prompt text written out by hand; the templates' own handling (Qwen3's thinking block,
DeepSeek-R1's, one that rewrites the text) and the answer stage's, in process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from localgen.engine.template import ChatTemplate
from localgen.tools.stream import Piece, answer_stream
from tests.test_serve import Server
from tests.test_tools import QWEN, R1, TEMPLATES

SYSTEM = "Answer in JSON."
QUESTION = "Give me a fictional person as JSON with name and age."
PREFILL = '{"name": "'
# a system prompt long enough that a slot reuses part of it (a piece of 64+ rows is evaluated again)
LONG = SYSTEM + " Each person has a name and an age in years, and nothing else: no address, no job." * 8


def prompt_text(model: str, system: str = SYSTEM) -> str:
    """Each model's prompt for [system, user, assistant PREFILL], as its template writes it (Gemma's BOS is
    added by the tokenizer to a raw prompt, as the template writes it to a chat's)."""
    if model == "gemma3:270m":
        return f"<start_of_turn>user\n{system}\n\n{QUESTION}<end_of_turn>\n<start_of_turn>model\n{PREFILL}"
    return (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{QUESTION}<|im_end|>\n"
            f"<|im_start|>assistant\n{PREFILL}")


# Gemma 3's chat template (text parts of it): the model's GGUF has none
GEMMA3 = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""
MODELS = ("smollm2:135m", "gemma3:270m")
ROUTES = ("/v1/chat/completions", "/v1/messages", "/api/chat", "/v1/responses")
N = 12
QWEN3 = TEMPLATES / "Qwen-Qwen3-0.6B.jinja"


@pytest.fixture(scope="module")
def server(cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Gemma 3 270M with Gemma 3's template; SmolLM2, loaded when first named, with its own."""
    template = tmp_path_factory.mktemp("gemma") / "gemma3.jinja"
    template.write_text(GEMMA3)
    s = Server(cli_env, "-m", "gemma3:270m", "--chat-template-file", str(template), "-np", "2", "--ctx", "1024")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def raw(server: Server) -> dict[tuple[str, ...], dict[str, Any]]:
    """Raw completions of prompt_text's (by model, system prompt and stop strings), made once."""
    return {}


def _raw(server: Server, done: dict[tuple[str, ...], dict[str, Any]], model: str, system: str = SYSTEM,
         stop: tuple[str, ...] = ()) -> dict[str, Any]:
    if (model, system, *stop) not in done:
        r = httpx.post(f"{server.url}/v1/completions", json={"model": model, "prompt": prompt_text(model, system),
                       "max_tokens": N, "temperature": 0, **({"stop": list(stop)} if stop else {})}, timeout=300)
        assert r.status_code == 200, r.text
        choice, usage = r.json()["choices"][0], r.json()["usage"]
        done[(model, system, *stop)] = {"text": choice["text"], "finish": choice["finish_reason"],
                               "prompt_tokens": usage["prompt_tokens"]}
    return done[(model, system, *stop)]


def _conversation(route: str, prefill: str, system: str = SYSTEM) -> dict[str, Any]:
    """The request body of each route for [system, user, assistant `prefill`], greedy, N tokens."""
    said = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": prefill}]
    if route == "/v1/messages":
        return {"system": system, "messages": said, "max_tokens": N, "temperature": 0}
    if route == "/api/chat":
        return {"messages": [{"role": "system", "content": system}, *said], "stream": False,
                "options": {"num_predict": N, "temperature": 0}}
    if route == "/v1/responses":
        return {"instructions": system, "input": said, "max_output_tokens": N, "temperature": 0, "store": False}
    return {"messages": [{"role": "system", "content": system}, *said], "max_tokens": N, "temperature": 0}


def _answer(route: str, doc: dict[str, Any]) -> tuple[str, int]:
    """The answer's text and its prompt tokens, from each route's answer."""
    if route == "/v1/messages":
        return "".join(b["text"] for b in doc["content"] if b["type"] == "text"), doc["usage"]["input_tokens"]
    if route == "/api/chat":
        return doc["message"]["content"], doc["prompt_eval_count"]
    if route == "/v1/responses":
        text = "".join(p["text"] for item in doc["output"] if item["type"] == "message" for p in item["content"])
        return text, doc["usage"]["input_tokens"]
    return doc["choices"][0]["message"]["content"], doc["usage"]["prompt_tokens"]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("model", MODELS)
def test_each_chat_route_continues_a_final_assistant_message(server: Server, raw: Any, model: str,
                                                             route: str) -> None:
    want = _raw(server, raw, model)
    r = httpx.post(f"{server.url}{route}", json={"model": model, **_conversation(route, PREFILL)}, timeout=300)
    assert r.status_code == 200, r.text
    text, prompt_tokens = _answer(route, r.json())
    # the continuation alone (the model goes on inside the JSON string), as a raw completion of the same text
    assert text == want["text"], (model, route)
    assert prompt_tokens == want["prompt_tokens"]
    assert not text.startswith(PREFILL)


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/messages"])
def test_a_continued_answer_streams_the_continuation(server: Server, raw: Any, route: str) -> None:
    want = _raw(server, raw, "smollm2:135m")
    body = {"model": "smollm2:135m", **_conversation(route, PREFILL), "stream": True}
    text = ""
    with httpx.stream("POST", f"{server.url}{route}", json=body, timeout=300) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if route == "/v1/messages":
                text += event.get("delta", {}).get("text", "") if event["type"] == "content_block_delta" else ""
            elif event.get("choices"):
                text += event["choices"][0]["delta"].get("content") or ""
    assert text == want["text"]


def test_stop_strings_and_the_prompt_cache_see_the_continuation(server: Server, raw: Any) -> None:
    """A stop string ends the continuation (the name's closing quote); the same request again reuses the
    slot's prompt."""
    want = _raw(server, raw, "smollm2:135m", LONG, ('"',))
    assert want["finish"] == "stop" and '"' not in want["text"] and want["text"]
    body = {"model": "smollm2:135m", **_conversation("/v1/chat/completions", PREFILL, LONG), "stop": ['"']}
    docs = [httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300).json() for _ in range(2)]
    for doc in docs:
        assert doc["choices"][0]["message"]["content"] == want["text"]
        assert doc["choices"][0]["finish_reason"] == "stop"
        assert doc["usage"]["prompt_tokens"] == want["prompt_tokens"]
    assert docs[1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_an_empty_final_assistant_message_starts_the_answer(server: Server) -> None:
    """Anthropic's "optional final assistant message", empty: the answer is the one without it (its turn is
    the answer's, not an empty turn closed before it)."""
    body = _conversation("/v1/messages", "")
    without = {**body, "messages": body["messages"][:-1]}
    docs = [httpx.post(f"{server.url}/v1/messages", json={"model": "gemma3:270m", **b}, timeout=300).json()
            for b in (body, without)]
    assert docs[0]["content"] == docs[1]["content"]
    assert docs[0]["usage"]["input_tokens"] == docs[1]["usage"]["input_tokens"]


def test_continue_final_is_the_renderers_own(server: Server) -> None:
    body = {"model": "smollm2:135m", **_conversation("/v1/chat/completions", PREFILL),
            "chat_template_kwargs": {"continue_final": False}}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "chat_template_kwargs.continue_final"


def test_anthropic_refuses_a_prefill_ending_in_whitespace(server: Server) -> None:
    for prefill in ("Sure, ", "\n", [{"type": "text", "text": "Sure"}, {"type": "text", "text": " "}]):
        body = {"model": "gemma3:270m", **_conversation("/v1/messages", "")}
        body["messages"][-1]["content"] = prefill
        r = httpx.post(f"{server.url}/v1/messages", json=body, timeout=60)
        assert r.status_code == 400, prefill
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["message"] == "messages: final assistant content cannot end with trailing whitespace"


def test_a_stored_continued_response_is_one_message_to_follow_up(server: Server) -> None:
    """The Responses API keeps the prefill and its continuation as one assistant message: a follow-up renders
    through Gemma's template, which refuses two assistant turns in a row."""
    first = {"model": "gemma3:270m", **_conversation("/v1/responses", PREFILL), "store": True}
    r = httpx.post(f"{server.url}/v1/responses", json=first, timeout=300)
    assert r.status_code == 200, r.text
    answer = _answer("/v1/responses", r.json())[0]
    follow = {"model": "gemma3:270m", "previous_response_id": r.json()["id"], "input": "Another one.",
              "max_output_tokens": 4, "temperature": 0}
    again = httpx.post(f"{server.url}/v1/responses", json=follow, timeout=300)
    assert again.status_code == 200, again.text
    # what it went on from: the question, then the answer the prefill began, as one assistant turn
    count = httpx.post(f"{server.url}/v1/messages/count_tokens", json={"model": "gemma3:270m", "messages": [
        {"role": "user", "content": QUESTION}, {"role": "assistant", "content": PREFILL + answer},
        {"role": "user", "content": "Another one."}]}, timeout=60)
    assert again.json()["usage"]["input_tokens"] == count.json()["input_tokens"]
    # its input items are the input as sent: the question and the prefill, apart (docs/api.md)
    items = httpx.get(f"{server.url}/v1/responses/{r.json()['id']}/input_items", params={"order": "asc"},
                      timeout=60).json()["data"]
    assert [(i["role"], i["content"][0]["text"]) for i in items] == [("user", QUESTION), ("assistant", PREFILL)]


# ---- the templates' side, in process ------------------------------------------------------------------------

def _render(source: str, last: dict[str, Any], **extra: Any) -> str:
    messages = [{"role": "user", "content": "Hi"}, last]
    return ChatTemplate(source, "", "").render(messages, continue_final=True, **extra)


def test_qwen3s_thinking_block_stays_before_the_continued_text() -> None:
    """Qwen3 writes a closed thinking block before a final answer's text: the prompt keeps it, the text
    follows it unclosed, thinking on or off."""
    for thinking in (True, False):
        prompt = _render(QWEN3.read_text(), {"role": "assistant", "content": PREFILL}, enable_thinking=thinking)
        assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n" + PREFILL), prompt[-80:]
    # its reasoning given apart (the template moves it into the block), the text still last
    prompt = _render(QWEN3.read_text(), {"role": "assistant", "content": "<think>\nhm\n</think>\n\nSure"})
    assert prompt.endswith("<think>\nhm\n</think>\n\nSure")


def test_a_continued_r1_answer_is_content_not_thinking() -> None:
    """DeepSeek-R1's generation prompt opens a thinking block, and its assistant turns have none: the
    continued text follows the turn's header, and the answer stage reads the continuation as content."""
    source = R1.read_text()
    prompt = _render(source, {"role": "assistant", "content": PREFILL})
    assert prompt.endswith("<｜Assistant｜>" + PREFILL)
    assert not prompt.endswith("<think>\n" + PREFILL)
    fresh = answer_stream(None, source)
    assert fresh.feed("Bob") == [Piece("reasoning", "Bob")]  # without a prefill: inside the block it opened
    stage = answer_stream(None, source, prefill=PREFILL)
    assert stage.feed('Bob", "age": 30}') + stage.finish() == [Piece("content", 'Bob", "age": 30}')]
    # a prefill that opens a thinking block of its own: the continuation thinks until it closes
    stage = answer_stream(None, source, prefill="<think>\nFirst")
    said = stage.feed(" I check.</think>\n\nYes") + stage.finish()
    assert said == [Piece("reasoning", " I check."), Piece("content", "Yes")]


def test_a_template_that_rewrites_the_text_gets_it_after_the_generation_prompt() -> None:
    """Where the template does not write the text as given (here in capitals), llama-server's way: the rest of
    the conversation with the generation prompt, then the text."""
    upper = ("{% for m in messages %}<{{ m.role }}>{{ m.content | upper }}</{{ m.role }}>{% endfor %}"
             "{% if add_generation_prompt %}<assistant>{% endif %}")
    assert _render(upper, {"role": "assistant", "content": "Well"}) == "<user>HI</user><assistant>Well"


def test_only_a_final_assistant_text_is_continued() -> None:
    """A final message with tool calls is a closed turn, and so is any final assistant message where the
    request does not continue it (`chat`'s counts, a Responses round after its own messages)."""
    source = QWEN.read_text()
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}]}
    closed = ChatTemplate(source, "", "").render([{"role": "user", "content": "Hi"}, call])
    assert _render(source, call) == closed and closed.endswith("<|im_start|>assistant\n")
    text = {"role": "assistant", "content": "Well"}
    plain = ChatTemplate(source, "", "").render([{"role": "user", "content": "Hi"}, text])
    assert plain.endswith("Well<|im_end|>\n<|im_start|>assistant\n")
    assert _render(source, text).endswith("Well")
