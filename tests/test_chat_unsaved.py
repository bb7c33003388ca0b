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
FULL = ('cp -a "$H/data/chats" "$T" && mount -t tmpfs -o size=16k tmpfs "$H/data/chats" && cp -a "$T/chats/." '
        '"$H/data/chats/" && { dd if=/dev/zero of="$H/data/chats/filler" bs=4k 2>/dev/null; true; }')


@pytest.fixture
def ucli(cli_env: dict[str, str], tmp_path: Path) -> CLI:
    return CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")})


def _can_mount() -> bool:
    return shutil.which("unshare") is not None and not subprocess.run(["unshare", "-m", "true"],
                                                                      capture_output=True).returncode


def _read_only(ucli: CLI, *args: str, input: str, mount: str = READ_ONLY) -> subprocess.CompletedProcess[str]:
    """`localgen ARGS` with the home bind-mounted read-only (or its chats on a full disk), in a mount namespace
    that ends with the process."""
    if not _can_mount():
        pytest.skip("mounting needs unshare and the right to use it (root)")
    env = {**ucli.env, "H": ucli.env["LOCALGEN_HOME"], "T": str(Path(ucli.env["LOCALGEN_HOME"]).parent),
           "PY": sys.executable}
    return subprocess.run(["unshare", "-m", "sh", "-c", f'{mount} && exec "$PY" -m localgen "$@"', "sh", *args],
                          env=env, input=input, capture_output=True, text=True, timeout=600, cwd=ROOT)


@pytest.mark.parametrize(("mount", "why"), [(READ_ONLY, "Read-only file system"), (FULL, "No space left on device")])
def test_a_chat_on_a_read_only_home_answers_every_message_warns_once_and_exits_1(ucli: CLI, mount: str,
                                                                                 why: str) -> None:
    first = ucli("chat", "trip", *N, input="Name a yellow fruit.\n")
    assert first.returncode == 0, first.stderr
    saved = Path(ucli.env["LOCALGEN_HOME"]) / "data" / "chats" / "trip.json"
    before = saved.read_bytes()
    r = _read_only(ucli, "chat", "--resume", "trip", *N, input="Name a red fruit.\nAnd a green one?\n/save other\n",
                   mount=mount)
    answers = r.stdout.splitlines()
    assert len(answers) == 2 and all(a.strip() for a in answers), (r.stdout, r.stderr)  # both answered
    lines = r.stderr.splitlines()
    warned = [x for x in lines if x.startswith("warning: cannot write") and "trip.json" in x]
    assert len(warned) == 1 and why in warned[0], r.stderr
    # the conversation's file is named, not the temporary file it is written through (.other.json.PID.tmp); and the
    # chat goes on as trip: the name of a /save that failed is not taken (later turns went nowhere)
    assert f"not saved: cannot write {saved.parent / 'other.json'}: {why}; the chat goes on as trip" in lines, r.stderr
    assert r.returncode == 1, r.stderr
    assert lines[-1].startswith(f"localgen: error: the conversation was not saved: cannot write {saved}: "), r.stderr
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


def test_a_file_where_the_chats_folder_goes_is_named_as_such(ucli: CLI) -> None:
    """A red team's: with a file at <data>/chats the warning said `cannot write .../chats: File exists`; it names the
    conversation's file and what is in its way."""
    data = Path(ucli.env["LOCALGEN_HOME"]) / "data"
    data.mkdir(parents=True)
    (data / "chats").write_text("not a folder")
    r = ucli("chat", "blocked", *N, input="Hi\n")
    assert r.stdout.strip(), r.stderr
    said = (f"cannot write {data / 'chats' / 'blocked.json'}: {data / 'chats'} is a file, not a folder; the chat "
            "goes on, but the conversation is not saved")
    assert f"warning: {said}" in r.stderr.splitlines(), r.stderr
    assert r.returncode == 1 and (data / "chats").read_text() == "not a folder", r.stderr


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


