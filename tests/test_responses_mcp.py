"""The Responses API's `mcp` tool with the real `openai` client, a real `localgen serve` (SmolLM2 with Qwen2.5's
template, for tools) and tests/mcp_server.py over streamable HTTP on loopback: refused without
--allow-mcp-urls, tools listed and called (approved first, or not), streamed as the client parses the events, a
dead server an mcp_list_tools with its error, a call past --tool-timeout an mcp_call with its error, and the
headers a request gives reaching the MCP server but never the response, the store or the server's log (short
ones, and a server_url's password, too); a listing past tools/mcp.py's limits an item with its error, servers that
hang, die or connect late leaving no thread or connection behind, and the 8 rounds' limit."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import CLI, ROOT
from tests.test_serve import Server
from tests.test_tools import QWEN

TOKEN = "mcp-secret-5e4d3c2b1a"
ADD = {"type": "mcp", "server_label": "calc", "name": "add"}


@contextlib.contextmanager
def mcp_server(record: Path | None = None, *args: str) -> Iterator[str]:
    """tests/mcp_server.py over streamable HTTP on a free loopback port (recording the Authorization headers its
    `authorization` tool sees in `record`; `args`: its other options): its URL, the server stopped after."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, **({"LOCALGEN_TEST_MCP_HEADERS": str(record)} if record else {})}
    mode = ["--hang", str(port)] if "--hang" in args else ["--http", str(port), *args]
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "mcp_server.py"), *mode],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:  # a call still sleeping in `stall` holds its shutdown
            proc.kill()
            proc.wait(10)


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp") / "headers.txt"


@pytest.fixture(scope="module")
def url(record: Path) -> Iterator[str]:
    with mcp_server(record) as u:
        yield u


@pytest.fixture(scope="module")
def server(cli_env: dict[str, str]) -> Iterator[Server]:
    s = Server(cli_env, "-np", "1", "--ctx", "2048", "--chat-template-file", str(QWEN), "--allow-mcp-urls",
               "--allow-private-urls", "--tool-timeout", "3")
    yield s
    assert s.stop() == 0


def _client(server: Server) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)


def _ask(server: Server, tools: list[dict[str, Any]], **kw: Any) -> Any:
    """A request with `tools` (max_output_tokens: the whole response's, every round's tokens together)."""
    return _client(server).responses.create(model="smollm2:135m", tools=tools, temperature=0,
                                            **{"input": "What is 2 + 3? Use the add tool.", "max_output_tokens": 160,
                                               **kw})


def _log(server: Server) -> str:
    return server.proc.stderr.read().decode() if server.proc.stderr else ""


def test_refused_without_the_flag_and_loopback_without_allow_private_urls(cli_env: dict[str, str],
                                                                          url: str) -> None:
    import openai

    tool = {"type": "mcp", "server_label": "calc", "server_url": url, "require_approval": "never"}
    plain = Server(cli_env, "-np", "1", "--ctx", "1024")
    try:
        with pytest.raises(openai.BadRequestError) as e:
            _ask(plain, [tool])
        assert e.value.status_code == 400 and "--allow-mcp-urls" in str(e.value)
        assert e.value.body["param"] == "tools"  # type: ignore[index]
    finally:
        assert plain.stop() == 0
    public = Server(cli_env, "-np", "1", "--ctx", "2048", "--chat-template-file", str(QWEN), "--allow-mcp-urls")
    try:  # the URL's address is checked as an image URL's is: loopback needs --allow-private-urls
        for u in (url, url.replace("127.0.0.1", "localhost")):  # an address, or a name that resolves to one
            r = _ask(public, [{**tool, "server_url": u}], tool_choice="required")
            assert r.status == "completed" and r.output[0].type == "mcp_list_tools"
            assert r.output[0].tools == [] and "refused: a loopback address" in r.output[0].error
            assert "--allow-private-urls" in r.output[0].error
            assert all(o.type not in ("mcp_call", "mcp_approval_request") for o in r.output)
    finally:
        assert public.stop() == 0


def test_off_loopback_the_flag_needs_a_key(cli_env: dict[str, str]) -> None:
    """--allow-mcp-urls on an address others reach, with no key, would let anyone make the server call MCP servers
    of their choosing (with headers they choose): refused before anything loads, as --mcp and --collection are."""
    r = CLI(cli_env)("serve", "--allow-mcp-urls", "--host", "0.0.0.0", "--port", "1")
    assert r.returncode == 2 and "--allow-mcp-urls on 0.0.0.0 with no API key" in r.stderr, r.stderr


