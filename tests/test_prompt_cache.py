"""Saved prompt caches: hit and miss give the same text, bad files are removed, the cap evicts, chats resume."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localgen.engine.promptcache import MIN_PREFIX
from localgen.engine.tokens import reusable_prefix
from tests.conftest import CLI

UBATCH, BATCH = 512, 512  # run's and chat's pieces: n_batch 512 (LoadParams), llama.cpp's n_ubatch 512


def kept_at_least(stats: object) -> bool:
    """Whether a run kept at least what a saved prefix of MIN_PREFIX tokens gives (a longer one gives more):
    the prefix but the rows a fresh evaluation computes otherwise (engine/tokens.py, reusable_prefix)."""
    assert isinstance(stats, dict)
    cached, prompt = stats["cached_tokens"], stats["prompt_tokens"]
    return bool(reusable_prefix(MIN_PREFIX, MIN_PREFIX, prompt, UBATCH, BATCH) <= cached <= prompt - 64)


def last_turn(stderr: str) -> tuple[int, int]:
    """The prompt tokens and cached tokens of chat's /stats line."""
    line = next(ln for ln in stderr.splitlines() if "prompt tokens" in ln)
    found = re.search(r"([\d,]+) prompt tokens(?: \(([\d,]+) cached\))?", line)
    assert found, line
    return int(found.group(1).replace(",", "")), int((found.group(2) or "0").replace(",", ""))


def kept_of(prompt1: int, prompt2: int) -> int:
    """What a chat's turn of `prompt2` tokens keeps of the previous turn's prompt of `prompt1` tokens (its
    answer, generated one token at a time, is evaluated again)."""
    return reusable_prefix(prompt1, prompt1, prompt2, UBATCH, BATCH)


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


class Asked:
    """One document asked three times in one home (without the cache, then saving it, then hitting it): the
    answers, the states after each, and the saved state's place and bytes, which later tests copy into homes
    of their own instead of evaluating the document again."""

    def __init__(self, env: dict[str, str], ask: list[str]) -> None:
        self.env, self.ask = env, ask
        self.off = run(env, *ask, "--no-prompt-cache")
        self.states_after_off = states(env)
        self.saved = run(env, *ask)
        [self.state] = self.states_after_saved = states(env)
        self.state_bytes = self.state.read_bytes()
        self.hit = run(env, *ask)

    def home_with_the_state(self, env: dict[str, str], data: bytes | None = None) -> Path:
        """The saved state (or `data` in its place) in `env`'s home, where a run of `ask` looks for it."""
        path = Path(env["LOCALGEN_HOME"]) / self.state.relative_to(self.env["LOCALGEN_HOME"])
        path.parent.mkdir(parents=True)
        path.write_bytes(self.state_bytes if data is None else data)
        return path


