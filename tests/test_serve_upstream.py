"""`localgen serve --endpoint`: the real serve fronting (i) tests/fake_openai.py's FakeServer, named in
endpoints.toml, for its errors, a stream seen arriving before its end, a client that leaves, the queue, the
other APIs' refusals, the log and the metrics; (ii) a second real `localgen serve` with SmolLM2, asked through
the front with the `openai` client (docs/serve.md, "Fronting other servers")."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from tests.conftest import CLI
from tests.fake_openai import FakeServer, _chunk
from tests.test_serve import Server

KEY = "sk-front-own-key"  # the front's own key (serve --api-key)
UPSTREAM_KEY = "sk-upstream-secret-9f8e7d"  # the key the front sends the fake (endpoints.toml's api_key_env)
FAKE_MODELS = ("plain", "usage", "gated", "held", "busy", "busy-once", "broken", "html", "redirect",
               "unauthorized", "missing")
WAIT_S = 60.0  # a safety net for what the tests wait for, never a timing asserted


class Upstream(FakeServer):
    """FakeServer with three more behaviours by model id:
    - gated: a role chunk and "first", then nothing until `release` is set, then " second" and the end;
      `closed` is set when the stream was closed before its end (its client left)
    - unauthorized: 401 whose message repeats the key it was sent, as some servers do
    - missing: 404, no such model
    - held: no answer at all until `release` is set, then a whole (not streamed) answer; `closed` is set when
      the connection closed before (its client left while the upstream was still working)
    """

    def __init__(self) -> None:
        self.release = threading.Event()
        self.closed = threading.Event()
        super().__init__()

    async def chat(self, request: Request) -> Response:
        body = await request.json()  # Starlette keeps it: FakeServer.chat reads it again
        model = body.get("model")
        if model not in ("gated", "unauthorized", "missing", "held"):
            return await super().chat(request)
        self.requests.append({"headers": dict(request.headers), "body": body})
        if model == "unauthorized":
            sent = request.headers.get("authorization", "").removeprefix("Bearer ")
            return JSONResponse({"error": {"message": f"Incorrect API key provided: {sent}",
                                           "type": "invalid_request_error"}}, status_code=401)
        if model == "held":
            while not self.release.is_set():
                if await request.is_disconnected():
                    self.closed.set()
                    return Response(status_code=499)
                await asyncio.sleep(0.01)
            return JSONResponse({"id": "x", "object": "chat.completion", "model": "held", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "all at once"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}})
        if model == "missing":
            return JSONResponse({"error": {"message": "The model `missing` does not exist",
                                           "type": "invalid_request_error"}}, status_code=404)

        async def stream() -> AsyncIterator[str]:
            ended = False
            try:
                yield _chunk(role="assistant")
                yield _chunk("first")
                while not self.release.is_set():
                    await asyncio.sleep(0.01)
                yield _chunk(" second")
                yield _chunk(finish="stop")
                yield "data: [DONE]\n\n"
                ended = True
            finally:
                if not ended:
                    self.closed.set()

        return StreamingResponse(stream(), media_type="text/event-stream")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    u = Upstream()
    yield u
    u.release.set()
    u.stop()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The front's own model: the tiny BERT (loads at once; its name clashes with no upstream's)."""
    from tests.tiny_bert import build

    return str(build(tmp_path_factory.mktemp("tiny") / "tiny-bert.gguf"))


@pytest.fixture(scope="module")
def front_env(tmp_path_factory: pytest.TempPathFactory, cli_env: dict[str, str], upstream: Upstream) -> dict[str, str]:
    """A home of its own (nothing installed: no name clashes), whose endpoints.toml names the fake (fakebox, with
    its key's variable) and a server that is down (downbox)."""
    home = tmp_path_factory.mktemp("front-home")
    (home / "config").mkdir()
    models = ", ".join(f'"{m}"' for m in FAKE_MODELS)
    (home / "config" / "endpoints.toml").write_text(
        f'[fakebox]\nurl = "{upstream.url}/v1"\napi_key_env = "UPSTREAM_KEY"\nmodels = [{models}]\n\n'
        f'[downbox]\nurl = "http://127.0.0.1:{_free_port()}/v1"\nmodels = ["gone"]\n\n'
        f'[twin]\nurl = "http://127.0.0.1:{_free_port()}/v1"\nmodels = ["plain"]\n')
    return {**cli_env, "LOCALGEN_HOME": str(home), "UPSTREAM_KEY": UPSTREAM_KEY}


@pytest.fixture(scope="module")
def front(front_env: dict[str, str], tiny: str) -> Iterator[Server]:
    """serve with its own key, one request at a time per model and none waiting, fronting fakebox and downbox."""
    s = Server(front_env, "--api-key", KEY, "-m", tiny, "--no-on-demand", "-np", "1", "--max-queue", "0",
               "--endpoint", "fakebox,downbox")
    yield s
    assert s.stop() == 0


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