def test_bad_mcp_tools_are_400s_naming_the_field(server: Server, url: str) -> None:
    import openai

    good = {"type": "mcp", "server_label": "calc", "server_url": url}
    for bad, said in (({**good, "server_url": "file:///etc/passwd"}, "server_url must be an http(s) URL"),
                      ({**good, "server_url": "http://example.com:99999/mcp"}, "port must be a number"),
                      ({**good, "server_url": "http://example.com:abc/mcp"}, "port must be a number"),
                      ({**good, "server_label": "a b"}, "server_label must be"),
                      ({**good, "headers": {"X": 1}}, "headers must be an object"),
                      ({**good, "headers": {"X-A": "v\r\nX-Injected: 1"}}, "'X-A' is not a header HTTP can send"),
                      ({**good, "headers": {"bad name:": "v"}}, "'bad name:' is not a header HTTP can send"),
                      ({**good, "headers": {"X-A": "\u00fc\u20ac"}}, "'X-A' is not a header HTTP can send"),
                      ({**good, "authorization": "tok\nen"}, "authorization must be a string of printable ASCII"),
                      ({**good, "require_approval": "sometimes"}, "require_approval must be"),
                      ({**good, "allowed_tools": {"read_only": True}}, "read_only is not served"),
                      ({**good, "connector_id": "connector_gmail"}, "connectors are not served here")):
        with pytest.raises(openai.BadRequestError) as e:
            _ask(server, [bad])
        assert said in str(e.value) and e.value.body["param"] == "tools"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as e:
        _ask(server, [good, {**good}])
    assert "two mcp tools have the server_label 'calc'" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        _ask(server, [good, {"type": "file_search", "vector_store_ids": ["notes"]}])
    assert "file_search and mcp tools are not served together" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:  # before any server is connected to
        _ask(server, [good], tool_choice={"type": "mcp", "server_label": "other", "name": "add"})
    assert "which no mcp tool has" in str(e.value) and e.value.body["param"] == "tool_choice"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as e:
        _ask(server, [good], truncation="auto")
    assert e.value.body["param"] == "truncation"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as e:  # an approval that answers nothing waiting
        _ask(server, [good], input=[{"type": "mcp_approval_response", "approval_request_id": "mcpr_x",
                                     "approve": True}])
    assert "answers no mcp_approval_request" in str(e.value)


def test_listed_and_called_without_approval(server: Server, url: str) -> None:
    tool = {"type": "mcp", "server_label": "calc", "server_url": url, "require_approval": "never",
            "allowed_tools": ["add"]}
    r = _ask(server, [tool], tool_choice=ADD)
    kinds = [o.type for o in r.output]
    assert kinds[:2] == ["mcp_list_tools", "mcp_call"] and kinds[-1] == "message", kinds
    listed, call = r.output[0], r.output[1]
    assert listed.server_label == "calc" and listed.error is None
    assert [t.name for t in listed.tools] == ["add"]  # allowed_tools: only add is offered
    assert listed.tools[0].input_schema["required"] == ["a", "b"] and listed.tools[0].description == "Add two integers."
    assert (call.server_label, call.name, call.output, call.error) == ("calc", "add", "5", None)
    assert json.loads(call.arguments) == {"a": 2, "b": 3} and call.status == "completed"
    assert r.tools[0].type == "mcp" and r.tool_choice.type == "mcp"  # echoed as given
    # stored: GET returns the same items
    got = httpx.get(f"{server.url}/v1/responses/{r.id}", timeout=10).json()
    assert [o["type"] for o in got["output"]] == kinds and got["output"][1]["output"] == "5"
    # two servers with a tool of the same name: each kept apart by its label
    other = {**tool, "server_label": "calc2"}
    r = _ask(server, [tool, other], tool_choice={"type": "mcp", "server_label": "calc2", "name": "add"})
    assert [(o.type, o.server_label) for o in r.output[:2]] == [("mcp_list_tools", "calc"), ("mcp_list_tools", "calc2")]
    call = r.output[2]
    assert (call.type, call.server_label, call.name, call.output) == ("mcp_call", "calc2", "add", "5")


