"""`localgen chat`: the REPL in a real pseudo-terminal, scripted stdin, saving and resuming."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pexpect
import pytest

from localgen.chat.session import ChatSession
from localgen.cli.chat.render import PlainView, split_blocks
from tests import terminal
from tests.conftest import CLI, ROOT, SAFETY_NET_S, InProcessCLI, default_sigint

PROMPT = ">>>"
SCREEN = (40, 120)


def spawn(cli_env: dict[str, str], *args: str, log: terminal.Screen | None = None,
          dimensions: tuple[int, int] = SCREEN) -> Any:
    """`localgen chat ARGS` on a terminal of `dimensions` (40 x 120), at its first prompt; `log` is fed everything
    it writes."""
    env = dict(cli_env)
    env.pop("NO_COLOR", None)
    env["TERM"] = "xterm"
    env["PROMPT_TOOLKIT_NO_CPR"] = "1"
    child = terminal.spawn(env, ["chat", *args], timeout=60, dimensions=dimensions)
    child.logfile_read = log
    child.expect("ready in")
    child.expect_exact(PROMPT)
    return child


def send(child: Any, line: str, expect: str) -> str:
    child.sendline(line)
    child.expect(expect)
    before = str(child.before)
    child.expect_exact(PROMPT)
    return before


def exits(child: Any) -> None:
    """/exit: the chat ends, with exit status 0."""
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def leaves(child: Any) -> None:
    """Ctrl-D at an empty prompt: the chat ends, with exit status 0."""
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_repl_turns_and_slash_commands(cli_env: dict[str, str], home: Path, tmp_path: Path) -> None:
    note = tmp_path / "note.txt"
    note.write_text("The launch code is PELICAN-42.\n")
    child = spawn(cli_env, "replchat", "-n", "16", "--temp", "0")
    send(child, "Hello! Who are you?", r"tok/s")
    send(child, "/set temperature 0.3", r"temperature = 0\.3")
    send(child, "/show", r"temperature 0\.3")
    send(child, "/context", r"tokens used")
    send(child, "/stats", r"prompt tokens")
    send(child, "/system Answer in one short sentence.", r"system prompt set")
    send(child, "/retry", r"tok/s")
    send(child, f"/read {note}", r"will be sent with your next message")
    send(child, "What is the launch code?", r"tok/s")
    send(child, "/set top_p 2", r"must be within")
    send(child, "/bogus", r"unknown command")
    send(child, "Thanks!", r"tok/s")
    send(child, "/undo", r"last exchange dropped")
    send(child, "/save savedchat", r"saved to")
    exits(child)
    saved = json.loads((home / "data" / "chats" / "savedchat.json").read_text())
    assert saved["system"] == "Answer in one short sentence."
    users = [m["content"] for m in saved["messages"] if m["role"] == "user"]
    assert users[0] == "Hello! Who are you?"
    assert "PELICAN-42" in users[1] and users[1].endswith("What is the launch code?")
    assert "Thanks!" not in users, "/undo dropped the last exchange"
    assert saved["settings"]["temperature"] == 0.3
    assert (home / "data" / "chats" / "replchat.json").exists(), "the autosave under the first name stays"


def test_clear_after_save_starts_a_new_conversation_and_keeps_the_saved_one(cli_env: dict[str, str],
                                                                          home: Path) -> None:
    """chat.md: `/clear` goes on in a new conversation (a name from the clock, its own in the log), so the one
    saved with `/save NAME` is never emptied: `/load NAME` brings it back whole."""
    chats = home / "data" / "chats"
    before = set(chats.glob("*.json"))
    child = spawn(cli_env, "-n", "4", "--temp", "0")
    send(child, "Remember the word kumquat.", r"tok/s")
    send(child, "/save mychat", r"saved to")
    child.sendline("/clear")
    child.expect(r"conversation cleared: this chat goes on as (chat-[\d-]+) \(mychat is kept as it was\)")
    new = child.match.group(1)
    child.expect_exact(PROMPT)
    send(child, "Hello again.", r"tok/s")
    send(child, "/load mychat", r"continuing mychat: 2 messages")
    exits(child)
    kept, fresh = ChatSession.load("mychat"), ChatSession.load(new)
    assert [m["content"] for m in kept.messages if m["role"] == "user"] == ["Remember the word kumquat."]
    assert [m["content"] for m in fresh.messages if m["role"] == "user"] == ["Hello again."]
    with sqlite3.connect(home / "data" / "logs" / "logs.db") as db:
        logged = db.execute("SELECT conversation_id, prompt FROM responses WHERE conversation_id IN (?, ?) "
                            "ORDER BY id", (kept.log_id, fresh.log_id)).fetchall()
    assert logged == [(kept.log_id, "Remember the word kumquat."), (fresh.log_id, "Hello again.")]
    assert fresh.log_id != kept.log_id, "the new conversation is a new one in the log too"
    # the first name's autosave (kept by /save, as chat.md says), mychat and the new one
    made = sorted(p.stem for p in set(chats.glob("*.json")) - before)
    assert len(made) == 3 and {"mychat", new} < set(made), made


def test_ctrl_c_stops_answer_and_keeps_it(cli_env: dict[str, str], home: Path) -> None:
    child = spawn(cli_env, "interrupted", "-n", "3000", "--temp", "0")
    child.sendline("Write a very long essay about the history of rivers.")
    child.expect_exact("\x1b[?2004l")  # the prompt's last word to the terminal: what follows is the answer
    # its first word (not a terminal code's last letter): the answer streams (a busy machine reads in slowly)
    child.expect(r"(?<![\x1b\[?0-9;])[A-Za-z]{3}", timeout=300)
    child.sendcontrol("c")
    child.expect("stopped; the partial answer is kept")
    child.expect_exact(PROMPT)
    child.sendcontrol("c")
    child.expect("Ctrl-D")
    child.expect_exact(PROMPT)
    time.sleep(0.5)
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    saved = json.loads((home / "data" / "chats" / "interrupted.json").read_text())
    assert saved["messages"][-1]["role"] == "assistant"
    assert 0 < len(saved["messages"][-1]["content"]) < 3000 * 8


LETTER = "Write a short letter to a friend."  # at --temp 0, paragraphs from its first line on


def paragraphs_shown(rows: list[str], question: str) -> list[list[str]]:
    """The answer on the screen, from the row below the question to the first notice (the footer, or what Ctrl-C
    says): its paragraphs (runs of rows between blank rows), each as its words; two blank rows in a row make an
    empty paragraph."""
    start = next(i for i, row in enumerate(rows) if row.startswith(f"{PROMPT} {question}")) + 1
    end = next(i for i in range(start, len(rows)) if "tok/s" in rows[i] or rows[i].startswith("(stopped"))
    text = "\n".join(rows[start:end]).strip("\n")
    shown: list[list[str]] = [[]]
    for row in text.split("\n"):
        if row.strip():
            shown[-1].extend(row.split())
        else:
            shown.append([])
    return shown if text else []


def wait_until(child: Any, shown: Callable[[], bool]) -> None:
    """Read what `child` writes (its screen fed as it comes) until `shown()`. Each read takes all that came: the
    screen is fed as pexpect reads, so taking one character at a time asked `shown()` (a render of the whole
    screen) again of the same screen for each character read, seconds of CPU an answer."""
    while not shown():
        child.expect(r"[\s\S]+", timeout=SAFETY_NET_S)


def paragraphs_saved(text: str) -> list[list[str]]:
    """An answer's paragraphs (text between blank lines), each as its words."""
    return [p.split() for p in re.split(r"\n[ \t]*\n", text) if p.strip()]


def test_paragraphs_are_shown_apart_as_the_answer_has_them(cli_env: dict[str, str], home: Path) -> None:
    """Each finished paragraph is printed for good as the answer streams, with the blank line the answer has
    between it and the next, as the whole answer rendered at once would show it. Keys typed while it streams are
    not echoed into it: they show at the next prompt."""
    screen = terminal.Screen(SCREEN)
    child = spawn(cli_env, "paragraphs", "-n", "60", "--temp", "0", log=screen)
    child.sendline(LETTER)
    child.expect_exact("\x1b[?2004l")  # the prompt's last word to the terminal: what follows is the answer
    wait_until(child, lambda: bool(paragraphs_shown([*screen.rows(), "tok/s"], LETTER)))  # it streams
    child.send("ahead")
    child.expect("tok/s", timeout=SAFETY_NET_S)
    wait_until(child, lambda: f"{PROMPT} ahead" in screen.rows())
    child.sendcontrol("u")
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    answer = json.loads((home / "data" / "chats" / "paragraphs.json").read_text())["messages"][-1]["content"]
    saved = paragraphs_saved(answer)
    assert len(saved) >= 2, f"the test needs an answer of several paragraphs: {answer!r}"
    assert paragraphs_shown(screen.rows(), LETTER) == saved, "\n".join(screen.rows())


