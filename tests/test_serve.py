"""`localgen serve` over loopback, driven by the real `openai` and `ollama` clients and raw HTTP: both APIs,
keys, streaming, batching, disconnects, a full queue, errors in each API's shape, keep-alive, shutdown."""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from localgen.engine.tokens import reusable_prefix
from tests.conftest import CLI, ROOT, InProcessCLI, default_sigint, fork_server, same_text_as_reference

KEY = "sk-local-test"
SERVE_GRID = (512, 2048)  # serve's pieces on a CPU: llama.cpp's n_ubatch 512, llama-server's n_batch 2048


def serve_process(env: dict[str, str], args: list[str], stderr: int) -> Any:
    """`localgen serve ARGS`, stdout a pipe and stderr `stderr`: forked by the session's fork server where the
    environment allows (as conftest's `cli` runs commands), else an interpreter started for it."""
    forks = fork_server(env)
    if forks is not None and forks.accepts(env):
        return forks.popen(["serve", *args], env, stderr, sigint=True)
    return subprocess.Popen([sys.executable, "-m", "localgen", "serve", *args], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL, preexec_fn=default_sigint)


class Server:
    """A `localgen serve` child process on a free loopback port (serve_process). Its stderr goes to a file that
    `proc.stderr` reads, not to a pipe: the server writes a line per request, and a pipe nobody reads until the
    end would fill (64 KiB) and block it."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.env = env
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        log = tempfile.NamedTemporaryFile(prefix="localgen-serve-", suffix=".log", delete=False)  # noqa: SIM115
        self.proc = serve_process(env, ["--port", str(self.port), *args], log.fileno())
        log.close()
        self.proc.stderr = open(log.name, "rb")  # noqa: SIM115  # its own offset: reads all, from the start
        os.unlink(log.name)  # the child's descriptor keeps the file until it exits
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 600  # a safety net: a slow start on busy cores is still a start
        # one client for the polls: each httpx.get makes its own, its TLS context loaded again (60 ms of CPU, ten
        # times a second, taken from the server starting on the same core)
        with httpx.Client(timeout=1) as client:
            while time.monotonic() < deadline:
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if self.proc.poll() is not None:
                    raise RuntimeError(self.proc.stderr.read().decode() if self.proc.stderr else "died")
                time.sleep(0.1)
        raise RuntimeError("the server did not start")

    def log(self) -> str:
        """All the server has written so far, from its start; where `proc.stderr.read()` goes on from is kept."""
        assert self.proc.stderr is not None
        at = self.proc.stderr.tell()
        self.proc.stderr.seek(0)
        try:
            return self.proc.stderr.read().decode(errors="replace")
        finally:
            self.proc.stderr.seek(at)

    def access(self, request_id: str, timeout: float = 60) -> str:
        """The access line of one request (its X-Request-Id), waited for: it is written after the response's last
        byte, so it can reach the log a moment after the client has the answer. "" where none comes in time."""
        end = time.monotonic() + timeout
        while True:
            line = next((ln for ln in self.log().splitlines() if ln.endswith(f"id={request_id}")), None)
            if line is not None or time.monotonic() > end:
                return line or ""
            time.sleep(0.05)

    def health(self) -> dict[str, Any]:
        return dict(httpx.get(f"{self.url}/health", timeout=5).json()["models"]["smollm2:135m"])

    def stop(self) -> int:
        """SIGTERM, and the exit status; where it is not 0 (a server that had ended by itself, with 1), the end of
        its log goes to stderr, which pytest shows with the test that failed on it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=300)
        if code != 0:
            print(f"serve ended with {code}; the end of its log:\n{self.log()[-4000:]}", file=sys.stderr)
        return code


@pytest.fixture(scope="module")
def server(cli_env: dict[str, str]) -> Iterator[Server]:
    s = Server(cli_env, "--api-key", KEY, "-np", "4", "--ctx", "1024")
    yield s
    assert s.stop() == 0


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


def test_openai_client_streaming_usage_and_keys(server: Server) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY)
    r = client.chat.completions.create(model="smollm2:135m", messages=[{"role": "user", "content": "Name a colour."}],
                                       max_tokens=8, temperature=0)
    assert r.choices[0].message.content and r.usage is not None and r.usage.completion_tokens <= 8
    assert r.usage.prompt_tokens > 5
    chunks = list(client.chat.completions.create(
        model="smollm2:135m", messages=[{"role": "user", "content": "Name a colour."}], max_tokens=8, temperature=0,
        stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    ids = [m.id for m in client.models.list().data]
    assert ids[0] == "smollm2:135m" and "gemma3:270m" in ids  # the default first, then every model here
    bad = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong")
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="smollm2:135m", messages=[{"role": "user", "content": "hi"}])
    assert httpx.get(f"{server.url}/health").status_code == 200, "/health needs no key"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the child's /proc maps")
def test_serve_runs_on_uvloop_and_httptools(server: Server) -> None:
    """uvicorn picks its C event loop and HTTP parser when they are installed; the install brings them."""
    r = httpx.post(f"{server.url}/v1/completions", headers=_auth(),
                   json={"model": "smollm2:135m", "prompt": "Hi", "max_tokens": 1})
    assert r.status_code == 200
    maps = Path(f"/proc/{server.proc.pid}/maps").read_text()
    assert "/uvloop/loop." in maps and "/httptools/parser/parser." in maps


def test_timings_logprobs_and_response_format(server: Server) -> None:
    r = httpx.post(f"{server.url}/v1/chat/completions", headers=_auth(), timeout=60, json={
        "model": "smollm2:135m", "messages": [{"role": "user", "content": "Give me a person as JSON."}],
        "max_tokens": 40, "temperature": 0, "logprobs": True, "top_logprobs": 2,
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {
            "type": "object", "properties": {"name": {"type": "string", "maxLength": 10}}, "required": ["name"]}}},
    })
    assert r.status_code == 200, r.text
    doc = r.json()
    assert isinstance(json.loads(doc["choices"][0]["message"]["content"])["name"], str)
    t = doc["timings"]
    assert t["predicted_n"] == doc["usage"]["completion_tokens"] and t["prompt_n"] + t["cache_n"] == \
        doc["usage"]["prompt_tokens"] and t["predicted_per_second"] > 0
    lps = doc["choices"][0]["logprobs"]["content"]
    assert len(lps) == doc["usage"]["completion_tokens"] and all(len(x["top_logprobs"]) == 2 for x in lps)


def _token_bytes(key: str) -> bytes:
    """A legacy completions token as bytes: its text, or OpenAI's bytes:\\xe4\\xbd for a part of a character."""
    return bytes.fromhex(key[6:].replace("\\x", "")) if key.startswith("bytes:") else key.encode()


def test_logprobs_bytes_of_tokens_that_are_parts_of_characters(server: Server, cli: CLI) -> None:
    """Chat's `bytes` are each token's own (they were U+FFFD's [239, 191, 189] for a part of a character), and
    the legacy `tokens` and `top_logprobs` keys name such a part as OpenAI does, bytes:\\xf0\\x9f (the
    alternatives that were each U+FFFD were one key)."""
    schema = {"type": "string", "pattern": "^😀🎉 你好$"}
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    r = httpx.post(f"{server.url}/v1/chat/completions", headers=_auth(), timeout=120, json={
        "model": "smollm2:135m", "messages": [{"role": "user", "content": "Emoji."}], "max_tokens": 16,
        "temperature": 0, "logprobs": True, "top_logprobs": 3, "response_format": fmt})
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["message"]["content"]
    assert json.loads(content) == "😀🎉 你好"
    lps = r.json()["choices"][0]["logprobs"]["content"]
    assert b"".join(bytes(t["bytes"]) for t in lps) == content.encode()
    parts = [one for one in [*lps, *(a for t in lps for a in t["top_logprobs"])] if "\ufffd" in one["token"]]
    assert parts and all(one["bytes"] != [239, 191, 189] for one in parts), parts
    r = httpx.post(f"{server.url}/v1/completions", headers=_auth(), timeout=120, json={
        "model": "smollm2:135m", "prompt": "Emoji:", "max_tokens": 16, "temperature": 0, "logprobs": 3,
        "response_format": fmt})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    tokens = choice["logprobs"]["tokens"]
    assert b"".join(_token_bytes(t) for t in tokens) == choice["text"].encode() and json.loads(choice["text"])
    assert any(t.startswith("bytes:") for t in tokens), tokens
    assert all(len(top) == 3 for top in choice["logprobs"]["top_logprobs"]), choice["logprobs"]["top_logprobs"]
    # run --endpoint keeps the server's bytes (it took the token's text, U+FFFD, and encoded it again)
    r2 = CLI({**cli.env, "THE_KEY": KEY})("run", "--endpoint", server.url, "--api-key-env", "THE_KEY", "-m",
                                          "smollm2:135m", "--json", "--logprobs", "2", "-n", "16", "--temperature",
                                          "0", "-j", json.dumps(schema), "-p", "Emoji.")
    assert r2.returncode == 0, r2.stderr
    doc = json.loads(r2.stdout)
    assert b"".join(bytes(t["bytes"]) for t in doc["logprobs"]) == doc["text"].encode() and json.loads(doc["text"])


