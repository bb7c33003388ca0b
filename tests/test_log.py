"""The log of prompts and answers: every run and chat exchange in SQLite, `logs` (-n, -q, -m, --cid, --json,
path, on, off, status), `run --continue` / `--cid`, `chat --resume ID`, concurrent writers, and a damaged or
unwritable log that never stops an answer. Each test has a home of its own, so rows are counted exactly."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import stat
import subprocess
import threading
import time
from contextlib import closing, suppress
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CLI, ROOT, InProcessCLI

N = ["-n", "6", "--temperature", "0"]


@pytest.fixture
def lcli(cli_env: dict[str, str], tmp_path: Path) -> CLI:
    return CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")})


def _db(lcli: CLI) -> Path:
    return Path(lcli.env["LOCALGEN_HOME"]) / "data" / "logs" / "logs.db"


def _logged(lcli: CLI, *args: str) -> list[dict[str, object]]:
    r = lcli("logs", "-n", "0", "--json", *args)
    assert r.returncode == 0, r.stderr
    return list(json.loads(r.stdout))


def test_every_run_is_logged_and_found(lcli: CLI) -> None:
    r = lcli("run", "Name a fruit that is yellow.", *N, "--system", "Be brief.")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    answer = r.stdout.strip()
    rows = _logged(lcli)
    assert len(rows) == 1
    row = rows[0]
    assert row["prompt"] == "Name a fruit that is yellow." and row["response"] == answer
    assert row["system"] == "Be brief." and row["model"] == "smollm2:135m" and row["source"] == "run"
    assert row["completion_tokens"] == 6 and row["prompt_tokens"] > 10 and row["finish_reason"] == "length"
    assert row["settings"]["temperature"] == 0.0 and row["decode_tps"] > 0  # type: ignore[index]
    word = max(answer.split(), key=len).strip(".,!")
    assert [x["response"] for x in _logged(lcli, "-q", word)] == [answer], "-q finds a word of the answer"
    assert _logged(lcli, "-q", "zyzzyva") == []
    assert _logged(lcli, "-m", "other-model") == []
    shown = lcli("logs")
    assert "## Prompt\n\nName a fruit that is yellow." in shown.stdout and answer in shown.stdout
    # logs.md: the heading's time is UTC, the log's, whatever the time zone (a newcomer's trial read it as local)
    east = CLI({**lcli.env, "TZ": "America/New_York"})("logs")
    assert f"# {str(row['datetime_utc']).replace('T', ' ')}  smollm2:135m  conversation " in east.stdout, east.stdout
    assert "Each exchange's heading gives its time in UTC" in " ".join(
        (ROOT / "docs" / "logs.md").read_text().split())
    db = _db(lcli)
    assert stat.S_IMODE(db.stat().st_mode) == 0o600 and stat.S_IMODE(db.parent.stat().st_mode) == 0o700
    assert lcli("logs", "path").stdout.strip() == str(db)
    assert lcli("logs", "status").stdout.endswith(" · 1 exchange\n")


def test_logs_m_finds_a_run_by_the_m_it_was_given(lcli: CLI, smollm2_path: Path) -> None:
    """A newcomer's trial: `run -m PATH` was logged under the file's name, and `logs -m PATH` found nothing (only
    that name, never shown in the listing, did)."""
    assert lcli("run", "-m", str(smollm2_path), "Name a colour.", *N).returncode == 0
    [row] = _logged(lcli, "-m", str(smollm2_path))
    assert row["model"] == smollm2_path.name and _logged(lcli, "-m", smollm2_path.name) == [row]
    # and by the model's name, which is that file here (it said "the log has no model by that name")
    assert _logged(lcli, "-m", "smollm2:135m") == [row]


def test_the_log_keeps_the_seed_a_run_drew_so_the_answer_can_be_made_again(lcli: CLI) -> None:
    sampled = ("-n", "12", "--temperature", "1.5", "--top-k", "0", "--top-p", "1")  # a drawn seed decides the words
    run = json.loads(lcli("run", "Invent a word.", *sampled, "--json").stdout)
    [row] = _logged(lcli)
    assert row["settings"]["seed"] == run["seed"]  # type: ignore[index]
    again = lcli("run", "Invent a word.", *sampled, "--seed", str(run["seed"]))
    assert again.returncode == 0 and again.stdout.rstrip("\n") == run["text"].rstrip("\n"), again.stderr
    assert lcli("chat", *sampled, input="Hi.\n").returncode == 0
    assert isinstance(_logged(lcli, "-q", "Hi")[0]["settings"]["seed"], int)  # type: ignore[index]


def test_continue_sends_the_earlier_turns(lcli: CLI) -> None:
    first = json.loads(lcli("run", "My name is Ada.", *N, "--json").stdout)
    second = lcli("run", "--continue", "What is my name?", *N, "--json", "--verbose-prompt")
    assert second.returncode == 0, second.stderr
    doc = json.loads(second.stdout)
    alone = json.loads(lcli("run", "What is my name?", *N, "--json", "--no-log").stdout)
    s1, s2, s0 = first["stats"], doc["stats"], alone["stats"]
    assert s2["prompt_tokens"] > s1["prompt_tokens"] + s1["completion_tokens"], "the first exchange went first"
    assert s2["prompt_tokens"] > s0["prompt_tokens"] + s1["completion_tokens"], "more than the question alone"
    assert "My name is Ada." in second.stderr and first["text"] in second.stderr
    assert doc["conversation_id"] == first["conversation_id"]
    third = json.loads(lcli("run", "--cid", str(first["conversation_id"]), "And again?", *N, "--json").stdout)
    assert third["stats"]["prompt_tokens"] > s2["prompt_tokens"] + s2["completion_tokens"]
    rows = _logged(lcli, "--cid", str(first["conversation_id"]))
    assert [x["prompt"] for x in rows] == ["My name is Ada.", "What is my name?", "And again?"]
    r = lcli("run", "--cid", "nonexistent", "hi")
    assert r.returncode == 1 and "no conversation 'nonexistent'" in r.stderr and r.stderr.count("\n") == 1
    r = lcli("run", "--continue", "--raw", "hi")
    assert r.returncode == 2 and "cannot be combined with --raw" in r.stderr
    r = lcli("run", "-C", "--cid", str(first["conversation_id"]), "hi")  # --cid won, -C dropped unsaid (a trial)
    assert r.returncode == 2 and r.stderr == ("localgen: error: --continue and --cid each name the conversation to "
                                              "go on with: give one\n"), r.stderr


def test_a_continued_conversation_longer_than_the_window_leaves_its_oldest_turns_out(lcli: CLI) -> None:
    """As chat's window: the logged turns that no longer fit with the new prompt are left out, oldest first and
    whole exchanges, said in one line; the log keeps them. (Every later --continue failed: "the prompt is 700
    tokens", naming the prompt, not the conversation.) A prompt too long alone goes without them, to its error."""
    filler = " ".join(["the quick brown fox jumps over the lazy dog."] * 30)
    small = ("--ctx", "512", "--json")
    first = json.loads(lcli("run", f"The code word is PELICAN. {filler}", *N, *small).stdout)
    cid = str(first["conversation_id"])
    for prompt in ("The colour is TEAL.", "The animal is OTTER."):
        r = lcli("run", "--cid", cid, prompt, *N, *small)
        assert r.returncode == 0 and "left out" not in r.stderr, r.stderr
    half = " ".join(["the quick brown fox jumps over the lazy dog."] * 15)
    r = lcli("run", "--cid", cid, f"And now? {half}", *N, *small, "--verbose-prompt")
    assert r.returncode == 0, r.stderr
    said = ("the conversation's first 2 of 6 logged messages are left out to fit the 512-token context window "
            "(the log keeps them; a larger --ctx sends more)")
    assert said in r.stderr.splitlines() and "PELICAN" not in r.stderr, r.stderr
    assert "TEAL" in r.stderr and "OTTER" in r.stderr  # the newer exchanges went
    assert json.loads(r.stdout)["conversation_id"] == cid
    r = lcli("run", "--cid", cid, "And again?", *N, "--ctx", "4096", "--verbose-prompt")  # all fit: all sent, unsaid
    assert r.returncode == 0 and "PELICAN" in r.stderr and "left out" not in r.stderr, r.stderr
    r = lcli("run", "--cid", cid, " ".join([filler] * 3), *N, *small)
    assert r.returncode == 1 and "left out" not in r.stderr and "the context window is 512" in r.stderr, r.stderr
    assert [x["prompt"][:8] for x in _logged(lcli, "--cid", cid)] == [
        "The code", "The colo", "The anim", "And now?", "And agai"]


def test_a_continued_conversation_with_tools_counts_the_tools_in_its_window(lcli: CLI) -> None:
    """The tools are sent with the prompt (some 320 tokens of smollm2's template for tests/tool_functions.py): the
    turns that fit are those that fit beside them. (Counted without them, every turn was kept and the prompt was
    "581 tokens; the context window is 512".)"""
    filler = " ".join(["the quick brown fox jumps over the lazy dog."] * 20)
    first = json.loads(lcli("run", f"The code word is PELICAN. {filler}", *N, "--json").stdout)
    r = lcli("run", "--cid", str(first["conversation_id"]), "And now?", *N, "--ctx", "512",
             "--functions", str(ROOT / "tests" / "tool_functions.py"), "--yes")
    assert r.returncode == 0, r.stderr
    assert ("the conversation's first 2 of 2 logged messages are left out to fit the 512-token context window "
            "(the log keeps them; a larger --ctx sends more)") in r.stderr.splitlines(), r.stderr


@pytest.mark.skipif(os.name != "posix", reason="POSIX modes")
def test_a_data_dir_that_cannot_be_entered_is_said_as_such_to_a_reader_not_as_a_write() -> None:
    """`logs` and `chat --list` only read, yet a data dir they could not enter was "cannot write PATH: Permission
    denied"; the one line says the path cannot be used. Root enters a folder of any mode: as root, run as nobody."""
    import shutil
    import sys
    import tempfile

    as_nobody: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root, and no setpriv to run as another user")
        as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        probe = subprocess.run([*as_nobody, sys.executable, "-c", "import localgen"], cwd=ROOT, capture_output=True,
                               timeout=120, stdin=subprocess.DEVNULL)
        if probe.returncode != 0:  # this Python or the checkout is root's alone (a home of mode 0700)
            pytest.skip("root, and nobody cannot run this Python on this checkout")
    top = Path(tempfile.mkdtemp(prefix="localgen-noentry-", dir="/tmp"))  # pytest's own folders are root's alone
    home = top / "home"
    data = home / "data"
    try:
        top.chmod(0o777)
        data.mkdir(parents=True)
        home.chmod(0o777)  # the home is the user's; only its data dir cannot be entered
        data.chmod(0)
        env = {"PATH": os.environ.get("PATH", ""), "LOCALGEN_HOME": str(home), "HF_HOME": str(top / "hf"),
               "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
        for args, path in ((["logs"], data / "logs" / "logs.db"), (["chat", "--list"], data / "chats")):
            r = subprocess.run([*as_nobody, sys.executable, "-m", "localgen", *args], env=env, cwd=ROOT,
                               capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
            assert (r.returncode, r.stdout) == (1, ""), r.stderr
            assert r.stderr == (f"localgen: error: cannot use {path}: Permission denied (LOCALGEN_HOME is "
                                f"{str(home)!r}: give a folder localgen can write, or unset it)\n"), r.stderr
    finally:
        with suppress(OSError):
            data.chmod(0o700)
        shutil.rmtree(top, ignore_errors=True)


def test_logs_json_before_anything_is_logged_is_an_empty_array(lcli: CLI) -> None:
    for args in ((), ("-q", "word"), ("--cid", "abc")):
        r = lcli("logs", "--json", *args)
        assert r.returncode == 0 and json.loads(r.stdout) == [] and "nothing is logged yet" in r.stderr, r


def _seeded_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prompts: tuple[str, ...]) -> Path:
    """A LOCALGEN_HOME whose log holds one exchange for each prompt, in order, written by the store itself (a second
    apart: rows written in the same second would sort by their random ids)."""
    from localgen.log import store

    home = tmp_path / "home"
    monkeypatch.setenv("LOCALGEN_HOME", str(home))
    for i, prompt in enumerate(prompts):
        store.record(store.Entry(conversation_id=store.new_id(), source="run", model="m", prompt=prompt,
                                 response="r", datetime_utc=f"2026-01-01T00:00:{i:02d}"))
    return home


@pytest.mark.parametrize("logged", [False, True], ids=["fresh-home", "with-a-log"])
def test_a_query_with_no_letter_or_digit_is_refused_before_anything_is_logged_too(
        cli_in_process: InProcessCLI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logged: bool) -> None:
    """docs/logs.md: a query with no letter or digit is refused, exit 2, on a fresh home as on one with a log (it
    was "nothing is logged yet", exit 0, and `[]` with --json, where no log was made yet)."""
    home = _seeded_home(tmp_path, monkeypatch, ("Name a yellow fruit.",) if logged else ())
    lcli = InProcessCLI({**cli_in_process.env, "LOCALGEN_HOME": str(home)})
    for args in (("-q", "***"), ("-q", "***", "--json")):
        r = lcli("logs", *args)
        assert (r.returncode, r.stdout) == (2, ""), (args, r)
        assert r.stderr.startswith("localgen: error: -q '***' has no word to search for"), r.stderr
        assert r.stderr.count("\n") == 1 and "nothing is logged" not in r.stderr, r.stderr


def test_a_word_said_again_in_q_is_searched_once(cli_in_process: InProcessCLI, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A pasted text's words, each a phrase of the full-text query: `-q` of one word 40,000 times took 5 s here
    (40,000 different words, minutes). A word said again, in any case, is searched once: it matches nothing more."""
    from localgen.log import store

    assert store.fts_query('Yellow yellow YELLOW fruit "x" fruit') == '"Yellow" "fruit" """x"""'
    # only ASCII case is folded here: unicode61 keeps Georgian capitals apart from the small letters
    assert store.fts_query("ᲗᲑᲘᲚᲘᲡᲘ თბილისი") == '"ᲗᲑᲘᲚᲘᲡᲘ" "თბილისი"'
    home = _seeded_home(tmp_path, monkeypatch, ("Name a yellow fruit.", "Name a red one."))
    r = InProcessCLI({**cli_in_process.env, "LOCALGEN_HOME": str(home)})("logs", "-q", " ".join(["YELLOW"] * 40000),
                                                                          "--json")
    assert r.returncode == 0 and [e["prompt"] for e in json.loads(r.stdout)] == ["Name a yellow fruit."], r.stderr


def test_logs_shows_the_latest_3_exchanges_oldest_first(cli_in_process: InProcessCLI, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/logs.md: plain `localgen logs` is the latest 3 exchanges, oldest first."""
    prompts = ("First one.", "Second one.", "Third one.", "Fourth one.", "Fifth one.")
    home = _seeded_home(tmp_path, monkeypatch, prompts)
    lcli = InProcessCLI({**cli_in_process.env, "LOCALGEN_HOME": str(home)})
    r = lcli("logs")
    assert r.returncode == 0 and not r.stderr, r.stderr
    shown = [line for line in r.stdout.splitlines() if line.endswith(" one.")]
    assert shown == ["Third one.", "Fourth one.", "Fifth one."], r.stdout
    assert r.stdout.count("## Prompt") == 3, r.stdout
    assert [x["prompt"] for x in json.loads(lcli("logs", "--json").stdout)] == list(prompts[2:])


@pytest.mark.parametrize("args", [("logs", "-q", "a\udcffb"), ("logs", "-m", "a\udcffb"), ("logs", "--cid", "a\udcffb"),
                                  ("run", "--cid", "a\udcffb", "hi")])
def test_a_filter_or_id_that_is_not_utf8_is_a_usage_error(cli_in_process: InProcessCLI, args: tuple[str, ...]) -> None:
    """Bytes that are not UTF-8 (a lone surrogate in Python's argv) are one line, exit 2, not SQLite's traceback."""
    r = cli_in_process(*args)
    flag = args[-2] if args[0] == "logs" else "--cid"
    assert r.returncode == 2, r.stderr
    assert r.stderr == f"localgen: error: {flag} is not valid UTF-8 text: byte 0xff at character 2 is not UTF-8\n"


def test_continue_with_an_empty_log_is_an_error_as_chat_resume_is(lcli: CLI) -> None:
    """Nothing to go on with is exit 1 (docs/ci.md), for `run --continue` as for `chat --resume`."""
    r = lcli("run", "--continue", "hi")
    assert r.returncode == 1 and "the log has no conversation yet" in r.stderr and r.stderr.count("\n") == 1
    r = lcli("chat", "--resume", input="hi\n")
    assert r.returncode == 1 and "there is no saved conversation to resume" in r.stderr, r.stderr


def test_no_log_and_logs_off(lcli: CLI) -> None:
    assert lcli("run", "One.", *N).returncode == 0
    assert lcli("run", "Two.", *N, "--no-log").returncode == 0
    assert lcli("logs", "off").returncode == 0
    assert lcli("run", "Three.", *N).returncode == 0
    assert "logging is off" in lcli("logs", "status").stdout
    assert lcli("logs", "on").returncode == 0
    assert lcli("run", "Four.", *N).returncode == 0
    assert [x["prompt"] for x in _logged(lcli)] == ["One.", "Four."]


def test_logs_off_on_a_full_disk_turns_logging_off(lcli: CLI) -> None:
    """A disk with no room left for data (a file size limit, as a full disk: a file is made, nothing goes in it):
    `logs off` said "No space left on device" with no path and exit 1, yet logging was off (its marker made, its
    note not written). Now the marker is all it takes: logging is off, exit 0; one that cannot be made at all (a
    read-only folder) is one line naming it, and logging stays on."""
    import resource

    def no_room() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

    marker = Path(lcli.env["LOCALGEN_HOME"]) / "config" / "logs-off"
    marker.parent.mkdir(parents=True)
    r = subprocess.run(lcli.argv("logs", "off"), env=lcli.env, capture_output=True, text=True, preexec_fn=no_room,
                       timeout=600)
    assert (r.returncode, r.stderr) == (0, "logging is off\n"), r.stderr
    assert "logging is off" in lcli("logs", "status").stdout
    assert lcli("logs", "on").returncode == 0 and not marker.exists()
    marker.parent.rmdir()
    marker.parent.write_text("")  # a file where its folder should be: the marker cannot be made
    r = lcli("logs", "off")
    assert r.returncode == 1 and r.stderr == f"localgen: error: {marker.parent} is a file, not a folder\n", r.stderr
    assert r.stderr.count("\n") == 1 and "logging is on" in lcli("logs", "status").stdout


def test_chat_turns_are_logged_and_a_logged_conversation_resumes(lcli: CLI) -> None:
    r = lcli("chat", *N, input="Remember the word banana.\nWhat was the word?\n")
    assert r.returncode == 0, r.stderr
    rows = _logged(lcli)
    assert [x["prompt"] for x in rows] == ["Remember the word banana.", "What was the word?"]
    assert {x["source"] for x in rows} == {"chat"} and len({x["conversation_id"] for x in rows}) == 1
    run = json.loads(lcli("run", "A logged run.", *N, "--json").stdout)
    again = lcli("chat", "--resume", str(run["conversation_id"]), *N, "--stats", input="Go on.\n")
    assert again.returncode == 0, again.stderr
    rows = _logged(lcli, "--cid", str(run["conversation_id"]))
    assert [x["prompt"] for x in rows] == ["A logged run.", "Go on."] and rows[1]["source"] == "chat"
    before, after = rows
    assert int(str(after["prompt_tokens"])) > int(str(before["prompt_tokens"])) + int(str(before["completion_tokens"]))
    r = lcli("chat", "--resume", "no-such-thing", input="hi\n")
    assert r.returncode == 1 and "nor a conversation with that id in the log" in r.stderr


RACERS = 6


def test_six_runs_at_once_leave_six_rows(lcli: CLI, monkeypatch: pytest.MonkeyPatch) -> None:
    """Concurrent writers wait for each other. The test holds the log's write lock while the runs answer, so
    their inserts are certain to meet: each prints its answer, then waits on the lock (a run cannot end while
    it is held), and once it is let go they all race for it at the same moment."""
    from localgen.log import store

    # the schema exists (made by a row written here, as a run writes it: no seventh model load); now only
    # inserts race
    monkeypatch.setenv("LOCALGEN_HOME", lcli.env["LOCALGEN_HOME"])
    store.record(store.Entry(conversation_id=store.new_id(), source="run", model="smollm2:135m",
                             prompt="Warm up the log.", response="Warm."))
    answered: list[float] = []
    hold = sqlite3.connect(_db(lcli), isolation_level=None)
    hold.execute("BEGIN IMMEDIATE")  # the write lock, as a writer holds it
    try:
        procs = [lcli.popen("run", f"Say the number {i}.", "-n", "2", "--threads", "1", stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL) for i in range(RACERS)]
        readers = [threading.Thread(target=lambda p=p: (p.stdout.readline(), answered.append(time.monotonic())))
                   for p in procs]
        for t in readers:
            t.start()
        # until every run has answered, or for 20 s after the first did (model loads on busy cores can be far
        # apart): 10 s within the 30 s a writer waits
        give_up = time.monotonic() + 300  # a guard against a hang, not a timing
        while len(answered) < RACERS and not (answered and time.monotonic() - answered[0] > 20):
            assert time.monotonic() < give_up, "no run answered in 300 s"
            time.sleep(0.05)
        time.sleep(0.3)
        waiting = [p for p in procs if p.poll() is None]
        assert len(answered) >= 2 and len(waiting) == RACERS, "the runs answered, and none could end: they wait"
    finally:
        hold.rollback()
        hold.close()
    for t in readers:
        t.join(timeout=300)
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0 and not err, err.decode()
    prompts = {str(x["prompt"]) for x in _logged(lcli)}
    assert prompts >= {f"Say the number {i}." for i in range(RACERS)} and len(prompts) == RACERS + 1


def test_a_damaged_or_unwritable_log_never_stops_an_answer(lcli: CLI) -> None:
    assert lcli("run", "First.", *N).returncode == 0
    db = _db(lcli)
    for name in list(db.parent.iterdir()):
        name.unlink()
    db.write_bytes(b"this is not a database, just some bytes " * 100)
    r = lcli("run", "Second.", *N)
    assert r.returncode == 0 and r.stdout.strip(), "the answer came"
    assert r.stderr.count("\n") == 1 and "the log at" in r.stderr and "this answer was not logged" in r.stderr
    bad = lcli("logs")
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
    assert bad.stderr.endswith("is unusable: file is not a database (move it away, and the next run starts a new "
                               "log)\n"), bad.stderr
    resumed = lcli("chat", "--resume", "some-id", input="hi\n")  # not "no conversation": the log cannot tell
    assert resumed.returncode == 1 and "is unusable: file is not a database" in resumed.stderr, resumed.stderr
    assert db.read_bytes().startswith(b"this is not a database"), "the damaged file is left as it was"
    db.unlink()
    db.parent.rmdir()
    db.parent.write_text("a file where the log's folder should be")  # nothing can be written there
    r = lcli("run", "Third.", *N)
    assert r.returncode == 0 and r.stdout.strip() and "this answer was not logged" in r.stderr


def test_a_chat_with_a_damaged_log_warns_once_and_answers_every_turn(lcli: CLI) -> None:
    """A chat meets the log on every turn: one warning (not an error line a turn), every answer, exit 0."""
    db = _db(lcli)
    db.parent.mkdir(parents=True)
    db.write_bytes(b"this is not a database, just some bytes " * 100)
    r = lcli("chat", *N, input="Hi.\nName a fruit.\nName a colour.\n")
    assert r.returncode == 0, r.stderr
    assert len([line for line in r.stdout.splitlines() if line.strip()]) >= 3, "every turn was answered"
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("warning: the log at "), r.stderr
    assert "this answer was not logged (nor are the chat's later answers while this lasts)" in r.stderr
    assert db.read_bytes().startswith(b"this is not a database"), "the damaged file is left as it was"


def _half_made(db: Path, keep: str) -> None:
    """The log as a first write leaves it when the disk fills up part of the way through making it: an empty
    file, the table alone, or the full-text table with one of its three triggers; user_version still 0."""
    db.parent.mkdir(parents=True)
    db.touch()
    if keep == "empty file":
        return
    import sqlite_utils

    from localgen.log import store

    with sqlite3.connect(db) as conn:
        sqlite_utils.Database(conn).table("responses").create(store.COLUMNS, pk="id")  # one statement: whole
        if keep == "full-text table and one trigger":
            conn.execute("CREATE VIRTUAL TABLE responses_fts USING FTS5 (prompt, response, content=[responses])")
            conn.execute("CREATE TRIGGER responses_ai AFTER INSERT ON responses BEGIN INSERT INTO responses_fts "
                         "(rowid, prompt, response) VALUES (new.rowid, new.prompt, new.response); END")
    conn.close()


@pytest.mark.parametrize("keep", ["empty file", "table", "full-text table and one trigger"])
def test_a_log_whose_first_write_stopped_half_way_is_empty_and_the_next_run_finishes_it(lcli: CLI, keep: str) -> None:
    """A first run on a disk that filled up leaves the log half made: `logs` shows an empty log (not an error),
    and once there is room the next run makes the rest and is logged, searchable, as every later one."""
    db = _db(lcli)
    _half_made(db, keep)
    shown = lcli("logs")
    assert shown.returncode == 0 and shown.stderr == "the log holds no exchange yet\n", shown.stderr
    status = lcli("logs", "status")
    assert status.returncode == 0 and "· 0 exchanges" in status.stdout, status.stderr
    assert lcli("logs", "--json").stdout.strip() == "[]"
    r = lcli("run", "--cid", "abc", "hi")
    assert r.returncode == 1 and "the log has no conversation 'abc'" in r.stderr, r.stderr
    for prompt in ("Name a yellow fruit.", "Name a red berry."):
        r = lcli("run", prompt, *N)
        assert r.returncode == 0 and not r.stderr, r.stderr
    assert [x["prompt"] for x in _logged(lcli, "-q", "yellow")] == ["Name a yellow fruit."]
    assert [x["prompt"] for x in _logged(lcli, "-q", "red berry")] == ["Name a red berry."]


def test_logs_count_beyond_what_sqlite_counts_to_shows_them_all(lcli: CLI, monkeypatch: pytest.MonkeyPatch) -> None:
    """-n takes any count: one past SQLite's largest integer means all of them, not a log called unusable."""
    from localgen.log import store

    monkeypatch.setenv("LOCALGEN_HOME", lcli.env["LOCALGEN_HOME"])
    for prompt in ("One.", "Two."):
        store.record(store.Entry(conversation_id=store.new_id(), source="run", model="m", prompt=prompt, response="r"))
    for args in (("-n", "99999999999999999999"), ("-n", str(2**63)), ("-q", "r", "-n", str(2**64))):
        r = lcli("logs", "--json", *args)
        assert r.returncode == 0, r.stderr
        assert sorted(x["prompt"] for x in json.loads(r.stdout)) == ["One.", "Two."]


READ_ONLY = 'mount --bind -o ro "$H" "$H"'
FULL = ('cp -a "$H/data/logs" "$T/logs" && mount -t tmpfs -o size=256k tmpfs "$H/data/logs" && cp -a "$T/logs/." '
        '"$H/data/logs/" && { dd if=/dev/zero of="$H/data/logs/filler" bs=4k 2>/dev/null; true; }')


def _mounted(lcli: CLI, tmp_path: Path, mount: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`localgen ARGS` with the home read-only, or the log's folder on a full disk: a mount of its own (in a
    mount namespace that ends with the process; the home outside it is left as it was)."""
    import shutil
    import sys

    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("mounting needs unshare and the right to use it (root)")
    env = {**lcli.env, "H": lcli.env["LOCALGEN_HOME"], "T": str(tmp_path), "PY": sys.executable}
    return subprocess.run(["unshare", "-m", "sh", "-c", f'{mount} && exec "$PY" -m localgen "$@"', "sh", *args],
                          env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)


@pytest.mark.parametrize(("mount", "why"), [(READ_ONLY, "its folder cannot be written"),
                                            (FULL, "no space is left on its disk")])
def test_a_log_that_cannot_be_written_is_still_read_and_says_why_an_answer_was_not_logged(
        lcli: CLI, tmp_path: Path, mount: str, why: str) -> None:
    """A home on a read-only disk, or a full one: the log is read as it is (logs, -q, status, --continue), and a run
    answers with one warning that says the cause instead of SQLite's "unable to open" or "disk I/O error"."""
    first = lcli("run", "Name a yellow fruit.", *N)
    assert first.returncode == 0 and not first.stderr, first.stderr
    listed = _mounted(lcli, tmp_path, mount, "logs", "-n", "0", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [x["prompt"] for x in json.loads(listed.stdout)] == ["Name a yellow fruit."]
    found = _mounted(lcli, tmp_path, mount, "logs", "-q", "yellow", "--json")
    assert found.returncode == 0 and len(json.loads(found.stdout)) == 1, found.stderr
    status = _mounted(lcli, tmp_path, mount, "logs", "status")
    assert status.returncode == 0 and status.stdout.endswith("· 1 exchange\n"), status.stderr
    r = _mounted(lcli, tmp_path, mount, "run", "--continue", "Another?", *N)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    assert r.stderr.count("\n") == 1 and f"is unusable: {why} (" in r.stderr and "not logged" in r.stderr, r.stderr
    assert [x["prompt"] for x in _logged(lcli)] == ["Name a yellow fruit."], "the log outside is as it was"
    assert lcli("run", "One more.", *N).returncode == 0 and len(_logged(lcli)) == 2, "and takes the next run"


def test_a_log_never_made_on_a_read_only_disk_is_one_warning_and_exit_0(lcli: CLI, tmp_path: Path) -> None:
    """Making the log's tables takes a lock file beside it: on a read-only disk that is one warning too, not an
    error after the answer (exit 1)."""
    _half_made(_db(lcli), "empty file")
    r = _mounted(lcli, tmp_path, READ_ONLY, "run", "Hi.", *N)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("warning: the log at ") and "not logged" in r.stderr


def test_a_fresh_home_on_a_read_only_disk_says_its_folder_cannot_be_written_in_words(lcli: CLI,
                                                                                     tmp_path: Path) -> None:
    """A home where nothing was ever written, read-only: the warning says the folder cannot be written, with its
    path, as the other log warnings do, not Python's "[Errno 30] Read-only file system: '...'"."""
    home = Path(lcli.env["LOCALGEN_HOME"])
    home.mkdir()
    r = _mounted(lcli, tmp_path, READ_ONLY, "run", "Hi.", *N)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    assert r.stderr == (f"warning: the log at {_db(lcli)} cannot be opened: its folder cannot be written "
                        f"({home / 'data'}: read-only file system); this answer was not logged\n"), r.stderr
    assert list(home.iterdir()) == []


def test_a_lock_that_cannot_be_made_is_said_in_words(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A log whose making takes the lock file beside it, on a disk with no inode left for that file: the warning
    said Python's "[Errno 28] No space left on device: '.../logs.db.lock'"; now the cause in words, as the other
    log warnings do, with the file named."""
    import errno
    import os

    from localgen.log import store

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    db = store.path()
    _half_made(db, "empty file")
    real = os.open

    def no_inode(path: Any, *args: Any, **kwargs: Any) -> int:
        if str(path).endswith("logs.db.lock"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_inode)
    with pytest.raises(store.LogError) as caught:
        store.record(store.Entry(conversation_id=store.new_id(), source="run", model="m", prompt="p", response="r"))
    assert str(caught.value) == (f"the log at {db} is unusable: no space is left on its disk ({db}.lock: no space "
                                 "left on device)"), str(caught.value)


def test_logs_status_counts_one_exchange_in_the_singular_and_refuses_the_listing_options(
        lcli: CLI, monkeypatch: pytest.MonkeyPatch) -> None:
    """`logs status` says "1 exchange", not "1 exchanges"; `logs -n 5 status` (the listing's options before a
    subcommand, which ignored them) is one usage error naming the option, exit 2."""
    from localgen.log import store

    monkeypatch.setenv("LOCALGEN_HOME", lcli.env["LOCALGEN_HOME"])
    store.record(store.Entry(conversation_id=store.new_id(), source="run", model="m", prompt="p", response="r"))
    r = lcli("logs", "status")
    assert r.returncode == 0 and r.stdout == f"logging is on · {_db(lcli)} · 1 exchange\n", r.stdout
    for args, flag in ((("-n", "5", "status"), "-n/--count"), (("--json", "path"), "--json"),
                       (("-q", "x", "off"), "-q/--query")):
        r = lcli("logs", *args)
        assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith(f"localgen: error: {flag} lists exchanges: `logs {args[-1]}` takes no options")
    assert lcli("logs", "status").stdout.startswith("logging is on"), "`logs -q x off` turned nothing off"


def test_a_log_held_past_the_wait_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer that waited its busy timeout out says another process held the log, not just 'unusable'."""
    from localgen.log import store

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    entry = store.Entry(conversation_id=store.new_id(), source="run", model="m", prompt="p", response="r")
    store.record(entry)
    monkeypatch.setattr(store, "BUSY_TIMEOUT_S", 0.2)
    hold = sqlite3.connect(store.path(), isolation_level=None)
    hold.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(store.LogError) as e:
            store.record(entry)
    finally:
        hold.rollback()
        hold.close()
    assert "another process held it for the 0.2 s a writer waits (database is locked)" in e.value.message
    assert store.count() == 1


def test_a_log_whose_writes_meet_damage_is_called_damaged_by_logs_and_status(lcli: CLI, tmp_path: Path) -> None:
    """A log damaged in its middle pages still reads (count, the latest rows) while every run's write fails: `logs
    status` and `logs` say it is damaged and runs are not logged (one warning line), where status said "logging
    is on · 33 exchanges" as if all were well; the next good write (a new log) clears it."""
    r = lcli("run", "-m", "smollm2:135m", "A first question.", *N)
    assert r.returncode == 0, r.stderr
    db = _db(lcli)
    with closing(sqlite3.connect(db)) as conn, conn:  # some pages of rows, then all of it in the file itself
        conn.executemany("INSERT INTO responses (id, conversation_id, source, model, prompt, response, settings, "
                         "datetime_utc) VALUES (?, ?, 'run', 'm', ?, ?, '{}', '2026-11-30T00:00:00')",
                         [(f"id{i}", f"c{i}", f"p{i} " + "x" * 300, "r" * 300) for i in range(32)])
    with closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    good = tmp_path / "backup.db"
    shutil.copyfile(db, good)
    with db.open("r+b") as f:
        f.seek(8192)
        f.write(bytes(range(256)) * 16)
    r = lcli("run", "-m", "smollm2:135m", "Another question.", *N)
    assert r.returncode == 0 and "database disk image is malformed" in r.stderr, r.stderr
    warning = (f"warning: the log at {db} is damaged (database disk image is malformed): runs are not logged; move "
               "it away, and the next run starts a new log\n")
    status = lcli("logs", "status")
    assert status.returncode == 0, status.stderr
    assert status.stdout == (f"logging is on but failing · {db} · 33 exchanges · damaged: database disk image is "
                             "malformed\n"), status.stdout
    assert status.stderr == warning, status.stderr
    listed = lcli("logs", "-n", "1")
    assert listed.returncode == 0 and listed.stderr == warning, listed.stderr
    shutil.copyfile(good, db)  # a backup restored over it (the same inode): no longer the file found damaged
    status = lcli("logs", "status")
    assert (status.stdout, status.stderr) == (f"logging is on · {db} · 33 exchanges\n", ""), status
    marker = Path(lcli.env["LOCALGEN_HOME"]) / "state" / "log-damaged"
    assert marker.is_file()
    marker.write_bytes(b"\xff\xfe garbage\n")  # the note damaged itself: no word of damage (it was a traceback)
    status = lcli("logs", "status")
    assert (status.stdout, status.stderr) == (f"logging is on · {db} · 33 exchanges\n", ""), status
    db.rename(tmp_path / "damaged.db")
    for suffix in ("-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    assert lcli("run", "-m", "smollm2:135m", "A third question.", *N).returncode == 0
    status = lcli("logs", "status")
    assert (status.stdout, status.stderr) == (f"logging is on · {db} · 1 exchange\n", ""), status


def test_a_damaged_search_index_or_a_log_that_cannot_be_counted_is_called_damaged_by_status(lcli: CLI) -> None:
    """A newcomer's trial: a damaged page of the full-text index (FTS5: `vtable constructor failed`) made every
    run's write fail while `logs status` said `logging is on` with no warning, since only two of SQLite's words
    counted as damage; and a log damaged where counting reads made `logs status` fail (exit 1), so a user could
    not see whether logging was on."""
    r = lcli("run", "-m", "smollm2:135m", "A first question.", *N)
    assert r.returncode == 0, r.stderr
    db = _db(lcli)
    with closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'responses_fts_config'").fetchone()[0]
    with db.open("r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(bytes(range(256)) * (page_size // 256))
    r = lcli("run", "-m", "smollm2:135m", "Another question.", *N)
    assert r.returncode == 0 and "vtable constructor failed: responses_fts" in r.stderr, r.stderr
    status = lcli("logs", "status")
    assert status.returncode == 0, status.stderr
    assert status.stdout == (f"logging is on but failing · {db} · 1 exchange · damaged: vtable constructor failed: "
                             "responses_fts\n"), status.stdout
    assert "runs are not logged; move it away, and the next run starts a new log" in status.stderr, status.stderr
    other = db.with_name("other.db")  # another file (made while the first is there: not its inode), with no
    other.write_bytes(bytes(range(256)) * 64)  # database at all in it: not even its exchanges can be counted, and
    for suffix in ("-wal", "-shm"):  # no write has met it yet
        Path(str(db) + suffix).unlink(missing_ok=True)
    other.replace(db)
    status = lcli("logs", "status")
    assert status.returncode == 0, status.stderr
    assert status.stdout == (f"logging is on but failing · {db} · its exchanges cannot be counted · damaged: file is "
                             "not a database\n"), status.stdout
    assert lcli("logs", "-n", "1").returncode == 1  # listing it is still the error logs.md says


def test_a_search_index_whose_format_record_is_damaged_is_called_damaged(lcli: CLI) -> None:
    """A newcomer's trial: the full-text index's format record damaged (SQLite: `invalid fts5 file format (found 99,
    expected 4) - run 'rebuild'`) was not taken for damage: each run's warning gave SQLite's advice alone, and
    `logs status` said `logging is on` while no run was logged."""
    assert lcli("run", "-m", "smollm2:135m", "A first question.", *N).returncode == 0
    db = _db(lcli)
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("UPDATE responses_fts_config SET v = 99 WHERE k = 'version'")
    r = lcli("run", "-m", "smollm2:135m", "Another question.", *N)
    assert r.returncode == 0 and "invalid fts5 file format" in r.stderr and "move it away" in r.stderr, r.stderr
    status = lcli("logs", "status")
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith(f"logging is on but failing · {db} · 1 exchange · damaged: invalid fts5 file "
                                    "format"), status.stdout


def test_a_log_that_is_a_folder_or_a_newer_localgens_says_what_to_do(lcli: CLI) -> None:
    """A newcomer's trial: a folder where the log should be was "cannot be opened: unable to open database file",
    a newer localgen's log said so and no more, and `logs status` failed (exit 1) on both, so a user could not see
    whether logging was on."""
    db = _db(lcli)
    db.mkdir(parents=True)
    r = lcli("run", "-m", "smollm2:135m", "A question.", *N)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    assert r.stderr == (f"warning: the log at {db} is a folder, not a file; this answer was not logged; move it away, "
                        "and the next run starts a new log\n"), r.stderr
    listing = lcli("logs", "-n", "1")
    assert listing.returncode == 1 and listing.stderr == (
        f"localgen: error: the log at {db} is a folder, not a file (move it away, and the next run starts a new "
        "log)\n"), listing.stderr
    status = lcli("logs", "status")
    assert status.returncode == 0 and status.stdout == f"logging is on · {db} · its exchanges cannot be counted\n"
    assert status.stderr == (f"warning: the log at {db} is a folder, not a file; move it away, and the next run "
                             "starts a new log\n"), status.stderr
    db.rmdir()
    with closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA user_version = 999")
    listing = lcli("logs", "-n", "1")
    assert listing.returncode == 1 and listing.stderr.count("\n") == 1, listing.stderr
    assert listing.stderr.endswith("was written by a newer localgen (schema 999) (read it with that version, or move "
                                   "it away, and the next run starts a new log; it was left as it is)\n")
    status = lcli("logs", "status")
    assert status.returncode == 0 and status.stdout == f"logging is on · {db} · its exchanges cannot be counted\n"
    assert "newer localgen (schema 999); read it with that version" in status.stderr, status.stderr


def test_logs_cid_takes_a_saved_chats_name(lcli: CLI) -> None:
    """logs.md: `logs --cid` and `run --cid` take a saved chat's name (chat --list's) as well as a conversation's
    id; a name was "no logged exchange matches" and "the log has no conversation" (a newcomer's trial)."""
    r = lcli("chat", "-m", "smollm2:135m", *N, input="A question for the trip.\n/save trip\n")
    assert r.returncode == 0, r.stderr
    assert lcli("run", "-m", "smollm2:135m", "Another conversation.", *N).returncode == 0
    [logged] = json.loads(lcli("logs", "--cid", "trip", "--json").stdout)
    assert logged["prompt"] == "A question for the trip." and logged["source"] == "chat", logged
    assert json.loads(lcli("logs", "--cid", logged["conversation_id"], "--json").stdout) == [logged]
    none = lcli("logs", "--cid", "nope")
    assert none.returncode == 0 and none.stderr == "no logged exchange matches --cid 'nope'\n", none.stderr
    damaged = Path(lcli.env["LOCALGEN_HOME"]) / "data" / "chats" / "broken.json"
    damaged.write_text("{not json")  # a saved chat that cannot be read says why, not "no logged exchange"
    r = lcli("logs", "--cid", "broken")
    assert r.returncode == 1 and f"the saved conversation {damaged} is unreadable" in r.stderr, r.stderr
    on = lcli("run", "--cid", "trip", "And then?", *N, "--json")  # run --cid goes on with it by the name too
    assert on.returncode == 0 and json.loads(on.stdout)["conversation_id"] == logged["conversation_id"], on.stderr
    gone = lcli("run", "--cid", "nope", "And then?", *N)
    assert gone.returncode == 1 and "the log has no conversation 'nope'" in gone.stderr, gone.stderr


def test_continue_keeps_the_conversations_model_under_localgen_model(lcli: CLI) -> None:
    """logs.md: --continue goes on with the conversation's model "unless -m" says otherwise; LOCALGEN_MODEL is a
    default (configuration.md), not -m typed, and replaced it (here with a model that has no chat template)."""
    first = lcli("run", "-m", "smollm2:135m", "My name is Ada.", *N, "--json")
    assert first.returncode == 0, first.stderr
    under = CLI({**lcli.env, "LOCALGEN_MODEL": "gemma3:270m"})
    r = under("run", "--continue", "What is my name?", *N, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["model"]["name"] == "smollm2:135m"
    r = under("run", "--continue", "-m", "gemma3:270m", "What is my name?", *N)  # -m typed: that model
    assert r.returncode == 2 and "gemma3:270m has no chat template" in r.stderr, r.stderr


def test_a_conversation_begun_on_the_default_model_keeps_it_under_localgen_model(lcli: CLI) -> None:
    """logs.md, configuration.md: a conversation gone on with keeps its own model, the default's too. The log kept
    no model for one begun without -m, so LOCALGEN_MODEL replaced it: `run -C` and `chat --resume ID` answered with
    (or failed on) that model instead."""
    first = lcli("run", "My name is Ada.", *N, "--json")
    assert first.returncode == 0, first.stderr
    cid = str(json.loads(first.stdout)["conversation_id"])
    under = CLI({**lcli.env, "LOCALGEN_MODEL": "gemma3:270m"})  # no chat template: it would fail to go on
    r = under("run", "--continue", "What is my name?", *N, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["model"]["name"] == "smollm2:135m"
    r = under("chat", "--resume", cid, *N, input="Again?\n")
    assert r.returncode == 0, r.stderr
    assert [row["model"] for row in _logged(lcli, "--cid", cid)] == ["smollm2:135m"] * 3
    # the chat's turn is logged under the model that answered it, not LOCALGEN_MODEL's: the run after goes on
    r = under("run", "--cid", cid, "And now?", *N, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["model"]["name"] == "smollm2:135m", r.stderr


def test_a_conversation_logged_without_a_model_goes_on_with_the_default(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Logs written before the default's name was kept hold no model for a conversation begun on the default:
    that model goes on with it, not LOCALGEN_MODEL's (a remote one keeps none: its endpoint names it)."""
    from localgen.cli.log.conversation import logged_thread
    from localgen.log import store

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    monkeypatch.setenv("LOCALGEN_MODEL", "gemma3:270m")
    store.record(store.Entry(conversation_id="old", source="run", model="smollm2:135m", prompt="p", response="r"))
    store.record(store.Entry(conversation_id="far", source="run", model="m", prompt="p", response="r",
                             endpoint="http://127.0.0.1:9/v1"))
    assert logged_thread("old").model_spec == "smollm2:135m"
    assert logged_thread("far").model_spec is None


def test_a_log_another_user_owns_is_not_written_and_one_of_ours_is_made_private(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/logs.md: the log is mode 0600 in a 0700 folder. A log (or its folder) another user made first, in a
    shared LOCALGEN_HOME or planted where ours was renamed away, took every prompt, readable by that user and
    without a word: now it is not written (a LogError, one warning in run and chat). One of ours whose mode
    another program loosened is made 0600 again at the next write, in a 0700 folder again."""
    from localgen.log import store

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))

    def entry() -> store.Entry:
        return store.Entry(conversation_id=store.new_id(), source="run", model="m", prompt="secret", response="r")

    store.record(entry())
    db = store.path()
    os.chmod(db, 0o666)
    os.chmod(db.parent, 0o755)  # (its folder was left as it was: others could list the log's files)
    store.record(entry())
    assert stat.S_IMODE(db.stat().st_mode) == 0o600 and stat.S_IMODE(db.parent.stat().st_mode) == 0o700
    monkeypatch.setattr(os, "geteuid", lambda: db.stat().st_uid + 4242)  # as another user sees these files
    with pytest.raises(store.LogError) as caught:
        store.record(entry())
    assert str(caught.value) == (f"the log at {db} is not written: {db.parent} belongs to another user (uid "
                                 f"{db.stat().st_uid}); set LOCALGEN_HOME to a folder of your own")
    assert store.count() == 2  # still read


def test_the_logs_lock_is_private_as_the_log_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/logs.md: the log's files are 0600. Its lock beside it was 0644, 0666 under umask 000."""
    from localgen.log import store

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    old = os.umask(0)
    try:
        store.record(store.Entry(conversation_id=store.new_id(), source="run", model="m", prompt="p", response="r"))
    finally:
        os.umask(old)
    lock = Path(str(store.path()) + ".lock")
    assert lock.exists() and stat.S_IMODE(lock.stat().st_mode) == 0o600


def test_logs_off_never_writes_through_a_link_planted_in_its_place(lcli: CLI, tmp_path: Path) -> None:
    """`localgen logs off` wrote its note through a symbolic link at config/logs-off, overwriting the file it
    pointed at (outside the home); now the link is replaced by the marker, and the file is left as it was."""
    victim = tmp_path / "victim"
    victim.write_text("the user's own file\n")
    config = Path(lcli.env["LOCALGEN_HOME"]) / "config"
    config.mkdir(parents=True)
    (config / "logs-off").symlink_to(victim)
    r = lcli("logs", "off")
    assert r.returncode == 0, r.stderr
    assert victim.read_text() == "the user's own file\n"
    marker = config / "logs-off"
    assert not marker.is_symlink() and stat.S_IMODE(marker.stat().st_mode) == 0o600
    assert lcli("logs", "status").stdout.startswith("logging is off")


def test_a_config_folder_that_cannot_be_entered_leaves_logging_on(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`enabled()` asked whether config/logs-off exists, and Python 3.11's exists() raises PermissionError for a
    folder that cannot be entered (a root-owned 0700 one under `sudo -E`): `run` answered, then ended with exit 1.
    Now logging is taken as on, and the log's own write warns if it cannot."""
    import errno

    from localgen.log import store

    monkeypatch.setenv("LOCALGEN_HOME", str(tmp_path))
    real = Path.exists

    def denied(self: Path, *args: Any, **kwargs: Any) -> bool:
        if self.name == "logs-off":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "exists", denied)
    assert store.enabled()


def test_a_continued_conversation_of_megabytes_leaves_its_oldest_turns_out(lcli: CLI,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A logged thread past what the window could hold by its characters alone (1.2 million characters here) was refused
    whole, "the prompt is 1,175,482 characters; the context window of 512 tokens holds at most 16,384", where
    its oldest turns are to be left out: the thread is cut by its characters, then by its tokens."""
    from localgen.log import store

    monkeypatch.setenv("LOCALGEN_HOME", lcli.env["LOCALGEN_HOME"])
    filler = "the quick brown fox jumps over the lazy dog. " * 1300  # 58,500 characters a turn
    for i in range(20):
        store.record(store.Entry(conversation_id="longone", source="run", model="smollm2:135m", prompt=filler,
                                 response=filler[:200], datetime_utc=f"2026-01-01T00:00:{i:02d}"))
    store.record(store.Entry(conversation_id="longone", source="run", model="smollm2:135m",
                             prompt="The code word is PELICAN.", response="Noted.",
                             datetime_utc="2026-01-01T00:01:00"))
    r = lcli("run", "--cid", "longone", "What is the code word?", *N, "--ctx", "512", "--verbose-prompt")
    assert r.returncode == 0, r.stderr
    assert ("the conversation's first 40 of 42 logged messages are left out to fit the 512-token context window "
            "(the log keeps them; a larger --ctx sends more)") in r.stderr.splitlines(), r.stderr
    assert "PELICAN" in r.stderr and "quick brown fox" not in r.stderr
    assert r.stdout.strip()


def test_logs_reads_its_rows_as_it_writes_them(cli_in_process: InProcessCLI, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`logs -n 0 --json` of a 50,000-row log took 847 MB (every row fetched, then one json.dumps of the list), and
    `logs -n 0 | head -1` read every row before its first line. The rows are read as they are written: a reader
    gone after the first ends the reading there; the JSON array is the bytes json.dumps writes of it whole."""
    from dataclasses import asdict

    from localgen.cli.output import TextWriter
    from localgen.log import store

    home = tmp_path / "home"
    monkeypatch.setenv("LOCALGEN_HOME", str(home))
    for i in range(120):
        store.record(store.Entry(conversation_id=f"c{i % 7}", source="run", model="smollm2:135m",
                                 prompt=f"question {i}\nits second line", response=f"answer {i} — «ok»",
                                 settings={"temperature": 0.5, "stop": ["\n", "x"]},
                                 datetime_utc=f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}"))
    lcli = InProcessCLI({**cli_in_process.env, "LOCALGEN_HOME": str(home)})
    for args, entries in ((("-n", "0"), store.recent(0)), (("-n", "0", "--cid", "c3"), store.recent(0, cid="c3")),
                          (("-n", "5", "--cid", "c3"), store.recent(5, cid="c3")),
                          (("-q", "answer", "-n", "9"), store.recent(9, query="answer")),
                          (("-n", "200"), store.recent(200))):
        r = lcli("logs", "--json", *args)
        assert r.returncode == 0 and r.stdout == json.dumps([asdict(e) for e in entries], ensure_ascii=False,
                                                            indent=1) + "\n", args
    assert [x["prompt"] for x in json.loads(lcli("logs", "-n", "2", "--json").stdout)] == [
        "question 118\nits second line", "question 119\nits second line"]
    read: list[object] = []
    entry = store._entry
    monkeypatch.setattr(store, "_entry", lambda row: read.append(row) or entry(row))
    monkeypatch.setattr(TextWriter, "write", lambda self, text: False)  # the reader gone at the first row
    for args in (("-n", "0"), ("-n", "0", "--json"), ("-n", "100")):
        read.clear()
        r = lcli("logs", *args)
        assert r.returncode == 0 and len(read) <= 2, (args, len(read))


def test_a_continued_conversation_whose_system_prompt_fills_the_window_says_so(lcli: CLI) -> None:
    """`run -C` sends the conversation's system prompt: one that alone takes more than the window was said as "the
    prompt is 317 tokens; the context window is 256", blaming the four words typed. The error says the system
    prompt's share, as chat's does ("this message needs N tokens with the system prompt")."""
    system = "Be brief. " * 100
    assert lcli("run", "--system", system, "hi", *N, "--ctx", "1024").returncode == 0
    r = lcli("run", "-C", "and?", *N, "--ctx", "256")
    told = re.fullmatch(r"localgen: error: this prompt needs ([\d,]+) tokens with the conversation's system prompt "
                        r"\(([\d,]+) of them\); the context window is 256 \(a continued conversation \(--continue, "
                        r"--cid\) is sent with its system prompt: give a shorter one with --system, or raise "
                        r"--ctx\)\n", r.stderr)
    assert r.returncode == 1 and told is not None and r.stdout == "", r.stderr
    need, share = (int(n.replace(",", "")) for n in told.groups())
    assert need > 256 and 256 < share < need, (need, share)
    r = lcli("run", "--system", system, "and?", *N, "--ctx", "256")  # given: "the system prompt" (no turn fits)
    assert r.returncode == 1 and r.stderr.startswith(f"localgen: error: this prompt needs {need:,} tokens with the "
                                                     f"system prompt ({share:,} of them); the context window is 256 "
                                                     "(shorten the system prompt or the prompt"), r.stderr
