"""`localgen serve --endpoint`: the real serve fronting (i) tests/fake_openai.py's FakeServer, named in
endpoints.toml, for its errors, a stream seen arriving before its end, a client that leaves, the queue, the
other APIs' refusals, the log and the metrics; (ii) a second real `localgen serve` with SmolLM2, asked through
the front with the `openai` client (docs/serve.md, "Fronting other servers")."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from tests.conftest import CLI
from tests.fake_openai import FakeServer, GatheringServer, StrictServer, _chunk
from tests.test_serve import Server
from tests.test_webui import Tab, ask, browser  # noqa: F401  # browser: the chat page's fixture

KEY = "sk-front-own-key"  # the front's own key (serve --api-key)
UPSTREAM_KEY = "sk-upstream-secret-9f8e7d"  # the key the front sends the fake (endpoints.toml's api_key_env)
FAKE_MODELS = ("plain", "usage", "gated", "held", "busy", "busy-once", "broken", "html", "redirect",
               "unauthorized", "missing", "counted", "lingering", "echoing", "garbled",
               "garbled-whole", "spread")
HOLD_S = 0.3  # what `counted` waits after its role chunk before its first content
LINGER_S = 2.0  # what `lingering` waits after its [DONE] before its body ends
WAIT_S = 60.0  # a safety net for what the tests wait for, never a timing asserted


class Upstream(FakeServer):
    """FakeServer with three more behaviours by model id:
    - gated: a role chunk and "first", then nothing until `release` is set, then " second" and the end;
      `closed` is set when the stream was closed before its end (its client left)
    - unauthorized: 401 whose message repeats the key it was sent, as some servers do
    - missing: 404, no such model
    - held: no answer at all until `release` is set, then a whole (not streamed) answer; `closed` is set when
      the connection closed before (its client left while the upstream was still working)
    - counted: as OpenAI streams: a role chunk, HOLD_S of nothing, then "Hello" " world" and the end; with
      stream_options.include_usage, `"usage": null` in every chunk and a last chunk with no choices and the usage
      (5 prompt tokens, 2 of them cached, 3 made), without it no usage at all; a whole answer has its usage
    - lingering: as counted, its body ending LINGER_S after its `data: [DONE]`
    - echoing: repeats the key it was sent, whole and its first and last 8 characters: streamed, "x", then an
      error event saying so, and the connection closed with no finish_reason and no [DONE]; whole, in its text
    - garbled: streamed, "Hello ", then an event that is not JSON, and the connection closed with no finish_reason
      and no [DONE]; garbled-whole: the same, then the end (finish_reason, [DONE])
    Its /v1/models answers 401, repeating the key it was sent, to any key but UPSTREAM_KEY.
    """

    def __init__(self) -> None:
        self.release = threading.Event()
        self.closed = threading.Event()
        super().__init__()

    async def models(self, request: Request) -> Response:
        sent = request.headers.get("authorization", "").removeprefix("Bearer ")
        if sent != UPSTREAM_KEY:
            return JSONResponse({"error": {"message": f"Incorrect API key provided: {sent}",
                                           "type": "invalid_request_error"}}, status_code=401)
        return await super().models(request)

    async def chat(self, request: Request) -> Response:
        body = await request.json()  # Starlette keeps it: FakeServer.chat reads it again
        model = body.get("model")
        if model not in ("gated", "unauthorized", "missing", "held", "counted", "lingering", "echoing", "garbled",
                         "garbled-whole", "spread"):
            return await super().chat(request)
        self.requests.append({"headers": dict(request.headers), "body": body})
        if model in ("counted", "lingering"):
            return _counted(body, LINGER_S if model == "lingering" else 0.0)
        if model == "echoing":
            sent = request.headers.get("authorization", "").removeprefix("Bearer ")
            said = f"upstream died; key was {sent} (starts {sent[:8]}, ends {sent[-8:]})"
            if not body.get("stream"):
                return JSONResponse({"id": "e", "object": "chat.completion", "model": "echoing", "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": said}, "finish_reason": "stop"}]})

            async def echoed() -> AsyncIterator[str]:
                yield _chunk(role="assistant")
                yield _chunk("x")
                yield "data: " + json.dumps({"error": {"message": said}}) + "\n\n"

            return StreamingResponse(echoed(), media_type="text/event-stream")
        if model == "spread":  # each event's JSON over several data: lines, CRLF line ends, a CR and its LF apart
            async def spread() -> AsyncIterator[str]:
                for piece in (_chunk(role="assistant"), _chunk("Hello "), _chunk("world"), _chunk(finish="stop")):
                    lines = json.dumps(json.loads(piece.removeprefix("data: ")), indent=1).split("\n")
                    yield "".join(f"data: {line}\r\n" for line in lines[:-1]) + f"data: {lines[-1]}\r"
                    yield "\n\r\n"
                yield "data: [DONE]\r\n\r\n"

            return StreamingResponse(spread(), media_type="text/event-stream")
        if model.startswith("garbled"):
            async def garbled() -> AsyncIterator[str]:
                yield _chunk(role="assistant")
                yield _chunk("Hello ")
                yield "data: this is not json\n\n"
                if model == "garbled-whole":
                    yield _chunk(finish="stop")
                    yield "data: [DONE]\n\n"

            return StreamingResponse(garbled(), media_type="text/event-stream")
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


def _counted(body: dict[str, Any], linger: float) -> Response:
    usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8,
             "prompt_tokens_details": {"cached_tokens": 2}}
    if not body.get("stream"):
        return JSONResponse({"id": "c", "object": "chat.completion", "model": "counted", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "Hello world"}, "finish_reason": "stop"}],
            "usage": usage})
    opts = body.get("stream_options")
    asked = isinstance(opts, dict) and opts.get("include_usage") is True

    def event(delta: dict[str, Any], finish: str | None = None) -> str:
        doc: dict[str, Any] = {"id": "c", "object": "chat.completion.chunk", "model": "counted",
                               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return f"data: {json.dumps({**doc, 'usage': None} if asked else doc)}\n\n"

    async def stream() -> AsyncIterator[str]:
        yield event({"role": "assistant", "content": ""})
        await asyncio.sleep(HOLD_S)
        yield event({"content": "Hello"})
        yield event({"content": " world"})
        yield event({}, "stop")
        if asked:
            yield "data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "model": "counted",
                                         "choices": [], "usage": usage}) + "\n\n"
        yield "data: [DONE]\n\n"
        await asyncio.sleep(linger)

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


def _logged(server: Server, wanted: Any) -> bool:
    """Whether a line of the server's log is `wanted` (a callable), waiting for it: a stream's access line is
    written once its end was sent, which the client may see first."""
    import time

    deadline = time.monotonic() + WAIT_S
    while not any(wanted(line) for line in _log(server).splitlines()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


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
        metrics = httpx.get(f"{front.url}/metrics", headers=_auth(), timeout=WAIT_S).text
        assert _metric(metrics, 'localgen_running_requests{model="gated"}') == 1, metrics
        assert 'localgen_queue_depth{model="gated"} 0.0' in metrics
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
    assert "the one this server sends fakebox (its api_key_env in endpoints.toml), not this request's" in message
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
    # logged with the error that ended it, not its 200
    assert _logged(front, lambda line: line.startswith("POST /v1/chat/completions 502 ")
                   and line.endswith(" via fakebox id=broken-stream-1"))


def test_an_answer_that_repeats_the_key_passes_without_it_and_one_cut_short_ends_with_an_error(
        front: Server) -> None:
    r = httpx.post(f"{front.url}/v1/chat/completions", headers={**_auth(), "X-Request-Id": "echoing-1"},
                   json=_chat("echoing"), timeout=WAIT_S)
    assert r.status_code == 200
    events = _events(r.text)
    assert events[-3]["error"]["message"] == "upstream died; key was *** (starts ***, ends ***)"
    # closed with no finish_reason and no [DONE]: the client is told, as for a connection that breaks
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == 502
    assert "ended before the answer did" in events[-2]["error"]["message"]
    whole = httpx.post(f"{front.url}/v1/chat/completions", headers=_auth(), json=_chat("echoing", stream=False),
                       timeout=WAIT_S)
    assert whole.json()["choices"][0]["message"]["content"] == "upstream died; key was *** (starts ***, ends ***)"
    for text in (r.text, whole.text):
        assert UPSTREAM_KEY[:8] not in text and UPSTREAM_KEY[-8:] not in text
    assert _logged(front, lambda line: line.startswith("POST /v1/chat/completions 502 ")
                   and line.endswith(" via fakebox id=echoing-1"))


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
    assert _logged(front, lambda line: line.startswith("POST /v1/chat/completions 200 7+2 tokens")
                   and " via fakebox id=" in line), _log(front)
    log = _log(front)
    assert "remote models (--endpoint fakebox" in log
    for text in [*shown, log]:
        assert UPSTREAM_KEY not in text


def _metric(text: str, series: str) -> float:
    """A series' value in a /metrics text (0 where it has none yet)."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def _events(body: str) -> list[Any]:
    """A stream's data events, each JSON read ([DONE] as it is)."""
    return [json.loads(d) if d != "[DONE]" else d for line in body.splitlines()
            if line.startswith("data: ") and (d := line.removeprefix("data: "))]


