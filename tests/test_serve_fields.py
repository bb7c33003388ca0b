"""Every malformed field of a `serve` request is a 4xx in its route's API shape naming the field (docs/api.md's
"Every request"), never a 500, a value quietly read as another, or an answer the size of what was sent: one
table of (route, body, field) found by driving a real server with hostile values in every field, checked here
against the real app on SmolLM2 in this process (Starlette's TestClient over a real ModelWorker)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.workers import running_worker

MODEL = "smollm2:135m"
pytestmark = pytest.mark.slow  # a real ModelWorker on SmolLM2

BIG = "x" * 1_000_000


@pytest.fixture(scope="module")
def client(smollm2_path: Path) -> Iterator[Any]:
    from starlette.testclient import TestClient

    from localgen.serve.app import build
    from localgen.serve.guard import Policy
    from localgen.serve.state import ServeState

    with running_worker(smollm2_path, parallel=2) as worker, \
            TestClient(build(ServeState(workers={MODEL: worker}), Policy(check_host=False)),
                       raise_server_exceptions=False) as c:
        yield c


def _raw_chat(field: str, raw: str) -> str:
    """A chat request with `field` set to raw JSON text (NaN and Infinity, which Python's json reads)."""
    return (f'{{"model": "{MODEL}", "max_tokens": 1, "messages": [{{"role": "user", "content": "Hi"}}], '
            f'"{field}": {raw}}}')


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}], **fields}


