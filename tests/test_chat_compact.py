"""`chat --compact`: the oldest turns folded into a summary the model writes (with the real SmolLM2 in a 512-token
window), sent after the system prompt in their place; the saved conversation keeps every message and the
summary; --resume keeps the compacted state; a summary that fails or is stopped leaves the turns out instead."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pexpect
import pytest
from typer.testing import CliRunner

from localgen import compact
from localgen.chat.session import ChatSession, Summary
from localgen.compact import CompactionError, fold
from localgen.errors import LocalgenError
from localgen.types import SamplingParams
from tests import terminal
from tests.conftest import CLI
from tests.fake_openai import FakeServer
from tests.test_chat import spawn

# about 120 tokens each: four exchanges no longer fit a 512-token window
TOPICS = ("rivers", "volcanoes", "glaciers", "deserts", "forests", "coral reefs", "comets")
LONG = ("Please tell me about {}: where they are found, how they form, how they change over the years, "
        "what lives in or near them, why people study them, and which of them are the most famous in the "
        "world, with a short story about each one. Also say how the weather, the seasons and the people who "
        "live nearby change them, and what a visitor should see first.")


def _messages(n: int) -> list[str]:
    return [LONG.format(TOPICS[i % len(TOPICS)]) + f" (question {i + 1})" for i in range(n)]


# ---- the folding logic ------------------------------------------------------------------------------------


def test_fold_makes_one_request_when_the_lines_fit() -> None:
    calls: list[tuple[str | None, list[str]]] = []

    def write(previous: str | None, lines: list[str]) -> str:
        calls.append((previous, list(lines)))
        return "S1"

    assert fold(["User: a", "Assistant: b"], None, lambda p, lines: True, write) == ("S1", 1)
    assert calls == [(None, ["User: a", "Assistant: b"])]


def test_fold_in_pieces_folds_each_summary_into_the_next() -> None:
    lines = [f"User: line {i}" for i in range(10)]  # 14 characters each
    calls: list[tuple[str | None, list[str]]] = []

    def fits(previous: str | None, chunk: list[str]) -> bool:  # a request holds 50 characters
        return len(previous or "") + sum(len(x) for x in chunk) <= 50

    def write(previous: str | None, chunk: list[str]) -> str:
        calls.append((previous, list(chunk)))
        return f"S{len(calls)}"

    summary, pieces = fold(lines, "S0", fits, write)
    assert summary == f"S{pieces}" and pieces == len(calls) > 1
    assert [c[0] for c in calls] == ["S0", *(f"S{i}" for i in range(1, pieces))], "each piece folds the last summary"
    assert [x for c in calls for x in c[1]] == lines, "every line folded once, in order"
    assert all(fits(prev, chunk) for prev, chunk in calls), "every request fits"
    assert all(not fits(prev, chunk + lines[len(chunk):][:1]) for prev, chunk in calls[:-1]), "each takes its most"


def test_fold_cuts_a_line_too_long_for_a_request_alone() -> None:
    seen: list[list[str]] = []

    def write(previous: str | None, chunk: list[str]) -> str:
        seen.append(list(chunk))
        return "S"

    fold(["x" * 100, "User: short"], None, lambda p, chunk: sum(len(x) for x in chunk) <= 40, write)
    assert seen[0] == ["x" * (40 - len(compact.CUT)) + compact.CUT] and seen[1] == ["User: short"]


def test_fold_refuses_a_window_that_holds_no_request() -> None:
    with pytest.raises(CompactionError, match="cannot hold a summary request"):
        fold(["User: hi"], None, lambda p, chunk: False, lambda p, chunk: "S")


def test_a_summary_takes_an_eighth_of_the_window_within_bounds() -> None:
    assert [compact.budget(n) for n in (128, 512, 4096, 32768)] == [32, 64, 512, 512]


def test_undo_past_what_the_summary_covers_drops_it() -> None:
    from localgen.chat.runner import ChatRunner

    session = ChatSession(name="undo", model="m", messages=[
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}])
    session.summary = Summary(text="s", covers=2, tokens=1, compactions=1, model="m", created=0.0)
    runner = ChatRunner(session, backend=None, sampling=SamplingParams())  # type: ignore[arg-type]
    assert runner.first == 2, "the window starts after what the summary covers"
    session.undo()
    runner.forget()
    assert session.summary is not None, "the summary still covers messages that are there"
    session.undo()
    runner.forget()
    assert session.summary is None and runner.first == 0


def test_a_summary_logged_as_a_system_prompt_is_not_sent_again() -> None:
    """An older localgen logged a compacted chat's summary as its system prompt (alone, or after the system
    prompt in one message): run --cid and chat --resume ID sent it before the turns it summarized."""
    from localgen.cli.log.conversation import without_summary

    text = compact.summary_text(6, "They talked about cats.\n\nAnd dogs.")
    assert without_summary(text) is None
    assert without_summary(f"Be brief.\n\n{text}") == "Be brief."
    assert without_summary(compact.summary_text(1, "x")) is None
    for kept in (None, "Be brief.", f"Quote: {compact.HEADING} (3 messages, summarized):\nno"):
        assert without_summary(kept) == kept


def test_the_transcript_names_who_said_what() -> None:
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}}]}
    assert compact.line_of({"role": "user", "content": "Hi"}) == "User: Hi"
    assert compact.line_of(call) == 'Assistant: [called weather({"city": "Oslo"})]'
    assert compact.line_of({"role": "tool", "content": "rain", "name": "weather"}) == "Tool result (weather): rain"
    assert compact.cleaned("<think>hmm</think>\n A summary. ") == "A summary."


def test_a_saved_summary_must_match_its_conversation(home: Path) -> None:
    session = ChatSession(name="badsummary", model="m", messages=[{"role": "user", "content": "hi"}])
    session.summary = Summary(text="s", covers=1, tokens=1, compactions=1, model="m", created=0.0)
    session.save()
    assert ChatSession.load("badsummary").summary == session.summary
    data = json.loads(session.path.read_text())
    data["summary"]["covers"] = 5  # more messages than the conversation has
    session.path.write_text(json.dumps(data))
    with pytest.raises(LocalgenError, match="not in localgen's format: its \"summary\" covers 5 messages, and the "
                                            "conversation has 1"):
        ChatSession.load("badsummary")
    for summary, said in (({"covers": 1}, 'its "summary" is not an object with a "text"'),
                          ({"text": "s", "covers": "1"}, 'its "summary"\'s "covers" is not a whole number'),
                          ({"text": "s", "covers": 1, "summarized": 2}, 'its "summary" summarized 2 of the 1')):
        session.path.write_text(json.dumps({**data, "summary": summary}))
        with pytest.raises(LocalgenError, match=re.escape(said)):
            ChatSession.load("badsummary")


# ---- in process, with the real model: what is sent ---------------------------------------------------------


@pytest.fixture(scope="module")
def small_backend(smollm2_path: Path) -> Iterator[Any]:
    """SmolLM2 in a 512-token window."""
    from localgen.engine.llama import Engine
    from localgen.engine.local import LocalBackend
    from localgen.models.resolve import resolve
    from localgen.types import LoadParams

    backend = LocalBackend(Engine(resolve(str(smollm2_path)), LoadParams(n_ctx=512)))
    yield backend
    backend.close()


class Spy:
    """The real backend, with every request it generates for kept (the summary requests among them)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.generated: list[Any] = []

    def generate(self, request: Any, started: float | None = None) -> Any:
        self.generated.append(request)
        return self.backend.generate(request)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)