def _chat(model: str, **more: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True, **more}


def _log(server: Server) -> str:
    assert server.proc.stderr is not None
    server.proc.stderr.seek(0)
    return str(server.proc.stderr.read().decode())


# ---- (i) the fake upstream ----

def test_remote_models_are_listed_beside_the_local_ones(front: Server, upstream: Upstream) -> None:
    models = httpx.get(f"{front.url}/v1/models", headers=_auth()).json()["data"]
    by_id = {m["id"]: m for m in models}
    assert by_id["tiny-bert.gguf"]["owned_by"] == "localgen"
    assert by_id["plain"]["owned_by"] == "fakebox" and by_id["plain"]["upstream"] == f"{upstream.url}/v1"
    assert by_id["gone"]["owned_by"] == "downbox"
    assert set(FAKE_MODELS) <= set(by_id)
    one = httpx.get(f"{front.url}/v1/models/usage", headers=_auth()).json()
    assert one["owned_by"] == "fakebox"
    tags = {m["name"]: m for m in httpx.get(f"{front.url}/api/tags", headers=_auth()).json()["models"]}
    assert tags["plain"]["remote_host"] == f"{upstream.url}/v1" and tags["plain"]["size"] == 0
    assert "tiny-bert.gguf" in tags
    anthropic = httpx.get(f"{front.url}/v1/models", headers={**_auth(), "anthropic-version": "2023-06-01"}).json()
    assert [m["id"] for m in anthropic["data"]] == ["tiny-bert.gguf"]  # /v1/messages cannot reach the others


