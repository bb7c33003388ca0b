"""Text a model or a user wrote (saved prompts and answers, a chat's saved file, an answer as it streams) shown on a
terminal: a control character shows escaped (`\\x1b`), never acts on the terminal (a window title set, the
clipboard written by OSC 52); into a pipe the same text goes byte for byte (docs/logs.md, docs/chat.md, docs/run.md).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pexpect
import pytest

from tests import terminal
from tests.conftest import CLI

TITLE = "\x1b]0;pwned\x07"  # the trial's title-setting OSC


@pytest.fixture
def tcli(cli_env: dict[str, str], tmp_path: Path) -> CLI:
    return CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")})


def on_terminal(tcli: CLI, *args: str) -> tuple[str, int]:
    """`localgen ARGS` on a pseudo-terminal: all it wrote there, and its exit status."""
    env = dict(tcli.env)
    env["TERM"] = "xterm"
    child = terminal.spawn(env, list(args), timeout=60, dimensions=(40, 200))
    child.expect(pexpect.EOF)
    shown = str(child.before)
    child.close()
    return shown, int(child.exitstatus or 0)


def test_a_saved_prompts_escape_reaches_logs_on_a_terminal_escaped_and_a_pipe_unchanged(tcli: CLI) -> None:
    r = tcli("run", "-p", f"{TITLE} hello", "-n", "3", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    shown, rc = on_terminal(tcli, "logs", "-q", "pwned", "-n", "1")
    assert rc == 0
    assert "\x1b]0;pwned" not in shown and "\x07" not in shown, "the OSC reached the terminal"
    assert "\\x1b]0;pwned\\x07 hello" in shown
    piped = tcli("logs", "-q", "pwned", "-n", "1")
    assert f"{TITLE} hello" in piped.stdout, "into a pipe the saved prompt goes byte for byte"
    as_json, _ = on_terminal(tcli, "logs", "-q", "pwned", "-n", "1", "--json")
    assert "\x1b" not in as_json and json.loads(as_json.replace("\r\n", "\n"))[0]["prompt"] == f"{TITLE} hello"


def test_chat_list_shows_a_saved_messages_escape_escaped_on_a_terminal(tcli: CLI) -> None:
    r = tcli("chat", "-n", "3", "--temperature", "0", input=f"{TITLE}hi \x9b31m\n")
    assert r.returncode == 0, r.stderr
    shown, rc = on_terminal(tcli, "chat", "-l")
    assert rc == 0 and "\x1b]0;" not in shown and "\x9b" not in shown
    assert "\\x1b]0;pwned\\x07hi \\u009b31m" in shown
    assert TITLE in tcli("chat", "-l").stdout, "piped, the list is as saved"


def _forced(tcli: CLI, *, pipe: bool) -> Any:
    """run whose answer a grammar makes begin with the title-setting OSC."""
    args = ["run", "-p", "Say hi.", "-n", "12", "--temperature", "0", "--grammar", r'root ::= "\x1b]0;model\x07" "ok"']
    return tcli(*args) if pipe else on_terminal(tcli, *args)


def test_runs_answer_on_a_terminal_shows_a_models_escape_escaped_and_piped_keeps_it(tcli: CLI) -> None:
    shown, rc = _forced(tcli, pipe=False)
    assert rc == 0 and "\x1b]0;model" not in shown and "\\x1b]0;model\\x07ok" in shown
    assert _forced(tcli, pipe=True).stdout == "\x1b]0;model\x07ok\n"


def test_a_chats_answer_and_show_on_a_terminal_show_escapes_escaped_and_save_them_as_said(tcli: CLI) -> None:
    env = {**tcli.env, "TERM": "xterm", "PROMPT_TOOLKIT_NO_CPR": "1"}
    env.pop("NO_COLOR", None)
    child = terminal.spawn(env, ["chat", "osc", "-n", "12", "--temperature", "0", "--system", "\x1b]0;sys\x07Be brief.",
                                 "--grammar",
                                 r'root ::= "\x1b]0;model\x07" "ok"'], timeout=60, dimensions=(40, 120))
    child.logfile_read = seen = io.StringIO()
    child.expect("ready in")
    child.expect_exact(">>>")
    child.sendline("Say hi.")
    child.expect_exact("\\x1b]0;model\\x07ok")
    child.expect_exact(">>>")
    child.sendline("/show")
    child.expect_exact("system: \\x1b]0;sys\\x07Be brief.")
    child.expect_exact(">>>")
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert "\x1b]0;" not in seen.getvalue(), "the model's or the system prompt's OSC reached the terminal"
    saved = json.loads((Path(tcli.env["LOCALGEN_HOME"]) / "data" / "chats" / "osc.json").read_text())
    assert saved["messages"][-1]["content"] == "\x1b]0;model\x07ok", "what is saved is what the model said"


def test_many_prompts_answers_on_a_terminal_show_a_models_escape_escaped_and_piped_keep_it(tcli: CLI,
                                                                                           tmp_path: Path) -> None:
    """run --file and --each-line write each answer as run's one answer is written: on a terminal a model's OSC
    shows escaped (it set the pane's title), into a pipe byte for byte; --json's line too (a C1 character is no
    JSON escape)."""
    prompts = tmp_path / "one.txt"
    prompts.write_text("Say hi.\n")
    for extra, grammar, seen in (([], r'root ::= "\x1b]0;model\x07" "ok"', "\\x1b]0;model\\x07ok"),
                                 (["--json"], r'root ::= "\u009b31m" "ok"', "\\u009b31mok")):
        args = ["run", "--file", str(prompts), "-n", "12", "--temperature", "0", "--grammar", grammar, *extra]
        shown, rc = on_terminal(tcli, *args)
        assert rc == 0 and "\x1b]0;model" not in shown and "\x9b" not in shown and seen in shown, shown
        piped = tcli(*args)
        assert piped.returncode == 0, piped.stderr
        assert seen not in piped.stdout and ("\x1b]0;model\x07ok" in piped.stdout or "\x9b31mok" in piped.stdout)


def test_html_looking_text_and_emoji_codes_show_on_a_terminal_as_written(tcli: CLI) -> None:
    """chat.md: on a terminal an answer's text that looks like HTML shows as written, as the chat page shows it
    (Rich's Markdown dropped it: `List<String>` showed as `List`, a `<div>x</div>` line not at all), and `:x:` in an
    error or a notice shows as typed (Rich's emoji codes made `unknown model 'qwen❌latest'`)."""
    shown, rc = on_terminal(tcli, "run", "-m", "qwen:x:latest", "hi")
    assert rc == 1 and "unknown model 'qwen:x:latest'" in shown and "\u274c" not in shown, shown
    env = {**tcli.env, "TERM": "xterm", "PROMPT_TOOLKIT_NO_CPR": "1"}
    env.pop("NO_COLOR", None)
    screen = terminal.Screen((40, 120))
    child = terminal.spawn(env, ["chat", "html", "-n", "24", "--temperature", "0", "--system", "Be :x: brief.",
                                 "--grammar", r'root ::= "<div>x</div>\n\nUse List<String> here."'],
                           timeout=60, dimensions=(40, 120))
    child.logfile_read = screen
    child.expect("ready in")
    child.expect_exact(">>>")
    child.sendline("Say hi.")
    child.expect_exact("tok/s")
    child.expect_exact(">>>")
    child.sendline("/show")
    child.expect_exact("system: Be :x: brief.")
    child.expect_exact(">>>")
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    rows = screen.rows()
    assert "<div>x</div>" in rows and "Use List<String> here." in rows, "\n".join(rows)
    assert not any("\u274c" in row for row in rows), "\n".join(rows)


# fit.md, models.md: a header's text shows every bidi control escaped on a terminal; U+061C (the Arabic letter mark,
# one of Unicode's Bidi_Control characters) went through as it was
@pytest.mark.parametrize("mark", ["\u061c", "\u200e", "\u200f", "\u202a", "\u202e", "\u2066", "\u2069"])
def test_a_headers_bidi_controls_are_each_escaped_on_a_terminal(monkeypatch: pytest.MonkeyPatch, mark: str) -> None:
    from localgen.cli import output

    monkeypatch.setattr(output, "is_terminal", lambda stream: True)
    assert output.header_text(f"name{mark}gguf.exe") == f"name\\u{ord(mark):04x}gguf.exe"
    monkeypatch.setattr(output, "is_terminal", lambda stream: False)
    assert output.header_text(f"name{mark}gguf.exe") == f"name{mark}gguf.exe"  # a pipe gets it as written