def _runner(backend: Any, exchanges: int) -> Any:
    from localgen.chat.runner import ChatRunner

    session = ChatSession(name="inproc", model="smollm2:135m", system="Be brief.")
    for text in _messages(exchanges):
        session.add("user", text)
        session.add("assistant", "They are remarkable places, studied for their history and their life.")
    runner = ChatRunner(session, Spy(backend), SamplingParams(temperature=0.0, max_tokens=32))
    runner.compact = True
    runner.prompt_cache = True
    return runner


@pytest.mark.slow
def test_the_model_gets_the_system_prompt_the_summary_and_the_recent_turns(small_backend: Any) -> None:
    runner = _runner(small_backend, 5)
    notes: list[str] = []
    runner.note, runner.alert = notes.append, notes.append
    original = list(runner.session.messages)
    left_out = runner.start("What was my last question about?")
    s = runner.session.summary
    assert s is not None and left_out == 0, notes
    assert runner.session.messages[:-1] == original, "every message stays in the conversation"
    assert 0 < s.covers < len(original) and runner.session.messages[s.covers]["role"] == "user"
    assert s.text and s.compactions == 1 and 0 < s.tokens <= compact.budget(512)
    sent = runner.sent()
    assert sent[0] == {"role": "system", "content": "Be brief."}
    assert sent[1] == {"role": "system", "content": compact.summary_text(s.covers, s.text)}
    assert sent[2:] == runner.session.messages[s.covers:], "the recent turns go verbatim"
    assert list(runner.last_request.messages) == sent
    assert not runner.last_request.prompt_cache, "a summary before the first user turn is no prefix to keep on disk"
    assert runner.count(sent) <= 512 - runner.reserve()
    assert runner.count(sent) <= (512 - runner.reserve()) // 2, "the recent turns fill at most half the window"
    request = runner.backend.generated[0]
    assert request.messages[0]["content"] == compact.INSTRUCTION and request.sampling.max_tokens == compact.budget(512)
    assert [n for n in notes if n.startswith("(compacted")] == notes and len(notes) == 1, notes
    # a later compaction folds the summary before it, with the turns added since
    first = s
    for text in _messages(3):
        runner.session.add("assistant", "Here is a long answer about them, with several stories in it.")
        runner.session.add("user", text)
    runner.backend.generated.clear()
    runner.prepare()
    s = runner.session.summary
    assert s is not None and s.compactions == 2 and s.covers > first.covers
    assert f"The summary so far:\n{first.text}" in runner.backend.generated[0].messages[1]["content"]
    assert runner.sent()[2:] == runner.session.messages[s.covers:]


