"""Tools the server runs itself (`serve --mcp`, `--functions`): GET /tools lists them in the shape a request's
`tools` takes, POST /tools/call runs one against the real MCP server or Python file, a failed call is a result
marked is_error (not an HTTP error), and a whole round trip with the OpenAI client: the model calls the listed
tool, the server runs it, the answer reads the result. SmolLM2 with Qwen2.5's template (tools)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT
from tests.test_serve import Server
from tests.test_tools import QWEN

MCP = f"{sys.executable} {ROOT / 'tests' / 'mcp_server.py'}"
FUNCTIONS = str(ROOT / "tests" / "tool_functions.py")
TOKEN = "sk-test-9f8e7d6c5b4a"


@pytest.fixture(scope="module")
def server(cli_env: dict[str, str]) -> Iterator[Server]:
    s = Server({**cli_env, "TEST_API_TOKEN": TOKEN}, "-np", "1", "--ctx", "2048", "--chat-template-file", str(QWEN),
               "--mcp", MCP, "--functions", FUNCTIONS, "--tool-timeout", "2")
    yield s
    assert s.stop() == 0


def _call(server: Server, name: str, arguments: Any = None) -> dict[str, Any]:
    r = httpx.post(f"{server.url}/tools/call", json={"name": name, "arguments": arguments}, timeout=60)
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    assert doc["object"] == "tool.result" and doc["name"] == name
    return doc


def test_the_tools_are_listed_as_a_requests_tools_take_them(server: Server) -> None:
    doc = httpx.get(f"{server.url}/tools", timeout=10).json()
    assert doc["object"] == "list" and doc["timeout"] == 2
    sources = {t["function"]["name"]: t["source"] for t in doc["data"]}
    from localgen.tools.mcpconfig import one

    assert sources["add"] == f"mcp: {one(MCP).label}"  # the command line (cut at 60 characters)
    assert sources["get_weather"] == "functions: tool_functions.py"
    add = next(t for t in doc["data"] if t["function"]["name"] == "add")
    assert add["type"] == "function" and add["function"]["description"] == "Add two integers."
    assert add["function"]["parameters"]["properties"].keys() == {"a", "b"}
    # the start-up lines say what is offered, by source
    text = server.proc.stderr.read().decode() if server.proc.stderr else ""
    assert "tools (functions: tool_functions.py): get_weather, explode, stall, secret" in text
    assert "add, leak, crash" in text


def test_calls_run_the_real_tools_and_failures_are_results_the_model_can_read(server: Server) -> None:
    assert _call(server, "add", {"a": 2, "b": 40}) == {"object": "tool.result", "name": "add", "content": "42",
                                                        "is_error": False}
    assert _call(server, "add", '{"a": 1, "b": 1}')["content"] == "2"  # as the model wrote the arguments
    garbled = _call(server, "add", "not json")  # the model's mistake too (tools.md)
    assert garbled["is_error"] and "are not JSON" in garbled["content"], garbled
    assert _call(server, "get_weather", None)["is_error"]  # null: no arguments, which its schema needs
    bad = _call(server, "add", {"a": 2, "b": "x"})
    assert bad["is_error"] and "fail its schema" in bad["content"] and "integer" in bad["content"]
    raised = _call(server, "explode", {"reason": "on purpose"})
    assert raised == {"object": "tool.result", "name": "explode", "content": "explode failed: ValueError: boom: "
                      "on purpose", "is_error": True}
    slow = _call(server, "stall")
    assert slow["is_error"] and "did not finish within 2 s" in slow["content"]
    # secrets of the server's environment never reach a client: a function's result is redacted, and a stdio
    # MCP server is started with only the SDK's safe subset of the environment
    assert _call(server, "secret")["content"] == "token=[TEST_API_TOKEN redacted]"
    assert _call(server, "leak")["content"] == "token=unset"
    # a failure's reason is redacted too: it may quote a key
    assert _call(server, "explode", {"reason": f"key={TOKEN}"})["content"] == \
        "explode failed: ValueError: boom: key=[TEST_API_TOKEN redacted]"


def test_bad_calls_are_http_errors(server: Server) -> None:
    r = httpx.post(f"{server.url}/tools/call", json={"name": "nope"}, timeout=10)
    assert r.status_code == 404 and r.json()["error"]["param"] == "name"
    assert "tools: get_weather" in r.json()["error"]["message"]
    for body, param in (({}, "name"), ({"name": "add", "arguments": 5}, "arguments"),
                        ({"name": "add", "arguments": [1, 2]}, "arguments")):
        r = httpx.post(f"{server.url}/tools/call", json=body, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    # a web page of another origin cannot make the server run a tool
    r = httpx.post(f"{server.url}/tools/call", json={"name": "add", "arguments": {"a": 1, "b": 2}},
                   headers={"Origin": "https://evil.example"}, timeout=10)
    assert r.status_code == 403


def test_a_round_trip_with_the_openai_client(server: Server) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")
    tools = [{k: v for k, v in t.items() if k != "source"}
             for t in httpx.get(f"{server.url}/tools", timeout=10).json()["data"] if t["function"]["name"] == "add"]
    messages: list[Any] = [{"role": "user", "content": "What is 17 + 25? Use the add tool."}]
    r = client.chat.completions.create(model="smollm2:135m", messages=messages, tools=tools, temperature=0,
                                       max_tokens=200, tool_choice="required", parallel_tool_calls=False)
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "add"
    result = _call(server, "add", call.function.arguments)
    args = json.loads(call.function.arguments)
    assert not result["is_error"] and result["content"] == str(args["a"] + args["b"])
    messages += [r.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": result["content"]}]
    r2 = client.chat.completions.create(model="smollm2:135m", messages=messages, tools=tools, temperature=0,
                                        max_tokens=30, tool_choice="none")
    assert r2.choices[0].finish_reason in ("stop", "length") and r2.choices[0].message.content


def test_a_dead_mcp_server_leaves_the_list_and_its_calls_fail_as_results(server: Server) -> None:
    # last in the file: it ends the module's MCP server
    crashed = _call(server, "crash")
    assert crashed["is_error"] and "failed" in crashed["content"]
    names = [t["function"]["name"] for t in httpx.get(f"{server.url}/tools", timeout=10).json()["data"]]
    assert "add" not in names and "get_weather" in names
    gone = _call(server, "add", {"a": 1, "b": 2})
    from localgen.tools.mcpconfig import one

    assert gone["is_error"] and gone["content"] == f"the MCP server {one(MCP).label} has gone: its tools are no " \
        "longer offered"


def test_a_stdio_mcp_server_killed_leaves_the_list_before_any_call_finds_it_gone(cli_env: dict[str, str],
                                                                                 tmp_path: Path) -> None:
    """docs/tools.md: a stdio MCP server that died is no longer listed; not only once a call has failed. A call
    to one of its tools then says its server has gone (not that no such tool was ever here)."""
    import os
    import signal
    import time

    pidfile = tmp_path / "pid"
    raw = f"{sys.executable} {ROOT / 'tests' / 'mcp_raw_server.py'} pidfile:{pidfile}"
    s = Server(cli_env, "-np", "1", "--ctx", "512", "--mcp", raw, "--functions", FUNCTIONS)
    try:
        names = [t["function"]["name"] for t in httpx.get(f"{s.url}/tools", timeout=10).json()["data"]]
        assert "add" in names
        os.kill(int(pidfile.read_text()), signal.SIGKILL)
        deadline = time.monotonic() + 30  # (the listing is read until the death is seen: no timing asserted)
        while "add" in names and time.monotonic() < deadline:
            time.sleep(0.1)
            names = [t["function"]["name"] for t in httpx.get(f"{s.url}/tools", timeout=10).json()["data"]]
        assert "add" not in names and "get_weather" in names
        gone = _call(s, "add", {"a": 1, "b": 2})
        assert gone["is_error"] and "has gone: its tools are no longer offered" in gone["content"], gone
    finally:
        assert s.stop() == 0


SLOW = '''import time


def slow(seconds: float) -> str:
    """Say so, then sleep `seconds`."""
    print("begun", flush=True)
    time.sleep(seconds)
    return f"slept {seconds:g}"
'''


def test_a_call_past_the_8_running_waits_its_turn(cli_env: dict[str, str], tmp_path: Path) -> None:
    """docs/tools.md: at most 8 calls at once; more wait. With 8 calls running within their timeout, a 9th (to
    the same tool) waits for a slot and answers; it was a 503 (`8 tool calls are still running`), as if they
    were stuck past it."""
    import concurrent.futures
    import time

    fns = tmp_path / "slow.py"
    fns.write_text(SLOW)
    s = Server(cli_env, "-np", "1", "--ctx", "512", "--functions", str(fns), "--tool-timeout", "600")
    try:
        with concurrent.futures.ThreadPoolExecutor(9) as pool:
            running = [pool.submit(_call, s, "slow", {"seconds": 8}) for _ in range(8)]
            deadline = time.monotonic() + 120  # a safety net: each call says when it runs
            while s.log().count("begun") < 8 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert s.log().count("begun") == 8
            ninth = _call(s, "slow", {"seconds": 0})
            assert ninth["content"] == "slept 0" and not ninth["is_error"], ninth
            assert all(f.result()["content"] == "slept 8" for f in running)
    finally:
        assert s.stop() == 0


def test_calls_stuck_past_their_timeout_hold_no_more_threads(server: Server) -> None:
    """Last but one: it leaves 8 of the `stall` tool's threads sleeping past --tool-timeout 2 (a thread cannot be
    stopped). While they run, a call is a 503, and the server's other routes still answer at once. 24 sent at once:
    a call that waited for a slot is refused once it gets one while 8 are stuck (each ran, 24 threads left stuck):
    at most 8 + 7 (the 8 in slots, each past its timeout after one started beside 7 stuck)."""
    import concurrent.futures

    def stall(_: int) -> httpx.Response:
        return httpx.post(f"{server.url}/tools/call", json={"name": "stall"}, timeout=60)

    with concurrent.futures.ThreadPoolExecutor(24) as pool:
        stalled = list(pool.map(stall, range(24)))
    # each timed out (or, once 8 were stuck with an earlier test's, was refused)
    assert all(r.status_code == 503 or "did not finish within 2 s" in r.json()["content"] for r in stalled)
    assert sum(r.status_code == 200 for r in stalled) <= 15, [r.text for r in stalled]
    r = httpx.post(f"{server.url}/tools/call", json={"name": "add", "arguments": {"a": 1, "b": 2}}, timeout=30)
    assert r.status_code == 503 and "tool calls are still running" in r.json()["error"]["message"], r.text
    assert httpx.get(f"{server.url}/v1/models", timeout=5).status_code == 200


def test_flags_that_cannot_work_are_refused_before_anything_starts(cli_in_process: Any) -> None:
    r = cli_in_process("serve", "--tool-timeout", "5")
    assert r.returncode == 2 and "--tool-timeout" in r.stderr and "--functions or --mcp" in r.stderr, r.stderr
    r = cli_in_process("serve", "--host", "0.0.0.0", "--functions", FUNCTIONS)
    assert r.returncode == 2 and "no API key" in r.stderr and "--api-key" in r.stderr, r.stderr
    # more web origins allowed, and no key: those pages could run the tools
    r = cli_in_process("serve", "--cors", "*", "--functions", FUNCTIONS)
    assert r.returncode == 2 and "more web origins allowed (*)" in r.stderr and "--api-key" in r.stderr, r.stderr
    r = cli_in_process("serve", "--functions", FUNCTIONS, "--functions", FUNCTIONS, "--port", "1")
    assert r.returncode == 1 and "two tools are named 'get_weather'" in r.stderr, r.stderr
    r = cli_in_process("serve", "--mcp", "'unclosed", "--port", "1")
    assert r.returncode == 2 and "is not a command line" in r.stderr, r.stderr


def test_tools_no_request_could_carry_are_refused_at_start(cli: Any, tmp_path: Any) -> None:
    """As run and chat refuse them (exit 2): more tools than one request takes (the chat page sends them all: every
    message was a 400), and a schema that cannot become a grammar (every request with the tools was a 400). A
    process with a bound: the old code served on."""
    many = tmp_path / "many.py"
    many.write_text("".join(f'def t{i}() -> str:\n    """Tool {i}."""\n    return "{i}"\n\n\n' for i in range(257)))
    r = cli("serve", "--functions", str(many), "--port", "18499", timeout=120)
    assert r.returncode == 2 and "offer 257 tools; a request takes at most 256" in r.stderr, r.stderr
    r = cli("serve", "--mcp", f"{MCP} --lookahead", "--port", "18499", timeout=120)
    assert r.returncode == 2 and "'s tool code:" in r.stderr and "lookahead" in r.stderr, r.stderr


LINGER = '''import time


def linger() -> str:
    """Say so, then sleep for two minutes."""
    print("lingering", flush=True)
    time.sleep(120)
    return "done"
'''


@pytest.mark.parametrize("force", [False, True], ids=["sigterm", "ctrl-c-twice"])
def test_a_tool_call_running_at_shutdown_ends_as_a_503_and_does_not_hold_the_exit(
        cli_env: dict[str, str], tmp_path: Any, force: bool) -> None:
    """serve.md's Stopping: a call still running after --drain-timeout (at once on a second Ctrl-C) ends with a
    503 in the API's shape, no traceback; its thread is abandoned (one log line) and the process exits 0 without
    waiting for the tool (it held the exit for the tool's whole sleep: 38 s of a 40 s call)."""
    import signal
    import threading
    import time

    fns = tmp_path / "linger.py"
    fns.write_text(LINGER)
    s = Server(cli_env, "-np", "1", "--ctx", "2048", "--functions", str(fns), "--tool-timeout", "600",
               "--drain-timeout", "0.5")
    got: dict[str, httpx.Response] = {}
    caller = threading.Thread(target=lambda: got.update(r=httpx.post(f"{s.url}/tools/call",
                                                                     json={"name": "linger"}, timeout=600)))
    try:
        caller.start()
        deadline = time.monotonic() + 60  # a safety net: the tool says when it runs
        while "lingering" not in s.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "lingering" in s.log()
        for sig in [signal.SIGINT, signal.SIGINT] if force else [signal.SIGTERM]:
            s.proc.send_signal(sig)
        assert s.proc.wait(timeout=60) == 0  # (the tool sleeps 120 s)
        caller.join(60)
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
    r = got["r"]
    assert r.status_code == 503 and r.headers["content-type"] == "application/json", r.text
    error = r.json()["error"]
    assert error["type"] == "server_error" and "shutting down" in error["message"] and "linger" in error["message"]
    log = s.log()
    assert "the tool call linger is abandoned" in log, log
    assert "Traceback" not in log and "timeout graceful shutdown exceeded" not in log, log


def test_an_mcp_tool_whose_name_a_request_cannot_carry_is_left_out_with_a_warning(cli_env: dict[str, str]) -> None:
    """MCP allows a name of 128 characters of any kind; a request's `tools` takes 1-64 of [A-Za-z0-9_.-]. GET /tools
    lists each tool as a request takes it, so the server's tools with other names are left out, each with one
    warning at start, and its other tools are offered: the listing, sent back as a request's tools, is a 200 (it
    was a 400 naming tools[0].function.name)."""
    s = Server(cli_env, "-np", "1", "--ctx", "2048", "--chat-template-file", str(QWEN), "--mcp", f"{MCP} --bad-names")
    try:
        listed = httpx.get(f"{s.url}/tools", timeout=10).json()["data"]
        assert [t["function"]["name"] for t in listed] == ["add", "leak", "crash"]
        tools = [{k: v for k, v in t.items() if k != "source"} for t in listed]
        r = httpx.post(f"{s.url}/v1/chat/completions", timeout=300, json={
            "messages": [{"role": "user", "content": "Hi"}], "tools": tools, "max_tokens": 1})
        assert r.status_code == 200, r.text
    finally:
        assert s.stop() == 0
    from localgen.tools.mcpconfig import one

    log, label = s.log(), one(f"{MCP} --bad-names").label
    for shown in ("'search_" + "x" * 73 + "'", "'a b\\n\"c'"):
        assert f"warning: the MCP server {label}'s tool {shown} is left out: a tool's name must be 1-64 ASCII " \
               "letters, digits, _ . or -" in log, log
