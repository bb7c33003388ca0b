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