@pytest.fixture(scope="module")
def asked(cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Asked:
    # With the cache, the prefix is loaded and the question evaluated after it; llama.cpp rounds some rows
    # differently in a ubatch of another shape, so what is kept of the prefix and how the rest is cut follow
    # engine/tokens.py's rule, and the answer is a fresh evaluation's. This document (300 prompt tokens) and
    # 16 tokens showed the drift when the question alone was evaluated after the whole prefix: at the 11th token.
    d = tmp_path_factory.mktemp("asked")
    rng = random.Random(3)
    words = ["alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "metal", "glass", "paper"]
    (d / "doc.txt").write_text(" ".join(rng.choice(words) for _ in range(260)))
    ask = ["-f", str(d / "doc.txt"), "-p", "Summary:", "-n", "16"]
    return Asked({**cli_env, "LOCALGEN_HOME": str(d / "home")}, ask)


def test_hit_reuses_the_prefix_and_changes_nothing(asked: Asked) -> None:
    env = asked.env
    assert asked.off["prompt_cache"] == "off" and not asked.states_after_off
    assert asked.saved["prompt_cache"] == "saved" and len(asked.states_after_saved) == 1
    assert asked.hit["prompt_cache"] == "hit"
    assert kept_at_least(asked.hit["stats"])
    other = run(env, *asked.ask[:2], "-p", "Name the river.")
    assert other["prompt_cache"] == "hit", "a different question reuses the same document prefix"
    short = run(env, "-p", "Hi")
    assert short["prompt_cache"] == "skipped"
    assert not list((Path(env["LOCALGEN_HOME"]) / "cache").rglob("*.tmp")), "writes are atomic"


def test_the_text_does_not_depend_on_the_cache(asked: Asked) -> None:
    off, saved, hit = asked.off, asked.saved, asked.hit
    assert (off["prompt_cache"], saved["prompt_cache"], hit["prompt_cache"]) == ("off", "saved", "hit")
    assert off["text"] == saved["text"] == hit["text"]


def test_a_long_system_prompt_is_a_cached_prefix_too(env: dict[str, str]) -> None:
    """The system prompt comes before the question: past 256 tokens it is saved by one run and loaded by the
    next, whatever that one asks, and the text is the one --no-prompt-cache gives (docs/run.md)."""
    system = " ".join(["Answer in plain words, briefly."] * 40)  # 290 prompt tokens with the question
    off = run(env, "--system", system, "-p", "Name a river.", "--no-prompt-cache")
    saved = run(env, "--system", system, "-p", "Name a river.")
    [state] = states(env)
    hit = run(env, "--system", system, "-p", "Name a lake.")
    assert (off["prompt_cache"], saved["prompt_cache"], hit["prompt_cache"]) == ("off", "saved", "hit")
    assert off["text"] == saved["text"]
    assert kept_at_least(hit["stats"]) and states(env) == [state]
    # a chat's second turn keeps all the first one left in the cache, not only the system prompt's part
    r = CLI(env)("chat", "kvs", "--system", system, "-n", "6", "--temperature", "0", "--stats",
                 input="Name a river.\nAnd a lake?\n/stats\n", timeout=180)
    assert r.returncode == 0, r.stderr
    held = int(re.search(r"context ([\d,]+)/", r.stderr).group(1).replace(",", ""))  # type: ignore[union-attr]
    p2, cached = last_turn(r.stderr)
    # what the first turn's prompt gives (the context held it and 5 or 6 answer tokens)
    assert cached in {kept_of(held - g, p2) for g in (5, 6)}, (held, p2, cached)


def test_the_tools_are_a_cached_prefix(env: dict[str, str]) -> None:
    """`run --functions`: the system prompt with the tools' schemas (past 256 tokens here) is saved by the first run
    and loaded, not evaluated and saved again, by the next (the same file: a new save would replace it). The
    prefix is attached before the first token, so two answer tokens show it."""
    tests = Path(__file__).parent
    # a template that renders the tools itself (Qwen 2.5's), where they are a template variable, not a message
    tools = ["--functions", str(tests / "tool_functions.py"), "--yes", "--chat-template-file",
             str(tests / "data" / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"), "-n", "2"]
    # the first run calls the tool (a second step reads the prefix its first step saved): the run's status is
    # its first step's
    first = run(env, *tools[:-2], "-n", "40", "--tool-choice", "get_weather", "-p", "Weather in Paris?")
    assert first["steps"] == 2, first
    [state] = states(env)
    made = state.stat().st_ino
    second = run(env, *tools, "-p", "Weather in Oslo?")
    assert (first["prompt_cache"], second["prompt_cache"]) == ("saved", "hit")
    assert states(env) == [state] and state.stat().st_ino == made, "the second run loaded the state"
    assert kept_at_least(second["stats"])


def test_cached_tokens_count_only_what_a_cache_gave_back(env: dict[str, str], asked: Asked) -> None:
    """`cached_tokens` are the prompt tokens not evaluated for this answer because a cache gave them back: none
    with the cache off or on a miss (the document is evaluated, then the question after it, in one process), the
    loaded prefix but the rows evaluated again on a hit; `--stats`'s "(N cached)" says the same."""
    assert asked.off["stats"]["cached_tokens"] == 0, "off: everything was evaluated"  # type: ignore[index]
    assert asked.saved["stats"]["cached_tokens"] == 0, "a miss: everything was evaluated"  # type: ignore[index]
    assert kept_at_least(asked.hit["stats"])
    asked.home_with_the_state(env)

    def stats_line(*args: str) -> str:
        r = CLI(env)("run", "-n", "6", "--temperature", "0", "--stats", *asked.ask, *args, timeout=180)
        assert r.returncode == 0, r.stderr
        return next(ln for ln in r.stderr.splitlines() if "prompt tokens" in ln)

    assert "cached" not in stats_line("--no-prompt-cache")
    assert f"({asked.hit['stats']['cached_tokens']} cached)" in stats_line()  # type: ignore[index]


def test_the_prefill_rate_counts_every_token_evaluated_for_the_answer(smollm2_engine: Any, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """`prefill_tps` is the rate of the prompt tokens evaluated for this answer, the document saved on a miss
    included: llama.cpp's counters, read for the stats, hold every prompt token (none is reset between them;
    the rows evaluated again after the saved prefix, engine/tokens.py, are counted as the work they are)."""
    from localgen.engine.local import LocalBackend
    from localgen.types import GenerationRequest, SamplingParams

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    document = doc(tmp_path, "brook", DOC_LINES).read_text()
    request = GenerationRequest(messages=({"role": "user", "content": f"{document}\n\nSummary:"},),
                                sampling=SamplingParams(temperature=0, max_tokens=2), shared=document,
                                prompt_cache=True)
    smollm2_engine.kv.clear()
    gen = LocalBackend(smollm2_engine).generate(request)
    assert "".join(c.text for c in gen) == gen.text and gen.prompt_cache == "saved"
    perf = smollm2_engine.perf()
    assert gen.stats.cached_tokens == 0 and perf.n_p_eval >= gen.stats.prompt_tokens > MIN_PREFIX
    assert gen.stats.prefill_tps == pytest.approx(perf.n_p_eval / (perf.t_p_eval_ms / 1000))


def damaged(data: bytes, damage: str) -> bytes:
    """A state file's bytes spoiled: not a state at all, cut short, or 200 of its KV bytes flipped (a file that
    llama.cpp would load without a word)."""
    if damage == "garbage":
        return b"\x00not a state" * 100
    if damage == "truncate":
        return data[: len(data) // 3]
    mid = len(data) // 2
    return data[:mid] + bytes(b ^ 0x40 for b in data[mid:mid + 200]) + data[mid + 200:]


@pytest.mark.parametrize("damage", ["garbage", "truncate", "flipped"])
def test_a_bad_state_file_is_removed_not_loaded(env: dict[str, str], asked: Asked, damage: str) -> None:
    data = asked.state_bytes
    path = asked.home_with_the_state(env, damaged(data, damage))
    again = run(env, *asked.ask)
    assert again["prompt_cache"] == "saved", "the bad file was dropped and the prefix evaluated again"
    assert again["text"] == asked.saved["text"]
    assert again["stats"]["cached_tokens"] == 0  # type: ignore[index]
    assert states(env) == [path] and path.read_bytes() == data, "the state was written again, whole"


def test_size_cap_evicts_least_recently_used(env: dict[str, str], asked: Asked, tmp_path: Path) -> None:
    first = asked.home_with_the_state(env)  # as if a run had saved it
    cap_mb = first.stat().st_size * 3 // 2 >> 20
    capped = {**env, "LOCALGEN_PROMPT_CACHE_MB": str(max(1, cap_mb))}
    run(capped, "-f", str(doc(tmp_path, "delta", DOC_LINES)), "-p", "First mill?")
    remaining = states(env)
    assert len(remaining) == 1 and remaining[0] != first, "the older state was evicted for the newer"


def test_a_lowered_cap_evicts_at_the_next_run(env: dict[str, str], asked: Asked) -> None:
    """docs/caches.md: files are evicted least recently used past the cap, and a lowered cap does it at the next
    run, before anything is loaded; that run hits the newer state, which is all the cap holds now (the older one
    stayed beside it, and it was loaded all the same)."""
    newer = asked.home_with_the_state(env)
    older = newer.with_name(f"{'0' * 64}.{hashlib.sha256(asked.state_bytes).hexdigest()}.state")  # another prefix's
    older.write_bytes(asked.state_bytes)
    os.utime(older, (1000, 1000))
    cap_mb = len(asked.state_bytes) * 3 // 2 >> 20
    assert cap_mb >= 1 and len(asked.state_bytes) <= cap_mb << 20 < 2 * len(asked.state_bytes)
    again = run({**env, "LOCALGEN_PROMPT_CACHE_MB": str(cap_mb)}, *asked.ask)
    assert again["prompt_cache"] == "hit" and again["text"] == asked.saved["text"]
    assert states(env) == [newer], "the least recently used state was evicted"


def test_a_state_past_a_lowered_cap_is_not_loaded(env: dict[str, str], asked: Asked) -> None:
    """A state saved under a larger cap is evicted by the first run under a cap it no longer fits: that run
    evaluates the prefix (`too big`, with the answer a fresh evaluation gives), where it said `hit`."""
    asked.home_with_the_state(env)
    r = CLI({**env, "LOCALGEN_PROMPT_CACHE_MB": "1"})("run", "--temperature", "0", "--json", *asked.ask, timeout=180)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["prompt_cache"] == "too big" and out["stats"]["cached_tokens"] == 0, out["prompt_cache"]
    assert out["text"] == asked.off["text"]
    assert states(env) == []


def test_a_state_over_the_cap_is_not_kept(env: dict[str, str], asked: Asked, tmp_path: Path) -> None:
    """A prefix whose state is larger than LOCALGEN_PROMPT_CACHE_MB is not written: the run says `too big` and
    warns once; the cache is still brought within the cap (the other prefix's state, larger too, is evicted)."""
    other = asked.home_with_the_state(env)
    capped = {**env, "LOCALGEN_PROMPT_CACHE_MB": "1"}
    assert len(asked.state_bytes) > 1 << 20
    r = CLI(capped)("run", "-n", "6", "--temperature", "0", "--json", "-f", str(doc(tmp_path, "delta", DOC_LINES)),
                    "-p", "First mill?", timeout=180)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["prompt_cache"] == "too big" and out["stats"]["cached_tokens"] == 0
    assert not other.exists() and states(env) == [], "nothing written, and the state past the cap evicted"
    assert r.stderr.count("LOCALGEN_PROMPT_CACHE_MB") == 1, r.stderr


def test_a_cap_of_0_turns_the_cache_off(env: dict[str, str], asked: Asked) -> None:
    """LOCALGEN_PROMPT_CACHE_MB=0 keeps nothing: the cache is off, as with --no-prompt-cache (`off`, no warning,
    a saved state neither loaded nor evicted), and chat keeps no conversation state either."""
    saved = asked.home_with_the_state(env)
    off = {**env, "LOCALGEN_PROMPT_CACHE_MB": "0"}
    r = CLI(off)("run", "--temperature", "0", "--json", *asked.ask, timeout=180)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["prompt_cache"] == "off" and out["stats"]["cached_tokens"] == 0, out["prompt_cache"]
    assert out["text"] == asked.off["text"]
    assert "cap" not in r.stderr and "LOCALGEN_PROMPT_CACHE_MB" not in r.stderr, r.stderr
    assert states(env) == [saved]
    r = CLI(off)("chat", "zero", "-n", "4", "--temperature", "0", input="Name a river.\n", timeout=180)
    assert r.returncode == 0 and "cap" not in r.stderr, r.stderr
    assert not list((Path(env["LOCALGEN_HOME"]) / "cache" / "prompt-states").rglob("zero.*"))


@pytest.mark.parametrize("value", ["abc", "-1", "1.5", "٣"])  # "٣" is decimal to str.isdecimal(), 3 to int()
def test_a_bad_cap_is_a_usage_error(env: dict[str, str], value: str) -> None:
    """configuration.md, run.md, caches.md: a cap that is not a whole number 0 or more is a usage error that says
    what it must be, for run and chat."""
    for command in (["run", "-p", "hi"], ["chat", "x"]):
        r = CLI({**env, "LOCALGEN_PROMPT_CACHE_MB": value})(*command, "-n", "2", input="hi\n")
        assert r.returncode == 2, r.stderr
        assert r.stderr.startswith("localgen: error: LOCALGEN_PROMPT_CACHE_MB must be a whole number of megabytes, 0 "
                                   f"or more (it is {value!r})") and r.stderr.count("\n") == 1, r.stderr


def test_chat_resume_restores_the_kv_state(env: dict[str, str]) -> None:
    def chat(*args: str, text: str) -> subprocess.CompletedProcess[str]:
        return CLI(env)("chat", *args, "-n", "12", "--temperature", "0", input=text, timeout=180)

    rivers = "Tell me about rivers: " + "their springs, their valleys, their bridges and their mills. " * 12
    r = chat("kv", "--stats", text=f"{rivers}\nAnd lakes?\n/stats\n")
    assert r.returncode == 0, r.stderr
    saved, _ = last_turn(r.stderr)  # the state keeps the last turn's prompt (its answer is evaluated again)
    assert list((Path(env["LOCALGEN_HOME"]) / "cache" / "prompt-states" / "chats").glob("kv.*.state"))
    r = chat("--resume", "kv", "--stats", text="And seas?\n/stats\n")
    assert r.returncode == 0, r.stderr
    assert "of the history kept ready" in r.stderr
    prompt, cached = last_turn(r.stderr)
    assert cached == kept_of(saved, prompt) > 64, (saved, prompt, cached)


def test_a_chat_s_next_turn_counts_what_its_kv_cache_gave_back(env: dict[str, str], tmp_path: Path) -> None:
    """A long first message and no long system prompt (nothing for the prompt cache: `skipped`): the second turn
    reuses the first's KV cache all the same, and says so, with the prompt cache on or off."""
    long = " ".join(doc(tmp_path, "epsilon", DOC_LINES).read_text().splitlines())

    def second_turn(*args: str) -> tuple[int, int]:
        r = CLI(env)("chat", *args, "-n", "6", "--temperature", "0", "--stats",
                     input=f"{long}\nAnd the last mill?\n/stats\n", timeout=180)
        assert r.returncode == 0, r.stderr
        return last_turn(r.stderr)

    on, off = second_turn(), second_turn("--no-prompt-cache")
    assert on == off and on[1] > 64, (on, off)
    assert states(env) == [], "no prefix of 256 tokens to save"


def test_a_chat_state_past_a_lowered_cap_is_not_resumed(env: dict[str, str]) -> None:
    """A conversation's KV state saved under a larger cap is evicted by a --resume under a cap it does not fit,
    and the history is read again."""
    def chat(cap: dict[str, str], *args: str, text: str) -> subprocess.CompletedProcess[str]:
        r = CLI({**env, **cap})("chat", *args, "-n", "6", "--temperature", "0", "--stats", input=text, timeout=180)
        assert r.returncode == 0, r.stderr
        return r

    rivers = "Tell me about rivers: " + "their springs, their valleys, their bridges and their mills. " * 3
    chat({}, "kc", text=f"{rivers}\n")
    [state] = (Path(env["LOCALGEN_HOME"]) / "cache" / "prompt-states" / "chats").glob("kc.*.state")
    assert state.stat().st_size > 1 << 20
    r = chat({"LOCALGEN_PROMPT_CACHE_MB": "1"}, "--resume", "kc", text="And lakes?\n/stats\n")
    assert "of the history kept ready" not in r.stderr and last_turn(r.stderr)[1] == 0, r.stderr
    assert not state.exists(), "the state past the cap was evicted"


def test_a_damaged_chat_state_is_not_resumed(env: dict[str, str]) -> None:
    """A conversation's saved KV state with flipped bytes is removed, and --resume reads the history again."""
    def chat(*args: str, text: str) -> subprocess.CompletedProcess[str]:
        r = CLI(env)("chat", *args, "-n", "6", "--temperature", "0", "--stats", input=text, timeout=180)
        assert r.returncode == 0, r.stderr
        return r

    chat("kd", text="Name three rivers of Europe and say where each one meets the sea.\n")
    [state] = (Path(env["LOCALGEN_HOME"]) / "cache" / "prompt-states" / "chats").glob("kd.*.state")
    state.write_bytes(damaged(state.read_bytes(), "flipped"))
    r = chat("--resume", "kd", text="And lakes?\n/stats\n")
    assert "of the history kept ready" not in r.stderr and last_turn(r.stderr)[1] == 0, r.stderr
    assert not state.exists(), "the damaged state was removed"


def test_a_chat_state_too_long_for_a_smaller_window_is_kept_for_a_larger_one(env: dict[str, str]) -> None:
    """--resume with a window smaller than the conversation's saved KV state cannot load it, but the state is whole:
    it stays, and --resume with the window that made it restores it (it was removed as if damaged, and the next
    resume read the whole history again)."""
    def chat(*args: str, text: str) -> subprocess.CompletedProcess[str]:  # --stats: a script is told what was kept
        return CLI(env)("chat", *args, "-n", "6", "--temperature", "0", "--stats", input=text, timeout=180)

    page = " ".join((Path(__file__).parents[1] / "docs" / "caches.md").read_text(encoding="utf-8").split())
    assert ("and so does a resume with a window too small for the state, which leaves it for a larger window until a "
            "turn of its own saves a newer one") in page
    rivers = "Tell me about rivers: " + "their springs, their valleys, their bridges and their mills. " * 60
    assert chat("kw", text=f"{rivers}\n").returncode == 0
    [state] = (Path(env["LOCALGEN_HOME"]) / "cache" / "prompt-states" / "chats").glob("kw.*.state")
    r = chat("--resume", "kw", "--ctx", "512", text="")  # looked in, nothing said
    assert r.returncode == 0 and "of the history kept ready" not in r.stderr, r.stderr
    assert state.exists(), "a whole state that this window cannot hold is not removed"
    r = chat("--resume", "kw", text="And lakes?\n")
    assert r.returncode == 0 and "of the history kept ready" in r.stderr, r.stderr


def test_a_resume_into_a_window_the_conversation_outgrew_restores_nothing(env: dict[str, str]) -> None:
    """A short last prompt (its state fits a 512-token window) with a long answer after it: resumed with --ctx 512 the
    oldest turns are left out, so the state's prefix is not what is sent; nothing is restored, and nothing claims it
    (it said "30 tokens of the history kept ready ...: the next message reads again the last answer (600 tokens)")."""
    def chat(*args: str, text: str) -> subprocess.CompletedProcess[str]:
        r = CLI(env)("chat", *args, "--temperature", "0", "--stats", input=text, timeout=180)
        assert r.returncode == 0, r.stderr
        return r

    chat("ko", "-n", "600", "--ignore-eos", text="Tell me about rivers.\n")
    assert list((Path(env["LOCALGEN_HOME"]) / "cache" / "prompt-states" / "chats").glob("ko.*.state"))
    r = chat("--resume", "ko", "--ctx", "512", text="")
    assert "of the history kept ready" not in r.stderr, r.stderr
    r = chat("--resume", "ko", text="")  # the window that made it: the state is whole, and restored
    assert "of the history kept ready" in r.stderr, r.stderr
    r = chat("--resume", "ko", "--ctx", "512", "-n", "4", text="And lakes?\n")
    assert "of the history kept ready" not in r.stderr and "outgrew the 512-token context" in r.stderr, r.stderr
    # a history within the window, but not with the room kept for the answer (-n 300): cut all the same
    chat("kr", "-n", "250", "--ignore-eos", text="Tell me about rivers.\n")
    r = chat("--resume", "kr", "--ctx", "512", "-n", "300", text="")
    assert "of the history kept ready" not in r.stderr, r.stderr


def test_a_chat_s_long_system_prompt_is_a_cached_prefix(env: dict[str, str], tmp_path: Path) -> None:
    """chat, as run: a system prompt past 256 tokens is saved by the first chat that starts with it and loaded by
    the next (the same file: a new save would replace it); --no-prompt-cache neither saves nor loads it, and the
    answers are the same three times."""
    system = doc(tmp_path, "gamma", DOC_LINES).read_text()

    def chat(*args: str) -> subprocess.CompletedProcess[str]:
        r = CLI(env)("chat", *args, "--system", system, "-n", "6", "--temperature", "0", "--stats",
                     input="First mill?\n/stats\n", timeout=180)
        assert r.returncode == 0, r.stderr
        return r

    off = chat("off", "--no-prompt-cache")
    assert states(env) == []
    saved = chat("saved")
    [state] = states(env)
    made = state.stat().st_ino
    hit = chat("hit")
    assert states(env) == [state] and state.stat().st_ino == made, "the third chat loaded the state"
    prompt, cached = last_turn(hit.stdout + "\n" + hit.stderr)
    assert kept_at_least({"cached_tokens": cached, "prompt_tokens": prompt}), (prompt, cached)
    assert last_turn(off.stderr)[1] == last_turn(saved.stderr)[1] == 0, "evaluated for the answer: nothing cached"
    assert off.stdout == saved.stdout == hit.stdout and off.stdout.strip()


def test_a_cap_of_0_evicts_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A cap of 0 turns the cache off: the states saved before stay (docs/configuration.md) until a later cap
    evicts them."""
    from localgen.engine import promptcache

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    root = promptcache.cache_root()
    root.mkdir(parents=True)
    kept = root / f"{0:064x}.{0:064x}.state"
    kept.write_bytes(b"\0" * 1024)
    monkeypatch.setenv(promptcache.CAP_ENV, "0")
    promptcache.evict()
    assert kept.exists()
    monkeypatch.setenv(promptcache.CAP_ENV, "1")
    promptcache.evict()
    assert kept.exists(), "within a cap of 1 MB"
    kept.write_bytes(b"\0" * (2 << 20))
    promptcache.evict()
    assert not kept.exists()


def test_eviction_is_not_upset_by_another_run_evicting_at_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Two runs evicting together: a state the other run removed between this one's listing and its reading of
    the sizes is no longer counted. It was a FileNotFoundError, which attach_prefix took for an unwritable cache:
    the state it had just saved was reported `unwritable`, with a warning, and the eviction stopped short."""
    from localgen.engine import promptcache

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    monkeypatch.setenv(promptcache.CAP_ENV, "2")
    root = promptcache.cache_root()
    root.mkdir(parents=True)
    made = []
    for i in range(4):  # 1 MiB each, the oldest first
        path = root / f"{i:064x}.{i:064x}.state"
        path.write_bytes(b"\0" * (1 << 20))
        os.utime(path, (1000 + i, 1000 + i))
        made.append(path)
    real = Path.rglob

    def listed_then_one_gone(self: Path, pattern: str) -> Iterator[Path]:
        yield from real(self, pattern)
        made[1].unlink()  # the other run's eviction, once this one has listed the files

    monkeypatch.setattr(Path, "rglob", listed_then_one_gone)
    promptcache.evict()
    assert sorted(p.name for p in root.glob("*.state")) == sorted(p.name for p in made[2:])


def test_a_file_where_the_cache_folder_goes_is_said_so(tmp_path: Path) -> None:
    """caches.md's `unwritable`: the warning says why in words a user can act on. A file in the folder's place
    made mkdir's "File exists" (a newcomer's trial could not tell what existed); it now names the file."""
    from localgen.engine.promptcache import _reason

    (tmp_path / "cache").write_text("")
    for target in (tmp_path / "cache", tmp_path / "cache" / "prompt-states"):
        try:
            target.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            assert _reason(e, target) == f"{tmp_path / 'cache'} is a file, where a folder goes"
        else:
            raise AssertionError("mkdir made a folder where a file is")
    full = OSError(28, "No space left on device", str(tmp_path))
    assert _reason(full, tmp_path) == f"{tmp_path}: No space left on device"


def test_a_state_that_fills_its_disk_is_said_to_have_filled_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp's failed write says no cause: the disk is looked at while the part written still fills it (after
    it was removed, the disk looked free again, and `unwritable` never said the disk was full)."""
    import shutil
    from types import SimpleNamespace

    from localgen.engine import kvcache, promptcache

    def save_file(ctx: Any, path: Path, tokens: list[int]) -> bool:  # llama.cpp's write, cut short by a full disk
        Path(path).write_bytes(b"x" * 100)
        return False

    def disk_usage(path: Any) -> Any:  # full while a part written is there
        return SimpleNamespace(free=0 if list(tmp_path.rglob(".*.tmp")) else 10 << 30)

    monkeypatch.setattr(shutil, "disk_usage", disk_usage)
    monkeypatch.setattr(kvcache.context, "save_file", save_file)
    kv = kvcache.KVCache(lambda: None, 512, 512)
    with pytest.raises(OSError) as caught:
        promptcache._save(SimpleNamespace(kv=kv), tmp_path, "stem")  # type: ignore[arg-type]
    assert not [p for p in tmp_path.rglob("*") if p.is_file()], "the part written is removed"
    assert promptcache._reason(caught.value, tmp_path) == f"{tmp_path}: No space left on device"


def test_a_new_link_or_a_chmod_of_the_model_keeps_its_prefixes(env: dict[str, str], smollm2_path: Path,
                                                                 tmp_path: Path) -> None:
    """run.md: the saved state is keyed by the model file's path, size, mtime and a sample of its bytes; a new hard
    link or new permissions are no change (its change time was part of the key: a store that links its files, or
    tests running beside, cost every saved prefix of that model: `saved` where it said `hit`)."""
    import shutil

    model = tmp_path / "copy.gguf"
    shutil.copyfile(smollm2_path, model)
    ask = ["-m", str(model), "-f", str(doc(tmp_path, "linked", DOC_LINES)), "-p", "First mill?"]
    assert run(env, *ask)["prompt_cache"] == "saved"
    os.link(model, tmp_path / "another-name.gguf")
    model.chmod(0o600)
    again = run(env, *ask)
    assert again["prompt_cache"] == "hit" and kept_at_least(again["stats"]), again
    assert len(states(env)) == 1
