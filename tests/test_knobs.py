"""llama.cpp's knobs on the real models: each sampler changes the text and every path applies it alike;
log-probabilities; load settings reach llama.cpp; threads, repacking and memory defaults; fast starts."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from localgen import hardware
from tests.conftest import ALL_CPUS, CLI, on_all_cpus, unpinned

PROMPT = "Write a short poem about the sea and the sky."
BASE = ["--temperature", "0.9", "--seed", "11", "-n", "24", "--ctx", "512", "--no-prompt-cache"]
KNOBS = {
    "mirostat": ["--mirostat", "2", "--mirostat-ent", "1.5"],
    "dry": ["--dry-multiplier", "3", "--dry-allowed-length", "1", "--raw"],  # with a repetitive prompt, below
    "xtc": ["--xtc-probability", "1", "--xtc-threshold", "0.02"],
    "top_n_sigma": ["--top-n-sigma", "0.3"],
    "logit_bias": ["--logit-bias", "30+40"],
    "dynatemp": ["--dynatemp-range", "0.8", "--dynatemp-exp", "2"],
}


def _text(r: Any) -> str:
    assert r.returncode == 0, r.stderr
    return str(json.loads(r.stdout)["text"])


REPEATS = "one two three one two three one two three one two three one two"  # DRY sees the prompt too


@pytest.fixture(scope="module")
def plain_texts() -> dict[tuple[str, ...], str]:
    """The run without a knob, once per prompt: four of the knobs share the same one."""
    return {}


@pytest.mark.parametrize("knob", sorted(KNOBS))
def test_each_sampler_changes_the_text_and_the_paths_agree(cli: CLI, tmp_path: Path, knob: str,
                                                           plain_texts: dict[tuple[str, ...], str]) -> None:
    args = KNOBS[knob]
    prompt = REPEATS if "--raw" in args else PROMPT
    without = ("run", "-p", prompt, *BASE, *[a for a in args if a == "--raw"], "--json")
    if without not in plain_texts:
        plain_texts[without] = _text(cli(*without))
    plain = plain_texts[without]
    alone = _text(cli("run", "-p", prompt, *BASE, *args, "--json"))
    assert alone != plain, f"{knob} made no difference"
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": prompt, "seed": 11}) + "\n" + json.dumps({"prompt": "Hi", "seed": 3}) + "\n")
    r = cli("run", "--file", str(f), "--parallel", "2", "--exact", "--json", *BASE, *args)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[0])["text"] == alone, f"--parallel applies {knob} alike"


def test_logit_bias_bans_the_greedy_first_token(cli: CLI, smollm2_engine: Any) -> None:
    greedy = json.loads(cli("run", "-p", "Say hello.", "-n", "3", "--temperature", "0", "--json", "--logprobs",
                            "0").stdout)
    first = greedy["logprobs"][0]
    token = smollm2_engine.tokenize(first["token"], add_special=False)[0]  # the session's SmolLM2: same vocabulary
    banned = json.loads(cli("run", "-p", "Say hello.", "-n", "3", "--temperature", "0", "--json", "--logit-bias",
                            f"{token}-inf").stdout)
    assert not banned["text"].startswith(first["token"])


def test_ignore_eos_keeps_going(cli: CLI) -> None:
    # greedy SmolLM2 answers "Say OK." in 12 tokens and ends: -n 20 leaves room for the end and goes past it
    short = json.loads(cli("run", "-p", "Say OK.", "--temperature", "0", "-n", "20", "--json").stdout)
    assert short["finish_reason"] == "eos" and short["stats"]["completion_tokens"] < 20
    longer = json.loads(cli("run", "-p", "Say OK.", "--temperature", "0", "-n", "20", "--json",
                            "--ignore-eos").stdout)
    assert longer["finish_reason"] == "length" and longer["stats"]["completion_tokens"] == 20


def test_logprobs_in_json_and_jsonl(cli: CLI, tmp_path: Path) -> None:
    doc = json.loads(cli("run", "-p", "Name a colour.", "-n", "6", "--temperature", "0", "--json", "--logprobs",
                         "3").stdout)
    lps = doc["logprobs"]
    assert len(lps) == doc["stats"]["completion_tokens"] and "".join(t["token"] for t in lps) == doc["text"]
    for t in lps:
        tops = [x["logprob"] for x in t["top_logprobs"]]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and all(x <= 0 for x in tops)
        assert t["logprob"] == pytest.approx(tops[0], abs=1e-4), "greedy picks the likeliest"
    f = tmp_path / "p.txt"
    f.write_text("Name a colour.\n")
    line = json.loads(cli("run", "--file", str(f), "-n", "6", "--temperature", "0", "--json", "--logprobs",
                          "1").stdout)
    assert [t["token"] for t in line["logprobs"]] == [t["token"] for t in lps]


def _greedy_logprobs(cli: CLI, *extra: str) -> list[Any]:
    r = cli("run", "-p", "The capital of France is", "--raw", "-n", "3", "--temperature", "0", "--json",
            "--logprobs", "3", "--ctx", "512", "--no-prompt-cache", *extra)
    assert r.returncode == 0, r.stderr
    return list(json.loads(r.stdout)["logprobs"])


def test_load_settings_reach_llama_cpp(cli: CLI, smollm2_path: Path) -> None:
    r = cli("run", "-p", "hi", "-n", "2", "--json", "--mlock", "--no-mmap", "--split-mode", "none",
            "--tensor-split", "3,1", "--main-gpu", "0", "--rope-scaling", "yarn", "--rope-freq-scale", "0.5",
            "--yarn-orig-ctx", "8192", "-c", "16384", "-tb", "1", "--verbose")
    assert r.returncode == 0, r.stderr
    load = json.loads(r.stdout)["load"]
    assert load["use_mlock"] is True and load["use_mmap"] is False and load["split_mode"] == "none"
    assert load["tensor_split"] == [3.0, 1.0] and load["rope_scaling"] == "yarn" and load["rope_freq_scale"] == 0.5
    assert load["n_ctx"] == 16384, "RoPE scaling lifts the cap at the training context (8,192)"
    assert load["n_threads_batch"] == 1
    # what llama.cpp's own log says it did (the split and GPU settings act only with layers on a GPU)
    assert "(load_mode = mlock)" in r.stderr, "--no-mmap --mlock: read into locked memory"
    # (beside a GPU the layers go to it and the rest to its pinned host buffer: no CPU_Mapped either)
    assert load["weights_mib"] and "CPU_Mapped" not in load["weights_mib"], "--no-mmap: a buffer of their own"
    assert re.search(r"llama_context: n_ctx += 16384", r.stderr) and re.search(r"freq_scale += 0\.5", r.stderr)
    assert "custom YaRN scaling detected" in r.stderr
    # and what it computes: the same greedy step's log-probabilities move with each RoPE setting
    plain = _greedy_logprobs(cli)
    assert _greedy_logprobs(cli, "--rope-freq-base", "100000")[0] == plain[0], "SmolLM2's own base: no change"
    for knob in (["--rope-freq-scale", "0.25"], ["--rope-freq-base", "1000"],
                 ["--rope-scaling", "yarn", "--rope-freq-scale", "0.25", "--yarn-orig-ctx", "8192"]):
        moved = _greedy_logprobs(cli, *knob)[0]
        assert moved["logprob"] != pytest.approx(plain[0]["logprob"], abs=1e-3), knob
    # -tb has no effect on the numbers: llama.cpp's context says how many threads it was given
    from localgen.engine.llama import Engine
    from localgen.models.resolve import resolve
    from localgen.types import LoadParams

    engine = Engine(resolve(str(smollm2_path)), LoadParams(n_ctx=256, n_threads=1, n_threads_batch=1))
    try:
        from localgen.native.lib import lib

        lc = lib()
        assert (lc.llama_n_threads(engine.ctx), lc.llama_n_threads_batch(engine.ctx)) == (1, 1)
    finally:
        engine.close()
    r = cli("run", "-p", "hi", "--split-mode", "diagonal")
    assert r.returncode == 2 and "unknown split mode" in r.stderr
    r = cli("run", "-p", "hi", "--tensor-split", "a,b")
    assert r.returncode == 2 and "--tensor-split takes numbers" in r.stderr


def test_default_threads_are_physical_for_generation_and_logical_for_batches(cli_env: dict[str, str],
                                                                            smollm2_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A run on every CPU the suite may use (not the one a test worker keeps to, where both counts are 1)
    takes as many threads as this machine has physical cores for generation, and logical CPUs for batches;
    and the rule reads the two counts apart (a machine faked to 3 cores and 5 CPUs gets 3 and 5)."""
    from localgen.engine import defaults
    from localgen.models.resolve import resolve
    from localgen.types import LoadParams

    r = unpinned("run", "-p", "hi", "-n", "1", "--json", env=cli_env)
    assert r.returncode == 0, r.stderr
    load = json.loads(r.stdout)["load"]
    physical, logical = on_all_cpus(lambda: (hardware.physical_cores(), hardware.usable_cores()))
    assert (load["n_threads"], load["n_threads_batch"]) == (physical, logical)
    if len(ALL_CPUS) > 1:
        assert logical > 1, "more than one CPU to use: a count stuck at 1 would fail here"
    monkeypatch.setattr(hardware, "physical_cores", lambda: 3)
    monkeypatch.setattr(hardware, "usable_cores", lambda: 5)
    chosen, origins = defaults.resolve(resolve(str(smollm2_path)), LoadParams(), cpu_only=True, use_records=False)
    assert (chosen.n_threads, chosen.n_threads_batch) == (3, 5)
    assert (origins["n_threads"], origins["n_threads_batch"]) == ("rule: physical cores", "rule: usable cores")


