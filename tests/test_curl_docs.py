"""The curl commands of README.md and the docs: none needs curl 7.82's `--json` (Ubuntu 22.04 ships 7.81), and
each that asks `localgen serve` runs as written, with the system's curl, against a real server on SmolLM2: its
address made the test server's, `"max_tokens": 8` put first in its body to bound the answer, and run where
`key.txt` holds that server's key. An example after a serve with a key on its page asks a server started with
one (which answers 401 without it), the others a server without one."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.test_doc_examples import DOCS, _command_lines
from tests.test_serve import Server

DOC_ADDRESS = "http://127.0.0.1:11435"
KEY = "sk-curl-docs"


def _curls() -> Iterator[tuple[str, str, bool]]:
    """(where, command, whether the serve before it on its page takes a key) for each curl command."""
    for doc in DOCS:
        keyed = False
        for n, line in _command_lines(doc.read_text(encoding="utf-8")):
            if line.startswith("localgen serve"):
                keyed = "--api-key" in line or "--api-key-file" in line
            elif line.startswith("curl "):
                yield f"{doc.name}:{n}", line, keyed


CURLS = list(_curls())
ASKING = [c for c in CURLS if DOC_ADDRESS in c[1]]
TO_SERVE = [c for c in ASKING if "'{\"model\"" in c[1]]  # generation requests: run with a bounded answer
TO_TOOLS = [c for c in ASKING if "/tools" in c[1]]  # serve's tools: run against `serve --mcp` as tools.md starts it
# a route of a model that is not here (ultravox:1b's transcription): tests/test_transcribe.py runs that route
ELSEWHERE = [c for c in ASKING if "model=ultravox" in c[1]]


def test_no_curl_example_needs_curl_7_82() -> None:
    """`curl --json` came in curl 7.82; a JSON body goes with `-H 'Content-Type: application/json' -d` instead
    (OpenAI's routes answer 415 to curl's plain `-d`, a form type: docs/serve.md, Limits)."""
    assert len(TO_SERVE) >= 3, CURLS
    assert sorted(TO_SERVE + TO_TOOLS + ELSEWHERE) == sorted(ASKING), "a curl example of serve no test runs"
    for where, line, _ in CURLS:
        assert "--json" not in line.split(), where
    for where, line, _ in TO_SERVE:
        assert "/v1/" not in line or " -d " not in line or "-H 'Content-Type: application/json'" in line, where


@pytest.fixture(scope="module")
def servers(cli_env: dict[str, str]) -> Iterator[dict[bool, Server]]:
    made = {False: Server(cli_env, "-np", "1", "--ctx", "1024"),
            True: Server(cli_env, "-np", "1", "--ctx", "1024", "--api-key", KEY)}
    yield made
    for s in made.values():
        assert s.stop() == 0


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl on this machine")
@pytest.mark.parametrize("where,line,keyed", TO_SERVE, ids=[c[0] for c in TO_SERVE])
def test_the_curl_example_runs_as_written(where: str, line: str, keyed: bool, servers: dict[bool, Server],
                                          tmp_path: Path) -> None:
    server = servers[keyed]
    (tmp_path / "key.txt").write_text(KEY + "\n")
    assert line.count("'{\"model\"") == 1, line
    command = line.replace(DOC_ADDRESS, server.url).replace("'{\"model\"", "'{\"max_tokens\": 8, \"model\"")
    r = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    if '"stream": true' in line:
        events = [x.removeprefix("data: ") for x in r.stdout.splitlines() if x.strip()]
        assert events[-1] == "[DONE]" and all("choices" in json.loads(e) for e in events[:-1]), r.stdout
    else:
        assert json.loads(r.stdout)["choices"][0]["message"]["role"] == "assistant", r.stdout
    if keyed:  # the key is what lets it in
        body = {"model": "smollm2:135m", "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]}
        assert httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).status_code == 401


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl on this machine")
def test_the_tools_curl_examples_run_as_written(cli_env: dict[str, str], tmp_path: Path) -> None:
    """docs/tools.md's /tools and /tools/call examples, against serve started with the page's tools (its
    relative paths from the checkout), each answer as the page's comment under it shows it."""
    from tests.conftest import ROOT

    assert len(TO_TOOLS) == 2, TO_TOOLS
    mcp = f"{sys.executable} {ROOT / 'tests' / 'mcp_server.py'}"
    s = Server(cli_env, "-np", "1", "--ctx", "512", "--mcp", mcp, "--functions",
               str(ROOT / "tests" / "tool_functions.py"))
    try:
        said = {}
        for where, line, _ in TO_TOOLS:
            command = line.replace(DOC_ADDRESS, s.url)
            r = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, (where, r.stderr)
            said[line.split()[2].split("/")[-1]] = json.loads(r.stdout)
        assert said["tools"]["object"] == "list" and said["tools"]["data"][0]["type"] == "function"
        assert said["call"] == {"object": "tool.result", "name": "add", "content": "42", "is_error": False}
    finally:
        assert s.stop() == 0