@pytest.mark.parametrize("columns", ["0", "\u00b2"])
def test_a_columns_that_is_no_width_is_ignored_for_the_terminal_s_own(cli_env: dict[str, str], columns: str) -> None:
    """chat.md: a COLUMNS (or LINES) that is no size (0, -1, `abc`) is ignored: the chat is drawn at the terminal's
    width. Rich took COLUMNS=0 as a width of 0, and the answer and every notice were blank; `²`, a digit to
    str.isdigit, was a ValueError traceback."""
    screen = terminal.Screen(SCREEN)
    child = spawn({**cli_env, "COLUMNS": columns}, f"columns-{ord(columns[0])}", "-n", "8", "--temp", "0", "--grammar",
                  'root ::= "Yes, it is wet."', log=screen)
    child.sendline("Is water wet?")
    child.expect("tok/s")
    child.expect_exact(PROMPT)
    leaves(child)
    assert "Yes, it is wet." in screen.rows(), "\n".join(screen.rows())
    assert any(row.startswith("smollm2:135m ready in") for row in screen.rows()), "\n".join(screen.rows())


def test_ctrl_d_pressed_while_an_answer_streams_leaves_once_it_is_done(cli_env: dict[str, str], home: Path) -> None:
    """tutorial.md: Ctrl-D leaves. Pressed while an answer streams, it is taken at the next prompt, as the shell and
    other REPLs take it: the answer ends whole and is saved, then the chat leaves (it was lost: the terminal's cooked
    mode made it an end-of-file that reached the prompt as a NUL, and only a second Ctrl-D left)."""
    screen = terminal.Screen(SCREEN)
    child = spawn(cli_env, "ctrl-d-ahead", "-n", "60", "--temp", "0", log=screen)
    child.sendline(LETTER)
    child.expect_exact("\x1b[?2004l")  # the prompt's last word to the terminal: what follows is the answer
    wait_until(child, lambda: bool(paragraphs_shown([*screen.rows(), "tok/s"], LETTER)))  # it streams
    child.sendcontrol("d")
    child.expect("tok/s", timeout=SAFETY_NET_S)  # the answer goes on to its end
    child.sendline("/show")  # what a chat still open would answer, after the Ctrl-D typed before it
    assert child.expect([pexpect.EOF, "conversation ctrl-d-ahead"], timeout=SAFETY_NET_S) == 0, "the chat stayed open"
    child.close()
    assert child.exitstatus == 0
    assert "stopped" not in "\n".join(screen.rows())
    saved = json.loads((home / "data" / "chats" / "ctrl-d-ahead.json").read_text())["messages"]
    assert [m["role"] for m in saved] == ["user", "assistant"] and saved[-1]["content"]


def test_ctrl_c_leaves_the_partial_answer_on_screen_once(cli_env: dict[str, str], home: Path) -> None:
    """Ctrl-C while a paragraph streams: the screen shows the partial answer once, as it was saved, then the
    notice; the terminal's echo of Ctrl-C (`^C`) neither shows nor moves the answer's live lines."""
    screen = terminal.Screen(SCREEN)
    child = spawn(cli_env, "stopped-letter", "-n", "3000", "--temp", "0", log=screen)
    child.sendline(LETTER)
    child.expect_exact("\x1b[?2004l")  # the prompt's last word to the terminal: what follows is the answer
    wait_until(child, lambda: sum(map(len, paragraphs_shown([*screen.rows(), "tok/s"], LETTER))) >= 12)  # 2nd paragraph
    child.send("dropped")  # typed, then Ctrl-C: the terminal drops it with the rest of the line
    child.sendcontrol("c")
    child.expect("stopped; the partial answer is kept")
    child.expect("tok/s")
    child.expect_exact(PROMPT)
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert not any("dropped" in row for row in screen.rows()), "\n".join(screen.rows())
    answer = json.loads((home / "data" / "chats" / "stopped-letter.json").read_text())["messages"][-1]["content"]
    assert 0 < len(answer) < 3000 * 8
    rows = screen.rows()
    assert paragraphs_shown(rows, LETTER) == paragraphs_saved(answer), "\n".join(rows)
    assert not any("^C" in row for row in rows), "\n".join(rows)


def fall_behind(child: Any) -> str:
    """The terminal reads nothing until the chat waits to write to it: the pty holds some 20 KB it has not shown,
    which a terminal throws away at Ctrl-C unless the program has set NOFLSH, and the write Ctrl-C then lands in
    ends short (unbuffered, PYTHONUNBUFFERED=1 as here, Python dropped the rest of that frame). Seen in what the
    chat does (/proc/PID/syscall), not in time, so a busy machine makes no difference. Returns what the chat waits
    to write, as the terminal gets it (a pty writes "\n" as "\r\n")."""
    deadline = time.monotonic() + SAFETY_NET_S
    while (waiting := terminal.waiting_to_write(child.pid)) is None:
        assert child.isalive() and time.monotonic() < deadline, "the answer stopped before the terminal fell behind"
        time.sleep(0.05)
    return waiting.decode().replace("\n", "\r\n")


def test_ctrl_c_after_the_terminal_fell_behind_shows_all_that_was_written(cli_env: dict[str, str],
                                                                           home: Path) -> None:
    """Ctrl-C while the terminal lags behind the answer (a busy machine, a slow link): what the chat wrote before
    it still reaches the screen, so the screen shows the partial answer as it was saved. (The terminal's own
    Ctrl-C threw it away, and the frame being written was cut short; the live region's next redraw, counting
    the rows it drew last, then erased rows of the answer above it: a paragraph printed for good was gone, a
    blank row in its place.) Keys typed before Ctrl-C are still dropped, as the terminal drops them."""
    tall = (120, SCREEN[1])  # the answer goes on while the terminal lags: all of it stays on the screen
    screen = terminal.Screen(tall)
    child = spawn(cli_env, "behind-letter", "-n", "3000", "--temp", "0", log=screen, dimensions=tall)
    child.sendline(LETTER)
    child.expect_exact("\x1b[?2004l")
    wait_until(child, lambda: bool(paragraphs_shown([*screen.rows(), "tok/s"], LETTER)))  # it streams
    waiting = fall_behind(child)
    child.send("dropped")
    child.sendcontrol("c")
    child.expect("stopped; the partial answer is kept", timeout=SAFETY_NET_S)
    child.expect_exact(PROMPT)
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    rows = screen.rows()
    assert not any("dropped" in row for row in rows), "\n".join(rows)
    answer = json.loads((home / "data" / "chats" / "behind-letter.json").read_text())["messages"][-1]["content"]
    assert len(paragraphs_saved(answer)) >= 3, f"the answer went on while the terminal lagged: {answer!r}"
    assert paragraphs_shown(rows, LETTER) == paragraphs_saved(answer), "\n".join(rows)
    assert waiting in screen.written, f"the frame being written at Ctrl-C was cut short: {waiting!r}"


def test_resume_and_list(cli: CLI, cli_env: dict[str, str]) -> None:
    r = cli("chat", "resumable", "-n", "8", "--temp", "0", input="My name is Ada.\n")
    assert r.returncode == 0, r.stderr
    listing = cli("chat", "--list")
    assert "resumable" in listing.stdout and "My name is Ada." in listing.stdout
    child = spawn(cli_env, "--resume", "resumable", "-n", "8")
    child.sendline("/context")
    child.expect(r"2 messages")
    child.expect_exact(PROMPT)
    exits(child)
    again = cli("chat", "resumable", input="hi\n")
    assert again.returncode == 2 and "--resume resumable" in again.stderr


def test_a_resumed_chat_says_how_much_of_the_history_its_next_turn_evaluates_again(cli: CLI) -> None:
    """The notice of a restored KV state says what is true: the last answer is not in the state (a generated token
    is never reused), so the next message evaluates it again, and the notice counts it (it said "the history is
    not re-read" while /stats showed the last answer's tokens evaluated again)."""
    r = cli("chat", "kv-told", "-n", "24", "--temp", "0", "--stats",
            input="Name three colors of fruit.\nAnd three of flowers.\n")
    assert r.returncode == 0, r.stderr
    answered = int(re.findall(r"^(\d+) tokens? ·", r.stderr, re.M)[-1])
    r = cli("chat", "--resume", "kv-told", "-n", "2", "--temp", "0", "--stats", input="Thanks.\n/stats\n")
    assert r.returncode == 0, r.stderr
    told = re.search(r"^([\d,]+) tokens of the history kept ready from the last time: the next message reads again "
                     r"the last answer \(([\d,]+) tokens\) and at most 71 tokens before it$",
                     r.stderr, re.M)
    assert told is not None, r.stderr
    restored, again = (int(n.replace(",", "")) for n in told.groups())
    stats = re.search(r"([\d,]+) prompt tokens \(([\d,]+) cached\)", r.stderr)
    assert stats is not None, r.stderr
    prompt, cached = (int(n.replace(",", "")) for n in stats.groups())
    assert 0 < cached <= restored <= cached + 71, (cached, restored)
    assert again >= answered, (again, answered)  # the whole last answer is counted as evaluated again
    assert prompt - cached > again, (prompt, cached, again)  # ... and it was, with the new message


