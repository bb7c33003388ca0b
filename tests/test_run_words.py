"""What `run` says when something is wrong, as a newcomer meets it (newcomer2's trial): a failed line of --file on
stderr with --json too, a prompt past the trained context without advice to raise --ctx, LOCALGEN_CTX named
rather than a flag never typed, the pull command in the name the README teaches, a model name in the wrong case,
and `localgen chat` for one who typed `localgen run` at a terminal to talk."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

from tests.conftest import CLI, ROOT, InProcessCLI

UNKNOWN_CTX = "takes 0 (the model's trained context) or 16 tokens or more, not 10"


def test_a_failed_line_of_run_file_is_one_error_line_on_stderr_with_json_too(cli: CLI, tmp_path: Path) -> None:
    """README: every error is one line `localgen: error: ...` on stderr. With --json the failed line was only an
    "error" in stdout's JSONL, so `run --file X --json > out.jsonl` failed (exit 1) with nothing on the terminal;
    without --json it read `localgen: line 2: ...`, without `error:`. stdout's JSON lines are as they were."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Name a color."}\n{not json\n{"prompt": "hi", "temperature": -1}\n')
    want = ["localgen: error: line 2: bad JSON line: Expecting property name enclosed in double quotes: line 1 "
            "column 2 (char 1)",
            "localgen: error: line 3: temperature must be within 0 to 5, not -1.0"]
    r = cli("run", "-m", "smollm2:135m", "--file", str(prompts), "--json", "-n", "2", "--temperature", "0")
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines() == want, r.stderr
    out = [json.loads(line) for line in r.stdout.splitlines()]
    assert [o["line"] for o in out] == [1, 2, 3] and out[0]["text"], r.stdout
    assert out[1] == {"line": 2, "error": want[0].split("line 2: ", 1)[1]}, out
    assert out[2] == {"line": 3, "error": "temperature must be within 0 to 5, not -1.0"}, out
    r = cli("run", "-m", "smollm2:135m", "--file", str(prompts), "-n", "2", "--temperature", "0")
    assert r.returncode == 1 and r.stderr.splitlines() == want, r.stderr
    assert r.stdout.splitlines()[1:] == ["", ""] and r.stdout.splitlines()[0].strip(), r.stdout


def test_a_system_prompt_past_the_trained_context_is_not_told_to_raise_ctx(cli: CLI) -> None:
    """SmolLM2 was trained on 8,192 tokens, where the load caps any --ctx: a prompt of more with its system prompt
    was told "or raise --ctx", which only led to a second error. A shorter one still is."""
    r = cli("run", "-m", "smollm2:135m", "--system", "word " * 9000, "-p", "hi", "-n", "2")
    assert r.returncode == 1 and r.stdout == "", r.stderr
    assert r.stderr.count("\n") == 1 and "raise --ctx" not in r.stderr, r.stderr
    assert r.stderr.endswith("(shorten the system prompt or the prompt: this prompt is longer than the 8,192 tokens "
                             "the model was trained on, past which --ctx does not go)\n"), r.stderr
    r = cli("run", "-m", "smollm2:135m", "--system", "word " * 5000, "-p", "hi", "-n", "2")
    assert r.returncode == 1 and r.stderr.endswith("(shorten the system prompt or the prompt, or raise --ctx)\n"), \
        r.stderr


def test_localgen_ctx_is_named_in_its_error_not_the_flag(cli_in_process: InProcessCLI) -> None:
    """`LOCALGEN_CTX=10 localgen run` said `--ctx takes ...`, a flag never typed (LOCALGEN_PORT=0 already named
    the variable). A typed --ctx is still named as the flag, even with the variable set."""
    env = InProcessCLI({**cli_in_process.env, "LOCALGEN_CTX": "10"})
    for command in (["run", "-p", "hi"], ["chat"], ["serve", "--port", "65000"]):
        r = env(*command, "-m", "smollm2:135m")
        assert (r.returncode, r.stdout) == (2, ""), (command, r)
        assert r.stderr == f"localgen: error: LOCALGEN_CTX {UNKNOWN_CTX}\n", (command, r.stderr)
    r = env("run", "-m", "smollm2:135m", "-p", "hi", "--ctx", "10")
    assert r.returncode == 2 and r.stderr == f"localgen: error: --ctx {UNKNOWN_CTX}\n", r.stderr


def test_a_catalogue_model_not_here_is_pulled_by_the_name_the_readme_teaches(cli_in_process: InProcessCLI) -> None:
    """`show qwen2.5:7b` said `(localgen pull qwen2.5:7b@Q4_K_M)`, a spelling the README never shows: at the
    entry's default quantization the command is `localgen pull qwen2.5:7b`; another keeps its @QUANT."""
    online = InProcessCLI({**cli_in_process.env, "HF_HUB_OFFLINE": None})
    r = online("show", "qwen2.5:7b")
    assert r.returncode == 1 and r.stderr == ("localgen: error: qwen2.5:7b@Q4_K_M is not downloaded "
                                              "(localgen pull qwen2.5:7b)\n"), r.stderr
    r = online("show", "qwen2.5:7b@Q8_0")
    assert r.returncode == 1 and r.stderr.endswith("(localgen pull qwen2.5:7b@Q8_0)\n"), r.stderr
    r = cli_in_process("doctor", "-m", "qwen2.5:7b")
    assert r.returncode == 1 and r.stderr == ("localgen: error: qwen2.5:7b is not downloaded (doctor downloads "
                                              "nothing: `localgen pull qwen2.5:7b` first)\n"), r.stderr