def test_physical_cores_count_cores_not_siblings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    topo = {0: ("0", "0"), 1: ("0", "0"), 2: ("1", "0"), 3: ("1", "0")}  # two cores, two threads each
    real_open = open

    def fake_open(path: Any, *a: Any, **k: Any) -> Any:
        p = str(path)
        if p.startswith("/sys/devices/system/cpu/cpu") and "/topology/" in p:
            cpu = int(p.split("/cpu")[2].split("/")[0])
            core, package = topo[cpu]
            f = tmp_path / "v"
            f.write_text(core if p.endswith("core_id") else package)
            return real_open(f, *a, **k)
        if p == "/sys/devices/cpu_core/cpus":
            raise OSError
        return real_open(path, *a, **k)

    monkeypatch.setattr("builtins.open", fake_open)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(hardware, "_cgroup_cpu_quota", lambda: None)
    assert hardware.physical_cores() == 2


def test_repacking_by_default_only_where_it_pays(cli: CLI, gemma_path: Path) -> None:
    from localgen.engine.defaults import default_repack
    from localgen.models.gguf_meta import read_summary
    from localgen.types import LoadParams, ModelRef

    share = read_summary(str(gemma_path)).repackable_share
    assert share is not None and share < 0.5, share  # Gemma 3 270M: its Q4_K matrices are a small share
    ref = ModelRef("x", str(gemma_path), "path", read_summary(str(gemma_path)))
    assert default_repack(ref, LoadParams()) is False
    mostly = ModelRef("y", "y", "path", read_summary(str(gemma_path)).__class__(
        **{**read_summary(str(gemma_path)).__dict__, "repackable_share": 0.9}))
    assert default_repack(mostly, LoadParams()) is True
    assert default_repack(mostly, LoadParams(n_gpu_layers=-1)) is False
    load = json.loads(cli("run", "-m", "gemma3:270m", "--raw", "-p", "x", "-n", "1", "--json").stdout)["load"]
    assert load["repack"] is False
    load = json.loads(cli("run", "-m", "gemma3:270m", "--raw", "-p", "x", "-n", "1", "--json",
                          "--repack").stdout)["load"]
    assert load["repack"] is True


