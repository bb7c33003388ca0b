"""`chat` with tools and reasoning, scripted and on a terminal: each call asked for (y / n / always) and shown,
a failing tool taking the question back, `--yes` for a scripted chat, reasoning saved apart and folded on a
terminal. SmolLM2 with Qwen2.5's template and the stdio MCP server of tests/mcp_server.py."""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pexpect
import pytest

from tests import terminal
from tests.conftest import CLI, InProcessCLI
from tests.test_tools import MCP, QWEN, R1, _only

CHAT_TOOLS = ("-m", "smollm2:135m", "--chat-template-file", str(QWEN), "--temperature", "0", "-n", "40")


@pytest.fixture(scope="module")
def scripted_add(cli: CLI, home: Path) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """A scripted chat (`scripted-tools`) whose turn calls add on the MCP server: what it printed, and the
    roles saved right after it (another test resumes the conversation, which adds to it)."""
    from localgen.chat.session import ChatSession

    r = cli("chat", "scripted-tools", *CHAT_TOOLS, "--mcp", MCP, "--yes", "--tool-choice", "add", "--stats",
            input="What is 2 + 3?\n")
    return r, [m["role"] for m in ChatSession.load("scripted-tools").messages] if r.returncode == 0 else []


def test_chat_on_a_terminal_asks_before_each_call_and_shows_the_result(cli_env: dict[str, str], home: Path) -> None:
    from localgen.chat.session import ChatSession
    from tests.test_chat import PROMPT, send, spawn

    child = spawn(cli_env, "toolchat", *CHAT_TOOLS, "--mcp", MCP, "--tool-choice", "add")
    child.sendline("What is 2 + 3?")
    child.expect(r"tool call: add\((\{.*?\})\)")
    args = json.loads(child.match.group(1))
    child.expect_exact("[y]es / [n]o / [a]lways for add:")
    child.sendline("yCompute 4 + 4 please")  # a question typed at the wrong prompt neither runs nor declines
    child.expect_exact("answer y, n or a (Enter declines)")
    child.expect_exact("[y]es / [n]o / [a]lways for add:")
    child.sendline("Y")
    child.expect(r"\A ?Y\r\n")  # the terminal echoes the reply: the echo, off while the answer streams, is back
    child.expect(r"tool result: (\d+)")
    assert int(child.match.group(1)) == args["a"] + args["b"]
    child.expect(r"1 tool call · ")
    child.expect_exact(PROMPT)
    child.sendline("And 4 + 4?")
    child.expect_exact("[y]es / [n]o / [a]lways for add:")
    child.sendline("n")
    child.expect_exact("tool add: declined")
    child.expect_exact("1 tool call (1 declined) · ")
    child.expect_exact(PROMPT)
    child.sendline("And 5 + 5?")
    child.expect_exact("[y]es / [n]o / [a]lways for add:")
    child.sendline("a")
    child.expect("tool result: ")
    child.expect_exact(PROMPT)
    child.sendline("And 6 + 6?")
    child.expect(r"tool call: add\(")
    assert child.expect([r"tool result: ", r"\[y\]es / \[n\]o"]) == 0, "always: no second question for add"
    child.expect_exact(PROMPT)
    send(child, "/tools", r"add\(a, b\) \(runs without asking\)")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    messages = ChatSession.load("toolchat").messages
    assert [m["role"] for m in messages[:4]] == ["user", "assistant", "tool", "assistant"]
    call = messages[1]["tool_calls"][0]
    assert call["function"]["name"] == "add" and messages[2]["tool_call_id"] == call["id"]
    assert messages[2]["content"] == str(args["a"] + args["b"])
    assert messages[6]["content"] == "The user declined to run this tool call."


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_at_a_tool_calls_question_declines_it_and_ends_the_chat_saved(cli_env: dict[str, str], home: Path,
                                                                              sig: int) -> None:
    """docs/chat.md: a SIGTERM or SIGHUP while a tool call's question waits declines the call as Ctrl-C there does,
    and ends the chat with 128 + the signal, the message and the call saved (it did not wait for a reply)."""
    from localgen.chat.session import ChatSession
    from tests.test_chat import spawn

    name = f"toolchat-{sig}"
    child = spawn(cli_env, name, *CHAT_TOOLS, "--mcp", MCP, "--tool-choice", "add")
    child.sendline("What is 2 + 3?")
    child.expect_exact("[y]es / [n]o / [a]lways for add:")
    child.kill(sig)
    terminal.ends(child)
    child.close()
    assert child.exitstatus == 128 + sig, (child.exitstatus, child.signalstatus)
    messages = ChatSession.load(name).messages
    assert messages[0] == {"role": "user", "content": "What is 2 + 3?"} | {k: v for k, v in messages[0].items()
                                                                          if k not in ("role", "content")}
    assert messages[1]["tool_calls"][0]["function"]["name"] == "add"
    assert messages[2]["content"] == "The user declined to run this tool call."