def test_a_resumed_small_state_is_said_to_be_evaluated_again_at_most_whole(cli: CLI) -> None:
    """The restore notice's "at most N tokens before it" is never more than the state holds (it said 71 of a
    32-token state)."""
    r = cli("chat", "kv-small", "-n", "2", "--temp", "0", input="hi\n")
    assert r.returncode == 0, r.stderr
    r = cli("chat", "--resume", "kv-small", "-n", "2", "--stats", input="/context\n")
    told = re.search(r"([\d,]+) tokens of the history kept ready .* and at most ([\d,]+) tokens before it", r.stderr)
    assert r.returncode == 0 and told is not None, r.stderr
    restored, before = (int(n.replace(",", "")) for n in told.groups())
    assert before <= min(restored, 71), r.stderr


def test_resume_last_without_a_name(cli: CLI, tmp_path: Path) -> None:
    """chat.md: --resume without a name takes the most recently updated conversation, whatever the names' order."""
    own = CLI({**cli.env, "LOCALGEN_HOME": str(tmp_path)})  # a home of these conversations only
    r = own("chat", "latest-one", "-n", "4", input="Remember the number 7.\n")
    assert r.returncode == 0, r.stderr
    chats = tmp_path / "data" / "chats"
    saved = json.loads((chats / "latest-one.json").read_text(encoding="utf-8"))
    for name in ("aa-older", "zz-older"):  # updated an hour before it, named before and after it
        older = {**saved, "name": name, "updated": saved["updated"] - 3600, "created": saved["created"] - 3600}
        (chats / f"{name}.json").write_text(json.dumps(older), encoding="utf-8")
    assert {p.stem for p in chats.glob("*.json")} == {"latest-one", "aa-older", "zz-older"}
    r = own("chat", "--resume", "-n", "4", input="/show\n")
    assert r.returncode == 0, r.stderr
    assert "conversation latest-one · 2 messages" in r.stderr


def test_show_says_where_a_conversation_will_be_saved_before_its_first_save(cli: CLI, home: Path) -> None:
    """/show before the first exchange says where the conversation is to be saved (it said "saved at" a file that
    did not exist yet); after it, where it is saved."""
    import os

    name = f"showme-{os.urandom(4).hex()}"  # the home is the session's: a name no other run has saved
    r = cli("chat", name, "-n", "2", input="/show\nHi.\n/show\n")
    path = home / "data" / "chats" / f"{name}.json"
    assert r.returncode == 0 and path.is_file(), r.stderr
    assert f"conversation {name} · 0 messages · to be saved at {path}\n" in r.stderr, r.stderr
    assert f"conversation {name} · 2 messages · saved at {path}\n" in r.stderr, r.stderr


def test_scripted_chat_prints_answers_plainly(cli: CLI) -> None:
    script = 'Hello\n/set temperature 0\nWhat is 2+2?\n"""\nA message\non two lines\n"""\n'
    r = cli("chat", "-n", "10", "--stats", input=script)
    assert r.returncode == 0, r.stderr
    assert len([ln for ln in r.stdout.splitlines() if ln.strip()]) >= 3
    assert "\x1b[" not in r.stdout
    assert r.stderr.count("tok/s") == 3
    assert "temperature = 0" in r.stderr