@pytest.mark.slow
def test_undo_after_the_window_moved_sends_what_fits_again(small_backend: Any) -> None:
    """chat.md: /undo back past what the summary covers drops it, and the window then sends what is left. A red
    team's: the window kept the start a longer conversation had moved it to, so after /undo the model got only the
    last message (an answer: no user turn at all), and /context said `1 in the window`."""
    runner = _runner(small_backend, 5)
    runner.compact = False
    assert runner.start("One more question.") > 0, "five long exchanges do not fit a 512-token window"
    while len(runner.session.messages) > 4:
        runner.session.undo()
        runner.forget()
    used, _, first = runner.context_used()
    assert first == 0 and used == runner.count(runner.sent()), "the two exchanges left fit: all are sent"
    assert runner.sent()[1:] == runner.session.messages
    # every message folded (/compact 0): the summary alone is what the next prompt sends before the new turn
    runner.session.summary = Summary(text="They asked about rivers.", covers=4, tokens=8, compactions=1, model="m",
                                     created=0.0)
    runner.first = 4
    used, _, first = runner.context_used()
    assert first == 4 and used == runner.count(runner.head()), "the last answer is not counted beside its summary"
    runner.session.undo()  # back past what it covers: it goes, and both messages left are sent
    runner.forget()
    assert runner.session.summary is None and runner.context_used()[2] == 0