def test_chat_tool_failure_takes_the_question_back(cli_env: dict[str, str], home: Path, tmp_path: Path) -> None:
    from tests.test_chat import PROMPT, send, spawn

    fns = _only(tmp_path, "explode")
    child = spawn(cli_env, "toolfail", *CHAT_TOOLS, "--functions", fns, "--tool-choice", "explode", "--yes")
    child.sendline("Go.")
    child.expect("explode failed: ValueError: boom")
    child.expect("the conversation is as it was")
    child.expect_exact(PROMPT)
    send(child, "/tools", r"explode\(reason\) \(runs without asking\)")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    assert not (home / "data" / "chats" / "toolfail.json").exists(), "nothing of the failed turn is saved"


def test_chat_takes_the_question_back_when_a_tool_s_result_outgrows_the_window(cli_env: dict[str, str], home: Path,
                                                                                tmp_path: Path) -> None:
    """A result of 100,000 characters (some 26,000 tokens, past the 4,096-token window) is a tool's failure: one line
    naming the tool's result, the question taken back, and the chat goes on (it ended with exit status 1, saying
    "the prompt is 26,442 tokens")."""
    from tests.test_chat import PROMPT, spawn

    fns = tmp_path / "big.py"
    fns.write_text('def dump() -> str:\n    """Dump the log."""\n    return "word " * 20_000\n')
    child = spawn(cli_env, "toolbig", *CHAT_TOOLS, "--functions", str(fns), "--tool-choice", "dump", "--yes")
    child.sendline("Go.")
    child.expect(r"the result of dump \(100,000 characters\) is too long for the context window")
    child.expect_exact(PROMPT)
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert not (home / "data" / "chats" / "toolbig.json").exists(), "nothing of the failed turn is saved"


def test_chat_shows_nothing_of_a_tool_past_its_timeout(cli_env: dict[str, str], home: Path, tmp_path: Path) -> None:
    """docs/tools.md: a function past --tool-timeout is stopped and what it prints after is not shown (it printed
    on into the conversation, a line every 50 ms, after the question was taken back)."""
    from tests.test_chat import spawn
    from tests.test_tools import TICKER

    fns = tmp_path / "ticker.py"
    fns.write_text(TICKER)
    child = spawn(cli_env, "tooltick", *CHAT_TOOLS, "--functions", str(fns), "--tool-choice", "ticker", "--yes",
                  "--tool-timeout", "1")
    child.sendline("Go.")
    child.expect("ticker did not finish within 1 s")
    _no_tick_after_the_prompt(child)


def _no_tick_after_the_prompt(child: Any) -> None:
    """Back at the chat's prompt, the ticker tool prints nothing more, up to the chat's end."""
    from tests.test_chat import PROMPT

    child.expect_exact(PROMPT)
    child.expect(pexpect.TIMEOUT, timeout=1)  # a second for it to print in, were it still running
    seen = str(child.before)
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    seen += str(child.before)
    assert not re.search(r"tick \d", seen), seen


def test_ctrl_c_during_a_tool_call_abandons_it_and_takes_the_question_back(cli_env: dict[str, str], home: Path,
                                                                             tmp_path: Path) -> None:
    """The first Ctrl-C while a call runs stops it there (it waited for the call to end or time out, and a second
    press left the tool printing on): the question is taken back, and nothing the tool prints after is shown."""
    from tests.test_chat import spawn
    from tests.test_tools import TICKER

    fns = tmp_path / "ticker.py"
    fns.write_text(TICKER)
    child = spawn(cli_env, "toolstop", *CHAT_TOOLS, "--functions", str(fns), "--tool-choice", "ticker", "--yes",
                  "--tool-timeout", "120")
    child.sendline("Go.")
    child.expect(r"tick \d+")
    child.sendintr()
    child.expect_exact("(stopped before the answer began; the message was taken back)", timeout=60)
    _no_tick_after_the_prompt(child)
    assert not (home / "data" / "chats" / "toolstop.json").exists(), "nothing of the stopped turn is saved"