def test_a_chat_runs_where_there_is_no_sighup(cli_in_process: InProcessCLI,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows has no SIGHUP: every chat was an AttributeError traceback once the model had loaded."""
    monkeypatch.delattr(signal, "SIGHUP")
    r = cli_in_process("chat", "-n", "4", input="Hello\n")
    assert r.returncode == 0 and r.stdout.strip() and "Traceback" not in r.stderr, r.stderr


def test_piped_chat_writes_each_answer_byte_for_byte(cli: CLI) -> None:
    r = cli("chat", "piped-letter", "-n", "60", "--temp", "0", input=f"{LETTER}\nThanks!\n")
    assert r.returncode == 0, r.stderr
    answers = [m["content"] for m in ChatSession.load("piped-letter").messages if m["role"] == "assistant"]
    assert len(answers) == 2 and "\n\n" in answers[0], answers
    assert r.stdout == "".join(a if a.endswith("\n") else a + "\n" for a in answers)


def test_a_full_window_never_deletes_history(cli: CLI) -> None:
    long = "Please tell me everything you know about this topic in great detail: " + "rivers and lakes " * 12
    # five turns: the history outgrows the 256-token window at the third, and is cut at each one from there on
    r = cli("chat", "overflow", "-n", "24", "--ctx", "256", "--temp", "0", "--system", "Be helpful.",
            input=(long + "\n") * 5)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("outgrew") == 1
    assert "Traceback" not in r.stderr
    saved = ChatSession.load("overflow")
    assert saved.system == "Be helpful."
    assert len(saved.messages) == 10, "every turn is saved; only what is sent is cut to the window"
    assert [m["role"] for m in saved.messages] == ["user", "assistant"] * 5
    r = cli("chat", "--resume", "overflow", "--ctx", "8192", "-n", "4", input="/context\n")
    assert r.returncode == 0, r.stderr
    assert "10 messages" in r.stderr and "in the window" not in r.stderr, "a larger window sees it all again"


def test_a_message_that_cannot_fit_is_refused_and_nothing_is_lost(cli: CLI) -> None:
    r = cli("chat", "toolong", "-n", "8", "--ctx", "256", "--temp", "0", input="Hello there.\n")
    assert r.returncode == 0, r.stderr
    child_input = "word " * 400 + "\n"
    r = cli("chat", "--resume", "toolong", "-n", "8", "--ctx", "256", input=child_input)
    assert r.returncode == 1
    assert "this message needs" in r.stderr and "the context window is 256" in r.stderr
    assert r.stderr.count("localgen: error:") == 1 and "Traceback" not in r.stderr
    saved = ChatSession.load("toolong")
    assert [m["content"] for m in saved.messages if m["role"] == "user"] == ["Hello there."]
    r = cli("chat", "--resume", "toolong", "-n", "8", input="/undo\n/context\n")
    assert "last exchange dropped" in r.stderr and "0 messages" in r.stderr


def test_a_message_past_the_trained_context_is_not_told_to_restart_with_a_larger_ctx(cli: CLI) -> None:
    """troubleshooting.md: a message longer than the 8,192 tokens SmolLM2 was trained on was told "restart with a
    larger --ctx", which is capped there; the hint says what helps, as run's does: a larger --ctx only where the
    window it gives holds the message with the answer's room, and RoPE scaling (which lifts the cap) is told so."""
    def refused(text: str, *flags: str) -> str:
        r = cli("chat", "-n", "8", *flags, input=text + "\n")
        assert r.returncode == 1 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith("localgen: error: this message needs "), r.stderr
        return r.stderr

    stretch = "a restart with --rope-scaling linear and a larger --ctx stretches the window, at some cost in quality"
    assert refused("word " * 9000, "--ctx", "4096").endswith(
        "; the context window is 4,096 (shorten it: with the answer's room (8 tokens in that window; -n sets it) it "
        "needs more than the 8,192 tokens this model was trained on, past which --ctx does not go; "
        f"{stretch}; the conversation is kept)\n")
    assert refused("word " * 9000, "--ctx", "8192").endswith(
        "; the context window is 8,192 (shorten it: the window is already the 8,192 tokens this model was trained "
        f"on; {stretch}; the conversation is kept)\n")
    assert refused("word " * 5000, "--ctx", "4096").endswith(
        "; the context window is 4,096 (shorten it, or restart with a larger --ctx, up to the 8,192 tokens this "
        "model was trained on; the conversation is kept)\n")
    # stretched, the window is capped by no training: a larger --ctx holds it
    assert refused("word " * 9000, "--ctx", "4096", "--rope-scaling", "linear").endswith(
        "; the context window is 4,096 (shorten it, or restart with a larger --ctx; the conversation is kept)\n")


def test_save_never_overwrites_another_conversation(cli: CLI, home: Path) -> None:
    cli("chat", "keepme", "-n", "4", input="Remember the number 7.\n")
    before = (home / "data" / "chats" / "keepme.json").read_text()
    r = cli("chat", "other", "-n", "4", input="Hi\n/save keepme\n")
    assert r.returncode == 2 and "a conversation named 'keepme' exists" in r.stderr
    assert (home / "data" / "chats" / "keepme.json").read_text() == before


def test_save_s_overwrite_question_shows_y_n_takes_ctrl_d_as_no_and_a_sigterm_ends_the_chat(
        cli: CLI, cli_env: dict[str, str], home: Path) -> None:
    """/save NAME over another conversation asks `[y/N]` (Rich took it for markup and showed none); Ctrl-D there is
    no, and the chat goes on (it ended the chat as interrupted, 130) on a line of its own (it went on after the
    question); a SIGTERM while it asks ends the chat at once with 143, as at the prompt (nothing happened until the
    user answered)."""
    cli("chat", "kept", "-n", "2", input="Remember the number 7.\n")
    before = (home / "data" / "chats" / "kept.json").read_text()
    child = spawn(cli_env, "asked", "-n", "2", "--temp", "0")
    send(child, "Hi", r"tok/s")
    child.sendline("/save kept")
    child.expect_exact("A conversation named 'kept' exists. Overwrite it? [y/N] ")
    child.sendcontrol("d")
    child.expect("not saved")
    assert "\n" in str(child.before), repr(child.before)  # on a line of its own, not after the question
    child.expect_exact(PROMPT)
    send(child, "/show", r"conversation asked · 2 messages")
    child.sendline("/save kept")
    child.expect_exact("Overwrite it? [y/N] ")
    child.kill(signal.SIGTERM)
    terminal.ends(child)
    child.close()
    assert child.exitstatus == 143, (child.exitstatus, child.signalstatus)
    assert (home / "data" / "chats" / "kept.json").read_text() == before
    assert ChatSession.load("asked").messages[0]["content"] == "Hi"


ASKED = """
import signal, sys, threading, time
import localgen.cli.chat.view as shown
from localgen.cli.chat.view import ChatView
signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
reading = threading.Event()
read = shown.read_answer
def read_answer():
    reading.set()
    return read()
shown.read_answer = read_answer
def poke():
    reading.wait(60)  # the question asked (under load, past any fixed sleep: it once came after the signal)
    time.sleep(0.3)  # its read begun
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # to this thread: the main one's read goes on
view = ChatView(interactive=True, plain=True, stats=False)
threading.Thread(target=poke, daemon=True).start()
print(view.ask("Overwrite it? [y/N] "))
"""


def test_a_signal_whose_handler_did_not_interrupt_the_read_of_an_answer_ends_the_question() -> None:
    """A chat's y/N question (/save over another conversation, a tool call's) read with input(): a SIGTERM that
    landed between the question and the read (once in CI, under load) tripped its handler without interrupting the
    read, and the chat waited for a line; so does one that reaches another thread (pthread_kill here, to be sure
    of it). The wait now wakes in slices and runs the handler."""
    import subprocess

    r, w = os.pipe()  # stdin: open, and never written
    try:
        done = subprocess.run([sys.executable, "-c", ASKED], stdin=r, capture_output=True, text=True, cwd=ROOT,
                              timeout=60)
    finally:
        os.close(r)
        os.close(w)
    assert done.returncode == 143, done.stderr
    assert done.stdout == "Overwrite it? [y/N] \n", done.stdout  # the question's line ended


def test_a_save_that_fails_leaves_the_chat_saving_under_its_name(cli_env: dict[str, str], home: Path) -> None:
    """A /save NAME that fails leaves the conversation its name: later turns are saved there (the name was taken
    all the same, and they were saved nowhere). A folder of that name is refused, never offered to be overwritten."""
    chats = home / "data" / "chats"
    chats.mkdir(parents=True, exist_ok=True)
    (chats / "dd.json").mkdir()
    (chats / "gone.json").symlink_to(home / "nowhere" / "x.json")  # an exclusive create of it fails
    try:
        screen = terminal.Screen(SCREEN)
        child = spawn(cli_env, "going-on", "-n", "2", "--temp", "0", log=screen)
        send(child, "Hi", r"tok/s")
        send(child, "/save dd", r"cannot save as 'dd'")
        shown = " ".join(screen.rows())  # the line wraps
        assert f"{chats / 'dd.json'} is a folder, not a saved conversation" in shown, shown
        send(child, "/save gone", r"a conversation named 'gone' was saved by another chat meanwhile")
        send(child, "/show", r"conversation going-on · 2 messages · saved at")
        send(child, "Hello again", r"tok/s")
        exits(child)
        said = [m["content"] for m in ChatSession.load("going-on").messages if m["role"] == "user"]
        assert said == ["Hi", "Hello again"]
        assert (chats / "dd.json").is_dir() and not list((chats / "dd.json").iterdir())
    finally:  # the home is the worker's: `chat --list` tests after this one would warn of them
        (chats / "dd.json").rmdir()
        (chats / "gone.json").unlink()


def test_keys_typed_during_an_answer_a_sigterm_stops_never_reach_the_shell(cli_env: dict[str, str],
                                                                           home: Path) -> None:
    """A SIGTERM stops an answer as Ctrl-C does, and drops the keys typed during it: they stayed in the terminal,
    and the shell the chat returned to ran them (`/save keep`)."""
    import os
    import termios

    child = spawn(cli_env, "typed", "-n", "3000", "--ignore-eos", "--temp", "0")
    child.sendline("Write a very long essay about the history of rivers.")
    child.expect_exact("\x1b[?2004l")  # the prompt's last word to the terminal: what follows is the answer
    child.expect(r"(?<![\x1b\[?0-9;])[A-Za-z]{3}", timeout=300)  # its first word: it streams
    child.send("/save keep\r")
    tty = os.open(f"/proc/{child.pid}/fd/0", os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)  # the terminal, kept open
    try:
        child.kill(signal.SIGTERM)
        deadline = time.monotonic() + SAFETY_NET_S
        while child.isalive():
            assert time.monotonic() < deadline, "the chat did not end"
            time.sleep(0.05)
        attrs = termios.tcgetattr(tty)
        attrs[3] &= ~termios.ICANON  # what is left there, line or not, is readable
        attrs[6][termios.VMIN], attrs[6][termios.VTIME] = 0, 0
        termios.tcsetattr(tty, termios.TCSANOW, attrs)
        try:
            left = os.read(tty, 1024)
        except BlockingIOError:
            left = b""
    finally:
        os.close(tty)
    child.close()
    assert child.exitstatus == 143, (child.exitstatus, child.signalstatus)
    assert left == b"", left
    messages = ChatSession.load("typed").messages
    assert messages[-1]["role"] == "assistant" and messages[-1]["content"], "the partial answer is kept"


def test_ctrl_g_with_an_editor_that_is_not_there_says_so(cli_env: dict[str, str], home: Path) -> None:
    """Ctrl-G with $EDITOR naming no program says so at the prompt (prompt_toolkit opened vi without a word)."""
    env = {k: v for k, v in cli_env.items() if k != "VISUAL"}
    child = spawn({**env, "EDITOR": "/nonexistent/ed"}, "-n", "2")
    child.sendcontrol("g")
    child.expect_exact("the editor $EDITOR names is not found: /nonexistent/ed")
    child.expect_exact(PROMPT)
    leaves(child)


def test_two_chats_resumed_on_one_conversation_both_keep_their_turns(cli: CLI, cli_env: dict[str, str],
                                                                        home: Path) -> None:
    """A chat on a terminal resumed on `shared` while a scripted chat resumed on it too saved a turn: the
    terminal's next save found the file changed since it read it, and kept its turns as `shared-2`, saying so,
    instead of writing over the other chat's turn."""
    chats = home / "data" / "chats"
    r = cli("chat", "shared", "-n", "4", "--temp", "0", input="First question.\n")
    assert r.returncode == 0, r.stderr
    child = spawn(cli_env, "--resume", "shared", "-n", "4", "--temp", "0")
    other = cli("chat", "--resume", "shared", "-n", "4", "--temp", "0", input="From the script.\n")
    assert other.returncode == 0, other.stderr
    said = send(child, "From the terminal.", "shared-2")
    assert "'shared' was saved by another chat since this one read it" in " ".join(said.split()), said
    exits(child)

    def users(name: str) -> list[str]:
        data = json.loads((chats / f"{name}.json").read_text())
        return [m["content"] for m in data["messages"] if m["role"] == "user"]

    assert users("shared") == ["First question.", "From the script."]
    assert users("shared-2") == ["First question.", "From the terminal."]


def test_undo_and_retry_edit_the_saved_conversation_and_the_log_keeps_every_answer(cli: CLI, home: Path) -> None:
    """chat.md: /undo drops the last exchange and /retry the answer it replaces, from the conversation and its
    file; the log keeps them."""
    # greedy, and the retry told to stop sooner: its answer differs from the one it replaces, whatever the model says
    r = cli("chat", "editme", "--temperature", "0", "-n", "4", input="Hi\n/set max_tokens 2\n/retry\nBye\n/undo\n")
    assert r.returncode == 0, r.stderr
    saved = ChatSession.load("editme")
    assert [m["role"] for m in saved.messages] == ["user", "assistant"] and saved.messages[0]["content"] == "Hi"
    with sqlite3.connect(home / "data" / "logs" / "logs.db") as db:
        logged = list(db.execute("SELECT prompt, response FROM responses WHERE conversation_id = ? ORDER BY id",
                                 (saved.log_id,)))
    assert [p for p, _ in logged] == ["Hi", "Hi", "Bye"]
    replaced, retried = logged[0][1], logged[1][1]
    assert replaced != retried and retried, logged
    assert saved.messages[1]["content"] == retried, "the saved conversation keeps the retried answer, not the old one"


def test_load_clear_and_display_settings(cli: CLI) -> None:
    r = cli("chat", "loadme", "-n", "4", input="/set temperature 0.3\n/set top_k 7\nHi\n")
    assert r.returncode == 0, r.stderr
    r = cli("chat", "host", "-n", "4", input="/load loadme\n/show\n/clear\n/context\n/set think off\n"
                                              "/set markdown off\n/show\n")
    assert r.returncode == 0, r.stderr
    assert "continuing loadme: 2 messages" in r.stderr
    assert "temperature 0.3" in r.stderr and "top_k 7" in r.stderr, "/load applies the loaded settings"
    assert "conversation cleared" in r.stderr and "0 messages" in r.stderr
    assert "think off" in r.stderr and "markdown off" in r.stderr
    assert len(ChatSession.load("loadme").messages) == 2, "/clear leaves the conversation it continues as it was"


NO_TEMPLATE = "gemma3:270m has no chat template (it may be a base model): the conversation goes to it as plain text"


def test_a_model_without_template_chats_in_plain_text(cli: CLI, gemma_path: Path) -> None:
    """Gemma 3 270M (a base model: no chat template) continues the conversation as plain text, each line as
    typed: its answer is a raw completion of "Hi\n", said once on stderr."""
    r = cli("chat", "-m", "gemma3:270m", "--temperature", "0", "-n", "8", input="Hi\n")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count(NO_TEMPLATE) == 1 and r.stderr.count("\n") == 1, r.stderr
    raw = cli("run", "-m", "gemma3:270m", "--raw", "--temperature", "0", "-n", "8", "-p", "Hi\n")
    assert raw.returncode == 0 and raw.stdout.strip() and r.stdout.strip() == raw.stdout.strip()
    r = cli("chat", "-m", "gemma3:270m", "--functions", str(ROOT / "tests" / "tool_functions.py"), "--yes",
            input="Hi\n")
    # one error, exit 2 as run's (a line before it said the conversation would go on as plain text; exit 1)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("localgen: error: gemma3:270m has no chat template (it may be a base model), which "
                               "tools need"), r.stderr


