"""Words a user reads: a resumed chat says what it kept in plain words (no "KV state"), on the terminal and,
scripted, only with --stats; a model name with a byte that is not UTF-8 is quoted as text, not as Python's
'\\udce8'; a stdout that cannot be written says it was stdout."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pexpect

from tests import terminal
from tests.conftest import CLI, ROOT, SAFETY_NET_S

KEPT = re.compile(r"^([\d,]+) tokens of the history kept ready from the last time: (none of them is read again|the "
                  r"next message reads again the last answer \([\d,]+ tokens\) and at most [\d,]+ tokens before it)$",
                  re.M)


def test_a_resumed_chat_says_what_it_kept_in_plain_words_and_a_script_only_with_stats(
        cli_env: dict[str, str], tmp_path: Path) -> None:
    """chat.md: the notice goes where each answer's footer goes. A script's stderr stays quiet (it said "restored the
    KV state of 76 tokens: the next message evaluates again ..." to every script that resumed); with --stats it
    says the numbers, as on a terminal. A home of its own: no tuning record's line on stderr."""
    env = {**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")}
    cli = CLI(env)
    r = cli("chat", "shown-kv", "-n", "8", "--temp", "0", input="Name three colors of fruit.\n")
    assert r.returncode == 0, r.stderr
    r = cli("chat", "--resume", "shown-kv", "-n", "2", "--temp", "0", input="Thanks.\n")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    r = cli("chat", "--resume", "shown-kv", "-n", "2", "--temp", "0", "--stats", input="Thanks.\n")
    assert r.returncode == 0 and KEPT.search(r.stderr) is not None, r.stderr
    assert "KV" not in r.stderr, r.stderr
    shown = {k: v for k, v in env.items() if k != "NO_COLOR"} | {"TERM": "xterm", "PROMPT_TOOLKIT_NO_CPR": "1"}
    child = terminal.spawn(shown, ["chat", "--resume", "shown-kv", "-n", "2"], timeout=60, dimensions=(40, 250))
    child.expect(r"tokens of the history kept ready from the last time: [^\r\n]*")
    assert "KV" not in str(child.after), child.after
    child.expect_exact(">>>")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_a_model_name_with_a_byte_that_is_not_utf8_is_quoted_as_text(cli: CLI) -> None:
    """A typed name quoted in an error shows such a byte as U+FFFD, as `unknown model 'caf\ufffd'` does (it said
    'o/caf\\udce8', Python's escape for the byte)."""
    for name, said in (("o/caf\udce8", "'o/caf\ufffd' is not a model name: use a catalogue name, owner/repo, "
                                       "owner/repo:QUANT or owner/repo/file.gguf (no '..' or empty parts)"),
                       ("caf\udce8/", "'caf\ufffd/' is not owner/repo")):
        r = cli("run", "-m", name, "-p", "hi", "-n", "2")
        assert r.returncode in (1, 2) and r.stderr == f"localgen: error: {said}\n", r.stderr
        assert r.stdout == "", r.stdout


def test_a_full_stdout_says_it_was_writing_stdout(cli_env: dict[str, str]) -> None:
    """`run > /dev/full` and a scripted chat into it: one line that names stdout, exit 1 (it said only "No space
    left on device", which a user reads as the model store's disk)."""
    for args, text in ((["run", "-p", "hi", "-n", "2"], ""), (["chat", "-n", "2"], "hi\n")):
        with open("/dev/full", "w") as full:
            r = subprocess.run([sys.executable, "-m", "localgen", *args], input=text, stdout=full,
                               stderr=subprocess.PIPE, text=True, env=cli_env, cwd=ROOT, timeout=SAFETY_NET_S)
        assert r.returncode == 1, (args, r.stderr)
        assert r.stderr == "localgen: error: cannot write to stdout: No space left on device\n", (args, r.stderr)