STRICT = """{%- if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set sys =
messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set sys = '' %}{% endif %}<|im_start|>system
{{ sys }}<|im_end|>
{% for m in loop_messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation
 roles must alternate user/assistant/user/assistant/...') }}{% endif %}<|im_start|>{{ m['role'] }}
{{ m['content'] }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


@pytest.mark.slow
def test_a_template_that_takes_one_system_message_gets_the_summary_in_it(smollm2_path: Path, tmp_path: Path) -> None:
    from localgen.chat.runner import ChatRunner
    from localgen.cli.options.files import with_template
    from localgen.engine.llama import Engine
    from localgen.engine.local import LocalBackend
    from localgen.models.resolve import resolve
    from localgen.types import LoadParams

    path = tmp_path / "strict.jinja"
    path.write_text(STRICT)
    ref = with_template(resolve(str(smollm2_path)), None, path)
    backend = LocalBackend(Engine(ref, LoadParams(n_ctx=512)))
    try:
        session = ChatSession(name="strict", model="m", system="Be brief.", messages=[
            {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"}])
        session.summary = Summary(text="They said a and b.", covers=2, tokens=6, compactions=1, model="m",
                                  created=0.0)
        runner = ChatRunner(session, backend, SamplingParams())
        sent = runner.sent()
        assert sent == [{"role": "system", "content": "Be brief.\n\n" + compact.summary_text(2, "They said a and b.")},
                        {"role": "user", "content": "c"}]
        assert "They said a and b." in backend.render(runner.request(sent))
        session.system = None  # no system prompt: the summary is the system message
        assert runner.sent()[0] == {"role": "system", "content": compact.summary_text(2, "They said a and b.")}
    finally:
        backend.close()


@pytest.mark.slow
def test_ctrl_c_during_the_summary_leaves_the_turns_out_instead(small_backend: Any) -> None:
    from localgen.cli.chat.turn import summary_interrupts

    runner = _runner(small_backend, 5)
    alerts: list[str] = []
    runner.alert = alerts.append
    original = list(runner.session.messages)

    def press() -> None:  # Ctrl-C once the summary is being written
        deadline = time.monotonic() + 120
        while not runner.summarizing and time.monotonic() < deadline:
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGINT)

    presser = threading.Thread(target=press)
    presser.start()
    with summary_interrupts(runner):
        left_out = runner.start("And now?")
    presser.join()
    assert alerts == ["the summary was stopped: the oldest turns are left out instead (the conversation is kept "
                      "whole)"]
    assert runner.session.summary is None and left_out > 0
    assert runner.last_request.prompt_cache, "without a summary, the prefix goes to the prompt cache as before"
    assert runner.session.messages[:-1] == original
    assert runner.sent()[1:] == runner.session.messages[runner.first:]


# ---- the real CLI --------------------------------------------------------------------------------------------


def _saved(home: Path, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((home / "data" / "chats" / f"{name}.json").read_text())
    return data


@pytest.mark.slow
def test_a_scripted_chat_compacts_and_resume_keeps_it(cli: CLI, cli_env: dict[str, str], home: Path) -> None:
    asked = _messages(5)
    r = cli("chat", "compacted", "--compact", "--ctx", "512", "-n", "16", "--temp", "0", "--system", "Be brief.",
            input="".join(f"{m}\n" for m in asked))
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("(compacted ") == 1 and "outgrew" not in r.stderr, r.stderr
    saved = _saved(home, "compacted")
    assert [m["content"] for m in saved["messages"] if m["role"] == "user"] == asked, "every message is kept"
    assert [m["role"] for m in saved["messages"]] == ["user", "assistant"] * 5
    summary = saved["summary"]
    assert summary["text"] and summary["compactions"] == 1 and saved["compact"] is True
    assert summary["model"] == "smollm2:135m" and 0 < summary["tokens"] <= compact.budget(512)
    assert 0 < summary["covers"] < 10 and saved["messages"][summary["covers"]]["role"] == "user"
    logged = json.loads(cli("logs", "-n", "0", "--json", "--cid", saved["log_id"]).stdout)
    assert len(logged) == 5 and {x["system"] for x in logged} == {"Be brief."}, [x["system"] for x in logged]
    # resumed: the summary is sent, /show and /context say so, and compaction goes on (it was saved on)
    r = cli("chat", "--resume", "compacted", "--ctx", "512", "-n", "16", "--temp", "0",
            input="/show\n/context\n" + "".join(f"{m}\n" for m in _messages(8)[5:]) + "/show\n")
    assert r.returncode == 0, r.stderr
    assert f"summary of the first {summary['covers']} messages (1 compaction" in r.stderr
    assert f"the first {summary['covers']} sent as a summary" in r.stderr
    assert "compact on" in r.stderr and r.stderr.count("(compacted ") == 1, r.stderr
    assert "outgrew" not in r.stderr
    again = _saved(home, "compacted")
    assert again["summary"]["compactions"] == 2 and again["summary"]["covers"] > summary["covers"]
    assert [m["content"] for m in again["messages"] if m["role"] == "user"] == _messages(8)
    # --no-compact turns it off (saved with the next turn); the summary still stands for what it covers; /compact
    # summarizes now all but the last exchange; /load takes the summary too; /clear starts without one
    r = cli("chat", "--resume", "compacted", "--no-compact", "--ctx", "512", "-n", "4", "--temp", "0",
            input="/show\nThanks!\n")
    assert r.returncode == 0, r.stderr
    assert "compact off" in r.stderr and "summary of the first" in r.stderr
    last = _saved(home, "compacted")
    assert last["compact"] is False and last["summary"] == again["summary"]
    r = cli("chat", "compact-loader", "--ctx", "512", "-n", "4", "--temp", "0",
            input="/load compacted\n/context\n/compact\n/show\n/compact 0\n/show\n/clear\n/show\n")
    assert r.returncode == 0, r.stderr
    n = len(last["messages"])
    assert f"(the first {again['summary']['covers']} sent as a summary" in r.stderr
    assert f"summary of the first {n - 2} messages (3 compactions" in r.stderr, r.stderr
    assert f"summary of the first {n} messages (4 compactions" in r.stderr, "/compact 0 folds every message"
    assert r.stderr.count("summary: none") == 1, "/clear starts without a summary"
    assert _saved(home, "compacted")["summary"]["covers"] == n
    # on a terminal, the resumed chat says what the summary stands for
    screen = terminal.Screen((40, 120))
    child = spawn(cli_env, "--resume", "compacted", "--ctx", "512", log=screen)
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    assert f"resumed compacted: {n} messages (the first {n} sent as a summary)" in "\n".join(screen.rows())


@pytest.mark.slow
def test_the_log_keeps_a_compacted_chats_system_prompt_not_its_summary(cli: CLI, home: Path) -> None:
    """logs.md: the log keeps each exchange's system prompt. A compacted chat without one logged its summary (the
    request's first system message) as one, and `run --cid ID` sent it before every turn it summarized."""
    r = cli("chat", "unsystematic", "--compact", "--ctx", "512", "-n", "16", "--temp", "0",
            input="".join(f"{m}\n" for m in _messages(5)))
    assert r.returncode == 0 and r.stderr.count("(compacted ") == 1, r.stderr
    saved = _saved(home, "unsystematic")
    logged = json.loads(cli("logs", "-n", "0", "--json", "--cid", saved["log_id"]).stdout)
    assert len(logged) == 5 and [x["system"] for x in logged] == [None] * 5, [x["system"] for x in logged]