def test_switch_model_keeps_conversation(cli: CLI, gemma_path: Path) -> None:
    """`/model` moves the conversation to the other real model (from SmolLM2, which has a template, to Gemma 3
    270M, which continues it as plain text) and keeps every message."""
    r = cli("chat", "switcher", "-n", "6", input="Hi\n/model gemma3:270m\nAgain\n/context\n")
    assert r.returncode == 0, r.stderr
    assert "4 messages" in r.stderr and r.stderr.count(NO_TEMPLATE) == 1, r.stderr
    saved = ChatSession.load("switcher")
    assert saved.model == "gemma3:270m" and [m["role"] for m in saved.messages] == ["user", "assistant"] * 2
    assert saved.messages[2]["content"] == "Again" and saved.messages[3]["content"], "Gemma answered"


def test_localgen_model_never_replaces_a_resumed_or_loaded_conversations_own_model(cli: CLI, gemma_path: Path) -> None:
    """chat.md: --resume and /load take the conversation's own model unless -m is typed; LOCALGEN_MODEL is a default
    (configuration.md), and it replaced that model (a chat saved on Gemma went on on SmolLM2)."""
    r = cli("chat", "own-gemma", "-m", "gemma3:270m", "-n", "4", input="The sky is\n")
    assert r.returncode == 0, r.stderr
    under = CLI({**cli.env, "LOCALGEN_MODEL": "smollm2:135m"})
    r = under("chat", "--resume", "own-gemma", "-n", "4", input="Again\n")
    assert r.returncode == 0 and NO_TEMPLATE in r.stderr, r.stderr
    assert ChatSession.load("own-gemma").model == "gemma3:270m"
    r = under("chat", "-n", "4", input="/load own-gemma\nAnd\n")  # a new chat on SmolLM2, then /load
    assert r.returncode == 0 and r.stderr.count(NO_TEMPLATE) == 1, r.stderr
    saved = ChatSession.load("own-gemma")
    assert saved.model == "gemma3:270m" and len(saved.messages) == 6, saved.messages
    r = under("chat", "--resume", "own-gemma", "-m", "smollm2:135m", "-n", "4", input="Once more\n")  # typed
    assert r.returncode == 0 and NO_TEMPLATE not in r.stderr, r.stderr
    assert ChatSession.load("own-gemma").model == "smollm2:135m"


def test_settings_and_the_system_prompt_are_shown_as_a_user_writes_them(cli: CLI) -> None:
    """/set's answer and /show's settings read as /set takes them (`a|b`, `random`, `15+1.5`, on/off), not as
    Python writes them (('a', 'b'), None, [(15, 1.5)], True); every setting /show lists goes back into /set."""
    r = cli("chat", "-n", "2", input="/set stop a|b\n/set seed random\n/set logit_bias 15+1.5,7-inf\n"
                                     "/set ignore_eos on\n/system\n/show\n")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert {"stop = a|b", "seed = random", "logit_bias = 15+1.5,7-inf", "ignore_eos = on", "system: none"} <= set(lines)
    shown = next(ln for ln in lines if ln.startswith("temperature ") and " · " in ln)
    for python in ("None", "True", "False", "('", "['", "[]", "=", "((", "{"):
        assert python not in shown, (python, shown)
    pairs = [p.split(" ", 1) for p in shown.split(" · ")]
    assert ["stop", "a|b"] in pairs and ["seed", "random"] in pairs and ["logit_bias", "15+1.5,7-inf"] in pairs
    again = "".join(f"/set {k} {v}\n" for k, v in pairs if k != "dry_sequence_breaker")  # its \n is shown escaped
    r2 = cli("chat", "-n", "2", input=again + "/show\n")
    assert r2.returncode == 0, r2.stderr
    assert next(ln for ln in r2.stderr.splitlines() if ln.startswith("temperature ") and " · " in ln) == shown


def test_bad_input_in_scripted_chat_is_an_error(cli: CLI) -> None:
    r = cli("chat", "-n", "4", input="/set temperature hot\n")
    assert r.returncode == 2 and "takes a number" in r.stderr
    r = cli("chat", "--resume", "no-such-chat", input="hi\n")
    assert r.returncode == 1 and "no saved conversation named" in r.stderr
    r = cli("chat", "bad/name", input="hi\n")
    assert r.returncode == 2 and "bad conversation name" in r.stderr
    r = cli("chat", ".hidden", input="hi\n")  # a name may not begin with '.': the error says so
    assert r.returncode == 2, r.stderr
    assert r.stderr == ("localgen: error: bad conversation name '.hidden': use at most 64 ASCII letters, digits, '.', "
                        "'_' or '-', beginning with a letter or digit\n"), r.stderr