def test_ctrl_c_during_an_mcp_call_abandons_it_at_once(cli_env: dict[str, str], home: Path) -> None:
    """An MCP call waits for its server (here a minute); the first Ctrl-C stops the answer there, and the question
    is taken back (it waited for the call's --tool-timeout)."""
    from tests.test_chat import PROMPT, spawn

    child = spawn(cli_env, "mcpstop", *CHAT_TOOLS, "--mcp", f"{MCP} --stall", "--tool-choice", "stall", "--yes",
                  "--tool-timeout", "120")
    child.sendline("Go.")
    child.expect("stalling")  # the server's stderr: the call has begun
    child.sendintr()
    child.expect_exact("(stopped before the answer began; the message was taken back)", timeout=60)
    child.expect_exact(PROMPT)
    child.sendline("/exit")
    child.expect(pexpect.EOF)


def test_scripted_chat_needs_yes_and_shows_calls_on_stderr(cli: CLI, cli_in_process: InProcessCLI, home: Path,
                                                           scripted_add: tuple[Any, list[str]]) -> None:
    from localgen.chat.session import ChatSession

    # the usage errors come before any server starts or model loads: in this process
    r = cli_in_process("chat", "scripted-yes", *CHAT_TOOLS, "--mcp", MCP, input="What is 2 + 3?\n")
    assert r.returncode == 2 and "add --yes" in r.stderr and "Traceback" not in r.stderr
    r, roles = scripted_add
    assert r.returncode == 0, r.stderr
    assert "tool call: add(" in r.stderr and "tool result: " in r.stderr and "tool call" not in r.stdout
    assert roles == ["user", "assistant", "tool", "assistant"]
    # the footer's tokens are the turn's, both rounds', and so is the log's entry; the window is the last round's
    footer = re.search(r"1 tool call · (\d+) tokens · .* · context ([\d,]+)/", r.stderr)
    assert footer, r.stderr
    log_id = ChatSession.load("scripted-tools").log_id
    with sqlite3.connect(home / "data" / "logs" / "logs.db") as db:
        prompt, completion = db.execute("SELECT prompt_tokens, completion_tokens FROM responses WHERE "
                                        "conversation_id = ? ORDER BY rowid LIMIT 1", (log_id,)).fetchone()
    assert completion == int(footer[1])
    assert prompt + completion > int(footer[2].replace(",", "")), "the first round's prompt is counted too"
    r = cli("chat", "scripted-crash", *CHAT_TOOLS, "--mcp", MCP, "--yes", "--tool-choice", "crash",
            input="Crash.\n")
    assert r.returncode == 1 and "failed (calling crash)" in r.stderr and "Traceback" not in r.stderr
    assert not (home / "data" / "chats" / "scripted-crash.json").exists(), "nothing of the failed turn is saved"
    r = cli_in_process("chat", "--tool-steps", "3", *CHAT_TOOLS, input="Hi\n")
    assert r.returncode == 2 and "go with tools" in r.stderr


def test_chat_saves_reasoning_apart_and_resumes_tool_turns_without_tools(cli: CLI, home: Path,
                                                                         scripted_add: tuple[Any, list[str]]) -> None:
    from localgen.chat.runner import ChatRunner
    from localgen.chat.session import ChatSession
    from localgen.types import SamplingParams

    r = cli("chat", "thinkchat", "-m", "smollm2:135m", "--chat-template-file", str(R1), "--temperature", "0",
            "-n", "16", input="Why is the sky blue?\n")
    assert r.returncode == 0, r.stderr
    answer = ChatSession.load("thinkchat").messages[1]
    assert answer["content"] == "" and answer["reasoning_content"].strip()
    assert "[thinking]" in r.stdout and answer["reasoning_content"].strip()[:20] in r.stdout
    hidden = cli("chat", "--resume", "thinkchat", "--chat-template-file", str(R1), "-n", "16",
                 input="/set think off\nAnd the sea?\n")
    assert hidden.returncode == 0 and "[thinking]" not in hidden.stdout
    # a conversation with calls (scripted_add's), resumed without tools: its calls and results go as plain turns
    assert scripted_add[0].returncode == 0, scripted_add[0].stderr
    saved = ChatSession.load("scripted-tools")
    runner = ChatRunner(saved, backend=None, sampling=SamplingParams())  # type: ignore[arg-type]
    sent = runner.request(runner.sent()).messages
    assert [m["role"] for m in sent] == ["user", "assistant", "user", "assistant"]
    assert json.loads(sent[1]["content"])["tool_call"]["name"] == "add"
    assert json.loads(sent[2]["content"])["tool_response"]["name"] == "add"
    again = cli("chat", "--resume", "scripted-tools", "-n", "8", input="Thanks.\n")
    assert again.returncode == 0 and again.stdout.strip(), again.stderr


