"""Keys typed while a chat answer streams reach the next prompt as the keys they were: Alt-Enter (ESC CR) typed
ahead is a new line in the next message, as at an idle prompt, not Enter that sends half of it."""

from __future__ import annotations

import json
from pathlib import Path

import pexpect

from tests import terminal
from tests.conftest import SAFETY_NET_S
from tests.test_chat import LETTER, PROMPT, SCREEN, paragraphs_shown, spawn, wait_until


def test_alt_enter_typed_while_an_answer_streams_is_a_new_line(cli_env: dict[str, str], home: Path) -> None:
    """`foo`, Alt-Enter, `bar` typed during an answer, then Enter at the next prompt: one message `foo\\nbar`.
    The terminal's cooked mode used to turn the typed-ahead CR into LF (ICRNL), which the prompt reads as Enter:
    `foo` was sent and answered alone."""
    screen = terminal.Screen(SCREEN)
    child = spawn(cli_env, "typeahead", "-n", "200", "--ignore-eos", "--temp", "0", log=screen)
    child.sendline(LETTER)
    child.expect_exact("\x1b[?2004l")  # the prompt's last word to the terminal: what follows is the answer
    wait_until(child, lambda: bool(paragraphs_shown([*screen.rows(), "tok/s"], LETTER)))  # it streams
    child.send("foo\x1b\rbar")
    assert not any("tok/s" in row for row in screen.rows()), "the keys went in while the answer streamed"
    child.expect("tok/s", timeout=SAFETY_NET_S)
    wait_until(child, lambda: any(row.startswith("bar") or row.endswith(" bar") for row in screen.rows()))
    child.send("\r")
    child.expect("tok/s", timeout=SAFETY_NET_S)
    child.expect_exact(PROMPT)
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    messages = json.loads((home / "data" / "chats" / "typeahead.json").read_text())["messages"]
    assert [m["content"] for m in messages if m["role"] == "user"] == [LETTER, "foo\nbar"], \
        "\n".join(screen.rows())


def test_a_paste_while_an_answer_streams_is_one_message(cli_env: dict[str, str], home: Path) -> None:
    """The held terminal asks for bracketed paste while the answer streams (as the prompt does), so a terminal marks
    a paste made then; the next prompt takes the marked lines as one paste: one message with its newlines, not a
    message sent at each line (the terminal, asked for nothing, sent the paste's lines as Enter-ended lines)."""
    screen = terminal.Screen(SCREEN)
    child = spawn(cli_env, "pasted", "-n", "200", "--ignore-eos", "--temp", "0", log=screen)
    child.sendline(LETTER)
    child.expect_exact("\x1b[?2004l")  # the prompt's last word to the terminal: what follows is the answer's
    child.expect_exact("\x1b[?2004h")  # the answer's screen asks for marked pastes: before the answer ends
    assert "tok/s" not in child.before, "bracketed paste came back on only at the next prompt"
    wait_until(child, lambda: bool(paragraphs_shown([*screen.rows(), "tok/s"], LETTER)))  # it streams
    child.send("\x1b[200~Q1 hello\rQ2 hello\rQ3 hello\x1b[201~")  # as a terminal sends a paste it marks
    child.expect("tok/s", timeout=SAFETY_NET_S)
    wait_until(child, lambda: any(row.endswith("Q3 hello") for row in screen.rows()))
    child.send("\r")
    child.expect("tok/s", timeout=SAFETY_NET_S)
    child.expect_exact(PROMPT)
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    messages = json.loads((home / "data" / "chats" / "pasted.json").read_text())["messages"]
    assert [m["content"] for m in messages if m["role"] == "user"] == [LETTER, "Q1 hello\nQ2 hello\nQ3 hello"], \
        "\n".join(screen.rows())