def test_greedy_answer_is_runs_answer(server: Server, cli: CLI) -> None:
    prompt = "The capital of Italy is"
    alone = cli("run", "--raw", "-p", prompt, "-n", "16", "--temperature", "0", "--ctx", "1024").stdout.rstrip("\n")
    r = httpx.post(f"{server.url}/v1/completions", headers=_auth(), timeout=60,
                   json={"model": "smollm2:135m", "prompt": prompt, "max_tokens": 16, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == alone


def test_ollama_client_chat_and_generate(server: Server) -> None:
    import ollama

    client = ollama.Client(host=server.url, headers=_auth())
    asked = time.perf_counter_ns()
    chat = client.chat(model="smollm2:135m", messages=[{"role": "user", "content": "Name a colour."}],
                       options={"num_predict": 8, "temperature": 0})
    wall = time.perf_counter_ns() - asked
    assert chat["message"]["content"] and chat["done"] and 1 < chat["eval_count"] <= 8
    assert chat["prompt_eval_count"] > 5 and chat["eval_duration"] > 0
    # the durations are nanoseconds (Ollama's unit): within the request's own time as the client counts it, and
    # of its size (in microseconds they would be a thousandth of it); decoding 7 tokens is more than 1% of the answer
    assert chat["prompt_eval_duration"] + chat["eval_duration"] <= chat["total_duration"] <= wall, (chat, wall)
    assert chat["total_duration"] >= wall // 10 and chat["eval_duration"] >= chat["total_duration"] // 100, (chat, wall)
    parts = list(client.generate(model="smollm2:135m", prompt="Hello", stream=True,
                                 options={"num_predict": 6, "temperature": 0}))
    assert parts[-1]["done"] and "".join(p["response"] for p in parts)
    streamed = list(client.chat(model="smollm2:135m", messages=[{"role": "user", "content": "Name a colour."}],
                                options={"num_predict": 8, "temperature": 0}, stream=True))
    assert "".join(p["message"]["content"] for p in streamed) == chat["message"]["content"]
    assert [m.model for m in client.list().models][:1] == ["smollm2:135m"]
    assert client.ps().models and client.show("smollm2:135m").details.quantization_level == "Q4_1"
    import localgen

    assert httpx.get(f"{server.url}/api/version", headers=_auth()).json() == {"version": "0.12.0",
                                                                             "localgen": localgen.__version__}


def test_ollama_client_streams_an_answer_holding_unicode_line_separators(server: Server) -> None:
    """U+2028, U+2029 and U+0085 are line ends to the ollama client's line reader (httpx's iter_lines, as
    str.splitlines), and JSON leaves them unescaped: a streamed line was split mid-string, a JSONDecodeError. The
    NDJSON lines escape them (as Go's encoding/json escapes U+2028 and U+2029)."""
    import ollama

    client = ollama.Client(host=server.url, headers=_auth())
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^x\u2028y\u2029z\u0085w$"}},
              "required": ["a"]}
    ask: dict[str, Any] = {"model": "smollm2:135m", "format": schema, "options": {"num_predict": 40, "temperature": 0}}
    messages = [{"role": "user", "content": "Give JSON."}]
    whole = client.chat(messages=messages, **ask)["message"]["content"]
    assert json.loads(whole) == {"a": "x\u2028y\u2029z\u0085w"}, whole
    streamed = "".join(p["message"]["content"] for p in client.chat(messages=messages, stream=True, **ask))
    assert streamed == whole
    generated = "".join(p["response"] for p in client.generate(prompt="Give JSON.", stream=True, **ask))
    assert json.loads(generated) == {"a": "x\u2028y\u2029z\u0085w"}, generated
    with httpx.stream("POST", f"{server.url}/api/chat", headers=_auth(), timeout=120,
                      json={**ask, "messages": messages}) as r:
        raw = r.read()
    assert not {"\u2028", "\u2029", "\x85"} & set(raw.decode())  # escaped: \\u2028 on the wire


def test_concurrent_requests_are_decoded_together(server: Server) -> None:
    before = server.health()
    results: list[int] = []

    def one(i: int) -> None:
        r = httpx.post(f"{server.url}/v1/completions", headers=_auth(), timeout=120, json={
            "model": "smollm2:135m", "prompt": f"Story {i}: once upon a time", "max_tokens": 48,
            "temperature": 0.8, "seed": i, "ignore_eos": True})
        results.append(r.json()["usage"]["completion_tokens"])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = server.health()
    assert sorted(results) == [48] * 4, "all four answered in full"
    calls, rows = after["decode_calls"] - before["decode_calls"], after["rows"] - before["rows"]
    assert rows / calls > 1.5, f"{rows} rows in {calls} calls: the requests shared decode calls"


def test_errors_have_each_apis_shape_and_status(server: Server) -> None:
    u, h = server.url, _auth()
    r = httpx.post(f"{u}/v1/chat/completions", headers={**h, "Content-Type": "application/json"}, content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(f"{u}/v1/chat/completions", headers=h, json={"model": "nope", "messages": [
        {"role": "user", "content": "x"}]})
    assert r.status_code == 404 and "not served here" in r.json()["error"]["message"]
    r = httpx.post(f"{u}/v1/chat/completions", headers=h, json={"model": "smollm2:135m", "temperature": 9,
                                                                "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and "temperature must be within" in r.json()["error"]["message"]
    r = httpx.post(f"{u}/v1/chat/completions", headers=h, json={"model": "smollm2:135m", "top_k": 2.5,
                                                                "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and "top_k must be an integer" in r.json()["error"]["message"]
    # a range in plain numbers, and the field as the client spelled it (Ollama's num_predict is not max_tokens)
    r = httpx.post(f"{u}/v1/chat/completions", headers=h, json={"model": "smollm2:135m", "top_k": -5,
                                                                "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["message"] == "top_k must be at least 0, not -5"
    r = httpx.post(f"{u}/api/generate", headers=h, json={"model": "smollm2:135m", "prompt": "x",
                                                         "options": {"num_predict": -5}})
    assert r.status_code == 400 and r.json()["error"] == "options.num_predict must be at least -1, not -5"
    r = httpx.post(f"{u}/v1/chat/completions", headers=h, json={"model": "smollm2:135m", "n": 2,
                                                                "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    r = httpx.post(f"{u}/v1/completions", headers=h, timeout=60,
                   json={"model": "smollm2:135m", "prompt": "word " * 1500})
    assert r.status_code == 400 and "context window" in r.json()["error"]["message"]
    assert r.json()["error"]["code"] == "context_length_exceeded"  # OpenAI's code, which Codex reads to compact
    r = httpx.post(f"{u}/v1/messages", headers=h, timeout=60, json={"model": "smollm2:135m", "max_tokens": 8,
                                                                     "messages": [{"role": "user",
                                                                                   "content": "word " * 1500}]})
    assert r.status_code == 400, r.text  # Anthropic's words, which Claude Code reads to compact
    assert re.fullmatch(r"prompt is too long: \d+ tokens > 1024 maximum", r.json()["error"]["message"]), r.text
    for path in ("/v1/chat/completions", "/api/chat"):  # a message that is not an object
        r = httpx.post(f"{u}{path}", headers=h, json={"model": "smollm2:135m", "messages": ["hi"]})
        assert r.status_code == 400, r.text
    r = httpx.post(f"{u}/api/chat", headers=h, json={"model": "nope", "messages": []})
    assert r.status_code == 404 and isinstance(r.json()["error"], str)
    r = httpx.post(f"{u}/api/generate", headers=h, json={"model": "smollm2:135m", "prompt": "x",
                                                         "options": {"bogus": 1}})
    assert r.status_code == 400 and "unknown options" in r.json()["error"]
    bad = {"type": "object", "properties": {"a": {"type": "strng"}}}  # no JSON Schema: refused, not "anything"
    r = httpx.post(f"{u}/v1/chat/completions", headers=h, json={
        "model": "smollm2:135m", "messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": bad}}})
    assert r.status_code == 400 and "not valid at properties/a/type" in r.json()["error"]["message"], r.text


def test_a_full_queue_is_503_and_a_disconnect_frees_the_slot(cli_env: dict[str, str]) -> None:
    s = Server(cli_env, "-np", "1", "--max-queue", "0", "--ctx", "2048")
    try:
        body = {"model": "smollm2:135m", "prompt": "Once", "max_tokens": 1500, "ignore_eos": True, "stream": True}
        with httpx.Client(timeout=60) as client, client.stream("POST", f"{s.url}/v1/completions", json=body) as r:
            lines = r.iter_lines()
            while not next(lines).startswith("data:"):
                pass  # generating now, in the only slot
            busy = httpx.post(f"{s.url}/v1/completions", json={**body, "stream": False, "max_tokens": 2}, timeout=30)
            assert busy.status_code == 503 and busy.json()["error"]["type"] == "server_error"
        # the client went away mid-stream: the slot is free again at once, long before 1,500 tokens
        deadline = time.monotonic() + 20
        while s.health()["running"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert s.health()["running"] == 0
        ok = httpx.post(f"{s.url}/v1/completions", json={**body, "stream": False, "max_tokens": 2}, timeout=30)
        assert ok.status_code == 200
    finally:
        assert s.stop() == 0


def test_keep_alive_unloads_and_the_next_request_loads_again(cli_env: dict[str, str]) -> None:
    """/api/ps's expires_at (`ollama ps`'s "Until") is the keep-alive from the last request's end, exact as soon
    as its answer came (it was the one before, until the worker's next idle tick)."""
    s = Server(cli_env, "--keep-alive", "3s")
    try:
        import ollama

        client = ollama.Client(host=s.url)
        first = client.generate(model="smollm2:135m", prompt="Hi", options={"num_predict": 2})
        assert first["done"]
        time.sleep(1)  # idle, still loaded
        asked = time.time()
        assert client.generate(model="smollm2:135m", prompt="Hi", options={"num_predict": 2})["done"]
        (ps,) = client.ps().models
        read = time.time()
        assert ps.expires_at is not None
        assert asked + 3 <= ps.expires_at.timestamp() <= read + 3, (asked, ps.expires_at.timestamp(), read)
        deadline = time.monotonic() + 20
        while client.ps().models and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not client.ps().models and s.health()["loaded"] is False, "unloaded after 3 s idle"
        again = client.generate(model="smollm2:135m", prompt="Hi", options={"num_predict": 2})
        assert again["done"] and again["load_duration"] > 0, "loaded again for this request"
        gone = client.generate(model="smollm2:135m", prompt="", keep_alive=0)
        assert gone["done_reason"] == "unload" and not client.ps().models
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_finishes_the_request_in_flight_and_exits_0(cli_env: dict[str, str], tmp_path: Path,
                                                            sig: int) -> None:
    """serve.md, Stopping: SIGHUP (the terminal closed) is SIGTERM: the request in flight finishes, exit 0 (SIGHUP
    killed it at once with 129, its stream cut and its prefixes not written)."""
    s = Server(cli_env, "-np", "2", "--drain-timeout", "120")  # room for 48 tokens however busy the cores are
    lines: list[str] = []
    first_token = threading.Event()

    def stream() -> None:
        # 48 tokens: well inside the time a stopping server gives the requests in flight
        body = {"model": "smollm2:135m", "prompt": "Once", "max_tokens": 48, "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", f"{s.url}/v1/completions", json=body, timeout=600) as r:
                for ln in r.iter_lines():
                    if ln.startswith("data:"):
                        lines.append(ln)
                        first_token.set()
        finally:
            first_token.set()  # a failed request must not leave the test waiting

    t = threading.Thread(target=stream)
    t.start()
    assert first_token.wait(600) and lines, "the request is running (its first token came back)"
    s.proc.send_signal(sig)
    assert "data: [DONE]" not in lines, "the request was still in flight when the signal came"
    time.sleep(0.05)
    s.proc.send_signal(sig)  # a service manager's repeat changes nothing (serve.md): it still finishes
    assert "data: [DONE]" not in lines, "the request was still in flight when the second signal came"
    t.join(600)
    assert s.proc.wait(timeout=600) == 0
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2].removeprefix("data:"))
    assert "error" not in last, "the stream in flight was finished, not cut"
    assert last["choices"][0]["finish_reason"] == "length" and last["timings"]["predicted_n"] == 48


@pytest.mark.parametrize(("sig", "json_lines", "in_exec"),
                         [(signal.SIGTERM, False, False), (signal.SIGHUP, False, False),
                          (signal.SIGTERM, True, False), (signal.SIGTERM, False, True)],
                         ids=["SIGTERM", "SIGHUP", "SIGTERM-json", "SIGTERM-in-exec"])
def test_sigterm_before_the_server_listens_says_so_and_exits_128_plus_its_number(
        cli_env: dict[str, str], tmp_path: Path, sig: int, json_lines: bool, in_exec: bool) -> None:
    """A SIGTERM or SIGHUP while serve starts (here while its --functions file is imported, before any model loads
    or the port is taken) stops it with one line and the signal's conventional status, as Ctrl-C there says
    `interrupted` and exits 130; it ended silently, killed by the signal (-15). One that lands inside exec() of a
    string (as a dataclass is made) exits 143 too (CPython killed itself with SIGINT, -2)."""
    mark = tmp_path / "importing"
    tools = tmp_path / "slowtools.py"
    wait = f"pathlib.Path({str(mark)!r}).write_text('x')\ntime.sleep(600)"
    tools.write_text("import pathlib, time\n" + (f"exec({wait!r})" if in_exec else wait) + "\n\n\n"
                     "def add(a: int, b: int) -> int:\n    \"\"\"Add two numbers.\"\"\"\n    return a + b\n")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    args = ["--port", str(port), "--functions", str(tools), *(["--log-format", "json"] if json_lines else [])]
    proc = serve_process(cli_env, args, subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300  # a safety net
        while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mark.exists(), "serve is importing its tools"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    said = err.decode()
    name = signal.Signals(sig).name
    assert proc.returncode == 128 + sig, said
    if json_lines:
        doc = json.loads(said)
        assert doc["event"] == "stopped" and doc["exit_code"] == 128 + sig, said
        assert doc["message"] == f"stopped by {name} before the server was listening"
    else:
        assert said == f"localgen serve: stopped by {name} before the server was listening\n", said


@pytest.mark.parametrize("where", ["config", "startup"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=["SIGTERM", "SIGHUP", "SIGINT"])
def test_sigterm_after_serve_takes_it_but_before_it_listens_says_so_and_exits_128_plus_its_number(
        cli_in_process: InProcessCLI, monkeypatch: pytest.MonkeyPatch, sig: int, where: str) -> None:
    """A SIGTERM or SIGHUP that lands once serve's own handler has taken over but before uvicorn listens (as
    uvicorn loads its config, or within its own start-up) stops it as one before does: its line and 128 + its
    number (uvicorn listened, skipped its loop and ended with exit 0, saying nothing); a Ctrl-C there says
    `interrupted`, exit 130 (it was a silent 130)."""
    import uvicorn

    if where == "config":
        real_load = uvicorn.Config.load

        def load(self: Any) -> None:
            signal.raise_signal(sig)
            real_load(self)

        monkeypatch.setattr(uvicorn.Config, "load", load)
    else:
        real_startup = uvicorn.Server.startup

        async def startup(self: Any, sockets: Any = None) -> None:
            signal.raise_signal(sig)
            await real_startup(self, sockets)

        monkeypatch.setattr(uvicorn.Server, "startup", startup)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    r = cli_in_process("serve", "-m", "smollm2:135m", "--ctx", "512", "-np", "1", "--port", str(port))
    assert r.returncode == 128 + sig, r.stderr
    if sig == signal.SIGINT:
        assert r.stderr.endswith("interrupted\n") and "before the server was listening" not in r.stderr, r.stderr
    else:
        name = signal.Signals(sig).name
        assert f"localgen serve: stopped by {name} before the server was listening\n" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr


def test_sigterm_again_and_again_while_the_server_stops_still_exits_0(cli_env: dict[str, str]) -> None:
    """A service manager or a script that repeats SIGTERM while the server finishes (its workers stopping, its
    prefixes written) does not kill it half-way: exit 0, as after one (serve.md, Stopping). It was killed by the
    signal (-15) when one came after uvicorn had given SIGTERM back to its default."""
    import time

    s = Server(cli_env, "-np", "1", "--ctx", "512")
    r = httpx.post(f"{s.url}/v1/completions", json={"model": "smollm2:135m", "prompt": "Once", "max_tokens": 4},
                   timeout=600)
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 600  # a safety net
    while s.proc.poll() is None and time.monotonic() < deadline:
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.005)
    assert s.proc.wait(timeout=60) == 0
    assert s.proc.stderr is not None and "Traceback" not in s.proc.stderr.read().decode()


def test_serve_usage_errors(cli_env: dict[str, str], cli_in_process: InProcessCLI, tmp_path: Path) -> None:
    # the refusals come before any model loads: in this process
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = cli_in_process("serve", "--port", str(port))
        assert r.returncode == 1 and "cannot listen on 127.0.0.1" in r.stderr and r.stderr.count("\n") == 1
        # a bad flag is a usage error first, whatever holds the port
        r = cli_in_process("serve", "--port", str(port), "--cache-ram", "lots")
        assert r.returncode == 2 and "--cache-ram" in r.stderr and "cannot listen" not in r.stderr, r.stderr
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        free = str(s.getsockname()[1])
    err_r, err_w = os.pipe()
    public = serve_process(cli_env, ["--host", "0.0.0.0", "--port", free], err_w)
    os.close(err_w)
    with open(err_r, "rb") as stderr:
        first = stderr.readline().decode()
        public.send_signal(signal.SIGTERM)
        public.wait(timeout=60)
    assert "no API key" in first and "anyone who can reach this port" in first
    empty = tmp_path / "key.txt"
    empty.write_text("\n")
    r = cli_in_process("serve", "--api-key-file", str(empty))
    assert r.returncode == 2 and "is empty" in r.stderr
    for bad in ("lots", "-2", "1.5X"):
        r = cli_in_process("serve", "--cache-ram", bad)
        assert r.returncode == 2 and "--cache-ram" in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_serve_sizes_say_what_they_mean(cli_in_process: InProcessCLI) -> None:
    """serve.md: --max-memory with no room for any model is a usage error before the port (it was exit 1,
    after the model resolved, with a budget of "-"); a plain number given to --cache-ram or --cache-disk is
    MiB, 1.5 too (it was 1 byte, and 0.5 turned the store off)."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        for bad in ("0", "0.5", "1000"):
            r = cli_in_process("serve", "--port", port, "--max-memory", bad)
            assert r.returncode == 2 and "--max-memory" in r.stderr and "no room" in r.stderr, r.stderr
            assert r.stderr.count("\n") == 1, r.stderr
    from localgen.cli.serve.checks import _cache_disk, _cache_ram

    assert _cache_disk("1.5") == _cache_ram("1.5") == 3 << 19
    assert _cache_disk("0.5") == 1 << 19 and _cache_disk("1") == 1 << 20 and _cache_disk("64K") == 64 << 10
    assert _cache_disk("0") == _cache_ram("0") == 0 and _cache_ram("4096") == 4 << 30


@pytest.mark.parametrize(("ram", "cache_ram"), [(16 << 30, 4 << 30), (32 << 30, 8 << 30), (64 << 30, 8 << 30),
                                                (None, 8 << 30)])
def test_cache_ram_auto_is_8_gib_or_a_quarter_of_ram_whichever_is_less(monkeypatch: pytest.MonkeyPatch,
                                                                        ram: int | None, cache_ram: int) -> None:
    """caches.md and configuration.md: --cache-ram's default (auto) is min(8 GiB, a quarter of RAM). Where the RAM's
    size is not known, 8 GiB: no doc says so; this case pins the implementation (checks._cache_ram)."""
    from localgen import hardware
    from localgen.cli.serve.checks import _cache_ram

    monkeypatch.setattr(hardware, "total_ram_bytes", lambda: ram)
    assert _cache_ram("auto") == _cache_ram(" AUTO ") == cache_ram


def test_max_memory_by_default_is_90_percent_of_ram_without_offload(monkeypatch: pytest.MonkeyPatch) -> None:
    """serve.md: --max-memory's default is 90 % of this machine's RAM (its GPUs' memory only when offloading)."""
    from localgen import hardware
    from localgen.serve.residency import default_budget

    monkeypatch.setattr(hardware, "total_ram_bytes", lambda: 10 << 30)
    assert default_budget(False) == 9 << 30


def test_a_disk_cache_that_cannot_work_says_so(cli_env: dict[str, str]) -> None:
    """caches.md: --cache-disk needs the prompt cache in RAM; with --cache-ram 0, a size given to --cache-disk
    says in one warning line that it is off (the default says nothing)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = str(s.getsockname()[1])
    err_r, err_w = os.pipe()
    p = serve_process(cli_env, ["--port", free, "--cache-ram", "0", "--cache-disk", "1G"], err_w)
    os.close(err_w)
    with open(err_r, "rb") as stderr:
        first = stderr.readline().decode()
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)
    assert first == "warning: --cache-disk is off: it needs the prompt cache in RAM, and --cache-ram is 0\n"


def test_a_growing_conversation_reuses_its_slot(server: Server) -> None:
    conv = [{"role": "system", "content": "You are terse. " * 60}, {"role": "user", "content": "Name a colour."}]
    body = {"model": "smollm2:135m", "max_tokens": 6, "temperature": 0}
    first = httpx.post(f"{server.url}/v1/chat/completions", headers=_auth(), timeout=60,
                       json={**body, "messages": conv}).json()
    conv += [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
             {"role": "user", "content": "Another one."}]
    second = httpx.post(f"{server.url}/v1/chat/completions", headers=_auth(), timeout=60,
                        json={**body, "messages": conv}).json()
    t = second["timings"]
    # turn 1's prompt but the rows a fresh evaluation computes otherwise (engine/tokens.py): what serve keeps
    p1, p2 = first["usage"]["prompt_tokens"], second["usage"]["prompt_tokens"]
    assert t["cache_n"] == reusable_prefix(p1, p1, p2, *SERVE_GRID), "turn 2 evaluated little more than turn 1 had not"
    assert t["prompt_n"] < second["usage"]["prompt_tokens"] // 2


def test_a_conversation_whose_slot_was_taken_comes_back_from_host_memory(cli_env: dict[str, str]) -> None:
    """One slot, two conversations taking turns: each turn takes the slot from the other conversation, whose
    KV state goes to host memory (--cache-ram, MiB as llama-server's) and comes back for its next turn."""
    import openai

    s = Server(cli_env, "-np", "1", "--ctx", "1024", "--cache-ram", "64")
    try:
        assert s.health()["prompt_cache"]["limit_bytes"] == 64 << 20
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="none")
        # 20 times: 124 tokens a conversation, past the 100 asserted below and the host cache's 64-token least
        convs = [[{"role": "system", "content": f"You are assistant {name}. " + "Answer tersely. " * 20},
                  {"role": "user", "content": "Name a colour."}] for name in ("Ada", "Bob")]
        firsts = []
        for conv in convs:
            r = client.chat.completions.create(model="smollm2:135m", messages=conv, max_tokens=4, temperature=0)
            firsts.append(r.usage.prompt_tokens if r.usage else 0)
            conv += [{"role": "assistant", "content": r.choices[0].message.content or ""},
                     {"role": "user", "content": "Another one."}]
        again = client.chat.completions.with_raw_response.create(model="smollm2:135m", messages=convs[0],
                                                                 max_tokens=4, temperature=0)
        doc = json.loads(again.text)
        timings, p2 = doc["timings"], doc["usage"]["prompt_tokens"]
        kept = reusable_prefix(firsts[0], firsts[0], p2, *SERVE_GRID)
        assert timings["cache_n"] == kept > 64 and firsts[0] > 100, "Ada's first turn came back from host memory"
        cache = s.health()["prompt_cache"]
        assert cache["limit_bytes"] == 64 << 20 and cache["loads"] == 1 and cache["saves"] == 2
        assert cache["loaded_tokens"] == timings["cache_n"] and 0 < cache["bytes"] <= 64 << 20
    finally:
        assert s.stop() == 0


def test_an_exact_request_gets_runs_answer_while_others_stream(server: Server, cli: CLI) -> None:
    """The server batches for throughput here (health says so); a request that asks for `exact` gets the
    answer `run` gives alone, even while other streams run beside it."""
    import ollama
    import openai

    health = server.health()
    assert health["batching"] == "throughput" and health["batching_why"].startswith("every request batched"), health
    page = (ROOT / "docs" / "api.md").read_text().splitlines()
    row = next(line for line in page if line.startswith("| `GET /health`"))
    listed = re.sub(r"\([^)]*\)", "", row.split("per model asked for so far:")[1].split("; `residency`")[0])
    assert re.findall(r"`(\w+)`", listed) == list(health), "api.md lists /health's fields for a model, in order"
    question = "What is the capital of France?"
    alone = cli("run", "-p", question, "-n", "16", "--temperature", "0", "--ctx", "1024").stdout.rstrip("\n")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY)
    busy = [threading.Thread(target=lambda i=i: client.completions.create(
        model="smollm2:135m", prompt=f"Story {i}:", max_tokens=40, temperature=0.8, seed=i,
        extra_body={"ignore_eos": True})) for i in range(2)]
    for t in busy:
        t.start()
    got = client.chat.completions.create(model="smollm2:135m", messages=[{"role": "user", "content": question}],
                                         max_tokens=16, temperature=0, extra_body={"exact": True})
    via_ollama = ollama.Client(host=server.url, headers=_auth()).chat(
        model="smollm2:135m", messages=[{"role": "user", "content": question}],
        options={"num_predict": 16, "temperature": 0, "exact": True})  # type: ignore[typeddict-unknown-key]
    for t in busy:
        t.join()
    assert got.choices[0].message.content == alone and via_ollama["message"]["content"] == alone
    bad = httpx.post(f"{server.url}/v1/chat/completions", headers=_auth(), timeout=30, json={
        "model": "smollm2:135m", "messages": [{"role": "user", "content": "hi"}], "exact": "yes"})
    assert bad.status_code == 400 and "exact" in bad.json()["error"]["message"]


def test_the_start_up_line_says_which_batching_mode_and_why(server: Server, cli_env: dict[str, str]) -> None:
    # the defaults: the module's server, whose flags leave batching and the prompt cache alone (its log read
    # from the start without moving the file's offset)
    assert server.proc.stderr is not None and server.health()["prompt_cache"] is not None
    said = os.pread(server.proc.stderr.fileno(), 1 << 20, 0).decode()
    assert "throughput batching: every request batched; exactness would cost" in said
    assert "4 slots per model · prompt cache in RAM: up to " in said
    from localgen import hardware
    from localgen.units import format_bytes

    # serve.md: at most 3 models (3 per GPU when offloading) or 90 % of the RAM (plus the GPUs' memory when
    # offloading; on Apple Silicon no more than Metal may use, the unified GPU's total): -ngl's default offloads
    # whenever there is a GPU, so this holds on a machine with one or without
    gpus = hardware.gpus()
    discrete = [g.total or 0 for g in gpus if not g.unified]
    memory = min([int(((hardware.total_ram_bytes() or 0) + sum(discrete)) * 0.9),
                  *[g.total for g in gpus if g.unified and g.total]])
    assert f"· at most {3 * max(1, len(discrete))} models or {format_bytes(memory)} loaded\n" in said, said
    s = Server(cli_env, "-np", "2", "--ctx", "512", "--exact", "--cache-ram", "0")
    off = s.health()["prompt_cache"] is None
    assert s.stop() == 0
    assert s.proc.stderr is not None
    said = s.proc.stderr.read().decode()
    assert "exact batching: --exact" in said and "2 slots per model · no prompt cache in RAM" in said and off



# ---- Anthropic's Messages API ------------------------------------------------------------------------------

def test_anthropic_client_whole_streamed_counted_and_keyed(server: Server) -> None:
    """The real `anthropic` SDK: the same greedy text as /v1/chat/completions, whole and streamed, usage that
    adds up, count_tokens equal to the prompt's tokens, x-api-key, and a claude-* name served by the one model."""
    import anthropic
    import openai

    ask = [{"role": "user", "content": "Name a colour."}]
    want = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY).chat.completions.create(
        model="smollm2:135m", messages=ask, max_tokens=8, temperature=0)  # type: ignore[arg-type]
    client = anthropic.Anthropic(base_url=server.url, api_key=KEY)
    r = client.messages.create(model="smollm2:135m", max_tokens=8, messages=ask,  # type: ignore[arg-type]
                               system="You are a helpful AI assistant named SmolLM, trained by Hugging Face",
                               extra_body={"temperature": 0})
    assert [b.type for b in r.content] == ["text"] and r.role == "assistant" and r.id.startswith("msg_")
    assert r.content[0].text == want.choices[0].message.content  # type: ignore[union-attr]
    assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 8
    assert want.usage is not None
    assert r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0) == want.usage.prompt_tokens
    with client.messages.stream(model="claude-sonnet-4-6", max_tokens=8, messages=ask,  # type: ignore[arg-type]
                                system="You are a helpful AI assistant named SmolLM, trained by Hugging Face",
                                extra_body={"temperature": 0}) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == r.content[0].text and final.stop_reason == "max_tokens" and final.usage.output_tokens == 8
    calls = server.health()["decode_calls"]
    counted = client.messages.count_tokens(model="smollm2:135m", messages=ask,  # type: ignore[arg-type]
                                           system="You are a helpful AI assistant named SmolLM, trained by "
                                                  "Hugging Face")
    assert counted.input_tokens == want.usage.prompt_tokens
    long = [{"role": "user", "content": "hi " * 2000}]  # over a slot's window: counted all the same
    over = client.messages.count_tokens(model="smollm2:135m", messages=long)  # type: ignore[arg-type]
    assert over.input_tokens > 2000, over
    assert server.health()["decode_calls"] == calls, "counting evaluates nothing"
    with pytest.raises(anthropic.BadRequestError, match=f"prompt is too long: {over.input_tokens} tokens > "):
        client.messages.create(model="smollm2:135m", max_tokens=8, messages=long)  # type: ignore[arg-type]
    stop = client.messages.create(model="smollm2:135m", max_tokens=40, messages=ask,  # type: ignore[arg-type]
                                  stop_sequences=[" "], extra_body={"temperature": 0})
    assert stop.stop_reason == "stop_sequence" and stop.stop_sequence == " " and " " not in stop.content[0].text  # type: ignore[union-attr]
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server.url, api_key="wrong").messages.create(
            model="smollm2:135m", max_tokens=1, messages=ask)  # type: ignore[arg-type]


def test_anthropic_message_start_carries_the_prompts_tokens(server: Server) -> None:
    """The real `anthropic` SDK's stream events: message_start (what Claude Code's context meter reads) already
    has the prompt's tokens, as count_tokens counts them (the cached part apart), equal to what message_delta
    says at the end."""
    import anthropic

    client = anthropic.Anthropic(base_url=server.url, api_key=KEY)
    ask = [{"role": "user", "content": "Name a fruit, then a colour, then an animal."}]
    counted = client.messages.count_tokens(model="smollm2:135m", messages=ask)  # type: ignore[arg-type]
    for _ in range(2):  # the same prompt again: any part a slot's cache held is counted apart
        with client.messages.stream(model="smollm2:135m", max_tokens=4, messages=ask,  # type: ignore[arg-type]
                                    extra_body={"temperature": 0}) as stream:
            events = list(stream)
        start = events[0]
        assert start.type == "message_start", [e.type for e in events]
        usage = start.message.usage
        assert usage.input_tokens + (usage.cache_read_input_tokens or 0) == counted.input_tokens > 0, usage
        end = next(e for e in events if e.type == "message_delta")
        assert end.usage.input_tokens == usage.input_tokens
        assert end.usage.cache_read_input_tokens == usage.cache_read_input_tokens


def test_claude_codes_billing_line_is_left_out_so_its_prefix_is_reused(server: Server) -> None:
    """Claude Code puts `x-anthropic-billing-header: ...; cch=XXXXX;` first in its system prompt, cch new with every
    request: kept, no request's prompt began as the one before, and its whole prefix was evaluated every turn. The
    line is left out: a prompt counts as it does without it, and the next turn reads the system prompt cached."""
    import anthropic

    client = anthropic.Anthropic(base_url=server.url, api_key=KEY)
    prompt = "You are a careful assistant. " + " ".join(f"Rule {i}: answer briefly and plainly." for i in range(30))
    ask = [{"role": "user", "content": "Name a fruit."}]

    def system(cch: str) -> list[dict[str, str]]:
        return [{"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.197.0d9; cc_entrypoint=cli; "
                                         f"cch={cch};"}, {"type": "text", "text": prompt}]

    plain = client.messages.count_tokens(model="smollm2:135m", system=prompt, messages=ask)  # type: ignore[arg-type]
    billed = client.messages.count_tokens(model="smollm2:135m", system=system("fa690"),  # type: ignore[arg-type]
                                          messages=ask)  # type: ignore[arg-type]
    assert billed.input_tokens == plain.input_tokens
    inline = client.messages.count_tokens(  # as one string, the billing line first
        model="smollm2:135m", system=f"x-anthropic-billing-header: cch=0aaa9;\n{prompt}",  # type: ignore[arg-type]
        messages=ask)  # type: ignore[arg-type]
    assert inline.input_tokens == plain.input_tokens
    for cch in ("36ee5", "0aaa9"):
        r = client.messages.create(model="smollm2:135m", max_tokens=2, system=system(cch),  # type: ignore[arg-type]
                                   messages=ask, extra_body={"temperature": 0})  # type: ignore[arg-type]
    assert (r.usage.cache_read_input_tokens or 0) > len(prompt) // 8, r.usage  # the system prompt, read cached


@pytest.mark.parametrize(("source", "words"), [
    ({"type": "base64", "media_type": "image/png", "data": "aGVsbG8gd29ybGQ="},
     "an image block's source.data is not an image"),
    ({"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgoAAAANSUhEUgAA"},
     "an image block's source.data is a truncated or corrupt PNG"),
    ({"type": "base64", "media_type": "image/png", "data": "not base64!"},
     "an image block's source.data is not valid base64"),
    ({"type": "base64", "media_type": "image/png", "data": ""}, "an image block's source.data must be"),
    ({"type": "base64", "media_type": "text/plain", "data": "aGVsbG8="}, "source.media_type must be an image type"),
    ({"type": "url", "url": "ftp://example.com/a.png"}, "source.url must be an http(s) URL"),
    ({"type": "url", "url": "https://example.com/a.png"}, "send it as a base64 source (source.data)"),
])
def test_anthropic_image_errors_name_anthropics_fields(server: Server, source: dict[str, str], words: str) -> None:
    """An image block's faults in Anthropic's words (its source's data, media_type, url), not OpenAI's data: URI."""
    import anthropic

    client = anthropic.Anthropic(base_url=server.url, api_key=KEY)
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="smollm2:135m", max_tokens=1, messages=[  # type: ignore[list-item,misc]
            {"role": "user", "content": [{"type": "image", "source": source}, {"type": "text", "text": "What?"}]}])
    message = e.value.body["error"]["message"]  # type: ignore[index,call-overload]
    assert words in message and "URI" not in message, message


PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"  # a 1x1 PNG


def test_a_model_asked_what_it_cannot_do_names_the_field_at_fault(server: Server) -> None:
    """Scores from a model that is no reranker name `model` in `param`, as OpenAI's errors name it for a model of
    the wrong kind; an image to a text-only model names the conversation that sent it (`messages`, the
    Responses API's `input`). tests/test_embed.py holds the encoder's and the reranker's."""
    r = httpx.post(f"{server.url}/v1/rerank", headers=_auth(), timeout=120,
                   json={"model": "smollm2:135m", "query": "q", "documents": ["a"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model", r.text
    assert "smollm2:135m is not a reranker" in r.json()["error"]["message"]
    image = f"data:image/png;base64,{PIXEL}"
    r = httpx.post(f"{server.url}/v1/chat/completions", headers=_auth(), timeout=120, json={
        "model": "smollm2:135m", "max_tokens": 1, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What?"}, {"type": "image_url", "image_url": {"url": image}}]}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
    assert "reads text only" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/v1/responses", headers=_auth(), timeout=120, json={
        "model": "smollm2:135m", "max_output_tokens": 16, "input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": image}]}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input", r.text


def test_anthropic_errors_have_anthropics_shape(server: Server) -> None:
    url = f"{server.url}/v1/messages"
    head = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    for body, words in (({"model": "smollm2:135m", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
                        ({"model": "smollm2:135m", "max_tokens": 4, "messages": []}, "messages"),
                        ({"model": "smollm2:135m", "max_tokens": 4, "messages": [{"role": "tool", "content": "x"}]},
                         "role"),
                        # system messages join the system prompt (Claude Code sends one): alone, no conversation
                        ({"model": "smollm2:135m", "max_tokens": 4, "messages": [{"role": "system", "content": "x"}]},
                         "a user message besides the system ones"),
                        ({"model": "smollm2:135m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
                          "thinking": {"type": "enabled"}}, "budget_tokens"),
                        ({"model": "smollm2:135m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
                          "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "custom tools"),
                        ({"model": "smollm2:135m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
                          "output_config": {"effort": "extreme"}}, "effort")):
        r = httpx.post(url, headers=head, json=body, timeout=60)
        doc = r.json()
        assert r.status_code == 400 and doc["type"] == "error", r.text
        assert doc["error"]["type"] == "invalid_request_error" and words in doc["error"]["message"], r.text
    r = httpx.post(url, headers=head, json={"model": "gpt-5", "max_tokens": 4,
                                            "messages": [{"role": "user", "content": "x"}]}, timeout=60)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = httpx.post(url, json={"model": "smollm2:135m", "max_tokens": 4, "messages": []}, timeout=60)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


@pytest.mark.parametrize(("body", "field"), [
    ({"stop_sequences": "x"}, "stop_sequences"),  # one string, not a list
    ({"stop_sequences": [""]}, "stop_sequences"),  # an empty stop sequence
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "42"}]}]}, "tool_use_id"),
])
def test_anthropic_refuses_what_anthropic_refuses(server: Server, body: dict[str, Any], field: str) -> None:
    """Inputs the real Messages API refuses are a 400 in Anthropic's shape that names the field, not a guess."""
    r = httpx.post(f"{server.url}/v1/messages", headers={"x-api-key": KEY}, timeout=60, json={
        "model": "smollm2:135m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}], **body})
    doc = r.json()
    assert r.status_code == 400 and doc["type"] == "error" and doc["error"]["type"] == "invalid_request_error", r.text
    assert field in doc["error"]["message"]


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "stream": True}),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 1, "stream": True}),
    ("/api/chat", {"messages": [{"role": "user", "content": "Hi"}], "options": {"num_predict": 1}}),
    ("/api/generate", {"prompt": "Hi", "options": {"num_predict": 1}}),
    ("/v1/messages", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "stream": True}),
    ("/v1/responses", {"input": "Hi", "max_output_tokens": 1, "stream": True}),
])
def test_every_stream_tells_a_proxy_not_to_buffer_it(server: Server, path: str, body: dict[str, Any]) -> None:
    """webui.md: a streamed answer carries `X-Accel-Buffering: no` (nginx passes it on as it comes), on each API's
    streaming route (Ollama's stream unless told not to)."""
    with httpx.stream("POST", f"{server.url}{path}", headers=_auth(), timeout=120,
                      json={"model": "smollm2:135m", **body}) as r:
        r.read()
        assert r.status_code == 200, r.text
        assert r.headers["x-accel-buffering"] == "no", dict(r.headers)


