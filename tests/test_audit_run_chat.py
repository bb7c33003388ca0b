"""What an audit of docs/run.md, chat.md, exactness.md and doctor.md found the program or the page getting
wrong, each held here: a repeated -p, where the sampling defaults come from, doctor's words for a model not
downloaded and for -m with --no-check, chat's piped answers, --no-prompt-cache with --resume, and the
smaller ones."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from localgen.settings import FLOAT, INT, KNOBS
from tests.conftest import CLI, InProcessCLI

ROOT = Path(__file__).resolve().parent.parent


def test_a_repeated_prompt_flag_is_a_usage_error(cli_in_process: InProcessCLI) -> None:
    """run.md: `-p/--prompt` (give it once). A second -p used to win quietly over the first."""
    r = cli_in_process("run", "-p", "alpha", "-p", "beta", "-n", "1")
    assert r.returncode == 2 and r.stdout == "", r
    assert r.stderr.strip() == "localgen: error: give -p/--prompt once (it was given 2 times)", r.stderr


def _sampling_rows() -> list[tuple[set[str], str]]:
    """run.md's option rows that name a numeric sampling setting: their flags and default cell."""
    text = (ROOT / "docs" / "run.md").read_text()
    rows = []
    for line in text.split("| option | default | meaning |", 1)[1].splitlines()[2:]:
        if not line.startswith("|"):
            break
        first, default = line.split(" | ")[:2]
        rows.append((set(re.findall(r"--?[a-z][a-z-]*", first)), default))
    return rows


def test_run_page_and_help_say_the_model_s_sampling_comes_first(cli_in_process: InProcessCLI,
                                                                 cli: CLI) -> None:
    """run.md's table and `run --help-all` give a sampling setting's default as "the model's, else X", X the
    settings table's; and it is so: the default smollm2:135m samples with its catalogue's temperature 0.2 and
    top-p 0.9 until a flag says otherwise."""
    numeric = [k for k in KNOBS.values() if k.kind in (INT, FLOAT) and k.default is not None]
    rows = _sampling_rows()
    for k in numeric:
        cell = next((d for flags, d in rows if set(k.cli) & flags), None)
        assert cell is not None and cell.startswith("the model's, else "), (k.name, cell)
    temperature = next(d for flags, d in rows if "--temperature" in flags)
    assert temperature == f"the model's, else {KNOBS['temperature'].default}"
    cli_in_process.env["COLUMNS"] = "200"
    words = " ".join(cli_in_process("run", "--help-all").stdout.replace("│", " ").split())
    for k in numeric:
        assert f"[default: (the model's, else {k.default})]" in words, k.name
    plain = json.loads(cli("run", "-p", "hi", "-n", "1", "--json").stdout)["sampling"]
    assert (plain["temperature"], plain["top_p"]) == (0.2, 0.9), plain  # models.toml's smollm2:135m
    given = json.loads(cli("run", "-p", "hi", "-n", "1", "--json", "--temperature", "0.8",
                           "--top-p", "0.95").stdout)["sampling"]
    assert (given["temperature"], given["top_p"]) == (0.8, 0.95), given


def test_doctor_says_a_model_is_not_downloaded_and_how_to_get_it(cli_in_process: InProcessCLI) -> None:
    """doctor.md: doctor downloads nothing; a model not here is one error (exit 1) saying to pull it, never
    "offline" (a flag the user did not give)."""
    r = cli_in_process("doctor", "-m", "qwen2.5:7b")
    assert r.returncode == 1 and r.stdout == "", r
    assert r.stderr.strip() == ("localgen: error: qwen2.5:7b is not downloaded (doctor downloads nothing: "
                                "`localgen pull qwen2.5:7b` first)"), r.stderr
    assert "offline" not in r.stderr


def test_doctor_says_plainly_why_m_needs_the_check(cli_in_process: InProcessCLI) -> None:
    """doctor.md: -m or a placement flag with --no-check is a usage error; its line is a sentence."""
    r = cli_in_process("doctor", "-m", "gemma3:270m", "--no-check")
    assert r.returncode == 2 and r.stderr.strip() == (
        "localgen: error: -m says what --check loads; it means nothing with --no-check"), r.stderr
    r = cli_in_process("doctor", "-m", "gemma3:270m", "-ngl", "1", "--no-check")
    assert r.returncode == 2 and r.stderr.strip() == (
        "localgen: error: -m, --gpu-layers say what --check loads; they mean nothing with --no-check"), r.stderr


