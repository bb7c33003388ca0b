"""Saved prompt caches: hit and miss give the same text, bad files are removed, the cap evicts, chats resume."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest

from tests.conftest import CLI


@pytest.fixture
def env(cli_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    return {**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")}


DOC_LINES = 15  # 279 tokens: a prefix of 256 or more is cached (engine/promptcache.py's MIN_PREFIX)


def doc(tmp_path: Path, name: str, n: int) -> Path:
    p = tmp_path / name
    p.write_text("\n".join(f"Line {i}: the {name} river passes mill number {i} near the old bridge." for i in range(n)))
    return p


def run(env: dict[str, str], *args: str) -> dict[str, object]:
    """`localgen run` in `env`: a process of its own (through the session's fork server: the environment
    differs from the session's in LOCALGEN_* only)."""
    r = CLI(env)("run", "-n", "6", "--temperature", "0", "--json", *args, timeout=180)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def states(env: dict[str, str]) -> list[Path]:
    return sorted((Path(env["LOCALGEN_HOME"]) / "cache" / "prompt-states").glob("*.state"))


def test_hit_reuses_the_prefix_and_changes_nothing(env: dict[str, str], tmp_path: Path) -> None:
    d = doc(tmp_path, "alpha", DOC_LINES)
    plain = run(env, "-f", str(d), "-p", "Which mill is first?", "--no-prompt-cache")
    assert plain["prompt_cache"] == "off" and not states(env)
    first = run(env, "-f", str(d), "-p", "Which mill is first?")
    assert first["prompt_cache"] == "saved" and len(states(env)) == 1
    again = run(env, "-f", str(d), "-p", "Which mill is first?")
    assert again["prompt_cache"] == "hit"
    stats = again["stats"]
    assert isinstance(stats, dict) and stats["cached_tokens"] >= 256
    assert plain["text"] == first["text"] == again["text"], "a cached prefix gives the same answer"
    other = run(env, "-f", str(d), "-p", "Name the river.")
    assert other["prompt_cache"] == "hit", "a different question reuses the same document prefix"
    short = run(env, "-p", "Hi")
    assert short["prompt_cache"] == "skipped"
    assert not list((Path(env["LOCALGEN_HOME"]) / "cache").rglob("*.tmp")), "writes are atomic"


def test_the_text_does_not_depend_on_the_cache(env: dict[str, str], tmp_path: Path) -> None:
    # With the cache, the prefix and the question are evaluated in two pieces; llama.cpp rounds some rows
    # differently in a batch of another size, so --no-prompt-cache evaluates the same two pieces.
    rng = random.Random(3)
    words = ["alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "metal", "glass", "paper"]
    d = tmp_path / "doc.txt"
    d.write_text(" ".join(rng.choice(words) for _ in range(700)))
    ask = ["-f", str(d), "-p", "Summary:", "-n", "16"]
    off = run(env, *ask, "--no-prompt-cache")
    saved = run(env, *ask)
    hit = run(env, *ask)
    assert (off["prompt_cache"], saved["prompt_cache"], hit["prompt_cache"]) == ("off", "saved", "hit")
    assert off["text"] == saved["text"] == hit["text"]


@pytest.mark.parametrize("damage", ["garbage", "truncate"])
def test_a_bad_state_file_is_removed_not_loaded(env: dict[str, str], tmp_path: Path, damage: str) -> None:
    d = doc(tmp_path, "beta", DOC_LINES)
    good = run(env, "-f", str(d), "-p", "Which mill is last?")
    [path] = states(env)
    data = path.read_bytes()
    path.write_bytes(b"\x00not a state" * 100 if damage == "garbage" else data[: len(data) // 3])
    again = run(env, "-f", str(d), "-p", "Which mill is last?")
    assert again["prompt_cache"] == "saved", "the bad file was dropped and the prefix evaluated again"
    assert again["text"] == good["text"]
    [path2] = states(env)
    assert path2.stat().st_size == len(data)


def test_size_cap_evicts_least_recently_used(env: dict[str, str], tmp_path: Path) -> None:
    a, b = doc(tmp_path, "gamma", DOC_LINES), doc(tmp_path, "delta", DOC_LINES)
    run(env, "-f", str(a), "-p", "First mill?")
    [first] = states(env)
    cap_mb = first.stat().st_size * 3 // 2 >> 20
    capped = {**env, "LOCALGEN_PROMPT_CACHE_MB": str(max(1, cap_mb))}
    run(capped, "-f", str(b), "-p", "First mill?")
    remaining = states(env)
    assert len(remaining) == 1 and remaining[0] != first, "the older state was evicted for the newer"


def test_chat_resume_restores_the_kv_state(env: dict[str, str]) -> None:
    def chat(*args: str, text: str) -> subprocess.CompletedProcess[str]:
        return CLI(env)("chat", *args, "-n", "12", "--temperature", "0", input=text, timeout=180)

    r = chat("kv", text="Tell me about rivers.\nAnd lakes?\n")
    assert r.returncode == 0, r.stderr
    assert list((Path(env["LOCALGEN_HOME"]) / "cache" / "prompt-states" / "chats").glob("kv.*.state"))
    r = chat("--resume", "kv", "--stats", text="And seas?\n/stats\n")
    assert r.returncode == 0, r.stderr
    assert "restored the KV state" in r.stderr
    line = next(ln for ln in r.stderr.splitlines() if "prompt tokens" in ln)
    prompt, cached = (int(x) for x in line.replace("(", " ").split()[0:4:3])
    assert cached >= prompt - 20, line
