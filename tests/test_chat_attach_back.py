"""Ctrl-C before the answer begins takes the message back, and what /read attached to it stays attached for the
next message (docs/chat.md, Ctrl-C): sent again, it goes with the file, as it first did."""

from __future__ import annotations

import json
import os
import re
import sys
import termios
import time
from pathlib import Path
from typing import Any

import pexpect
import pytest

from tests.conftest import CLI, ROOT, default_sigint


def answering(child: Any) -> None:
    """Wait until the chat has taken the message: the prompt has let go of the terminal (ISIG on) and the answer's
    screen holds it, not echoing keys (cli/echo.py): a Ctrl-C now stops the turn, not the prompt's read."""
    tty = os.open(f"/proc/{child.pid}/fd/0", os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
    try:
        deadline = time.monotonic() + 60
        while (termios.tcgetattr(tty)[3] & (termios.ISIG | termios.ECHO)) != termios.ISIG:
            assert time.monotonic() < deadline, "the chat never took the message"
            time.sleep(0.005)
    finally:
        os.close(tty)


def test_ctrl_c_that_takes_a_message_back_keeps_its_attachment(cli_env: dict[str, str], tmp_path: Path) -> None:
    lcli = CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")})
    big = tmp_path / "big.txt"  # some 2,800 tokens, read in pieces of 16: long enough to be stopped before it ends
    big.write_text("".join(f"Line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(200)))
    env = {**lcli.env, "TERM": "xterm", "PROMPT_TOOLKIT_NO_CPR": "1"}
    # pexpect's own child, the pty's foreground process as in a terminal emulator (the chat's echo-off needs that)
    child = pexpect.spawn(sys.executable, ["-m", "localgen", "chat", "att", "-n", "5", "--temperature", "0",
                                           "--batch-size", "16", "--no-prompt-cache"], env=env, cwd=str(ROOT),
                          encoding="utf-8", timeout=120, dimensions=(40, 120), preexec_fn=default_sigint)
    try:
        child.expect("ready in")
        child.expect_exact(">>>")
        child.sendline(f"/read {big}")
        child.expect_exact("will be sent with your next message")
        child.expect_exact(">>>")
        child.sendline("Summarize.")
        answering(child)
        child.sendintr()
        child.expect_exact("the message was taken back")
        child.expect_exact("its 1 attachment stays attached for your next message; /detach drops it")
        child.expect_exact(">>>")
        child.sendline("/detach")
        child.expect_exact("dropped 1 attachment")
        child.expect_exact(">>>")
        child.sendcontrol("d")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    chats = Path(lcli.env["LOCALGEN_HOME"]) / "data" / "chats" / "att.json"
    assert not chats.exists() or json.loads(chats.read_text())["messages"] == [], "the message was taken back"


def test_a_message_that_fails_keeps_its_attachment(cli_env: dict[str, str], home: Path, tmp_path: Path) -> None:
    """A message refused before its answer (here, too long for the window) keeps what /read attached to it, as
    one taken back does, and says so: the next message goes with the file. (It was taken off and lost.)"""
    from tests.test_chat import leaves, send, spawn
    from tests.test_media import wrappable

    note = tmp_path / "note.txt"
    note.write_text("The launch code is PELICAN-42.\n")
    child = spawn(cli_env, "failkeeps", "-n", "4", "--temperature", "0", "--ctx", "512")
    send(child, f"/read {note}", "will be sent with your next message")
    out = send(child, "word " * 700, wrappable("its 1 attachment stays attached for your next message"))
    assert re.search(wrappable("the context window is 512"), out), out[-2000:]
    send(child, "What is the launch code?", r"tok/s")
    leaves(child)
    saved = json.loads((home / "data" / "chats" / "failkeeps.json").read_text())
    users = [m["content"] for m in saved["messages"] if m["role"] == "user"]
    assert len(users) == 1 and "PELICAN-42" in users[0] and users[0].endswith("What is the launch code?"), users


def test_a_picture_that_fails_is_told_from_one_whose_name_holds_its_name(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The picture an error names is the one dropped: not also one whose name is part of its (a.png beside
    aa.png), which used to go too; the other attachments stay, said."""
    from dataclasses import dataclass

    from localgen.cli.chat.message import _kept_after_failure
    from localgen.cli.chat.view import ChatView
    from localgen.media import MediaError

    @dataclass
    class Picture:  # what the chat keeps of an attached image: its source and label
        source: str

        def label(self) -> str:
            return Path(self.source).name

    short, long_ = Picture("a.png"), Picture("aa.png")  # as typed: /image a.png, /image aa.png
    view = ChatView(interactive=False, plain=True, stats=False, media=[short, long_])
    _kept_after_failure(view, ["a note"], [short, long_], MediaError("aa.png is a corrupt or unreadable PNG"))
    assert view.media == [short] and view.attachments == ["a note"]
    assert capsys.readouterr().err == "(dropped aa.png; 2 other attachments stay attached (/detach drops them))\n"


class _Session:
    fresh = True  # a new conversation (a resumed one says so at the first prompt)

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": "earlier"}]


class _AddsThenPressed:
    """A runner whose start() has added the message and returned when the Ctrl-C is raised: the press landed as
    the turn's set-up ended (its terminal and SIGINT handler put back), past start()'s own taking back."""

    summarizing = False

    def __init__(self) -> None:
        self.session = _Session()

    def start(self, text: str, media: list[Any]) -> int:
        self.session.messages.append({"role": "user", "content": text})
        raise KeyboardInterrupt


def test_a_press_just_after_the_message_was_added_takes_it_back(capsys: pytest.CaptureFixture[str]) -> None:
    """CI caught it under load: the first of two Ctrl-C came as start() returned, the chat said "the message was
    taken back" and gave /read's file back, but the message stayed in the conversation, file and all, and the next
    one was sent after it."""
    from localgen.cli.chat.message import handle
    from localgen.cli.chat.view import ChatView

    runner = _AddsThenPressed()
    view = ChatView(interactive=True, plain=True, stats=False, attachments=["the file's text"])
    assert handle("Summarize.", runner, view) is True
    assert runner.session.messages == [{"role": "user", "content": "earlier"}]
    assert view.attachments == ["the file's text"]
    said = capsys.readouterr()
    assert "the message was taken back" in said.out + said.err


def test_a_press_that_gets_past_a_turn_leaves_the_chat_going(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A second Ctrl-C that lands as a turn ends, past the turn's own handler, is said as one at the prompt is, and
    the chat reads the next line: it ended the chat ("interrupted", exit 130) under load in CI."""
    import localgen.cli.chat.loop as loop
    import localgen.cli.chat.repl as repl
    from localgen.cli.chat.view import ChatView

    lines = iter(["Summarize.", "Say hi."])
    released: list[bool] = []

    class Lines:
        def __init__(self, *_: Any) -> None:
            pass

        def read(self) -> str:
            try:
                return next(lines)
            except StopIteration:
                raise EOFError from None

        def give_press(self) -> None:
            pass

        def release(self) -> None:
            released.append(True)

    handled: list[str] = []

    def handle(text: str, runner: Any, view: Any, press: Any) -> bool:
        handled.append(text)
        if text == "Summarize.":
            raise KeyboardInterrupt
        return True

    monkeypatch.setattr(repl, "LineInput", Lines)
    monkeypatch.setattr(repl, "make_completer", lambda *_: None)
    monkeypatch.setattr(loop, "handle", handle)
    runner = type("Runner", (), {"session": _Session()})()
    runner.session.messages = []
    loop._repl(runner, ChatView(interactive=True, plain=True, stats=False), [])
    assert handled == ["Summarize.", "Say hi."] and len(released) == 2
    said = capsys.readouterr()
    assert "Ctrl-C stops an answer" in said.out + said.err