def test_many_prompts_stats_say_the_batching_mode_and_why(cli: CLI, tmp_path: Path) -> None:
    """exactness.md: `run --file --stats` says which mode runs, and why (engine/batchmode.py's reason)."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Say hi"}\n{"prompt": "Say yo", "temperature": 0.7}\n{"prompt": "Count"}\n')
    for flag, mode in (("--exact", "exact"), ("--no-exact", "throughput")):
        r = cli("run", "--file", str(prompts), "--parallel", "8", "--stats", "-n", "3", flag)
        assert r.returncode == 0, r.stderr
        stats = r.stderr.strip().splitlines()[-1]
        assert f"· {mode} batching" in stats and f" · why: {flag}: " in stats, stats
    r = cli("run", "--file", str(prompts), "--parallel", "8", "--stats", "-n", "3")
    why = r.stderr.strip().splitlines()[-1].split(" · why: ")[1]
    assert why.startswith(("greedy answers identical", "every request batched; exactness would cost")), why


def test_a_piped_chat_ends_every_answer_with_a_line_break_even_an_empty_one(cli: CLI) -> None:
    """chat.md: piped, stdout carries each answer, each ending with a line break; an empty one (-n 0) too."""
    r = cli("chat", "-n", "0", input="hi\nhello\n")
    assert r.returncode == 0 and r.stdout == "\n\n", r


def test_no_prompt_cache_neither_reads_nor_writes_a_chat_s_kv_state(cli: CLI, home: Path) -> None:
    """chat.md: with --no-prompt-cache no saved KV state is read (--resume re-reads the history) or written."""
    states = home / "cache" / "prompt-states" / "chats"

    def saved(name: str) -> list[Path]:
        return sorted(states.glob(f"{name}.*")) if states.is_dir() else []

    assert cli("chat", "kv-none", "-n", "4", "--temp", "0", "--no-prompt-cache", input="Hi.\n").returncode == 0
    assert saved("kv-none") == []
    assert cli("chat", "kv-kept", "-n", "4", "--temp", "0", input="My name is Ada.\n").returncode == 0
    assert len(saved("kv-kept")) == 1
    r = cli("chat", "--resume", "kv-kept", "-n", "2", "--no-prompt-cache", "--stats", input="/show\n")
    assert r.returncode == 0 and "of the history kept ready" not in r.stderr, r.stderr
    r = cli("chat", "--resume", "kv-kept", "-n", "2", "--stats", input="/show\n")
    assert "of the history kept ready" in r.stderr, r.stderr  # it was there to be read


def test_flags_given_at_chat_start_are_not_saved_with_it(cli: CLI, home: Path) -> None:
    """chat.md and tutorial.md: a chat saves its /set values, not the flags it was started with."""
    for page in ("chat.md", "tutorial.md"):
        words = " ".join((ROOT / "docs" / page).read_text().split())
        assert "Flags given when the chat started" in words or "flags given when the chat started are not kept" \
            in words, page
    r = cli("chat", "flags-unsaved", "-n", "4", "--temperature", "0", input="/set top_k 7\nHi.\n")
    assert r.returncode == 0, r.stderr
    saved = json.loads((home / "data" / "chats" / "flags-unsaved.json").read_text())
    assert saved["settings"] == {"top_k": 7}, saved["settings"]


def test_the_footer_and_context_command_each_say_what_they_count(cli: CLI) -> None:
    """chat.md: the footer's context figure is the window as the answer ended; /context counts the conversation
    as the next prompt sends it, a few tokens more (the template closes the answer's turn and opens the next)."""
    r = cli("chat", "-n", "4", "--temp", "0", "--stats", input="Hi.\n/context\n")
    assert r.returncode == 0, r.stderr
    footer = int(re.search(r"· context (\d+)/4,096", r.stderr)[1])  # type: ignore[index]
    line = next(x for x in r.stderr.splitlines() if "tokens used" in x)
    counted = int(line.split(" of ")[0])
    assert 0 < counted - footer <= 8, (footer, line)
    assert "as the next prompt sends the conversation (the footer's figure: as the last answer ended" in line, line
    words = " ".join((ROOT / "docs" / "chat.md").read_text().split())
    assert f"`context {footer}/4,096` in the footer, `{counted} of 4,096 tokens used` from `/context`" in words


def test_a_logit_bias_outside_the_vocabulary_is_a_usage_error(cli: CLI, tmp_path: Path) -> None:
    """A token id the model's vocabulary lacks used to be dropped without a word; it is refused, naming the
    vocabulary's size (smollm2:135m: 49,152 tokens), on a line of its own with --file."""
    r = cli("run", "-p", "hi", "-n", "2", "--logit-bias", "99999999+1")
    assert r.returncode == 2 and r.stdout == "", r
    assert r.stderr.strip() == ("localgen: error: logit bias on token 99999999: this model's vocabulary has 49,152 "
                                "tokens (0 to 49,151)"), r.stderr
    assert cli("run", "-p", "hi", "-n", "1", "--logit-bias", "49151+1").returncode == 0  # the last id is in it
    lines = tmp_path / "bias.jsonl"
    lines.write_text('{"prompt": "a", "logit_bias": {"49152": 1}}\n{"prompt": "b"}\n')
    r = cli("run", "--file", str(lines), "-n", "2")
    assert r.returncode == 1 and ("localgen: error: line 1: logit bias on token 49152: this model's vocabulary has "
                                  "49,152") in r.stderr, r.stderr


@pytest.mark.parametrize("unbuffered", [True, False], ids=["PYTHONUNBUFFERED=1", "buffered"])
@pytest.mark.parametrize("args", [["run", "-p", "hi", "-n", "3"], ["list"]], ids=["run", "list"])
def test_a_full_stdout_is_one_error_line_as_the_page_shows(cli_env: dict[str, str], args: list[str],
                                                           unbuffered: bool) -> None:
    """run.md: a disk problem is one line; stdout, which has no path to name, is named as stdout. Also where
    stdout is buffered, as a shell starts it (the text the failed write kept made Python's flush at exit print a
    traceback and exit 120)."""
    import subprocess
    import sys

    env = cli_env if unbuffered else {k: v for k, v in cli_env.items() if k != "PYTHONUNBUFFERED"}
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "localgen", *args], stdout=full,
                           stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 1 and r.stderr == "localgen: error: cannot write to stdout: No space left on device\n", \
        r.stderr  # it said the reason alone, as if no write of the answer's had failed
    words = " ".join((ROOT / "docs" / "run.md").read_text().split())
    assert "as `run > /dev/full`: `localgen: error: cannot write to stdout: No space left on device`" in words


