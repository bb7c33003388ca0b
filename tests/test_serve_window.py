"""`localgen serve` at a small window (`--ctx 256`, one slot), driven by the real `ollama` and `anthropic`
clients and raw HTTP: what each API does where a prompt or an answer meets the window (docs/api.md): Ollama's
routes fit the prompt to it as Ollama does, Anthropic's says the window ended the answer, and a refusal names
the field the client sent."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.test_serve import Server

MODEL = "smollm2:135m"
WINDOW = 256
GREEDY = {"temperature": 0, "num_predict": 8}


@pytest.fixture(scope="module")
def server(cli_env: dict[str, str]) -> Iterator[Server]:
    s = Server(cli_env, "--ctx", str(WINDOW), "--parallel", "1")
    yield s
    assert s.stop() == 0


def _conversation(last: str = "Hi!") -> list[dict[str, str]]:
    """A system message, 20 old exchanges (some 700 tokens in all) and a short last message."""
    msgs = [{"role": "system", "content": "You are a terse assistant."}]
    for i in range(20):
        msgs += [{"role": "user", "content": f"Tell me fact number {i} about the sea, please."},
                 {"role": "assistant", "content": f"Fact {i}: the sea is big and salty and full of fish number {i}."}]
    return [*msgs, {"role": "user", "content": last}]


def _truncations(server: Server) -> list[str]:
    return [ln for ln in server.log().splitlines() if "truncating input prompt" in ln]


def test_ollama_chat_leaves_out_the_oldest_messages_as_ollama_does(server: Server) -> None:
    import ollama

    client = ollama.Client(host=server.url)
    msgs = _conversation()
    before = len(_truncations(server))
    r = client.chat(model=MODEL, messages=msgs, options=GREEDY)
    assert r.done and 0 < r.prompt_eval_count < WINDOW and r.eval_count > 0, r
    lines = _truncations(server)[before:]
    assert len(lines) == 1, lines  # one line per request, in Ollama's words
    said = re.fullmatch(rf"localgen serve: {MODEL}: truncating input prompt: limit={WINDOW} prompt=(\d+) "
                        r"new=(\d+) \((\d+) oldest messages left out\)", lines[0])
    assert said is not None, lines[0]
    prompt, new, dropped = map(int, said.groups())
    assert prompt > WINDOW and new == r.prompt_eval_count and dropped % 2 == 0, lines[0]
    # the system message and the latest ones kept, the fewest left out: one more message does not fit
    kept = [msgs[0], *msgs[1 + dropped:]]
    alone = client.chat(model=MODEL, messages=kept, options=GREEDY)
    assert (alone.message.content, alone.prompt_eval_count) == (r.message.content, r.prompt_eval_count)
    more = httpx.post(f"{server.url}/api/chat", timeout=300, json={
        "model": MODEL, "messages": [msgs[0], *msgs[dropped:]], "stream": False, "truncate": False,
        "options": GREEDY})
    assert more.status_code == 400 and "each slot's context window is 256" in more.json()["error"], more.text
    streamed = list(client.chat(model=MODEL, messages=msgs, options=GREEDY, stream=True))
    assert "".join(p.message.content for p in streamed) == r.message.content
    assert streamed[-1].prompt_eval_count == r.prompt_eval_count
    refused = httpx.post(f"{server.url}/api/chat", timeout=300, json={
        "model": MODEL, "messages": msgs, "stream": False, "truncate": False, "options": GREEDY})
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"] == f"the prompt is {prompt} tokens; each slot's context window is 256"
    assert server.health()["alive"]


def test_ollama_cuts_a_prompt_the_window_cannot_hold_keeping_its_start_and_end(server: Server) -> None:
    import ollama

    client = ollama.Client(host=server.url)
    before = len(_truncations(server))
    long_last = _conversation("Say hi. " + "Many words here, " * 150)  # the latest message alone is too long
    r = client.chat(model=MODEL, messages=long_last, options=GREEDY)
    assert r.done and r.prompt_eval_count == WINDOW - 1, r  # a token of room for the answer
    g = client.generate(model=MODEL, prompt="Many words here, " * 150 + "Say hi.", options=GREEDY)
    assert g.done and g.prompt_eval_count == WINDOW - 1, g
    raw = client.generate(model=MODEL, prompt="Many words here, " * 150, raw=True, options={**GREEDY, "num_keep": 0})
    assert raw.done and raw.prompt_eval_count == WINDOW - 1, raw
    lines = _truncations(server)[before:]
    assert len(lines) == 3, lines
    assert re.search(rf"limit={WINDOW} prompt=\d+ keep=4 new={WINDOW - 1} \(40 oldest messages left out\)$",
                     lines[0]), lines[0]
    assert re.search(rf"limit={WINDOW} prompt=\d+ keep=4 new={WINDOW - 1}$", lines[1]), lines[1]
    assert re.search(rf"keep=0 new={WINDOW - 1}$", lines[2]), lines[2]
    bad: dict[str, Any] = {"model": MODEL, "prompt": "Hi", "stream": False, "options": {"num_keep": "4"}}
    r2 = httpx.post(f"{server.url}/api/generate", json=bad, timeout=60)
    assert r2.status_code == 400 and "options.num_keep" in r2.json()["error"], r2.text
    r3 = httpx.post(f"{server.url}/api/generate", json={**bad, "options": {}, "truncate": "no"}, timeout=60)
    assert r3.status_code == 400 and "truncate" in r3.json()["error"], r3.text


def test_anthropic_says_the_window_not_max_tokens_ended_the_answer(server: Server) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=server.url, api_key="x")
    words = "sea " * 200  # some 210 tokens with the template
    ask: dict[str, Any] = {"model": MODEL, "max_tokens": 1000, "extra_body": {"ignore_eos": True},
                           "messages": [{"role": "user", "content": f"Repeat these: {words}"}]}
    m = client.messages.create(**ask)
    assert m.stop_reason == "model_context_window_exceeded", m.stop_reason  # a StopReason the SDK knows
    assert 0 < m.usage.output_tokens < 1000 and m.usage.input_tokens + m.usage.output_tokens == WINDOW, m.usage
    with client.messages.stream(**ask) as s:
        final = s.get_final_message()
    assert final.stop_reason == "model_context_window_exceeded" and final.usage.output_tokens == m.usage.output_tokens
    short = client.messages.create(**{**ask, "max_tokens": 8})
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 8, "max_tokens ended it"


@pytest.mark.parametrize(("path", "field"), [("/v1/chat/completions", "messages"), ("/v1/responses", "input"),
                                             ("/v1/completions", "prompt")])
def test_a_prompt_past_the_window_names_the_field_the_client_sent(server: Server, path: str, field: str) -> None:
    """Chat Completions has no `prompt` field: a prompt past the window names `messages` there, `input` in the
    Responses API and `prompt` for a completion, whether counted by its tokens or refused by its characters."""
    for text, said in (("the cat sat on the mat " * 120, " tokens; each slot's context window is 256"),
                       ("x" * 9000, "the prompt is 9,000 characters; a slot's window of 256 tokens takes at most "
                                    "8,192 here")):
        body: dict[str, Any] = {"model": MODEL, "max_tokens": 4}
        body[field] = [{"role": "user", "content": text}] if field == "messages" else text
        r = httpx.post(f"{server.url}{path}", json=body, timeout=120)
        error = r.json()["error"]
        assert r.status_code == 400 and (error["param"], error["code"]) == (field, "context_length_exceeded"), r.text
        assert said in error["message"], r.text


def test_a_cut_keeps_num_keep_tokens_a_bos_besides_and_the_end_that_fits() -> None:
    """As Ollama's runner cuts a prompt (docs/api.md): its first num_keep tokens (one more where it begins with the
    BOS; -1: all that leave one token of its end), then its end, `limit` tokens in all."""
    from localgen.native.prompt import Prompt
    from localgen.serve.prepare import cut

    tokens = Prompt.text(list(range(10)))
    assert cut(tokens, 2, 6, bos=-1).tokens == [0, 1, 6, 7, 8, 9]
    assert cut(tokens, 2, 6, bos=0).tokens == [0, 1, 2, 7, 8, 9]  # the BOS kept besides
    assert cut(tokens, 0, 6, bos=-1).tokens == [4, 5, 6, 7, 8, 9]
    assert cut(tokens, -1, 6, bos=-1).tokens == [0, 1, 2, 3, 4, 9]
    assert cut(tokens, 100, 6, bos=-1).tokens == [0, 1, 2, 3, 4, 9]


def test_ollama_s_num_predict_minus_2_fills_the_window(server: Server) -> None:
    """Ollama's `num_predict: -2` ("fill the context") was a 400 (localgen's range starts at -1): it is -1 here,
    until the model stops or the window is full."""
    import ollama

    client = ollama.Client(host=server.url)
    r = client.generate(model=MODEL, prompt="Count to a thousand.",
                        options={"num_predict": -2, "temperature": 0, "ignore_eos": True})
    assert r.done_reason == "length" and (r.prompt_eval_count or 0) + (r.eval_count or 0) == WINDOW, r

