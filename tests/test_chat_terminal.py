"""`localgen chat` in a real terminal, as a terminal trial found it: a burst of Ctrl-C (during an answer, a tool
call, `/compact`) neither echoes `^C` nor ends the chat; llama.cpp's abort in the Markdown view leaves the block
on the screen and the cursor shown; a window narrowed mid-answer leaves no stale copy of the block; and the
nits of `/set`, `/retry` and Tab."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pexpect
import pytest

from tests import terminal
from tests.conftest import ROOT, SAFETY_NET_S
from tests.test_chat import LETTER, PROMPT, SCREEN, exits, spawn

TALL = (100, 120)  # the answers stopped and the prompts the presses that reached them left, all on the screen
PRESS_EVERY_S = 0.0005  # a burst far denser than fingers make: every gap in the terminal's hold is hit


def burst(child: Any, screen: terminal.Screen, until: str | tuple[str, ...], after_s: float = 0.03) -> int:
    """Press Ctrl-C every PRESS_EVERY_S, reading what the chat writes (fed to `screen`), until `until` (or one of
    them) shows and `after_s` more (the presses that come as the chat winds down and its prompt comes back). Returns
    the presses."""
    until = (until,) if isinstance(until, str) else until
    mark = len(screen.written)  # this burst's notice, not an earlier burst's
    presses, stop_at = 0, None
    deadline = time.monotonic() + SAFETY_NET_S
    while stop_at is None or time.monotonic() < stop_at:
        assert time.monotonic() < deadline, f"{until!r} never showed:\n" + "\n".join(screen.rows())
        child.send("\x03")
        presses += 1
        time.sleep(PRESS_EVERY_S)
        try:
            child.read_nonblocking(1 << 16, timeout=0)
        except pexpect.TIMEOUT:
            pass
        except pexpect.EOF:
            raise AssertionError("the chat ended:\n" + "\n".join(screen.rows())) from None
        if stop_at is None and any(text in screen.written[mark:] for text in until):
            stop_at = time.monotonic() + after_s
    return presses


def settles(child: Any, screen: terminal.Screen, said: str | tuple[str, ...]) -> None:
    """Wait until the chat shows its prompt again, on the last row it wrote (the presses that reached the prompt
    each had their own). `said`: what the burst waited for. Nothing is typed before a prompt follows it: until the
    turn is over, a press the chat takes drops the keys typed and not yet read (cli/echo.py drop_typed), and a
    press taken late (a busy machine: the chat not scheduled for the burst's last 30 ms) dropped the `/stats`
    typed after it, so the chat waited at its prompt for a line that never came. At the prompt, presses are keys."""
    said = (said,) if isinstance(said, str) else said
    start = max(screen.written.rfind(text) for text in said)
    deadline = time.monotonic() + SAFETY_NET_S
    while PROMPT not in screen.written[start:]:
        assert time.monotonic() < deadline, "no prompt came back:\n" + "\n".join(screen.rows())
        with contextlib.suppress(pexpect.TIMEOUT):
            child.read_nonblocking(1 << 16, timeout=0.2)
    child.sendline("/stats")  # answered at a prompt: the presses before it are all taken
    child.expect(r"(tokens|no answer yet)", timeout=SAFETY_NET_S)
    child.expect_exact(PROMPT, timeout=SAFETY_NET_S)


def no_stray_ctrl_c(rows: list[str], notice: str) -> None:
    """No `^C` on the screen, and `notice` at the start of a row of its own."""
    shown = "\n".join(rows)
    assert "^C" not in shown, shown
    assert any(row.startswith(notice) for row in rows), shown


def test_a_burst_of_ctrl_c_as_an_answer_stops_echoes_nothing_and_the_chat_goes_on(cli_env: dict[str, str],
                                                                                 home: Path) -> None:
    """chat.md: more presses as an answer ends (a burst) change nothing. Those that came once the answer's hold
    on the terminal was let go were echoed (`^C^C(stopped; the partial answer is kept)`), and one landing while
    a notice was printed, or as a handler was put back, ended the chat (`interrupted`, exit 130)."""
    screen = terminal.Screen(TALL)
    child = spawn(cli_env, "burst", "-n", "3000", "--temp", "0", log=screen, dimensions=TALL)
    for _ in range(3):
        child.sendline("Write a very long essay about the history of rivers.")
        child.expect_exact("\x1b[?2004l")  # the prompt's last word to the terminal: what follows is the answer
        child.expect(r"(?<![\x1b\[?0-9;])[A-Za-z]{3}", timeout=SAFETY_NET_S)  # it streams
        burst(child, screen, "(stopped; the partial answer is kept)")
        settles(child, screen, "(stopped; the partial answer is kept)")
        no_stray_ctrl_c(screen.rows(), "(stopped; the partial answer is kept)")
    told = sum("(Ctrl-C stops an answer; to leave" in row for row in screen.rows())
    assert told <= 3, "said more than once a line:\n" + "\n".join(screen.rows())  # the presses that reached the prompt
    exits(child)
    saved = json.loads((home / "data" / "chats" / "burst.json").read_text())["messages"]
    assert [m["role"] for m in saved] == ["user", "assistant"] * 3 and all(m["content"] for m in saved)


def test_a_burst_of_ctrl_c_while_an_approved_tool_runs_echoes_nothing(cli_env: dict[str, str], home: Path,
                                                                     tmp_path: Path) -> None:
    """A tool call approved at its question (y) runs with the terminal held, as the answer streams: the echo, given
    back for the question, showed the press as `^C`, glued to the notice that the message was taken back."""
    from tests.test_tools import TICKER
    from tests.test_tools_chat import CHAT_TOOLS

    fns = tmp_path / "ticker.py"
    fns.write_text(TICKER)
    screen = terminal.Screen(TALL)
    child = spawn(cli_env, "toolburst", *CHAT_TOOLS, "--functions", str(fns), "--tool-choice", "ticker",
                  "--tool-timeout", "120", log=screen, dimensions=TALL)
    child.sendline("Go.")
    child.expect_exact("[y]es / [n]o / [a]lways for ticker:", timeout=SAFETY_NET_S)
    child.sendline("y")
    child.expect(r"tick \d+", timeout=SAFETY_NET_S)
    burst(child, screen, "(stopped before the answer began; the message was taken back)")
    settles(child, screen, "(stopped before the answer began; the message was taken back)")
    no_stray_ctrl_c(screen.rows(), "(stopped before the answer began; the message was taken back)")
    exits(child)


def test_a_burst_of_ctrl_c_during_compact_echoes_nothing(cli_env: dict[str, str], home: Path) -> None:
    """/compact writes its summary with the terminal held: the press that stops it showed as `^C`, glued to the
    error line that follows (`^C^Cerror: the summary was stopped ...`). End-of-generation is ruled out
    (--logit-bias 2-100), so the summary runs to its bound (512 tokens) and is stopped while it is written."""
    screen = terminal.Screen(TALL)
    child = spawn(cli_env, "compactburst", "-n", "8", "--temp", "0", "--logit-bias", "2-100", log=screen,
                  dimensions=TALL)
    for message in ("Tell me about rivers.", "And about lakes?"):
        child.sendline(message)
        child.expect("tok/s", timeout=SAFETY_NET_S)
        child.expect_exact(PROMPT)
    child.sendline("/compact 0")
    child.expect_exact("\x1b[?2004l")  # Enter taken: the summary is being written
    stopped = ("error: the summary was stopped", "(Ctrl-C stopped /compact before it finished)")  # (a press as Enter
    burst(child, screen, stopped)  # was taken)
    settles(child, screen, stopped)
    no_stray_ctrl_c(screen.rows(), next(said for said in stopped if said in screen.written))
    exits(child)
    assert json.loads((home / "data" / "chats" / "compactburst.json").read_text()).get("summary") is None


ABORT_AT_PIECE = """
from localgen.engine import generate
from localgen.native.lib import libggml
real = generate.Generation.__iter__
def pieces(self):
    for i, chunk in enumerate(real(self)):
        if i == 30:
            libggml().ggml_abort(b'ggml-rpc.cpp', 1, b'Remote RPC server crashed')
        yield chunk
generate.Generation.__iter__ = pieces
from localgen.cli.main import main
main(['chat', 'aborted', '-n', '200', '--temperature', '0'])
"""


def test_llama_cpp_aborting_mid_answer_leaves_the_markdown_block_then_its_error_and_the_cursor_shown(
        cli_env: dict[str, str]) -> None:
    """rpc.md: an RPC server gone mid-answer is one error line. In the Markdown view the live region held stdout and
    stderr: the error line was printed above the block being written, the block drawn again under it, and the chat
    ended with the cursor hidden. Now the block stays, the error line below it, the cursor shown and the echo back.
    The abort comes at the answer's 31st piece, as a server gone would end the next decode (test_run_io's way)."""
    import termios

    env = {k: v for k, v in cli_env.items() if k != "NO_COLOR"}
    env.update(TERM="xterm", PROMPT_TOOLKIT_NO_CPR="1")
    screen = terminal.Screen(SCREEN)
    child = pexpect.spawn(sys.executable, ["-c", ABORT_AT_PIECE], env=env, cwd=str(ROOT), encoding="utf-8",
                          timeout=SAFETY_NET_S, dimensions=SCREEN)
    child.logfile_read = screen
    child.expect_exact(PROMPT)
    child.sendline(LETTER)
    child.expect(pexpect.EOF)
    echo = termios.tcgetattr(child.child_fd)[3] & termios.ECHO  # the terminal as the chat left it
    child.close()
    assert child.exitstatus == 1
    rows = [row for row in screen.rows() if row]
    error = next(i for i, row in enumerate(rows) if row.startswith("localgen: error: llama.cpp stopped"))
    question = rows.index(f"{PROMPT} {LETTER}")
    shown = rows[question + 1:error]
    said = ("localgen: error: llama.cpp stopped: Remote RPC server crashed (an RPC server went away or failed: a "
            "generation cannot go on without it; run again)")
    assert len(shown) >= 2 and "".join(rows[error:]).replace(" ", "") == said.replace(" ", ""), "\n".join(rows)
    assert len(set(shown)) == len(shown), "a row of the block shows twice:\n" + "\n".join(rows)
    assert not screen.screen.cursor.hidden, screen.written[-300:]
    assert echo, "the terminal was left without its echo"


RIVER = ("Rivers carve valleys through stone over long ages and carry silt down to the sea where deltas grow wide and "
         "green, and along their banks towns rise and fall as the water gives and takes. " * 3).strip()  # 550
# characters in one paragraph (some 200 tokens): 5 rows at 120 columns, 10 at 60


def test_a_conversation_saved_before_its_first_exchange_says_it_resumed(cli_env: dict[str, str], home: Path) -> None:
    """`chat --resume NAME` of one `/save NAME` wrote before any message said nothing of the resume (every other
    says `resumed NAME: N messages`): it looked like a new chat."""
    child = spawn(cli_env, "-n", "2")
    child.sendline("/save emptysaved")
    child.expect("saved to")
    child.expect_exact(PROMPT)
    exits(child)
    child = spawn(cli_env, "--resume", "emptysaved", "-n", "2")  # (at its prompt: what came after "ready in")
    assert "resumed emptysaved: 0 messages" in str(child.before), child.before
    exits(child)


def tmux(socket: str, *args: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(["tmux", "-L", socket, "-f", "/dev/null", *args], env=env, capture_output=True, text=True,
                          check=True, timeout=60).stdout


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux, a terminal that rewraps its lines")
def test_a_window_narrowed_mid_answer_leaves_no_stale_copy_of_the_block_being_written(cli_env: dict[str, str],
                                                                                     home: Path) -> None:
    """In tmux (which, as most terminals, rewraps its lines when the window narrows), a window narrowed from 120
    columns to 60 while a paragraph streams: the line of the live block wider than 60 columns became two rows,
    and Rich, moving up one row a line it drew, left the first row of the block above the redrawn one. The answer
    is a paragraph of RIVER's words (a grammar), and the screen shows them once."""
    socket = f"localgen-test-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in cli_env.items() if k != "NO_COLOR"}
    env.update(TERM="xterm-256color", PROMPT_TOOLKIT_NO_CPR="1")
    for var in ("TMUX", "XTERM_VERSION"):
        env.pop(var, None)
    command = [sys.executable, "-m", "localgen", "chat", "narrowed", "-n", "1000", "--temp", "0", "--grammar",
               f'root ::= "{RIVER}"']
    tmux(socket, "new-session", "-d", "-x", "120", "-y", "40", "-c", str(ROOT), subprocess.list2cmdline(command) +
         "; sleep 600", env=env)
    try:
        def shown() -> str:
            return tmux(socket, "capture-pane", "-p", "-J", "-S", "-100")

        def wait_for(found: Any) -> str:
            deadline = time.monotonic() + SAFETY_NET_S
            while not found(text := shown()):
                assert time.monotonic() < deadline, text
                time.sleep(0.05)
            return text

        wait_for(lambda text: PROMPT in text)
        tmux(socket, "send-keys", "-l", "Tell me about rivers.")
        tmux(socket, "send-keys", "Enter")
        wait_for(lambda text: len(text.partition("Tell me about rivers.")[2].split()) >= 22)  # past the first row
        tmux(socket, "resize-window", "-x", "60")
        assert "tok/s" not in shown(), "the answer ended before the window narrowed"
        text = wait_for(lambda text: "tok/s" in text)
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, timeout=60)
    answer = text.partition("Tell me about rivers.")[2].partition("tok/s")[0].rsplit("\n", 1)[0]
    assert answer.split() == RIVER.split(), text


