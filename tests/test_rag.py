"""`run --rag` and `chat --rag` (docs/rag.md): each question's excerpts, found as `similar` finds them, go into
its message in the fixed template; the sources in --json, on stderr and with /sources; fitting to the window;
the errors. Real CLI, the seeded tiny BERT of tests/tiny_bert.py for the collection, SmolLM2 (and Gemma 3 under a
template without a system role) for the answers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pexpect
import pytest

from localgen.embeddings.retrieve import RAG_INSTRUCTION
from tests.conftest import CLI
from tests.fake_openai import FakeServer

ENTRIES = [("cats.md#1", "The cat named Whiskers sleeps on the red sofa."),
           ("paris.md#1", "Paris is the capital of France; the Eiffel tower is there."),
           ("llama.md#2", "Llamas live in the Andes mountains of South America."),
           ("tea.md#4", "Green tea is brewed with water below boiling.")]
QUICK = ["-n", "12", "--temperature", "0"]


@pytest.fixture(scope="module")
def hcli(cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> CLI:
    """A CLI with a home of its own holding the collection `notes` (ENTRIES) and the empty collection `empty`."""
    from tests.tiny_bert import build

    tmp = tmp_path_factory.mktemp("rag")
    bert = str(build(tmp / "tiny-bert.gguf"))
    hcli = CLI({**cli_env, "LOCALGEN_HOME": str(tmp / "home")})
    docs = tmp / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in ENTRIES))
    r = hcli("embed", "-m", bert, "--file", str(docs), "--store", "notes")
    assert r.returncode == 0, r.stderr
    r = hcli("embed", "-m", bert, "--store", "empty", "gone")
    assert r.returncode == 0, r.stderr
    r = hcli("collections", "rm", "empty", "--id", json.loads(hcli("collections", "show", "empty", "--json")
                                                                .stdout)["items"][0]["id"])
    assert r.returncode == 0, r.stderr
    return hcli


def similar(hcli: CLI, query: str) -> list[dict[str, Any]]:
    r = hcli("similar", "notes", query)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def message(question: str, hits: list[dict[str, Any]]) -> str:
    """The template of docs/rag.md, written out here."""
    excerpts = "\n\n".join(f"[{h['id']}]\n{h['content']}" for h in hits)
    return f"{RAG_INSTRUCTION}\n\n{excerpts}\n\nQuestion: {question}"


def logged(hcli: CLI, n: int) -> list[dict[str, Any]]:
    """The last n exchanges of the log, oldest first."""
    r = hcli("logs", "-n", str(n), "--json")
    assert r.returncode == 0, r.stderr
    entries: list[dict[str, Any]] = json.loads(r.stdout)
    return entries


def test_run_rag_sends_similars_excerpts_in_the_template_and_json_names_them(hcli: CLI) -> None:
    question = "Where do llamas live?"
    want = similar(hcli, question)[:3]
    r = hcli("run", "--rag", "notes", "--rag-top", "3", question, "--json", *QUICK)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)  # stdout is the one JSON object
    assert doc["sources"] == [{"id": h["id"], "score": h["score"]} for h in want]
    assert r.stderr == ""  # not a terminal, no --verbose: no sources line, nothing left out
    (entry,) = logged(hcli, 1)
    assert entry["prompt"] == message(question, want), "the log holds the message as sent"
    r = hcli("run", "--rag", "notes", question, "--verbose-prompt", *QUICK)  # --rag-top 4 by default
    assert r.returncode == 0, r.stderr
    assert message(question, similar(hcli, question)) in r.stderr
    r = hcli("run", "--rag", "notes", question, "--verbose", *QUICK)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    sources = "sources: " + ", ".join(f"{h['id']} ({h['score']:.3f})" for h in similar(hcli, question))
    assert r.stderr.splitlines()[-1] == sources


def test_the_question_is_the_prompt_and_piped_text_goes_before_the_excerpts(hcli: CLI) -> None:
    question = "What is the capital of France?"
    r = hcli("run", "--rag", "notes", "--verbose-prompt", *QUICK, input=question + "\n")  # stdin alone: the question
    assert r.returncode == 0, r.stderr
    assert message(question, similar(hcli, question)) in r.stderr
    r = hcli("run", "--rag", "notes", question, "--verbose-prompt", *QUICK, input="A NOTE PIPED IN\n")
    assert r.returncode == 0, r.stderr
    assert "A NOTE PIPED IN\n\n" + message(question, similar(hcli, question)) in r.stderr


def test_excerpts_that_do_not_fit_are_left_out_lowest_first(hcli: CLI) -> None:
    """--ctx 256 (llama.cpp's smallest window) with -n 110 kept for the answer: the four excerpts do not fit, the
    lowest-scoring go first; a question that does not fit alone is the usual too-long error."""
    question = "Where do llamas live?"
    want = similar(hcli, question)
    r = hcli("run", "--rag", "notes", question, "--json", "--ctx", "256", "-n", "110", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    sent = json.loads(r.stdout)["sources"]
    assert 0 < len(sent) < len(want) and sent == [{"id": h["id"], "score": h["score"]} for h in want[:len(sent)]]
    dropped = want[len(sent):]
    assert r.stderr == (f"rag: {len(dropped)} excerpt{'s' if len(dropped) > 1 else ''} left out to fit the context "
                        f"window ({', '.join(h['id'] for h in dropped)}); {len(sent)} sent\n")
    (entry,) = logged(hcli, 1)
    assert entry["prompt"] == message(question, want[:len(sent)])
    long = "Where do llamas live? " + "Please answer carefully. " * 200
    r = hcli("run", "--rag", "notes", long, "--ctx", "256", *QUICK)
    # the one error (a line before it said "4 excerpts left out ...; 0 sent", as if they were what did not fit)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("localgen: error: the prompt is ") and "the context window is 256" in r.stderr


def test_scripted_chat_retrieves_for_each_question_and_keeps_the_excerpts(hcli: CLI) -> None:
    questions = ["Where do llamas live?", "What is the capital of France?"]
    r = hcli("chat", "ragchat", "--rag", "notes", "--rag-top", "2", *QUICK,
             input="\n".join(questions) + "\n/sources\n")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 2  # stdout: the two answers only
    wants = [similar(hcli, q)[:2] for q in questions]
    assert wants[0] != wants[1]
    prompts = [e["prompt"] for e in logged(hcli, 2)]
    assert prompts == [message(q, w) for q, w in zip(questions, wants, strict=True)]
    # /sources: the last question's excerpts, in full, on stderr
    assert r.stderr == "".join(f"[{h['id']}] (score {h['score']:.3f})\n{h['content']}\n" for h in wants[1])
    saved = json.loads((Path(hcli.env["LOCALGEN_HOME"]) / "data" / "chats" / "ragchat.json").read_text())
    users = [m["content"] for m in saved["messages"] if m["role"] == "user"]
    assert users == prompts, "the conversation keeps each message as sent, excerpts and all"
    listed = hcli("chat", "--list")
    row = next(line for line in listed.stdout.splitlines() if line.startswith("ragchat"))
    assert row.endswith(questions[0]) and "excerpts" not in row, row  # listed by its question, not the template


def test_a_chat_searches_the_collection_as_it_is_when_asked(hcli: CLI, tmp_path: Path) -> None:
    """Entries stored or removed by another process during a chat are found, or no longer sent, from the next
    question on."""
    from tests.tiny_bert import build

    bert = str(build(tmp_path / "tiny-bert.gguf"))
    live = tmp_path / "live.jsonl"
    live.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in ENTRIES[:2]))
    assert hcli("embed", "-m", bert, "--file", str(live), "--store", "live").returncode == 0
    chat = hcli.popen("chat", "--rag", "live", "--rag-top", "4", *QUICK, stdin=subprocess.PIPE,
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    try:
        def sources() -> set[str]:
            """The ids /sources prints (to stderr: scripted), read up to the line after the last excerpt."""
            chat.stdin.write("/sources\n/sources\n")  # the second's first line marks the end of the first's
            chat.stdin.flush()
            seen: list[str] = []
            while True:
                line = chat.stderr.readline()
                assert line, "the chat ended early"
                if line.startswith("[") and "(score" in line:
                    ident = line[1:line.index("]")]
                    if ident in seen:
                        return set(seen)
                    seen.append(ident)

        chat.stdin.write("Where does the cat sleep?\n")
        assert sources() == {"cats.md#1", "paris.md#1"}
        r = hcli("collections", "rm", "live", "--id", "paris.md#1")  # sensitive, say: gone from the next question
        assert r.returncode == 0, r.stderr
        live.write_text(json.dumps({"id": ENTRIES[2][0], "text": ENTRIES[2][1]}) + "\n")
        assert hcli("embed", "-m", bert, "--file", str(live), "--store", "live").returncode == 0
        chat.stdin.write("Where do llamas live?\n")
        assert sources() == {"cats.md#1", "llama.md#2"}
        chat.stdin.close()
        assert chat.wait(timeout=120) == 0
    finally:
        if chat.poll() is None:
            chat.kill()
            chat.wait()
    prompts = [e["prompt"] for e in logged(hcli, 2)]
    assert ENTRIES[1][1] in prompts[0] and ENTRIES[2][1] not in prompts[0]
    assert ENTRIES[1][1] not in prompts[1] and ENTRIES[2][1] in prompts[1], prompts[1]


def test_chat_on_a_terminal_shows_the_sources_after_each_answer(hcli: CLI) -> None:
    from tests import terminal

    env = dict(hcli.env)
    env.pop("NO_COLOR", None)
    env.update(TERM="xterm", PROMPT_TOOLKIT_NO_CPR="1")
    child = terminal.spawn(env, ["chat", "--rag", "notes", "--rag-top", "2", *QUICK], timeout=60)
    child.expect("ready in")
    child.expect_exact(">>>")
    want = similar(hcli, "Where do llamas live?")[:2]
    child.sendline("Where do llamas live?")
    child.expect_exact("sources: " + ", ".join(f"{h['id']} ({h['score']:.3f})" for h in want))
    child.expect_exact(">>>")
    child.sendline("/sources")
    child.expect_exact(want[0]["content"])
    child.expect_exact(">>>")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_a_collection_removed_during_a_chat_is_said_once_not_as_none_fitting(hcli: CLI, tmp_path: Path) -> None:
    """The collection removed by another process mid-chat: the next question says so, once, and goes without
    excerpts; its sources line says "none". It said `sources: none (none fit)`, as if they had not fitted."""
    import pexpect

    from tests import terminal
    from tests.tiny_bert import build

    bert = str(build(tmp_path / "tiny-bert.gguf"))
    assert hcli("embed", "-m", bert, "--store", "brief", ENTRIES[2][1]).returncode == 0
    env = dict(hcli.env)
    env.pop("NO_COLOR", None)
    env.update(TERM="xterm", PROMPT_TOOLKIT_NO_CPR="1")
    child = terminal.spawn(env, ["chat", "--rag", "brief", *QUICK], timeout=60)
    child.expect_exact(">>>")
    child.sendline("Where do llamas live?")
    child.expect(r"sources: \S+ \(")
    child.expect_exact(">>>")
    r = hcli("collections", "rm", "brief", "--yes")
    assert r.returncode == 0, r.stderr
    said = []
    for question in ("Where do llamas live?", "And the cat?"):
        child.sendline(question)
        child.expect_exact("sources: none")
        said.append(" ".join(str(child.before).split()))
        child.expect_exact(">>>")
        assert "none fit" not in str(child.before), child.before
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert "rag: the collection 'brief' was removed: the question goes without excerpts" in said[0], said[0]
    assert "removed" not in said[1], said[1]


def test_a_template_without_a_system_role_gets_the_excerpts_in_the_user_turn(hcli: CLI, tmp_path: Path) -> None:
    """Gemma 3's way (no system role: a template that refuses one) works, as the excerpts are in the user's turn."""
    template = tmp_path / "nosystem.jinja"
    template.write_text("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}"
                        "{{ raise_exception('System role not supported') }}{% endif %}<start_of_turn>"
                        "{{ 'model' if m['role'] == 'assistant' else 'user' }}\n{{ m['content'] }}<end_of_turn>\n"
                        "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
    question = "What is the capital of France?"
    r = hcli("run", "-m", "gemma3:270m", "--chat-template-file", str(template), "--rag", "notes", question,
             "--verbose-prompt", *QUICK)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    assert f"<start_of_turn>user\n{message(question, similar(hcli, question))}<end_of_turn>" in r.stderr


def test_rag_with_an_endpoint_retrieves_here_and_sends_the_excerpts(hcli: CLI, fake: FakeServer) -> None:
    question = "Where do llamas live?"
    r = hcli("run", "--endpoint", fake.url, "-m", "plain", "--rag", "notes", question, "--json", timeout=60)
    assert r.returncode == 0, r.stderr
    want = similar(hcli, question)
    assert json.loads(r.stdout)["sources"] == [{"id": h["id"], "score": h["score"]} for h in want]
    assert fake.requests[-1]["body"]["messages"][-1] == {"role": "user", "content": message(question, want)}


@pytest.mark.parametrize(("args", "error"), [
    (["run", "--rag", "nope", "hi"], "no collection named 'nope' (there are: "),
    (["chat", "--rag", "nope"], "no collection named 'nope' (there are: "),
    (["run", "--rag", "empty", "hi"], "the collection 'empty' is empty: there is nothing to answer from"),
    (["chat", "--rag", "empty"], "the collection 'empty' is empty: there is nothing to answer from"),
    (["run", "--rag", "notes", "--rag-top", "0", "hi"], "--rag-top must be at least 1, not 0"),
    (["run", "--rag-top", "2", "hi"], "--rag-top goes with --rag COLLECTION"),
    (["chat", "--rag-top", "2"], "--rag-top goes with --rag COLLECTION"),
    (["run", "--rag", "", "hi"], "--rag is empty"),
    (["run", "--rag", "notes", "  \t "], "the question is blank: --rag searches the collection for it"),
    (["run", "--rag", "notes", "--raw", "hi"], "--rag cannot be combined with --raw"),
    (["run", "--rag", "notes", "--each-line", "-p", "hi"], "--rag cannot be combined with --file/--each-line"),
    (["run", "--rag", "notes", "--beams", "2", "hi"], "--rag cannot be combined with --beams"),
    (["run", "--rag", "notes", "--functions", "tests/fake_openai.py", "--yes", "hi"],
     "tools (--functions, --mcp) cannot be combined with --rag"),
])
def test_usage_errors_before_anything_loads(hcli: CLI, args: list[str], error: str) -> None:
    r = hcli(*args, input="")
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr.count("\n") == 1 and error in r.stderr, r.stderr
    assert "loading" not in r.stderr


def test_a_chat_model_that_is_not_there_is_said_before_the_embedding_model_loads(hcli: CLI, tmp_path: Path) -> None:
    """The chat's model is found before --rag's embedding model loads (which may take minutes): a collection whose
    embedding model is gone too shows which was looked for first, the error naming -m, not the collection's model."""
    from tests.tiny_bert import build

    bert = build(tmp_path / "gone-bert.gguf")
    r = hcli("embed", "-m", str(bert), "--store", "orphan", "A text whose model goes.")
    assert r.returncode == 0, r.stderr
    bert.unlink()
    missing = tmp_path / "missing.gguf"
    for command in (["run", "hi"], ["chat"]):
        r = hcli(*command, "-m", str(missing), "--rag", "orphan", input="hi\n")
        assert (r.returncode, r.stderr) == (2, f"localgen: error: -m/--model {missing}: no such file\n"), r.stderr
        r = hcli(*command, "-m", "nosuchmodel", "--rag", "orphan", input="hi\n")
        assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith("localgen: error: unknown model 'nosuchmodel'"), r.stderr
    r = hcli("chat", "--rag", "orphan", input="hi\n")  # the chat's model there: then the collection's is missed
    assert (r.returncode, r.stderr.count("\n")) == (1, 1), r.stderr
    assert r.stderr.startswith(f"localgen: error: the collection 'orphan' was made with {bert}: "), r.stderr
    assert "bring the model back" in r.stderr, r.stderr


def test_a_collection_made_with_a_relative_path_says_so_from_another_folder(hcli: CLI, tmp_path: Path) -> None:
    """A collection keeps its model file's full path: one stored with `-m bert.gguf` finds it from any folder. One
    an older localgen kept with the path as typed is not there from another folder, and the error names the
    collection and why (it said `no such model file: bert.gguf`, for a model the command was never given)."""
    import sqlite3
    from contextlib import closing

    from tests.tiny_bert import build

    (tmp_path / "here").mkdir()
    (tmp_path / "elsewhere").mkdir()
    build(tmp_path / "here" / "bert.gguf")
    r = hcli("embed", "-m", "bert.gguf", "--store", "relative", "The cat sits on the mat.", cwd=tmp_path / "here")
    assert r.returncode == 0, r.stderr
    for folder in ("here", "elsewhere"):
        r = hcli("similar", "relative", "cat", cwd=tmp_path / folder)
        assert r.returncode == 0 and "The cat sits" in r.stdout, r.stderr
    db = Path(hcli.env["LOCALGEN_HOME"]) / "data" / "embeddings" / "embeddings.db"
    with closing(sqlite3.connect(db)) as conn, conn:  # as an older localgen kept it: -m as typed
        conn.execute("UPDATE collections SET model_spec = 'bert.gguf' WHERE name = 'relative'")
    r = hcli("similar", "relative", "cat", cwd=tmp_path / "elsewhere")
    assert (r.returncode, r.stderr.count("\n")) == (1, 1), r.stderr
    assert r.stderr.startswith("localgen: error: the collection 'relative' was made with bert.gguf: no such model "
                               "file"), r.stderr
    assert "run this from the folder it was stored from" in r.stderr, r.stderr


def test_a_model_without_chat_template_is_refused(hcli: CLI, bad_models: dict[str, Path]) -> None:
    for command in (["run", "hi"], ["chat"]):
        r: subprocess.CompletedProcess[str] = hcli(*command, "-m", str(bad_models["no_template"]), "--rag", "notes",
                                                   input="hi\n", timeout=120)
        assert r.returncode == 2 and r.stdout == "", r.stderr
        said = r.stderr.splitlines()  # one line (chat said first that the conversation would go on as text)
        assert len(said) == 1, said
        assert "has no chat template (it may be a base model), which --rag needs (it puts the excerpts into a " \
               "chat message)" in said[0], said


def test_a_continued_run_keeps_the_earlier_excerpts_and_adds_the_new_question_s(hcli: CLI) -> None:
    """`run -C --rag`: the logged conversation goes on as it was sent (the first question's message with its
    excerpts), and the new question gets its own excerpts, searched for it alone."""
    first, second = "Where do llamas live?", "How is green tea brewed?"
    r = hcli("run", "--rag", "notes", "--rag-top", "1", first, *QUICK)
    assert r.returncode == 0, r.stderr
    (entry,) = logged(hcli, 1)
    r = hcli("run", "-C", "--rag", "notes", "--rag-top", "1", second, "--verbose-prompt", *QUICK)
    assert r.returncode == 0, r.stderr
    one, two = message(first, similar(hcli, first)[:1]), message(second, similar(hcli, second)[:1])
    assert one != two and one in r.stderr and two in r.stderr and r.stderr.index(one) < r.stderr.index(two)
    assert f"{entry['response']}" in r.stderr[r.stderr.index(one):r.stderr.index(two)], "the first answer between"
    (cont,) = logged(hcli, 1)
    assert cont["prompt"] == two and cont["conversation_id"] == entry["conversation_id"]


def test_many_excerpts_are_fitted_in_a_few_tries_and_the_line_names_a_few(hcli: CLI, tmp_path: Path) -> None:
    """--rag-top 60 in a 256-token window: the most excerpts that fit are sent, best first, found by halving
    (a few prompts rendered, not one per excerpt left out); the line names five and counts the rest."""
    from localgen.embeddings.retrieve import Hit, fit
    from tests.tiny_bert import build

    tried: list[int] = []
    hits = [Hit(f"e{i}", 1.0 - i / 1000, "x") for i in range(1000)]
    assert fit(hits, lambda some: tried.append(len(some)) is None and len(some) <= 7) == hits[:7]
    assert len(tried) <= 12, tried
    assert fit(hits, lambda some: True) == hits and fit(hits, lambda some: not some) == []

    docs = tmp_path / "many.jsonl"
    docs.write_text("".join(json.dumps({"id": f"m{i:02}", "text": f"Note {i}: the llama number {i} lives in a "
                                        f"valley of the Andes."}) + "\n" for i in range(60)))
    r = hcli("embed", "-m", str(build(tmp_path / "tiny-bert.gguf")), "--file", str(docs), "--store", "many")
    assert r.returncode == 0, r.stderr
    question = "Where do llamas live?"
    r = hcli("similar", "many", question, "-n", "60")
    assert r.returncode == 0, r.stderr
    want = [json.loads(line)["id"] for line in r.stdout.splitlines()]
    r = hcli("run", "--rag", "many", "--rag-top", "60", question, "--json", "--ctx", "256", "-n", "110",
             "--temperature", "0")
    assert r.returncode == 0, r.stderr
    sent = [s["id"] for s in json.loads(r.stdout)["sources"]]
    assert 0 < len(sent) < 60 and sent == want[:len(sent)]
    dropped = want[len(sent):]
    assert r.stderr == (f"rag: {len(dropped)} excerpts left out to fit the context window ({', '.join(dropped[:5])} "
                        f"and {len(dropped) - 5} more); {len(sent)} sent\n")