# Optional fields a client may send as null (OpenAI's SDKs and many front-ends do, for "the default"): each is
# taken as if absent, as OpenAI and Anthropic take them. Each route gets its own request with one field null.
NULLABLE = {
    "/v1/chat/completions": ("n", "stream", "stream_options", "logprobs", "top_logprobs", "max_tokens",
                             "max_completion_tokens", "temperature", "top_p", "stop", "seed", "presence_penalty",
                             "frequency_penalty", "logit_bias", "response_format", "tools", "tool_choice",
                             "parallel_tool_calls", "reasoning_effort", "user", "metadata", "store", "service_tier",
                             "modalities", "audio", "prediction", "functions", "function_call", "ttl",
                             "chat_template_kwargs", "reasoning_format", "top_k", "min_p"),
    "/v1/completions": ("n", "logprobs", "echo", "suffix", "best_of", "stream", "stream_options", "max_tokens",
                        "temperature", "top_p", "stop", "seed", "logit_bias", "user"),
    "/v1/responses": ("instructions", "previous_response_id", "max_output_tokens", "temperature", "top_p", "text",
                      "reasoning", "tools", "tool_choice", "parallel_tool_calls", "store", "truncation", "include",
                      "metadata", "user", "stream", "background", "service_tier", "top_logprobs"),
    "/v1/messages": ("system", "temperature", "top_p", "top_k", "stop_sequences", "stream", "metadata", "tools",
                     "tool_choice", "thinking", "service_tier", "output_config"),
}
HI = [{"role": "user", "content": "Hi"}]
# one token each: what is checked is that the request is taken, not what it says
NULL_BASE = {"/v1/chat/completions": {"messages": HI, "max_tokens": 1},
             "/v1/completions": {"prompt": "Hi", "max_tokens": 1},
             "/v1/responses": {"input": "Hi", "max_output_tokens": 1},
             "/v1/messages": {"messages": HI, "max_tokens": 1}}


