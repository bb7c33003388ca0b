"""Edges from issues #42 and #47: origin patterns with brackets, a projector's quantization read as a whole tag,
errors that name the attachment the user gave, `modalities` and `chat_template_kwargs` in chat requests, and a
shutdown with requests in flight."""

from __future__ import annotations

import json
import signal
import struct
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from tests.conftest import CLI, ROOT
from tests.test_serve import Server
from tests.test_serving_core import _listening

sys.path.insert(0, str(ROOT / "scripts"))
from make_mmproj import png, write_mmproj

MODEL = "smollm2:135m"


# ---- #47.4: origins ----------------------------------------------------------------------------------

def test_origin_patterns_have_only_star_as_a_wildcard() -> None:
    from localgen.errors import UsageError
    from localgen.serve.guard import Policy, origins_from

    policy = Policy()
    for allowed in ("http://[::1]:5173", "http://[::1]", "https://[::1]:8443", "http://localhost:3000",
                    "https://127.0.0.1", "http://0.0.0.0:8080", "app://obsidian.md", "vscode-webview://abc"):
        assert policy.origin_allowed(allowed), allowed
    for refused in ("http://1:5173", "http://:5173", "http://[::2]:5173", "http://evil.test", "https://evil.test",
                    "http://localhost.evil.test", "http://127.0.0.1.evil.test"):
        assert not policy.origin_allowed(refused), refused
    extra = Policy(origins=origins_from(["http://a.test", "https://*.example.test"], None))
    assert extra.origin_allowed("http://a.test") and not extra.origin_allowed("http://ab.test")
    with pytest.raises(UsageError, match="not an origin"):  # ? is no wildcard: and no origin holds one
        origins_from(["http://a?.test"], None)
    assert extra.origin_allowed("https://app.example.test") and not extra.origin_allowed("https://example.test")


def test_the_gate_lets_a_bracketed_loopback_page_in_with_cors_headers() -> None:
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from localgen.serve.guard import Gate, Policy

    async def hello(request: Any) -> PlainTextResponse:
        return PlainTextResponse("hi")

    client = TestClient(Gate(Starlette(routes=[Route("/v1/models", hello)]), Policy(check_host=False)))
    ok = client.get("/v1/models", headers={"Origin": "http://[::1]:5173"})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://[::1]:5173"
    pre = client.options("/v1/models", headers={"Origin": "http://[::1]:5173", "Access-Control-Request-Method": "POST"})
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://[::1]:5173"
    refused = client.get("/v1/models", headers={"Origin": "http://1:5173"})
    assert refused.status_code == 403 and "--cors http://1:5173" in refused.json()["error"]["message"]


def test_a_preflight_for_a_method_not_allowed_is_refused_in_the_routes_api_shape() -> None:
    """A preflight asking for a method serve does not take was Starlette's plain-text "Disallowed CORS method";
    it is the route's API error now (OpenAI's, Ollama's, Anthropic's), its CORS headers kept."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from localgen.serve.guard import Gate, Policy

    async def hello(request: Any) -> PlainTextResponse:
        return PlainTextResponse("hi")

    routes = [Route(p, hello, methods=["POST"]) for p in ("/v1/chat/completions", "/api/chat", "/v1/messages")]
    client = TestClient(Gate(Starlette(routes=routes), Policy(check_host=False)))
    page = {"Origin": "http://localhost:5173", "Access-Control-Request-Method": "PATCH"}
    openai = client.options("/v1/chat/completions", headers=page)
    assert openai.status_code == 400 and openai.headers["access-control-allow-origin"] == "http://localhost:5173"
    error = openai.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"] == (
        "the CORS preflight asks for the method PATCH, which serve does not take (it takes GET, POST, DELETE, "
        "OPTIONS, HEAD)"), error
    assert client.options("/api/chat", headers=page).json()["error"].startswith("the CORS preflight asks")
    anthropic = client.options("/v1/messages", headers=page).json()
    assert anthropic["type"] == "error" and anthropic["error"]["type"] == "invalid_request_error", anthropic
    allowed = client.options("/v1/chat/completions", headers={**page, "Access-Control-Request-Method": "POST"})
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == "http://localhost:5173"


# ---- #47.6: the projector pull picks --------------------------------------------------------------------

@pytest.mark.parametrize(("names", "want"), [
    (["mmproj-Qwen2.5-VL-3B-bf16.gguf", "mmproj-Qwen2.5-VL-3B-f16.gguf"], "mmproj-Qwen2.5-VL-3B-f16.gguf"),
    (["mmproj-BF16.gguf", "mmproj-F16.gguf", "model-Q4_K_M.gguf"], "mmproj-F16.gguf"),
    (["mmproj-model-bf16.gguf", "mmproj-model-f32.gguf"], "mmproj-model-bf16.gguf"),
    (["mmproj-x-f16.gguf", "mmproj-x-Q8_0.gguf", "mmproj-x-bf16.gguf"], "mmproj-x-Q8_0.gguf"),
    (["sub/mmproj-x-bf16.gguf", "sub/mmproj-x-F16.gguf"], "sub/mmproj-x-F16.gguf"),
    (["mmproj-x-bf16.gguf"], "mmproj-x-bf16.gguf"),
    (["mmproj-x-Q8_0_L.gguf", "mmproj-x-bf16.gguf"], "mmproj-x-bf16.gguf"),
    (["model-f16.gguf"], None),
])
def test_the_projector_is_chosen_by_whole_quantization_tags(names: list[str], want: str | None) -> None:
    from localgen.models.mmproj import choose

    assert choose(names) == want


def test_a_pulled_projector_is_found_by_whole_tags(tmp_path: Path) -> None:
    from localgen.models.mmproj import in_folder

    for name in ("mmproj-m-bf16.gguf", "mmproj-m-f16.gguf", "m-Q4_K_M.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    assert in_folder(tmp_path) == tmp_path / "mmproj-m-f16.gguf"


# ---- #47.8: errors name the attachment the user gave -------------------------------------------------

def _wav(seconds: float, rate: int = 8000) -> bytes:
    n = int(seconds * rate)
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate, 1, 8)
    return (b"RIFF" + struct.pack("<I", 36 + n) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + b"data"
            + struct.pack("<I", n) + b"\x80" * n)


def _corrupt_png() -> bytes:
    """Whole chunks up to IEND, but the IDAT is not zlib data: only the decoder can tell."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 8, 8, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", b"garbage" * 4) + chunk(b"IEND", b""))


