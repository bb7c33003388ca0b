"""--kv-unified / --no-kv-unified (llama.cpp's -kvu): the throughput scheduler's KV cells as one pool shared by every
sequence or a stream of cells per sequence (the default, on a CPU and a GPU alike, as llama-server and
llama-batched-bench keep them), by engine/batchmode.py's kv_pool. llama.cpp's own load log says which layout it
made."""

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


def test_a_stream_each_by_default_on_a_cpu_and_a_gpu_one_pool_when_asked() -> None:
    for offloaded in (True, False):
        assert not kv_pool(_engine(offloaded, None), throughput=True)  # type: ignore[arg-type]
        assert kv_pool(_engine(offloaded, True), throughput=True)  # type: ignore[arg-type]
        assert not kv_pool(_engine(offloaded, False), throughput=True)  # type: ignore[arg-type]
    from localgen.loadsettings import LOAD_KNOBS

    help_ = LOAD_KNOBS["kv_unified"].help  # --help said one pool on a GPU by default, which kv_pool never kept
    assert "(default: a stream per sequence, on a CPU and on a GPU alike," in help_ and "one pool for" not in help_
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


def test_the_environment_variable_lays_out_only_what_there_is_to_lay_out(cli: CLI) -> None:
    """LLAMA_ARG_KV_UNIFIED, which a user may export for llama-server, is no error where nothing is laid out:
    bench without -npl measures, a remote endpoint is asked; the flag typed there is an error."""
    env = CLI({**cli.env, "LLAMA_ARG_KV_UNIFIED": "1"})
    r = env("bench", "-p", "16", "-n", "4", "-r", "1", "--no-e2e", "-o", "jsonl")
    assert r.returncode == 0, r.stderr
    assert [json.loads(line)["kv_unified"] for line in r.stdout.splitlines()] == [None, None]
    enabled = CLI({**cli.env, "LLAMA_ARG_KV_UNIFIED": "enabled"})  # llama.cpp's words for its switches, too
    r = enabled("bench", "-p", "16", "-n", "4", "-r", "1", "-npl", "2", "--no-e2e", "-o", "jsonl")
    assert r.returncode == 0, r.stderr
    assert {x["test"]: x["kv_unified"] for x in map(json.loads, r.stdout.splitlines())}["tg4 x2"] is True
    for run, flags in ((env, []), (cli, ["-kvu"])):
        r = run("run", "--endpoint", "http://127.0.0.1:9", "-p", "hi", *flags)  # nothing listens on port 9
        assert r.returncode != 0 and "Traceback" not in r.stderr
        assert ("--kv-unified cannot be used with a remote endpoint" in r.stderr) == bool(flags), r.stderr


def test_serve_says_which_layout_it_keeps(cli_env: dict[str, str]) -> None:
    for flags, pool in (((), False), (("--kv-unified",), True)):  # a CPU's default: a stream per slot
        s = Server(cli_env, "-np", "2", "--ctx", "1024", *flags)
        try:
            assert s.health()["kv_unified"] is pool
            r = httpx.post(f"{s.url}/v1/completions", json={"model": "smollm2:135m", "prompt": "Rivers",
                                                            "max_tokens": 4, "temperature": 0}, timeout=300)
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
        finally:
            assert s.stop() == 0
        assert s.proc.stderr is not None
        assert ("smollm2:135m: the slots share one pool of KV cells" in s.proc.stderr.read().decode()) == pool


def test_a_kv_layout_reads_back_only_the_prefixes_it_wrote(cli_env: dict[str, str], tmp_path: Path) -> None:
    """llama.cpp places a slot's saved state only in the layout it came from (one stream, or one per slot): the
    prompt cache on disk keeps a folder per layout, so a server in the other layout reads none back, and none
    fails to load; a server in the same layout reads its prefix back."""
    env = {**cli_env, "LOCALGEN_HOME": str(tmp_path)}
    args = ("-np", "2", "--ctx", "1024")  # two slots: two streams, or one pool
    system = " ".join(f"Rule {i}: the door opens on day {i % 7 + 1}." for i in range(30))

    def ask(server: Server) -> tuple[int, dict[str, object]]:
        r = httpx.post(f"{server.url}/v1/chat/completions", timeout=300, json={
            "model": "smollm2:135m", "max_tokens": 2, "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Which day?"}]})
        assert r.status_code == 200, r.text
        health = httpx.get(f"{server.url}/health", timeout=30).json()["models"]["smollm2:135m"]
        return int(r.json()["timings"]["cache_n"]), health

    store = tmp_path / "cache" / "serve-prefixes"
    for flags, folders, read_back in (((), 1, False), (("--kv-unified",), 2, False), (("--kv-unified",), 2, True)):
        s = Server(env, *args, *flags)
        try:
            cached, health = ask(s)
        finally:
            assert s.stop() == 0
        assert health["prompt_cache"]["refused"] == 0, health  # type: ignore[index]
        assert (cached > 64 and health["disk_hits"] == 1) == read_back, (flags, cached, health)
        assert len([d for d in store.iterdir() if d.is_dir()]) == folders, sorted(store.iterdir())