def _null_bodies() -> dict[tuple[str, str], dict[str, Any]]:
    """(route, field) → the request with that field null."""
    bodies = {}
    for path, names in NULLABLE.items():
        for name in names:
            body = {"model": "smollm2:135m", **NULL_BASE[path], name: None}
            if name in ("max_tokens", "max_output_tokens"):  # its null is the default: bounded by its other spelling
                body = {**{k: v for k, v in body.items() if k not in ("max_tokens", "max_output_tokens")},
                        name: None, **({"max_completion_tokens": 1} if path == "/v1/chat/completions" else {})}
                if path != "/v1/chat/completions":
                    continue  # no other spelling: the server's own bound would be a long answer
            if name == "top_logprobs" and path == "/v1/chat/completions":
                body["logprobs"] = True
            bodies[path, name] = body
    return bodies


def test_a_null_optional_field_is_the_default(server: Server) -> None:
    """`"n": null`, `"top_logprobs": null` (with logprobs), `"temperature": null`...: the default, never a 400,
    on each of the four routes. The whole table at once, twice the server's four slots in flight, so its slots
    stay full and each step of the model serves four requests."""
    from concurrent.futures import ThreadPoolExecutor

    bodies = _null_bodies()
    assert len(bodies) == 76, len(bodies)
    # one client for all (each httpx.post makes a client of its own, its TLS context loaded again: CPU the
    # server's steps share)
    with ThreadPoolExecutor(8) as pool, httpx.Client(timeout=120, limits=httpx.Limits(max_connections=8)) as c:
        got = dict(zip(bodies, pool.map(lambda item: c.post(f"{server.url}{item[0][0]}", headers=_auth(),
                                                            json=item[1]), bodies.items()),
                       strict=True))
    refused = {f"{path} {name}": r.text[:200] for (path, name), r in got.items() if r.status_code != 200}
    assert not refused, refused


