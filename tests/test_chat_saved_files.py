"""Saved chat files written by hand or by another tool (docs/chat.md, Saving): one without a log id is logged as a
conversation of its own once loaded; one with a malformed message is reported (the file and the entry) and left as
it is; one without a model is named when it cannot be resumed; one saved as UTF-16, one whose first message is a
system one, a chats folder that is a broken link and a name that is not UTF-8 (the section at the end)."""

from __future__ import annotations

import contextlib
import json
import os
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
    ("/set max_token 5", "unknown setting 'max_token'; did you mean max_tokens?", "/set takes"),
    ("/set markdwn on", "unknown setting 'markdwn'; did you mean markdown?", "/set takes"),
    ("/undo extra", "/undo takes no argument", None),
    ("/retry 3", "/retry takes no argument: '3' was not understood", None),  # each was run, its word dropped
    ("/clear now", "/clear takes no argument: 'now' was not understood", None),
    ("/stats x", "/stats takes no argument: 'x' was not understood", None),
    ("/load ../x", "bad conversation name '../x'", "with the model"),  # a path: no hint (it said `chat -m ../x`)
    ("/load smollm2:135m", "(to chat with the model smollm2:135m: /model smollm2:135m)", "chat -m"),
    ("/load hf.co/owner/repo:q4_k_m", "(to chat with the model hf.co/owner/repo:q4_k_m: /model hf.co/", None),
    ("/load ollama:llama3.2:1b", "(to chat with the model ollama:llama3.2:1b: /model ollama:llama3.2:1b)", None),
])
def test_slash_command_words_it_cannot_take_are_one_line_refusals(scli: CLI, line: str, said: str,
                                                                   not_said: str | None) -> None:
    r = scli("chat", *N, input=f"{line}\n")
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    error = r.stderr.strip().splitlines()[-1]
    assert said in error, r.stderr
    assert not_said is None or not_said not in r.stderr
    if line.startswith("/set") and "did you mean" not in said:
        named = set(error.rsplit("takes: ", 1)[-1].split(" (")[0].split(", "))
        assert {"system", "reasoning", "compact", "think", "verbose", "markdown", "temperature", "top_k"} <= named


def test_a_damaged_saved_file_is_listed_as_a_warning_and_left_as_it_is(scli: CLI) -> None:
    """`chat --list` names each saved file it cannot read, and why, in a warning line, beside the ones it lists;
    the files stay byte for byte."""
    d = _chats(scli)
    damaged = {"list.json": b"[]", "latin.json": b"\xff", "cut.json": b"{",  # a message --resume refuses too:
               "bad.json": b'{"model":"smollm2:135m","messages":[{"role":5,"content":"x"}]}'}  # it was listed
    for name, raw in damaged.items():
        (d / name).write_bytes(raw)
    (d / "ada.json").write_text(json.dumps({"model": "smollm2:135m", "messages": ADA}))
    r = scli("chat", "--list")
    assert r.returncode == 0, r.stderr
    assert [line.split()[0] for line in r.stdout.splitlines()] == ["ada"], r.stdout
    assert sorted(r.stderr.splitlines()) == sorted(
        f"warning: the saved conversation {d / name} cannot be read ({why}): it is left as it is"
        for name, why in (("cut.json", "it is not JSON"), ("latin.json", "it is not UTF-8 text"),
                          ("list.json", "it is not a saved conversation"),
                          ("bad.json", 'it has a malformed message: entry 1 of "messages" has the role 5 (user, '
                                       'assistant or tool)'))), r.stderr
    assert {name: (d / name).read_bytes() for name in damaged} == damaged
    r = scli("chat", "--resume", "bad", *N, input="hi\n")
    assert r.returncode == 1 and 'entry 1 of "messages" has the role 5' in r.stderr, r.stderr


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

    from localgen.chat import saved

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path / "home"))
    path = _long("big", 8000).save()
    assert path.stat().st_size > 8 << 20
    tracemalloc.start()
    try:
        listed = saved.list_sessions()
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


# ---- files written by hand or by another tool: what localgen does not use is kept; a bad value is reported ----------

@pytest.fixture
def chats(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The chats folder of a LOCALGEN_HOME, for tests that call the session code in this process (no model)."""
    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path / "home"))
    d = tmp_path / "home" / "data" / "chats"
    d.mkdir(parents=True)
    return d


def test_a_loaded_file_keeps_the_fields_localgen_does_not_use_and_never_sends_them(chats: Path) -> None:
    """docs/chat.md, Saving: another tool's fields, at the top and in a message (a null tool field too), are written
    back as they were at each save; the messages the model is sent hold localgen's fields only."""
    from localgen.chat.session import ChatSession

    theirs = {"model": "smollm2:135m", "tags": ["work"], "pinned": {"by": "me", "at": [1, 2]},
              "messages": [{"role": "user", "content": "hi", "note": "keep me"},
                           {"role": "assistant", "content": "yo", "tool_calls": None, "rating": 5}]}
    (chats / "extra.json").write_text(json.dumps(theirs))
    session = ChatSession.load("extra")
    assert session.conversation() == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    session.add("user", "Hello")
    session.add("assistant", "Hi.")
    session.save()
    saved = json.loads((chats / "extra.json").read_text())
    assert saved["tags"] == ["work"] and saved["pinned"] == {"by": "me", "at": [1, 2]}
    assert saved["messages"] == [*theirs["messages"], {"role": "user", "content": "Hello"},
                                 {"role": "assistant", "content": "Hi."}]
    assert ChatSession.load("extra").to_dict()["messages"] == saved["messages"]  # and again, as they were


@pytest.mark.parametrize(("where", "key", "value", "why"), [
    (2, "tool_calls", "bogus", 'entry 2 of "messages" has "tool_calls" that are not a list of calls'),
    (2, "tool_calls", [{"name": "f"}], 'entry 2 of "messages" has "tool_calls" that are not a list of calls'),
    (2, "reasoning_content", {"a": 1}, 'entry 2 of "messages" has a "reasoning_content" of type dict, not text'),
    (1, "name", 5, 'entry 1 of "messages" has a "name" of type int, not text'),
    (None, "model", 5, 'is not in localgen\'s format: its "model" is not text'),
    (None, "log_id", {"id": 1}, 'is not in localgen\'s format: its "log_id" is not text'),
    (None, "settings", [["temperature", 0]], 'is not in localgen\'s format: its "settings" are not an object'),
    (None, "created", 1e20, 'is not in localgen\'s format: its "created" is not a time'),
    (None, "updated", "yesterday", 'is not in localgen\'s format: its "updated" is not a time'),
])
def test_a_field_of_localgen_s_with_a_bad_value_is_reported_and_the_file_left_as_it_is(
        chats: Path, where: int | None, key: str, value: Any, why: str) -> None:
    """A value a save never writes in one of localgen's fields is not dropped (the next save would lose it): the
    file and the entry are named, and the file is left byte for byte."""
    from localgen.chat.session import ChatSession
    from localgen.errors import LocalgenError

    data: dict[str, Any] = {"model": "smollm2:135m", "messages": [dict(m) for m in ADA]}
    (data["messages"][where - 1] if where else data)[key] = value
    f = chats / "bad.json"
    f.write_text(json.dumps(data))
    before = f.read_bytes()
    with pytest.raises(LocalgenError) as e:
        ChatSession.load("bad")
    assert e.value.message.startswith(f"the saved conversation {f} "), e.value.message
    assert why in e.value.message, e.value.message
    assert f.read_bytes() == before


def _unblock(fifo: Path) -> None:
    """Ends an open the old code left waiting on the FIFO: a writer's open and close ends a read (end of file),
    a reader's ends a write."""
    import os

    for flag in (os.O_WRONLY, os.O_RDONLY):
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, flag | os.O_NONBLOCK))