def test_a_first_save_that_fails_leaves_no_empty_file_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new conversation's file is named only once written whole: when the write fails (a full disk), nothing is
    left that `--list` would skip and `--resume` call unreadable, and the next save makes it. A SIGTERM the instant
    after the file was named leaves it whole, and this chat's (its next save writes there)."""
    import errno
    import os

    from localgen.chat import saved
    from localgen.chat import session as sessions

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    chat = sessions.ChatSession(name="full", model="m", fresh=True, auto_named=False)
    chat.add("user", "Hi")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as m:
        m.setattr(sessions.os, "fsync", full)
        with pytest.raises(OSError):
            chat.save()
    assert list(saved.chats_dir().iterdir()) == [], "nothing is left in the folder"
    assert chat.save() == saved.chats_dir() / "full.json", "the next save makes the file"
    assert sessions.ChatSession.load("full").messages == [{"role": "user", "content": "Hi"}]
    signalled = sessions.ChatSession(name="cut", model="m", fresh=True, auto_named=False)
    signalled.add("user", "Hello")
    real_link = os.link

    def sigterm(src: str, dst: str) -> None:  # a SIGTERM (SystemExit) the instant after the file was named
        real_link(src, dst)
        raise SystemExit(143)

    with monkeypatch.context() as m:
        m.setattr(sessions.os, "link", sigterm)
        with pytest.raises(SystemExit):
            signalled.save()
    assert sessions.ChatSession.load("cut").messages == signalled.messages and not signalled.fresh
    signalled.add("assistant", "Hi")
    assert signalled.save() == saved.chats_dir() / "cut.json", "its next save writes there, not to cut-2"
    assert sorted(f.name for f in saved.chats_dir().iterdir()) == ["cut.json", "full.json"]


def test_show_after_a_failed_save_says_the_conversation_is_not_saved_and_why(ucli: CLI) -> None:
    """/show after a save that failed (a read-only home) says `not saved (why)`, not `saved at` a file that is
    behind the conversation."""
    first = ucli("chat", "shown", *N, input="Name a yellow fruit.\n")
    assert first.returncode == 0, first.stderr
    r = _read_only(ucli, "chat", "--resume", "shown", *N, input="Name a red fruit.\n/show\n")
    saved = Path(ucli.env["LOCALGEN_HOME"]) / "data" / "chats" / "shown.json"
    shown = [x for x in r.stderr.splitlines() if x.startswith("conversation shown · ")]
    assert len(shown) == 1 and shown[0].startswith("conversation shown · 4 messages · not saved (cannot write "), \
        r.stderr
    assert "Read-only file system" in shown[0] and shown[0].endswith(f"): {saved}"), shown


@pytest.mark.parametrize("command", ["/clear", "/load other"])
def test_clear_or_load_never_drops_a_conversation_that_is_not_saved(ucli: CLI, command: str) -> None:
    """docs/chat.md: a conversation that cannot be saved is kept in memory and said. /clear and /load left it for
    another, and it was gone (nothing saved, the chat ending with exit 0); now a save is tried again, and where it
    fails too the command is refused, naming why (scripted, the chat ends there with exit 1, said)."""
    first = ucli("chat", "trip", *N, input="Name a yellow fruit.\n")
    assert first.returncode == 0, first.stderr
    assert ucli("chat", "other", *N, input="Hi.\n").returncode == 0
    saved = Path(ucli.env["LOCALGEN_HOME"]) / "data" / "chats" / "trip.json"
    before = saved.read_bytes()
    r = _read_only(ucli, "chat", "--resume", "trip", *N, input=f"Name a red fruit.\n{command}\nSay bye.\n",
                   mount=FULL)
    assert r.returncode == 1, r.stderr
    assert len(r.stdout.splitlines()) == 1, r.stdout  # the red fruit answered; nothing after the refusal
    assert f"localgen: error: {command} would drop this conversation, which is not saved (cannot write" in r.stderr
    assert "No space left on device" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert saved.read_bytes() == before