@pytest.mark.parametrize(("method", "path", "status", "shape"), [
    ("GET", "/v1/nothing", 404, "openai"), ("POST", "/v1/chat/nothing", 404, "openai"),
    ("DELETE", "/v1/chat/completions", 405, "openai"), ("GET", "/v1/responses", 405, "openai"),
    ("POST", "/v1/messages/nothing", 404, "anthropic"), ("GET", "/v1/messages", 405, "anthropic"),
    ("GET", "/api/nothing", 404, "ollama"), ("GET", "/api/chat", 405, "ollama"),
    ("PUT", "/v1/files", 405, "openai"), ("POST", "/v1/files/file-x", 405, "openai"),
    ("PUT", "/v1/batches", 405, "openai"), ("POST", "/v1/responses/resp_x", 405, "openai"),
])
def test_unknown_routes_and_methods_answer_in_the_apis_shape(server: Server, method: str, path: str, status: int,
                                                             shape: str) -> None:
    """By the path: Anthropic's error under /v1/messages, Ollama's under /api/, OpenAI's elsewhere; never
    Starlette's plain text. A method a route does not take says which it takes."""
    r = httpx.request(method, f"{server.url}{path}", headers=_auth(), json={}, timeout=30)
    assert r.status_code == status and r.headers["content-type"] == "application/json", r.text
    doc = r.json()
    message = {"openai": lambda: doc["error"]["message"], "anthropic": lambda: doc["error"]["message"],
               "ollama": lambda: doc["error"]}[shape]()
    assert path in message, doc
    if shape == "anthropic":
        assert doc["type"] == "error" and doc["error"]["type"] in ("not_found_error", "invalid_request_error")
    if shape == "openai":
        assert doc["error"]["type"] == "invalid_request_error" and doc["error"]["code"] == status
    if status == 405:
        assert r.headers["allow"] and r.headers["allow"] in message
        # every method the path takes, not only the first route's
        takes = {"/v1/files": {"GET", "POST"}, "/v1/files/file-x": {"GET", "DELETE"}, "/v1/batches": {"GET", "POST"},
                 "/v1/responses/resp_x": {"GET", "DELETE"}}.get(path)
        if takes is not None:
            assert takes <= {m.strip() for m in r.headers["allow"].split(",")}, r.headers["allow"]


