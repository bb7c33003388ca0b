"""README promises that no other test watched (issue #47): special-token text in prompts, `run --file` jobs kept
out of the log, a local `--resume-from`, shared prefixes on `/health`, `/v1/models`' `max_model_len`, the legacy
`functions` refused, and `enable_thinking` / Ollama's `think: false` reaching the template."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from localgen.engine.tokens import reusable_prefix
from tests.conftest import CLI, ROOT
from tests.test_serve import SERVE_GRID, Server

MODEL = "smollm2:135m"
N = ("-n", "4", "--temperature", "0")
# Qwen3's template reads enable_thinking: false writes an empty <think></think> block after the generation prompt.
# It speaks ChatML, as SmolLM2 does.
QWEN3 = ROOT / "tests" / "data" / "templates" / "Qwen-Qwen3-0.6B.jinja"


def _prompt_tokens(r: subprocess.CompletedProcess[str]) -> int:
    assert r.returncode == 0, r.stderr
    return int(json.loads(r.stdout)["stats"]["prompt_tokens"])


# ---- special tokens: "Text such as `<|im_end|>` in your prompt or piped file becomes the model's control token"

def test_special_token_text_in_a_prompt_or_piped_file_is_one_control_token(cli: CLI) -> None:
    special = _prompt_tokens(cli("run", "--raw", "--json", *N, "a<|im_end|>"))
    near = _prompt_tokens(cli("run", "--raw", "--json", *N, "a<|im_end>"))  # not the token's text: split up
    assert near > special + 2, "<|im_end|> was tokenized as its characters, not as the control token"
    piped = _prompt_tokens(cli("run", "--raw", "--json", *N, input="a<|im_end|>"))
    assert piped == special, "piped text is tokenized as a prompt is"


# ---- the log: "`run --file`/`--each-line` jobs are not logged: their JSONL output is their record."

def _log(c: CLI) -> list[dict[str, Any]]:
    r = c("logs", "-n", "0", "--json")
    assert r.returncode == 0, r.stderr
    return list(json.loads(r.stdout))


def test_file_and_each_line_jobs_are_not_logged(cli_env: dict[str, str], tmp_path: Path) -> None:
    c = CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")})
    one = c("run", *N, "Name a fruit.")
    assert one.returncode == 0 and "not logged" not in one.stderr, one.stderr
    assert [x["prompt"] for x in _log(c)] == ["Name a fruit."], "a single run is logged in this home"
    prompts = tmp_path / "in.txt"
    prompts.write_text("Name a tree.\nName a bird.\n")
    r = c("run", "--file", str(prompts), "--json", *N)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 2, r.stderr
    r = c("run", "--each-line", "--json", *N, input="Name a river.\nName a hill.\n")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 2, r.stderr
    assert [x["prompt"] for x in _log(c)] == ["Name a fruit."], "only the single run is in the log"


# ---- "`--resume-from OUTPUT.jsonl` ... skips the lines that output already answered ... This works for local
# runs too."

def test_resume_from_picks_up_a_local_job_where_it_stopped(cli: CLI, tmp_path: Path) -> None:
    prompts = tmp_path / "in.txt"
    prompts.write_text("".join(f"Say something about the number {i}.\n" for i in range(1, 5)))
    job = ("run", "--file", str(prompts), "--json", "--seed", "7", *N)
    full = cli(*job)
    assert full.returncode == 0 and len(full.stdout.splitlines()) == 4, full.stderr
    out = tmp_path / "out.jsonl"
    out.write_text("".join(full.stdout.splitlines(keepends=True)[:2]) + '{"line": 3, "te')  # cut short mid-line
    with open(out, "a") as sink:
        r = cli.popen(*job, "--resume-from", str(out), "--stats", stdout=sink, stderr=subprocess.PIPE, text=True)
        _, err = r.communicate(timeout=600)
    assert r.returncode == 0 and "2 already answered" in err, err
    new = [json.loads(x) for x in out.read_text().splitlines()[3:]]
    assert [d["line"] for d in new] == [3, 4], "only the unanswered lines ran, once each"
    assert [d["text"] for d in new] == [json.loads(x)["text"] for x in full.stdout.splitlines()[2:]]


# ---- serve: one server for the rest of the file

@pytest.fixture(scope="module")
def server(cli_env: dict[str, str]) -> Iterator[Server]:
    s = Server(cli_env, "-np", "2", "--ctx", "1024", "--chat-template-file", str(QWEN3))
    yield s
    assert s.stop() == 0


def _chat(server: Server, body: dict[str, Any]) -> httpx.Response:
    full = {"model": MODEL, "max_tokens": 4, "temperature": 0, **body}
    return httpx.post(f"{server.url}/v1/chat/completions", json=full, timeout=300)


def test_models_list_says_max_model_len(server: Server) -> None:
    r = httpx.get(f"{server.url}/v1/models", timeout=30)
    assert r.status_code == 200
    windows = {m["id"]: m["max_model_len"] for m in r.json()["data"]}
    assert windows[MODEL] == 1024 and windows["gemma3:270m"] == 1024  # loaded, and on demand: the same --ctx


def test_a_new_request_shares_a_busy_slots_prefix_and_health_counts_it(server: Server) -> None:
    # 30 rules, some 240 tokens: the shared cells stand well clear of the 20 the assertion allows for the question
    system = {"role": "system", "content": " ".join(f"Rule {i}: be brief." for i in range(30))}
    before = server.health()["shared_prompt_tokens"]
    long = threading.Thread(target=_chat, args=(server, {
        "messages": [system, {"role": "user", "content": "Count to fifty."}], "max_tokens": 64, "ignore_eos": True}))
    long.start()
    try:
        deadline = time.monotonic() + 120
        while server.health()["running"] == 0:  # its prompt is in the slot's cells once it runs
            assert time.monotonic() < deadline and long.is_alive(), "the first request never ran"
            time.sleep(0.05)
        r = _chat(server, {"messages": [system, {"role": "user", "content": "Name a colour."}]})
        assert r.status_code == 200, r.text
        prompt = r.json()["usage"]["prompt_tokens"]
    finally:
        long.join(timeout=300)
    shared = server.health()["shared_prompt_tokens"] - before
    # the system prompt's cells but the rows a fresh evaluation computes otherwise (engine/tokens.py): at least
    # what a common prefix of all but the question's (under 20) tokens gives
    least = reusable_prefix(prompt - 20, prompt - 20, prompt, *SERVE_GRID)
    assert 64 < least <= shared <= prompt - 64, f"the system prompt's cells were shared, not recomputed: {shared}"


def test_legacy_functions_and_audio_output_are_400s_that_say_so(server: Server) -> None:
    hi = [{"role": "user", "content": "Hi"}]
    fn = {"name": "f", "parameters": {"type": "object", "properties": {}}}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"functions": [fn]}, "functions"), ({"function_call": "auto"}, "function_call"),
        ({"modalities": ["text", "audio"]}, "modalities"), ({"audio": {"voice": "alloy", "format": "wav"}}, "audio")]
    for body, param in cases:
        r = _chat(server, {"messages": hi, **body})
        assert r.status_code == 400, (body, r.text)
        assert f"`{param}`" in r.json()["error"]["message"], r.text
    assert server.health()["failed_jobs"] == 0, "refused before any work"


def test_enable_thinking_and_ollama_think_false_reach_the_template(server: Server) -> None:
    msgs = [{"role": "user", "content": "Hi"}]

    def openai_tokens(extra: dict[str, Any]) -> int:
        r = _chat(server, {"messages": msgs, **extra})
        assert r.status_code == 200, r.text
        return int(r.json()["usage"]["prompt_tokens"])

    def ollama_tokens(extra: dict[str, Any]) -> int:
        r = httpx.post(f"{server.url}/api/chat", json={"model": MODEL, "messages": msgs, "stream": False,
                                                       "options": {"num_predict": 4, "temperature": 0}, **extra},
                       timeout=300)
        assert r.status_code == 200, r.text
        return int(r.json()["prompt_eval_count"])

    plain = openai_tokens({})
    assert openai_tokens({"chat_template_kwargs": {"enable_thinking": True}}) == plain
    off = openai_tokens({"chat_template_kwargs": {"enable_thinking": False}})
    assert off > plain, "enable_thinking: false writes an empty <think></think> block in Qwen3's template"
    assert ollama_tokens({}) == plain and ollama_tokens({"think": True}) == plain
    assert ollama_tokens({"think": False}) == off


# ---- "`--share-prefix`, on by default ... recomputed (`--no-share-prefix`)": the flag reaches the worker, and a
# scheduler told not to share evaluates a busy slot's prefix again (the other half, sharing, is test_scheduler's
# and the /health test above)

def test_serve_no_share_prefix_reaches_the_worker(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from localgen.cli import app, params
    from localgen.errors import LocalgenError
    from localgen.serve import worker

    got: list[bool] = []

    def recorder(*args: Any, **kw: Any) -> None:
        got.append(kw["share_prefixes"])
        raise LocalgenError("stopped before loading")

    monkeypatch.setattr(worker, "ModelWorker", recorder)
    params.install()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    for flags in ([], ["--share-prefix"], ["--no-share-prefix"]):
        r = CliRunner().invoke(app.build(), ["serve", "--port", port, *flags], env={"COLUMNS": "200"})
        assert isinstance(r.exception, LocalgenError) and "stopped before loading" in str(r.exception), r.output
    assert got == [True, True, False]


def test_a_scheduler_without_shared_prefixes_recomputes_a_busy_slots_prefix(smollm2_engine: object) -> None:
    from localgen.engine.batch import ParallelContext
    from localgen.engine.batchseq import Request
    from localgen.engine.scheduler import Finished, Scheduler
    from localgen.engine.tokens import reusable_prefix
    from localgen.native.prompt import Prompt
    from localgen.types import SamplingParams

    eng: Any = smollm2_engine
    system = "You are a careful assistant. Answer in one short sentence. " * 8  # the prompts share 107 tokens

    def conv(q: str) -> list[int]:
        return list(eng.chat_tokens([{"role": "system", "content": system}, {"role": "user", "content": q}]))

    def greedy(n: int) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)

    pcs: list[Any] = []

    def run(share: bool) -> tuple[int, int]:
        pc = ParallelContext(eng, 2, 1024, pooled=True, share_prefixes=share)
        pcs.append(pc)
        sched = Scheduler(pc, reuse=True)
        sched.add(Request(0, Prompt.text(conv("Name a river.")), greedy(6)))
        done: dict[int, Any] = {}
        try:
            while not sched.idle:
                done.update({o.id: o.completion for o in sched.step() if isinstance(o, Finished)})
                running = {seq.req.index: len(seq.dec.tokens) for seq in sched.active.values()}
                if running.get(0) == 2 and 1 not in running:  # the first request runs: the second arrives
                    sched.add(Request(1, Prompt.text(conv("Name a mountain.")), greedy(2)))
        finally:
            pc.close()
        return pc.slots.shared, done[1].cached_tokens

    first, second = conv("Name a river."), conv("Name a mountain.")
    common = next(i for i, (x, y) in enumerate(zip(first, second, strict=False)) if x != y)
    shared, cached = run(True)
    ubatch, grid = pcs[0].n_ubatch, pcs[0].grid
    # the system prompt's cells but the rows a fresh evaluation computes otherwise (engine/tokens.py)
    expected = reusable_prefix(common, len(first), len(second), ubatch, grid)
    assert shared == expected > 0 and cached == shared and common > 100, \
        "with sharing, the system prompt's cells are taken"
    assert run(False) == (0, 0), "without sharing, the second request evaluates its whole prompt"