@pytest.mark.slow
def test_a_summary_that_fails_leaves_the_turns_out_and_keeps_the_conversation(cli: CLI, home: Path) -> None:
    # end-of-generation forced first: every summary comes back empty (and every answer too)
    asked = [m + " " + m for m in _messages(3)]
    r = cli("chat", "nosummary", "--compact", "--ctx", "512", "-n", "16", "--temp", "0", "--logit-bias", "2+100",
            input="".join(f"{m}\n" for m in asked))
    assert r.returncode == 0, r.stderr
    assert "warning: the model wrote an empty summary: the oldest turns are left out instead" in r.stderr, r.stderr
    assert r.stderr.count("outgrew") == 1 and "(compacted " not in r.stderr
    saved = _saved(home, "nosummary")
    assert saved["summary"] is None
    assert [m["content"] for m in saved["messages"] if m["role"] == "user"] == asked
    assert [m["role"] for m in saved["messages"]] == ["user", "assistant"] * 3, "every message was answered"
    # /compact that fails: an error, and the conversation as it was
    r = cli("chat", "--resume", "nosummary", "--ctx", "512", "-n", "16", "--logit-bias", "2+100", input="/compact\n")
    assert r.returncode == 1 and "the model wrote an empty summary" in r.stderr
    assert "nothing was compacted; the conversation is as it was" in r.stderr
    assert _saved(home, "nosummary") == saved