def test_batch_and_beams_free_the_main_context(smollm2_engine: Any) -> None:
    from localgen.backend import Indexed
    from localgen.engine.beams import kv_cells
    from localgen.engine.local import LocalBackend
    from localgen.native.prompt import Prompt
    from localgen.types import GenerationRequest, SamplingParams

    backend = LocalBackend(smollm2_engine)
    req = GenerationRequest(prompt="Hello", sampling=SamplingParams(temperature=0, max_tokens=3))
    done: list[Any] = []
    backend.run_many([Indexed(1, req, 1)], 2, done.append)
    assert done and smollm2_engine._ctx is None, "the idle main context was freed during the batch"
    again = smollm2_engine.generate(Prompt.text(smollm2_engine.raw_tokens("Hello")), req.sampling)
    assert "".join(c.text for c in again)
    assert kv_cells(100, 4, -1, 4096) == 100 + 4 * 256 + 16, "without -n, beams are bounded"
    assert kv_cells(100, 4, 10, 4096) == 100 + 40 + 16


def test_gguf_summaries_skip_long_arrays_and_are_cached(smollm2_path: Path, home: Path) -> None:
    from localgen.models import gguf_meta

    fresh = gguf_meta.read_summary(str(smollm2_path), use_cache=False)
    assert fresh.vocab_size == 49152 and fresh.n_params == 134_515_008
    cached = gguf_meta.read_summary(str(smollm2_path))
    again = gguf_meta.read_summary(str(smollm2_path))
    assert again == cached == fresh
    assert list((home / "cache" / "gguf-summaries").glob("*.json"))


