"""What the how-to guides promise beyond their commands (which tests/test_doc_examples_run.py runs): each holds
against the real CLI and a real `localgen serve` on SmolLM2.

- docs/agents.md: the page's Python check runs as written, with the environment its `export` lines set (the
  server's address and key put in), the agent's model made SmolLM2; a `claude-` name is the server's `-m`
  model, either key header is taken, and an OpenAI model name the server lacks is a 404.
- docs/team.md: the chat page's requests leave no conversation on the server (no log), and the log's request
  line, in text or JSON, holds no prompt or answer; `GET /api/ps` wants the key.
- docs/ci.md: the same seed gives the same text, so does temperature 0; offline, a model not on disk is exit 1
  naming the offline mode; a bad flag is exit 2; a failed --file line is an `error` object and exit 1.
- docs/bigger-engine.md: `show --json`'s `file` is `list --json`'s `path`; serve takes every llama.cpp flag the
  page names; the llama-server command the repository's own comparison builds gives `-c` as the window times
  the slots."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import CLI, ROOT, InProcessCLI
from tests.test_serve import Server

DOCS = ROOT / "docs"
KEY = "sk-howto"
AGENT_MODEL = "qwen2.5-coder:7b"  # the page's; SmolLM2 stands in for it here


@pytest.fixture(scope="module")
def server(cli_env: dict[str, str]) -> Iterator[Server]:
    s = Server(cli_env, "-m", "smollm2:135m", "-np", "1", "--ctx", "2048", "--api-key", KEY)
    yield s
    assert s.stop() == 0


def _page(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def test_the_agents_page_check_runs_with_the_environment_it_sets(server: Server, cli_env: dict[str, str]) -> None:
    page = _page("agents.md").split("\n## 1. ", 1)[1]  # the by-hand sections (launch's --print-env shows others)
    exports = dict(re.findall(r"^export (\w+)=(.+)$", page, re.M))
    # the key as serve reads its file: without the blanks around it (a CRLF, spaces), which `cat` kept, and the
    # client refused to send a header of
    read = '"$(tr -d \'[:space:]\' < key.txt)"'
    assert exports == {"ANTHROPIC_BASE_URL": "http://127.0.0.1:11435", "ANTHROPIC_AUTH_TOKEN": read,
                       "OPENAI_BASE_URL": "http://127.0.0.1:11435/v1", "OPENAI_API_KEY": read}
    env = {k: v.replace("http://127.0.0.1:11435", server.url).replace(read, KEY) for k, v in exports.items()}
    [code] = re.findall(r"^```python\n(.*?)^```$", page, re.S | re.M)
    assert f'model="{AGENT_MODEL}"' in code and 'model="claude-sonnet-4-6"' in code
    sizes = []
    for _ in range(2):  # the second time the server holds the prompt's prefix: the prompt's size is the same
        r = subprocess.run([sys.executable, "-c", code.replace(AGENT_MODEL, "smollm2:135m")], env={**cli_env, **env},
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "is deprecated" not in r.stderr, r.stderr  # the SDK warns of a model name past its end of life
        first, *rest = r.stdout.splitlines()
        found = re.fullmatch(r"(end_turn|tool_use|max_tokens) \[.*\] (\d+) prompt tokens", first)
        assert found, first
        sizes.append(int(found[2]))
        assert "".join(rest).strip()
    assert sizes[0] == sizes[1] > 50, sizes


def test_a_claude_name_is_the_servers_model_with_either_key_header(server: Server) -> None:
    ask = {"model": "claude-sonnet-4-6", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}
    for header in ({"Authorization": f"Bearer {KEY}"}, {"x-api-key": KEY}):
        r = httpx.post(f"{server.url}/v1/messages", json=ask, headers=header, timeout=300)
        assert r.status_code == 200 and r.json()["model"] in ("claude-sonnet-4-6", "smollm2:135m"), r.text
    assert httpx.post(f"{server.url}/v1/messages", json=ask, timeout=60).status_code == 401
    # serve.md: only on Anthropic's API (and its count_tokens): elsewhere a claude-… name is unknown, a 404
    counted = httpx.post(f"{server.url}/v1/messages/count_tokens", json={k: ask[k] for k in ("model", "messages")},
                         headers={"x-api-key": KEY}, timeout=60)
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 0, counted.text
    chat = {"model": ask["model"], "max_tokens": 2, "messages": ask["messages"]}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=chat, headers={"x-api-key": KEY}, timeout=60)
    assert r.status_code == 404 and "claude-sonnet-4-6" in r.text, r.text


def test_an_openai_name_the_server_lacks_is_a_404(server: Server) -> None:
    r = httpx.post(f"{server.url}/v1/responses", headers={"Authorization": f"Bearer {KEY}"}, timeout=60,
                   json={"model": "gpt-5-codex", "input": "Hi", "max_output_tokens": 2})
    assert r.status_code == 404, r.text


def test_a_base_url_with_or_without_v1_the_wrong_way_says_which_it_meant(server: Server) -> None:
    """agents.md: Anthropic's base URL has no /v1, OpenAI's ends in /v1. A client given it the other way gets a 404
    that names the route it meant and the rule (it said only "Invalid URL"); a path that is no route either way
    gets the plain 404."""
    import anthropic
    import openai

    page = " ".join(_page("agents.md").split())
    assert "The base URL has no `/v1`: Anthropic's clients add it themselves." in page
    assert "read the server from `OPENAI_BASE_URL`, which does end in `/v1`" in page
    claude = anthropic.Anthropic(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    with pytest.raises(anthropic.NotFoundError) as found:
        claude.messages.create(model="claude-sonnet-4-6", max_tokens=2, messages=[{"role": "user", "content": "Hi"}])
    assert "did you mean /v1/messages? (an Anthropic client's base URL is http://HOST:PORT, with no /v1" in \
        str(found.value), found.value
    # clients.md: an OpenAI client without /v1 works too (llama-server's spellings without it are served), but for
    # a route that has no such spelling: the 404 names it
    codex = openai.OpenAI(base_url=server.url, api_key=KEY, max_retries=0)
    assert codex.responses.create(model="smollm2:135m", input="Hi", max_output_tokens=2).output_text is not None
    assert "smollm2:135m" in [m.id for m in codex.models.list()]
    with pytest.raises(openai.NotFoundError) as found2:
        codex.batches.list()
    assert "did you mean /v1/batches? (an OpenAI client's base URL ends in /v1)" in str(found2.value), found2.value
    assert "An OpenAI client without `/v1` works too" in " ".join(_page("clients.md").split())
    import ollama  # given the OpenAI base URL: its 404 said only "Invalid URL (POST /v1/api/chat)"

    with pytest.raises(ollama.ResponseError) as found3:
        ollama.Client(host=f"{server.url}/v1", headers={"Authorization": f"Bearer {KEY}"}).chat(
            model="smollm2:135m", messages=[{"role": "user", "content": "Hi"}])
    assert "did you mean /api/chat? (an Ollama client's host has no /v1" in str(found3.value), found3.value
    assert found3.value.error.startswith("Invalid URL"), found3.value  # in Ollama's error shape, which it reads
    for path in ("/api/chat/completions", "/api/v1/chat/completions"):  # an OpenAI client given Ollama's /api:
        # OpenAI's shape, which it reads
        r = httpx.post(f"{server.url}{path}", headers={"Authorization": f"Bearer {KEY}"}, json={}, timeout=60)
        assert r.status_code == 404 and r.json()["error"]["message"] == (
            f"Invalid URL (POST {path}): did you mean /v1/chat/completions? (an OpenAI client's base URL ends in "
            "/v1)"), r.text
    # /api/embeddings is Ollama's route too: an OpenAI client's body there (`input`, no `prompt`) is that 404, in
    # OpenAI's shape (it was Ollama's load, 200 {"embedding": []}: the SDK said "No embedding data received")
    api = openai.OpenAI(base_url=f"{server.url}/api", api_key=KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError) as found4:
        api.embeddings.create(model="smollm2:135m", input="hello world", encoding_format="float")
    assert "did you mean /v1/embeddings? (an OpenAI client's base URL ends in /v1)" in str(found4.value), found4.value
    r = httpx.post(f"{server.url}/v1/api/push", headers={"Authorization": f"Bearer {KEY}"}, json={}, timeout=60)
    assert r.status_code == 404 and r.json()["error"] == "Invalid URL (POST /v1/api/push)", r.text  # a route
    # localgen lacks, asked by an Ollama client given /v1: its shape still
    for path in ("/api/messages", "/messages"):  # Anthropic's route: its rule, in its shape
        r = httpx.post(f"{server.url}{path}", headers={"Authorization": f"Bearer {KEY}"}, json={}, timeout=60)
        assert r.status_code == 404 and r.json()["type"] == "error" and r.json()["error"]["message"].endswith(
            "did you mean /v1/messages? (an Anthropic client's base URL is http://HOST:PORT, with no /v1: it adds "
            "/v1 itself)"), r.text
    r = httpx.post(f"{server.url}/v1/nothing", headers={"Authorization": f"Bearer {KEY}"}, json={}, timeout=60)
    assert r.status_code == 404 and r.json()["error"]["message"] == "Invalid URL (POST /v1/nothing)", r.text


def test_tools_the_agent_does_not_run_itself_are_left_out_or_a_400_naming_their_type(server: Server) -> None:
    """agents.md: hosted tools (web search) are left out on the Responses API (Codex sends one by default, and
    every turn was a 400) and a 400 naming the type on Anthropic's; the Responses API's freeform `custom` tools
    (Codex's apply_patch) are refused with a 400 that names the tool's type."""
    page = " ".join(_page("agents.md").split())
    assert ("Tools that the API's maker runs (web search, code execution) are left out of what the model is offered "
            "on the Responses API") in page
    assert "The Responses API's freeform `custom` tools are refused with a `400` that names the tool's type" in page
    assert "File search is the exception: served by a Responses request over a collection" in page
    auth = {"Authorization": f"Bearer {KEY}"}
    function = {"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}}
    for tool in ({"type": "custom", "name": "apply_patch", "description": "Apply a patch"}, {"type": "web_search"},
                 {"type": "code_interpreter", "container": {"type": "auto"}}):
        r = httpx.post(f"{server.url}/v1/responses", headers=auth, timeout=60, json={
            "model": "smollm2:135m", "input": "Hi", "max_output_tokens": 2, "tools": [function, tool]})
        if tool["type"] == "custom":
            assert r.status_code == 400 and repr(tool["type"]) in r.json()["error"]["message"], r.text
        else:
            assert r.status_code == 200 and r.json()["status"] in ("completed", "incomplete"), r.text
    r = httpx.post(f"{server.url}/v1/messages", headers=auth, timeout=60, json={
        "model": "claude-sonnet-4-6", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}],
        "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 1}]})
    assert r.status_code == 400 and "web_search_20250305" in r.json()["error"]["message"], r.text


def test_the_server_keeps_no_conversation_and_logs_no_text(server: Server, cli_env: dict[str, str]) -> None:
    words = "Remember the word pomegranate."
    r = httpx.post(f"{server.url}/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=300,
                   json={"model": "smollm2:135m", "max_tokens": 3, "temperature": 0,  # sampled, "A" is in the log
                         "messages": [{"role": "user", "content": words}]})
    assert r.status_code == 200
    answer = r.json()["choices"][0]["message"]["content"]
    logs = Path(cli_env["LOCALGEN_HOME"]) / "data" / "logs" / "logs.db"
    if logs.exists():
        import sqlite3

        with sqlite3.connect(logs) as db:
            assert not db.execute("SELECT count(*) FROM responses WHERE prompt LIKE '%pomegranate%'").fetchone()[0]
    line = server.access(r.headers["x-request-id"])
    assert re.fullmatch(r"POST /v1/chat/completions 200 \d+\+\d+ tokens \d+ ms id=req_[0-9a-f]+", line), line
    said = server.log()
    assert "pomegranate" not in said and (not answer.strip() or answer.strip() not in said)


def test_api_ps_takes_the_key_as_the_team_page_says(server: Server) -> None:
    assert "`GET /api/ps` with the key from any machine that reaches the server (without it, `401`)" in " ".join(
        _page("team.md").split())
    assert httpx.get(f"{server.url}/api/ps", timeout=60).status_code == 401
    r = httpx.get(f"{server.url}/api/ps", headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert r.status_code == 200 and "models" in r.json(), r.text


def test_the_same_seed_gives_the_same_text_and_so_does_temperature_0(cli: CLI) -> None:
    def text(*flags: str) -> str:
        r = cli("run", "-p", "Name a colour.", "-n", "12", "--no-log", "--json", *flags)
        assert r.returncode == 0, r.stderr
        return str(json.loads(r.stdout)["text"])

    assert text("--seed", "42") == text("--seed", "42")
    assert text("--temperature", "0") == text("--temperature", "0")
    seeds = {json.loads(cli("run", "-p", "Hi", "-n", "1", "--no-log", "--json").stdout)["seed"] for _ in range(2)}
    assert len(seeds) == 2, "without --seed each run draws a fresh one, which --json reports"


def test_the_ci_pages_exit_codes(cli: CLI, tmp_path: Path) -> None:
    offline = CLI({**cli.env, "LOCALGEN_OFFLINE": "1"})
    r = offline("run", "-m", "qwen2.5:0.5b", "-p", "hi")
    assert r.returncode == 1 and "offline" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = cli("run", "-p", "hi", "--temprature", "1")
    assert r.returncode == 2 and r.stderr.startswith("localgen: error:"), r.stderr
    (tmp_path / "p.jsonl").write_text('{"prompt": "Hi", "max_tokens": 2}\n{"prompt": "Hi", "top_k": 3.5}\n')
    r = cli("run", "--file", str(tmp_path / "p.jsonl"), "--json", "--no-log")
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert r.returncode == 1 and len(lines) == 2 and "text" in lines[0] and "error" in lines[1], r.stdout


def test_offline_by_the_ci_pages_variable_says_to_unset_it(cli: CLI) -> None:
    """ci.md sets LOCALGEN_OFFLINE=1: a model not on disk then says to pull with that unset (there is no
    --offline to leave out); HF_HUB_OFFLINE, which localgen honours too, is named when it is the cause."""
    env = {k: v for k, v in cli.env.items() if k != "HF_HUB_OFFLINE"}
    for extra, how in (({"LOCALGEN_OFFLINE": "1"}, "pull with LOCALGEN_OFFLINE unset)"),
                       ({"HF_HUB_OFFLINE": "1"}, "pull with HF_HUB_OFFLINE unset)")):
        for args in (("run", "-m", "qwen2.5:0.5b", "-p", "hi"), ("pull", "qwen2.5:0.5b")):
            r = CLI({**env, **extra})(*args)
            assert r.returncode == 1 and r.stderr.strip().endswith(how), (extra, args, r.stderr)
    r = CLI(env)("run", "-m", "qwen2.5:0.5b", "-p", "hi", "--offline")
    assert r.returncode == 1 and r.stderr.strip().endswith("pull without --offline)"), r.stderr


def test_the_wheel_cache_is_where_the_ci_page_says() -> None:
    """ci.md: the install keeps the wheel in ~/.cache/localgen/llama-wheels/, which LOCALGEN_WHEEL_CACHE and
    XDG_CACHE_HOME move: what scripts/install.sh reads, in that order."""
    page = (ROOT / "docs" / "ci.md").read_text(encoding="utf-8")
    assert ("`~/.cache/localgen/llama-wheels/` (`LOCALGEN_WHEEL_CACHE` moves it, and so does `XDG_CACHE_HOME`)"
            in page.replace("\n", " "))
    script = (ROOT / "scripts" / "install.sh").read_text(encoding="utf-8")
    assert "wheels=${LOCALGEN_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/localgen/llama-wheels}/" in script


def test_the_ci_pages_exit_code_for_nothing_to_go_on_with(cli_in_process: InProcessCLI, tmp_path: Path) -> None:
    """ci.md's table: `run --continue` and `chat --resume` in a home with no conversation yet, and a `--cid` or
    `--resume NAME` that names none, are errors (1), not bad usage."""
    row1 = next(line for line in (ROOT / "docs" / "ci.md").read_text(encoding="utf-8").splitlines()
                if line.startswith("| 1 |"))
    assert ("nothing to go on with (`run --continue` or `chat --resume` before any conversation, a `--cid` or "
            "`--resume NAME` that names none)") in row1
    empty = InProcessCLI({**cli_in_process.env, "LOCALGEN_HOME": str(tmp_path / "empty")})
    for args in (["run", "--continue", "hi"], ["chat", "--resume"], ["run", "--cid", "nosuch", "hi"],
                 ["chat", "--resume", "nosuch"]):
        r = empty(*args, input="hi\n")
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and r.stderr.startswith("localgen: error:"), (
            args, r.stderr)


def test_the_ci_pages_exit_codes_for_files(cli_in_process: InProcessCLI, tmp_path: Path) -> None:
    """ci.md's table: each flag's file that is not there is bad usage (2), as are a -f document, a schema, a grammar
    and a chat template that are not UTF-8 (named with the line); a model file that is not a GGUF is an error (1).
    The flags are the page's own."""
    page = (ROOT / "docs" / "ci.md").read_text(encoding="utf-8")
    row2 = next(line for line in page.splitlines() if line.startswith("| 2 |"))
    named = row2.split("not there")[1].split(")")[0]
    flags = re.findall(r"`(-[-a-z]+)`", named.split(";")[0])  # run's; the other commands' after the `;`
    assert flags == ["--file", "-f", "--image", "-a", "-jf", "-j", "--grammar", "--chat-template-file", "--functions",
                     "--mmproj", "--lora", "-m", "--draft"], row2
    assert re.findall(r"`(-[-a-z]+)`", named.split(";")[1]) == ["--api-key-file", "--docs", "-f", "-f",
                                                                  "--reference", "--imatrix"], row2
    assert "one shape, `--file prompts.txt: no such file`" in named
    gone = str(tmp_path / "gone")
    for flag in flags:
        args = [flag, gone] + ([] if flag == "--file" else ["-p", "hi"])
        r = cli_in_process("run", *args, "--yes", "-n", "1")
        assert r.returncode == 2 and r.stderr.count("\n") == 1, (flag, r.stderr)
        assert f" {gone}: no such file" in r.stderr, (flag, r.stderr)  # the one shape (tests/test_input_files.py)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"\xff\xfe not text, not a GGUF")
    for flag in ("-f", "-jf", "--grammar", "--chat-template-file"):
        assert "not UTF-8" in row2 and f"`{flag}`" in row2.split("not there")[1].split(")")[1]
        r = cli_in_process("run", flag, str(bad), "-p", "hi", "-n", "1")
        assert r.returncode == 2 and r.stderr.count("\n") == 1, (flag, r.stderr)
        assert "is not UTF-8 text: byte 0xff on line 1" in r.stderr, (flag, r.stderr)
    row1 = next(line for line in page.splitlines() if line.startswith("| 1 |"))
    assert "a model (or `--mmproj`) file that is not a GGUF" in row1
    for flag in ("-m", "--mmproj"):
        r = cli_in_process("run", flag, str(bad), "-p", "hi", "-n", "1")
        assert r.returncode == 1 and "is not a GGUF file" in r.stderr, (flag, r.stderr)


def test_show_names_the_file_list_gives(cli: CLI) -> None:
    shown = json.loads(cli("show", "smollm2:135m", "--json").stdout)["file"]
    listed = {m["name"]: m["path"] for m in json.loads(cli("list", "--json").stdout)}
    assert shown == listed["smollm2:135m"] and Path(shown).read_bytes()[:4] == b"GGUF"


def test_serve_takes_the_llama_cpp_flags_the_page_names(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tests.test_doc_examples import _parse

    page = _page("bigger-engine.md")
    named = ("`-ngl`, `-fa`, `-ctk` and `-ctv`,\n`-b` and `-ub`, `-t`, `-ot`, `--n-cpu-moe`, `--cache-ram`, "
             "`--lora`, `-np`")
    assert named in page
    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    (tmp_path / "a.gguf").touch()
    values = {"-ngl": "0", "-fa": "on", "-ctk": "q8_0", "-ctv": "f16", "-b": "512", "-ub": "256", "-t": "2",
              "-ot": "blk=CPU", "--n-cpu-moe": "2", "--cache-ram": "0", "--lora": str(tmp_path / "a.gguf"), "-np": "2"}
    assert set(values) == set(re.findall(r"`(-[\w-]+)`", named))
    for flag, value in values.items():
        assert _parse(["serve", flag, value]) == ["localgen", "serve"], flag


def test_llama_servers_window_is_the_slots_windows_together() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import bench_serve
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert "`localgen serve --ctx 4096 -np 4` is `llama-server -c 16384 -np 4`" in _page("bigger-engine.md")
    a = argparse.Namespace(slots=4, threads=2, ctx=4096, localgen_args="", llama_args="", llama_server="llama-server")
    ours, theirs = (bench_serve.command(t, "m.gguf", 1, a, 4) for t in ("localgen", "llama-server"))
    assert ours[ours.index("-c") + 1] == "4096" and ours[ours.index("-np") + 1] == "4"
    assert theirs[theirs.index("-c") + 1] == "16384" and theirs[theirs.index("-np") + 1] == "4"


def test_the_json_log_holds_no_prompt_or_answer_either(cli_env: dict[str, str]) -> None:
    server = Server(cli_env, "-np", "1", "--ctx", "512", "--log-format", "json")
    try:
        r = httpx.post(f"{server.url}/v1/chat/completions", timeout=300, json={
            "model": "smollm2:135m", "max_tokens": 3, "messages": [{"role": "user", "content": "Say pomegranate."}]})
        assert r.status_code == 200
        answer = r.json()["choices"][0]["message"]["content"].strip()
    finally:
        assert server.stop() == 0
    assert server.proc.stderr is not None
    lines = [json.loads(line) for line in server.proc.stderr.read().decode().splitlines() if line.startswith("{")]
    request = [e for e in lines if e["event"] == "request" and e["path"] == "/v1/chat/completions"]
    assert request and request[0]["prompt_tokens"] > 0, lines
    said = json.dumps(lines)
    assert "pomegranate" not in said and (not answer or answer not in said)


def test_the_preset_the_page_shows_is_one_a_page_it_links_makes() -> None:
    """bigger-engine.md's `show NAME --modelfile` names a preset that no fresh home has: the page says where it is
    made, and that page's example makes it."""
    page = _page("bigger-engine.md")
    name = re.search(r"localgen show (\S+) --modelfile", page)
    assert name, "the page shows show --modelfile"
    assert f"(`{name[1]}` is the preset that [Presets](models.md#presets-localgen-create-cp)" in page
    assert re.search(rf"^localgen create {name[1]} -f ", _page("models.md"), re.M)


def test_serve_speculates_by_lookup_or_a_draft_model_as_the_page_says(cli_in_process: InProcessCLI) -> None:
    """bigger-engine.md: serve drafts by prompt lookup (tests/test_batch_lookup.py) or with a draft model
    (tests/test_serve_draft.py), not both at once (a usage error); run has both."""
    assert "`localgen\nserve --draft MODEL` (also `-md`, as llama-server's `-md FILE`)" in _page("bigger-engine.md")
    r = cli_in_process("serve", "-md", "smollm2:135m", "--lookup")
    assert r.returncode == 2 and "--draft and --lookup cannot be combined" in r.stderr, r.stderr
    r = cli_in_process("serve", "--lookup", "--draft-max", "0")  # an option, with its range
    assert r.returncode == 2 and "No such option" not in r.stderr and "--draft-max" in r.stderr, r.stderr
    r = cli_in_process("run", "--lookup", "--draft", "smollm2:135m", "-p", "hi", "--mmproj", "/nonexistent.gguf")
    assert r.returncode == 2 and "No such option" not in r.stderr, r.stderr


def test_load_wait_takes_a_duration_as_keep_alive_does(cli_in_process: InProcessCLI) -> None:
    """team.md gives --load-wait in minutes beside --keep-alive 30m: it takes 90s or 2m as well as seconds (2m was
    "not a valid number"), within 1 s to 1 h, each refusal one line and exit 2."""
    for good in ("2m", "90s", "90"):  # accepted: the error is the next check's, the model's
        r = cli_in_process("serve", "--load-wait", good, "-m", "no-such-model:1b")
        assert r.returncode == 1 and "unknown model 'no-such-model:1b'" in r.stderr, (good, r.stderr)
    for bad, said in (("2x", "--load-wait: bad duration '2x': use seconds, or e.g. 90s, 2m"),
                      ("2h", "--load-wait must be within 1 s to 1 h, not 2h"), ("0", "--load-wait must be within")):
        r = cli_in_process("serve", "--load-wait", bad, "-m", "no-such-model:1b")
        assert r.returncode == 2 and r.stderr.startswith(f"localgen: error: {said}"), (bad, r.stderr)
        assert r.stderr.count("\n") == 1, r.stderr


def test_the_team_pages_defaults_are_serves() -> None:
    """team.md names serve's defaults: the address, the port, --max-models, --load-wait, --keep-alive, --parallel,
    --max-queue and --drain-timeout (--max-models' and --max-memory's rules: tests/test_residency.py)."""
    import typer

    from localgen.cli import app, params

    page = " ".join(_page("team.md").split())
    params.install()
    command: Any = typer.main.get_command(app.build())
    default = {p.opts[0]: p.default for p in command.commands["serve"].params}
    assert default["--host"] == "127.0.0.1" and "By default the server listens on `127.0.0.1`" in page
    assert f"open `http://ADDRESS:{default['--port']}/`" in page
    assert default["--max-models"] is None and "`--max-models N` (default 3, or 3 per GPU when offloading)" in page
    assert default["--load-wait"] == "2m" and "up to `--load-wait` (2 minutes by default)" in page
    assert default["--keep-alive"] == "5m" and "after that long idle (default `5m`)" in page
    assert default["--parallel"] == 4 and "`--parallel N` (default 4)" in page
    assert default["--max-queue"] == 64 and "up to `--max-queue` requests (default 64)" in page
    assert default["--drain-timeout"] == 4 and "(`--drain-timeout`, default 4)" in page


def test_an_install_with_the_wheel_cached_builds_nothing() -> None:
    """ci.md: with the wheel cache kept, "the next install builds nothing": scripts/install.sh runs its one build
    (`pip wheel`) only when the cache folder holds no llama-cpp-python wheel, and installs the cached one."""
    page = " ".join(_page("ci.md").split())
    assert "cache that folder between jobs and the next install builds nothing" in page
    script = (ROOT / "scripts" / "install.sh").read_text(encoding="utf-8").splitlines()
    builds = [i for i, line in enumerate(script) if " wheel " in line and "-w \"$wheels\"" in line]
    assert len(builds) == 1, "one build, into the cache"
    guard = next(i for i in range(builds[0], -1, -1) if script[i].lstrip().startswith("if "))
    assert script[guard].strip() == 'if ! ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then', script[guard]
    after = script[builds[0]:]
    assert after[1].strip() == "fi" and "install -q --no-deps --force-reinstall \"$wheels\"/llama_cpp_python-*.whl" \
        in after[2], after[:3]


def test_the_log_has_a_line_for_each_load_and_unload(cli_env: dict[str, str]) -> None:
    """team.md: the server's stderr has "one [line] per model load, unload and swap" (a swap's line:
    tests/test_serve_service.py): the start's load, the unload after --keep-alive idle, the load a request brings,
    and the unload a request asks for (Ollama's keep_alive 0)."""
    import time

    server = Server(cli_env, "-np", "1", "--ctx", "512", "--keep-alive", "1s")
    try:
        deadline = time.monotonic() + 120  # a safety net: the idle unload comes a second after the load
        while server.health()["loaded"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert server.health()["loaded"] is False
        r = httpx.post(f"{server.url}/api/generate", timeout=300, json={
            "model": "smollm2:135m", "prompt": "Hi", "options": {"num_predict": 1}, "keep_alive": "5m",
            "stream": False})
        assert r.status_code == 200 and r.json()["done"], r.text
        r = httpx.post(f"{server.url}/api/generate", timeout=300, json={"model": "smollm2:135m", "keep_alive": 0})
        assert r.status_code == 200 and r.json()["done_reason"] == "unload", r.text
    finally:
        assert server.stop() == 0
    assert server.proc.stderr is not None
    said = [line for line in server.proc.stderr.read().decode().splitlines()
            if line.startswith(("localgen serve: loaded ", "localgen serve: unloaded "))]
    assert [line.split(" (")[0].split(" in ")[0] for line in said] == [
        "localgen serve: loaded smollm2:135m", "localgen serve: unloaded smollm2:135m",
        "localgen serve: loaded smollm2:135m", "localgen serve: unloaded smollm2:135m"], said
    assert said[1].endswith("(idle for its keep-alive)") and said[3].endswith("(asked)"), said
