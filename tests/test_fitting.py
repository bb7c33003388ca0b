"""The Responses API's truncation "auto" (docs/api.md; serve/fitting.py): a thread past a slot's window has its
oldest turns folded into a summary the model writes, the turn being answered kept word for word, and goes on
from the fitted conversation; without it the same request is the 400 agents read to compact."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localgen import compact
from localgen.serve import fitting
from tests.test_serve import Server

PARA = ("The river town of Alder keeps its bells in a stone tower by the mill, and every spring the miller paints "
        "the doors blue. ") * 9  # about 250 tokens: two turns of it pass a window of 512


@pytest.fixture(scope="module")
def server(cli_env: dict[str, str]) -> Iterator[Server]:
    s = Server(cli_env, "--ctx", "512", "-np", "1", "--log-format", "json")
    yield s
    assert s.stop() == 0


def test_a_thread_past_the_window_is_folded_and_goes_on(server: Server) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")
    first = client.responses.create(model="smollm2:135m", input=PARA + "What colour are the doors?",
                                    max_output_tokens=16, temperature=0, instructions="Answer briefly.")
    ask = {"model": "smollm2:135m", "input": PARA + "Where are the bells?", "previous_response_id": first.id,
           "max_output_tokens": 16, "temperature": 0}
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(**ask)  # type: ignore[call-overload]
    assert e.value.code == "context_length_exceeded"
    fitted = client.responses.create(**ask, truncation="auto")  # type: ignore[call-overload]
    assert fitted.truncation == "auto" and fitted.usage is not None
    assert fitted.usage.input_tokens + 16 <= 512 and fitted.output_text
    # its own input is kept word for word, and listed as its input
    items = client.responses.input_items.list(fitted.id).data
    assert [(i.role, i.content[0].text) for i in items] == [("user", PARA + "Where are the bells?")]  # type: ignore[union-attr]
    lines = [json.loads(line) for line in (server.proc.stderr.read().decode() if server.proc.stderr else "")
             .splitlines() if line.startswith("{")]
    said = [line for line in lines if line.get("event") == "fitted"]
    assert len(said) == 1 and said[0]["folded"] >= 1 and said[0]["model"] == "smollm2:135m", said
    # a follow-up goes on from the fitted conversation (with its summary), folding nothing again
    more = client.responses.create(model="smollm2:135m", input="And the doors?", previous_response_id=fitted.id,
                                   max_output_tokens=8, temperature=0, truncation="auto")
    assert more.usage is not None and more.usage.input_tokens + 8 <= 512
    later = server.proc.stderr.read().decode() if server.proc.stderr else ""
    assert '"event": "fitted"' not in later and '"event":"fitted"' not in later


def test_a_long_input_of_its_own_is_folded_and_its_items_are_what_was_sent(server: Server) -> None:
    """No previous response: the request's own earlier turns are folded; its input items list what it sent, the
    folded turns too (as OpenAI's do), never the summary the server wrote."""
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")
    sent = [{"role": "user", "content": PARA}, {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": PARA + "Where are the bells?"}]
    fitted = client.responses.create(model="smollm2:135m", input=sent, max_output_tokens=8,  # type: ignore[arg-type]
                                     temperature=0, truncation="auto")
    assert fitted.usage is not None and fitted.usage.input_tokens + 8 <= 512
    items = client.responses.input_items.list(fitted.id, order="asc").data
    listed = [(i.role, i.content[0].text) for i in items]  # type: ignore[union-attr]
    assert listed == [(m["role"], m["content"]) for m in sent]


def test_a_summary_heading_with_a_unicode_digit_is_folded_not_a_500(server: Server) -> None:
    """A client's system message in a summary's form whose count is "²" (a digit int() refuses) was a 500."""
    import httpx

    note = {"role": "system", "content": f"{compact.HEADING} (² messages, summarized):\nThey met in Alder."}
    sent = [note, {"role": "user", "content": PARA}, {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": PARA + "Where are the bells?"}]
    r = httpx.post(f"{server.url}/v1/responses", json={"model": "smollm2:135m", "input": sent, "store": False,
                                                        "max_output_tokens": 8, "temperature": 0,
                                                        "truncation": "auto"}, timeout=600)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["input_tokens"] + 8 <= 512
    assert fitting._parts([note])[1] == ("They met in Alder.", 0)  # type: ignore[list-item]


def test_the_parts_of_a_conversation_and_its_summary_round_trip() -> None:
    system = {"role": "system", "content": "Be brief."}
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function",
                                                                "function": {"name": "f", "arguments": "{}"}}]}
    result = {"role": "tool", "tool_call_id": "c", "content": "42"}
    note = {"role": "system", "content": compact.summary_text(7, "They met in Alder.\nThe doors are blue.")}
    convo = [system, note, {"role": "user", "content": "a"}, call, result, {"role": "assistant", "content": "b"},
             {"role": "user", "content": "c"}]
    head, previous, middle, tail = fitting._parts(convo)  # type: ignore[arg-type]
    assert head == [system] and previous == ("They met in Alder.\nThe doors are blue.", 7)
    assert middle == convo[2:6] and tail == convo[6:]
    # a fold that would end between a call and its result takes the result too
    assert fitting._not_a_result(middle, 2) == 3 and fitting._not_a_result(middle, 1) == 1  # type: ignore[arg-type]
    # where the template shows one system message, the summary goes after the instructions in it
    merged = fitting._model_form([system, note, *tail], apart=False)  # type: ignore[list-item]
    assert merged == [{"role": "system", "content": f"Be brief.\n\n{note['content']}"}, *tail]
    assert fitting._model_form([system, note, *tail], apart=True) == [system, note, *tail]  # type: ignore[list-item]


def _facts(count: int) -> list[dict[str, str]]:
    fact = "The quick brown fox jumps over the lazy dog near the river bank today. " * 3
    out: list[dict[str, str]] = []
    for i in range(count):
        out += [{"role": "user", "content": f"Fact {i}: {fact}"}, {"role": "assistant", "content": "Noted."}]
    return [*out, {"role": "user", "content": "What was fact 0 about?"}]


def test_a_conversation_past_a_windows_characters_is_folded_not_refused(server: Server) -> None:
    """docs/api.md: truncation "auto" fits a conversation instead of refusing it; only one whose instructions and
    last turn alone do not fit is still the 400. 17 turns of facts, past the 16,384 characters a window of 512
    takes, are folded (they were a 400 "the prompt is 17,... characters"). Each fact is padded with a run of '='
    (about 60 characters a token) so that the fold's summary costs little."""
    import httpx

    sent = [{**m, "content": m["content"][:40] + " " + "=" * 1000} if m["content"].startswith("Fact") else m
            for m in _facts(17)]
    assert sum(len(m["content"]) for m in sent) > 32 * 512
    ask = {"model": "smollm2:135m", "input": sent, "max_output_tokens": 8, "temperature": 0, "store": False}
    r = httpx.post(f"{server.url}/v1/responses", json={**ask, "truncation": "auto"}, timeout=600)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["input_tokens"] + 8 <= 512
    refused = httpx.post(f"{server.url}/v1/responses", json=ask, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "context_length_exceeded"


def test_what_truncation_folds_is_bounded_and_what_must_fit_is_the_window() -> None:
    """The bounds said before any work (serve/pipeline.py): with truncation "auto", the instructions and the last
    turn within a window's characters, the whole conversation within FOLD_WINDOWS times that."""
    from types import SimpleNamespace

    from localgen.serve.apierror import HTTPError
    from localgen.serve.pipeline import check_prompt_size

    worker = SimpleNamespace(n_ctx=512)
    long = _facts(75)
    check_prompt_size(worker, long, fit=True)  # type: ignore[arg-type]
    with pytest.raises(HTTPError, match="the prompt is 17,"):
        check_prompt_size(worker, long)  # type: ignore[arg-type]
    last = {"role": "user", "content": "x" * (32 * 512 + 1)}
    with pytest.raises(HTTPError, match=r"takes at most 16,384 here$"):
        check_prompt_size(worker, [*long[:-1], last], fit=True)  # type: ignore[arg-type]
    with pytest.raises(HTTPError, match=r"takes at most 16,384 here \(truncation \"auto\" folds at most 2 times"):
        check_prompt_size(worker, _facts(300), fit=True)  # type: ignore[arg-type]
    # tool calls' arguments count too: a summary reads them (they were free, up to the body's 16 MiB)
    calls = [{"role": "assistant", "content": "", "tool_calls": [{"id": f"c{i}", "type": "function", "function": {
        "name": "f", "arguments": "x" * 8000}}]} for i in range(5)]
    with pytest.raises(HTTPError, match="the prompt is 40,"):
        check_prompt_size(worker, [*calls, {"role": "user", "content": "go on"}], fit=True)  # type: ignore[arg-type]


PRESET_SYSTEM = ("You are the archivist of the river town of Alder. Answer in one short sentence, name the street "
                 "when you can, and never guess a date you were not told.")


def test_a_presets_system_stays_first_after_a_fold(cli_env: dict[str, str], tmp_path: Path) -> None:
    """docs/serve.md: a preset's SYSTEM goes before a chat request's messages unless the request has its own.
    The summary a fold writes is the server's, not the request's: the folding request and its follow-ups still
    get the SYSTEM first, the summary after it (it was dropped once a conversation had been folded)."""
    import httpx

    from localgen.serve.responsestore import ResponseStore
    from tests.conftest import CLI

    env = {**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")}
    made = CLI(env)("create", "archivist", "-f", "-", input=f'FROM smollm2:135m\nSYSTEM "{PRESET_SYSTEM}"\n')
    assert made.returncode == 0, made.stderr
    s = Server(env, "-m", "archivist", "--ctx", "512", "-np", "1")
    try:
        sent = [{"role": "user", "content": PARA}, {"role": "assistant", "content": "Noted."},
                {"role": "user", "content": PARA + "Where are the bells?"}]
        ask = {"model": "archivist", "max_output_tokens": 8, "temperature": 0, "truncation": "auto"}
        fitted = httpx.post(f"{s.url}/v1/responses", json={**ask, "input": sent}, timeout=600)
        assert fitted.status_code == 200, fitted.text
        stored = ResponseStore(tmp_path / "home" / "data" / "responses" / "responses.db").load(fitted.json()["id"])
        assert stored is not None and stored.conversation[0]["content"].startswith(compact.HEADING)
        more = httpx.post(f"{s.url}/v1/responses", timeout=600, json={
            **ask, "input": "And the doors?", "previous_response_id": fitted.json()["id"]})
        assert more.status_code == 200, more.text
        # the same conversation with the SYSTEM first, as the model should have had it
        said = [{"role": m["role"], "content": m["content"]} for m in stored.conversation]
        said[0] = {"role": "system", "content": f"{PRESET_SYSTEM}\n\n{said[0]['content']}"}
        direct = httpx.post(f"{s.url}/v1/chat/completions", timeout=600, json={
            "model": "archivist", "max_tokens": 1, "messages": [*said, {"role": "user", "content": "And the doors?"}]})
        assert direct.status_code == 200, direct.text
        assert more.json()["usage"]["input_tokens"] == direct.json()["usage"]["prompt_tokens"]
    finally:
        assert s.stop() == 0


def test_a_folding_requests_access_line_counts_its_answer_and_the_log_the_summarys_tokens(server: Server) -> None:
    """docs/api.md: the access line counts the answer's tokens, as `usage` does, not the fold's window probes and
    summary (it said 3,047 prompt tokens for an answer of 407), and so does /metrics; the `fitted` event says the
    summary's tokens."""
    import httpx

    sent = [{"role": "user", "content": PARA}, {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": PARA + "How are the bells kept?"}]
    def prompt_tokens() -> float:
        text = httpx.get(f"{server.url}/metrics", timeout=10).text
        found = re.search(r'^localgen_prompt_tokens_total\{model="smollm2:135m"\} (\S+)$', text, re.M)
        return float(found[1]) if found else 0.0

    counted = prompt_tokens()
    before = len(server.log().splitlines())
    r = httpx.post(f"{server.url}/v1/responses", timeout=600, json={
        "model": "smollm2:135m", "input": sent, "max_output_tokens": 4, "temperature": 0, "truncation": "auto",
        "store": False})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    ident = r.headers["x-request-id"]

    def logged() -> list[dict[str, Any]]:
        return [json.loads(line) for line in server.log().splitlines()[before:] if line.startswith("{")]

    end = time.monotonic() + 60  # the access line is written after the response's last byte: wait for it
    while not any(line.get("request_id") == ident and "prompt_tokens" in line for line in logged()):
        if time.monotonic() > end:
            break
        time.sleep(0.05)
    lines = logged()
    fitted = [line for line in lines if line.get("event") == "fitted"]
    assert len(fitted) == 1 and fitted[0]["summary_tokens"] > 0, lines
    access = [line for line in lines if line.get("path") == "/v1/responses" and "prompt_tokens" in line]
    assert len(access) == 1, lines
    assert access[0]["prompt_tokens"] == usage["input_tokens"], (access, usage)
    assert access[0].get("completion_tokens") == usage["output_tokens"], (access, usage)
    assert prompt_tokens() - counted == usage["input_tokens"]