def test_a_truncated_png_is_named_by_its_path_when_read(tmp_path: Path) -> None:
    from localgen import media

    whole = png(96, 64)
    cut = tmp_path / "trunc.png"
    cut.write_bytes(whole[:len(whole) // 2])
    with pytest.raises(media.MediaError) as e:
        media.read(str(cut))
    assert e.value.message == f"{cut} is a truncated PNG: it ends before its IEND chunk"
    (tmp_path / "whole.png").write_bytes(whole)
    assert media.read(str(tmp_path / "whole.png")).format == "PNG"


def test_parts_read_back_keep_the_name_they_were_made_from(tmp_path: Path) -> None:
    """run and chat carry an attachment as a data: URI or base64 in the message; libmtmd's decode and the
    audio length check see the Media read back from it, whose source must still be the user's file."""
    from localgen import media

    pic, clip = tmp_path / "broken.png", tmp_path / "clip.wav"
    pic.write_bytes(_corrupt_png())
    clip.write_bytes(_wav(1.25))
    parts = media.content("Describe.", [media.read(str(pic)), media.read(str(clip))])
    _, found = media.split([{"role": "user", "content": parts}], media.MARKER)
    assert [m.source for m in found] == [str(pic), str(clip)]
    assert found[0].sha256 == media.sniff(_corrupt_png(), "x").sha256
    with pytest.raises(media.MediaError, match=f"^{clip} is 12.0 minutes of audio"):
        media.check_seconds(720, found[1].source)
    # bytes no part was made from here (a client's data: URI, Ollama's base64) are named as what they are
    other = png(10, 10)
    assert media.from_url("data:image/png;base64," + _b64(other), allow_http=False).source == "data URI"
    assert media.from_url(_b64(other), allow_http=False).source == "base64 data"


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()


def test_run_names_the_attachment_it_cannot_use(cli: CLI, tmp_path: Path) -> None:
    proj = write_mmproj(tmp_path / "proj.gguf")
    whole = png(96, 64)
    cut, broken = tmp_path / "trunc.png", tmp_path / "broken.png"
    cut.write_bytes(whole[:len(whole) // 2])
    broken.write_bytes(_corrupt_png())
    for path, words in ((cut, "is a truncated PNG"), (broken, "is a corrupt or unreadable PNG image")):
        r = cli("run", "--mmproj", str(proj), "-a", str(path), "-p", "Describe it.", "-n", "4")
        assert r.returncode != 0 and r.stdout == ""
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and f"{path} {words}" in lines[0], r.stderr


# ---- #47.9, #47.10, #42: modalities and chat_template_kwargs ------------------------------------------

def _chat_request(body: dict[str, Any]) -> Any:
    """serve's OpenAI request parsing, in process, for a worker that only needs its defaults and window."""
    import asyncio

    from localgen.serve import openai
    from localgen.serve.pipeline import generation
    from localgen.serve.state import ServeState

    summary = SimpleNamespace(chat_template="{{ x }}")
    worker = SimpleNamespace(ref=SimpleNamespace(sampling_defaults={}, summary=summary), n_ctx=2048)
    state = ServeState(workers={})
    full = {"messages": [{"role": "user", "content": "Hi"}], **body}

    async def parsed() -> Any:
        return (await generation(state, worker, await openai.CHAT.parse(full)))[0]  # type: ignore[arg-type]

    return asyncio.run(parsed())


def test_modalities_text_is_accepted_and_audio_output_refused() -> None:
    from localgen.serve.apierror import HTTPError

    assert _chat_request({"modalities": ["text"]}).messages[0]["content"] == "Hi"
    assert _chat_request({"modalities": []}).messages
    for body, param, words in [
        ({"modalities": ["text", "audio"]}, "modalities", "answers in text only: `modalities` cannot ask for 'audio'"),
        ({"modalities": "text"}, "modalities", "must be a list of strings"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio", "answers in text only: `audio`"),
    ]:
        with pytest.raises(HTTPError) as e:
            _chat_request(body)
        assert (e.value.status, e.value.param) == (400, param) and words in e.value.message, body


@pytest.mark.parametrize(("kwargs", "param", "words"), [
    ({"enable_thinking": "no"}, "chat_template_kwargs.enable_thinking", "must be true or false, not \"no\""),
    ({"enable_thinking": 0}, "chat_template_kwargs.enable_thinking", "must be true or false"),
    ({"messages": []}, "chat_template_kwargs.messages", "the server gives the chat template this variable"),
    ({"add_generation_prompt": False}, "chat_template_kwargs.add_generation_prompt", "cannot be set"),
    ({"bos_token": "<s>"}, "chat_template_kwargs.bos_token", "cannot be set"),
    ({"eos_token": "</s>"}, "chat_template_kwargs.eos_token", "cannot be set"),
    ({"tools": "x"}, "chat_template_kwargs.tools", "cannot be set"),
    ({"custom": {"a": 1}}, "chat_template_kwargs.custom", "a string, a number or true/false"),
    ([], "chat_template_kwargs", "must be an object"),
    ("enable_thinking", "chat_template_kwargs", "must be an object"),
    (False, "chat_template_kwargs", "must be an object"),
])
def test_bad_chat_template_kwargs_are_400_naming_the_field(kwargs: Any, param: str, words: str) -> None:
    from localgen.serve.apierror import HTTPError

    with pytest.raises(HTTPError) as e:
        _chat_request({"chat_template_kwargs": kwargs})
    assert (e.value.status, e.value.param) == (400, param) and words in e.value.message


def test_good_chat_template_kwargs_reach_the_template() -> None:
    got = _chat_request({"chat_template_kwargs": {"enable_thinking": False, "reasoning_effort": "low"}})
    assert got.template_args == (("enable_thinking", False), ("reasoning_effort", "low"))
    assert _chat_request({"chat_template_kwargs": None}).template_args == ()


@pytest.fixture(scope="module")
def server(cli_env: dict[str, str]) -> Iterator[Server]:
    s = Server(cli_env, "-np", "2", "--ctx", "1024")
    yield s
    assert s.stop() == 0


def test_served_chat_takes_modalities_text_and_refuses_colliding_kwargs(server: Server) -> None:
    from openai import BadRequestError, OpenAI

    client = OpenAI(base_url=f"{server.url}/v1", api_key="none")
    said = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                          modalities=["text"])
    assert said.choices[0].message.content is not None
    for kwargs in ({"messages": "x"}, {"add_generation_prompt": False}, {"enable_thinking": "no"}):
        with pytest.raises(BadRequestError) as e:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                           extra_body={"chat_template_kwargs": kwargs})
        assert e.value.status_code == 400 and next(iter(kwargs)) in str(e.value.body), kwargs
    assert server.health()["failed_jobs"] == 0, "no request reached the worker to fail there"


# ---- #47.7: shutdown with requests in flight -----------------------------------------------------------

def _default_drain() -> float:
    """serve's --drain-timeout when it is not given."""
    import inspect

    from localgen.cli.serve.command import serve

    return float(inspect.signature(serve).parameters["drain_timeout"].default)


def test_sigterm_ends_every_request_in_flight_in_its_apis_error_shape(cli_env: dict[str, str]) -> None:
    """With the default drain (4 s; uvicorn waits 1 s more before it cancels requests), the two requests still
    running end as 503s in their API's shape. The server is paused (SIGSTOP) through the drain instead of
    generating for 4 s: it resumes 0.1 s past the drain after its listener closed (its drain timer, started
    before that, is then due; uvicorn's wait, started 0.1 s after it, still has about 1 s to run)."""
    s = Server(cli_env, "-np", "2", "--ctx", "4096")
    body = {"model": MODEL, "prompt": "Once", "max_tokens": 4000, "ignore_eos": True}
    got: dict[str, Any] = {}
    first_token = threading.Event()

    def stream() -> None:
        lines = []
        with httpx.stream("POST", f"{s.url}/v1/completions", json={**body, "stream": True}, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    lines.append(line)
                    first_token.set()
        got["stream"] = lines

    def whole() -> None:
        got["whole"] = httpx.post(f"{s.url}/v1/completions", json=body, timeout=120)

    threads = [threading.Thread(target=stream), threading.Thread(target=whole)]
    try:
        for t in threads:
            t.start()
        assert first_token.wait(60), "the stream produced its first token"
        deadline = time.monotonic() + 60
        while s.health()["running"] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert s.health()["running"] == 2, "both requests are generating"
        s.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60  # a safety net
        while _listening(s.port) and time.monotonic() < deadline:
            time.sleep(0.02)
        closed = time.monotonic()
        s.proc.send_signal(signal.SIGSTOP)
        time.sleep(max(0.0, closed + _default_drain() + 0.1 - time.monotonic()))
        s.proc.send_signal(signal.SIGCONT)
        for t in threads:
            t.join(60)
        assert s.proc.wait(timeout=30) == 0
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
    stderr = s.proc.stderr.read().decode() if s.proc.stderr else ""
    r = got["whole"]
    assert r.status_code == 503 and r.headers["content-type"] == "application/json", r.text
    assert r.json()["error"]["type"] == "server_error" and "shutting down" in r.json()["error"]["message"]
    lines = got["stream"]
    assert lines[-1] == "data: [DONE]", lines[-3:]
    error = json.loads(lines[-2][5:])["error"]
    assert error["code"] == 503 and "shutting down" in error["message"]
    assert "Traceback" not in stderr and "timeout graceful shutdown exceeded" not in stderr, stderr


def test_requests_ended_by_sigterm_have_their_tokens_in_their_access_lines(cli_env: dict[str, str]) -> None:
    """A request the server's stop ends (here at once: --drain-timeout 0) is logged with the tokens made for it
    so far, read from what its worker counted at its last step, not waited for: a stream and a whole answer,
    each one access line with its prompt and generated tokens (the stream's at least the text chunks it got)."""
    s = Server(cli_env, "-np", "2", "--ctx", "4096", "--drain-timeout", "0", "--log-format", "json")
    body = {"model": MODEL, "prompt": "Once", "max_tokens": 4000, "ignore_eos": True}
    got: dict[str, Any] = {}
    chunks: list[dict[str, Any]] = []

    def stream() -> None:
        with httpx.stream("POST", f"{s.url}/v1/completions", json={**body, "stream": True}, timeout=120,
                          headers={"X-Request-Id": "streamed"}) as r:
            for line in r.iter_lines():
                if line.startswith("data:") and line != "data: [DONE]":
                    chunks.append(json.loads(line[5:]))

    def whole() -> None:
        got["whole"] = httpx.post(f"{s.url}/v1/completions", json=body, timeout=120, headers={"X-Request-Id": "whole"})

    threads = [threading.Thread(target=stream), threading.Thread(target=whole)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120
        while s.health()["running"] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert s.health()["running"] == 2, "both requests are generating"
        seen = len(chunks)
        while len(chunks) < seen + 4 and time.monotonic() < deadline:  # both have made tokens by now
            time.sleep(0.02)
        s.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        assert s.proc.wait(timeout=60) == 0
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
    assert got["whole"].status_code == 503 and "error" in chunks[-1], (got["whole"].text, chunks[-1:])
    said = [json.loads(line) for line in (s.proc.stderr.read().decode() if s.proc.stderr else "").splitlines()]
    logged = {e["request_id"]: e for e in said if e["event"] == "request" and e["path"] == "/v1/completions"}
    assert set(logged) == {"streamed", "whole"}, said
    texts = sum(1 for c in chunks if "choices" in c and c["choices"][0]["text"])
    # the stream began as a 200, but its error event ended it: its line says how it ended
    assert logged["streamed"]["status"] == 503 and logged["streamed"]["completion_tokens"] >= texts >= 4
    assert logged["whole"]["status"] == 503 and logged["whole"]["completion_tokens"] >= 1
    for e in logged.values():
        assert e["prompt_tokens"] >= 1 and e["cached_tokens"] is not None and e["ttft_ms"] > 0, e


def _answer_of(sock: Any) -> bytes:
    """All the server sends on a connection until it closes it (a safety net of 60 s)."""
    sock.settimeout(60)
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


BODY_PENDING = {  # requests whose body has not all arrived when the server is told to stop, by the API that answers
    "chat": b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"X-Request-Id: pending-chat\r\nExpect: 100-continue\r\nContent-Length: 100000\r\n\r\n{",
    "ollama": b"POST /api/chat HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
              b"X-Request-Id: pending-ollama\r\nExpect: 100-continue\r\nContent-Length: 100000\r\n\r\n{",
    "upload": b"POST /v1/files HTTP/1.1\r\nHost: localhost\r\nContent-Type: multipart/form-data; boundary=XyZ\r\n"
              b"X-Request-Id: pending-upload\r\nExpect: 100-continue\r\nContent-Length: 100000\r\n\r\n"
              b"--XyZ\r\nContent-Disposition: "
              b"form-data; name=\"purpose\"\r\n\r\nbatch\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; "
              b"filename=\"a.jsonl\"\r\nContent-Type: application/jsonl\r\n\r\n{\"custom_id\"",
}


def test_an_app_run_on_a_second_event_loop_still_reads_bodies() -> None:
    """The app run on one event loop and then on another (a TestClient without `with`, an app reused) reads a
    body that arrives in parts on both: the second was a false 503 "shutting down" (the stop event was bound to
    the first loop)."""
    import asyncio

    from localgen.serve.app import build
    from localgen.serve.guard import Policy
    from localgen.serve.state import ServeState

    app = build(ServeState(workers={}), Policy(check_host=False), webui=False)
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "root_path": "", "query_string": b"",
             "headers": [(b"host", b"localhost"), (b"content-type", b"application/json")],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}

    async def once() -> int:
        parts = [b'{"model": "nope", ', b'"messages": [{"role": "user", "content": "Hi"}]}']
        statuses: list[int] = []

        async def receive() -> dict[str, Any]:
            for _ in range(10):  # each part comes a few turns of the loop later
                await asyncio.sleep(0)
            body = parts.pop(0)
            return {"type": "http.request", "body": body, "more_body": bool(parts)}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                statuses.append(message["status"])

        await app(dict(scope), receive, send)
        return statuses[0]

    assert asyncio.run(once()) == 404  # no such model: its body was read
    assert asyncio.run(once()) == 404


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_request_whose_body_is_still_arriving_at_shutdown_is_a_503_in_its_apis_shape(
        cli_env: dict[str, str], sig: int) -> None:
    """serve.md, Stopping: a request still running when the drain ends is a 503 in its API's shape, and the exit
    is 0 with no traceback; one still waiting for its body was cancelled by uvicorn a second later (a traceback, a
    plain-text 500 and `-` in the access line)."""
    import socket

    s = Server(cli_env, "-np", "2", "--read-timeout", "60", "--drain-timeout", "1")
    socks = {}
    try:
        for name, head in BODY_PENDING.items():
            socks[name] = socket.create_connection(("127.0.0.1", s.port))
            headers, _, body_start = head.partition(b"\r\n\r\n")
            socks[name].sendall(headers + b"\r\n\r\n")
            # uvicorn answers `Expect: 100-continue` on the app's first receive(): the request has been read and
            # waits for its body
            socks[name].settimeout(60)
            seen = b""
            while b"\r\n\r\n" not in seen and (chunk := socks[name].recv(1)):
                seen += chunk
            assert seen.startswith(b"HTTP/1.1 100 "), seen
            socks[name].sendall(body_start)
        s.proc.send_signal(sig)
        got = {name: _answer_of(sock) for name, sock in socks.items()}
        assert s.proc.wait(timeout=60) == 0
    finally:
        for sock in socks.values():
            sock.close()
        if s.proc.poll() is None:
            s.proc.kill()
    log = s.log()
    assert "Traceback" not in log and "timeout graceful shutdown exceeded" not in log, log
    for name, out in got.items():
        head, _, body = out.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503") and b"application/json" in head, out[:300]
        error = json.loads(body)["error"]
        message = error if name == "ollama" else error["message"]  # Ollama's error is a string
        assert "shutting down" in message, body
        assert " 503 " in s.access(f"pending-{name}"), log
