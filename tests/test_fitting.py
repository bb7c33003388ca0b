"""The Responses API's truncation "auto" (docs/api.md; serve/fitting.py): a thread past a slot's window has its
oldest turns folded into a summary the model writes, the turn being answered kept word for word, and goes on
from the fitted conversation; without it the same request is the 400 agents read to compact."""

from __future__ import annotations

import json
from collections.abc import Iterator

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