def test_a_streams_usage_is_asked_for_the_log_and_metrics_and_the_client_gets_what_it_asked_for(
        front: Server, upstream: Upstream) -> None:
    import openai

    def scrape() -> dict[str, float]:
        text = httpx.get(f"{front.url}/metrics", headers=_auth(), timeout=WAIT_S).text
        return {name: _metric(text, f'{name}{{model="counted"}}') for name in (
            "localgen_prompt_tokens_total", "localgen_generated_tokens_total",
            "localgen_time_to_first_token_seconds_count", "localgen_inter_token_seconds_count")} | {
            "fast": _metric(text, 'localgen_time_to_first_token_seconds_bucket{le="0.25",model="counted"}')}

    before = scrape()
    direct = httpx.post(f"{upstream.url}/v1/chat/completions", json=_chat("counted"), timeout=WAIT_S)
    via = httpx.post(f"{front.url}/v1/chat/completions", headers={**_auth(), "X-Request-Id": "counted-stream-1"},
                     json=_chat("counted"), timeout=WAIT_S)
    assert via.status_code == 200 and _events(via.text) == _events(direct.text), via.text  # no usage: none asked
    assert "usage" not in via.text
    assert upstream.requests[-1]["body"]["stream_options"] == {"include_usage": True}  # serve asked for it
    assert _logged(front, lambda line: line.startswith("POST /v1/chat/completions 200 5+3 tokens ")
                   and line.endswith(" via fakebox id=counted-stream-1")), _log(front)
    after = scrape()
    assert after["localgen_prompt_tokens_total"] == before["localgen_prompt_tokens_total"] + 5
    assert after["localgen_generated_tokens_total"] == before["localgen_generated_tokens_total"] + 3
    assert after["localgen_time_to_first_token_seconds_count"] == \
        before["localgen_time_to_first_token_seconds_count"] + 1
    assert after["localgen_inter_token_seconds_count"] == before["localgen_inter_token_seconds_count"] + 1
    # the first content came HOLD_S after the role chunk: the time to it is not the time to the first byte
    assert after["fast"] == before["fast"]

    client = openai.OpenAI(base_url=f"{front.url}/v1", api_key=KEY)
    ask: dict[str, Any] = {"model": "counted", "messages": [{"role": "user", "content": "hi"}]}
    chunks = list(client.chat.completions.create(**ask, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello world"
    assert all(c.choices and "usage" not in c.model_fields_set for c in chunks)
    chunks = list(client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    assert all(c.usage is None and "usage" in c.model_fields_set for c in chunks[:-1])  # as the upstream sent them
    whole = client.chat.completions.create(**ask)
    assert whole.usage is not None and whole.usage.prompt_tokens == 5
    assert _metric(httpx.get(f"{front.url}/metrics", headers=_auth(), timeout=WAIT_S).text,
                   'localgen_generated_tokens_total{model="counted"}') == after["localgen_generated_tokens_total"] + 9


def test_a_client_that_closes_at_done_has_its_answer_logged_whole(front: Server) -> None:
    """Clients close the connection once they read `data: [DONE]` (the `openai` client does): the answer ends there
    for the front too, not when the upstream's body ends, so its access line has its 200 and its tokens."""
    headers = {**_auth(), "X-Request-Id": "lingering-1"}
    with httpx.Client(timeout=WAIT_S) as c, c.stream("POST", f"{front.url}/v1/chat/completions", headers=headers,
                                                     json=_chat("lingering")) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line == "data: [DONE]":
                break  # and the connection is closed, LINGER_S before the upstream ends its body
    assert _logged(front, lambda line: line.endswith(" via fakebox id=lingering-1")), _log(front)
    assert any(line.startswith("POST /v1/chat/completions 200 5+3 tokens ") and line.endswith("id=lingering-1")
               for line in _log(front).splitlines()), _log(front)


def test_a_batch_of_a_remote_models_requests_runs_through_the_front(front: Server, upstream: Upstream) -> None:
    """The Batch API sends each line through the server's own routes: a remote model's lines go upstream as a
    client's request would, here one after another (the front's -np 1 and --max-queue 0: a line waits for the
    model's one place rather than take its queue, so none is refused a place)."""
    import time

    import openai

    client = openai.OpenAI(base_url=f"{front.url}/v1", api_key=KEY)
    sent = len(upstream.requests)
    lines = "".join(json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": "counted", "messages": [{"role": "user", "content": f"hi {i}"}]}}) + "\n" for i in range(3))
    given = client.files.create(file=("remote.jsonl", lines.encode()), purpose="batch")
    batch = client.batches.create(input_file_id=given.id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + WAIT_S
    while batch.status not in ("completed", "failed", "expired", "cancelled") and time.monotonic() < deadline:
        time.sleep(0.1)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.output_file_id, batch
    assert batch.request_counts is not None and batch.request_counts.completed == 3, batch.request_counts
    records = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
    assert sorted(r["custom_id"] for r in records) == ["line-0", "line-1", "line-2"]
    for r in records:
        assert r["response"]["status_code"] == 200 and r["error"] is None, r
        assert r["response"]["body"]["choices"][0]["message"]["content"] == "Hello world"
        assert r["response"]["body"]["usage"]["completion_tokens"] == 3  # the upstream's own answer
    assert sorted(m["body"]["messages"][0]["content"] for m in upstream.requests[sent:]) == ["hi 0", "hi 1", "hi 2"]
    assert all(m["headers"]["authorization"] == f"Bearer {UPSTREAM_KEY}" for m in upstream.requests[sent:])


def test_an_upstreams_long_error_is_cut_alike_by_serve_and_run(front_env: dict[str, str]) -> None:
    """An upstream's error message reads the same through serve --endpoint and run --endpoint (one reading,
    remote/errortext.py's error_text): cut at 300 characters, with "…"."""
    strict = StrictServer()
    s = Server(front_env, "--no-on-demand", "--endpoint", strict.url)
    cut = StrictServer.WORDY[:299] + "…"
    try:
        r = httpx.post(f"{s.url}/v1/chat/completions", json=_chat("wordy"), timeout=WAIT_S)
        assert r.status_code == 400 and r.json()["error"]["message"] == \
            f"127.0.0.1:{strict.port} answered 400: {cut}", r.text
        ran = CLI(front_env)("run", "--endpoint", strict.url, "-m", "wordy", "-p", "hi", timeout=60)
        assert ran.returncode == 1 and f"rejected the request (400): {cut}\n" in ran.stderr, ran.stderr
    finally:
        assert s.stop() == 0
        strict.stop()


def test_a_batchs_remote_lines_run_at_once_up_to_batch_lines_within_parallel(front_env: dict[str, str],
                                                                            tmp_path: Path) -> None:
    """A batch of a remote model's lines keeps --batch-lines of them in flight upstream (3 here), within the
    model's --parallel places (2 with -np 2): none waits in the model's queue, none is refused for room. Each
    server in a home of its own: the module's front holds the batches of front_env's."""
    import time

    import openai

    lines = "".join(json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": "plain", "messages": [{"role": "user", "content": f"hi {i}"}]}}) + "\n" for i in range(7))
    for flags, most in ((("--batch-lines", "3"), 3), (("--batch-lines", "3", "-np", "2", "--max-queue", "0"), 2)):
        gathering = GatheringServer(target=most)
        home = tmp_path / f"home-{most}"
        s = Server({**front_env, "LOCALGEN_HOME": str(home)}, "--no-on-demand", "--endpoint", gathering.url, *flags)
        try:
            client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="none")
            given = client.files.create(file=("remote.jsonl", lines.encode()), purpose="batch")
            batch = client.batches.create(input_file_id=given.id, endpoint="/v1/chat/completions",
                                          completion_window="24h")
            deadline = time.monotonic() + WAIT_S
            while batch.status not in ("completed", "failed", "cancelled") and time.monotonic() < deadline:
                time.sleep(0.1)
                batch = client.batches.retrieve(batch.id)
            assert batch.status == "completed" and batch.output_file_id, batch
            assert batch.request_counts is not None and batch.request_counts.completed == 7, batch.request_counts
            records = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
            assert sorted(r["custom_id"] for r in records) == sorted(f"line-{i}" for i in range(7))
            assert {r["response"]["body"]["choices"][0]["message"]["content"] for r in records} == {"Hello world"}
            assert gathering.most == most, (flags, gathering.most)
        finally:
            assert s.stop() == 0
            gathering.stop()


def test_an_upstream_silent_past_the_timeout_is_a_504_and_leaves_nothing_open(front_env: dict[str, str], tiny: str,
                                                                              upstream: Upstream) -> None:
    """--endpoint-timeout 1, one request at a time and none waiting: a request whose answer never starts is a 504
    in OpenAI's shape, a stream that stops sending ends with a 504 error event; each time the upstream's connection
    is closed and the model's one place is free again (a next request goes through, not a 503)."""
    s = Server(front_env, "-m", tiny, "--no-on-demand", "-np", "1", "--max-queue", "0", "--endpoint", "fakebox",
               "--endpoint-timeout", "1")
    try:
        upstream.release.clear()
        upstream.closed.clear()
        r = httpx.post(f"{s.url}/v1/chat/completions", json={**_chat("held"), "stream": False}, timeout=WAIT_S)
        assert r.status_code == 504, r.text
        error = r.json()["error"]
        assert error["type"] == "server_error" and "fakebox did not answer within 1 s" in error["message"], error
        assert "--endpoint-timeout" in error["message"] and r.json()["request_id"]
        assert upstream.closed.wait(WAIT_S), "the upstream's connection was left open"
        upstream.release.set()
        r = httpx.post(f"{s.url}/v1/chat/completions", json={**_chat("held"), "stream": False}, timeout=WAIT_S)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "all at once", r.text

        upstream.release.clear()
        upstream.closed.clear()
        r = httpx.post(f"{s.url}/v1/chat/completions", json=_chat("gated"), timeout=WAIT_S)
        events = _events(r.text)
        assert r.status_code == 200 and events[-1] == "[DONE]"
        assert events[1]["choices"][0]["delta"]["content"] == "first"
        error = events[-2]["error"]
        assert error["code"] == 504 and "fakebox sent nothing for 1 s" in error["message"], error
        assert upstream.closed.wait(WAIT_S), "the upstream's stream was left open"
        upstream.release.set()
        r = httpx.post(f"{s.url}/v1/chat/completions", json=_chat("gated"), timeout=WAIT_S)
        assert r.status_code == 200 and "second" in r.text and r.text.rstrip().endswith("[DONE]"), r.text
        assert _logged(s, lambda line: line.startswith("POST /v1/chat/completions 504 ")), _log(s)
    finally:
        upstream.release.set()
        assert s.stop() == 0


def test_with_endpoint_and_no_model_named_nothing_loads_at_start(front_env: dict[str, str],
                                                                upstream: Upstream) -> None:
    """serve --endpoint without -m: the remote models, and every model here on demand (the embedded smollm2:135m
    in this empty home), with no load at start; a request that names no model is told to name one."""
    s = Server(front_env, "--endpoint", "fakebox")
    try:
        log = _log(s)
        assert "localgen serve: remote models, no model loaded at start (every model here on demand) on " in log, log
        assert "remote models (--endpoint fakebox" in log and "loaded smollm2:135m" not in log
        assert httpx.get(f"{s.url}/health", timeout=WAIT_S).json()["models"] == {}
        assert httpx.get(f"{s.url}/api/ps", timeout=WAIT_S).json()["models"] == []
        listed = {m["id"]: m for m in httpx.get(f"{s.url}/v1/models", timeout=WAIT_S).json()["data"]}
        assert listed["plain"]["owned_by"] == "fakebox" and listed["smollm2:135m"]["owned_by"] == "localgen", listed
        assert not any(m.get("default") for m in listed.values())
        r = httpx.post(f"{s.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]},
                       timeout=WAIT_S)
        assert r.status_code == 400 and r.json()["error"]["param"] == "model", r.text
        assert "name a model: this server has no default model (serve --endpoint without -m)" in r.text
        assert "plain" in r.json()["error"]["message"] and "smollm2:135m" in r.json()["error"]["message"]
        r = httpx.post(f"{s.url}/v1/chat/completions", json=_chat("counted", stream=False), timeout=WAIT_S)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Hello world", r.text
        r = httpx.post(f"{s.url}/v1/completions", json={"model": "smollm2:135m", "prompt": "Hi", "max_tokens": 2},
                       timeout=WAIT_S * 5)
        assert r.status_code == 200, r.text  # loaded on demand, as ever
        assert [m["name"] for m in httpx.get(f"{s.url}/api/ps", timeout=WAIT_S).json()["models"]] == ["smollm2:135m"]
    finally:
        assert s.stop() == 0


def test_the_chat_page_chats_with_a_remote_model(browser: Any, front_env: dict[str, str],  # noqa: F811
                                                 upstream: Upstream) -> None:
    """The chat page (serve --endpoint without -m) lists the remote models, says where one runs instead of
    "not loaded yet", and streams its answer with the upstream's count. An event of the upstream's that is not JSON
    is skipped: the answer says serve's reason for its end, never a parser's message."""
    s = Server(front_env, "--endpoint", "fakebox")
    tab = Tab(browser, s)
    try:
        page = tab.open(key=False)
        page.wait_for_function("() => document.querySelectorAll('#model option').length > 0")
        page.select_option("#model", "counted")
        page.wait_for_function("() => document.getElementById('model-note')?.textContent === 'on fakebox'")
        article = ask(page, "hi")
        assert article.locator(".body").inner_text().strip() == "Hello world"
        stats = article.locator(".stats").inner_text()
        assert stats.startswith("3 tokens"), stats  # the upstream's usage
        assert upstream.requests[-1]["body"]["model"] == "counted"
        assert page.text_content("#model-note") == "on fakebox"
        page.select_option("#model", "garbled")
        article = ask(page, "hi")
        assert article.locator(".body").inner_text().strip() == "Hello"
        assert article.locator(".note").inner_text() == (
            "the answer from fakebox ended before the answer did (no finish_reason, no [DONE]): it is partial")
        page.select_option("#model", "garbled-whole")  # no error event: the page says it
        article = ask(page, "hi")
        assert article.locator(".body").inner_text().strip() == "Hello"
        assert article.locator(".note").inner_text() == (
            "The server sent a part of the answer that could not be read (not JSON): what is shown may lack words.")
        page.select_option("#model", "spread")  # events as the SSE spec writes them: every word read
        article = ask(page, "hi")
        assert article.locator(".body").inner_text().strip() == "Hello world"
        assert article.locator(".note").count() == 0 or not article.locator(".note").inner_text().strip()
    finally:
        tab.close()
        assert s.stop() == 0


# ---- what stops the start ----

def test_what_stops_the_start(front_env: dict[str, str], upstream: Upstream) -> None:
    cli = CLI(front_env)
    port = str(_free_port())
    r = cli("serve", "--port", port, "--endpoint", f"http://127.0.0.1:{_free_port()}", timeout=120)
    assert r.returncode == 1 and "--endpoint: cannot reach 127.0.0.1:" in r.stderr and "Traceback" not in r.stderr
    r = cli("serve", "--port", port, "--endpoint", f"{upstream.url}/nothing-here", timeout=120)
    assert r.returncode == 1 and "lists no models at" in r.stderr and "Traceback" not in r.stderr
    assert '([NAME] url = "..." models = [...])' in r.stderr and "docs/" not in r.stderr, r.stderr  # pip has no docs/
    # LOCALGEN_ENDPOINT is run's: serve does not take it for --endpoint
    r = CLI({**front_env, "LOCALGEN_ENDPOINT": upstream.url})("serve", "--port", port, "--api-key-env", "UPSTREAM_KEY",
                                                               timeout=120)
    assert r.returncode == 2 and "--api-key-env goes with --endpoint" in r.stderr
    r = cli("serve", "--port", port, "--endpoint", "nosuchbox", timeout=120)
    assert r.returncode == 2 and "neither an http:// or https:// URL nor an entry of" in r.stderr
    r = cli("serve", "--port", port, "--endpoint", "fakebox", "--draft", "smollm2:135m", timeout=120)
    assert r.returncode == 2 and "--draft goes with a model loaded at start, and with --endpoint and no -m none is" \
        in r.stderr and "-m" in r.stderr
    some_file = front_env["LOCALGEN_HOME"] + "/config/endpoints.toml"  # a file that exists: read no further
    for flag in ("--mmproj", "--chat-template-file"):
        r = cli("serve", "--port", port, "--endpoint", "fakebox", flag, some_file, timeout=120)
        assert r.returncode == 2 and f"{flag} goes with a model loaded at start" in r.stderr, r.stderr
    r = cli("serve", "--port", port, "--endpoint-timeout", "5", timeout=120)
    assert r.returncode == 2 and "--endpoint-timeout goes with --endpoint" in r.stderr
    # a server that refuses the key it was sent (and repeats it): exit 1, the key nowhere in what serve says
    wrong = "sk-wrong-key-0a1b2c"
    r = CLI({**front_env, "WRONG_KEY": wrong})("serve", "--port", port, "--endpoint", upstream.url,
                                              "--api-key-env", "WRONG_KEY", timeout=120)
    assert r.returncode == 1 and f"--endpoint 127.0.0.1:{upstream.port} refused to list its models (401)" in r.stderr
    assert "Incorrect API key provided: ***" in r.stderr and "--api-key-env" in r.stderr, r.stderr
    assert wrong not in r.stderr + r.stdout and "Traceback" not in r.stderr


def test_a_name_two_endpoints_serve_is_reached_by_endpoint_name(front_env: dict[str, str], tiny: str,
                                                                 upstream: Upstream) -> None:
    """`plain` is served by fakebox and by twin: the bare name means neither, `fakebox/plain` and `twin/plain`
    each its own (sent on under the server's own id); a name one endpoint alone serves keeps its bare name."""
    s = Server(front_env, "-m", tiny, "--no-on-demand", "--endpoint", "fakebox", "--endpoint", "twin")
    try:
        ids = [m["id"] for m in httpx.get(f"{s.url}/v1/models", timeout=WAIT_S).json()["data"]]
        assert "fakebox/plain" in ids and "twin/plain" in ids and "plain" not in ids, ids
        assert "usage" in ids and "fakebox/usage" not in ids, "listed once, by its bare name"
        before = len(upstream.requests)
        r = httpx.post(f"{s.url}/v1/chat/completions", json=_chat("fakebox/plain", stream=False), timeout=WAIT_S)
        assert r.status_code == 200, r.text
        assert upstream.requests[before]["body"]["model"] == "plain", "sent under its server's own id"
        r = httpx.post(f"{s.url}/v1/chat/completions", json=_chat("fakebox/usage", stream=False), timeout=WAIT_S)
        assert r.status_code == 200 and upstream.requests[-1]["body"]["model"] == "usage", r.text
        r = httpx.post(f"{s.url}/v1/chat/completions", json=_chat("plain", stream=False), timeout=WAIT_S)
        assert r.status_code == 404 and len(upstream.requests) == before + 2, r.text
    finally:
        assert s.stop() == 0


def test_an_upstream_that_refuses_stream_options_gets_the_stream_as_the_client_sent_it(
        front_env: dict[str, str]) -> None:
    """serve adds stream_options to a stream's request for its usage; an upstream that refuses the field (400 or
    422 naming it) gets the request once more as the client sent it, and the client a normal stream; the
    endpoint is remembered (its next streams go without the field at once) and said once in the log. A field the
    client sent itself, or a 400 about another field, comes back as the upstream's error."""
    strict = StrictServer()
    s = Server(front_env, "--no-on-demand", "--endpoint", strict.url)
    where = f"127.0.0.1:{strict.port}"
    try:
        direct = httpx.post(f"{strict.url}/v1/chat/completions", json=_chat("plain"), timeout=WAIT_S)
        assert direct.status_code == 200
        strict.requests.clear()
        r = httpx.post(f"{s.url}/v1/chat/completions", headers={"X-Request-Id": "strict-1"}, json=_chat("plain"),
                       timeout=WAIT_S)
        assert r.status_code == 200 and _events(r.text) == _events(direct.text), r.text
        sent = [m["body"] for m in strict.requests]
        assert [b.get("stream_options") for b in sent] == [{"include_usage": True}, None], sent
        assert sent[1] == _chat("plain"), "the second time as the client sent it"
        assert _logged(s, lambda line: line.startswith("POST /v1/chat/completions 200 0+0 tokens ")
                       and line.endswith(f" via {where} id=strict-1")), _log(s)  # no usage: none counted
        metrics = httpx.get(f"{s.url}/metrics", timeout=WAIT_S).text
        assert _metric(metrics, 'localgen_time_to_first_token_seconds_count{model="plain"}') == 1, metrics

        strict.requests.clear()  # remembered: the next stream goes as it came, once
        r = httpx.post(f"{s.url}/v1/chat/completions", json=_chat("plain"), timeout=WAIT_S)
        assert r.status_code == 200 and _events(r.text) == _events(direct.text), r.text
        assert [m["body"] for m in strict.requests] == [_chat("plain")]
        assert _log(s).count("refuses stream_options") == 1, _log(s)
        assert f"warning: {where} refuses stream_options: its streams are sent on without them" in _log(s)

        # the client's own stream_options: the upstream's answer, not sent again
        strict.requests.clear()
        r = httpx.post(f"{s.url}/v1/chat/completions", json=_chat("plain", stream_options={"include_usage": True}),
                       timeout=WAIT_S)
        assert r.status_code == 400 and len(strict.requests) == 1, r.text
        assert r.json()["error"]["message"] == \
            f"{where} answered 400: Unrecognized request argument supplied: stream_options"
        # a 400 about something else comes back as it was, sent once
        strict.requests.clear()
        r = httpx.post(f"{s.url}/v1/chat/completions", json=_chat("picky"), timeout=WAIT_S)
        assert r.status_code == 400 and len(strict.requests) == 1, r.text
        assert r.json()["error"]["message"] == f"{where} answered 400: temperature must be at most 2"
    finally:
        assert s.stop() == 0

    # a 422 in pydantic's shape, at /v1/completions, on a fresh server
    s = Server(front_env, "--no-on-demand", "--endpoint", strict.url)
    try:
        strict.requests.clear()
        r = httpx.post(f"{s.url}/v1/completions", json={"model": "plain", "prompt": "hi", "stream": True},
                       timeout=WAIT_S)
        assert r.status_code == 200 and "".join(e["choices"][0]["text"] for e in _events(r.text)[:-1]) == \
            "Hello world", r.text
        assert [m["body"].get("stream_options") for m in strict.requests] == [{"include_usage": True}, None]
    finally:
        assert s.stop() == 0
        strict.stop()


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
    chunks = list(front.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True},
                                                extra_headers={"X-Request-Id": "real-asked"}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    unasked = list(front.chat.completions.create(**ask, stream=True, extra_headers={"X-Request-Id": "real-unasked"}))
    assert "".join(c.choices[0].delta.content or "" for c in unasked if c.choices) == whole.choices[0].message.content
    assert all(c.choices and c.usage is None for c in unasked)  # serve asked for the usage, and kept it
    raw = {"model": "smollm2:135m", "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0}
    assert front.completions.create(**raw).choices[0].text == direct.completions.create(**raw).choices[0].text
    via = front.embeddings.create(model="smollm2:135m", input=["a cat sat", "stocks fell"])
    assert [d.embedding for d in via.data] == [d.embedding for d in direct.embeddings.create(
        model="smollm2:135m", input=["a cat sat", "stocks fell"]).data]
    shaped = front.chat.completions.create(**{**ask, "max_tokens": 40}, response_format={
        "type": "json_schema", "json_schema": {"name": "c", "schema": {
            "type": "object", "properties": {"colour": {"type": "string", "maxLength": 12}}, "required": ["colour"]}}})
    assert isinstance(json.loads(shaped.choices[0].message.content or "")["colour"], str)
    def requests() -> list[dict[str, Any]]:
        lines = [json.loads(line) for line in _log(real_front).splitlines() if line.startswith("{")]
        return [d for d in lines if d["event"] == "request" and d["path"] == "/v1/chat/completions"]

    assert _logged(real_front, lambda line: len(requests()) >= 4), "whole, streamed twice and shaped"
    sent = requests()
    assert sent and all(d["upstream"] == f"127.0.0.1:{real.port}" and d["model"] == "smollm2:135m" for d in sent)
    assert sent[0]["completion_tokens"] == whole.usage.completion_tokens, sent  # from the answer's usage
    assert sent[0]["ttft_ms"] is None  # a whole answer's text comes at once: no time to a first token
    streamed = next(d for d in sent if d["request_id"] == "real-unasked")
    assert streamed["completion_tokens"] == whole.usage.completion_tokens and streamed["prompt_tokens"] > 5
    assert streamed["ttft_ms"] > 0
    asked = next(d for d in sent if d["request_id"] == "real-asked")
    details = chunks[-1].usage.prompt_tokens_details
    assert details is not None and asked["cached_tokens"] == details.cached_tokens
    metrics = httpx.get(f"{real_front.url}/metrics", timeout=WAIT_S).text
    assert _metric(metrics, 'localgen_time_to_first_token_seconds_count{model="smollm2:135m"}') == 2  # the streams
    every = [json.loads(line) for line in _log(real_front).splitlines() if line.startswith("{")]  # completions too
    assert _metric(metrics, 'localgen_generated_tokens_total{model="smollm2:135m"}') == sum(
        d["completion_tokens"] or 0 for d in every if d["event"] == "request" and d.get("upstream"))
    embedded = [d for d in every if d["event"] == "request" and d["path"] == "/v1/embeddings"]
    assert embedded and embedded[0]["prompt_tokens"] > 0  # logged, and (as a local model's) not in the series:
    assert _metric(metrics, 'localgen_prompt_tokens_total{model="smollm2:135m"}') == sum(
        d["prompt_tokens"] for d in every if d["event"] == "request" and d.get("upstream") and d not in embedded)


def test_a_name_served_here_stays_here_and_its_upstream_twin_is_reached_by_endpoint(cli_env: dict[str, str],
                                                                                    tiny: str, real: Server) -> None:
    # the session's home has smollm2:135m on disk, offered on demand: the bare name is this server's model, the
    # upstream's is ENDPOINT/smollm2:135m
    s = Server(cli_env, "-m", tiny, "--endpoint", real.url)
    try:
        label = f"127.0.0.1:{real.port}"
        listed = {m["id"]: m for m in httpx.get(f"{s.url}/v1/models", timeout=WAIT_S).json()["data"]}
        assert listed[f"{label}/smollm2:135m"]["owned_by"] == label, listed
        assert listed["smollm2:135m"]["owned_by"] != label and "upstream" not in listed["smollm2:135m"]
        raw = {"model": f"{label}/smollm2:135m", "prompt": "The capital of France is", "max_tokens": 4,
               "temperature": 0}
        r = httpx.post(f"{s.url}/v1/completions", json=raw, timeout=WAIT_S)
        direct = httpx.post(f"{real.url}/v1/completions", json={**raw, "model": "smollm2:135m"}, timeout=WAIT_S)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == direct.json()["choices"][0]["text"]
        assert "served here, so reached upstream only as ENDPOINT/NAME: smollm2:135m" in _log(s)
    finally:
        assert s.stop() == 0