def test_chat_folds_thinking_on_a_terminal(cli_env: dict[str, str], home: Path) -> None:
    from localgen.chat.session import ChatSession
    from tests.test_chat import PROMPT, spawn

    child = spawn(cli_env, "foldchat", "-m", "smollm2:135m", "--chat-template-file", str(R1), "--temperature", "0",
                  "-n", "16")
    child.sendline("Why is the sky blue?")
    child.expect(r"thought \((\d+) words\) · /think shows it")
    words = int(child.match.group(1))
    child.expect_exact(PROMPT)
    reasoning = ChatSession.load("foldchat").messages[1]["reasoning_content"]
    assert words == len(reasoning.split()) > 0
    child.sendline("/think")
    child.expect_exact(" ".join(reasoning.split()[:3]))
    child.expect_exact(PROMPT)
    child.sendline("/exit")
    child.expect(pexpect.EOF)


def test_chat_withdraws_the_tools_of_an_mcp_server_that_stopped(cli_env: dict[str, str], home: Path,
                                                                 tmp_path: Path) -> None:
    """tools.md: on a terminal, a call that finds its MCP server dead is one error whose hint says its tools are
    withdrawn; the next turn is answered (the forced choice of a withdrawn tool no longer applies) and /tools
    lists only what is left."""
    from tests.test_chat import PROMPT, spawn

    (tmp_path / "tools.py").write_text('def double(x: int) -> int:\n    """Twice x."""\n    return 2 * x\n')
    child = spawn(cli_env, "deadmcp", *CHAT_TOOLS, "--functions", str(tmp_path / "tools.py"), "--mcp", MCP, "--yes",
                  "--tool-choice", "crash")
    child.sendline("Crash.")
    child.expect_exact("failed (calling crash)")
    child.expect_exact("no longer offered")
    child.expect_exact(PROMPT)
    child.sendline("Say hello.")
    assert child.expect([r"tok/s", r"failed \(calling"]) == 0, child.before
    child.expect_exact(PROMPT)
    child.sendline("/tools")
    child.expect(r"double\(x\)")
    listed = str(child.before)
    child.expect_exact(PROMPT)
    listed += str(child.before)  # the tools after it, up to the prompt
    assert "add(" not in listed and "crash(" not in listed, listed
    child.sendline("/exit")
    child.expect(pexpect.EOF)


def test_a_line_typed_during_the_answer_never_answers_a_tool_calls_question(cli_env: dict[str, str],
                                                                             home: Path) -> None:
    """tools.md: a call runs only once you say so. A `y` typed while the model wrote its call (type-ahead, which the
    next prompt would show) answered the question unseen: the call ran while the screen showed the `n` typed at
    the question, and that `n` then answered the next question. The keys typed ahead are dropped, and said so."""
    import termios

    from localgen.chat.session import ChatSession
    from tests.test_chat import spawn

    child = spawn(cli_env, "typed-ahead", *CHAT_TOOLS, "--mcp", MCP, "--tool-choice", "add")
    child.sendline("What is 2 + 3? " + "Think of it slowly. " * 100)  # its reading gives the time to type ahead
    terminal.wait_for_local_modes(child, termios.NOFLSH | termios.ISIG)  # the prompt (raw: no ISIG) has ended
    child.send("y\r")
    child.expect_exact("(what you typed during the answer was dropped: a tool call's question takes only what")
    child.expect_exact("[y]es / [n]o / [a]lways for add:")
    child.sendline("n")
    child.expect_exact("tool add: declined")
    child.expect_exact(">>>")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    messages = ChatSession.load("typed-ahead").messages
    assert messages[2]["content"] == "The user declined to run this tool call.", messages[2]