def _in_time(call: Any, fifo: Path) -> Any:
    """call(), which must end within a minute (a FIFO read would wait for a writer forever)."""
    import threading

    out: list[Any] = []
    worker = threading.Thread(target=lambda: out.append(call()), daemon=True)
    worker.start()
    worker.join(60)
    hung = worker.is_alive()
    _unblock(fifo)
    worker.join(10)
    assert not hung, "it hung on the FIFO"
    return out[0] if out else None


def _damaged(chats: Path) -> dict[str, str]:
    """Saved files `chat --list` cannot list, made in `chats`, and why each is skipped."""
    import os

    for name, text in (("inf", '{"model": "m", "updated": 1e400, "messages": []}'),
                       ("nan", '{"model": "m", "updated": NaN, "messages": []}'),
                       ("far", '{"model": "m", "updated": 1e20, "messages": []}'),
                       ("deep", '{"model": "m", "messages": ' + "[" * 50000 + "]" * 50000 + "}")):
        (chats / f"{name}.json").write_text(text)
    os.mkfifo(chats / "fifo.json")
    (chats / "null.json").symlink_to("/dev/null")  # as /dev/zero is, where a read never ends
    (chats / "dir.json").mkdir()
    return {"inf": 'its "updated" is not a time', "nan": 'its "updated" is not a time',
            "far": 'its "updated" is not a time', "deep": "it nests more than 200 levels deep",
            "fifo": "it is a FIFO", "null": "it is a device", "dir": "it is a folder"}