def test_a_request_goes_upstream_as_it_came_with_the_upstreams_key(front: Server, upstream: Upstream) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{front.url}/v1", api_key=KEY)
    tools = [{"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]
    chunks = list(client.chat.completions.create(
        model="usage", messages=[{"role": "user", "content": "hi"}], stream=True, tools=tools,  # type: ignore[arg-type]
        stream_options={"include_usage": True}, extra_body={"x_custom": [1, 2]}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello world"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 2
    sent = upstream.requests[-1]
    assert sent["body"]["model"] == "usage" and sent["body"]["tools"] == tools and sent["body"]["x_custom"] == [1, 2]
    assert sent["headers"]["authorization"] == f"Bearer {UPSTREAM_KEY}"  # never the front's own key
    assert not any(KEY in v for v in sent["headers"].values())


def test_a_stream_arrives_chunk_by_chunk_and_a_client_that_leaves_closes_it(front: Server,
                                                                            upstream: Upstream) -> None:
    upstream.release.clear()
    with httpx.Client(timeout=WAIT_S) as c, c.stream("POST", f"{front.url}/v1/chat/completions", headers=_auth(),
                                                     json=_chat("gated")) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        seen = ""
        lines = r.iter_lines()
        while "first" not in seen:
            seen += next(lines)
        assert not upstream.release.is_set()  # "first" came through while the upstream still holds the rest
        upstream.release.set()
        rest = "".join(lines)
    assert "second" in rest and rest.endswith("[DONE]")
    assert not upstream.closed.is_set()

    upstream.release.clear()
    client = httpx.Client(timeout=WAIT_S)
    with client.stream("POST", f"{front.url}/v1/chat/completions", headers=_auth(), json=_chat("gated")) as r:
        seen = ""
        lines = r.iter_lines()
        while "first" not in seen:
            seen += next(lines)
    client.close()  # the client leaves mid-stream: the front closes the upstream's stream
    assert upstream.closed.wait(WAIT_S), "the upstream's stream was left open"
    upstream.release.set()


def test_a_whole_answer_comes_back_and_a_client_that_leaves_while_it_is_made_closes_it(
        front: Server, upstream: Upstream) -> None:
    upstream.release.set()
    r = httpx.post(f"{front.url}/v1/chat/completions", headers=_auth(), json={**_chat("held"), "stream": False},
                   timeout=WAIT_S)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "all at once"
    upstream.release.clear()
    upstream.closed.clear()
    sent = len(upstream.requests)
    body = json.dumps({**_chat("held"), "stream": False}).encode()
    with socket.create_connection(("127.0.0.1", front.port)) as s:  # a client that leaves without a word
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        for _ in range(int(WAIT_S * 100)):
            if len(upstream.requests) > sent:
                break
            threading.Event().wait(0.01)
        assert len(upstream.requests) > sent, "the request never reached the upstream"
    assert upstream.closed.wait(WAIT_S), "the upstream's connection was left open"
    upstream.release.set()


def test_the_queue_is_serves_own_and_nothing_past_it_goes_upstream(front: Server, upstream: Upstream) -> None:
    upstream.release.clear()
    with httpx.Client(timeout=WAIT_S) as c, c.stream("POST", f"{front.url}/v1/chat/completions", headers=_auth(),
                                                     json=_chat("gated")) as r:
        lines = r.iter_lines()
        seen = ""
        while "first" not in seen:
            seen += next(lines)
        sent = len(upstream.requests)
        second = httpx.post(f"{front.url}/v1/chat/completions", headers=_auth(), json=_chat("gated"), timeout=WAIT_S)
        assert second.status_code == 503 and "--max-queue 0" in second.json()["error"]["message"], second.text
        assert len(upstream.requests) == sent  # refused here, never sent on
        upstream.release.set()
        assert "".join(lines).endswith("[DONE]")
    sent = len(upstream.requests)
    keyless = httpx.post(f"{front.url}/v1/chat/completions", json=_chat("plain"), timeout=WAIT_S)
    assert keyless.status_code == 401 and len(upstream.requests) == sent  # serve's own key first


def _error(front: Server, model: str) -> httpx.Response:
    return httpx.post(f"{front.url}/v1/chat/completions", headers=_auth(), json=_chat(model), timeout=WAIT_S)


def test_upstream_errors_come_back_with_their_status_naming_the_endpoint(front: Server) -> None:
    r = _error(front, "unauthorized")
    message = r.json()["error"]["message"]
    assert r.status_code == 401 and "fakebox refused the request (401)" in message and "***" in message
    assert UPSTREAM_KEY not in r.text
    r = _error(front, "missing")
    assert r.status_code == 404 and "fakebox has no model 'missing'" in r.json()["error"]["message"]
    r = _error(front, "busy-once")  # sent once, not retried: the client sees the 429 and its Retry-After
    assert r.status_code == 429 and r.headers["retry-after"] == "0" and "fakebox is busy" in r.text
    r = _error(front, "busy")
    assert r.status_code == 503 and r.json()["error"]["type"] == "server_error" and "fakebox" in r.text
    r = _error(front, "html")
    assert r.status_code == 502 and "not an OpenAI answer" in r.json()["error"]["message"]
    r = _error(front, "redirect")
    assert r.status_code == 502 and "does not follow redirects" in r.json()["error"]["message"]
    r = _error(front, "gone")
    assert r.status_code == 502 and "cannot reach downbox" in r.json()["error"]["message"], r.text
    assert all(k in r.json() for k in ("error", "request_id"))


def test_a_stream_that_breaks_ends_with_an_error_event(front: Server) -> None:
    r = httpx.post(f"{front.url}/v1/chat/completions", headers={**_auth(), "X-Request-Id": "broken-stream-1"},
                   json=_chat("broken"), timeout=WAIT_S)
    assert r.status_code == 200
    events = [line.removeprefix("data: ") for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == 502 and "fakebox" in error["message"] and "partial" in error["message"]
    assert "Hel" in "".join(events[:-2])
    # logged with the error that ended it, not its 200 (written as the request's task ends: waited for)
    deadline = time.monotonic() + 30
    while not (logged := any(line.startswith("POST /v1/chat/completions 502 ") and line.endswith(
            " via fakebox id=broken-stream-1") for line in _log(front).splitlines())):
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert logged, _log(front)


def test_the_other_apis_refuse_a_remote_model_in_their_own_shape(front: Server) -> None:
    r = httpx.post(f"{front.url}/v1/messages", headers={**_auth(), "anthropic-version": "2023-06-01"},
                   json={"model": "plain", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert "runs on fakebox" in r.json()["error"]["message"] and "/v1/chat/completions" in r.json()["error"]["message"]
    r = httpx.post(f"{front.url}/api/chat", headers=_auth(),
                   json={"model": "plain", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "runs on fakebox" in r.json()["error"]
    r = httpx.post(f"{front.url}/v1/responses", headers=_auth(), json={"model": "plain", "input": "hi"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"


def test_the_log_and_metrics_count_remote_requests_and_never_show_the_key(front: Server) -> None:
    r = httpx.post(f"{front.url}/v1/chat/completions", headers=_auth(),
                   json=_chat("usage", stream_options={"include_usage": True}), timeout=WAIT_S)
    assert r.status_code == 200
    metrics = httpx.get(f"{front.url}/metrics", headers=_auth()).text
    assert 'localgen_upstream_requests_total{endpoint="fakebox",model="usage",status="200"}' in metrics
    assert 'localgen_upstream_requests_total{endpoint="fakebox",model="busy",status="503"}' in metrics
    assert 'localgen_upstream_requests_total{endpoint="downbox",model="gone",status="502"}' in metrics
    shown = [metrics, httpx.get(f"{front.url}/health").text, httpx.get(f"{front.url}/api/ps", headers=_auth()).text]
    log = _log(front)
    assert any(line.startswith("POST /v1/chat/completions 200 7+2 tokens") and " via fakebox id=" in line
               for line in log.splitlines()), log
    assert "remote models (--endpoint fakebox" in log
    for text in [*shown, log]:
        assert UPSTREAM_KEY not in text


# ---- what stops the start ----

def test_what_stops_the_start(front_env: dict[str, str], upstream: Upstream) -> None:
    cli = CLI(front_env)
    port = str(_free_port())
    r = cli("serve", "--port", port, "--endpoint", f"http://127.0.0.1:{_free_port()}", timeout=120)
    assert r.returncode == 1 and "--endpoint: cannot reach 127.0.0.1:" in r.stderr and "Traceback" not in r.stderr
    r = cli("serve", "--port", port, "--endpoint", f"{upstream.url}/nothing-here", timeout=120)
    assert r.returncode == 1 and "lists no models at" in r.stderr and "Traceback" not in r.stderr
    # LOCALGEN_ENDPOINT is run's: serve does not take it for --endpoint
    r = CLI({**front_env, "LOCALGEN_ENDPOINT": upstream.url})("serve", "--port", port, "--api-key-env", "UPSTREAM_KEY",
                                                               timeout=120)
    assert r.returncode == 2 and "--api-key-env goes with --endpoint" in r.stderr
    r = cli("serve", "--port", port, "--endpoint", "nosuchbox", timeout=120)
    assert r.returncode == 2 and "neither an http:// or https:// URL nor an entry of" in r.stderr
    r = cli("serve", "--port", port, "--endpoint", "fakebox", "--endpoint", "twin", timeout=120)
    assert r.returncode == 2 and "'plain' is served by both fakebox and twin" in r.stderr


# ---- (ii) a real localgen serve upstream ----

@pytest.fixture(scope="module")
def real(cli_env: dict[str, str]) -> Iterator[Server]:
    s = Server(cli_env, "--ctx", "1024", "-np", "2")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def real_front(front_env: dict[str, str], tiny: str, real: Server) -> Iterator[Server]:
    s = Server(front_env, "-m", tiny, "--no-on-demand", "--endpoint", real.url, "--log-format", "json")
    yield s
    assert s.stop() == 0


def test_a_real_localgen_serve_behind_the_front(real_front: Server, real: Server) -> None:
    import openai

    front = openai.OpenAI(base_url=f"{real_front.url}/v1", api_key="none")
    direct = openai.OpenAI(base_url=f"{real.url}/v1", api_key="none")
    listed = {m.id: m for m in front.models.list().data}
    assert listed["smollm2:135m"].owned_by == f"127.0.0.1:{real.port}"
    ask: dict[str, Any] = {"model": "smollm2:135m", "messages": [{"role": "user", "content": "Name a colour."}],
                           "max_tokens": 8, "temperature": 0}
    whole = front.chat.completions.create(**ask)
    assert whole.model == "smollm2:135m" and whole.choices[0].message.content
    assert whole.usage is not None and 0 < whole.usage.completion_tokens <= 8
    chunks = list(front.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    raw = {"model": "smollm2:135m", "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0}
    assert front.completions.create(**raw).choices[0].text == direct.completions.create(**raw).choices[0].text
    via = front.embeddings.create(model="smollm2:135m", input=["a cat sat", "stocks fell"])
    assert [d.embedding for d in via.data] == [d.embedding for d in direct.embeddings.create(
        model="smollm2:135m", input=["a cat sat", "stocks fell"]).data]
    shaped = front.chat.completions.create(**{**ask, "max_tokens": 40}, response_format={
        "type": "json_schema", "json_schema": {"name": "c", "schema": {
            "type": "object", "properties": {"colour": {"type": "string", "maxLength": 12}}, "required": ["colour"]}}})
    assert isinstance(json.loads(shaped.choices[0].message.content or "")["colour"], str)
    lines = [json.loads(line) for line in _log(real_front).splitlines() if line.startswith("{")]
    sent = [d for d in lines if d["event"] == "request" and d["path"] == "/v1/chat/completions"]
    assert sent and all(d["upstream"] == f"127.0.0.1:{real.port}" and d["model"] == "smollm2:135m" for d in sent)
    assert sent[0]["completion_tokens"] == whole.usage.completion_tokens  # from the answer's usage


def test_a_name_served_here_and_upstream_stops_the_start(cli_env: dict[str, str], tiny: str, real: Server) -> None:
    # the session's home has smollm2:135m on disk, offered on demand: the upstream's smollm2:135m clashes
    r = CLI(cli_env)("serve", "--port", str(_free_port()), "-m", tiny, "--endpoint", real.url, timeout=300)
    assert r.returncode == 2, r.stderr
    said = f"--endpoint 127.0.0.1:{real.port} serves '"
    assert said in r.stderr and "', and so does this server" in r.stderr
    assert "--no-on-demand" in r.stderr and "Traceback" not in r.stderr