def test_anthropic_json_output_follows_the_schema(server: Server) -> None:
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 12}}, "required": ["colour"],
              "additionalProperties": False}
    r = httpx.post(f"{server.url}/v1/messages", headers={"x-api-key": KEY}, timeout=120, json={
        "model": "smollm2:135m", "max_tokens": 40, "temperature": 0,
        "messages": [{"role": "user", "content": "Name a colour as JSON."}],
        "output_config": {"format": {"type": "json_schema", "schema": schema}}})
    assert r.status_code == 200, r.text
    assert isinstance(json.loads(r.json()["content"][0]["text"])["colour"], str)


# ---- OpenAI's Responses API --------------------------------------------------------------------------------

def test_responses_client_whole_streamed_continued_and_stored(server: Server) -> None:
    """The real `openai` SDK's client.responses: the same greedy text as /v1/chat/completions, whole and
    streamed (the response.* events, numbered, ending in response.incomplete with usage at max_output_tokens);
    previous_response_id continues the stored conversation; GET finds it, DELETE forgets it; store: false
    keeps nothing."""
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY)
    ask = [{"role": "user", "content": "Name a colour."}]
    want = client.chat.completions.create(model="smollm2:135m", messages=ask, max_tokens=3,  # type: ignore[arg-type]
                                          temperature=0)
    assert want.usage is not None
    r = client.responses.create(model="smollm2:135m", input="Name a colour.", max_output_tokens=3, temperature=0)
    assert r.id.startswith("resp_") and r.output_text == want.choices[0].message.content
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.usage is not None and r.usage.output_tokens == 3 and r.usage.input_tokens == want.usage.prompt_tokens
    assert r.store is True and r.max_output_tokens == 3 and r.temperature == 0
    events = list(client.responses.create(model="smollm2:135m", input=ask,  # type: ignore[arg-type]
                                          max_output_tokens=3, temperature=0, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:4]] == ["response.created", "response.in_progress", "response.output_item.added",
                                            "response.content_part.added"]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    last = events[-1]
    assert text == r.output_text and last.type == "response.incomplete"
    assert last.response.output_text == text and last.response.usage is not None
    assert last.response.usage.output_tokens == 3
    r2 = client.responses.create(model="smollm2:135m", input="Another one?", previous_response_id=r.id,
                                 max_output_tokens=1, temperature=0)
    again = client.chat.completions.create(model="smollm2:135m", max_tokens=1, messages=[  # type: ignore[arg-type]
        *ask, {"role": "assistant", "content": r.output_text}, {"role": "user", "content": "Another one?"}])
    assert r2.previous_response_id == r.id and r2.usage is not None and again.usage is not None
    assert r2.usage.input_tokens == again.usage.prompt_tokens > r.usage.input_tokens
    # instructions are a system message ahead of the input, and a follow-up does not carry them over
    brief = client.responses.create(model="smollm2:135m", input="Name a colour.", instructions="Be brief.",
                                    max_output_tokens=1, temperature=0)
    told = client.chat.completions.create(model="smollm2:135m", max_tokens=1, messages=[  # type: ignore[arg-type]
        {"role": "system", "content": "Be brief."}, *ask])
    assert brief.usage is not None and told.usage is not None and brief.instructions == "Be brief."
    assert brief.usage.input_tokens == told.usage.prompt_tokens
    later = client.responses.create(model="smollm2:135m", input="Another one?", previous_response_id=brief.id,
                                    max_output_tokens=1, temperature=0)
    untold = client.chat.completions.create(model="smollm2:135m", max_tokens=1, messages=[  # type: ignore[arg-type]
        *ask, {"role": "assistant", "content": brief.output_text}, {"role": "user", "content": "Another one?"}])
    assert later.usage is not None and untold.usage is not None
    assert later.usage.input_tokens == untold.usage.prompt_tokens
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text
    gone = httpx.delete(f"{server.url}/v1/responses/{r.id}", headers=_auth(), timeout=60)
    assert gone.json() == {"id": r.id, "object": "response.deleted", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="smollm2:135m", input="x", previous_response_id=r.id, max_output_tokens=1)
    assert "not found" in e.value.message
    unstored = client.responses.create(model="smollm2:135m", input="x", max_output_tokens=1, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_a_responses_input_items_are_its_own_input(server: Server) -> None:
    """GET /v1/responses/{id}/input_items (the SDK's responses.input_items.list): the request's own input as
    items, newest first unless order=asc, paged by limit and after; not what it continued, nor its answer."""
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY)
    first = client.responses.create(model="smollm2:135m", max_output_tokens=2, temperature=0, instructions="Brief.",
                                    input=[{"role": "user", "content": "Name a colour."},  # type: ignore[list-item]
                                           {"role": "assistant", "content": "Red."},
                                           {"role": "user", "content": [{"type": "input_text", "text": "Another?"}]}])
    items = client.responses.input_items.list(first.id, order="asc").data
    assert [(i.type, i.role, i.content[0].type, i.content[0].text) for i in items] == [  # type: ignore[union-attr]
        ("message", "user", "input_text", "Name a colour."), ("message", "assistant", "output_text", "Red."),
        ("message", "user", "input_text", "Another?")]
    assert len({i.id for i in items}) == 3
    newest = client.responses.input_items.list(first.id)
    assert [i.id for i in newest.data] == [i.id for i in reversed(items)] and not newest.has_more
    page = client.responses.input_items.list(first.id, order="asc", limit=2)
    assert [i.id for i in page.data] == [i.id for i in items[:2]] and page.has_more
    rest = client.responses.input_items.list(first.id, order="asc", limit=2, after=items[1].id)
    assert [i.id for i in rest.data] == [items[2].id] and not rest.has_more
    # a follow-up's input is its own message, not the conversation it continues
    second = client.responses.create(model="smollm2:135m", max_output_tokens=2, temperature=0, input="And a third?",
                                     previous_response_id=first.id)
    assert [(i.role, i.content[0].text) for i in client.responses.input_items.list(second.id).data] == [  # type: ignore[union-attr]
        ("user", "And a third?")]
    for bad, param in (("order=sideways", "order"), ("limit=0", "limit"), ("after=msg_nosuch", "after")):
        r = httpx.get(f"{server.url}/v1/responses/{first.id}/input_items?{bad}", headers=_auth(), timeout=10)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = httpx.get(f"{server.url}/v1/responses/resp_nosuch/input_items", headers=_auth(), timeout=10)
    assert r.status_code == 404