def test_a_columns_no_terminal_has_is_ignored(cli_env: dict[str, str]) -> None:
    """COLUMNS=99999999999 (a positive whole number) was taken as a width, and Rich's allocation of it was a
    MemoryError traceback from `localgen --help`; past 10,000 it is ignored too."""
    import subprocess

    r = subprocess.run([sys.executable, "-m", "localgen", "--help"], env={**cli_env, "COLUMNS": "99999999999"},
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0 and "Traceback" not in r.stderr and "Usage" in r.stdout, r.stderr


def test_a_conversation_name_takes_ascii_letters_only(cli_in_process: InProcessCLI) -> None:
    """chat.md: a NAME's letters are ASCII (A-Z, a-z): `café` is a usage error (the docs said "letters")."""
    r = cli_in_process("chat", "caf\u00e9", input="hi\n")
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr.startswith("localgen: error: bad conversation name 'caf\u00e9': use at most 64 ASCII letters"), \
        r.stderr


def test_corrupt_save_is_reported_and_kept(cli: CLI, home: Path) -> None:
    path = home / "data" / "chats" / "broken.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"messages": [')
    try:
        r = cli("chat", "--resume", "broken", input="hi\n")
        assert r.returncode == 1 and "unreadable" in r.stderr
        assert path.read_text() == '{"messages": [', "a user's file is never overwritten or removed"
    finally:  # the home is the session's: `chat --list` elsewhere would warn of it
        path.unlink()


def test_interrupted_save_keeps_the_previous_one(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = ChatSession(name="atomic", model="smollm2:135m")
    s.add("user", "first")
    s.save()
    s.add("user", "second")

    def crash(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", crash)  # the new content written, never made durable: the save fails there
    with pytest.raises(OSError):
        s.save()
    monkeypatch.undo()
    assert [m["content"] for m in ChatSession.load("atomic").messages] == ["first"]
    assert not list(s.path.parent.glob(".atomic*")), "no temporary file is left behind"


def test_chat_turns_reuse_the_kv_cache(smollm2_engine: Any) -> None:
    from localgen.chat.runner import ChatRunner
    from localgen.engine.local import LocalBackend
    from localgen.engine.tokens import reusable_prefix
    from localgen.tools.loop import Turn
    from localgen.types import SamplingParams

    runner = ChatRunner(ChatSession(name="kv-test", model="x"), LocalBackend(smollm2_engine),
                        SamplingParams(temperature=0, max_tokens=8))
    runner.session.save = lambda: Path()  # type: ignore[method-assign]
    stats = []
    long = "Hi there. " + "I am planning a walk along a river, past its mills and bridges, to a lake. " * 8
    for text in [long, "What is a river?", "And a lake?"]:
        runner.start(text)
        turn = runner.reply(lambda event: None, lambda call: False, Turn())
        runner.record(turn)
        stats.append(turn.generations[-1].stats)
    kv = smollm2_engine.kv
    for prev, cur in itertools.pairwise(stats):
        # the earlier turns' prompt comes from the cache, but the rows a fresh evaluation computes otherwise
        # and the answer generated after it (engine/tokens.py, reusable_prefix)
        p = prev.prompt_tokens
        assert cur.cached_tokens == reusable_prefix(p, p, cur.prompt_tokens, kv.n_ubatch, kv.n_batch) > 64
        assert cur.prompt_tokens - cur.cached_tokens < 100, "little more than the new turn is evaluated"


def test_plain_view_shows_or_hides_thinking_and_puts_calls_on_the_notice_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    from localgen.tools.loop import ToolResult
    from localgen.tools.spec import ToolCall
    from localgen.tools.stream import Piece

    notices: list[str] = []
    events = [Piece("reasoning", "secret reasoning"), Piece("content", "Visible"),
              ToolCall("add", '{"a": 1}'), ToolResult(ToolCall("add", '{"a": 1}'), "2"), Piece("content", "Done")]
    for think in (False, True):
        view = PlainView(sys.stdout, show_think=think, notice=notices.append)
        for event in events:
            view.show(event)
        view.finish()
    hidden, shown = capsys.readouterr().out.split("Done\n")[:2]
    assert hidden == "Visible\n"
    assert shown == "[thinking]\nsecret reasoning\n[/thinking]\nVisible\n"
    assert notices == ['tool call: add({"a": 1})', "tool result: 2"] * 2


def test_split_blocks_never_splits_inside_code_fences() -> None:
    text = "Intro\n\n```py\nx = 1\n\ny = 2\n```\n\nTail being written"
    done, current = split_blocks(text)
    assert done.endswith("```\n\n") and current == "Tail being written"
    done, current = split_blocks("Intro\n\n```py\nx = 1\n\ny")
    assert done == "Intro\n\n"


MARKDOWN_ANSWERS = [
    "First paragraph, long enough to wrap on a narrow screen of forty columns.\n\nSecond one.\n\nThird.",
    "Steps:\n\n1. Boil water.\n\n2. Add tea.\n\n3. Wait.\n\nDone.",
    "Tight list:\n\n- a\n- b\n\nAfter it.",
    "# Title\n\nText under it.\n\n## Part\n\nMore text.",
    "Code:\n\n```py\nx = 1\n\ny = 2\n```\n\nAfter the code.",
    "Above.\n\n---\n\nBelow the rule.\n\n> A quote.\n\nThe end.",
    "A poem:\n\nRoses are red,\nViolets are blue,\nSugar is sweet.\n\nThe end.",
]


def test_the_block_being_written_is_redrawn_at_most_12_times_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    """chat.md: the block being written is re-rendered at most 12 times a second. Pieces arrive every 0.01 s of a
    fake clock (no real time passes): in each second of it the live region is redrawn 12 times at most (13 where
    a redraw falls on both ends of the second), and it is redrawn."""
    import io
    import types

    from rich.console import Console

    from localgen.cli.chat import render
    from localgen.tools.stream import Piece

    now = [1000.0]
    monkeypatch.setattr(render, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    view = render.RichView(Console(file=io.StringIO(), width=40, height=30, force_terminal=True,
                                   force_interactive=True, color_system=None), show_think=True)
    redraws: list[float] = []
    redraw = view._refresh
    monkeypatch.setattr(view, "_refresh", lambda: (redraws.append(now[0]), redraw())[1])
    for i in range(300):  # 3 fake seconds
        view.show(Piece("content", f"word{i} "))
        now[0] += 0.01
    view.finish()
    per_second = [sum(1 for t in redraws if s <= t - 1000.0 < s + 1) for s in range(3)]
    assert all(1 <= n <= 13 for n in per_second), (per_second, redraws)


@pytest.mark.parametrize("answer", MARKDOWN_ANSWERS)
def test_a_streamed_answer_ends_on_screen_as_the_whole_answer_renders(answer: str) -> None:
    """Streamed a few characters at a time, each block printed for good as it ends, an answer leaves the screen
    as the whole answer rendered at once does: the same lines, spaced the same."""
    from rich.console import Console

    from localgen.cli.chat.render import RichView, chat_markdown
    from localgen.tools.stream import Piece

    def console(screen: terminal.Screen) -> Console:
        return Console(file=screen, width=40, height=30, force_terminal=True, force_interactive=True,
                       color_system=None, highlight=False)

    streamed = terminal.Screen((30, 40), onlcr=True)
    view = RichView(console(streamed), show_think=True)
    view.REFRESH_S = 0  # the live region redrawn at every piece
    for i in range(0, len(answer), 3):
        view.show(Piece("content", answer[i:i + 3]))
    view.finish()
    whole = terminal.Screen((30, 40), onlcr=True)
    console(whole).print(chat_markdown(answer))
    assert streamed.rows() == whole.rows(), "\n".join(streamed.rows())
    if "Roses" in answer:  # single line breaks are kept, as chat pages keep them (Markdown would join the lines)
        assert [r.strip() for r in streamed.rows() if r.strip()][1:4] == ["Roses are red,", "Violets are blue,",
                                                                          "Sugar is sweet."], streamed.rows()


def test_set_verbose_off_hides_the_footer_and_on_shows_it_again(cli_env: dict[str, str]) -> None:
    """chat.md: after each answer a footer shows tokens, tok/s, ... (`/set verbose off` hides it)."""
    child = spawn(cli_env, "-n", "4", "--temp", "0")
    send(child, "Hi", r"tok/s")
    send(child, "/set verbose off", r"verbose off")
    child.sendline("Hello again.")
    child.expect_exact("Hello again.")  # the echo of the message
    child.expect_exact(PROMPT)
    answer = str(child.before)  # the answer, and the footer if there were one
    assert answer.strip() and "tok/s" not in answer and "context " not in answer, answer
    send(child, "/set verbose on", r"verbose on")
    send(child, "Bye.", r"tok/s · first token [\d.]+ s · context [\d,]+/")
    exits(child)


def test_ctrl_c_in_a_scripted_chat_keeps_the_answer_and_ends_the_script(cli_env: dict[str, str],
                                                                         tmp_path: Path) -> None:
    """`localgen chat < messages.txt`: Ctrl-C stops the answer under way, keeps it (saved), and ends the script
    with "interrupted" and exit 130, as it ends `run --file`; the messages after it are not sent (Ctrl-C only
    stopped one answer, and the script went on)."""
    import signal
    import subprocess

    env = {**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")}
    p = subprocess.Popen(CLI(env).argv("chat", "-n", "3000", "--temp", "0"), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    assert p.stdin is not None and p.stdout is not None and p.stderr is not None
    p.stdin.write("Write a very long essay about the history of rivers.\nAnd now about lakes.\n")
    p.stdin.close()
    first = p.stdout.readline()  # the answer is streaming (3,000 tokens take far longer)
    p.send_signal(signal.SIGINT)
    out, err = first + p.stdout.read(), p.stderr.read()
    assert p.wait(SAFETY_NET_S) == 130, err
    assert err.endswith("(stopped; the partial answer is kept)\ninterrupted\n"), err
    saved = list((tmp_path / "home" / "data" / "chats").glob("*.json"))
    assert len(saved) == 1, err
    messages = json.loads(saved[0].read_text())["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"], messages
    assert out.startswith(messages[1]["content"].rstrip("\n")[:20]) and messages[1]["content"], (out, messages)


def test_read_checks_the_size_before_reading_and_names_a_bad_byte_line(cli_env: dict[str, str],
                                                                        tmp_path: Path) -> None:
    """/read reads at most one byte past its 1 MiB bound: an 8 GiB file is refused at once (it was read whole: a
    MemoryError traceback, or the machine's memory); a file that is not UTF-8 is named with its line, as -f's is."""
    import resource
    import subprocess

    env = {**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")}

    def limited() -> None:  # the old reader stops at this bound instead of at the machine's memory
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    huge = tmp_path / "huge.txt"
    with huge.open("wb") as f:
        f.truncate(8 << 30)  # sparse: no disk spent
    r = subprocess.run(CLI(env).argv("chat", "-n", "4"), input=f"/read {huge}\nHi\n", capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=SAFETY_NET_S, preexec_fn=limited)
    assert r.returncode == 1 and r.stdout == "", r.stderr
    assert r.stderr == f"localgen: error: {huge} is larger than 1 MiB\n", r.stderr
    bad = tmp_path / "notes.txt"
    bad.write_bytes(b"first line\ncaf\xe9\n")
    r = CLI(env)("chat", "-n", "4", input=f"/read {bad}\nHi\n")
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr == f"localgen: error: {bad} is not UTF-8 text: byte 0xe9 on line 2 is not UTF-8\n", r.stderr


@pytest.mark.parametrize("what", ["FIFO", "device", "folder"])
def test_read_refuses_what_is_not_a_file_without_opening_it(cli_env: dict[str, str], tmp_path: Path,
                                                             what: str) -> None:
    """/read of a FIFO is one error line, never a hang (it was opened, and the open waited for a writer forever, deaf
    to SIGTERM); a device (/dev/zero) or a folder is refused the same way, before it is opened."""
    import os

    path = {"FIFO": tmp_path / "f", "device": Path("/dev/zero"), "folder": tmp_path}[what]
    if what == "FIFO":
        os.mkfifo(path)
    r = CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")})("chat", "-n", "2", input=f"/read {path}\nhi\n")
    assert r.returncode == 1 and r.stdout == "", r.stderr
    assert r.stderr == f"localgen: error: cannot read {path}: it is a {what} (/read takes a regular file)\n", r.stderr


@pytest.mark.parametrize("what", ["FIFO", "device"])
def test_image_refuses_what_is_not_a_file_without_opening_it(cli_env: dict[str, str], tmp_path: Path,
                                                              what: str) -> None:
    """/image of a FIFO is one error line, never a hang (media.read opened it, and the open waited for a writer
    forever, deaf to SIGTERM); a device (/dev/zero, 20 MiB read to refuse it) is refused the same way, unopened."""
    import os

    path = {"FIFO": tmp_path / "f", "device": Path("/dev/zero")}[what]
    if what == "FIFO":
        os.mkfifo(path)
    r = CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")})("chat", "-n", "2", input=f"/image {path}\nhi\n")
    assert r.returncode == 1 and r.stdout == "", r.stderr
    wanted = f"localgen: error: cannot read {path}: it is a {what} (/image takes a regular file or a URL)\n"
    assert r.stderr == wanted, r.stderr


def test_a_scripted_message_past_64_mib_is_refused_without_reading_it_whole(cli_env: dict[str, str],
                                                                            tmp_path: Path) -> None:
    """`chat < /dev/zero` (one line that never ends): a message is bounded as run's prompt is, and read only one
    character past the bound (the line was read whole: a MemoryError traceback, or the machine's memory)."""
    import resource
    import subprocess

    env = {**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")}

    def limited() -> None:  # the old reader stops at this bound instead of at the machine's memory
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    with open("/dev/zero", "rb") as zero:
        r = subprocess.run(CLI(env).argv("chat", "-n", "4"), stdin=zero, capture_output=True, text=True, env=env,
                           cwd=ROOT, timeout=SAFETY_NET_S, preexec_fn=limited)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr == ("localgen: error: a message on stdin is larger than 64 MiB: more text than any context "
                        "window holds\n"), r.stderr



def test_ctrl_d_inside_a_triple_quoted_block_sends_it(cli_env: dict[str, str], home: Path) -> None:
    """chat.md: Ctrl-D inside a `\"\"\"` block ends it as a closing `\"\"\"` would, the lines typed sent as one message
    (an empty block is dropped); on an empty prompt it still leaves. It did nothing: prompt_toolkit's Ctrl-D
    deletes the character under the cursor, and at the end of the text there is none."""
    screen = terminal.Screen(SCREEN)
    child = spawn(cli_env, "ctrl-d-block", "-n", "8", "--temp", "0", log=screen)
    child.send('"""\rSay hi.\rThen stop.')
    wait_until(child, lambda: any(row.strip().endswith("Then stop.") for row in screen.rows()))
    child.sendcontrol("d")
    child.expect("tok/s", timeout=120)  # answered: on the old code Ctrl-D did nothing, and no answer came
    child.expect_exact(PROMPT)
    child.send('"""\r')  # an empty block: dropped, the prompt comes again
    wait_until(child, lambda: any(row.strip() == "..." for row in screen.rows()))  # the block's second line
    child.sendcontrol("d")
    send(child, "/show", "conversation ctrl-d-block")  # at a prompt of its own (not inside the block)
    child.sendcontrol("d")  # an empty prompt: leaves
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    saved = json.loads((home / "data" / "chats" / "ctrl-d-block.json").read_text())["messages"]
    assert [m["content"] for m in saved if m["role"] == "user"] == ["Say hi.\nThen stop."], saved


def _command_runs(child: Any) -> None:
    """Wait until the prompt has let go of the terminal (ISIG on: a Ctrl-C is a signal again, not a key of the
    prompt's): the line sent is being handled."""
    import os
    import termios

    tty = os.open(f"/proc/{child.pid}/fd/0", os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
    try:
        deadline = time.monotonic() + 60
        while not termios.tcgetattr(tty)[3] & termios.ISIG:
            assert time.monotonic() < deadline, "the prompt never let go of the terminal"
            time.sleep(0.005)
    finally:
        os.close(tty)


def test_ctrl_c_while_model_loads_stops_the_command_and_the_chat_goes_on(cli_env: dict[str, str],
                                                                         home: Path) -> None:
    """docs/chat.md, Ctrl-C: pressed while /model loads another model, it stops the command in one line and the
    chat goes on with the model it had (it said "the message was taken back" of no message, then ended with a
    traceback: UnboundLocalError)."""
    screen = terminal.Screen(SCREEN)
    child = spawn(cli_env, "switching", "-n", "4", "--temp", "0", log=screen)
    child.sendline("/model gemma3:270m")
    _command_runs(child)
    child.sendintr()
    child.expect_exact("(Ctrl-C stopped /model before it finished)")
    assert "taken back" not in str(child.before), child.before
    said = next(row for row in screen.rows() if "(Ctrl-C stopped" in row)
    assert said.startswith("(Ctrl-C stopped /model"), said  # over the echoed `^C` (it read `^C(Ctrl-C stopped`)
    child.expect_exact(PROMPT)
    send(child, "Say hi.", r"tok/s")
    leaves(child)
    saved = json.loads((home / "data" / "chats" / "switching.json").read_text())
    assert "gemma" not in saved["model"] and saved["messages"][0]["content"] == "Say hi.", saved


# `localgen chat ARGS` whose first Enter is followed by a Ctrl-C the moment the terminal's ISIG is back on: as the
# prompt ends its raw mode, the process sends itself SIGINT, as the terminal does at a press then
AS_ENTER = ("import os, signal, sys, termios\nreal = termios.tcsetattr\nfired = []\n"
            "def tcsetattr(fd, when, attrs):\n    was = termios.tcgetattr(fd)[3] & termios.ISIG\n"
            "    real(fd, when, attrs)\n"
            "    if not was and attrs[3] & termios.ISIG and not fired:\n        fired.append(1)\n"
            "        os.kill(os.getpid(), signal.SIGINT)\n"
            "termios.tcsetattr = tcsetattr\nfrom localgen.cli.main import main\n"
            "sys.argv = ['localgen', *sys.argv[1:]]\nsys.exit(main())\n")


def test_ctrl_c_as_enter_is_taken_stops_the_command_it_starts(cli_env: dict[str, str], home: Path) -> None:
    """docs/chat.md, Ctrl-C: pressed as Enter is taken (the prompt still ending, the terminal's ISIG back on), it
    stops what the line starts, and the chat goes on with the model it had. prompt_toolkit's own SIGINT handler,
    still in place then, swallowed the press and /model loaded on (now and then in the test above, which presses
    as soon as it sees ISIG on); a moment later it stopped the prompt, and the line was dropped unrun."""
    env = {k: v for k, v in cli_env.items() if k != "NO_COLOR"}
    env.update(TERM="xterm", PROMPT_TOOLKIT_NO_CPR="1")
    child = pexpect.spawn(sys.executable, ["-c", AS_ENTER, "chat", "as-enter", "-n", "4", "--temp", "0"], env=env,
                          cwd=str(ROOT), encoding="utf-8", timeout=60, dimensions=SCREEN, preexec_fn=default_sigint)
    child.expect("ready in")
    child.expect_exact(PROMPT)
    child.sendline("/model gemma3:270m")
    child.expect_exact("(Ctrl-C stopped /model before it finished)")
    child.expect_exact(PROMPT)
    send(child, "/show", r"model smollm2:135m")
    leaves(child)


def test_two_ctrl_c_while_a_long_message_is_read_in_take_it_back_once(cli_env: dict[str, str],
                                                                      tmp_path: Path) -> None:
    """docs/chat.md, Ctrl-C: a second press while a long message is read in does what one does (the first has
    stopped the read-in where it was): the message is taken back once, and the chat goes on."""
    from tests.test_chat_attach_back import answering

    lcli = CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")})
    big = tmp_path / "big.txt"  # some 2,800 tokens, read in pieces of 16
    big.write_text("".join(f"Line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(200)))
    child = spawn(lcli.env, "twice", "-n", "4", "--temperature", "0", "--batch-size", "16", "--no-prompt-cache")
    child.sendline(f"/read {big}")
    child.expect_exact("will be sent with your next message")
    child.expect_exact(PROMPT)
    child.sendline("Summarize.")
    answering(child)
    child.sendintr()
    time.sleep(0.05)
    child.sendintr()
    child.expect_exact("the message was taken back")
    child.expect_exact(PROMPT)
    shown = str(child.before)
    send(child, "/detach", "dropped 1 attachment")
    send(child, "Say hi.", r"tok/s")
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert "taken back" not in shown and "Traceback" not in shown, shown
    saved = json.loads((tmp_path / "home" / "data" / "chats" / "twice.json").read_text())
    assert [m["content"] for m in saved["messages"] if m["role"] == "user"] == ["Say hi."], saved


def test_help_in_a_scripted_chat_lists_the_commands_and_no_keys(cli: CLI) -> None:
    """Scripted, lines are messages: /help lists the /commands, and not the terminal's keys (Alt-Enter, Ctrl-G)."""
    r = cli("chat", "-n", "1", input="/help\n")
    assert r.returncode == 0, r.stderr
    assert "/exit" in r.stderr and "/compact" in r.stderr
    assert all(alias in r.stderr for alias in ("/bye", "/quit", "/?")), r.stderr  # each name it takes
    assert "Alt-Enter" not in r.stderr and "Ctrl-G" not in r.stderr, r.stderr


def test_a_terminal_that_takes_no_escape_codes_gets_no_bracketed_paste_codes(cli_env: dict[str, str]) -> None:
    """TERM=dumb (Emacs' shell, a serial console): the held terminal asks for no bracketed paste around an answer
    (`\x1b[?2004h` and `\x1b[?2004l` showed there as text)."""
    import io

    env = {k: v for k, v in cli_env.items() if k != "NO_COLOR"}
    env.update(TERM="dumb", PROMPT_TOOLKIT_NO_CPR="1")
    child = terminal.spawn(env, ["chat", "dumbterm", "-n", "6", "--temp", "0"], timeout=60, dimensions=SCREEN)
    child.logfile_read = shown = io.StringIO()
    child.expect("ready in")
    child.sendline("Hi.")
    child.expect("tok/s")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0 and "Hi." in shown.getvalue(), shown.getvalue()
    assert "\x1b[?2004" not in shown.getvalue(), shown.getvalue()


def test_context_after_a_resume_counts_the_window_the_next_prompt_sends(cli: CLI, home: Path) -> None:
    """/context on a resumed (or /load-ed) conversation counted its whole saved history ("8,505 of 256 tokens used
    (3322 %)"), the window being worked out only as a message was sent; it is the window the next prompt sends."""
    s = ChatSession(name="ctx-resumed", model="smollm2:135m")
    for i in range(100):
        s.add("user", f"Tell me about the number {i}.")
        s.add("assistant", f"The number {i} comes after {i - 1} and before {i + 1}.")
    s.save()
    try:
        for args, script in ((("--resume", "ctx-resumed"), "/context\n"), ((), "/load ctx-resumed\n/context\n")):
            r = cli("chat", *args, "--ctx", "256", "-n", "16", input=script)
            assert r.returncode == 0, r.stderr
            told = re.search(r"([\d,]+) of 256 tokens used \((\d+) %\).* · 200 messages \((\d+) in the window\)",
                             r.stderr)
            assert told is not None, r.stderr
            used, share, sent = (int(n.replace(",", "")) for n in told.groups())
            assert used <= 256 - 16 and share < 100 and 0 < sent < 200, r.stderr
    finally:  # the home is the session's: `chat --list` elsewhere would list it
        (home / "data" / "chats" / "ctx-resumed.json").unlink()


def test_a_burst_of_ctrl_c_as_an_answer_stops_never_cuts_its_save_short(home: Path, capsys: Any) -> None:
    """Ctrl-C pressed again and again to stop an answer (a burst, each press 30 ms apart): one that came once the
    answer had stopped, as its turn was saved, raised inside the save, which wrote nothing; /show counted the turn,
    and /exit and --resume lost it (the log had it). The press now leaves the save whole, and the line saying the
    answer was stopped still comes."""
    from types import SimpleNamespace

    from localgen.chat.runner import ChatRunner
    from localgen.cli.chat import turn as chat_turn
    from localgen.cli.chat.view import ChatView
    from localgen.types import SamplingParams

    session = ChatSession(name="burst", model="smollm2:135m")
    session.add("user", "Hi")
    runner = ChatRunner(session, SimpleNamespace(n_ctx=512), SamplingParams())  # type: ignore[arg-type]
    real_save = session.save

    def reply(show: Any, approve: Any, turn: Any) -> None:
        turn.messages.append({"role": "assistant", "content": "Hel"})
        os.kill(os.getpid(), signal.SIGINT)  # the first press: the answer stops there

    def save() -> Any:
        os.kill(os.getpid(), signal.SIGINT)  # the burst goes on while the turn is saved
        return real_save()

    runner.reply = reply  # type: ignore[method-assign]
    session.save = save  # type: ignore[method-assign]
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as the chat has it (a background job's
    try:  # pytest ignores SIGINT)
        assert chat_turn.stream(runner, ChatView(interactive=True, plain=True, stats=False), 0) is False
        assert [m["content"] for m in ChatSession.load("burst").messages] == ["Hi", "Hel"]
        assert "(stopped; the partial answer is kept)" in capsys.readouterr().out
        # scripted: a press that came only as the (whole) answer was saved still ends the script, 130, the save
        # whole; the press was counted and forgotten, and the script answered its next message
        session.add("user", "Again")
        runner.reply = lambda show, approve, turn: turn.messages.append(  # type: ignore[method-assign]
            {"role": "assistant", "content": "Hello"})
        with pytest.raises(KeyboardInterrupt):
            chat_turn.stream(runner, ChatView(interactive=False, plain=True, stats=False), 0)
        assert [m["content"] for m in ChatSession.load("burst").messages] == ["Hi", "Hel", "Again", "Hello"]
    finally:  # the home is the session's: `chat --list` elsewhere would list it
        signal.signal(signal.SIGINT, previous)
        session.path.unlink(missing_ok=True)


def test_a_refused_load_leaves_the_chat_with_the_conversation_it_had(cli_env: dict[str, str], home: Path) -> None:
    """docs/chat.md: a command that fails changes nothing. /load of a conversation holding a picture, with a model
    that reads text only, said so, yet the chat went on with the refused conversation: every message failed, and
    /undo took an exchange out of the refused file."""
    chats = home / "data" / "chats"
    chats.mkdir(parents=True, exist_ok=True)
    picture = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
               {"type": "text", "text": "What is this?"}]
    held = chats / "with-picture.json"
    held.write_text(json.dumps({"model": "smollm2:135m", "messages": [
        {"role": "user", "content": picture}, {"role": "assistant", "content": "A picture."}]}))
    before = held.read_bytes()
    child = spawn(cli_env, "refused-load", "-n", "4", "--temp", "0")
    send(child, "Hello.", r"tok/s")
    send(child, "/load with-picture", "the conversation with-picture holds images or audio, and smollm2:135m "
                                      "reads text only")
    send(child, "/show", "conversation refused-load")
    send(child, "Again.", r"tok/s")
    send(child, "/undo", "dropped")
    leaves(child)
    assert held.read_bytes() == before
    saved = json.loads((chats / "refused-load.json").read_text())
    assert saved["messages"][0]["content"] == "Hello." and len(saved["messages"]) == 2, saved


def test_ctrl_z_at_the_prompt_puts_no_control_character_in_the_message(cli_env: dict[str, str], home: Path) -> None:
    """Ctrl-Z at the prompt put a raw 0x1A into the line, sent to the model and saved; it suspends the chat now, as
    during an answer (here, a process group with no shell above it, the terminal's stop is ignored: the line goes
    on without the character)."""
    child = spawn(cli_env, "ctrl-z", "-n", "2", "--temp", "0")
    child.send("ab")
    child.sendcontrol("z")
    send(child, "cd", r"tok/s")
    leaves(child)
    saved = json.loads((home / "data" / "chats" / "ctrl-z.json").read_text())
    assert saved["messages"][0]["content"] == "abcd", saved["messages"][0]


def test_help_rows_wrap_under_their_text_on_a_narrow_terminal() -> None:
    """/help at 100 columns wrapped /set's row at the terminal's edge, its rest at column 0 (`/ compact`, read as a
    command); a row goes on under its text, the names' column left clear."""
    import io

    from rich.console import Console

    from localgen.cli.chat import slash
    from localgen.cli.chat.repl import COMMANDS
    from localgen.cli.chat.view import ChatView

    view = ChatView(interactive=True, plain=True, stats=False)
    out = io.StringIO()
    view.console = Console(file=out, width=100, color_system=None, soft_wrap=False)
    slash._help(None, view, "")
    lines = out.getvalue().splitlines()
    assert all(len(line) <= 100 for line in lines), lines
    names = [line.split()[0] for line in lines if line and not line.startswith(" ")]
    assert names[:len(COMMANDS)] == list(COMMANDS), lines
    assert any(line.startswith(" " * 10) and "compact" in line for line in lines), lines
