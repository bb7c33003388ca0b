"""docs/clients.md holds: each of its Python blocks runs as written against a real `localgen serve` (its
address made the test server's, and OLLAMA_HOST set as the page says), and a `/v1` too many or too few in a
client's base URL is a 404, as its table says."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT
from tests.test_serve import Server

PAGE = ROOT / "docs" / "clients.md"
DOC_ADDRESS = "127.0.0.1:11435"


@pytest.fixture(scope="module")
def server(cli_env: dict[str, str]) -> Iterator[Server]:
    s = Server(cli_env, "-np", "1", "--ctx", "1024")
    yield s
    assert s.stop() == 0


def _blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", PAGE.read_text(encoding="utf-8"), re.S | re.M)


def test_the_page_has_a_block_for_each_client() -> None:
    blocks = _blocks()
    for library in ("from openai import OpenAI", "import anthropic", "import ollama"):
        assert any(library in b for b in blocks), library
    assert all(DOC_ADDRESS in b or "OLLAMA_HOST" in b for b in blocks)


@pytest.mark.parametrize("n", range(len(_blocks())))
def test_each_python_block_runs_against_serve(server: Server, cli_env: dict[str, str], n: int) -> None:
    address = server.url.removeprefix("http://")
    code = _blocks()[n].replace(DOC_ADDRESS, address)
    env = {**cli_env, "OLLAMA_HOST": address}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip(), "each block prints an answer"


def test_a_v1_too_many_or_too_few_is_a_404(server: Server) -> None:
    import anthropic
    import ollama
    import openai

    ask = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.NotFoundError):  # OpenAI's clients want /v1, but for llama-server's spellings without it
        openai.OpenAI(base_url=server.url, api_key="none").batches.list()
    openai.OpenAI(base_url=server.url, api_key="none").chat.completions.create(
        model="smollm2:135m", messages=ask, max_tokens=1)  # type: ignore[arg-type]  # /chat/completions: served
    with pytest.raises(anthropic.NotFoundError):  # Anthropic's add it themselves
        anthropic.Anthropic(base_url=f"{server.url}/v1", api_key="none").messages.create(
            model="smollm2:135m", max_tokens=1, messages=ask)  # type: ignore[arg-type]
    with pytest.raises(ollama.ResponseError) as e:  # so do Ollama's (/api)
        ollama.Client(host=f"{server.url}/v1").chat(model="smollm2:135m", messages=ask)
    assert e.value.status_code == 404
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


def test_with_an_api_key_each_client_gives_it_as_the_page_says(cli_env: dict[str, str]) -> None:
    """The page's "With an API key": `api_key=KEY` for openai and anthropic (the anthropic library sends it as a
    Bearer token, its older versions as x-api-key: serve takes both), `headers={"Authorization": "Bearer KEY"}`
    for ollama.Client; without it, each client meets the 401."""
    import anthropic
    import ollama
    import openai

    key = "sk-clients-doc"
    s = Server(cli_env, "--api-key", key, "--no-on-demand", "-np", "1", "--ctx", "256")
    try:
        ask = [{"role": "user", "content": "Name three rivers."}]
        sent: list[Any] = []  # the headers of each request the anthropic client sends
        seen = anthropic.DefaultHttpxClient(event_hooks={"request": [lambda r: sent.append(r.headers)]})
        client = anthropic.Anthropic(base_url=s.url, api_key=key, http_client=seen)
        assert client.messages.create(model="smollm2:135m", max_tokens=4, messages=ask).content  # type: ignore[arg-type]
        assert sent[-1].get("authorization") == f"Bearer {key}" or sent[-1].get("x-api-key") == key
        old_style = httpx.post(f"{s.url}/v1/messages", headers={"x-api-key": key}, timeout=60,  # older clients'
                               json={"model": "smollm2:135m", "max_tokens": 2, "messages": ask})
        assert old_style.status_code == 200, old_style.text
        chat = openai.OpenAI(base_url=f"{s.url}/v1", api_key=key).chat.completions.create(
            model="smollm2:135m", max_tokens=4, messages=ask)  # type: ignore[arg-type]
        assert chat.choices[0].message.content
        reply = ollama.Client(host=s.url, headers={"Authorization": f"Bearer {key}"}).chat(
            model="smollm2:135m", messages=ask, options={"num_predict": 4})
        assert reply.message.content
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{s.url}/v1", api_key="none").models.list()
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=s.url, api_key="none").messages.create(
                model="smollm2:135m", max_tokens=4, messages=ask)  # type: ignore[arg-type]
        with pytest.raises(ollama.ResponseError) as e:
            ollama.Client(host=s.url).chat(model="smollm2:135m", messages=ask)
        assert e.value.status_code == 401
    finally:
        assert s.stop() == 0
