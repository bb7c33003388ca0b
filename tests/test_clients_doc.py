"""docs/clients.md holds: each of its Python blocks runs as written against a real `localgen serve` (its
address made the test server's, and OLLAMA_HOST set as the page says), and a `/v1` too many or too few in a
client's base URL is a 404, as its table says."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator

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
    with pytest.raises(openai.NotFoundError):  # OpenAI's clients want /v1
        openai.OpenAI(base_url=server.url, api_key="none").chat.completions.create(
            model="smollm2:135m", messages=ask, max_tokens=1)  # type: ignore[arg-type]
    with pytest.raises(anthropic.NotFoundError):  # Anthropic's add it themselves
        anthropic.Anthropic(base_url=f"{server.url}/v1", api_key="none").messages.create(
            model="smollm2:135m", max_tokens=1, messages=ask)  # type: ignore[arg-type]
    with pytest.raises(ollama.ResponseError) as e:  # so do Ollama's (/api)
        ollama.Client(host=f"{server.url}/v1").chat(model="smollm2:135m", messages=ask)
    assert e.value.status_code == 404
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