def test_a_function_call_beside_mcp_tools_ends_the_response(server: Server, url: str) -> None:
    tool = {"type": "mcp", "server_label": "calc", "server_url": url, "require_approval": "never"}
    weather = {"type": "function", "name": "weather", "description": "The weather in a city.",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    r = _ask(server, [tool, weather], tool_choice={"type": "function", "name": "weather"},
             input="What is the weather in Paris?")
    assert [o.type for o in r.output] == ["mcp_list_tools", "function_call"]
    assert r.output[1].name == "weather" and "city" in json.loads(r.output[1].arguments)


def _conversation(cli_env: dict[str, str], ident: str) -> list[dict[str, Any]]:
    """The conversation serve stored for response `ident` (what the model read, and its answer)."""
    from localgen.serve.responsestore import ResponseStore

    path = next(Path(cli_env["LOCALGEN_HOME"]).rglob("responses.db"))
    found = ResponseStore(path).load(ident)
    assert found is not None
    return found.conversation


def test_the_approval_round_trip(server: Server, url: str, record: Path, cli_env: dict[str, str]) -> None:
    tool = {"type": "mcp", "server_label": "calc", "server_url": url}  # require_approval: "always" by default
    asked = _ask(server, [tool], tool_choice=ADD)
    assert [o.type for o in asked.output] == ["mcp_list_tools", "mcp_approval_request"]
    request = asked.output[1]
    assert (request.server_label, request.name) == ("calc", "add") and json.loads(request.arguments) == {"a": 2, "b": 3}
    approved = _ask(server, [tool], previous_response_id=asked.id,
                    input=[{"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}])
    kinds = [o.type for o in approved.output]
    assert kinds[0] == "mcp_call" and "mcp_list_tools" not in kinds, kinds  # listed once in the conversation
    call = approved.output[0]
    assert (call.approval_request_id, call.name, call.output, call.error) == (request.id, "add", "5", None)
    # the same approval again answers nothing that waits
    import openai

    with pytest.raises(openai.BadRequestError):
        _ask(server, [tool], previous_response_id=approved.id,
             input=[{"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}])
    # denied: the call never runs, and the model answers (it was told the user declined)
    before = record.read_text() if record.exists() else ""
    who = {"type": "mcp", "server_label": "calc", "server_url": url, "headers": {"Authorization": f"Bearer {TOKEN}"}}
    pick = {"type": "mcp", "server_label": "calc", "name": "authorization"}
    waiting = _ask(server, [who], tool_choice=pick, input="Who am I?")
    assert waiting.output[-1].type == "mcp_approval_request" and waiting.output[-1].name == "authorization"
    denied = _ask(server, [who], previous_response_id=waiting.id,
                  input=[{"type": "mcp_approval_response", "approval_request_id": waiting.output[-1].id,
                          "approve": False}])
    assert [o.type for o in denied.output] == ["message"] and denied.status == "completed"
    assert (record.read_text() if record.exists() else "") == before  # the tool did not run
    told = [m for m in _conversation(cli_env, denied.id) if m.get("role") == "tool"]  # what the model read of it
    assert [(m["tool_call_id"], m["content"]) for m in told] == [
        (waiting.output[-1].id, "The user declined to run this tool call.")]
    # the approval's tool must come again
    with pytest.raises(openai.BadRequestError) as e:
        _ask(server, [], previous_response_id=waiting.id,
             input=[{"type": "mcp_approval_response", "approval_request_id": waiting.output[-1].id, "approve": True}])
    assert "give that tool again" in str(e.value)
    # without the store: the items sent back as input, as the Agents SDK does
    items = [{"type": "message", "role": "user", "content": "What is 2 + 3? Use the add tool."},
             *(o.model_dump(exclude_none=True) for o in asked.output),
             {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}]
    again = _ask(server, [tool], input=items, store=False)
    assert [o.type for o in again.output][:1] == ["mcp_call"] and again.output[0].output == "5"
    # the next turn sends all that back (as the Agents SDK's to_input_list does): the approval is history, answered
    # then, and the call does not run again
    history = [*items, *(o.model_dump(exclude_none=True) for o in again.output),
               {"type": "message", "role": "user", "content": "Thank you."}]
    third = _ask(server, [tool], input=history, store=False, tool_choice="none")
    assert not [o for o in third.output if o.type == "mcp_call"], third.output
    assert third.status == "completed" and third.output[-1].type == "message"
    for r in (approved, again):  # the approved call made again is not asked about again: the model must answer
        assert not [o for o in r.output if o.type == "mcp_approval_request" and o.name == "add"
                    and json.loads(o.arguments) == {"a": 2, "b": 3}], r.output
    # one answer twice in a request would run the call twice; a request the client wrote itself for a tool
    # that allowed_tools leaves out is not run
    with pytest.raises(openai.BadRequestError) as e:
        _ask(server, [tool], input=[*items, items[-1]], store=False)
    assert "answered twice" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        _ask(server, [{**tool, "allowed_tools": ["authorization"]}], input=items, store=False)
    assert "allowed_tools does not list" in str(e.value)


def test_streamed_events_as_the_client_parses_them(server: Server, url: str) -> None:
    tool = {"type": "mcp", "server_label": "calc", "server_url": url, "require_approval": {"never": {
        "tool_names": ["add"]}}}
    with _client(server).responses.stream(model="smollm2:135m", input="What is 2 + 3?", tools=[tool],
                                           tool_choice=ADD, temperature=0, max_output_tokens=160) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    mcp = [k for k in kinds if "mcp" in k]
    assert mcp == ["response.mcp_list_tools.in_progress", "response.mcp_list_tools.completed",
                   "response.mcp_call.in_progress", "response.mcp_call_arguments.delta",
                   "response.mcp_call_arguments.done", "response.mcp_call.completed"], kinds
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added[:2] == ["mcp_list_tools", "mcp_call"]
    done = next(e for e in events if e.type == "response.mcp_call_arguments.done")
    assert json.loads(done.arguments) == {"a": 2, "b": 3}
    assert type(done).__name__ == "ResponseMcpCallArgumentsDoneEvent"  # the client's own type, not a fallback
    assert [o.type for o in final.output][:2] == ["mcp_list_tools", "mcp_call"] and final.output[1].output == "5"


def test_a_dead_server_and_a_stalled_call_are_items_with_their_error(server: Server) -> None:
    with mcp_server() as url:
        tool = {"type": "mcp", "server_label": "slow", "server_url": url, "require_approval": "never"}
        r = _ask(server, [tool], tool_choice={"type": "mcp", "server_label": "slow", "name": "fail"}, input="Fail.")
        call = next((o for o in r.output if o.type == "mcp_call"), None)
        assert call is not None, r.model_dump_json()
        assert call.name == "fail" and call.output is None and call.status == "failed"
        assert call.error.type == "mcp_tool_execution_error"  # the SDK's server says which tool, not why
        assert call.error.content == [{"type": "text", "text": "Error executing tool fail"}]
        r = _ask(server, [tool], tool_choice={"type": "mcp", "server_label": "slow", "name": "stall"},
                 input="Sleep.")
        call = next(o for o in r.output if o.type == "mcp_call")
        assert call.name == "stall" and call.output is None and call.status == "failed"
        assert call.error.type == "mcp_protocol_error"  # parsed by the client as its own type
        assert "did not answer within 3 s" in call.error.message  # --tool-timeout 3
        assert r.status == "completed"
    # nothing listens there now
    tool = {"type": "mcp", "server_label": "gone", "server_url": url, "require_approval": "never"}
    r = _ask(server, [tool], tool_choice="required")
    assert r.output[0].type == "mcp_list_tools" and r.output[0].tools == []
    assert r.output[0].error == f"cannot reach the MCP server {url}: Connection refused"
    assert r.status == "completed" and r.output[-1].type == "message"
    with _client(server).responses.stream(model="smollm2:135m", input="Hi", tools=[tool], temperature=0,
                                           max_output_tokens=8) as stream:
        kinds = [e.type for e in stream]
    assert "response.mcp_list_tools.failed" in kinds and kinds[-1] in ("response.completed", "response.incomplete")


def test_headers_reach_the_server_and_nothing_else(server: Server, url: str, record: Path) -> None:
    tool = {"type": "mcp", "server_label": "calc", "server_url": url, "require_approval": "never",
            "headers": {"Authorization": f"Bearer {TOKEN}"}}
    r = _ask(server, [tool], tool_choice={"type": "mcp", "server_label": "calc", "name": "authorization"},
             input="Who am I?")
    assert f"Bearer {TOKEN}" in record.read_text().splitlines()  # the MCP server got it
    call = next(o for o in r.output if o.type == "mcp_call")
    assert call.name == "authorization" and call.output == "[Authorization token redacted]"
    assert r.tools[0].headers == {"Authorization": "[redacted]"}
    stored = httpx.get(f"{server.url}/v1/responses/{r.id}", timeout=10).text
    assert TOKEN not in stored and TOKEN not in r.model_dump_json()
    # `authorization` is sent as a bearer token, and redacted as well
    key = TOKEN[::-1]
    tool = {"type": "mcp", "server_label": "calc", "server_url": url, "require_approval": "never",
            "authorization": key}
    r = _ask(server, [tool], tool_choice={"type": "mcp", "server_label": "calc", "name": "authorization"},
             input="Who am I?")
    assert f"Bearer {key}" in record.read_text().splitlines()
    assert r.tools[0].authorization == "[redacted]" and key not in r.model_dump_json()
    assert TOKEN not in _log(server) and key not in _log(server)


def test_which_calls_need_approval() -> None:
    from localgen.serve.mcprequest import _tool

    base = {"type": "mcp", "server_label": "s", "server_url": "https://example.com/mcp"}
    assert _tool(base).needs_approval("add")  # "always" is the default, as at OpenAI
    assert not _tool({**base, "require_approval": "never"}).needs_approval("add")
    mixed = _tool({**base, "require_approval": {"always": {"tool_names": ["rm"]}, "never": {"tool_names": ["ls"]}}})
    assert mixed.needs_approval("rm") and not mixed.needs_approval("ls") and mixed.needs_approval("cat")


def test_what_is_redacted_whatever_its_length() -> None:
    from localgen.serve.mcprequest import _tool

    t = _tool({"type": "mcp", "server_label": "s", "server_url": "https://al:p%40ss@example.com/mcp",
               "headers": {"X-N": "1"}, "authorization": "tok"})
    assert t.redact("12+1") == "[X-N token redacted]2+[X-N token redacted]"  # one digit: out of every number
    assert t.redact("Bearer tok, tok") == "[Authorization token redacted], [Authorization bearer token redacted]"
    assert t.redact("al:p%40ss al:p@ss p@ss al") == ("[server_url password redacted] [server_url decoded password "
                                                     "redacted] [server_url decoded password part redacted] al")
    assert t.redact("Basic YWw6cEBzcw==") == "Basic [server_url credentials redacted]"  # base64 of al:p@ss


def _sse(server: Server, body: dict[str, Any], until: str | None = None) -> tuple[list[dict[str, Any]], str]:
    """A streamed /v1/responses request read event by event (closed at the first `until` event after the mcp_call,
    when given): the events read, and the request's id (the x-request-id its access line ends with)."""
    out: list[dict[str, Any]] = []
    with httpx.stream("POST", f"{server.url}/v1/responses", json={**body, "stream": True}, timeout=300) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append(json.loads(line[6:]))
                called = any(e["type"] == "response.mcp_call.completed" for e in out)
                if until is not None and called and out[-1]["type"] == until:
                    break
        return out, r.headers["x-request-id"]


def _access_tokens(server: Server, ident: str) -> int:
    """The completion tokens the access line of request `ident` counts (waiting for the line: a client that
    left is logged once its jobs have stopped)."""
    seen = ""
    for _ in range(600):
        seen += _log(server)
        line = next((ln for ln in seen.splitlines() if ln.endswith(f"id={ident}")), None)
        if line is not None:
            return int(line.split(" tokens")[0].rsplit("+", 1)[1])
        time.sleep(0.1)
    raise AssertionError(f"no access line for {ident}: {seen}")


def test_the_answer_round_streams_as_the_model_writes_it(server: Server, url: str) -> None:
    tool = {"type": "mcp", "server_label": "calc", "server_url": url, "require_approval": "never"}
    body = {"model": "smollm2:135m", "tools": [tool], "tool_choice": ADD, "temperature": 0, "max_output_tokens": 160,
            "input": "What is 2 + 3? Use the add tool, then write a long story about the number five."}
    events, whole = _sse(server, body)
    kinds = [e["type"] for e in events]
    after = kinds[kinds.index("response.mcp_call.completed"):]
    assert after.count("response.output_text.delta") > 5, kinds  # the answer in pieces, as it was written
    full = events[-1]["response"]["usage"]["output_tokens"]
    assert _access_tokens(server, whole) == full
    # the client leaves at the answer's first piece: the model was still writing it, and stops (the old way, a
    # round was sent once written whole: the server had made every token by then)
    events, cut = _sse(server, body, until="response.output_text.delta")
    assert events[-1]["type"] == "response.output_text.delta"
    assert _access_tokens(server, cut) < full


def test_max_output_tokens_is_the_whole_responses_budget(server: Server, url: str) -> None:
    tool = {"type": "mcp", "server_label": "calc", "server_url": url}
    asked = _ask(server, [tool], tool_choice=ADD, max_output_tokens=100)  # one round: the call, then approval
    assert [o.type for o in asked.output] == ["mcp_list_tools", "mcp_approval_request"]
    spent = asked.usage.output_tokens  # what the round that makes the call takes
    never = {**tool, "require_approval": "never"}
    full = _ask(server, [never], tool_choice=ADD, max_output_tokens=100)
    assert full.status == "completed" and full.usage.output_tokens > spent + 2  # its answer takes more than 2
    # 2 tokens past the call: the call runs, the answer round gets the 2 left and is cut short
    r = _ask(server, [never], tool_choice=ADD, max_output_tokens=spent + 2)
    assert [o.type for o in r.output] == ["mcp_list_tools", "mcp_call", "message"] and r.output[1].output == "5"
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == spent + 2
    # too few for the call's arguments: the call, cut short, is not run
    r = _ask(server, [never], tool_choice=ADD, max_output_tokens=3)
    assert r.output[0].type == "mcp_list_tools"
    assert all(o.type not in ("mcp_call", "mcp_approval_request") for o in r.output), r.output
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3


def test_each_connection_to_a_requests_mcp_server_is_checked_as_it_is_made() -> None:
    """No DNS rebinding: the SDK's HTTP client for a request's server resolves and checks the host at every
    connection and connects to the checked address, not only once before (a name that resolves to loopback is
    refused there, without private addresses allowed)."""
    import asyncio

    from localgen.errors import ToolError
    from localgen.tools.mcp import McpServer, _pinned_client
    from localgen.tools.mcpconfig import McpTarget

    async def post(u: str, private: bool) -> int:
        async with _pinned_client({"X-Test": "1"}, private) as client:
            return int((await client.post(u, json={})).status_code)

    with mcp_server() as url:
        local = url.replace("127.0.0.1", "localhost")
        with pytest.raises(Exception, match="refused: a loopback address"):
            asyncio.run(post(local, False))
        assert asyncio.run(post(local, True)) >= 200  # allowed: the server answered (its status: not our concern)
        with pytest.raises(ToolError, match="refused: a loopback address"):
            McpServer(McpTarget("calc", url=local), 10, private=False)
        server = McpServer(McpTarget("calc", url=local), 10, private=True)
        try:
            assert "add" in [t.name for t in server.tools] and server.call("add", {"a": 2, "b": 3}, 10) == "5"
        finally:
            server.close()


def test_credentials_in_server_url_are_never_shown(server: Server, url: str) -> None:
    secret = "pw-5e4d3c2b1a0f"
    tool = {"type": "mcp", "server_label": "calc", "require_approval": "never",
            "server_url": url.replace("://", f"://alice:{secret}@")}
    r = _ask(server, [tool], tool_choice=ADD)
    assert r.output[1].type == "mcp_call" and r.output[1].output == "5"  # the URL works with them
    assert r.tools[0].server_url == url.replace("://", "://[redacted]@")
    got = httpx.get(f"{server.url}/v1/responses/{r.id}", timeout=10).text
    with socket.socket() as s:  # a port nobody listens on: the error names the URL, without them
        s.bind(("127.0.0.1", 0))
        dead = f"http://alice:{secret}@127.0.0.1:{s.getsockname()[1]}/mcp"
    r2 = _ask(server, [{**tool, "server_url": dead}], max_output_tokens=8)
    assert r2.output[0].error.startswith("cannot reach the MCP server http://[redacted]@127.0.0.1:")
    for seen in (r.model_dump_json(), got, r2.model_dump_json(), _log(server)):
        assert secret not in seen and "alice" not in seen


def test_a_listing_in_pages_is_read_to_its_end(server: Server) -> None:
    """The mcp tool's server is listed as run's are (tools/mcp.py): every page of its tools/list, its nextCursor
    followed; a cursor sent twice is the item's error, not a loop."""
    with mcp_server(None, "--pages", "2") as url:
        tool = {"type": "mcp", "server_label": "paged", "server_url": url, "require_approval": "never"}
        r = _ask(server, [tool], max_output_tokens=8)
    listed = r.output[0]
    assert listed.type == "mcp_list_tools" and not listed.error, listed
    assert [t.name for t in listed.tools] == ["add", "leak", "crash", "authorization", "fail", "stall"]
    with mcp_server(None, "--pages", "same") as url:
        r = _ask(server, [{**tool, "server_url": url}], max_output_tokens=8)
    listed = r.output[0]
    assert listed.type == "mcp_list_tools" and listed.tools == [], listed
    assert listed.error == "the MCP server paged sent the same tools/list cursor twice: its listing would never end"


def test_an_oversized_listing_is_an_item_with_its_error(server: Server) -> None:
    """A server's listing is read only up to tools/mcp.py's limits, each checked before what is past it is parsed:
    its mcp_list_tools item has the error, no tools, and the model answers without them."""
    for kind, said in (("body", "sent a body of 5,2"), ("event", "sent a server-sent event over 4 MB"),
                       ("count", "listed 1,007 tools: at most 1,000 are read"),
                       ("description", "tool wordy has a description of 70,000 characters: at most 65,536"),
                       ("total", "tool listing is over 4,194,304 characters of names, descriptions and schemas")):
        paged = ("--pages", "40") if kind == "total" else ()  # two pages, each body under 4 MB
        with mcp_server(None, "--oversized", kind, *paged) as url:
            tool = {"type": "mcp", "server_label": "big", "server_url": url, "require_approval": "never"}
            r = _ask(server, [tool], max_output_tokens=8)
        listed = r.output[0]
        assert listed.type == "mcp_list_tools" and listed.tools == [], (kind, listed)
        assert said in listed.error and listed.error.startswith("the MCP server big"), (kind, listed.error)
        assert r.output[-1].type == "message" and not [o for o in r.output if o.type == "mcp_call"]
    with mcp_server(None, "--oversized", "result") as url:  # a call's result past 4 MB: its mcp_call's error
        tool = {"type": "mcp", "server_label": "big", "server_url": url, "require_approval": "never"}
        r = _ask(server, [tool], tool_choice={"type": "mcp", "server_label": "big", "name": "flood"}, input="Flood.",
                 max_output_tokens=40)
    call = next(o for o in r.output if o.type == "mcp_call")
    assert call.output is None and call.error.type == "mcp_protocol_error"
    assert call.error.message == "the MCP server big sent a server-sent event over 4 MB: at most 4,194,304 bytes are " \
                                 "read (calling flood)"


def test_short_secrets_are_never_shown(server: Server) -> None:
    """A header value and a server_url's user:password of any length (3 characters here) are redacted wherever the
    server may echo them: a listed tool's description, a call's output (the Basic credentials the URL's become), an
    error that names the URL; never in the stored response or the server's log."""
    import base64

    key, password = "k7W", "zQ9"
    basic = base64.b64encode(f"al:{password}".encode()).decode()
    pick = {"type": "mcp", "server_label": "echo", "name": "authorization"}
    seen = []
    with mcp_server(None, "--echo") as url:
        for tool, shown in (({"authorization": key, "server_url": url}, "[Authorization token redacted]"),
                            ({"server_url": url.replace("://", f"://al:{password}@")},
                             "Basic [server_url credentials redacted]")):
            tool = {"type": "mcp", "server_label": "echo", "require_approval": "never", **tool}
            r = _ask(server, [tool], tool_choice=pick, input="Who am I?", max_output_tokens=40)
            whoami = next(t for t in r.output[0].tools if t.name == "whoami")
            assert whoami.description == f"Say who calls: {shown}", whoami
            call = next(o for o in r.output if o.type == "mcp_call")
            assert call.output == shown, call
            seen += [r.model_dump_json(), httpx.get(f"{server.url}/v1/responses/{r.id}", timeout=10).text]
    tool = {"type": "mcp", "server_label": "gone", "server_url": url.replace("://", f"://al:{password}@"),
            "require_approval": "never"}
    r = _ask(server, [tool], max_output_tokens=8)  # nothing listens there now: the error names the URL
    hidden = url.replace("://", "://[redacted]@")
    assert r.output[0].error == f"cannot reach the MCP server {hidden}: Connection refused"
    seen += [r.model_dump_json(), _log(server)]
    for text in seen:
        assert key not in text and password not in text and basic not in text


def _held(pid: int, ports: set[int]) -> tuple[list[str], int]:
    """What process `pid` holds of MCP servers: its threads named for one (not the pool's, which wait for the next
    request), and its TCP connections to `ports`."""
    task = Path(f"/proc/{pid}/task")
    names = [n for n in (_read(t / "comm") for t in task.iterdir()) if n.startswith("mcp ") and
             not n.startswith("mcp tool")]
    inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")
              if _link(f"/proc/{pid}/fd/{fd}").startswith("socket:[")}
    held = 0
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[2].rpartition(":")[2], 16) in ports and fields[9] in inodes:
            held += 1
    return names, held


def _read(path: Path) -> str:
    with contextlib.suppress(OSError):  # a thread that ended as we looked
        return path.read_text().strip()
    return ""


def _link(path: str) -> str:
    with contextlib.suppress(OSError):
        return os.readlink(path)
    return ""


def _let_go(server: Server, ports: set[int]) -> None:
    """Waits until serve holds no MCP server's thread or connection to `ports` (a close waits at most
    tools/mcp.py's CLOSE_S for a server that hangs), else fails naming what it still holds."""
    held: tuple[list[str], int] = ([], 0)
    for _ in range(300):
        held = _held(server.proc.pid, ports)
        if held == ([], 0):
            return
        time.sleep(0.1)
    raise AssertionError(f"serve still holds {held}")


def _port(url: str) -> int:
    return int(url.rpartition(":")[2].partition("/")[0])


def test_servers_that_hang_close_or_connect_late_leave_nothing_behind(server: Server, url: str) -> None:
    """Connecting and each call take at most --tool-timeout (3 s here), a server that hangs included; a server
    that dies mid-call is that call's error; one that connects after the client left is closed. However the
    response ends, no thread or connection to any of them is left (a server that never answers held four of
    them open, its loop's thread ended under them)."""
    calc = {"type": "mcp", "server_label": "calc", "server_url": url, "require_approval": "never"}
    with mcp_server(None, "--hang") as hung, mcp_server() as dying, mcp_server(None, "--slow", "2") as late, \
            mcp_server(None, "--freeze") as frozen:
        ports = {_port(u) for u in (url, hung, dying, late, frozen)}
        # one server of two that cannot list: its item has the error, the other's tools are called
        r = _ask(server, [{**calc, "server_label": "hung", "server_url": hung}, calc], tool_choice=ADD)
        assert [(o.type, o.server_label, o.error) for o in r.output[:2]] == [
            ("mcp_list_tools", "hung", "the MCP server hung did not answer within 3 s (starting)"),
            ("mcp_list_tools", "calc", None)]
        assert (r.output[2].type, r.output[2].output) == ("mcp_call", "5") and r.status == "completed"
        # a server that dies in the middle of a call
        pick = {"type": "mcp", "server_label": "dying", "name": "crash"}
        r = _ask(server, [{**calc, "server_label": "dying", "server_url": dying}], tool_choice=pick, input="Crash.",
                 max_output_tokens=40)
        call = next(o for o in r.output if o.type == "mcp_call")
        assert call.error.type == "mcp_protocol_error" and "the MCP server dying failed (calling crash)" in \
            call.error.message and r.status in ("completed", "incomplete")
        # one that stops answering mid-session: the call past --tool-timeout, its connections closed all the same
        pick = {"type": "mcp", "server_label": "frozen", "name": "add"}
        r = _ask(server, [{**calc, "server_label": "frozen", "server_url": frozen}], tool_choice=pick)
        call = next(o for o in r.output if o.type == "mcp_call")
        assert call.error.message == "the MCP server frozen did not answer within 3 s (calling add)"
        _let_go(server, ports)
        # the client leaves while a server is still connecting: it is closed once it has
        body = {"model": "smollm2:135m", "input": "Hi", "stream": True, "max_output_tokens": 8,
                "tools": [{**calc, "server_label": "late", "server_url": late}]}
        with httpx.stream("POST", f"{server.url}/v1/responses", json=body, timeout=60) as s:
            assert next(s.iter_lines()).startswith("event: response.created")
        time.sleep(3)  # (the late server answers each request after 2 s)
        _let_go(server, ports)


def test_a_url_rewritten_between_turns_is_redacted_as_it_now_is(server: Server, url: str) -> None:
    """The approved call runs with the server_url of the request that approves it: its user:password (here
    rewritten since the call was asked for) is the one redacted from the call's output, as Basic credentials."""
    import base64

    pick = {"type": "mcp", "server_label": "calc", "name": "authorization"}
    first = {"type": "mcp", "server_label": "calc", "server_url": url.replace("://", "://al:pw1@")}
    asked = _ask(server, [first], tool_choice=pick, input="Who am I?", max_output_tokens=40)
    request = asked.output[-1]
    assert request.type == "mcp_approval_request" and request.name == "authorization"
    now = {**first, "server_url": url.replace("://", "://bo:pw2@")}
    r = _ask(server, [now], previous_response_id=asked.id, max_output_tokens=40,
             input=[{"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}])
    call = r.output[0]
    assert call.type == "mcp_call" and call.output == "Basic [server_url credentials redacted]", call
    assert r.tools[0].server_url == url.replace("://", "://[redacted]@")
    stored = httpx.get(f"{server.url}/v1/responses/{r.id}", timeout=10).text
    for text in (asked.model_dump_json(), r.model_dump_json(), stored, _log(server)):
        for secret in ("pw1", "pw2", base64.b64encode(b"al:pw1").decode(), base64.b64encode(b"bo:pw2").decode()):
            assert secret not in text, secret


def test_after_eight_rounds_of_calls_the_model_must_answer(cli_env: dict[str, str], tmp_path: Path) -> None:
    """`step`'s result asks for the next step, as a call written out (the model copies it): the model calls it
    round after round, until the round after the 8th, which may only answer (its calls written as text). A server of
    its own, whose calls have time enough on a busy machine (the module's has 3 s, for the hung servers' tests: a
    call cut there changed what the model did next), and a home of its own (no prefix another test's server kept on
    disk is reused: a prefix evaluated in another batch shape can turn SmolLM2's greedy text)."""
    env = {**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")}
    server = Server(env, "-np", "1", "--ctx", "2048", "--chat-template-file", str(QWEN), "--allow-mcp-urls",
                    "--allow-private-urls", "--tool-timeout", "120")
    try:
        with mcp_server(None, "--steps") as url:
            tool = {"type": "mcp", "server_label": "calc", "server_url": url, "require_approval": "never",
                    "allowed_tools": ["step"]}
            r = _ask(server, [tool], tool_choice={"type": "mcp", "server_label": "calc", "name": "step"},
                     input="Do the task: call step with n=1, then each step it says, until step 20.",
                     max_output_tokens=1000)
    finally:
        assert server.stop() == 0
    calls = [o for o in r.output if o.type == "mcp_call"]
    assert calls and all(c.output.startswith("Step ") for c in calls), r.output
    rounds = [bool(m.get("tool_calls")) for m in _conversation(env, r.id) if m["role"] == "assistant"]
    assert rounds[:2] == [True, True] and sum(rounds) <= 8, rounds  # never a 9th round of calls
    if r.status == "completed":  # alone on a quiet machine: eight rounds of calls, then the answer
        assert r.output[-1].type == "message" and rounds == [True] * 8 + [False], (rounds, r.output)
    else:  # SmolLM2's greedy text turned (other tests' servers beside it) and spent the budget first
        assert r.incomplete_details is not None and r.incomplete_details.reason == "max_output_tokens", r


def test_requests_with_the_mcp_tool_leave_no_open_files_behind(server: Server, url: str) -> None:
    """Each request connects to its MCP servers on an event loop of their own: once it is answered, the loop is
    closed (a trial found each request left its loop open, three descriptors, until the server ran out of them and
    its Responses store could no longer be opened)."""
    tool = {"type": "mcp", "server_label": "calc", "server_url": url, "require_approval": "never"}
    body = {"model": "smollm2:135m", "input": "Hi", "max_output_tokens": 1, "tools": [tool]}

    def fds() -> int:  # event loops' epoll descriptors: one for each loop not closed (the leak's mark)
        return sum(_link(f"/proc/{server.proc.pid}/fd/{fd}") == "anon_inode:[eventpoll]"
                   for fd in os.listdir(f"/proc/{server.proc.pid}/fd"))

    with httpx.Client(base_url=server.url, timeout=120) as client:  # one connection to the server throughout
        assert client.post("/v1/responses", json=body).status_code == 200
        before = fds()
        for _ in range(6):
            r = client.post("/v1/responses", json=body)
            assert r.status_code == 200 and r.json()["output"][0]["type"] == "mcp_list_tools", r.text
        after = fds()
        for _ in range(100):  # the last request's servers are closed as its answer goes: wait for that
            if after <= before:
                break
            time.sleep(0.1)
            after = fds()
    assert after <= before, (before, after)  # one loop (and its two sockets) a request were left before


def test_an_mcp_call_running_at_shutdown_ends_as_a_503_and_does_not_hold_the_exit(cli_env: dict[str, str]) -> None:
    """serve.md's Stopping: a Responses request whose mcp tool call is still running after --drain-timeout ends
    with a 503 in the API's shape, no traceback; the call's thread is abandoned (one log line), and serve exits 0
    without waiting for it (a pool's thread was joined at exit)."""
    import signal
    import threading

    s = Server(cli_env, "-np", "1", "--ctx", "2048", "--chat-template-file", str(QWEN), "--allow-mcp-urls",
               "--allow-private-urls", "--tool-timeout", "600", "--drain-timeout", "0.5")
    got: dict[str, Any] = {}
    try:
        with mcp_server() as url:
            tool = {"type": "mcp", "server_label": "slow", "server_url": url, "require_approval": "never"}

            def ask() -> None:
                got["r"] = httpx.post(f"{s.url}/v1/responses", timeout=600, json={
                    "model": "smollm2:135m", "input": "Sleep.", "tools": [tool], "temperature": 0,
                    "tool_choice": {"type": "mcp", "server_label": "slow", "name": "stall"}, "max_output_tokens": 160})

            caller = threading.Thread(target=ask)
            caller.start()
            seen, deadline = False, time.monotonic() + 600  # a safety net: the round's generation, then its call
            while time.monotonic() < deadline and caller.is_alive():
                running = s.health()["running"]
                if seen and not running:
                    break
                seen = seen or bool(running)
                time.sleep(0.05)
            assert seen and caller.is_alive(), got
            s.proc.send_signal(signal.SIGTERM)
            assert s.proc.wait(timeout=60) == 0  # (`stall` sleeps far longer)
            caller.join(60)
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
    r = got["r"]
    assert r.status_code == 503 and r.json()["error"]["type"] == "server_error", r.text
    assert "shutting down: the tool call stall was" in r.json()["error"]["message"]
    log = s.log()
    assert "the tool call stall is abandoned" in log and "Traceback" not in log, log
