"""`localgen collections` (list, --json), `collections show`, `collections rm` (whole collections, --id), and
`embed --store NAME --replace` (the collection holds exactly the run's ids; a failed run removes nothing), with
the real CLI, the real store and the seeded tiny BERT of tests/tiny_bert.py (docs/embed.md, "Collections")."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import unicodedata
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from localgen.embeddings.store import text_id
from tests.conftest import CLI, SAFETY_NET_S


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tests.tiny_bert import build

    return str(build(tmp_path_factory.mktemp("tiny") / "tiny-bert.gguf"))


@pytest.fixture
def hcli(cli_env: dict[str, str], tmp_path: Path) -> CLI:
    """A CLI with a home of its own (no collections)."""
    return CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")})


def _db(hcli: CLI) -> Path:
    return Path(hcli.env["LOCALGEN_HOME"]) / "data" / "embeddings" / "embeddings.db"


def _held(hcli: CLI, name: str) -> dict[str, str]:
    with closing(sqlite3.connect(_db(hcli))) as conn:
        return dict(conn.execute("SELECT id, content FROM embeddings WHERE collection = ?", (name,)).fetchall())


def _listed(hcli: CLI) -> list[dict[str, object]]:
    r = hcli("collections", "--json")
    assert r.returncode == 0, r.stderr
    listed: list[dict[str, object]] = json.loads(r.stdout)
    return listed


def _store(hcli: CLI, bert: str, name: str, *args: str, input: str | None = None) -> str:
    r = hcli("embed", "-m", bert, "--store", name, *args, input=input)
    assert r.returncode == 0 and r.stdout == "", r.stderr
    return r.stderr


LINES = ["the cat sat on the mat", "stocks fell in paris", "llamas are native to south america"]


def test_collections_lists_each_with_its_model_size_entries_and_last_write(hcli: CLI, bert: str) -> None:
    r = hcli("collections")
    assert r.returncode == 0 and r.stdout == "" and r.stderr.startswith("no collections yet"), r.stderr
    assert r.stderr.count("\n") == 1
    r = hcli("collections", "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == [], r.stdout
    _store(hcli, bert, "notes", input="\n".join(LINES) + "\n")
    _store(hcli, bert, "args", "one text")
    r = hcli("collections")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    head, *rows = r.stdout.splitlines()
    assert head.split() == ["NAME", "MODEL", "POOLING", "DIMENSIONS", "ENTRIES", "LAST", "WRITTEN", "(UTC)"]
    assert [row.split()[:5] for row in rows] == [["args", "tiny-bert.gguf", "cls", "64", "1"],
                                                  ["notes", "tiny-bert.gguf", "cls", "64", "3"]], r.stdout
    listed = _listed(hcli)
    assert [c["name"] for c in listed] == ["args", "notes"]
    assert listed[1] | {"created_utc": "", "last_written_utc": ""} == {
        "name": "notes", "model": "tiny-bert.gguf", "pooling": "cls", "dimensions": 64, "normalized": True,
        "entries": 3, "created_utc": "", "last_written_utc": ""}
    assert hcli("collections", "list", "--json").stdout == hcli("collections", "--json").stdout
    assert hcli("collections", "list").stdout == r.stdout
    # "last written" is when an entry was last stored or removed; the collection's creation stays
    _backdate(hcli)
    assert {c["last_written_utc"] for c in _listed(hcli)} == {"1970-01-01T00:00:00"}
    _store(hcli, bert, "notes", "a new note")
    notes = _listed(hcli)[1]
    assert notes["created_utc"] == "1970-01-01T00:00:00" and notes["entries"] == 4
    assert str(notes["last_written_utc"]) > "2020", notes
    assert "1970-01-01 00:00:00" in hcli("collections").stdout.splitlines()[1], "args was not written again"
    _backdate(hcli)
    r = hcli("collections", "rm", "notes", "--id", "1")
    assert r.returncode == 0, r.stderr
    args, notes = _listed(hcli)
    assert str(notes["last_written_utc"]) > "2020" and args["last_written_utc"] == "1970-01-01T00:00:00", notes
    _backdate(hcli)
    _store(hcli, bert, "notes", LINES[1], "--replace")  # only a removal: the text is held already
    assert str(_listed(hcli)[1]["last_written_utc"]) > "2020"


def _backdate(hcli: CLI) -> None:
    """Every collection made, and its entries stored and removed, at the epoch."""
    with closing(sqlite3.connect(_db(hcli))) as conn, conn:
        conn.execute("UPDATE embeddings SET updated = 0")
        conn.execute("UPDATE collections SET created = 0, written = 0")


def _cells(text: str) -> int:
    """How many terminal cells `text` takes: a CJK character two, a combining accent none."""
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def test_the_tables_line_up_as_a_terminal_draws_wide_and_combining_characters(hcli: CLI, bert: str) -> None:
    """A collection named 笔记 (two cells a character) and ids with CJK or a combining accent: each column starts
    at the same cell on every line (padding by len() pushed the next column one cell per wide character)."""
    _store(hcli, bert, "笔记", input="\n".join(json.dumps({"id": i, "text": t}) for i, t in
                                                (("猫", "a cat"), ("cafe\u0301", "a café"), ("dog", "a dog"))) + "\n")
    _store(hcli, bert, "notes", "one text")
    lines = hcli("collections").stdout.splitlines()
    assert {_cells(line[:line.index(word)]) for line, word in zip(lines, ["MODEL", "tiny", "tiny"], strict=True)} \
        == {7}, lines  # NAME's column is "notes" wide, and two spaces
    table = hcli("collections", "show", "笔记").stdout.split("\n\n")[1].splitlines()
    assert [line.split(None, 1)[0] for line in table] == ["ID", "猫", "cafe\u0301", "dog"]
    assert {_cells(line[:line.index(text)]) for line, text in zip(table, ["TEXT", "a cat", "a café", "a dog"],
                                                                   strict=True)} == {6}, table


def test_a_database_from_before_removals_counted_gets_its_column_and_reads_as_before(hcli: CLI, bert: str) -> None:
    _store(hcli, bert, "notes", input="\n".join(LINES) + "\n")
    with closing(sqlite3.connect(_db(hcli))) as conn, conn:
        conn.execute("ALTER TABLE collections DROP COLUMN written")
        conn.execute("UPDATE embeddings SET updated = 0")
        conn.execute("UPDATE collections SET created = 0")
    assert _listed(hcli)[0]["last_written_utc"] == "1970-01-01T00:00:00", "an entry's time, as before"
    assert hcli("collections", "show", "notes").returncode == 0
    with closing(sqlite3.connect(_db(hcli))) as conn:
        columns = {r[1] for r in conn.execute("PRAGMA table_info(collections)")}
    assert "written" not in columns, "a listing reads the file as it is, never changes it"
    r = hcli("collections", "rm", "notes", "--id", "2")
    assert r.returncode == 0 and r.stderr == "notes: removed 1 entry, 2 left\n", r.stderr
    assert str(_listed(hcli)[0]["last_written_utc"]) > "2020"


def test_show_lists_a_collections_ids_and_the_start_of_each_text(hcli: CLI, bert: str) -> None:
    long = "a long text about " + "llamas and alpacas " * 10
    _store(hcli, bert, "notes", input="\n".join(LINES) + "\n" + json.dumps({"id": "car", "text": long}) + "\n")
    _store(hcli, bert, "notes", "an argument\ttext")
    _store(hcli, bert, "other", "elsewhere")
    r = hcli("collections", "show", "notes")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    head, table = r.stdout.split("\n\n")
    about = {line[:14].rstrip(): line[14:] for line in head.splitlines()}
    listed = _listed(hcli)[0]
    assert about == {"name": "notes", "model": "tiny-bert.gguf", "pooling": "cls", "dimensions": "64",
                     "normalized": "yes", "entries": "5",
                     "created": str(listed["created_utc"]).replace("T", " ") + " UTC",
                     "last written": str(listed["last_written_utc"]).replace("T", " ") + " UTC"}, head
    arg_id = text_id("an argument\ttext")
    rows = [line.split(None, 1) for line in table.splitlines()]
    assert rows == [["ID", "TEXT"], ["1", LINES[0]], ["2", LINES[1]], ["3", LINES[2]],
                    ["car", " ".join(long[:80].split()) + "…"],
                    [arg_id, "an argument text"]], table
    doc = json.loads(hcli("collections", "show", "notes", "--json").stdout)
    assert {k: v for k, v in doc.items() if k != "items"} == listed
    assert doc["items"] == [{"id": "1", "start": LINES[0], "chars": len(LINES[0])},
                            {"id": "2", "start": LINES[1], "chars": len(LINES[1])},
                            {"id": "3", "start": LINES[2], "chars": len(LINES[2])},
                            {"id": "car", "start": long[:80], "chars": len(long)},
                            {"id": arg_id, "start": "an argument\ttext", "chars": 16}], doc["items"]
    # what show lists is what rm --id takes; an emptied collection shows no table
    r = hcli("collections", "rm", "notes", "--id", "car", "--id", arg_id, "--id", "1", "--id", "2", "--id", "3")
    assert r.returncode == 0, r.stderr
    r = hcli("collections", "show", "notes")
    assert r.returncode == 0 and "\n\n" not in r.stdout and "entries       0\n" in r.stdout, r.stdout
    assert json.loads(hcli("collections", "show", "notes", "--json").stdout)["items"] == []
    r = hcli("similar", "notes", "a cat")  # said (it printed nothing, exit 0, without a word: a newcomer's trial)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "the collection 'notes' is empty: there is nothing to "
                                                         "rank\n"), r.stderr
    r = hcli("collections", "show", "nope")
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert "no collection named 'nope' (there are: notes, other)" in r.stderr, r.stderr


def test_rm_removes_whole_collections_and_checks_every_name_first(hcli: CLI, bert: str) -> None:
    r = hcli("collections", "rm", "notes")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no collection named 'notes'" in r.stderr, r.stderr
    _store(hcli, bert, "notes", input="\n".join(LINES) + "\n")
    _store(hcli, bert, "args", "one text", "two texts")
    _store(hcli, bert, "keep", "kept text")
    r = hcli("collections", "rm", "notes", "nope", "args")
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "no collection named 'nope' (there are: args, keep, notes)" in r.stderr, r.stderr
    assert [c["entries"] for c in _listed(hcli)] == [2, 1, 3], "an unknown name removes nothing"
    r = hcli("collections", "rm", "notes", "args")  # not on a terminal: only with --yes, as rm does
    assert r.returncode == 2 and r.stderr == ("localgen: error: would remove the collections notes (3 entries), args "
                                              "(2 entries); pass --yes to confirm when not on a terminal\n"), r.stderr
    assert [c["entries"] for c in _listed(hcli)] == [2, 1, 3]
    r = hcli("collections", "rm", "notes", "args", "--yes")
    assert r.returncode == 0 and r.stdout == "", r.stderr
    assert r.stderr.splitlines() == ["removed the collection notes (3 entries)",
                                     "removed the collection args (2 entries)"]
    assert [c["name"] for c in _listed(hcli)] == ["keep"] and _held(hcli, "notes") == {} == _held(hcli, "args")
    with closing(sqlite3.connect(_db(hcli))) as conn:
        assert conn.execute("SELECT name FROM collections").fetchall() == [("keep",)], "the record goes too"
    r = hcli("similar", "notes", "a cat")
    assert r.returncode == 2 and "no collection named 'notes' (there are: keep)" in r.stderr
    # a removed name is free again, for another model or size
    r = hcli("embed", "--store", "notes", "a text", "--dimensions", "32")
    assert r.returncode == 0, r.stderr
    assert [(c["name"], c["model"], c["dimensions"]) for c in _listed(hcli)] == [
        ("keep", "tiny-bert.gguf", 64), ("notes", "smollm2:135m", 32)]
    r = hcli("collections", "rm")
    assert r.returncode == 2 and "Missing argument" in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_rm_on_a_terminal_asks_first_and_a_no_keeps_the_collection(hcli: CLI, bert: str) -> None:
    import pexpect

    from tests import terminal

    _store(hcli, bert, "notes", input="\n".join(LINES) + "\n")
    for answer, status in (("n", 1), ("y", 0)):
        child = terminal.spawn(hcli.env, ["collections", "rm", "notes"])
        child.expect_exact("Remove the collection notes (3 entries)? [y/N]")
        child.sendline(answer)
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == status, (answer, child.before)
        assert [c["name"] for c in _listed(hcli)] == (["notes"] if answer == "n" else [])


def test_rm_id_removes_only_those_entries_and_an_unknown_id_removes_none(hcli: CLI, bert: str) -> None:
    _store(hcli, bert, "notes", input="\n".join(LINES) + "\n")
    _store(hcli, bert, "other", input="\n".join(LINES) + "\n")
    r = hcli("collections", "rm", "notes", "--id", "1", "--id", "9", "--id", "x")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "collection 'notes' has no entry '9', 'x'; nothing was removed" in r.stderr, r.stderr
    assert set(_held(hcli, "notes")) == {"1", "2", "3"}
    r = hcli("collections", "rm", "notes", "other", "--id", "1")
    assert r.returncode == 2 and "--id removes entries of one collection" in r.stderr, r.stderr
    r = hcli("collections", "rm", "nope", "--id", "1")
    assert r.returncode == 2 and "no collection named 'nope'" in r.stderr, r.stderr
    r = hcli("collections", "rm", "notes", "--id", "1", "--id", "3", "--id", "1")
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "notes: removed 2 entries, 1 left\n", r.stderr
    assert _held(hcli, "notes") == {"2": LINES[1]} and len(_held(hcli, "other")) == 3, "only those, only there"
    r = hcli("similar", "notes", LINES[0], "-n", "5")
    assert [json.loads(line)["id"] for line in r.stdout.splitlines()] == ["2"], "similar no longer finds them"
    r = hcli("collections", "rm", "notes", "--id", "2")
    assert r.returncode == 0 and r.stderr == "notes: removed 1 entry, 0 left\n", r.stderr
    assert [(c["name"], c["entries"]) for c in _listed(hcli)] == [("notes", 0), ("other", 3)], "the collection stays"


def test_replace_leaves_exactly_the_runs_ids_without_embedding_unchanged_texts(hcli: CLI, bert: str,
                                                                              tmp_path: Path) -> None:
    docs = tmp_path / "docs.txt"
    docs.write_text("\n".join(LINES) + "\n")
    assert "3 embedded and stored, 0 unchanged" in _store(hcli, bert, "notes", "--file", str(docs))
    docs.write_text(f"{LINES[0]}\n{LINES[2]}\n")  # the middle line deleted: the last one moves up to 2
    err = _store(hcli, bert, "notes", "--file", str(docs), "--replace")
    assert err == "notes: 1 embedded and stored, 1 unchanged, 1 removed\n", err
    assert _held(hcli, "notes") == {"1": LINES[0], "2": LINES[2]}, "only the file's current lines"
    hits = [json.loads(line) for line in hcli("similar", "notes", LINES[1], "-n", "9").stdout.splitlines()]
    assert sorted(h["content"] for h in hits) == sorted([LINES[0], LINES[2]])
    err = _store(hcli, bert, "notes", "--file", str(docs), "--replace")
    assert err == "notes: 0 embedded and stored, 2 unchanged, 0 removed\n", "unchanged texts are not embedded again"
    # without --replace the other ids stay (as before)
    assert "0 removed" not in _store(hcli, bert, "notes", "another text")
    assert len(_held(hcli, "notes")) == 3
    # argument texts: their content ids; a text the collection holds under an old numbered id is stored again
    # under its own, so the collection holds exactly the run's ids
    with closing(sqlite3.connect(_db(hcli))) as conn, conn:
        conn.execute("UPDATE embeddings SET id = '7' WHERE content = 'another text'")
    err = _store(hcli, bert, "notes", "another text", "a second text", "--replace")
    assert err == "notes: 2 embedded and stored, 0 unchanged, 3 removed\n", err
    assert _held(hcli, "notes") == {text_id("another text"): "another text", text_id("a second text"): "a second text"}
    # a new collection with --replace is made as with --store alone
    assert _store(hcli, bert, "fresh", "x y", "--replace") == "fresh: 1 embedded and stored, 0 unchanged, 0 removed\n"
    r = hcli("embed", "-m", bert, "a text", "--replace")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--replace needs --store" in r.stderr, r.stderr
    assert r.stdout == ""


def test_a_replace_run_that_fails_removes_nothing(hcli: CLI, bert: str, tmp_path: Path) -> None:
    """The other ids go only after every text of the run is stored: a run that fails while embedding (a text
    too long for the window) or storing (another model than the collection's) leaves the collection whole."""
    _store(hcli, bert, "notes", input="\n".join(LINES) + "\n")
    before = _held(hcli, "notes")
    long = "word " * 2000  # past the 512-token window of the tiny BERT
    r = hcli("embed", "-m", bert, "--store", "notes", "--replace", input=f"{LINES[0]}\n{long}\n")
    assert r.returncode == 2 and "--truncate" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert _held(hcli, "notes") == before
    r = hcli("embed", "--store", "notes", "--replace", input=f"{LINES[0]}\n")  # smollm2: not the collection's model
    assert r.returncode == 2 and "holds tiny-bert.gguf vectors" in r.stderr, r.stderr
    assert _held(hcli, "notes") == before


def test_an_interrupted_replace_run_removes_nothing(hcli: CLI, tmp_path: Path) -> None:
    """Ctrl-C during a long replace run (20,000 texts: loading or embedding when the signal comes, on any
    machine this suite runs on): exit 130, and the collection is as it was."""
    r = hcli("embed", "--store", "notes", input="\n".join(LINES) + "\n")  # smollm2: minutes for 20,000 texts
    assert r.returncode == 0, r.stderr
    before = _held(hcli, "notes")
    big = tmp_path / "big.jsonl"
    big.write_text("".join(json.dumps({"id": f"n{i}", "text": f"note {i} of a long file"}) + "\n"
                           for i in range(20_000)))
    proc = hcli.popen("embed", "--store", "notes", "--replace", "--file", str(big), "--verbose",
                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    seen = ""
    while not seen.startswith("llama.cpp: "):  # the model loading (--verbose): the run is under way
        seen = proc.stderr.readline()
        assert seen, "the run ended before the model loaded"
    proc.send_signal(2)
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=SAFETY_NET_S) == 130, err
    # said (it was a bare "interrupted": a newcomer's trial), in place of the word (it was said, then the word)
    assert err.endswith("notes: nothing was stored or removed: an interrupted --replace run leaves the collection "
                        "as it was\n") and "\ninterrupted\n" not in err, err
    assert _held(hcli, "notes") == before


def _long_store(hcli: CLI, tmp_path: Path, name: str) -> tuple[Path, Any]:
    """128 texts of some 15 tokens (seconds a step of 64 on one thread), and `embed --store NAME` of them started
    on a terminal."""
    from tests import terminal

    texts = tmp_path / "long.jsonl"
    texts.write_text("".join(json.dumps({"id": f"t{i}", "text": f"note {i}: " + "a longer line of text " * 2})
                             + "\n" for i in range(128)))
    return texts, terminal.spawn(hcli.env, ["embed", "--store", name, "--file", str(texts)], timeout=SAFETY_NET_S)


def _pressed_at(child: Any, shown: str) -> str:
    """Ctrl-C once `shown` is on the terminal: what it said then, to its end (its exit status in the child)."""
    import pexpect

    child.expect_exact(shown)
    child.sendintr()
    child.expect(pexpect.EOF)
    child.close()
    return " ".join(str(child.before).split())


def test_ctrl_c_keeps_what_was_embedded_and_the_same_command_embeds_the_rest(hcli: CLI, tmp_path: Path) -> None:
    """On a terminal a long --store run says how far it is; Ctrl-C stores what was embedded (whole steps of 64
    texts), says so, and exits 130; the same command again embeds only the rest."""
    import re

    texts, child = _long_store(hcli, tmp_path, "big")
    said = _pressed_at(child, "embedding: 64 of 128")  # the second step under way
    assert child.exitstatus == 130, said
    kept = re.search(r"big: ([\d,]+) of 128 embedded and stored before Ctrl-C; the same command again embeds the "
                     r"rest", said)
    # one line, in place of the word "interrupted" (it was the line, then a second saying `interrupted`)
    assert kept is not None and "interrupted" not in said, said
    n = int(kept.group(1))
    assert n == 64 and len(_held(hcli, "big")) == n, (n, len(_held(hcli, "big")))
    r = hcli("embed", "--store", "big", "--file", str(texts))
    assert r.returncode == 0 and r.stderr == "big: 64 embedded and stored, 64 unchanged\n", r.stderr
    assert len(_held(hcli, "big")) == 128


def test_ctrl_c_before_the_first_step_ends_says_nothing_was_stored(hcli: CLI, tmp_path: Path) -> None:
    """A first step takes a minute on a slow machine: nothing showed until it ended, and Ctrl-C then said only
    `interrupted`. How far it is shows from the start (0 of N), and such a Ctrl-C says nothing was stored."""
    _, child = _long_store(hcli, tmp_path, "early")
    said = _pressed_at(child, "embedding: 0 of 128")  # the first step under way
    assert child.exitstatus == 130 and "interrupted" not in said, said  # the line below, in place of the word
    assert "early: 0 of 128 embedded before the first step ended: nothing was stored (the collection is as it was)" \
        in said, said


def test_a_kill_keeps_what_was_embedded_and_ends_by_the_signal(hcli: CLI, tmp_path: Path) -> None:
    """A SIGTERM (`timeout`, a kill) during a long --store run stores what was embedded, as Ctrl-C does, says so,
    and the process then ends by that signal (it lost every text embedded)."""
    import signal

    import pexpect


    _, child = _long_store(hcli, tmp_path, "big")
    child.expect_exact("embedding: 64 of 128")  # the second step under way
    child.kill(signal.SIGTERM)
    child.expect(pexpect.EOF)
    child.close()
    said = " ".join(str(child.before).split())
    assert child.signalstatus == signal.SIGTERM, (child.exitstatus, said)
    assert "big: 64 of 128 embedded and stored before SIGTERM; the same command again embeds the rest" in said, said
    assert len(_held(hcli, "big")) == 64


def test_a_write_lock_held_past_the_wait_is_said_busy_not_unusable(hcli: CLI, bert: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process holding the write lock past the busy timeout (30 s; a fraction of a second here): the
    error says the database was busy, not that it is unusable (a damaged file's word)."""
    from localgen.embeddings import storedb
    from tests.conftest import InProcessCLI

    _store(hcli, bert, "notes", "a text")
    monkeypatch.setattr(storedb, "BUSY_TIMEOUT_S", 0.2)
    run = InProcessCLI(dict(hcli.env))  # in this process: the shorter wait set above holds
    with closing(sqlite3.connect(_db(hcli), isolation_level=None)) as conn:
        conn.execute("BEGIN IMMEDIATE")  # the write lock, held
        r = run("embed", "-m", bert, "--store", "notes", "another text")
        conn.execute("ROLLBACK")
    assert r.returncode == 1 and r.stderr.splitlines()[-1] == (
        f"localgen: error: the collections database {_db(hcli)} is busy: another process held its write lock for "
        "0.2 s (run it again once that process ends: another `localgen embed --store` or `collections rm`?)"), r.stderr


def test_rm_and_replace_wait_for_another_writer(hcli: CLI, bert: str) -> None:
    """Writers wait for each other (WAL, a busy timeout): rm and a replace run started while another
    connection holds the write lock finish once it lets go, and reading goes on meanwhile."""
    _store(hcli, bert, "notes", input="\n".join(LINES) + "\n")
    _store(hcli, bert, "gone", "a text")
    with closing(sqlite3.connect(_db(hcli), isolation_level=None)) as conn:
        conn.execute("BEGIN IMMEDIATE")  # the write lock, held
        conn.execute("UPDATE embeddings SET updated = updated WHERE collection = 'notes'")
        procs = [hcli.popen("collections", "rm", "gone", "--yes", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True),
                 hcli.popen("embed", "-m", bert, "--store", "notes", "--replace", LINES[0], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
        listed = hcli("collections", "--json")  # readers never wait in WAL
        assert listed.returncode == 0 and len(json.loads(listed.stdout)) == 2, listed.stderr
        found = hcli("similar", "gone", "a text", "-n", "1")
        assert found.returncode == 0 and json.loads(found.stdout)["content"] == "a text", found.stderr
        waiting = f"waiting for another process writing {_db(hcli)} (at most 30 s)\n"
        for p in procs:  # each says so once it finds the lock held (else it fails in 30 s, and says that)
            assert p.stderr.readline() == waiting
        assert all(p.poll() is None for p in procs), "both wait for the lock"
        conn.execute("COMMIT")
    outs = [p.communicate(timeout=SAFETY_NET_S) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert outs[0][1] == "removed the collection gone (1 entry)\n"
    assert "1 embedded and stored, 0 unchanged, 3 removed" in outs[1][1], outs[1][1]
    assert waiting not in outs[1][1], "said once, where the lock was first found held"
    assert [(c["name"], c["entries"]) for c in _listed(hcli)] == [("notes", 1)]


def test_the_new_commands_on_a_damaged_database_are_one_line(hcli: CLI, bert: str) -> None:
    _store(hcli, bert, "notes", "the cat")
    db = _db(hcli)
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("DROP TABLE embeddings")
    for args in (["collections"], ["collections", "rm", "notes"], ["collections", "rm", "notes", "--id", "1"]):
        r = hcli(*args)
        assert r.returncode == 1 and r.stdout == "" and r.stderr.count("\n") == 1, (args, r.stderr)
        assert str(db) in r.stderr and "no embeddings table" in r.stderr, (args, r.stderr)
    for suffix in ("-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    db.write_bytes(b"not a database at all " * 200)
    for args in (["collections"], ["collections", "--json"], ["collections", "rm", "notes", "--yes"],
                 ["collections", "rm", "notes", "--id", "1"],
                 ["embed", "-m", bert, "x", "--store", "notes", "--replace"]):
        r = hcli(*args)
        assert r.returncode == 1 and r.stdout == "" and r.stderr.count("\n") == 1, (args, r.stderr)
        assert str(db) in r.stderr and "is unusable" in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)


def test_a_collection_name_with_control_characters_is_refused(hcli: CLI, bert: str) -> None:
    """A collection is one line wherever it is listed: a name with a newline or a tab is a usage error,
    before anything is embedded or stored."""
    for name in ("a\nb", "a\tb", "a\x85b"):  # C1 controls too (U+0085, NEL)
        r = hcli("embed", "-m", bert, "--store", name, "the cat")
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stdout == "", r.stderr
        assert "cannot hold control characters" in r.stderr
    for name in ("d ", " d"):  # listed, it read as d's name (a collection of its own)
        r = hcli("embed", "-m", bert, "--store", name, "the cat")
        assert r.returncode == 2 and r.stderr == (f"localgen: error: --store {name!r}: a collection's name cannot "
                                                  "begin or end with a space (--store 'd')\n"), r.stderr
    assert not _db(hcli).exists()


def test_embed_of_an_empty_file_or_dev_zero_is_one_line_and_keeps_the_collection(hcli: CLI, bert: str,
                                                                                 tmp_path: Path) -> None:
    """docs/embed.md: bad input is one line and exit 2 before the model loads; --file and stdin are read only
    up to a bound (/dev/zero never ends), and the collection the run would have written keeps what it held.
    `--file -` is stdin."""
    _store(hcli, bert, "notes", "--file", "-", input="".join(f"{line}\n" for line in LINES))
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    r = hcli("embed", "-m", bert, "--store", "notes", "--replace", "--file", str(empty))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"nothing to embed: --file {empty} is empty" in r.stderr, r.stderr
    r = hcli("embed", "-m", bert, "--store", "notes", "--replace", "--file", "-", input="\n \n")  # - is stdin
    assert r.returncode == 2 and "nothing to embed: every line of stdin is blank" in r.stderr, r.stderr
    with open("/dev/zero", "rb") as zero:  # named stdin, not /dev/stdin, in every error
        p = subprocess.run(hcli.argv("embed", "-m", bert, "--file", "-"), stdin=zero, capture_output=True,
                           text=True, env=hcli.env, timeout=60)
    assert p.returncode == 2 and p.stderr.startswith("localgen: error: stdin is larger than 256 MiB"), p.stderr
    r = hcli("embed", "-m", bert, "--store", "notes", "--replace", "--file", "/dev/zero", timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "/dev/zero is larger than 256 MiB" in r.stderr
    for command in (["embed", "-m", bert, "--store", "notes", "--replace"], ["rerank", "-m", bert, "query"]):
        with open("/dev/zero", "rb") as zero:
            p = subprocess.run(hcli.argv(*command), stdin=zero, capture_output=True, text=True, env=hcli.env,
                               timeout=60)
        assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
        assert "stdin is larger than 256 MiB" in p.stderr
    assert sorted(_held(hcli, "notes").values()) == sorted(LINES)


def test_a_json_line_s_id_is_a_string_on_one_line_or_a_whole_number(hcli: CLI, bert: str) -> None:
    """docs/embed.md, "Ids": null, true, an object or a multi-line string are a usage error naming the line,
    never stored as the words None, True or {...}; a number is its digits."""
    for bad, said in (("null", "must be"), ("true", "must be"), ('{"a": 1}', "must be"), ('"x\\ny"', "must be"),
                      ('"x\\u0085y"', "must be"), ('""', "is empty: give a string on one line, or a whole number")):
        r = hcli("embed", "-m", bert, "--store", "notes", input=f'{{"id": 1, "text": "the cat"}}\n'
                                                            f'{{"id": {bad}, "text": "the dog"}}\n')
        assert r.returncode == 2 and r.stderr.count("\n") == 1, (bad, r.stderr)
        assert r.stderr.startswith(f'localgen: error: line 2: bad JSON line: its "id" {said}'), r.stderr
    assert not _db(hcli).exists()
    # a text left empty is refused as an empty argument is (it stored the vector of no text under its id)
    for text, said in (('""', 'its "text" is empty'), ('"   "', 'its "text" is empty or only whitespace')):
        r = hcli("embed", "-m", bert, "--store", "notes", input=f'{{"id": "x", "text": {text}}}\n')
        assert r.returncode == 2 and r.stderr.count("\n") == 1, (text, r.stderr)
        assert r.stderr.startswith(f"localgen: error: line 1: bad JSON line: {said}"), r.stderr
    assert not _db(hcli).exists()
    _store(hcli, bert, "notes", input='{"id": 7, "text": "the cat"}\n{"id": "a b", "text": "the dog"}\n')
    assert _held(hcli, "notes") == {"7": "the cat", "a b": "the dog"}
    # embed.md: a line that begins with `{` (past its spaces) is a JSON line; such a text goes as an argument
    r = hcli("embed", "-m", bert, "--store", "notes", input="  {braces in a plain note}\n")
    assert r.returncode == 2 and r.stderr.startswith("localgen: error: line 1: bad JSON line: "), r.stderr
    assert "1 embedded and stored" in _store(hcli, bert, "notes", "{braces in a plain note}")


def test_an_empty_or_tableless_database_holds_no_collections_yet_and_the_next_store_makes_it(hcli: CLI,
                                                                                           bert: str) -> None:
    """A 0-byte embeddings.db (a full disk while it was made), or one with no table at all, reads as no
    collections and `embed --store` makes it anew, as the log does; it was "no collections or embeddings table
    (it is damaged ...: move it aside ...)" for every command, for good."""
    db = _db(hcli)
    for make in ("empty", "tableless"):
        db.parent.mkdir(parents=True, exist_ok=True)
        for suffix in ("", "-wal", "-shm"):
            Path(str(db) + suffix).unlink(missing_ok=True)
        db.touch()
        if make == "tableless":
            with closing(sqlite3.connect(db)) as conn:
                conn.execute("PRAGMA journal_mode=WAL")
        assert db.stat().st_size == 0 or make == "tableless"
        r = hcli("collections", "--json")
        assert (r.returncode, r.stdout) == (0, "[]\n") and "no collections yet" in r.stderr, (make, r.stderr)
        r = hcli("similar", "notes", "a cat")
        assert r.returncode == 2 and "there are no collections yet" in r.stderr and "damaged" not in r.stderr, r.stderr
        _store(hcli, bert, "notes", *LINES)
        assert sorted(_held(hcli, "notes").values()) == sorted(LINES), make
        r = hcli("similar", "notes", "a cat", "-n", "1")
        assert r.returncode == 0 and r.stdout.count("\n") == 1, r.stderr


def _read_only(hcli: CLI, *args: str) -> subprocess.CompletedProcess[str]:
    """`localgen ARGS` with the home on a read-only disk (a bind mount in a mount namespace of its own)."""
    import shutil
    import sys

    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("mounting needs unshare and the right to use it (root)")
    env = {**hcli.env, "H": hcli.env["LOCALGEN_HOME"], "PY": sys.executable}
    return subprocess.run(["unshare", "-m", "sh", "-c", 'mount --bind -o ro "$H" "$H" && exec "$PY" -m localgen "$@"',
                           "sh", *args], env=env, capture_output=True, text=True, timeout=SAFETY_NET_S)


def test_collections_on_a_read_only_disk_are_read_and_a_store_says_it_cannot_write(hcli: CLI, bert: str) -> None:
    """On a read-only disk `similar`, `collections` and `run --rag` read the collections as they are (WAL cannot
    make the file it reads beside the database there), and `embed --store` and `collections rm` say the database
    cannot be written; all said "is unusable: unable to open database file (move it aside and store the
    collections again ...)", advice that throws good data away."""
    _store(hcli, bert, "notes", *LINES)
    r = _read_only(hcli, "collections", "--json")
    assert r.returncode == 0 and [c["name"] for c in json.loads(r.stdout)] == ["notes"], r.stderr
    r = _read_only(hcli, "similar", "notes", "the cat sat on the mat", "-n", "1")  # its own text: the nearest
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[0])["content"] == "the cat sat on the mat"
    r = _read_only(hcli, "run", "-m", "smollm2:135m", "--rag", "notes", "-p", "Where did the cat sit?", "-n", "2")
    assert r.returncode == 0 and "collections database" not in r.stderr, r.stderr
    db = _db(hcli)
    for args in (["embed", "-m", bert, "a dog", "--store", "notes"], ["collections", "rm", "notes", "--yes"]):
        r = _read_only(hcli, *args)
        assert (r.returncode, r.stdout) == (1, ""), (args, r.stderr)
        assert r.stderr == (f"localgen: error: the collections database {db} cannot be written: its folder is "
                            "read-only (the collections in it can still be read: similar, collections, run "
                            "--rag)\n"), (args, r.stderr)
    assert sorted(_held(hcli, "notes").values()) == sorted(LINES)


def test_a_store_of_the_other_normalisation_or_from_the_same_path_changed_is_refused_with_a_hint_that_helps(
        hcli: CLI, bert: str, tmp_path: Path) -> None:
    """A newcomer's trial: `--no-normalize` into a normalised collection was taken (a vector of length 38 beside
    unit ones, and `normalized: true` listed); it is refused as another pooling is. And a store from the very path a
    collection was made from, its file since replaced by other weights, was told to `use -m` that same path."""
    import shutil

    from tests.tiny_bert import with_other_weights

    _store(hcli, bert, "notes", *LINES)
    before = _held(hcli, "notes")
    r = hcli("embed", "-m", bert, "--store", "notes", "--no-normalize", "a dog")
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr == ("localgen: error: collection 'notes' holds normalised vectors, not unnormalised ones (use "
                        "--normalize, or another collection name)\n"), r.stderr
    assert _store(hcli, bert, "raw", "--no-normalize", "a dog") == "raw: 1 embedded and stored, 0 unchanged\n"
    r = hcli("embed", "-m", bert, "--store", "raw", "a cat")
    assert r.returncode == 2 and r.stderr.endswith("holds unnormalised vectors, not normalised ones (use "
                                                   "--no-normalize, or another collection name)\n"), r.stderr
    assert _held(hcli, "notes") == before
    moved = tmp_path / "model" / "tiny-bert.gguf"
    moved.parent.mkdir()
    shutil.copyfile(bert, moved)
    _store(hcli, str(moved), "mine", "a dog")
    with_other_weights(bert, tmp_path / "other.gguf").replace(moved)  # the same path, other weights
    r = hcli("embed", "-m", str(moved), "--store", "mine", "a cat")
    assert r.returncode == 2 and r.stderr.endswith(
        f"(a file of that name with other content), not of this one ({moved} has changed since it was stored: put "
        "back the file it was, or use another collection name)\n"), r.stderr


def test_a_file_where_the_collections_folder_goes_is_named_not_no_collections_yet(hcli: CLI, bert: str) -> None:
    """A newcomer's trial: with a file at <data>/embeddings, `embed --store z` said "there are no collections yet
    (make one with `localgen embed --store NAME`)", the command just run, and `collections` exited 2."""
    folder = Path(hcli.env["LOCALGEN_HOME"]) / "data" / "embeddings"
    folder.parent.mkdir(parents=True)
    folder.write_text("")
    said = (f"localgen: error: the collections database {folder / 'embeddings.db'} cannot be opened: {folder} is a "
            "file, not a folder (move it away, and the next `localgen embed --store` makes the folder)\n")
    for args in (["collections"], ["similar", "notes", "a cat"], ["embed", "-m", bert, "--store", "z", "x"]):
        r = hcli(*args)
        assert (r.returncode, r.stdout, r.stderr) == (1, "", said), (args, r.stderr)
    assert folder.read_text() == ""


def test_a_later_store_with_another_file_of_the_same_name_is_refused(hcli: CLI, bert: str, tmp_path: Path) -> None:
    """docs/embed.md: a collection keeps its model's fingerprint (its file's content), not only its file's name: a
    store from another tiny-bert.gguf (other weights) was taken ("notes: 1 embedded and stored") and mixed two
    models' vectors. The same file elsewhere (copied, moved, downloaded again) is the same model. A collection
    made before fingerprints were recorded is compared by name, and its next store records its model."""
    import shutil

    from tests.tiny_bert import with_other_weights

    _store(hcli, bert, "notes", *LINES)
    other = with_other_weights(bert, tmp_path / "other" / "tiny-bert.gguf")
    before = _held(hcli, "notes")
    refused = ("localgen: error: collection 'notes' holds vectors of another tiny-bert.gguf (a file of that name "
               f"with other content), not of this one (use -m {bert}, or another collection name)\n")
    for args in (["a dog"], ["a dog", "--replace"], list(LINES)):
        r = hcli("embed", "-m", str(other), "--store", "notes", *args)
        assert (r.returncode, r.stdout, r.stderr) == (2, "", refused), args
    assert _held(hcli, "notes") == before
    same = tmp_path / "copy" / "tiny-bert.gguf"
    same.parent.mkdir()
    shutil.copyfile(bert, same)
    assert _store(hcli, str(same), "notes", "a dog") == "notes: 1 embedded and stored, 0 unchanged\n"
    refused = refused.replace(f"-m {bert},", f"-m {same},")  # the collection loads the copy now: where it was stored
    with closing(sqlite3.connect(_db(hcli))) as conn, conn:  # as a collection was kept before
        conn.execute("ALTER TABLE collections DROP COLUMN model_id")
    assert [c["name"] for c in _listed(hcli)] == ["notes"]
    assert hcli("similar", "notes", "a cat", "-n", "1").returncode == 0
    assert _store(hcli, bert, "notes", "a bird") == "notes: 1 embedded and stored, 0 unchanged\n"
    refused = refused.replace(f"-m {same},", f"-m {bert},")  # its first store since: the model and where it is
    r = hcli("embed", "-m", str(other), "--store", "notes", "a fish")
    assert (r.returncode, r.stderr) == (2, refused), r.stderr
    # a collection's -m that now means another file (replaced; a relative path from another folder): `similar`
    # and --rag would rank its vectors against another model's query
    _store(hcli, str(other), "others", *LINES)
    shutil.copyfile(bert, other)
    for args in (["similar", "others", "a cat"],
                 ["run", "-m", "smollm2:135m", "--rag", "others", "-p", "hi", "-n", "1"]):
        r = hcli(*args)
        assert (r.returncode, r.stdout) == (2, ""), (args, r.stderr)
        assert r.stderr.startswith(f"localgen: error: the collection 'others' was made with another tiny-bert.gguf "
                                   f"than {other} is now (a file of other content)"), (args, r.stderr)


def test_a_store_with_the_model_moved_records_where_it_is_now(hcli: CLI, bert: str, tmp_path: Path) -> None:
    """docs/embed.md: the same file moved is the same model, and a store with it records where it is now, so
    `similar` loads it from there (the collection kept the old path: similar and --rag failed with "no such model
    file" whatever was stored, and the hint said to store it again)."""
    import shutil

    first, moved = tmp_path / "a" / "bert.gguf", tmp_path / "b" / "bert.gguf"
    first.parent.mkdir()
    shutil.copyfile(bert, first)
    _store(hcli, str(first), "notes", *LINES)
    moved.parent.mkdir()
    first.rename(moved)
    r = hcli("similar", "notes", "a cat", "-n", "1")
    assert r.returncode == 1 and f"the collection 'notes' was made with {first}: no such model file" in r.stderr
    assert "store into the collection with it from where it is now (`localgen embed -m PATH --store notes" in \
        r.stderr, r.stderr
    assert _store(hcli, str(moved), "notes", "a bird") == "notes: 1 embedded and stored, 0 unchanged\n"
    r = hcli("similar", "notes", LINES[0], "-n", "1")
    assert r.returncode == 0 and json.loads(r.stdout)["content"] == LINES[0], r.stderr
    # a collection made before fingerprints were kept: its first store takes the model's and where it is now
    with closing(sqlite3.connect(_db(hcli))) as conn, conn:
        conn.execute("ALTER TABLE collections DROP COLUMN model_id")
    again = tmp_path / "c" / "bert.gguf"
    again.parent.mkdir()
    moved.rename(again)
    assert _store(hcli, str(again), "notes", "a fish") == "notes: 1 embedded and stored, 0 unchanged\n"
    r = hcli("similar", "notes", LINES[0], "-n", "1")
    assert r.returncode == 0 and json.loads(r.stdout)["content"] == LINES[0], r.stderr


FULL_DISK_STORE = r'''
set -u
mount -t tmpfs -o size=3m tmpfs "$H" || exit 99
"$PY" -m localgen embed -m "$BERT" --file "$T/docs.txt" --store horses >/dev/null 2>"$T/store.err"
echo "store rc=$?"
"$PY" -m localgen collections --json 2>"$T/list.err"
'''


def test_a_first_store_that_fails_for_a_full_disk_leaves_no_collection(hcli: CLI, bert: str, tmp_path: Path) -> None:
    """A first `embed --store` on a disk that fills (a real tmpfs, ENOSPC from the kernel) said "no space is
    left", yet `collections` listed the collection with 0 entries, tied to that model: its record was kept
    apart from its texts. It is made with them now, in one transaction, so a run that fails stores nothing."""
    import shutil
    import sys

    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("mounting needs unshare and the right to use it (root)")
    # 3.6 MB, more than the disk holds, in a few tokens a text (spaces make none): quick to embed
    lines = [f"horse {i}" + " " * 30_000 + f"field {i}" for i in range(120)]
    (tmp_path / "docs.txt").write_text("\n".join(lines) + "\n")
    home = Path(hcli.env["LOCALGEN_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    env = {**hcli.env, "H": str(home), "T": str(tmp_path), "PY": sys.executable, "BERT": bert}
    r = subprocess.run(["unshare", "-m", "sh", "-c", FULL_DISK_STORE], env=env, capture_output=True, text=True,
                       timeout=SAFETY_NET_S)
    failed = (tmp_path / "store.err").read_text()
    assert r.returncode == 0 and "store rc=1" in r.stdout, (r.stdout, r.stderr, failed)
    assert failed.endswith("cannot be written: no space is left on its disk (the collections in it can still be "
                           "read: similar, collections, run --rag)\n"), failed
    assert r.stdout.split("store rc=1\n", 1)[1] == "[]\n", (r.stdout, (tmp_path / "list.err").read_text())


NOT_UTF8 = "a\udcffb"  # the argument a\xffb as Python keeps it (surrogateescape): no UTF-8 holds it


def test_a_collection_name_that_is_not_utf8_is_a_usage_error(hcli: CLI, bert: str) -> None:
    """Every command that takes a collection's name says, as `run --cid` does, that it is not UTF-8: one line
    and exit 2, never a traceback, before anything is embedded or loaded."""
    _store(hcli, bert, "notes", *LINES)
    for args, flag in ((["collections", "show", NOT_UTF8], "the collection"),
                       (["collections", "rm", NOT_UTF8, "--yes"], "the collection"),
                       (["collections", "rm", "notes", "--id", NOT_UTF8], "--id"),
                       (["similar", NOT_UTF8, "cat"], "the collection"),
                       (["embed", "-m", bert, "--store", NOT_UTF8, "hello"], "--store"),
                       (["run", "-n", "4", "--rag", NOT_UTF8, "hi"], "--rag"),
                       (["chat", "--rag", NOT_UTF8], "--rag"),
                       (["serve", "--collection", NOT_UTF8], "--collection")):
        r = hcli(*args, input="hi\n")
        assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, (args, r.stderr)
        assert r.stderr == f"localgen: error: {flag} is not valid UTF-8 text: byte 0xff at character 2 is not " \
                           "UTF-8\n", (args, r.stderr)
    assert sorted(_held(hcli, "notes").values()) == sorted(LINES)


def test_a_json_id_that_is_not_valid_unicode_is_a_usage_error(hcli: CLI, bert: str, tmp_path: Path) -> None:
    """A JSON line's "id" with a lone surrogate escape would be a traceback storing it or printing it, or a raw
    byte in the NDJSON: a usage error naming the line, for embed (stored or printed) and rerank alike."""
    for escape, why in (("\\udc80", "byte 0x80 at character 1 is not UTF-8"),
                        ("\\ud83d", "a lone surrogate (\\ud83d) at character 1")):
        line = f'{{"id": "{escape}", "text": "a"}}\n'
        f = tmp_path / "sur.jsonl"
        f.write_text(line)
        for args in (["embed", "-m", bert, "--store", "s"], ["embed", "-m", bert],
                     ["rerank", "-m", bert, "q", "--file", str(f)]):
            r = hcli(*args, input=line)
            assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, (args, r.stderr)
            assert r.stderr.startswith(f'localgen: error: line 1: bad JSON line: its "id" is not valid UTF-8 text: '
                                       f"{why}"), (args, r.stderr)
    assert not _db(hcli).exists()


def test_an_id_repeated_in_one_store_run_is_a_usage_error_naming_its_lines(hcli: CLI, bert: str) -> None:
    """docs/embed.md, "Ids": a collection holds one text an id, so two lines with one id (7 and "7" are one) are
    refused before anything is embedded, not stored as one with a wrong count; the same text given twice as an
    argument (one id, its content's) is stored once, and counted once."""
    dup = ('{"id": "x", "text": "the cat sat"}\n{"id": "x", "text": "the dog ran"}\n{"id": 7, "text": "seven"}\n'
           '{"id": "7", "text": "seven str"}\n')
    r = hcli("embed", "-m", bert, "--store", "dup", input=dup)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr == "localgen: error: the id 'x' is on lines 1 and 2 (and 1 other id repeated): a collection " \
                       "holds one text an id (give each text its own id)\n", r.stderr
    r = hcli("embed", "-m", bert, "--store", "dup", input='{"id": 3, "text": "three"}\nplain\nthird line\n')
    assert r.returncode == 2 and "the id '3' is on lines 1 and 3:" in r.stderr, r.stderr
    assert not _db(hcli).exists()
    err = _store(hcli, bert, "same", "the cat", "the cat", "the dog")
    assert err == "same: 2 embedded and stored, 0 unchanged\n", err
    assert sorted(_held(hcli, "same").values()) == ["the cat", "the dog"]
    # printed, not stored: one vector a text, as given
    r = hcli("embed", "-m", bert, "the cat", "the cat")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 2, r.stderr


def test_show_measures_a_text_holding_a_nul_whole(hcli: CLI, bert: str) -> None:
    """SQLite's length() and substr() stop at a NUL: show's start and length are the whole text's."""
    text = "ab\0cdé and more " + "é" * 100
    _store(hcli, bert, "nul", input=json.dumps({"id": "n", "text": text}) + "\n")
    doc = json.loads(hcli("collections", "show", "nul", "--json").stdout)
    assert doc["items"] == [{"id": "n", "start": text[:80], "chars": len(text)}], doc["items"]


def test_an_unknown_collection_s_error_lists_the_others_sorted(hcli: CLI, bert: str) -> None:
    """embed.md, rag.md: a name that names no collection is a usage error, exit 2, whichever command is given it."""
    for name in ("zeta", "alpha", "mid"):
        _store(hcli, bert, name, "the cat")
    for args in (["similar", "nope", "cat"], ["run", "--rag", "nope", "hi"], ["collections", "show", "nope"],
                 ["collections", "rm", "nope", "--yes"], ["collections", "rm", "nope", "--id", "1"]):
        r = hcli(*args)
        assert r.returncode == 2 and "no collection named 'nope' (there are: alpha, mid, zeta)" in r.stderr, \
            (args, r.stderr)


def test_a_relative_model_path_naming_another_file_here_says_where_it_was_stored_from(hcli: CLI, bert: str,
                                                                                       tmp_path: Path) -> None:
    """A collection stored with `-m bert.gguf` from one folder, added to from another whose bert.gguf is another
    file: the hint names the file the collection was stored with, by the full path it keeps (it said `use -m
    bert.gguf`, the very words typed); for a collection an older localgen kept with the path as typed, that the path
    was read from the folder it was stored from."""
    import shutil

    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    shutil.copy(bert, first / "bert.gguf")
    data = bytearray(Path(bert).read_bytes())
    data[-1] ^= 1  # other weights under the same name
    (second / "bert.gguf").write_bytes(bytes(data))
    r = hcli("embed", "-m", "bert.gguf", "--store", "rel", "the cat", cwd=first)
    assert r.returncode == 0, r.stderr
    r = hcli("embed", "-m", "bert.gguf", "--store", "rel", "the dog", cwd=second)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "collection 'rel' holds vectors of another bert.gguf (a file of that name with other content)" in r.stderr
    assert f"(use -m {first / 'bert.gguf'}, or another collection name)" in r.stderr, r.stderr  # its full path, kept
    with closing(sqlite3.connect(_db(hcli))) as conn, conn:  # as an older localgen kept it: -m as typed
        conn.execute("UPDATE collections SET model_spec = 'bert.gguf' WHERE name = 'rel'")
    r = hcli("embed", "-m", "bert.gguf", "--store", "rel", "the dog", cwd=second)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "(bert.gguf was a relative path, read from the current folder: store from the folder it was stored from, " \
           "or use another collection name)" in r.stderr, r.stderr
    assert _held(hcli, "rel") == {text_id("the cat"): "the cat"}, "the collection is as it was"