@pytest.mark.parametrize("edit", [{"context_length": "x"}, {"file_size": "big"}, {"n_params": [1]},
                                  {"add_bos": 1}, {"architecture": None}, {"extra": 1}, {"metadata": []}])
def test_a_remembered_summary_of_the_wrong_shape_is_read_again(smollm2_path: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              edit: dict[str, Any]) -> None:
    """A summary in the cache whose fields have the wrong types (edited by hand, another version's) was handed on:
    a TypeError traceback in list, show and run, and fit called the model file corrupt. It is read again."""
    import json

    from localgen.models import gguf_meta

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    fresh = gguf_meta.read_summary(str(smollm2_path))
    edited = 0
    for path in (tmp_path / "cache" / "gguf-summaries").glob("*.json"):
        doc = json.loads(path.read_text())
        if "architecture" in doc["summary"]:
            doc["summary"].update(edit)
            path.write_text(json.dumps(doc))
            edited += 1
    assert edited == 1
    assert gguf_meta.read_summary(str(smollm2_path)) == fresh


def test_show_hashes_only_on_request(cli: CLI, smollm2_path: Path, tmp_path: Path) -> None:
    import hashlib
    import shutil

    copy = tmp_path / "c.gguf"
    shutil.copyfile(smollm2_path, copy)
    r = cli("show", str(copy))
    assert r.returncode == 0 and "not known yet (--sha256 computes it)" in r.stdout
    doc = json.loads(cli("show", str(copy), "--sha256", "--json").stdout)
    assert doc["sha256"] == hashlib.sha256(copy.read_bytes()).hexdigest()


def test_logprobs_bytes_are_each_tokens_own_bytes(cli: CLI, tmp_path: Path) -> None:
    """OpenAI's `bytes` rebuild a character split over tokens: each token's own bytes. A token that was part of a
    character had U+FFFD's bytes [239, 191, 189] (its text decoded, then encoded again), its alternatives too."""
    grammar = tmp_path / "g.gbnf"
    grammar.write_text('root ::= "😀🎉 你好"\n', encoding="utf-8")
    r = cli("run", "--raw", "-p", "Emoji:", "-n", "12", "--temperature", "0", "--json", "--logprobs", "2",
            "--grammar", str(grammar), "--ctx", "512")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["text"] == "😀🎉 你好"
    lps = doc["logprobs"]
    assert b"".join(bytes(t["bytes"]) for t in lps) == "😀🎉 你好".encode()
    assert any("\ufffd" in t["token"] for t in lps), "the test needs a token that is part of a character"
    for one in [*lps, *(a for t in lps for a in t["top_logprobs"])]:
        if "\ufffd" in one["token"]:
            assert one["bytes"] != [239, 191, 189], one
