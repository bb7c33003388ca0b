"""Ctrl-C while a long prompt is read in (docs/chat.md and docs/run.md, Ctrl-C): llama.cpp stops between two of its
operations, not at the end of the piece under way (one piece here: --batch-size 4096 -ub 4096), and the KV cache
keeps only what was read before it, so the next message answers as in a fresh chat.

Where the press lands and how much work follows it are counted in the process's CPU seconds (/proc/PID/stat), not
in time: a busy machine stretches the wall clock, not the work. After the press the work is a take-back and a
prompt; the piece it stopped costs tens of CPU seconds (the old code did it all before it answered the press)."""

from __future__ import annotations

import io
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pexpect
import pytest

from tests import terminal
from tests.conftest import CLI, ROOT, SAFETY_NET_S
from tests.test_chat import PROMPT, send, spawn
from tests.test_chat_attach_back import answering

ONE_PIECE = ["--batch-size", "4096", "-ub", "4096"]
INTO = 0.5  # CPU seconds into the read-in when Ctrl-C is pressed: past rendering and tokenizing (some 0.05 s)


def long_text(path: Path) -> Path:
    """Some 850 tokens (the piece's decode: over 4 CPU seconds on a fast core, some 12 here)."""
    path.write_text("".join(f"Line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(60)))
    return path


def cpu_s(pid: int) -> float:
    """The CPU seconds the process has used, all its threads (utime + stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def piped_cpu_s(env: dict[str, str], args: list[str], *words: str) -> float:
    """The CPU seconds of `localgen ARGS WORDS` run to its end into a pipe (an interpreter of its own)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", "localgen", *args, *words], env=env, cwd=str(ROOT),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=SAFETY_NET_S)
    assert done.returncode == 0, done.stderr
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (now.ru_utime - before.ru_utime) + (now.ru_stime - before.ru_stime)


def press_into_the_work(child: pexpect.spawn, since: float, into: float = INTO) -> float:
    """Ctrl-C once the child has used `into` CPU seconds more than `since`; its CPU seconds at the press."""
    deadline = time.monotonic() + SAFETY_NET_S
    while (used := cpu_s(child.pid)) < since + into:
        assert child.isalive() and time.monotonic() < deadline, "the read-in never began"
        time.sleep(0.01)
    child.sendintr()
    return used


def test_ctrl_c_stops_a_long_read_in_inside_its_piece_and_the_next_message_answers_as_a_fresh_chat(
        cli_env: dict[str, str], tmp_path: Path) -> None:
    """After a first answer, /read and a message: Ctrl-C soon after the read-in begins takes the message back having
    done a small part of the piece's work, and the KV cache holds the first turn alone: sent again, the message is
    read in whole (the old code, which ended the piece first, held all of it) and answered as a fresh chat with the
    same history answers it."""
    big = long_text(tmp_path / "big.txt")
    args = ["-n", "8", "--temperature", "0", *ONE_PIECE, "--no-prompt-cache"]
    home = tmp_path / "home"
    child = spawn({**cli_env, "LOCALGEN_HOME": str(home)}, "readin", *args)
    send(child, "Say hi.", r"tok/s")
    send(child, f"/read {big}", "will be sent with your next message")
    child.sendline("Summarize.")
    answering(child)
    pressed = press_into_the_work(child, cpu_s(child.pid))
    child.expect_exact("the message was taken back")
    child.expect_exact(PROMPT)
    after = cpu_s(child.pid) - pressed
    start = cpu_s(child.pid)
    send(child, "Summarize.", r"tok/s")  # the attachment stayed attached: the message goes as it first went
    resend = cpu_s(child.pid) - start
    child.sendline("/stats")
    child.expect(r"(\d+) prompt tokens(?: \((\d+) cached\))?")
    prompt, cached = int(child.match.group(1)), int(child.match.group(2) or 0)
    child.expect_exact(PROMPT)
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert cached < prompt - 800, (prompt, cached)  # the file is read again: nothing of the stopped piece was kept
    assert after * 4 < resend, (after, resend)  # stopped inside the piece: its work is the resend's
    fresh_home = tmp_path / "fresh"
    fresh = CLI({**cli_env, "LOCALGEN_HOME": str(fresh_home)})("chat", "readin", *args,
                                                               input=f"Say hi.\n/read {big}\nSummarize.\n")
    assert fresh.returncode == 0, fresh.stderr
    saved = json.loads((home / "data" / "chats" / "readin.json").read_text())["messages"]
    expected = json.loads((fresh_home / "data" / "chats" / "readin.json").read_text())["messages"]
    assert [m["role"] for m in saved] == ["user", "assistant", "user", "assistant"], saved
    assert [m["content"] for m in saved] == [m["content"] for m in expected]


RUN_PROMPTS = {
    "the prompt": lambda big: [big.read_text() + "\nSummarize."],
    "a document with -f": lambda big: ["-f", str(big), "Summarize."],  # read in before the answer, as its prefix
}


@pytest.mark.parametrize("prompt", RUN_PROMPTS)
def test_ctrl_c_stops_runs_long_read_in_inside_its_piece(cli_env: dict[str, str], tmp_path: Path,
                                                          prompt: str) -> None:
    """`run` with a long prompt: Ctrl-C soon after the read-in begins ends it (`interrupted`, 130) having done a
    small part of the piece's work, where the old code finished the piece first. The work is measured against the
    same run piped to its end and a one-word run (the load and exit)."""
    big = long_text(tmp_path / "big.txt")
    env = {**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")}
    args = ["run", "-n", "1", "--temperature", "0", *ONE_PIECE, "--no-prompt-cache"]

    base = piped_cpu_s(env, args, "Hi.")
    whole = piped_cpu_s(env, args, *RUN_PROMPTS[prompt](big))
    assert whole > base + 4 * INTO, (base, whole)  # the read-in is long beside the point of the press
    child = terminal.spawn({**env, "TERM": "xterm"}, [*args, *RUN_PROMPTS[prompt](big)], timeout=SAFETY_NET_S)
    child.logfile_read = log = io.StringIO()
    pressed = press_into_the_work(child, 0.0, base + INTO)
    child.expect_exact("interrupted")
    after = cpu_s(child.pid) - pressed
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 130, log.getvalue()
    assert "Traceback" not in log.getvalue() and not re.search(r"Exception ignored", log.getvalue()), log.getvalue()
    assert after * 4 < whole - pressed, (after, whole, pressed)


def test_ctrl_c_stops_a_files_batched_read_in_inside_its_step(cli_env: dict[str, str], tmp_path: Path) -> None:
    """`run --file` reads its prompts in batched steps (continuous batching): Ctrl-C soon after the first step
    begins ends the run (`interrupted`, 130) having done a small part of the step's work, where the old code
    finished the step first (seconds of a busy machine's time, for two long prompts)."""
    text = long_text(tmp_path / "big.txt").read_text().replace("\n", " ")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(f"{text} Summarize.\n{text} Say it again.\n")
    env = {**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")}
    args = ["run", "-n", "1", "--temperature", "0", *ONE_PIECE, "--no-prompt-cache"]

    base = piped_cpu_s(env, args, "Hi.")
    whole = piped_cpu_s(env, args, "--file", str(prompts), "-np", "2")
    assert whole > base + 4 * INTO, (base, whole)
    child = terminal.spawn({**env, "TERM": "xterm"}, [*args, "--file", str(prompts), "-np", "2"],
                           timeout=SAFETY_NET_S)
    child.logfile_read = log = io.StringIO()
    pressed = press_into_the_work(child, 0.0, base + INTO)
    child.expect_exact("interrupted")
    after = cpu_s(child.pid) - pressed
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 130, log.getvalue()
    assert "Traceback" not in log.getvalue() and not re.search(r"Exception ignored", log.getvalue()), log.getvalue()
    assert after * 4 < whole - pressed, (after, whole, pressed)


def test_first_ctrl_c_stops_a_first_turns_long_system_prompt_read_and_nothing_of_it_is_kept(
        cli_env: dict[str, str], tmp_path: Path) -> None:
    """`chat --system LONG`: the system prompt is read in with the first message, as the prompt cache's prefix, where
    the old code answered the first press only once all of it was read (and saved to the prompt cache). One press
    soon after the read-in begins takes the message back, and the one piece it stopped leaves no state: nothing is
    saved to the prompt cache, and the message sent again reads the system prompt again (the old code held it)."""
    big = long_text(tmp_path / "big.txt")
    home = tmp_path / "home"
    child = spawn({**cli_env, "LOCALGEN_HOME": str(home)}, "sysread", "-n", "8", "--temperature", "0", *ONE_PIECE,
                  "--system", big.read_text())
    child.sendline("Summarize.")
    answering(child)
    press_into_the_work(child, cpu_s(child.pid))
    child.expect_exact("the message was taken back")
    child.expect_exact(PROMPT)
    states = home / "cache" / "prompt-states"
    assert not (states.exists() and any(states.iterdir())), list(states.iterdir())  # no part of it was kept
    send(child, "Summarize.", r"tok/s")
    child.sendline("/stats")
    child.expect(r"(\d+) prompt tokens(?: \((\d+) cached\))?")
    prompt, cached = int(child.match.group(1)), int(child.match.group(2) or 0)
    child.expect_exact(PROMPT)
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert cached < prompt - 800, (prompt, cached)  # the system prompt was read again, whole
    assert states.exists() and len(list(states.iterdir())) >= 1  # ... and, read to its end, kept
    saved = json.loads((home / "data" / "chats" / "sysread.json").read_text())
    assert [m["role"] for m in saved["messages"]] == ["user", "assistant"], saved
    assert saved["messages"][0]["content"] == "Summarize.", saved


def test_a_cancelled_speculative_generation_reads_in_nothing_more_and_says_nothing(smollm2_engine: Any,
                                                                                  smollm2_path: Path) -> None:
    """`--draft`: the Generation's cancel() (a chat's first Ctrl-C) reaches both models' read-in. Cancelled before
    its first piece, neither the model nor the draft model reads the prompt, and no token is said (the old code read
    the prompt with both and said the first token)."""
    from localgen.engine.llama import Engine
    from localgen.engine.speculative import ModelDrafter
    from localgen.models.resolve import resolve
    from localgen.native.prompt import Prompt
    from localgen.types import LoadParams, SamplingParams

    eng: Any = smollm2_engine
    drafter = ModelDrafter(eng, Engine(resolve(str(smollm2_path)), LoadParams(n_ctx=2048)))
    try:
        eng.kv.clear()
        prompt = Prompt.text(eng.chat_tokens([{"role": "user", "content": "Name three colours."}]))
        gen = eng.generate(prompt, SamplingParams(temperature=0, max_tokens=8), drafter=drafter)
        gen.cancel()
        assert list(gen) == [] and gen.finish_reason == "cancelled"
        assert eng.kv.held == [] and drafter.engine.kv.held == []
        gen = eng.generate(prompt, SamplingParams(temperature=0, max_tokens=8), drafter=drafter)
        assert "".join(c.text for c in gen) and gen.finish_reason in ("length", "eos")  # the next one answers
    finally:
        drafter.close()
        eng.kv.clear()
