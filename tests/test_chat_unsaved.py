"""`localgen chat` when a write fails. On a home that cannot be written (a read-only disk): every answer is given,
one warning says why the conversation is not saved, and the exit status says it was not. With stdout's reader gone
(`| head -1`): the chat ends quietly and keeps what was said."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pexpect
import pytest

from tests.conftest import CLI, ROOT

N = ["-n", "6", "--temperature", "0"]
READ_ONLY = 'mount --bind -o ro "$H" "$H"'


@pytest.fixture
def ucli(cli_env: dict[str, str], tmp_path: Path) -> CLI:
    return CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")})


def _can_mount() -> bool:
    return shutil.which("unshare") is not None and not subprocess.run(["unshare", "-m", "true"],
                                                                      capture_output=True).returncode


def _read_only(ucli: CLI, *args: str, input: str) -> subprocess.CompletedProcess[str]:
    """`localgen ARGS` with the home bind-mounted read-only, in a mount namespace that ends with the process."""
    if not _can_mount():
        pytest.skip("mounting needs unshare and the right to use it (root)")
    env = {**ucli.env, "H": ucli.env["LOCALGEN_HOME"], "PY": sys.executable}
    return subprocess.run(["unshare", "-m", "sh", "-c", f'{READ_ONLY} && exec "$PY" -m localgen "$@"', "sh", *args],
                          env=env, input=input, capture_output=True, text=True, timeout=600, cwd=ROOT)


def test_a_chat_on_a_read_only_home_answers_every_message_warns_once_and_exits_1(ucli: CLI) -> None:
    first = ucli("chat", "trip", *N, input="Name a yellow fruit.\n")
    assert first.returncode == 0, first.stderr
    saved = Path(ucli.env["LOCALGEN_HOME"]) / "data" / "chats" / "trip.json"
    before = saved.read_bytes()
    r = _read_only(ucli, "chat", "--resume", "trip", *N, input="Name a red fruit.\nAnd a green one?\n/save other\n")
    answers = r.stdout.splitlines()
    assert len(answers) == 2 and all(a.strip() for a in answers), (r.stdout, r.stderr)  # both answered
    lines = r.stderr.splitlines()
    warned = [x for x in lines if x.startswith("warning: cannot write") and "trip.json" in x]
    assert len(warned) == 1 and "Read-only file system" in warned[0], r.stderr
    assert any(x.startswith("not saved: cannot write") and "other.json" in x for x in lines), r.stderr
    assert r.returncode == 1, r.stderr
    assert lines[-1].startswith("localgen: error: the conversation was not saved: cannot write"), r.stderr
    assert saved.read_bytes() == before, "the saved conversation is left as it was"
    assert json.loads(before)["messages"][0]["content"] == "Name a yellow fruit."


def test_a_new_chat_on_an_empty_read_only_home_answers_and_exits_1(ucli: CLI) -> None:
    Path(ucli.env["LOCALGEN_HOME"]).mkdir()
    r = _read_only(ucli, "chat", *N, input="Hi\n")
    assert r.stdout.strip() and len(r.stdout.splitlines()) == 1, (r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert [x.endswith("the chat goes on, but the conversation is not saved") for x in lines
            if x.startswith("warning: cannot write")] == [True], r.stderr
    assert lines[-1].startswith("localgen: error: the conversation was not saved: cannot write"), r.stderr
    assert r.returncode == 1, r.stderr


def test_the_repl_on_a_read_only_home_keeps_answering_and_says_once_that_nothing_is_saved(
        ucli: CLI, cli_env: dict[str, str]) -> None:
    """A terminal chat: the input history and the conversation cannot be written, and neither stops it."""
    if not _can_mount():
        pytest.skip("mounting needs unshare and the right to use it (root)")
    first = ucli("chat", *N, input="Hi\n")  # the home exists, with a saved chat
    assert first.returncode == 0, first.stderr
    env = {**ucli.env, "H": ucli.env["LOCALGEN_HOME"], "PY": sys.executable, "TERM": "xterm",
           "PROMPT_TOOLKIT_NO_CPR": "1"}
    env.pop("NO_COLOR", None)
    child: Any = pexpect.spawn("unshare", ["-m", "sh", "-c", f'{READ_ONLY} && exec "$PY" -m localgen chat "$@"', "sh",
                                           *N], env=env, cwd=str(ROOT), encoding="utf-8", timeout=300,
                               dimensions=(40, 120))
    child.logfile_read = shown = io.StringIO()
    child.expect("ready in")
    child.expect_exact(">>>")
    for message in ("Name a red fruit.", "And a green one?"):
        child.sendline(message)
        child.expect(r"tok/s")
        child.expect_exact(">>>")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    text = shown.getvalue()
    assert text.count("warning: cannot write") == 1, text
    assert text.count("tok/s") == 2, text  # both answered, each with its footer
    assert "the conversation was not saved" in text, text
    assert child.exitstatus == 1, text


def test_a_scripted_chat_whose_reader_goes_away_keeps_the_message_and_what_was_said(ucli: CLI) -> None:
    """`chat | head -1`: the chat ends with status 0 at the answer's next write, and the conversation keeps the
    message and the partial answer, as Ctrl-C keeps it (it was lost whole)."""
    p = subprocess.Popen(ucli.argv("chat", "-n", "300", "--temperature", "0"), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ucli.env, cwd=ROOT)
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write("Write a long story about a dragon, in many short lines.\n")
    p.stdin.close()
    first = p.stdout.readline()
    p.stdout.close()
    assert p.stderr is not None
    err = p.stderr.read()
    p.wait(600)
    assert p.returncode == 0 and first.strip(), err
    saved = list((Path(ucli.env["LOCALGEN_HOME"]) / "data" / "chats").glob("*.json"))
    assert len(saved) == 1, err
    messages = json.loads(saved[0].read_text())["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"], messages
    assert messages[0]["content"] == "Write a long story about a dragon, in many short lines."
    assert messages[1]["content"].startswith(first.rstrip("\n")), (messages, first)
