"""Saved chat files written by hand or by another tool (docs/chat.md, Saving): one without a log id is logged as a
conversation of its own once loaded; one with a malformed message is reported (the file and the entry) and left as
it is; one without a model is named when it cannot be resumed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CLI

N = ["-n", "5", "--temperature", "0"]


@pytest.fixture
def scli(cli_env: dict[str, str], tmp_path: Path) -> CLI:
    return CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")})


def _chats(scli: CLI) -> Path:
    d = Path(scli.env["LOCALGEN_HOME"]) / "data" / "chats"
    d.mkdir(parents=True, exist_ok=True)
    return d


ADA = [{"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": "Hi Ada."}]


def test_loading_a_file_without_a_log_id_logs_its_answers_under_an_id_of_its_own(scli: CLI) -> None:
    (_chats(scli) / "ed3.json").write_text(json.dumps({"model": "smollm2:135m", "messages": ADA}))
    r = scli("chat", *N, input="/load ed3\nWhat is my name?\n")
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr and "unusable" not in r.stderr, r.stderr
    saved = json.loads((_chats(scli) / "ed3.json").read_text())
    assert saved["log_id"] and len(saved["messages"]) == 4
    rows = json.loads(scli("logs", "-n", "0", "--json").stdout)
    assert [(x["conversation_id"], x["prompt"]) for x in rows] == [(saved["log_id"], "What is my name?")]


@pytest.mark.parametrize("how", ["load", "resume"])
def test_a_saved_file_with_a_malformed_message_is_reported_and_never_rewritten(scli: CLI, how: str) -> None:
    bad = _chats(scli) / "bad.json"
    bad.write_text(json.dumps({"model": "smollm2:135m", "messages": [*ADA, {"role": 5, "content": None}]}))
    before = bad.read_bytes()
    r = (scli("chat", *N, input="/load bad\nWhat is my name?\n") if how == "load" else
         scli("chat", "--resume", "bad", *N, input="What is my name?\n"))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(f"localgen: error: the saved conversation {bad} has a "
                                                        "malformed message: entry 3 of \"messages\" has the role 5")
    assert bad.read_bytes() == before, "a corrupt saved file is never overwritten"


def test_resuming_a_file_without_a_model_names_the_file_and_takes_m(scli: CLI) -> None:
    f = _chats(scli) / "nomodel.json"
    f.write_text(json.dumps({"messages": ADA}))
    r = scli("chat", "--resume", "nomodel", *N, input="What is my name?\n")
    assert r.returncode == 1 and r.stdout == ""
    assert f"the saved conversation {f} names no model" in r.stderr and "-m MODEL" in r.stderr, r.stderr
    r = scli("chat", "--resume", "nomodel", "-m", "smollm2:135m", *N, input="What is my name?\n")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr


@pytest.mark.parametrize(("line", "said", "not_said"), [
    ("/save ../x", "bad conversation name '../x'", "chat -m"),
    ("/set nosuch 1", "unknown setting 'nosuch'; /set takes: ", None),
    ("/undo extra", "/undo takes no argument", None),
])
def test_slash_command_words_it_cannot_take_are_one_line_refusals(scli: CLI, line: str, said: str,
                                                                   not_said: str | None) -> None:
    r = scli("chat", *N, input=f"{line}\n")
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    error = r.stderr.strip().splitlines()[-1]
    assert said in error, r.stderr
    assert not_said is None or not_said not in r.stderr
    if line.startswith("/set"):
        named = set(error.rsplit("takes: ", 1)[-1].split(" (")[0].split(", "))
        assert {"system", "reasoning", "compact", "think", "verbose", "markdown", "temperature", "top_k"} <= named


def test_a_damaged_saved_file_is_listed_as_a_warning_and_left_as_it_is(scli: CLI) -> None:
    """`chat --list` names each saved file it cannot read, and why, in a warning line, beside the ones it lists;
    the files stay byte for byte."""
    d = _chats(scli)
    damaged = {"list.json": b"[]", "latin.json": b"\xff", "cut.json": b"{"}
    for name, raw in damaged.items():
        (d / name).write_bytes(raw)
    (d / "ada.json").write_text(json.dumps({"model": "smollm2:135m", "messages": ADA}))
    r = scli("chat", "--list")
    assert r.returncode == 0, r.stderr
    assert [line.split()[0] for line in r.stdout.splitlines()] == ["ada"], r.stdout
    assert sorted(r.stderr.splitlines()) == sorted(
        f"warning: the saved conversation {d / name} cannot be read ({why}): it is left as it is"
        for name, why in (("cut.json", "it is not JSON"), ("latin.json", "it is not UTF-8 text"),
                          ("list.json", "it is not a saved conversation"))), r.stderr
    assert {name: (d / name).read_bytes() for name in damaged} == damaged


def _long(name: str, n: int) -> Any:
    """A conversation of n turns (some 1 KiB each), as a chat saves it."""
    from localgen.chat.session import ChatSession

    session = ChatSession(name=name, model="smollm2:135m")
    for i in range(n):
        session.add("user", f"Question {i}: " + "x" * 500)
        session.add("assistant", "y" * 500)
    return session


def test_chat_list_reads_a_huge_saved_file_s_head_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """docs/chat.md: `chat --list` reads at most 1 MiB of each file; a save writes what it lists first."""
    import tracemalloc

    from localgen.chat import session as sessions

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path / "home"))
    path = _long("big", 8000).save()
    assert path.stat().st_size > 8 << 20
    tracemalloc.start()
    try:
        listed = sessions.list_sessions()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [(s.name, s.model, s.turns, s.preview) for s in listed] == [
        ("big", "smollm2:135m", 8000, ("Question 0: " + "x" * 500)[:60])]
    assert peak < 4 << 20, peak  # the whole file read (old) would be over 8 MiB


def test_a_huge_saved_file_without_the_listed_fields_first_is_one_warning_line(scli: CLI) -> None:
    """A file over 1 MiB written by hand (or by an older localgen) that does not begin with "turns" is one
    warning line of `chat --list`, left as it is; a small one is listed whole, as before."""
    d = _chats(scli)
    big = d / "old.json"
    big.write_text(json.dumps({"model": "smollm2:135m", "messages": ADA * 15000}))
    assert big.stat().st_size > 1 << 20
    kept = big.read_bytes()
    (d / "ada.json").write_text(json.dumps({"model": "smollm2:135m", "messages": ADA}))
    r = scli("chat", "--list")
    assert r.returncode == 0, r.stderr
    assert [line.split()[0] for line in r.stdout.splitlines()] == ["ada"], r.stdout
    assert r.stderr.splitlines() == [
        f"warning: the saved conversation {big} cannot be read (it is larger than 1 MiB and does not begin with "
        "the fields `chat --list` shows; its next save writes them): it is left as it is"], r.stderr
    assert big.read_bytes() == kept