def test_a_remote_summary_that_fails_leaves_the_turns_out(home: Path, fake: FakeServer) -> None:
    from localgen.chat.runner import ChatRunner
    from localgen.remote.backend import RemoteBackend
    from localgen.remote.endpoints import Endpoint

    backend = RemoteBackend([Endpoint(url=fake.url + "/v1")], "error-mid", assumed_ctx=512)
    session = ChatSession(name="remote-fail", model="error-mid")
    for text in _messages(6):
        session.add("user", text)
        session.add("assistant", "Hello world")
    runner = ChatRunner(session, backend, SamplingParams(max_tokens=16))
    runner.compact = True
    alerts: list[str] = []
    runner.alert = alerts.append
    try:
        left_out = runner.start("And then?")
    finally:
        backend.close()
    assert len(alerts) == 1 and alerts[0].startswith("the summary could not be written (") and "the GPU fell over" \
        in alerts[0], alerts
    assert left_out > 0 and session.summary is None and len(session.messages) == 13


def test_compaction_goes_through_a_remote_endpoint(home: Path, fake: FakeServer) -> None:
    from localgen.cli import app, params

    params.install()
    fake.requests.clear()
    asked = _messages(7)
    r = CliRunner().invoke(app.build(), ["chat", "remote-compact", "--endpoint", fake.url, "-m", "plain", "--ctx",
                                         "512", "-n", "16", "--compact"], input="".join(f"{m}\n" for m in asked),
                           env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    bodies = [q["body"] for q in fake.requests]
    asks = [b for b in bodies if b["messages"][0]["content"] == compact.INSTRUCTION]
    assert asks and all(b["max_tokens"] == compact.budget(512) for b in asks)
    saved = _saved(home, "remote-compact")
    assert saved["summary"]["text"] == "Hello world"  # what the fake server answers
    last = bodies[-1]["messages"]
    assert last[0] == {"role": "system", "content": compact.summary_text(saved["summary"]["covers"], "Hello world")}
    assert last[1:] == [{"role": m["role"], "content": m["content"]}
                        for m in saved["messages"][saved["summary"]["covers"]:-1]], "the last answer came after it"


def test_compact_with_nothing_to_fold_says_why(cli: CLI) -> None:
    """/compact on an empty chat said `the last 1 exchange stay as they are`: now what there is and what it keeps."""
    r = cli("chat", "nothing-to-fold", "-n", "4", "--temp", "0",
            input="/compact\nHi\n/compact\n/compact 3\n")
    assert r.returncode == 0, r.stderr
    said = [line for line in r.stderr.splitlines() if line.startswith("nothing to compact")]
    assert said == ["nothing to compact: the conversation is empty",
                    "nothing to compact: the conversation has 1 exchange, and /compact keeps the last exchange as "
                    "it is",
                    "nothing to compact: the conversation has 1 exchange, and /compact keeps the last 3 exchanges as "
                    "they are"], r.stderr


def test_a_summary_no_smaller_than_what_it_folds_is_not_kept(cli: CLI, home: Path) -> None:
    """/compact over short turns: a summary as long as they are would make the conversation no smaller (it was kept,
    and the conversation grew), so it is dropped and said so; the chat goes on, and nothing is saved as folded."""
    r = cli("chat", "short-turns", "-n", "15", "--temp", "0", input="Say hi\nWhat is 2+2?\n/compact 0\n")
    assert r.returncode == 0, r.stderr
    said = [line for line in r.stderr.splitlines() if line.startswith("nothing compacted: ")]
    assert len(said) == 1 and "summary would not make the conversation smaller (" in said[0], r.stderr
    saved = json.loads((home / "data" / "chats" / "short-turns.json").read_text())
    assert saved.get("summary") is None and len(saved["messages"]) == 4


def test_compact_with_a_unicode_digit_is_its_usage_error(cli: CLI) -> None:
    """`/compact ²`: "²".isdigit() is true and int("²") raises, so the chat ended with a traceback; now its usage."""
    r = cli("chat", "superscript", "-n", "4", "--temp", "0", input="/compact ²\n")
    assert "usage: /compact [N] (keep the last N exchanges as they are; 1 unless given)" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and r.returncode == 2, r.stderr


class Capped(Spy):
    """A Spy that fails the test past `most` generations (a fold of a whole long history makes hundreds)."""

    def __init__(self, backend: Any, most: int) -> None:
        super().__init__(backend)
        self.most = most

    def generate(self, request: Any, started: float | None = None) -> Any:
        assert len(self.generated) < self.most, f"more than {self.most} requests"
        return super().generate(request, started)


@pytest.mark.slow
def test_a_long_history_resumed_compacts_only_its_newest_part_in_few_requests(small_backend: Any) -> None:
    """A resumed history of 3,000 messages with --compact folded all of it, one window at a time: hundreds of
    summary requests (90 s, silent) for one message. A fold now takes at most two windows of transcript tokens,
    the newest, said in one line with the older ones left out (as without --compact); and a fold of more than one
    request's worth says it is under way before the model's time is spent."""
    runner = _runner(small_backend, 150)
    runner.backend = Capped(small_backend, 6)
    notes: list[str] = []
    runner.note = notes.append
    runner.alert = lambda text: pytest.fail(text)
    runner.start("And now? (the last question)")
    s = runner.session.summary
    assert s is not None and s.compactions == 1, notes
    assert len(runner.backend.generated) <= 5, len(runner.backend.generated)  # the summary requests, the answer apart
    assert len(notes) == 3, notes
    left = notes[0]
    assert left.startswith("(a compaction folds at most 2 windows of tokens at a time: the ") and left.endswith(
        "are left out, as without --compact; the saved conversation keeps every message)"), left
    assert notes[1].startswith("(compacting ") and notes[1].endswith(" into a summary, in several requests ...)")
    assert notes[2].startswith("(compacted "), notes
    folded = int(notes[2].split()[1])
    assert 0 < folded < 20 and s.covers == runner.first, (folded, s.covers)
    assert runner.sent()[2:] == runner.session.messages[s.covers:]
    # the summary stands for the messages it folded, not for the older ones left out: its heading, its saved form
    # and what a resumed chat says count those (they counted every message before the window as summarized)
    assert s.count == folded < s.covers, (s.count, folded, s.covers)
    assert f"({folded} messages, summarized)" in str(runner.head()[-1]["content"]), runner.head()
    saved = s.to_dict()
    assert saved["summarized"] == folded and Summary.from_dict(saved, len(runner.session.messages)) == s
    from localgen.cli.chat.view import summarized

    assert summarized(runner.session) == (f" (the first {s.covers:,}: {folded:,} sent as a summary, the "
                                          f"{s.covers - folded:,} before left out)")


def test_a_summary_saved_before_it_counted_what_it_summarized_stands_for_all_it_covers() -> None:
    """A conversation saved before a summary kept its count reads as one of every message it covers; a count
    that is not one of those messages is a damaged summary."""
    old = {"text": "t", "covers": 4, "tokens": 3, "compactions": 1, "model": "m", "created": 1.0}
    s = Summary.from_dict(old, 6)
    assert (s.count, s.to_dict()["summarized"]) == (4, 4)
    for bad in (0, 5, "2", True):
        with pytest.raises(ValueError):
            Summary.from_dict({**old, "summarized": bad}, 6)


def test_the_room_kept_for_the_answer_is_max_tokens_where_given() -> None:
    """chat.md: the room left for the answer is --max-tokens, or a quarter of the window (at least 16), at most
    half of it. `chat -n 8` said "16 more are kept for the answer" (a newcomer's trial): the floor was taken for
    the answer asked for too."""
    from localgen.chat.runner import ChatRunner

    def reserve(max_tokens: int, n_ctx: int) -> int:
        return int(ChatRunner(ChatSession(name="room", model="m"), None, SamplingParams(max_tokens=max_tokens))
                   .reserve(n_ctx))

    assert reserve(8, 256) == 8 and reserve(500, 256) == 128 and reserve(8, 8) == 4
    assert reserve(0, 256) == 64 and reserve(0, 32) == 16 and reserve(0, 8192) == 2048
    from localgen.chat.runner import answer_room  # run --rag leaves the same room (rag.md): it kept 16 for -n 8

    assert answer_room(256, 8) == 8 and answer_room(256, 0) == 64 and answer_room(256, 500) == 128