def test_a_model_name_in_the_wrong_case_is_suggested(cli_in_process: InProcessCLI) -> None:
    """`-m SmolLM2:135M` had no suggestion (names are matched as written, unlike Ollama's); the suggestions of a
    family read `?;` before the rest of the hint."""
    r = cli_in_process("run", "-m", "SmolLM2:135M", "-p", "hi")
    assert r.returncode == 1 and r.stdout == "", r
    assert r.stderr == "localgen: error: unknown model 'SmolLM2:135M' (did you mean smollm2:135m?)\n", r.stderr
    r = cli_in_process("run", "-m", "smollm2:7b", "-p", "hi")
    assert r.returncode == 1 and "?;" not in r.stderr, r.stderr
    assert r.stderr.startswith("localgen: error: unknown model 'smollm2:7b' (did you mean smollm2:135m"), r.stderr
    assert r.stderr.endswith("? Or give owner/repo or a .gguf path)\n") and " or smollm2:" in r.stderr, r.stderr


def test_the_suggestion_for_a_name_in_the_wrong_case_keeps_its_quant(cli_in_process: InProcessCLI) -> None:
    """`-m SmolLM2:1.7B@Q8_0` suggested smollm2:1.7b, without the @Q8_0 (run as told, that is Q4_K_M); `pull`'s
    the same. An embedded model's own tag is kept too; another tag of one is said to be none of its."""
    for args in (["run", "-m", "SmolLM2:1.7B@q8_0", "-p", "hi"], ["pull", "SmolLM2:1.7B@Q8_0"]):
        r = cli_in_process(*args)
        assert (r.returncode, r.stdout) == (1, ""), (args, r)
        assert r.stderr == "localgen: error: unknown model 'SmolLM2:1.7B' (did you mean smollm2:1.7b@Q8_0?)\n", r.stderr
    r = cli_in_process("run", "-m", "SmolLM2:135M@q4_1", "-p", "hi")
    assert r.returncode == 1 and r.stderr == ("localgen: error: unknown model 'SmolLM2:135M' (did you mean "
                                              "smollm2:135m@Q4_1?)\n"), r.stderr
    r = cli_in_process("run", "-m", "SmolLM2:135M@Q8_0", "-p", "hi")
    assert r.returncode == 1 and r.stderr == ("localgen: error: unknown model 'SmolLM2:135M' (did you mean "
                                              "smollm2:135m? It ships only as Q4_1)\n"), r.stderr


def test_run_with_no_prompt_at_a_terminal_points_to_chat(cli_env: dict[str, str]) -> None:
    """An Ollama user types `localgen run` at a terminal to talk: the error says where that is. Piped (nothing on
    stdin), it is the same error without that hint."""
    controller, terminal = pty.openpty()
    try:
        p = subprocess.run([sys.executable, "-m", "localgen", "run", "-m", "smollm2:135m"], stdin=terminal,
                           capture_output=True, text=True, env=cli_env, cwd=ROOT, timeout=300)
    finally:
        os.close(terminal)
        os.close(controller)
    said = "localgen: error: no prompt: give it as an argument or with -p, or pipe text on stdin"
    assert p.returncode == 2 and p.stdout == "", p
    assert p.stderr == f"{said} (to talk with the model turn by turn: localgen chat)\n", p.stderr
    p = subprocess.run([sys.executable, "-m", "localgen", "run", "-m", "smollm2:135m"], stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, env=cli_env, cwd=ROOT, timeout=300)
    assert p.returncode == 2 and p.stderr == f"{said}\n", p.stderr


def test_a_prompt_past_the_trained_context_is_not_told_to_raise_ctx(cli: CLI) -> None:
    """troubleshooting.md: a prompt longer than the 8,192 tokens SmolLM2 was trained on was told "raise --ctx" at
    the default window of 4,096; raised, it met a second error, that no --ctx goes past 8,192. The first error says
    so at once; a prompt a larger --ctx would hold is still told to raise it."""
    r = cli("run", "-m", "smollm2:135m", "-p", "Sum it up.", "-n", "2", input="word " * 9000)
    assert r.returncode == 1 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert "raise --ctx" not in r.stderr and r.stderr.endswith(
        "; the context window is 4,096 (shorten the prompt: it is longer than the 8,192 tokens this model was trained "
        "on, past which --ctx does not go; --rope-scaling linear with a larger --ctx stretches the window, at some "
        "cost in quality)\n"), \
        r.stderr
    r = cli("run", "-m", "smollm2:135m", "-p", "Sum it up.", "-n", "2", input="word " * 5000)
    assert r.returncode == 1 and r.stderr.endswith(
        "; the context window is 4,096 (shorten the prompt or raise --ctx; this model was trained on up to 8,192)\n"), \
        r.stderr