def test_responses_errors_and_json_output(server: Server) -> None:
    url, head = f"{server.url}/v1/responses", _auth()
    for body, param in (({"input": []}, "input"), ({"input": ""}, "input"),
                        ({"input": "x", "tools": [{"type": "custom", "name": "apply_patch"}]}, "tools"),
                        ({"input": "x", "truncation": "middle"}, "truncation"),
                        ({"input": "x", "reasoning": {"effort": "huge"}}, "reasoning.effort"),
                        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
                        ({"input": [{"type": "item_reference", "id": "x"}]}, "input")):
        r = httpx.post(url, headers=head, json={"model": "smollm2:135m", **body}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(url, headers=head, timeout=120, json={"model": "smollm2:135m", "input": "x", "max_output_tokens": 1,
                                                          "prompt_cache_key": "k", "service_tier": "auto"})
    assert r.status_code == 200 and r.json()["status"] == "incomplete", r.text
    for method in ("GET", "DELETE"):
        r = httpx.request(method, f"{url}/resp_unknown", headers=head, timeout=60)
        assert r.status_code == 404 and r.json()["error"]["param"] == "response_id", r.text
    assert httpx.post(url, json={"model": "smollm2:135m", "input": "x"}, timeout=60).status_code == 401
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 12}}, "required": ["colour"],
              "additionalProperties": False}
    r = httpx.post(url, headers=head, timeout=120, json={
        "model": "smollm2:135m", "max_output_tokens": 40, "temperature": 0, "input": "Name a colour as JSON.",
        "text": {"format": {"type": "json_schema", "name": "colour", "schema": schema}}})
    assert r.status_code == 200, r.text
    assert isinstance(json.loads(r.json()["output"][0]["content"][0]["text"])["colour"], str)


def test_messages_match_llama_servers_and_chat_completions(cli_env: dict[str, str]) -> None:
    """scripts/messages_reference.py's conversations: localgen's /v1/messages gives llama-server's greedy answers
    (tests/data/llama_server_messages.json, from the same vendored llama.cpp) and the same text as its own
    /v1/chat/completions for the conversation. A fresh server with the script's settings, asked in the script's
    order: greedy text at a near-tie can flip with how much of a prompt a slot already held."""
    ref = json.loads((ROOT / "tests" / "data" / "llama_server_messages.json").read_text())
    server = Server(cli_env, "--api-key", KEY, "-np", "1", "--ctx", "2048", "--no-on-demand")
    try:
        _same_answers(server, ref)
    finally:
        assert server.stop() == 0


def _same_answers(server: Server, ref: dict[str, Any]) -> None:
    for name, case in ref["cases"].items():
        want = ref["answers"]["smollm2:135m"][name]
        r = httpx.post(f"{server.url}/v1/messages", headers={"x-api-key": KEY}, timeout=300, json={
            "model": "smollm2:135m", "max_tokens": ref["max_tokens"], "temperature": 0, **case})
        assert r.status_code == 200, r.text
        said = "".join(b["text"] for b in r.json()["content"] if b["type"] == "text")
        same_text_as_reference(said, want, name)
        system = case.get("system")
        if isinstance(system, list):
            system = "".join(b["text"] for b in system)
        msgs = ([{"role": "system", "content": system}] if system else []) + [
            {"role": m["role"], "content": m["content"] if isinstance(m["content"], str)
             else "".join(b["text"] for b in m["content"])} for m in case["messages"]]
        chat = httpx.post(f"{server.url}/v1/chat/completions", headers=_auth(), timeout=300, json={
            "model": "smollm2:135m", "max_tokens": ref["max_tokens"], "temperature": 0, "messages": msgs}).json()
        assert chat["choices"][0]["message"]["content"] == said, name  # the same server: the same text


def test_ps_against_a_server_with_a_key(server: Server, cli: CLI) -> None:
    """`localgen ps` takes the key as serve does (--api-key, LOCALGEN_API_KEY); without it, one line naming
    both, never the server's raw 401 JSON."""
    port = str(server.port)
    r = cli("ps", "--port", port)
    assert r.returncode == 1 and "needs an API key: give --api-key KEY or set LOCALGEN_API_KEY" in r.stderr
    assert "{" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = cli("ps", "--port", port, "--api-key", "wrong")
    assert r.returncode == 1 and "refused the API key" in r.stderr and "{" not in r.stderr, r.stderr
    r = cli("ps", "--port", port, "--api-key", KEY)
    assert r.returncode == 0 and "smollm2:135m" in r.stdout, r.stderr
    keyed = CLI({**cli.env, "LOCALGEN_API_KEY": KEY})("ps", "--port", port, "--json")
    assert keyed.returncode == 0 and json.loads(keyed.stdout)[0]["name"] == "smollm2:135m", keyed.stderr


def test_ps_takes_a_key_file_and_the_address_from_the_environment(server: Server, cli: CLI, tmp_path: Path) -> None:
    """`localgen ps --api-key-file FILE` as serve's (a typed file wins over LOCALGEN_API_KEY; with --api-key, an
    empty or unreadable file: usage errors); LOCALGEN_HOST and LOCALGEN_PORT set its --host and --port."""
    key = tmp_path / "key.txt"
    key.write_text(f"{KEY}\n")
    at = CLI({**cli.env, "LOCALGEN_HOST": "localhost", "LOCALGEN_PORT": str(server.port), "LOCALGEN_API_KEY": "wrong"})
    r = at("ps", "--api-key-file", str(key), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)[0]["name"] == "smollm2:135m", r.stderr
    r = at("ps", "--api-key-file", str(key), "--port", "1")  # a typed flag wins over the variable
    assert r.returncode == 1 and "no localgen serve is running at http://localhost:1" in r.stderr, r.stderr
    r = at("ps")
    assert r.returncode == 1 and "refused the API key" in r.stderr, r.stderr
    (tmp_path / "empty.txt").write_text("\n")
    for args, said in ((["--api-key", KEY, "--api-key-file", str(key)], "cannot be combined"),
                       (["--api-key-file", str(tmp_path / "empty.txt")], "is empty"),
                       (["--api-key-file", str(tmp_path / "nothing.txt")], "nothing.txt: no such file")):
        r = at("ps", *args)
        assert r.returncode == 2 and said in r.stderr and r.stderr.count("\n") == 1, r.stderr
    r = CLI({**cli.env, "LOCALGEN_PORT": "x"})("ps")
    assert r.returncode == 2 and "LOCALGEN_PORT" in r.stderr, r.stderr


@pytest.mark.parametrize("status", [404, 200])
def test_ps_at_a_port_where_another_web_server_listens_says_so_in_one_line(cli_in_process: InProcessCLI,
                                                                         status: int) -> None:
    """ps (and stop --all, which reads the same list) at a port where some other web server answers /api/ps with
    an HTML page: one line saying a web page came, not localgen serve's answer. Its 404 printed the page's HTML over
    ten lines; its 200, a JSONDecodeError's traceback."""
    import http.server

    page = b"<!DOCTYPE HTML>\n<html lang=\"en\">\n<head><title>Error response</title></head>\n<body></body>\n</html>\n"

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: Any) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page) as web:
        threading.Thread(target=web.serve_forever, daemon=True).start()
        try:
            said = [cli_in_process(*args, "--port", str(web.server_address[1])) for args in (["ps"], ["stop", "--all"])]
        finally:
            web.shutdown()
    for r in said:
        assert r.returncode == 1 and r.stdout == "", r
        assert r.stderr == f"localgen: error: http://127.0.0.1:{web.server_address[1]}/api/ps answered {status}: a " \
                           "web page, not localgen serve's answer\n", r.stderr


def test_run_and_chat_without_m_name_the_missing_key(server: Server, cli: CLI) -> None:
    """--endpoint without -m asks the server's /models for the model: a keyed server's 401 is said as a request's
    refusal naming --api-key-env (it was "did not list its models (name the model with -m)"), with or without -m."""
    url = f"{server.url}/v1"
    for command, extra in (("run", ["-p", "Hi"]), ("chat", [])):
        for model in ([], ["-m", "smollm2:135m"]):
            r = cli(command, "--endpoint", url, *model, *extra, "-n", "2", input="Hi\n")
            assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
            assert "refused the request (401)" in r.stderr and "--api-key-env" in r.stderr, r.stderr
    r = CLI({**cli.env, "THE_KEY": KEY})("run", "--endpoint", url, "--api-key-env", "THE_KEY", "-p", "Hi", "-n", "2")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr


def _raw(port: int, request: bytes) -> tuple[bytes, bytes]:
    """One request over a bare socket, read to the server's close: the response's head and body as sent."""
    with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head.lower(), body


