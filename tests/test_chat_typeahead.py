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


def test_tab_completes_a_command_or_a_setting_with_the_space_its_argument_follows() -> None:
    """chat.md: Tab completes /commands and /set names. A red team's: `/lo<Tab>ha` typed `/loadha`, and
    `/set seed<Tab>5` `/set seed5`: the completion ends with the space, as a shell's does; a value does not."""
    from prompt_toolkit.completion import CompleteEvent
    from prompt_toolkit.document import Document

    from localgen.cli.chat.repl import make_completer

    completer = make_completer(["seed", "temperature"], lambda: ["hat"], lambda: ["smollm2:135m"])

    def complete(text: str) -> list[str]:
        return [c.text for c in completer.get_completions(Document(text, len(text)), CompleteEvent())]

    assert complete("/lo") == ["/load "]
    assert complete("/set se") == ["seed "]
    assert complete("/set think o") == ["on", "off"]
    assert complete("/load h") == ["hat"] and complete("/model smol") == ["smollm2:135m"]
