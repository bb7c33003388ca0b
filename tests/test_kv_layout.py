"""--kv-unified / --no-kv-unified (llama.cpp's -kvu): the throughput scheduler's KV cells as one pool shared by every
sequence (the default with layers on a GPU) or a stream of cells per sequence (a CPU's default, and bench -npl's, as
llama-batched-bench keeps them), by engine/batchmode.py's kv_pool. On this CPU machine --kv-unified puts the GPU's
layout under test; llama.cpp's own load log says which layout it made."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import httpx

from localgen.engine.batchmode import kv_pool
from localgen.types import LoadParams
from tests.conftest import CLI, InProcessCLI
from tests.test_serve import Server

PROMPTS = ["Tell me about rivers.", "What is the capital of France?", "Write a haiku about snow."]


def _engine(offloaded: bool, kv_unified: bool | None) -> SimpleNamespace:
    return SimpleNamespace(offloaded=offloaded, params=LoadParams(kv_unified=kv_unified))


def test_one_pool_on_a_gpu_a_stream_each_on_a_cpu_and_for_sequences_that_start_together() -> None:
    assert kv_pool(_engine(True, None), throughput=True)  # type: ignore[arg-type]
    assert not kv_pool(_engine(False, None), throughput=True)  # type: ignore[arg-type]
    assert not kv_pool(_engine(True, None), throughput=True, together=True)  # type: ignore[arg-type]
    # the flag decides wherever it is given, for serve's requests and bench's sequences alike
    assert kv_pool(_engine(False, True), throughput=True, together=True)  # type: ignore[arg-type]
    assert not kv_pool(_engine(True, False), throughput=True)  # type: ignore[arg-type]
    # the exact scheduler keeps a stream per sequence: a row's attention spans only its own cells, as alone
    assert not kv_pool(_engine(True, True), throughput=False)  # type: ignore[arg-type]


def _kv_caches(stderr: str) -> list[str]:
    """llama.cpp's KV cache lines: "(  1536 cells,  30 layers,  3/1 seqs)", sequences / streams."""
    return [line.split("layers,")[1].split(")")[0].strip() for line in stderr.splitlines()
            if "llama_kv_cache: size" in line]


def _first_token(doc: dict[str, object]) -> dict[str, float]:
    """The first answer token's candidates in a --json --logprobs 3 record: token → logprob."""
    first = doc["logprobs"][0]  # type: ignore[index]
    return {c["token"]: c["logprob"] for c in first["top_logprobs"]}  # type: ignore[index]


def test_run_file_lays_out_the_cells_as_asked_and_answers_alike(cli: CLI, tmp_path: Path) -> None:
    common = ["-n", "8", "--temperature", "0", "--ctx", "512"]
    f = tmp_path / "prompts.txt"
    f.write_text("\n".join(PROMPTS) + "\n")
    alone = []
    for p in PROMPTS:
        r = cli("run", "-p", p, "--no-prompt-cache", "--json", "--logprobs", "3", *common)
        assert r.returncode == 0, r.stderr
        alone.append(json.loads(r.stdout))
    env_pool = CLI({**cli.env, "LLAMA_ARG_KV_UNIFIED": "1"})  # llama.cpp's environment variable for -kvu
    for run, flags, seqs, pool in ((cli, ["--no-exact"], "3/3 seqs", False),
                                   (cli, ["--no-exact", "--kv-unified"], "3/1 seqs", True),
                                   (cli, ["--no-exact", "-kvu"], "3/1 seqs", True),
                                   (env_pool, ["--no-exact"], "3/1 seqs", True),
                                   (env_pool, ["--no-exact", "-no-kvu"], "3/3 seqs", False),
                                   (cli, ["--exact", "--kv-unified"], "3/3 seqs", False)):
        r = run("run", "--file", str(f), "--parallel", "3", "--stats", "--verbose", "--json", "--logprobs", "3",
                *common, *flags)
        assert r.returncode == 0, r.stderr
        assert seqs in _kv_caches(r.stderr), (flags, _kv_caches(r.stderr))
        assert ("in one pool of KV cells" in r.stderr) == pool, flags
        got = [json.loads(line) for line in r.stdout.splitlines()]
        assert len(got) == 3 and all(g["completion_tokens"] > 0 for g in got), flags
        if "--exact" in flags:
            assert [g["text"] for g in got] == [a["text"] for a in alone], "--exact keeps a stream per sequence"
            continue
        # Sound answers: each first token is one of the three the prompt alone ranks first, near its log-probability
        # there (another sequence's cells seen through the mask would move them far). Not the same bits in one pool:
        # three prompts in one ubatch are 64+ rows of one stream, which llama.cpp's CPU flash attention computes
        # in tiles of F32 products, not in the F16 ones of fewer rows (up to 0.33 apart here, a near tie flipped)
        for mine, solo in zip(got, alone, strict=True):
            token, lp = mine["logprobs"][0]["token"], mine["logprobs"][0]["logprob"]
            assert token in _first_token(solo) and abs(lp - _first_token(solo)[token]) < 0.5, (flags, mine, solo)


def test_bench_npl_keeps_a_stream_per_sequence_unless_told(cli: CLI, cli_in_process: InProcessCLI) -> None:
    recs = {}
    for flags in ([], ["--kv-unified"]):
        r = cli("bench", "-p", "16", "-n", "4", "-r", "1", "-npl", "2", "--no-e2e", "-o", "jsonl", *flags)
        assert r.returncode == 0, r.stderr
        recs[bool(flags)] = {x["test"]: x for x in map(json.loads, r.stdout.splitlines())}
    assert recs[False]["tg4 x2"]["kv_unified"] is False and recs[True]["tg4 x2"]["kv_unified"] is True
    assert recs[True]["tg4"]["kv_unified"] is None  # one sequence: no layout to choose
    r = cli("bench", "-p", "16", "-n", "4", "-r", "1", "-npl", "2", "--no-e2e", "-o", "md", "--kv-unified")
    assert r.returncode == 0 and "tg4 x2 (throughput, one pool)" in r.stdout, r.stdout
    for args in (["-p", "16", "--kv-unified"], ["--endpoint", "http://127.0.0.1:9", "-npl", "2", "--no-kv-unified"]):
        r = cli_in_process("bench", *args)  # usage errors, before any model loads or connection
        assert r.returncode == 2 and "kv-unified" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_serve_says_which_layout_it_keeps(cli_env: dict[str, str]) -> None:
    s = Server(cli_env, "-np", "2", "--ctx", "1024", "--kv-unified")
    try:
        assert s.health()["kv_unified"] is True
        r = httpx.post(f"{s.url}/v1/completions", json={"model": "smollm2:135m", "prompt": "Rivers", "max_tokens": 4,
                                                        "temperature": 0}, timeout=300)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
    finally:
        assert s.stop() == 0
    assert s.proc.stderr is not None
    assert "smollm2:135m: the slots share one pool of KV cells" in s.proc.stderr.read().decode()