def _chat_parts(*parts: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": list(parts)}]}


# (route, body, the param an OpenAI-shaped error names, or for Anthropic's and Ollama's shapes a word the
# message must hold)
CASES: list[tuple[str, dict[str, Any] | str, str]] = [
    # a text part's text that is not a string was read as Python's repr of it ("None", "[1]", "{'a': 1}")
    ("/v1/chat/completions", _chat_parts({"type": "text", "text": None}), "messages.[0].content"),
    ("/v1/chat/completions", _chat_parts({"type": "text", "text": 5}), "messages.[0].content"),
    ("/v1/chat/completions", _chat_parts({"type": "text", "text": [1]}), "messages.[0].content"),
    ("/v1/chat/completions", _chat_parts({"type": "text", "text": {"a": 1}}), "messages.[0].content"),
    ("/v1/chat/completions", _chat_parts({"type": "text"}), "messages.[0].content"),
    ("/api/chat", {"model": MODEL, "stream": False, "messages": [
        {"role": "user", "content": [{"type": "text", "text": True}]}]}, "text"),
    # /api/generate's system prompt that was not a string was dropped, the prompt answered without it
    ("/api/generate", {"model": MODEL, "prompt": "Hi", "stream": False, "system": 5}, "system"),
    ("/api/generate", {"model": MODEL, "prompt": "Hi", "stream": False, "system": ["be brief"]}, "system"),
    # /api/create wrote Python's text of a value into the preset (PARAMETER stop {'a': 1}, PARAMETER stop None),
    # and took parameters or messages of the wrong type ([] or "") as none
    ("/api/create", {"model": "fields-a", "from": MODEL, "stream": False, "parameters": {"stop": {"a": 1}}},
     "parameters.stop"),
    ("/api/create", {"model": "fields-b", "from": MODEL, "stream": False, "parameters": {"stop": None}},
     "parameters.stop"),
    ("/api/create", {"model": "fields-c", "from": MODEL, "stream": False, "parameters": {"stop": ["x", [1]]}},
     "parameters.stop"),
    ("/api/create", {"model": "fields-d", "from": MODEL, "stream": False, "parameters": []}, "parameters"),
    ("/api/create", {"model": "fields-e", "from": MODEL, "stream": False, "messages": ""}, "messages"),
    ("/api/create", {"model": "fields-f", "from": MODEL, "stream": False, "modelfile": 5}, "modelfile"),
    # /api/embed's dimensions went unchecked to the engine: a 500 (and a traceback in the log) for 1.5, "8", [8]
    ("/api/embed", {"model": MODEL, "input": ["a"], "dimensions": 1.5}, "dimensions"),
    ("/api/embed", {"model": MODEL, "input": ["a"], "dimensions": "8"}, "dimensions"),
    ("/api/embed", {"model": MODEL, "input": ["a"], "dimensions": [8]}, "dimensions"),
    ("/api/embed", {"model": MODEL, "input": ["a"], "dimensions": {"n": 8}}, "dimensions"),
    ("/api/embed", {"model": MODEL, "input": ["a"], "dimensions": 0}, "dimensions"),
    # the router's load and unload named no param for a model that is not a name
    ("/models/load", {"model": 5}, "model"),
    ("/models/unload", {"model": None}, "model"),
    # Anthropic's metadata.user_id was taken whatever it held
    ("/v1/messages", {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}],
                      "metadata": {"user_id": 5}}, "metadata.user_id"),
    ("/v1/messages", {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}],
                      "metadata": {"user_id": "u" * 257}}, "metadata.user_id"),
    # Ollama's content beside images that was not a string was dropped: the model answered an empty message
    ("/api/chat", {"model": MODEL, "stream": False, "options": {"num_predict": 1},
                   "messages": [{"role": "user", "content": 5, "images": []}]},
     "content"),
    ("/api/chat", {"model": MODEL, "stream": False, "options": {"num_predict": 1},
                   "messages": [{"role": "user", "content": {"a": 1}, "images": []}]}, "content"),
    # LM Studio's ttl as NaN or Infinity was taken: the model never unloaded, and /api/ps was a 500 from then on
    ("/v1/chat/completions", _raw_chat("ttl", "NaN"), "ttl"),
    ("/v1/chat/completions", _raw_chat("ttl", "Infinity"), "ttl"),
    ("/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 1, "ttl": "5m"}, "ttl"),
    # top_logprobs out of its 0-20, or not a number, was unread (a 200) unless logprobs was on
    ("/v1/chat/completions", _chat(top_logprobs="x"), "top_logprobs"),
    ("/v1/chat/completions", _chat(top_logprobs=2**64), "top_logprobs"),
    ("/v1/chat/completions", _chat(logprobs=False, top_logprobs=21), "top_logprobs"),
    # chat's metadata and user (OpenAI bounds them as the Responses API's) were taken whatever they held
    ("/v1/chat/completions", _chat(metadata=[1]), "metadata"),
    ("/v1/chat/completions", _chat(metadata={"a": 5}), "metadata"),
    ("/v1/chat/completions", _chat(metadata={f"k{i}": "v" for i in range(17)}), "metadata"),
    ("/v1/chat/completions", _chat(user=5), "user"),
    ("/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 1, "user": {"id": 1}}, "user"),
    # requests OpenAI refuses were taken: max_tokens 0 answered empty with "length"; top_logprobs without logprobs
    # was dropped; json_schema without its json_schema was any object; a user's null content was ""; a model that
    # is not a name was a 404 "not served"; a bias on a token past the vocabulary named no param
    ("/v1/chat/completions", _chat(max_tokens=0), "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 0}, "max_tokens"),  # api.md: as for chat
    ("/v1/chat/completions", {**_chat(), "max_tokens": None, "max_completion_tokens": 0}, "max_completion_tokens"),
    ("/v1/chat/completions", _chat(top_logprobs=2), "top_logprobs"),
    ("/v1/chat/completions", _chat(response_format={"type": "json_schema"}), "response_format.json_schema"),
    ("/v1/chat/completions", {**_chat(), "messages": [{"role": "user", "content": None}]}, "messages.[0].content"),
    ("/v1/chat/completions", {**_chat(), "model": 5}, "model"),
    ("/v1/chat/completions", _chat(logit_bias={"999999": 1}), "logit_bias"),
    # "²" is a digit to str.isdigit() that int() refuses: a 500
    ("/v1/chat/completions", _chat(logit_bias={"²": 1}), "logit_bias"),
    ("/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 1, "logit_bias": {" ①": 1}}, "logit_bias"),
    # Anthropic's rule: the thinking is part of max_tokens
    ("/v1/messages", {"model": MODEL, "max_tokens": 2048, "messages": [{"role": "user", "content": "Hi"}],
                      "thinking": {"type": "enabled", "budget_tokens": 2048}},
     "max_tokens must be greater than thinking.budget_tokens"),
    # Anthropic's least budget, 1,024, was 1 here
    ("/v1/messages", {"model": MODEL, "max_tokens": 4096, "messages": [{"role": "user", "content": "Hi"}],
                      "thinking": {"type": "enabled", "budget_tokens": 1023}},
     "thinking.budget_tokens must be an integer from 1,024"),
    # OpenAI's temperature is 0 to 2 (the knob's 5 was taken); OpenAI's paths into messages are `messages.[N].x`
    # (a tool message's id named no message: `messages.tool_call_id`)
    ("/v1/chat/completions", _chat(temperature=2.5), "temperature"),
    ("/v1/chat/completions", _chat(temperature=9), "temperature"),
    ("/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 1, "temperature": 3}, "temperature"),
    ("/v1/responses", {"model": MODEL, "input": "Hi", "max_output_tokens": 1, "temperature": 2.01}, "temperature"),
    ("/v1/chat/completions", {**_chat(), "messages": [{"role": "user", "content": "Hi"},
                                                      {"role": "tool", "content": "x", "tool_call_id": 5}]},
     "messages.[1].tool_call_id"),
    # an integer field takes no decimal, 1.0 either, as OpenAI's API answers it
    ("/v1/chat/completions", _chat(max_tokens=1.0), "max_tokens"),
    # n: true was read as n: 1 (Python's True == 1)
    ("/v1/chat/completions", _chat(n=True), "n"),
    ("/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 1, "n": True}, "n"),
]


@pytest.mark.parametrize(("route", "body", "param"), CASES,
                         ids=[f"{r}-{i}" for i, (r, _, _) in enumerate(CASES)])
def test_a_malformed_field_is_a_400_naming_it(client: Any, route: str, body: dict[str, Any] | str, param: str) -> None:
    r = (client.post(route, content=body, headers={"Content-Type": "application/json"}) if isinstance(body, str)
         else client.post(route, json=body))
    assert r.status_code == 400, r.text[:300]
    doc = r.json()
    assert len(r.content) < 2_000, "an error never echoes what was sent in full"
    if route.startswith("/api/"):
        assert isinstance(doc["error"], str) and param in doc["error"], doc
    elif route.startswith("/v1/messages"):
        assert doc["type"] == "error" and doc["error"]["type"] == "invalid_request_error", doc
        assert param in doc["error"]["message"], doc
    else:
        assert doc["error"]["param"] == param, doc


def test_openais_and_anthropics_clients_meet_their_apis_bounds(client: Any) -> None:
    """docs/api.md, as the real clients see it: OpenAI's temperature is 0 to 2 (past it a 400 naming it; 2 is
    answered), max_tokens an integer (1.0 a 400), a null content is `messages.[0].content`, and more than OpenAI's
    4 stop strings are taken, as llama-server takes them, the fifth stopping the answer too; Anthropic's
    thinking.budget_tokens is 1,024 at least (1 was taken), and becomes the request's reasoning budget."""
    import asyncio

    import anthropic
    import openai

    from localgen.serve.anthropic import MESSAGES

    oa = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=client, max_retries=0)
    hi: Any = [{"role": "user", "content": "Hi"}]
    for bad, param in (({"temperature": 2.5}, "temperature"), ({"temperature": 5}, "temperature"),
                       ({"max_tokens": 1.0}, "max_tokens"),
                       ({"messages": [{"role": "user", "content": None}]}, "messages.[0].content")):
        with pytest.raises(openai.BadRequestError) as e:
            oa.chat.completions.create(**{"model": MODEL, "messages": hi, "max_tokens": 1, **bad})
        assert e.value.param == param, (bad, e.value.body)
        assert e.value.type == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as e:
        oa.completions.create(model=MODEL, prompt="Hi", max_tokens=1, temperature=2.5)
    assert e.value.param == "temperature" and "within 0 to 2, not 2.5" in str(e.value.message)
    assert oa.chat.completions.create(model=MODEL, messages=hi, max_tokens=1, temperature=2).choices
    plain = str(oa.chat.completions.create(model=MODEL, messages=hi, max_tokens=8, temperature=0)
                .choices[0].message.content)
    fifth = plain[3:6]
    assert len(plain) > 6 and fifth.strip(), plain
    cut = oa.chat.completions.create(model=MODEL, messages=hi, max_tokens=8, temperature=0,
                                     stop=["zq1", "zq2", "zq3", "zq4", fifth])
    assert cut.choices[0].message.content == plain[:plain.index(fifth)]

    ac = anthropic.Anthropic(base_url="http://testserver", api_key="none", http_client=client, max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as a:
        ac.messages.count_tokens(model=MODEL, messages=hi, thinking={"type": "enabled", "budget_tokens": 1023})
    assert "thinking.budget_tokens must be an integer from 1,024" in a.value.message
    assert ac.messages.count_tokens(model=MODEL, messages=hi,
                                    thinking={"type": "enabled", "budget_tokens": 1024}).input_tokens > 0
    ask = asyncio.run(MESSAGES.parse({"model": MODEL, "max_tokens": 2048, "messages": hi,
                                      "thinking": {"type": "enabled", "budget_tokens": 1024}}))
    assert ask.values["reasoning_budget"] == 1024


def test_the_routers_unload_of_a_model_not_loaded_is_llama_servers_400(client: Any) -> None:
    """docs/api.md: llama-server's router answers an unload of a model not running with a 400 `model is not
    running` (it was a 200 `{"success": true}` here); a load brings it back."""
    first = client.post("/models/unload", json={"model": MODEL})
    assert (first.status_code, first.json()) == (200, {"success": True}), first.text
    again = client.post("/models/unload", json={"model": MODEL})
    assert again.status_code == 400, again.text
    assert again.json()["error"]["message"] == "model is not running" and again.json()["error"]["param"] == "model"
    load = client.post("/models/load", json={"model": MODEL})
    assert (load.status_code, load.json()) == (200, {"success": True}), load.text
    assert client.post("/models/unload", json={"model": MODEL}).status_code == 200
    assert client.post("/models/load", json={"model": MODEL}).status_code == 200


@pytest.mark.parametrize("ttl", [1e308, 2**64, 10**12])
def test_a_ttl_past_a_century_keeps_the_model_and_the_listings_answer(client: Any, ttl: float) -> None:
    """A ttl of a century or more is "never unload", as a keep_alive that long is: /api/ps, which says when the
    model unloads, was a 500 (a time past what a timestamp holds) for every client after such a request."""
    r = client.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 1, "ttl": ttl,
                                                  "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 200, r.text[:300]
    far = str(time.gmtime().tm_year + 5)  # "never" is shown ten years on
    deadline = time.monotonic() + 30  # the worker takes the request's ttl once the job ends, after the answer
    while True:
        ps = client.get("/api/ps")
        assert ps.status_code == 200, ps.text[:300]
        if ps.json()["models"][0]["expires_at"] > far or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(ps.json()["models"]) == 1 and ps.json()["models"][0]["expires_at"] > far
    r = client.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 1, "ttl": 600,
                                                  "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 200 and client.get("/api/ps").status_code == 200


LONG = "x" * 1_000_000


@pytest.mark.parametrize(("route", "body"), [
    ("/v1/chat/completions", _chat(model=LONG)),
    ("/v1/chat/completions", _chat_parts({"type": LONG})),
    ("/v1/messages", {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": LONG}]}]}),
    ("/v1/messages", {"model": LONG, "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]}),
    ("/v1/responses", {"model": MODEL, "input": [{"type": LONG}]}),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "options": {LONG: 1}}),
    ("/api/show", {"model": LONG}),
    ("/api/copy", {"source": MODEL, "destination": LONG}),
    ("/api/create", {"model": "fields-x", "from": MODEL, "quantize": LONG}),
    ("/api/create", {"model": "fields-x", "modelfile": LONG}),
    ("/models/load", {"model": LONG}),
], ids=lambda v: v if isinstance(v, str) else "")
def test_an_error_never_sends_back_the_megabytes_it_was_sent(client: Any, route: str, body: dict[str, Any]) -> None:
    """A value the error names (a model, a block's type, an option) is cut: a 1 MB name was echoed whole."""
    r = client.post(route, json=body)
    assert 400 <= r.status_code < 500, r.text[:300]
    assert len(r.content) < 5_000, f"{len(r.content):,} bytes of error"
    assert "x" * 50 + "…" in r.text, "the value is named, cut"


@pytest.mark.parametrize("top", [21, -1, 2.5, "3"])
def test_responses_top_logprobs_past_20_is_the_400_chat_completions_gives(client: Any, top: Any) -> None:
    """docs/api.md: the Responses API's top_logprobs is OpenAI's 0 to 20, as chat completions' (21 was a 200)."""
    chat = client.post("/v1/chat/completions", json=_chat(logprobs=True, top_logprobs=top))
    resp = client.post("/v1/responses", json={"model": MODEL, "input": "Hi", "max_output_tokens": 1,
                                              "top_logprobs": top})
    assert resp.status_code == chat.status_code == 400, resp.text
    assert resp.json()["error"]["message"] == chat.json()["error"]["message"] == \
        "top_logprobs must be an integer from 0 to 20"
    assert resp.json()["error"]["param"] == "top_logprobs"
    for fine in (0, 20, None):
        r = client.post("/v1/responses", json={"model": MODEL, "input": "Hi", "max_output_tokens": 1, "store": False,
                                               "top_logprobs": fine})
        assert r.status_code == 200, r.text


def test_an_empty_stop_string_is_dropped_as_llama_server_drops_it_and_anthropic_refuses_it(client: Any) -> None:
    """docs/api.md: OpenAI's and Ollama's `stop` drop an empty string (as llama-server does: the answer is the one
    without it, never cut before it starts), Anthropic's stop_sequences refuse it (as Anthropic does)."""
    def chat(**stop: Any) -> str:
        r = client.post("/v1/chat/completions", json=_chat(max_tokens=4, temperature=0, **stop))
        assert r.status_code == 200, r.text
        return str(r.json()["choices"][0]["message"]["content"])

    def responses(**stop: Any) -> str:
        r = client.post("/v1/responses", json={"model": MODEL, "input": "Hi", "max_output_tokens": 4,
                                               "temperature": 0, "store": False, **stop})
        assert r.status_code == 200, r.text
        return str(r.json()["output"][-1]["content"][0]["text"])

    def ollama(**stop: Any) -> str:
        r = client.post("/api/chat", json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                                           "stream": False, "options": {"num_predict": 4, "temperature": 0, **stop}})
        assert r.status_code == 200, r.text
        return str(r.json()["message"]["content"])

    for answer in (chat, responses, ollama):
        plain = answer()
        assert plain and answer(stop="") == answer(stop=[""]) == plain, answer
    r = client.post("/v1/messages", json={"model": MODEL, "max_tokens": 4, "stop_sequences": [""],
                                          "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 400 and "empty string" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize(("api", "body", "knob", "value"), [
    ("openai", {"max_tokens": 3, "max_completion_tokens": None}, "max_tokens", 3),
    ("openai", {"max_completion_tokens": None, "n_predict": None, "max_tokens": 3}, "max_tokens", 3),
    ("responses", {"max_output_tokens": 2, "max_tokens": None}, "max_tokens", 2),
    ("anthropic", {"stop_sequences": ["How"], "stop": None}, "stop", ["How"]),
    ("openai", {"temperature": None}, "temperature", None),
])
def test_a_null_spelling_never_wipes_another_s_value(api: str, body: dict[str, Any], knob: str, value: Any) -> None:
    """A field sent as null is "not given", as OpenAI reads it: `"max_tokens": 3, "max_completion_tokens": null`
    answered 9 tokens (the null, read after, wiped the 3)."""
    from localgen.serve.ask import sampling_values

    assert sampling_values(body, api).get(knob) == value