def test_a_json_line_with_a_value_out_of_range_is_not_called_bad_json(cli: CLI) -> None:
    """A valid JSON line whose setting is out of range says so, as `line N: ...`; only a line that does not
    parse is "bad JSON"."""
    r = cli("run", "--each-line", "-n", "1", input='{"prompt": "x", "top_p": 2}\n{"prompt": 5}\n{bad\n')
    assert r.returncode == 1
    errors = [x for x in r.stderr.splitlines() if x.startswith("localgen: error: line")]
    assert errors[0] == "localgen: error: line 1: top_p must be within 0 to 1, not 2.0", errors
    assert errors[1] == 'localgen: error: line 2: a JSON line needs a "prompt" string', errors
    assert errors[2].startswith("localgen: error: line 3: bad JSON line: Expecting property name"), errors


def test_chat_list_counts_one_turn_in_the_singular(cli: CLI) -> None:
    assert cli("chat", "one-turn-only", "-n", "2", input="Hi.\n").returncode == 0
    row = next(x for x in cli("chat", "-l").stdout.splitlines() if x.startswith("one-turn-only "))
    assert "  1 turn  " in row and "turns" not in row, row


def test_the_chat_page_says_save_overwrites_only_when_asked(cli: CLI) -> None:
    """chat.md: /save onto another conversation asks on a terminal (and may overwrite) and refuses scripted."""
    words = " ".join((ROOT / "docs" / "chat.md").read_text().split())
    assert "never overwrites" not in words
    assert "another conversation of that name is overwritten only if you say so" in words
    assert cli("chat", "save-target", "-n", "1", input="Hi.\n").returncode == 0
    r = cli("chat", "save-other", "-n", "1", input="Hello.\n/save save-target\n")
    assert r.returncode == 2 and "'save-target' exists; /save does not overwrite it" in r.stderr, r