def test_chat_list_warns_of_each_file_it_cannot_list_and_lists_the_others(
        chats: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/chat.md: one bad file in the chats folder is a warning line naming it (a time no date can be written of,
    a nesting too deep, a FIFO, a device, a folder), never a traceback or a hang, and the others are listed."""
    import time

    from localgen.cli.chat.loop import print_list

    whys = _damaged(chats)
    (chats / "ada.json").write_text(json.dumps({"model": "smollm2:135m", "updated": 1.7e9, "messages": ADA}))
    _in_time(print_list, chats / "fifo.json")
    out, err = capsys.readouterr()
    assert [line.split()[:2] for line in out.splitlines()] == [["ada", time.strftime("%Y-%m-%d",
                                                                                     time.localtime(1.7e9))]], out
    assert sorted(err.splitlines()) == sorted(
        f"warning: the saved conversation {chats / name}.json cannot be read ({why}): it is left as it is"
        for name, why in whys.items()), err


def test_chat_list_lines_up_names_in_wide_characters(chats: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`chat --list`'s columns are counted in terminal cells: a name in Chinese (two cells a character) was padded
    by characters, and its line's date stood 4 cells right of the others'."""
    from rich.cells import cell_len

    from localgen.cli.chat.loop import print_list

    for name, model, t in (("ada", "smollm2:135m", 1.7e9), ("日本語の会話", "/m/模型.gguf", 1.7e9 + 60)):
        (chats / f"{name}.json").write_text(json.dumps({"model": model, "updated": t, "messages": ADA}))
    print_list()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("日本語の会話 "), lines
    dates = [cell_len(line[:line.index("20")]) for line in lines]  # the cells before each line's date
    assert dates == [31, 31], lines
    previews = [cell_len(line[:line.index("My name")]) for line in lines]  # and before each preview, after the model
    assert previews[0] == previews[1], lines


def test_loading_a_file_that_cannot_be_read_is_one_error_never_a_hang(chats: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """--resume and /load of a FIFO, a device, a folder, a file nested too deeply or over 1 GiB: one error naming
    it (nothing read of a FIFO, a device or a file too large), the file left as it is."""
    from localgen.chat import session as sessions
    from localgen.chat.session import ChatSession
    from localgen.errors import LocalgenError

    assert sessions.LOAD_READ == 1 << 30  # docs/chat.md's figure; a test of it at 1 MiB reads less if it fails
    monkeypatch.setattr(sessions, "LOAD_READ", 1 << 20)
    whys = {**_damaged(chats), "huge": "it is 1,048,577 bytes, more than the 1 MiB a conversation is read to"}
    (chats / "huge.json").write_text(json.dumps({"model": "m", "messages": ADA, "pad": "x" * (1 << 20)}))
    (chats / "huge.json").write_bytes((chats / "huge.json").read_bytes()[:(1 << 20) + 1])
    for name, why in whys.items():
        def load(name: str = name) -> Any:
            try:
                ChatSession.load(name)
            except LocalgenError as e:
                return e.message
            return None
        said = _in_time(load, chats / "fifo.json")
        if name in ("inf", "nan", "far"):  # read, and refused as not localgen's format
            assert said == f"the saved conversation {chats / name}.json is not in localgen's format: {why}"
        else:
            assert said == f"the saved conversation {chats / name}.json is unreadable: {why}"


def test_the_input_history_where_a_folder_or_a_fifo_is_is_kept_for_the_session_only(tmp_path: Path) -> None:
    """docs/chat.md: a history that cannot be read or written is this chat's only: reading it gives nothing and
    writing it does nothing, without an error (prompt_toolkit's thread would print a traceback) or a hang; a file
    that can be is read and written as before."""
    import os

    from prompt_toolkit.history import FileHistory

    from localgen.cli.chat.repl import _history

    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    for name in ("dir", "fifo"):
        history = _history(FileHistory, tmp_path / name)
        assert _in_time(lambda h=history: list(h.load_history_strings()), tmp_path / "fifo") == []
        _in_time(lambda h=history: h.store_string("Hi"), tmp_path / "fifo")
    assert (tmp_path / "dir").is_dir() and not list((tmp_path / "dir").iterdir())
    history = _history(FileHistory, tmp_path / "file")
    history.store_string("Hi")
    history.store_string("two\nlines")
    assert list(_history(FileHistory, tmp_path / "file").load_history_strings()) == ["two\nlines", "Hi"]


def test_the_input_history_reads_its_newest_entries_only(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The input history grows by every message ever sent: of a file past MAX_HISTORY_READ only the newest
    entries are read (whole ones: the first, cut, is left out), in FileHistory's order; the file is left as it is.
    (A 2 GB history was read whole into memory, in prompt_toolkit's thread.)"""
    from prompt_toolkit.history import FileHistory

    from localgen.cli.chat import repl

    path = tmp_path / "history"
    writer = FileHistory(str(path))
    for i in range(400):
        writer.store_string(f"message {i}\nits second line {'x' * (i % 7)}")
    everything = list(FileHistory(str(path)).load_history_strings())
    assert list(repl._history(FileHistory, path).load_history_strings()) == everything  # under the bound: all
    before = path.read_bytes()
    monkeypatch.setattr(repl, "MAX_HISTORY_READ", 2000)
    newest = list(repl._history(FileHistory, path).load_history_strings())
    assert 20 < len(newest) < 60 and newest == everything[:len(newest)], newest[-3:]
    assert path.read_bytes() == before
    path.write_bytes(b"+" + b"y" * 5000)  # one line past the bound, no entry begins in what is read: nothing
    assert list(repl._history(FileHistory, path).load_history_strings()) == []
    newest = b"# 2026-12-01 10:00:00\n+" + b"w" * 1976 + b"\n"  # 2,000 bytes: its `#` line begins at the cut
    path.write_bytes(b"# 2026-11-30 09:00:00\n+" + b"z" * 3000 + b"\n" + newest)
    assert list(repl._history(FileHistory, path).load_history_strings()) == ["w" * 1976]  # whole: kept


def test_resuming_another_tool_s_file_keeps_its_fields_and_a_bad_one_is_left_as_it_is(scli: CLI) -> None:
    """The red team's case: `chat --resume` of a file with fields localgen does not use writes them back with the
    new turn; one whose "tool_calls" are not calls is one error, and the file stays byte for byte."""
    d = _chats(scli)
    theirs = {"model": "smollm2:135m", "tags": ["work"], "messages": [
        {"role": "user", "content": "hi", "note": "keep me"}, {"role": "assistant", "content": "yo"}]}
    (d / "extra.json").write_text(json.dumps(theirs))
    r = scli("chat", "--resume", "extra", *N, input="Hello\n")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    saved = json.loads((d / "extra.json").read_text())
    assert saved["tags"] == ["work"] and saved["messages"][:2] == theirs["messages"]
    assert [m["role"] for m in saved["messages"][2:]] == ["user", "assistant"]
    theirs["messages"][1].update(tool_calls="bogus", reasoning_content={"a": 1})
    (d / "bad.json").write_text(json.dumps(theirs))
    before = (d / "bad.json").read_bytes()
    r = scli("chat", "--resume", "bad", *N, input="Hello\n")
    assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(
        f"localgen: error: the saved conversation {d / 'bad.json'} has a malformed message: entry 2 of \"messages\" "
        "has \"tool_calls\" that are not a list of calls"), r.stderr
    assert (d / "bad.json").read_bytes() == before


def test_resume_without_a_name_takes_the_newest_file_even_one_chat_list_skips(scli: CLI) -> None:
    """docs/chat.md: `--resume` continues the last conversation. The newest file being one `chat --list` skips (over
    1 MiB, in an older version's layout) is resumed, read whole (an older one was resumed, and saved into); the
    newest being a damaged one is one error naming it, and neither file is changed."""
    import os

    d = _chats(scli)
    ada = d / "ada.json"
    ada.write_text(json.dumps({"model": "smollm2:135m", "messages": ADA}))
    big = d / "old.json"
    # over 1 MiB, without "turns" before the messages: an older version's layout (another tool's field here)
    big.write_text(json.dumps({"model": "smollm2:135m", "theirs": "x" * (1 << 20), "messages": ADA}))
    os.utime(ada, (1_700_000_000, 1_700_000_000))
    os.utime(big, (1_700_000_100, 1_700_000_100))
    kept = ada.read_bytes(), big.read_bytes()
    assert [line.split()[0] for line in scli("chat", "--list").stdout.splitlines()] == ["ada"]
    r = scli("chat", "--resume", *N, input="/show\n")
    assert r.returncode == 0, r.stderr
    assert "conversation old · 2 messages" in r.stderr, r.stderr
    stray = d / "old (copy).json"  # no conversation's name: another tool's file, never the one resumed
    stray.write_text("{")
    os.utime(stray, (1_700_000_150, 1_700_000_150))
    r = scli("chat", "--resume", *N, input="/show\n")
    assert r.returncode == 0 and "conversation old · 2 messages" in r.stderr, r.stderr
    bad = d / "bad.json"
    bad.write_text('{"model": "smollm2:135m", "messages": [')
    os.utime(bad, (1_700_000_200, 1_700_000_200))
    r = scli("chat", "--resume", *N, input="Hello\n")
    assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(
        f"localgen: error: the saved conversation {bad} is unreadable: it is not JSON"), r.stderr
    assert (ada.read_bytes(), big.read_bytes()) == kept


def test_resume_of_a_damaged_newest_file_names_it_and_how_to_resume_another(scli: CLI) -> None:
    """docs/chat.md: `--resume` without a name, the newest file damaged, is one error naming that file, with a hint
    to resume another by name (it said only that the file was left as it is: no way on); named, the other one
    resumes, and the damaged file is left as it is."""
    import os

    d = _chats(scli)
    (d / "ada.json").write_text(json.dumps({"model": "smollm2:135m", "messages": ADA}))
    os.utime(d / "ada.json", (1_700_000_000, 1_700_000_000))
    bad = d / "bad.json"
    bad.write_text('{"model": "smollm2:135m", "messages": [')
    r = scli("chat", "--resume", *N, input="Hello\n")
    assert r.returncode == 1 and r.stdout == "", r.stderr
    assert r.stderr.strip().splitlines() == [
        f"localgen: error: the saved conversation {bad} is unreadable: it is not JSON (the file was left as it is; "
        "resume another by name, `localgen chat --resume NAME`, as `localgen chat --list` names them)"], r.stderr
    r = scli("chat", "--resume", "bad", *N, input="Hello\n")  # named, it is the one asked for: no other to go on with
    assert r.returncode == 1 and "resume another" not in r.stderr, r.stderr
    r = scli("chat", "--resume", "ada", *N, input="/show\n")
    assert r.returncode == 0 and "conversation ada · 2 messages" in r.stderr, r.stderr
    assert bad.read_text() == '{"model": "smollm2:135m", "messages": ['


@pytest.mark.parametrize("pairs", [2, 8])
def test_a_conversation_of_over_a_megabyte_of_text_goes_on_with_its_newest_turns(scli: CLI, pairs: int) -> None:
    """A history longer than the window could hold by its size alone (over 1 MiB of text, as an older version's
    long chat; and over the 4 MiB a chat template may write, 8 pairs) is left out of the window as any too-long
    history is, and the chat goes on and saves (it was "the prompt is 1,232,252 characters", whatever was asked,
    and the conversation could never go on; past 4 MiB, "the model's chat template produced an absurdly long
    prompt")."""
    d = _chats(scli)
    long = [{"role": "user", "content": "tell me more. " * 44000}, {"role": "assistant", "content": "More."}] * pairs
    (d / "long.json").write_text(json.dumps({"model": "smollm2:135m", "messages": long}))
    r = scli("chat", "--resume", "long", *N, input="Hello\n")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    assert "the oldest turns are no longer sent to the model" in r.stderr, r.stderr
    saved = json.loads((d / "long.json").read_text())
    assert saved["messages"][:2 * pairs] == long
    assert [m["role"] for m in saved["messages"][2 * pairs:]] == ["user", "assistant"]


def test_a_file_of_a_newer_format_is_refused_and_left_as_it_is(scli: CLI) -> None:
    """docs/chat.md, Saving: a file a newer localgen wrote (a higher "format") is one error, exit 1, and never
    written back as this version's (it was loaded, and saved as format 1 without what it did not know); format 1
    and a file without "format" load as before."""
    d = _chats(scli)
    fut = d / "fut.json"
    fut.write_text(json.dumps({"format": 99, "model": "smollm2:135m", "messages": ADA, "future": {"x": 1}}))
    before = fut.read_bytes()
    for args, more in ((("--resume", "fut"), ""), (("--resume",), "; resume another by name, `localgen chat --resume "
                                                      "NAME`, as `localgen chat --list` names them")):
        r = scli("chat", *args, *N, input="Hello\n")
        assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.strip().splitlines() == [
            f"localgen: error: the saved conversation {fut} was written by a newer localgen (format 99) (resume it "
            f"with that version; the file was left as it is{more})"], r.stderr  # the newest, taken unasked: or another
    r = scli("chat", *N, input="/load fut\n")
    assert f"the saved conversation {fut} was written by a newer localgen (format 99)" in r.stderr, r.stderr
    assert fut.read_bytes() == before
    for name, fmt in (("one", {"format": 1}), ("none", {})):
        (d / f"{name}.json").write_text(json.dumps({**fmt, "model": "smollm2:135m", "messages": ADA}))
        r = scli("chat", "--resume", name, *N, input="/show\n")
        assert r.returncode == 0 and f"conversation {name} · 2 messages" in r.stderr, r.stderr
    (d / "text.json").write_text(json.dumps({"format": "2", "model": "smollm2:135m", "messages": ADA}))
    r = scli("chat", "--resume", "text", *N, input="Hello\n")
    assert r.returncode == 1 and 'is not in localgen\'s format: its "format" is not a whole number' in r.stderr


def test_a_new_chat_is_written_at_its_first_exchange_not_by_a_set_before_it(scli: CLI) -> None:
    """docs/chat.md, Saving: a /set, /system or /model before the first exchange leaves no file, and the name free;
    the first exchange saves them with it; /save NAME writes an empty chat at once."""
    d = _chats(scli)
    r = scli("chat", "setonly", *N, input="/set temperature 0.5\n/system Be brief.\n/model smollm2:135m\n/undo\n")
    assert r.returncode == 0, r.stderr
    assert not (d / "setonly.json").exists() and not list(d.iterdir())
    r = scli("chat", "setonly", *N, input="/set temperature 0.5\nHi\n")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    saved = json.loads((d / "setonly.json").read_text())
    assert saved["settings"] == {"temperature": 0.5} and len(saved["messages"]) == 2
    r = scli("chat", *N, input="/save named\n")
    assert r.returncode == 0, r.stderr
    assert json.loads((d / "named.json").read_text())["messages"] == []


# ---- two chats on one home at once (docs/chat.md, Saving) ---------------------------------------------------------

def _users(path: Path) -> list[str]:
    return [m["content"] for m in json.loads(path.read_text())["messages"] if m["role"] == "user"]


def _saves_a_turn(tag: str, barrier: Any = None) -> None:
    """A chat resumed on `shared` that adds a turn and saves it (in a process of its own), at the barrier."""
    from localgen.chat.session import ChatSession

    session = ChatSession.load("shared")
    session.add("user", f"from {tag}")
    session.add("assistant", "ok")
    if barrier is not None:
        barrier.wait()
    session.save()


def _fork() -> Any:
    import multiprocessing

    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("needs fork")
    return multiprocessing.get_context("fork")


def _shared(chats: Path) -> None:
    from localgen.chat.session import ChatSession

    first = ChatSession(name="shared", model="m", fresh=True)
    first.add("user", "first")
    first.add("assistant", "ok")
    first.save()


def test_a_chat_whose_file_another_saved_while_it_was_writing_keeps_its_turns_apart(
        chats: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two chats resumed on one conversation: the other's whole save comes while this one's file is being written
    (after it found the file as it read it). The check and the rename are one step (a lock every save holds), so
    this chat then finds the file changed and keeps its turn as shared-2; the other's turn was renamed over."""
    import os

    from localgen.chat import session as sessions

    _shared(chats)
    mine = sessions.ChatSession.load("shared")
    mine.add("user", "from here")
    mine.add("assistant", "ok")
    fork, real_fsync, other = _fork(), os.fsync, []

    def the_other_saves_meanwhile(fd: int) -> None:
        real_fsync(fd)
        if not other:  # once: the other's save (forked with this hook) calls it too
            other.append(None)
            p = fork.Process(target=_saves_a_turn, args=("there",))
            p.start()
            p.join()
            other[0] = p.exitcode

    monkeypatch.setattr(sessions.os, "fsync", the_other_saves_meanwhile)
    mine.save()
    assert other == [0]
    assert _users(chats / "shared.json") == ["first", "from there"]
    assert mine.name == "shared-2" and _users(chats / "shared-2.json") == ["first", "from here"]
    assert mine.forked == "shared"


def test_two_chats_resumed_on_one_conversation_saving_at_once_both_keep_their_turns(chats: Path) -> None:
    """docs/chat.md: two chats resumed on the same conversation never write over each other's turns, even when
    they save at the same instant (two processes let go at a barrier, again and again)."""
    import shutil

    fork = _fork()
    for trial in range(12):
        shutil.rmtree(chats)
        _shared(chats)
        barrier = fork.Barrier(2)
        ps = [fork.Process(target=_saves_a_turn, args=(tag, barrier)) for tag in ("A", "B")]
        for p in ps:
            p.start()
        for p in ps:
            p.join()
        assert [p.exitcode for p in ps] == [0, 0]
        kept = {f.stem: _users(f) for f in chats.glob("*.json")}
        assert sorted(kept.values()) == [["first", "from A"], ["first", "from B"]], (trial, kept)
        assert sorted(kept) == ["shared", "shared-2"], (trial, kept)


def test_a_new_chat_s_file_never_appears_empty_while_its_first_save_is_written(
        chats: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`chat --list` and `chat --resume` (the newest) in another terminal while a new chat's first save is being
    written see no file yet (it was claimed empty before, and called "not JSON"); once saved, it is whole."""
    import os

    from localgen.chat import saved
    from localgen.chat.session import ChatSession

    seen: list[Any] = []
    real_fsync = os.fsync

    def look(fd: int) -> None:
        real_fsync(fd)
        skipped: list[Any] = []
        seen.append(([s.name for s in saved.list_sessions(skipped=skipped)], skipped, saved.latest()))

    chat = ChatSession(name="brand-new", model="m", fresh=True, auto_named=False)
    chat.add("user", "x" * 100_000)
    chat.add("assistant", "ok")
    with monkeypatch.context() as m:
        m.setattr(os, "fsync", look)
        chat.save()
    assert seen and seen[0] == ([], [], None), seen
    assert [s.name for s in saved.list_sessions()] == ["brand-new"]
    assert ChatSession.load("brand-new").messages == chat.messages
    assert [f.name for f in chats.iterdir()] == ["brand-new.json"], "no temporary file is left"


def test_a_new_chat_whose_name_was_taken_meanwhile_is_a_failed_save_never_an_overwrite(chats: Path) -> None:
    """A chosen name another chat saved first: NameTaken, that file as it was; an automatic one takes the next."""
    from localgen.chat.session import ChatSession, NameTaken

    (chats / "mine.json").write_text(json.dumps({"model": "m", "messages": ADA}))
    before = (chats / "mine.json").read_bytes()
    chat = ChatSession(name="mine", model="m", fresh=True, auto_named=False)
    chat.add("user", "Hi")
    with pytest.raises(NameTaken, match="a conversation named 'mine' was saved by another chat meanwhile"):
        chat.save()
    assert (chats / "mine.json").read_bytes() == before and chat.fresh
    assert [f.name for f in chats.iterdir()] == ["mine.json"], "no temporary file is left"
    auto = ChatSession(name="mine", model="m", fresh=True, auto_named=True)
    auto.add("user", "Hi")
    assert auto.save() == chats / "mine-2.json" and json.loads((chats / "mine-2.json").read_text())["name"] == "mine-2"


def test_a_file_system_without_hard_links_still_never_overwrites_a_taken_name(
        chats: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import os

    from localgen.chat import session as sessions

    def no_links(src: Any, dst: Any) -> None:
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(sessions.os, "link", no_links)
    (chats / "mine.json").symlink_to(chats / "nowhere.json")  # dangling: taken all the same
    chat = sessions.ChatSession(name="mine", model="m", fresh=True, auto_named=True)
    chat.add("user", "Hi")
    assert chat.save() == chats / "mine-2.json" and not chat.fresh
    assert (chats / "mine.json").is_symlink() and _users(chats / "mine-2.json") == ["Hi"]


@pytest.mark.parametrize("by", ["name", "log-id"])
def test_a_terminal_chat_whose_name_another_chat_saved_first_goes_on_and_keeps_its_turn(scli: CLI, by: str) -> None:
    """`localgen chat mine` open on a terminal while a scripted `localgen chat mine` saves first (or two
    `chat --resume ID` of one logged conversation): the terminal's turn is answered and logged, one warning says the
    name was taken and how to keep the conversation, `/save NAME` keeps it, and the other's file is left as it is
    (it ended with exit 1, its turn in neither the file nor the log)."""
    from tests import terminal
    from tests.test_chat import SCREEN, exits, send, spawn

    d = _chats(scli)
    if by == "name":
        name = "mine"
        args = [name]
    else:
        r = scli("run", "-p", "Say hi.", *N)
        assert r.returncode == 0, r.stderr
        name = json.loads(scli("logs", "-n", "0", "--json").stdout)[0]["conversation_id"]
        args = ["--resume", name]
    screen = terminal.Screen(SCREEN)
    child = spawn(scli.env, *args, *N, log=screen)
    other = scli("chat", *args, *N, input="From the script.\n")
    assert other.returncode == 0, other.stderr
    send(child, "From the terminal.", r"another\s+name")
    said = " ".join(" ".join(screen.rows()).split())  # the line wraps
    assert (f"a conversation named {name!r} was saved by another chat meanwhile; the chat goes on, but this "
            "conversation is not saved: /save NAME keeps it under another") in said, said
    send(child, "/save kept", "saved to")
    exits(child)
    assert _users(d / f"{name}.json")[-1] == "From the script."
    assert _users(d / "kept.json")[-1] == "From the terminal."
    rows = json.loads(scli("logs", "-n", "0", "--json").stdout)
    assert "From the terminal." in [x["prompt"] for x in rows]


def test_a_scripted_chat_whose_name_another_chat_saved_first_answers_everything_and_loses_nothing(scli: CLI) -> None:
    """A scripted `localgen chat mine` whose name another chat saved first, while it was open: every message is
    answered, one warning says so, each turn is logged, and the exit status (1) and its error say how to go on with
    it from the log; the other's file is left as it is."""
    import subprocess

    from tests.conftest import SAFETY_NET_S

    d = _chats(scli)
    p = scli.popen("chat", "mine", *N, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                   text=True)
    try:
        p.stdin.write("/show\n")
        p.stdin.flush()
        while "to be saved at" not in (line := p.stderr.readline()):  # open, its name free when it began
            assert line, "the chat ended"
        other = scli("chat", "mine", *N, input="From the other.\n")
        assert other.returncode == 0, other.stderr
        out, err = p.communicate("First.\nSecond.\n", timeout=SAFETY_NET_S)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    answers = out.splitlines()
    assert len(answers) == 2 and all(a.strip() for a in answers), (out, err)
    assert _users(d / "mine.json") == ["From the other."]
    cid = next(x["conversation_id"] for x in json.loads(scli("logs", "-n", "0", "--json").stdout)
               if x["prompt"] == "First.")
    lines = err.splitlines()
    assert [x for x in lines if x.startswith("warning:")] == [
        "warning: a conversation named 'mine' was saved by another chat meanwhile; the chat goes on, but this "
        "conversation is not saved: /save NAME keeps it under another name"], err
    assert lines[-1] == ("localgen: error: the conversation was not saved: a conversation named 'mine' was saved by "
                         f"another chat meanwhile (its answers are above and in the log: `localgen chat --resume "
                         f"{cid}` goes on with them)"), err
    assert p.returncode == 1
    r = scli("chat", "--resume", cid, *N, input="/show\n")
    assert r.returncode == 0 and f"conversation {cid} · 4 messages" in r.stderr, r.stderr


def test_a_chats_folder_that_cannot_be_read_is_said_not_taken_for_an_empty_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chats folder root's `sudo -E localgen chat` left 0700: `chat --list` said "no saved conversations" and
    `--resume` "there is no saved conversation to resume" (glob() took the folder it could not read for an empty
    one); now one error names the folder and why."""
    import errno

    from localgen.chat import saved
    from localgen.errors import LocalgenError

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    chats = saved.chats_dir()
    chats.mkdir(parents=True)
    real = Path.iterdir

    def denied(self: Path) -> Any:
        if self == chats:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "iterdir", denied)
    for ask in (saved.list_sessions, saved.latest):
        with pytest.raises(LocalgenError) as caught:
            ask()
        assert caught.value.message == f"cannot read the saved conversations in {chats}: Permission denied"


def test_a_message_that_begins_with_a_slash_is_written_with_two(scli: CLI) -> None:
    """A path or a pasted log line could not be sent: every line beginning with / was a command (`unknown command
    /usr/lib/libfoo.so:`), and `//` did not help. `//` sends the line with one slash, and the unknown command says
    so; a pasted block whose first line is a word alone is one error line (it was split over two)."""
    r = scli("chat", "slashes", *N, input="//usr/lib/libfoo.so: what is this?\n")
    assert r.returncode == 0, r.stderr
    saved = json.loads((_chats(scli) / "slashes.json").read_text())
    assert saved["messages"][0]["content"] == "/usr/lib/libfoo.so: what is this?"
    r = scli("chat", *N, input="/usr/lib/libfoo.so: what is this?\n")
    assert r.returncode == 2 and r.stderr == ("localgen: error: unknown command /usr/lib/libfoo.so:; /help lists them "
                                              "(a message that begins with / is written //: `//usr/lib` sends "
                                              "/usr/lib)\n"), r.stderr
    from localgen.cli.chat.slash import run_command
    from localgen.errors import UsageError

    with pytest.raises(UsageError) as e:
        run_command("/undo\nsome more text", None, None)
    assert e.value.message == "a command is one line: /undo was followed by more lines"


def test_tools_says_so_when_every_tool_has_gone() -> None:
    """/tools printed nothing at all once the only MCP server had gone (its tools withdrawn)."""
    from types import SimpleNamespace

    from localgen.cli.chat.slash import run_command

    said: list[str] = []
    view = SimpleNamespace(info=said.append, yes=False, always=set())
    run_command("/tools", SimpleNamespace(toolbox=SimpleNamespace(specs=[], had_tools=True)), view)
    run_command("/tools", SimpleNamespace(toolbox=SimpleNamespace(specs=[], had_tools=False)), view)
    assert said == ["no tools are offered now: the MCP servers that gave them have gone",
                    "no tools are offered: the MCP servers list none"]


# ---- written by an editor or another tool ----------------------------------------------------------------------
# Saved chats that an editor or another tool wrote (docs/chat.md, Saving): a file saved as UTF-16 is said to be so
# in one line, as a preset's is (text.config_text); a first message with the role "system" (OpenAI's shape) is the
# conversation's system prompt. A chats folder that is a link to nothing is named as one where a save fails, and a
# file's name whose byte is not UTF-8 is shown as \\xe8 (types.shown_path), never as Python's \\udce8.

UTF16 = {"with a byte order mark (Notepad's Unicode)": lambda t: b"\xff\xfe" + t.encode("utf-16-le"),
         "big-endian without a byte order mark": lambda t: t.encode("utf-16-be")}
SAID_UTF16 = "is UTF-16 text, not UTF-8 as JSON is"
SAVE_AS = "save it as UTF-8: in Notepad, Save As with Encoding UTF-8"


# ---- a file saved as UTF-16 --------------------------------------------------------------------------------------

@pytest.mark.parametrize("encoding", UTF16)
def test_resuming_a_utf16_saved_chat_is_one_line_that_says_so_and_the_file_is_left_as_it_is(
        scli: CLI, encoding: str) -> None:
    """It said `is unreadable: it is not UTF-8 text` (or `it is not JSON`, without a byte order mark), exit 1."""
    path = _chats(scli) / "ed16.json"
    data = UTF16[encoding](json.dumps({"model": "smollm2:135m", "messages": ADA}))
    path.write_bytes(data)
    r = scli("chat", "--resume", "ed16", "-m", "smollm2:135m", *N, input="What is my name?\n")
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr == f"localgen: error: the saved conversation {path} {SAID_UTF16} ({SAVE_AS})\n", r.stderr
    assert path.read_bytes() == data


def test_chat_list_warns_of_a_utf16_saved_chat_in_those_words_and_lists_the_others(scli: CLI) -> None:
    d = _chats(scli)
    data = UTF16["with a byte order mark (Notepad's Unicode)"](json.dumps({"model": "smollm2:135m", "messages": ADA}))
    (d / "ed16.json").write_bytes(data)
    (d / "ada.json").write_text(json.dumps({"model": "smollm2:135m", "messages": ADA}))
    r = scli("chat", "--list")
    assert r.returncode == 0, r.stderr
    assert [line.split()[0] for line in r.stdout.splitlines()] == ["ada"], r.stdout
    assert r.stderr == (f"warning: the saved conversation {d / 'ed16.json'} cannot be read (it {SAID_UTF16}; "
                        f"{SAVE_AS}): it is left as it is\n"), r.stderr
    assert (d / "ed16.json").read_bytes() == data


def test_a_utf16_saved_chat_over_what_chat_list_reads_is_said_to_be_utf16_too(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A file larger than LIST_READ is listed from its head: UTF-16 there is the same reason, not "not UTF-8"."""
    from localgen.chat import saved

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(saved, "LIST_READ", 1 << 10)
    d = saved.chats_dir()
    d.mkdir(parents=True)
    doc = {"model": "smollm2:135m", "turns": 300, "messages": ADA * 300}
    (d / "big16.json").write_bytes(UTF16["with a byte order mark (Notepad's Unicode)"](json.dumps(doc)))
    skipped: list[tuple[Path, str]] = []
    assert saved.list_sessions(skipped=skipped) == []
    assert skipped == [(d / "big16.json", f"it {SAID_UTF16}; {SAVE_AS}")]


# ---- a system message written as the first of "messages" ---------------------------------------------------------

PIRATE = "You are a pirate. Answer as one."


def test_a_hand_written_file_whose_first_message_is_a_system_one_resumes_with_that_system_prompt(scli: CLI) -> None:
    """It was refused: `entry 1 of "messages" has the role "system" (user, assistant or tool)`, and not listed."""
    path = _chats(scli) / "pirate.json"
    path.write_text(json.dumps({"model": "smollm2:135m", "tags": ["mine"],
                                "messages": [{"role": "system", "content": PIRATE}, *ADA]}))
    listed = scli("chat", "--list")
    assert listed.returncode == 0 and listed.stderr == "", listed.stderr
    assert [line.split()[:1] + line.split()[3:5] for line in listed.stdout.splitlines()] == [["pirate", "1", "turn"]]
    r = scli("chat", "--resume", "pirate", *N, input="/system\nWhat is my name?\n")
    assert r.returncode == 0, r.stderr
    assert f"system: {PIRATE}" in r.stderr, r.stderr
    logged = json.loads(scli("logs", "-n", "1", "--json").stdout)
    assert [(x["prompt"], x["system"]) for x in logged] == [("What is my name?", PIRATE)], logged
    saved = json.loads(path.read_text())  # localgen's form: the prompt apart, the turns as they were, "tags" kept
    assert (saved["system"], saved["messages"][:2], saved["tags"]) == (PIRATE, ADA, ["mine"]), saved
    assert [m["role"] for m in saved["messages"]] == ["user", "assistant", "user", "assistant"], saved


def test_a_first_system_message_of_text_parts_is_the_system_prompt_and_one_same_as_system_is_one(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from localgen.chat.session import ChatSession

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path / "home"))
    d = tmp_path / "home" / "data" / "chats"
    d.mkdir(parents=True)
    parts = [{"type": "text", "text": "You are a pirate."}, {"type": "text", "text": "Answer as one."}]
    (d / "parts.json").write_text(json.dumps({"model": "m", "messages": [{"role": "system", "content": parts}, *ADA]}))
    (d / "both.json").write_text(json.dumps({"model": "m", "system": PIRATE,
                                             "messages": [{"role": "system", "content": PIRATE}, *ADA]}))
    for name in ("parts", "both"):
        s = ChatSession.load(name)
        assert (s.system, s.messages, s.conversation()[0]) == (PIRATE, ADA, {"role": "system", "content": PIRATE})


@pytest.mark.parametrize(("messages", "top", "said"), [
    ([*ADA, {"role": "system", "content": "Be brief."}], None,
     'has a malformed message: entry 3 of "messages" is a system message after the first entry: localgen keeps one '
     'system prompt, sent before the conversation (move its text to "system")'),
    ([{"role": "system", "content": PIRATE, "name": "captain"}, *ADA], None,
     'has a malformed message: entry 1 of "messages" is a system message with "name": localgen keeps a system '
     'prompt as text alone (put it in "system")'),
    ([{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, *ADA], None,
     'has a malformed message: entry 1 of "messages" is a system message whose content is not text'),
    ([{"role": "system", "content": PIRATE}, *ADA], "Be brief.",
     'is not in localgen\'s format: its "system" and its first message, a system message, differ: keep one'),
], ids=["after the first", "with a name", "an image", "beside another system"])
def test_a_system_message_a_save_could_not_keep_is_one_line_that_says_why(
        scli: CLI, messages: list[dict[str, object]], top: str | None, said: str) -> None:
    """What a save would lose or move is refused, as any entry it could not write back; the file is left as it is."""
    path = _chats(scli) / "odd.json"
    path.write_text(json.dumps({"model": "smollm2:135m", "system": top, "messages": messages}))
    kept = path.read_bytes()
    r = scli("chat", "--resume", "odd", *N, input="What is my name?\n")
    assert (r.returncode, r.stdout, r.stderr.count("\n")) == (1, "", 1), r.stderr
    assert r.stderr.startswith(f"localgen: error: the saved conversation {path} {said} ("), r.stderr
    assert path.read_bytes() == kept


# ---- where the chats folder cannot be -----------------------------------------------------------------------------

def test_a_chats_folder_that_is_a_link_to_nothing_is_named_as_one_when_a_save_fails(scli: CLI, tmp_path: Path) -> None:
    """It said `…/chats is a file, not a folder`; a data folder that is a file was said to be chats."""
    data = Path(scli.env["LOCALGEN_HOME"]) / "data"
    data.mkdir(parents=True)
    (data / "chats").symlink_to(tmp_path / "gone")
    r = scli("chat", "-m", "smollm2:135m", "--no-log", *N, input="Hi\n")
    assert r.returncode == 1 and r.stdout, r.stderr
    said = f"{data / 'chats'} is a broken link (to {tmp_path / 'gone'}, which does not exist), not a folder"
    assert r.stderr.startswith(f"warning: cannot write {data / 'chats'}/chat-"), r.stderr
    assert f": {said}; the chat goes on, but the conversation is not saved\n" in r.stderr, r.stderr
    assert "is a file" not in r.stderr and not (tmp_path / "gone").exists(), r.stderr
    (data / "chats").unlink()
    data.rmdir()
    data.write_text("")
    r = scli("chat", "-m", "smollm2:135m", "--no-log", *N, input="Hi\n")
    assert r.returncode == 1 and f": {data} is a file, not a folder; the chat goes on" in r.stderr, r.stderr


# ---- a file name whose byte is not UTF-8 ----------------------------------------------------------------------------

def test_a_name_whose_byte_is_not_utf8_is_shown_as_the_byte_in_errors_and_warnings(scli: CLI) -> None:
    """`caf$'\\xe8'` (a Latin-1 terminal's é): Python keeps the byte as '\\udce8', which stderr wrote as that."""
    d = _chats(scli)
    with open(os.path.join(os.fsencode(d), b"caf\xe8.json"), "w") as fh:
        fh.write("{")
    listed = scli("chat", "--list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stderr == (f"warning: the saved conversation {d}/caf\\xe8.json cannot be read (it is not JSON): it "
                             "is left as it is\n"), listed.stderr
    r = scli("chat", "-m", "caf\udce8.gguf", *N, input="Hi\n")
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr.startswith("localgen: error: -m/--model caf\\xe8.gguf: no such file"), r.stderr
    r = scli("chat", "--resume", "caf\udce8", *N, input="Hi\n")
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr.startswith("localgen: error: bad conversation name 'caf\ufffd': use at most 64"), r.stderr
    for out in (listed, r):
        assert "udce8" not in out.stderr, out.stderr


def test_chat_list_shows_a_saved_chat_whose_name_is_not_utf8_where_stdout_is_strict_utf8(scli: CLI) -> None:
    """A saved chat `caf\\xe8.json` that is valid JSON: `chat --list` printed its name raw, and a stdout that encodes
    UTF-8 strictly (PYTHONIOENCODING=utf-8, a UTF-8 locale's default for a pipe) ended in a UnicodeEncodeError
    traceback. Its name shows as the byte (caf\\xe8), as its model's path does."""
    d = _chats(scli)
    (d / "ada.json").write_text(json.dumps({"model": "smollm2:135m", "messages": ADA}))
    os.rename(d / "ada.json", os.fsencode(d) + b"/caf\xe8.json")
    r = CLI({**scli.env, "PYTHONIOENCODING": "utf-8:strict"})("chat", "--list")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert [line.split()[0] for line in r.stdout.splitlines()] == ["caf\\xe8"], r.stdout
