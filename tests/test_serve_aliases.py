"""`localgen serve` as a client whose base URL has no /v1 reaches it, and how it stops, against a real server on
SmolLM2: llama-server's spellings of the OpenAI routes without /v1 (/chat/completions, /completions,
/embeddings, /responses, /models, /reranking, /v1/health) answer as their /v1 routes do (GET /models answered
200 while POST /chat/completions was a 404); a path with no such spelling still gets the 404 that names the
route meant; GET /models is the /v1/models listing with the router's `status`; every model in /api/tags has a
digest (SmolLM2's was ""), the same in /api/ps; and Ctrl-C stops a listening server with exit 0, as the README
says (it said 130 for every command)."""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT
from tests.test_serve import KEY, Server

MODEL = "smollm2:135m"
pytestmark = pytest.mark.slow  # every test talks to a server on SmolLM2


@pytest.fixture(scope="module")
def server(cli_env: dict[str, str]) -> Iterator[Server]:
    s = Server(cli_env, "--api-key", KEY, "-np", "2", "--ctx", "1024")
    yield s
    assert s.stop() == 0


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


def test_an_openai_client_without_v1_reaches_chat_completions_responses_and_embeddings(server: Server) -> None:
    import openai

    bare = openai.OpenAI(base_url=server.url, api_key=KEY, max_retries=0)
    v1 = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    said: Any = [{"role": "user", "content": "Name a colour."}]
    got = bare.chat.completions.create(model=MODEL, messages=said, max_tokens=8, temperature=0)
    want = v1.chat.completions.create(model=MODEL, messages=said, max_tokens=8, temperature=0)
    assert got.object == "chat.completion" and got.choices[0].message.content == want.choices[0].message.content
    chunks = list(bare.chat.completions.create(model=MODEL, messages=said, max_tokens=8, temperature=0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.choices[0].message.content
    text = bare.completions.create(model=MODEL, prompt="The sky is", max_tokens=4, temperature=0)
    assert text.object == "text_completion" and text.choices[0].text == \
        v1.completions.create(model=MODEL, prompt="The sky is", max_tokens=4, temperature=0).choices[0].text
    answer = bare.responses.create(model=MODEL, input="Name a colour.", max_output_tokens=8, temperature=0)
    assert answer.status in ("completed", "incomplete") and answer.output_text
    vec = bare.embeddings.create(model=MODEL, input="hello").data[0].embedding
    assert vec == v1.embeddings.create(model=MODEL, input="hello").data[0].embedding and len(vec) > 100
    ids = [m.id for m in bare.models.list().data]
    assert ids[0] == MODEL and "gemma3:270m" in ids
    # the key, the body's checks and the errors' shape are the /v1 route's
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url, api_key="wrong", max_retries=0).chat.completions.create(
            model=MODEL, messages=said, max_tokens=8)
    r = httpx.post(f"{server.url}/chat/completions", headers={**_auth(), "Content-Type": "application/json"},
                   content=b"{bad", timeout=30)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
    r = httpx.post(f"{server.url}/reranking", headers=_auth(), timeout=60,
                   json={"model": MODEL, "query": "sky", "documents": ["blue", "green"]})
    assert r.status_code == 400 and "is not a reranker" in r.json()["error"]["message"], r.text
    # a route llama-server has no such spelling of is still the 404 that names the one meant
    with pytest.raises(openai.NotFoundError) as missed:
        bare.batches.list()
    assert "did you mean /v1/batches?" in str(missed.value), missed.value


def test_get_models_is_the_v1_listing_with_the_routers_status(server: Server) -> None:
    listed = httpx.get(f"{server.url}/models", headers=_auth(), timeout=60).json()
    assert listed == httpx.get(f"{server.url}/v1/models", headers=_auth(), timeout=60).json()
    by_id = {m["id"]: m for m in listed["data"]}
    assert by_id[MODEL]["status"] == {"value": "loaded"} and by_id[MODEL]["max_model_len"] == 1024
    assert by_id[MODEL]["default"] is True and by_id[MODEL]["path"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert by_id["gemma3:270m"]["status"] == {"value": "unloaded"} and "/" not in by_id["gemma3:270m"]["path"]
    health = httpx.get(f"{server.url}/v1/health", timeout=30)  # llama-server's: open without the key, as /health
    assert health.status_code == 200 and health.json()["status"] == "ok", health.text


def test_every_model_listed_has_a_digest_the_same_in_tags_and_ps(server: Server) -> None:
    from localgen.models.embedded import EMBEDDED

    def tags() -> dict[str, str]:
        models = httpx.get(f"{server.url}/api/tags", headers=_auth(), timeout=60).json()["models"]
        return {m["name"]: m["digest"] for m in models}

    first = tags()
    assert all(re.fullmatch(r"[0-9a-f]{64}", d) for d in first.values()), first
    assert first == tags(), "the same while the files are"
    assert first["gemma3:270m"] == EMBEDDED["gemma3:270m"].sha256, "the embedded model's published SHA-256"
    assert first[MODEL] != first["gemma3:270m"]
    loaded = httpx.get(f"{server.url}/api/ps", headers=_auth(), timeout=30).json()["models"]
    ps = {m["name"]: m["digest"] for m in loaded}
    assert ps[MODEL] == first[MODEL], ps


def test_ctrl_c_stops_a_listening_server_with_exit_0_as_the_readme_says(cli_env: dict[str, str]) -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "130 interrupted (a running `serve` stopped by Ctrl-C or SIGTERM exits 0" in readme
    s = Server(cli_env, "-np", "1", "--ctx", "512")
    try:
        assert httpx.get(f"{s.url}/health", timeout=30).status_code == 200
        s.proc.send_signal(signal.SIGINT)
        assert s.proc.wait(timeout=120) == 0, s.log()[-2000:]
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()
    log = s.log()
    assert "Traceback" not in log and "interrupted" not in log, log


def _wav() -> bytes:
    """Half a second of silence, 16 kHz mono: audio the transcription route reads (what a model hears in it aside)."""
    import io
    import wave

    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0\0" * 8000)
    return out.getvalue()


def test_an_upload_to_audio_transcriptions_without_v1_is_read_as_the_v1_routes(server: Server) -> None:
    """A multipart POST to /audio/transcriptions is the upload /v1/audio/transcriptions reads itself (the gate
    took it for a JSON body and refused it, 415): the same answer, here SmolLM2's, which hears no audio."""
    said: dict[str, Any] = {}
    for path in ("/v1/audio/transcriptions", "/audio/transcriptions"):
        r = httpx.post(f"{server.url}{path}", headers=_auth(), data={"model": MODEL}, timeout=120,
                       files={"file": ("clip.wav", _wav(), "audio/wav")})
        said[path] = (r.status_code, r.json()["error"]["message"] if r.status_code != 200 else r.json())
    assert said["/audio/transcriptions"] == said["/v1/audio/transcriptions"], said
    assert said["/audio/transcriptions"][0] != 415, said
    # the route read the form: a file that is not audio is named as the route names it
    r = httpx.post(f"{server.url}/audio/transcriptions", headers=_auth(), data={"model": MODEL}, timeout=60,
                   files={"file": ("notes.txt", b"hello", "text/plain")})
    assert r.status_code == 400 and r.json()["error"]["param"] == "file", r.text


def test_embeddings_without_v1_log_their_tokens_as_the_v1_route_does(server: Server) -> None:
    """/embeddings' access line carries the usage its answer reports, as /v1/embeddings' does (no worker counts
    an embedding's tokens: the line reads them from the answer); /metrics counts both under /v1/embeddings."""
    for path, rid in (("/v1/embeddings", "alias-embed-v1"), ("/embeddings", "alias-embed-bare")):
        r = httpx.post(f"{server.url}{path}", headers={**_auth(), "X-Request-Id": rid}, timeout=120,
                       json={"model": MODEL, "input": "the sky is blue"})
        assert r.status_code == 200, r.text
        tokens = r.json()["usage"]["prompt_tokens"]
        line = server.access(rid)
        assert line.startswith(f"POST {path} 200 {tokens} tokens "), line
    scrape = httpx.get(f"{server.url}/metrics", headers=_auth(), timeout=30).text
    assert 'route="/embeddings"' not in scrape and 'localgen_requests_total{route="/v1/embeddings"' in scrape


def test_get_models_without_v1_for_anthropics_client_errs_in_its_shape(server: Server) -> None:
    """GET /models with anthropic-version is Anthropic's page, as /v1/models is: its 400s are Anthropic's too
    (they came back in OpenAI's shape)."""
    anthropic = {**_auth(), "anthropic-version": "2023-06-01"}
    for path in ("/v1/models", "/models"):
        page = httpx.get(f"{server.url}{path}", headers=anthropic, params={"limit": 1}, timeout=60)
        assert page.status_code == 200 and page.json()["data"][0]["type"] == "model", page.text
        for query in ({"limit": 0}, {"after_id": "no-such-model"}):
            r = httpx.get(f"{server.url}{path}", headers=anthropic, params=query, timeout=60)
            body = r.json()
            assert r.status_code == 400 and body["type"] == "error", (path, r.text)
            assert body["error"]["type"] == "invalid_request_error", (path, r.text)


def test_tags_and_ps_stat_each_models_file_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """/api/tags' and /api/ps' entries (a file's digest: its real path and a stat; its modification time) are made
    in the thread that reads the listing, not on the event loop, where a slow disk held every other request."""
    import asyncio
    from types import SimpleNamespace

    from starlette.testclient import TestClient

    from localgen.serve import listings
    from localgen.serve.app import build
    from localgen.serve.guard import Policy
    from localgen.serve.state import ServeState

    on_loop: list[bool] = []

    def digest(ref: Any) -> str:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:  # none runs on this thread: a worker thread
            on_loop.append(False)
        return "0" * 64

    monkeypatch.setattr(listings, "_digest", digest)
    summary = SimpleNamespace(architecture="llama", n_params=135_000_000, quantization="Q4_1", file_size=1 << 20)
    ref = SimpleNamespace(path="/nonexistent/m.gguf", summary=summary)
    worker = SimpleNamespace(name="m", ref=ref, loaded=True, n_ctx=512, yielding_to=[], expires=lambda: None,
                             residence=SimpleNamespace(need=1 << 20, vram_bytes=0, placement="cpu"))
    state = ServeState(workers={"m": worker})  # type: ignore[dict-item]
    client = TestClient(build(state, Policy(check_host=False)))
    tags = client.get("/api/tags")
    assert tags.status_code == 200 and [m["digest"] for m in tags.json()["models"]] == ["0" * 64], tags.text
    ps = client.get("/api/ps")
    assert ps.status_code == 200 and [m["name"] for m in ps.json()["models"]] == ["m"], ps.text
    assert on_loop == [False, False]