def test_set_says_a_value_out_of_range_as_typed_and_an_empty_one_clears(cli: Any, home: Path) -> None:
    """`/set temperature -1` is refused in one line quoting -1 as typed (it said -1.0); `/set stop ""` clears the stop
    strings (it set one of two quote characters), `/set system ""` the system prompt."""
    r = cli("chat", "emptyset", "-n", "4", "--temp", "0", "--system", "Be brief.",
            input='/set stop a|b\n/set stop ""\n/set system \'\'\nHi\n/show\n/set temperature -1\n')
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines()[-1] == "localgen: error: temperature must be within 0 to 5, not -1", r.stderr
    assert "stop = none" in r.stderr and "system prompt removed" in r.stderr and "system: none" in r.stderr, r.stderr
    saved = json.loads((home / "data" / "chats" / "emptyset.json").read_text())
    assert saved["settings"].get("stop") in ([], None) and saved.get("system") is None, saved


def test_ctrl_c_before_a_retrys_answer_begins_says_the_last_answer_is_kept(cli_env: dict[str, str],
                                                                           tmp_path: Path) -> None:
    """Ctrl-C while /retry reads the conversation in: the answer it was to replace comes back, and the chat says so
    (it said the message was taken back: it was not). The model is loaded again first (/model), so that /retry
    reads the long message in again (some 1,700 tokens, in pieces of 16), rather than reusing its KV cache."""
    from tests.conftest import CLI
    from tests.test_chat_attach_back import answering

    lcli = CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")})
    big = tmp_path / "big.txt"
    big.write_text("".join(f"Line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(120)))
    child = spawn(lcli.env, "retried", "-n", "4", "--temperature", "0", "--batch-size", "16", "--no-prompt-cache")
    child.sendline(f"/read {big}")
    child.expect_exact(PROMPT)
    child.sendline("Summarize.")
    child.expect("tok/s", timeout=SAFETY_NET_S)
    child.expect_exact(PROMPT)
    path = tmp_path / "home" / "data" / "chats" / "retried.json"
    before = json.loads(path.read_text())["messages"]
    child.sendline("/model smollm2:135m")
    child.expect_exact("ready in", timeout=SAFETY_NET_S)
    child.expect_exact(PROMPT)
    child.sendline("/retry")
    answering(child)
    time.sleep(0.3)
    child.sendintr()
    said = child.expect_exact(["(stopped before the new answer began; the answer it was to replace is kept)",
                               "the message was taken back", "Ctrl-C stopped /retry"], timeout=SAFETY_NET_S)
    assert said == 0, child.after
    child.expect_exact(PROMPT)
    exits(child)
    assert json.loads(path.read_text())["messages"] == before


def test_tab_completes_a_folder_with_its_slash(cli_env: dict[str, str], tmp_path: Path) -> None:
    """Tab after `/read PATH` completes a folder's name with its `/`, as a shell does, so the next Tab goes on in it."""
    (tmp_path / "onlyfolder").mkdir()
    screen = terminal.Screen(SCREEN)
    child = spawn(cli_env, "tabfolder", log=screen)
    child.send(f"/read {tmp_path}/only\t")
    line = f"{PROMPT} /read {tmp_path}/onlyfolder/"
    deadline = time.monotonic() + 60
    while line not in screen.rows():  # completed, with its slash (a redraw may come in more than one write)
        assert time.monotonic() < deadline, "\n".join(screen.rows())
        with contextlib.suppress(pexpect.TIMEOUT):
            child.read_nonblocking(1 << 16, timeout=0.1)
    child.sendcontrol("u")
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


NOTICE = "(Ctrl-C stops an answer; to leave, press Ctrl-D or type /exit)"


def flood(child: Any, presses: int = 50) -> None:
    """Ctrl-C `presses` times as a held key sends it: in groups, some landing as one read at the prompt, some
    between two prompts (where the terminal makes them a signal)."""
    for _ in range(presses // 10):
        child.send("\x03" * 10)
        time.sleep(0.02)
        with contextlib.suppress(pexpect.TIMEOUT):
            child.read_nonblocking(1 << 16, timeout=0)


def test_a_flood_of_ctrl_c_at_the_prompt_says_how_to_leave_once_and_leaves_one_prompt(cli_env: dict[str, str]) -> None:
    """chat.md: Ctrl-C at the prompt says how to leave once until a line is entered; later presses on an empty
    prompt (a held key) show nothing. Each press left a new prompt: 50 presses, a screen of `>>>`. On a line with
    text, Ctrl-C still drops the line."""
    screen = terminal.Screen(TALL)
    child = spawn(cli_env, "flood", "-n", "8", "--temperature", "0", log=screen, dimensions=TALL)
    flood(child)
    child.send("some text")
    time.sleep(0.2)
    flood(child)
    child.sendline("/stats")
    child.expect_exact("no answer yet", timeout=SAFETY_NET_S)
    child.expect_exact(PROMPT)
    rows = [row for row in screen.rows() if row]
    start = next(i for i, row in enumerate(rows) if row == PROMPT)  # after the ready line (and a first run's tip)
    assert rows[start:] == [PROMPT, NOTICE, f"{PROMPT} some text", f"{PROMPT} /stats", "no answer yet",
                                PROMPT], "\n".join(rows)
    child.sendline("Hi")  # a line entered: the next press says it again
    child.expect("tok/s", timeout=SAFETY_NET_S)
    child.expect_exact(PROMPT)
    flood(child, 20)
    exits(child)
    assert sum(row == NOTICE for row in screen.rows()) == 2, "\n".join(screen.rows())


def test_chat_list_fits_a_narrow_terminal_its_previews_cut_and_a_pipe_gets_whole_rows(cli_env: dict[str, str],
                                                                                     tmp_path: Path) -> None:
    """`chat --list` on a terminal 60 columns wide: one row each, the first message's preview cut with `…` (a wide
    character counted as two cells); the rows wrapped, a second row with no name breaking the columns. Into a pipe
    the rows are whole."""
    from tests.conftest import CLI

    lcli = CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")})
    asked = {"rivers": "Tell me about the long history of rivers and how they shaped the towns along them.",
             "yangtze": "给我讲讲长江的历史和它如何塑造了沿岸的城镇以及那里的人们的生活方式好吗"}
    for name, message in asked.items():
        r = lcli("chat", name, "-n", "1", "--temperature", "0", input=message + "\n")
        assert r.returncode == 0, r.stderr
    env = {**lcli.env, "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    screen = terminal.Screen((20, 60))
    child = terminal.spawn(env, ["chat", "-l"], dimensions=(20, 60))
    child.logfile_read = screen
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    rows = [row for row in screen.rows() if row]
    assert sorted(row.split()[0] for row in rows) == sorted(asked), "\n".join(rows)
    assert all(row.endswith("…") and "smollm2" in row for row in rows), "\n".join(rows)
    assert next(row for row in rows if row.startswith("rivers")).split("smollm2:135m ")[1].startswith("Tell"), rows
    piped = lcli("chat", "--list").stdout.splitlines()
    assert len(piped) == 2 and all(asked[row.split()[0]][:60] in row for row in piped), piped