def test_an_http_1_0_client_gets_a_stream_whole_with_its_length_not_in_chunks(server: Server) -> None:
    """HTTP/1.0 has no chunked encoding: a streamed answer to a 1.0 request comes whole, with Content-Length,
    its events as a 1.1 client reads them; a 1.1 request still streams in chunks."""
    body = json.dumps({"model": "smollm2:135m", "prompt": "Hi", "max_tokens": 3, "stream": True,
                       "temperature": 0}).encode()
    asks = {version: (f"POST /v1/completions HTTP/{version}\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                      ).encode() + body for version in ("1.0", "1.1")}
    head, got = _raw(server.port, asks["1.0"])
    assert head.split(b"\r\n")[0].endswith(b" 200 ok") and b"transfer-encoding" not in head, head
    assert f"content-length: {len(got)}".encode() in head.split(b"\r\n"), head
    assert got.startswith(b"data: {") and got.rstrip().endswith(b"data: [DONE]"), got[:200]
    head, got = _raw(server.port, asks["1.1"])
    assert b"transfer-encoding: chunked" in head and b"content-length" not in head, head
    # a status that has no body has no length either (RFC 9110): a 304 of the chat page's file, to a 1.0 client
    ask = b"GET /webui/app.js HTTP/1.0\r\nHost: 127.0.0.1\r\n"
    head, _ = _raw(server.port, ask + b"\r\n")
    etag = next(line for line in head.split(b"\r\n") if line.startswith(b"etag:")).split(b":", 1)[1].strip()
    head, got = _raw(server.port, ask + b"If-None-Match: " + etag + b"\r\n\r\n")
    assert b" 304 " in head.split(b"\r\n")[0] and b"content-length" not in head and got == b"", head


def test_an_http_1_0_stream_its_error_event_ends_is_that_error_not_a_200(cli_env: dict[str, str]) -> None:
    """serve.md: a 1.0 client's stream that fails before its end reaches it as that failure, with its request_id
    and its status in the access line; one ended by the server's stop (its 503 error event) came as a 200 whose
    body ended in the error event."""
    s = Server(cli_env, "-np", "1", "--ctx", "4096", "--drain-timeout", "0")
    body = json.dumps({"model": "smollm2:135m", "messages": [{"role": "user", "content": "story"}],
                       "max_tokens": 4000, "ignore_eos": True, "stream": True}).encode()
    got: dict[str, Any] = {}
    ask = (b"POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\nX-Request-Id: old-client\r\n"
           b"Content-Length: %d\r\n\r\n" % len(body)) + body
    asking = threading.Thread(target=lambda: got.update(answer=_raw(s.port, ask)))
    try:
        asking.start()
        deadline = time.monotonic() + 120
        while s.health()["running"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert s.health()["running"] == 1, "the stream is in its slot"
        began = s.health()["decode_calls"]
        while s.health()["decode_calls"] < began + 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert s.health()["decode_calls"] >= began + 5, "the stream has begun: its tokens come"
        s.proc.send_signal(signal.SIGTERM)
        asking.join(60)
        assert s.proc.wait(timeout=60) == 0
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
    head, answer = got["answer"]
    assert head.split(b"\r\n")[0].endswith(b" 503 service unavailable"), head
    assert b"content-type: application/json" in head and f"content-length: {len(answer)}".encode() in head, head
    error = json.loads(answer)
    assert "shutting down" in error["error"]["message"] and error["request_id"] == "old-client", error
    assert " 503 " in s.access("old-client"), s.log()


def test_a_ctx_past_the_trained_window_is_said_at_start(cli_env: dict[str, str]) -> None:
    """As run says it: the load caps --ctx at what the model was trained on (SmolLM2: 8,192), and serve says so."""
    s = Server(cli_env, "-np", "1", "--ctx", "16384")
    try:
        assert httpx.get(f"{s.url}/api/ps", timeout=10).json()["models"][0]["context_length"] == 8192
    finally:
        assert s.stop() == 0
    text = s.proc.stderr.read().decode() if s.proc.stderr else ""
    assert ("warning: --ctx 16,384 is past the 8,192 tokens smollm2:135m was trained on: its window is 8,192 "
            "(--rope-scaling linear or yarn stretches it)") in text, text


def test_models_are_listed_in_the_shape_of_the_client_that_asks(server: Server) -> None:
    """OpenAI's shape by default; Anthropic's (type, display_name, created_at, has_more) for its SDK, which sends
    anthropic-version; one model by its id in either; a page of Anthropic's by limit and after_id."""
    import anthropic
    import openai

    o = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY)
    one = o.models.retrieve("smollm2:135m")
    assert (one.id, one.object, one.owned_by) == ("smollm2:135m", "model", "localgen")
    a = anthropic.Anthropic(base_url=server.url, api_key=KEY)
    listed = a.models.list()
    ids = [m.id for m in listed.data]
    assert ids[0] == "smollm2:135m" and {m.type for m in listed.data} == {"model"}
    assert listed.data[0].display_name == "smollm2:135m" and listed.data[0].created_at.year >= 2026
    got = a.models.retrieve("smollm2:135m")
    assert (got.id, got.type) == ("smollm2:135m", "model")
    first = a.models.list(limit=1)
    assert [m.id for m in first.data] == ids[:1] and first.has_more == (len(ids) > 1)
    if len(ids) > 1:
        assert [m.id for m in a.models.list(limit=1, after_id=ids[0]).data] == ids[1:2]
    r = httpx.get(f"{server.url}/v1/models/nosuch", headers=_auth(), timeout=10)
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    # errors too come in the asker's shape: Anthropic's SDK reads {"type": "error", "error": {type, message}}
    with pytest.raises(anthropic.NotFoundError) as missing:
        a.models.retrieve("nosuch")
    body = dict(missing.value.body)
    assert body.pop("request_id").startswith("req_") and body == {"type": "error", "error": {
        "type": "not_found_error", "message": "The model 'nosuch' does not exist"}}, body
    with pytest.raises(anthropic.BadRequestError) as bad:
        a.models.list(limit=0)
    assert isinstance(bad.value.body, dict) and bad.value.body["error"]["type"] == "invalid_request_error"


def test_ctx_0_is_each_models_training_context_before_and_after_it_loads(cli_env: dict[str, str]) -> None:
    """serve --ctx 0, as llama-server's -c 0: /v1/models says each model's training context before it loads
    (it said 0), and the loaded model has it."""
    s = Server(cli_env, "-np", "1", "--ctx", "0", "--cache-ram", "0")
    try:
        windows = {m["id"]: m["max_model_len"] for m in httpx.get(f"{s.url}/v1/models", timeout=60).json()["data"]}
        assert windows["smollm2:135m"] == 8192 and windows["gemma3:270m"] == 32768, windows
        assert httpx.get(f"{s.url}/api/ps", timeout=10).json()["models"][0]["context_length"] == 8192
    finally:
        assert s.stop() == 0


def test_ollama_client_gets_logprobs_as_ollama_sends_them(server: Server) -> None:
    """The ollama client sends `logprobs` and `top_logprobs` (Ollama's native API has them since 0.12.11) and reads
    `logprobs` at the top of the answer: they were ignored, and it read None. Each generated token's log-probability
    comes back, with its alternatives, the same as chat completions' for the same request; streamed, the lines carry
    them all; `top_logprobs` past 20 is Ollama's 400."""
    import ollama

    client = ollama.Client(host=server.url, headers=_auth())
    messages = [{"role": "user", "content": "Name a colour."}]
    options = {"num_predict": 6, "temperature": 0}
    chat = client.chat(model="smollm2:135m", messages=messages, options=options, logprobs=True, top_logprobs=2)
    assert chat.logprobs is not None and len(chat.logprobs) == chat["eval_count"], chat
    assert "".join(t.token for t in chat.logprobs) == chat["message"]["content"]
    assert all(len(t.top_logprobs or []) == 2 and t.logprob <= 0 for t in chat.logprobs), chat.logprobs
    openai = httpx.post(f"{server.url}/v1/chat/completions", headers=_auth(), timeout=120, json={
        "model": "smollm2:135m", "messages": messages, "max_tokens": 6, "temperature": 0, "logprobs": True,
        "top_logprobs": 2}).json()["choices"][0]["logprobs"]["content"]
    assert [(t.token, t.logprob) for t in chat.logprobs] == [(t["token"], t["logprob"]) for t in openai]
    streamed = list(client.generate(model="smollm2:135m", prompt="Name a colour.", options=options, stream=True,
                                    logprobs=True))
    tokens = [t for part in streamed for t in (part.logprobs or [])]
    assert "".join(t.token for t in tokens) == "".join(p["response"] for p in streamed) and tokens
    assert all(not t.top_logprobs for t in tokens)  # none asked for: left out, as Ollama leaves them
    assert client.chat(model="smollm2:135m", messages=messages, options=options).logprobs is None
    with pytest.raises(ollama.ResponseError, match="top_logprobs must be between 0 and 20") as e:
        client.chat(model="smollm2:135m", messages=messages, options=options, logprobs=True, top_logprobs=21)
    assert e.value.status_code == 400


def _stops_in(tokens: list[str]) -> tuple[int, str, int, str]:
    """Two stop strings for a greedy answer of these tokens, each found first where it is meant: one that begins
    where token i begins, one that begins inside token j (after its first character)."""
    text = "".join(tokens)
    starts = [len("".join(tokens[:k])) for k in range(len(tokens))]
    i = next(k for k in range(1, len(tokens) - 1) if text.find(tokens[k] + tokens[k + 1]) == starts[k])
    j = next(k for k in range(1, len(tokens) - 1) if len(tokens[k]) > 1 and tokens[k].strip()
             and text.find(tokens[k][1:] + tokens[k + 1]) == starts[k] + 1)
    return i, tokens[i] + tokens[i + 1], j, tokens[j][1:] + tokens[j + 1]


def test_logprobs_leave_out_the_stop_strings_tokens(server: Server, cli: CLI) -> None:
    """docs/api.md, docs/run.md: the log-probabilities are the answer's tokens: a stop string's are left out (they
    ran on to its end), and a token the answer ends inside is kept, whole; streamed and not, and in run --json."""
    def chat(stream: bool, **stop: Any) -> tuple[str, list[str]]:
        body = {"model": "smollm2:135m", "messages": [{"role": "user", "content": "Write one sentence about the sea."}],
                "max_tokens": 24, "temperature": 0, "logprobs": True, "top_logprobs": 1, "stream": stream, **stop}
        r = httpx.post(f"{server.url}/v1/chat/completions", headers=_auth(), timeout=120, json=body)
        assert r.status_code == 200, r.text
        if not stream:
            choice = r.json()["choices"][0]
            return choice["message"]["content"], [t["token"] for t in choice["logprobs"]["content"]]
        chunks = [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: {")]
        deltas = [c["choices"][0] for c in chunks if c["choices"]]
        return ("".join(d["delta"].get("content") or "" for d in deltas),
                [t["token"] for d in deltas if d.get("logprobs") for t in d["logprobs"]["content"]])

    def run(*stop: str) -> tuple[str, list[str]]:
        r = cli("run", "-p", "Write one sentence about the sea.", "-n", "24", "--temperature", "0", "--logprobs", "0",
                "--json", *stop)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        return doc["text"], [t["token"] for t in doc["logprobs"]]

    for answer in (functools.partial(chat, False), functools.partial(chat, True)):
        text, tokens = answer()
        assert "".join(tokens) == text
        i, at, j, inside = _stops_in(tokens)
        assert answer(stop=[at]) == ("".join(tokens[:i]), tokens[:i])
        assert answer(stop=inside) == ("".join(tokens[:j]) + tokens[j][0], tokens[:j + 1])
    text, tokens = run()
    i, at, j, inside = _stops_in(tokens)
    assert run("--stop", at) == ("".join(tokens[:i]), tokens[:i])
    assert run("--stop", inside) == ("".join(tokens[:j]) + tokens[j][0], tokens[:j + 1])
