"""docs/bench.md's history keeps what was measured, and says in one line what it cannot: a history file that
cannot be written (a full disk) or read (damaged) is one error naming it, never a traceback; the rows a sweep
measured before its history failed are still printed; a damaged record leaves the rest of its run, and every
other run, readable. Real SmolLM2 runs with tiny sizes; the failures are SQLite's own (a trigger refusing the
insert as a full disk would, bytes overwritten in the file)."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from pathlib import Path

import pytest

from tests.conftest import CLI, knows_the_bandwidth

TINY = ("-p", "8,16", "-n", "0", "-r", "1", "-t", "1", "--no-e2e")


def _home(cli: CLI, tmp_path: Path) -> tuple[CLI, Path]:
    home = knows_the_bandwidth(tmp_path / "home")
    return CLI({**cli.env, "LOCALGEN_HOME": str(home)}), home / "data" / "bench.sqlite"


def test_a_history_that_fills_up_mid_sweep_still_prints_the_rows_measured(cli: CLI, tmp_path: Path) -> None:
    c, db = _home(cli, tmp_path)
    first = c("bench", "-p", "8", "-n", "0", "-r", "1", "-t", "1", "--no-e2e", "-o", "json")
    assert first.returncode == 0, first.stderr
    with sqlite3.connect(db) as conn:  # the second result of any run cannot be stored, as on a disk that filled
        conn.execute("CREATE TRIGGER full BEFORE INSERT ON results WHEN NEW.seq >= 1 "
                     "BEGIN SELECT RAISE(FAIL, 'database or disk is full'); END")
    r = c("bench", *TINY, "-o", "json")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert [rec["test"] for rec in json.loads(r.stdout)] == ["pp8", "pp16"]  # both measured rows, on stdout
    lines = r.stderr.splitlines()
    assert lines[-2] == "2 results measured; 1 of them kept as run 2: localgen bench history 2"
    assert lines[-1] == (f"localgen: error: the benchmark history {db} cannot be used: database or disk is full "
                         "(free some space)")
    kept = c("bench", "history", "2", "-o", "json")
    assert [rec["test"] for rec in json.loads(kept.stdout)] == ["pp8"]


def test_a_history_that_cannot_keep_the_run_is_refused_before_anything_is_measured(cli: CLI, tmp_path: Path) -> None:
    c, db = _home(cli, tmp_path)
    db.parent.mkdir(parents=True)
    with sqlite3.connect(db) as conn:
        conn.executescript("CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, created REAL NOT NULL, "
                           "command TEXT NOT NULL, system TEXT NOT NULL);"
                           "CREATE TRIGGER full BEFORE INSERT ON runs "
                           "BEGIN SELECT RAISE(FAIL, 'database or disk is full'); END")
    r = c("bench", *TINY)
    assert r.returncode == 1 and r.stdout == "", r.stdout
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"localgen: error: the benchmark history {db} cannot "
                                                             "be used: database or disk is full"), r.stderr


def test_a_damaged_history_file_is_one_line_and_left_as_it_is(cli: CLI, tmp_path: Path) -> None:
    c, db = _home(cli, tmp_path)
    assert c("bench", "-p", "8", "-n", "0", "-r", "1", "-t", "1", "--no-e2e").returncode == 0
    data = bytearray(db.read_bytes())
    data[4096:] = b"\xff" * (len(data) - 4096)  # the tables' pages overwritten, the schema's (the first) kept
    db.write_bytes(bytes(data))
    for args in (("bench", "history"), ("bench", "history", "1"), ("bench", "compare", "1", "1"), ("bench", *TINY)):
        r = c(*args)
        assert r.returncode == 1 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1, (args, r.stderr)
        assert r.stderr.startswith(f"localgen: error: the benchmark history {db} "), r.stderr
    assert db.read_bytes() == bytes(data)


def test_a_damaged_record_leaves_the_rest_readable(cli: CLI, tmp_path: Path) -> None:
    c, db = _home(cli, tmp_path)
    for _ in range(2):
        assert c("bench", *TINY).returncode == 0
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE results SET record = '{\"test\": \"pp8\", ' WHERE run_id = 1 AND seq = 0")
    listed = c("bench", "history", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert [(d["id"], d["results"]) for d in json.loads(listed.stdout)] == [(2, 2), (1, 2)]  # (results stored)
    shown = c("bench", "history", "1", "-o", "json")
    assert shown.returncode == 0 and [rec["test"] for rec in json.loads(shown.stdout)] == ["pp16"]
    assert shown.stderr == ("warning: run 1: 1 result in the history no longer reads as a record (damaged): left "
                            "out\n")
    compared = c("bench", "compare", "1", "2", "--json")
    assert compared.returncode == 0, compared.stderr
    assert [(x["test"], x["a_ts"] is None) for x in json.loads(compared.stdout)["results"]] == [("pp16", False),
                                                                                               ("pp8", True)]
    assert "run 1: 1 result" in compared.stderr


def test_a_damaged_run_date_leaves_every_run_listed(cli: CLI, tmp_path: Path) -> None:
    """A run's date edited into text, a blob or a number past any calendar is shown as ? with a warning (null in
    JSON); that run, and every other, still lists, shows and compares."""
    c, db = _home(cli, tmp_path)
    for _ in range(2):
        assert c("bench", "-p", "8", "-n", "0", "-r", "1", "-t", "1", "--no-e2e").returncode == 0
    for damage in ("'abc'", "1e300", "x'00'", "-1e18"):
        with sqlite3.connect(db) as conn:
            conn.execute(f"UPDATE runs SET created = {damage} WHERE id = 1")
        listed = c("bench", "history")
        assert listed.returncode == 0 and "Traceback" not in listed.stderr, (damage, listed.stderr)
        assert listed.stderr == "warning: run 1: its date in the history no longer reads as one (damaged): shown as ?\n"
        rows = [line.split()[:2] for line in listed.stdout.splitlines()[1:]]
        assert rows[0][0] == "2" and rows[0][1] != "?" and rows[1] == ["1", "?"], listed.stdout
        as_json = c("bench", "history", "-o", "json")
        assert [(d["id"], d["created"] is None) for d in json.loads(as_json.stdout)] == [(2, False), (1, True)]
        for args in (("bench", "history", "1"), ("bench", "compare", "1", "2")):
            r = c(*args)
            assert r.returncode == 0 and "Traceback" not in r.stderr, (damage, args, r.stderr)


def test_a_quality_run_whose_history_fills_up_still_prints_its_rows(cli: CLI, tmp_path: Path,
                                                                     smollm2_path: Path) -> None:
    import shutil

    c, db = _home(cli, tmp_path)
    other = tmp_path / "copy.gguf"  # the same weights under another path: a row of its own, a KLD of 0
    shutil.copyfile(smollm2_path, other)
    db.parent.mkdir(parents=True)
    with sqlite3.connect(db) as conn:
        conn.executescript("CREATE TABLE results (run_id INTEGER NOT NULL, seq INTEGER NOT NULL, record TEXT NOT NULL,"
                           " PRIMARY KEY (run_id, seq));"
                           "CREATE TRIGGER full BEFORE INSERT ON results WHEN NEW.seq >= 1 "
                           "BEGIN SELECT RAISE(FAIL, 'database or disk is full'); END")
    r = c("bench", "-m", str(other), "--quality", "default", "--reference", str(smollm2_path), "-c", "64",
          "--chunks", "2", "-t", "1", "-p", "0", "-n", "0", "-o", "jsonl")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert [row["model"] for row in map(json.loads, r.stdout.splitlines())] == ["SmolLM2-135M-Instruct.Q4_1.gguf",
                                                                                "copy.gguf"]
    lines = r.stderr.splitlines()
    assert lines[-2] == "2 rows measured; 1 of them kept as run 1: localgen bench history 1"
    assert lines[-1].startswith(f"localgen: error: the benchmark history {db} cannot be used: database or disk is "
                                "full")


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_after_a_ladders_first_row_prints_and_keeps_it(cli: CLI, tmp_path: Path, smollm2_path: Path,
                                                              sig: str) -> None:
    """bench.md: Ctrl-C prints the rows measured and keeps them, exit status 130; here once the reference's row
    is in and the next file is being measured. A SIGTERM (`timeout`) does the same, then ends the process by it
    (it printed nothing). Ten windows each: the signal is sent as the copy's measurement starts, seconds before it
    could end."""
    import shutil
    import signal
    import subprocess

    c, _ = _home(cli, tmp_path)
    other = tmp_path / "copy.gguf"
    shutil.copyfile(smollm2_path, other)
    p = c.popen("bench", "-m", str(other), "--quality", "default", "--reference", str(smollm2_path), "-c", "64",
                "--chunks", "10", "-t", "1", "-p", "0", "-n", "0", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stderr is not None and p.stdout is not None
    seen = b""
    while b"measuring copy.gguf" not in seen:
        line = p.stderr.readline()
        assert line, f"it ended before it could be stopped: {seen!r}"
        seen += line
    p.send_signal(getattr(signal, sig))
    rc = p.wait(timeout=120)
    out, err = p.stdout.read().decode(), p.stderr.read().decode()
    assert rc == (130 if sig == "SIGINT" else -signal.SIGTERM), err
    assert [line.split()[0] for line in out.splitlines()[1:-1]] == ["SmolLM2-135M-Instruct.Q4_1.gguf"]
    assert out.splitlines()[-1] == ("only the reference SmolLM2-135M-Instruct.Q4_1.gguf was measured: no quantization "
                                    "to choose from")
    assert err.strip().splitlines()[-1] == "interrupted; the row above was measured and kept (run 1)"
    kept = c("bench", "history", "1", "-o", "json")
    assert [row["model"] for row in json.loads(kept.stdout)["rows"]] == ["SmolLM2-135M-Instruct.Q4_1.gguf"]


def test_what_a_killed_measurement_left_is_removed_by_the_next(cli: CLI, tmp_path: Path, smollm2_path: Path) -> None:
    """perplexity.md: a reference model's logits are kept in a temporary file, removed after; and a --save-logits
    file is written whole or not at all. A process killed mid-way cannot remove them (hundreds of MB each): the
    next measurement removes what a process no longer running left, and leaves a running one's alone."""
    import subprocess

    c, _ = _home(cli, tmp_path)
    gone = int(subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True, check=True).stdout)  # ended
    alive = subprocess.Popen(["sleep", "600"])
    try:
        cache = Path(c.env["LOCALGEN_HOME"]) / "cache" / "perplexity"
        cache.mkdir(parents=True)
        left = [cache / f"reference-model-{gone}.logits", cache / f".reference-ladder-{gone}.logits.{gone}.partial"]
        kept = [cache / f"reference-model-{alive.pid}.logits", cache / "notes.txt"]
        saved = tmp_path / "f.logits"
        left.append(tmp_path / f".f.logits.{gone}.partial")
        for path in left + kept:
            path.write_bytes(b"x" * 1000)
        r = c("perplexity", "-m", str(smollm2_path), "--reference", "smollm2:135m", "-c", "64", "--chunks", "2",
              "-t", "1")
        assert r.returncode == 0, r.stderr
        r = c("perplexity", "-m", str(smollm2_path), "-c", "64", "--chunks", "2", "-t", "1", "--save-logits",
              str(saved))
        assert r.returncode == 0, r.stderr
        assert [p.name for p in left if p.exists()] == [] and all(p.exists() for p in kept)
        assert saved.exists() and sorted(p.name for p in cache.iterdir()) == sorted(p.name for p in kept)
        page = " ".join(Path(__file__).parent.parent.joinpath("docs", "perplexity.md").read_text().split())
        assert "one that a killed process left is removed by the next measurement" in page
        assert "a hidden `.FILE.PID.partial` beside it, removed by the next `--save-logits` to that file" in page
    finally:
        alive.kill()
        alive.wait()


def test_history_lists_every_run(cli: CLI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bench.md: `bench history` lists the runs: every one that kept a result (the 50 newest alone were listed once,
    without a word of the others), each with its results counted."""
    from localgen.bench import history

    c, _ = _home(cli, tmp_path)
    monkeypatch.setenv("LOCALGEN_HOME", c.env["LOCALGEN_HOME"])
    for i in range(60):
        run = history.start(f"localgen bench -p {i}", {"build_commit": "x"})
        for seq in range(i % 3):
            history.add(run, seq, {"test": f"pp{i}", "avg_ts": 1.0})
    for fmt in ("json", "csv"):
        listed = c("bench", "history", "-o", fmt)
        assert listed.returncode == 0, listed.stderr
    docs = json.loads(c("bench", "history", "-o", "json").stdout)
    kept = [i % 3 for i in range(60) if i % 3]  # a run that kept no result is not in the history
    assert [(d["id"], d["results"]) for d in docs] == list(reversed(list(enumerate(kept, 1))))
    assert len(c("bench", "history").stdout.splitlines()) == len(kept) + 1


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_a_bench_killed_before_its_first_result_leaves_no_run(cli: CLI, tmp_path: Path, smollm2_path: Path,
                                                              sig: str) -> None:
    """bench.md: a run enters the history with its first result, so a bench killed outright (no Ctrl-C's
    cleanup) while its model loads or its first test runs leaves no empty run; the runs before it stay whole."""
    import signal
    import subprocess
    import time

    c, _ = _home(cli, tmp_path)
    assert c("bench", "-m", str(smollm2_path), *TINY).returncode == 0
    p = c.popen("bench", "-m", str(smollm2_path), "-p", "0", "-n", "4000", "-r", "1", "-t", "1", "--no-e2e",
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)  # a process of its own
    maps = Path(f"/proc/{p.pid}/maps")
    deadline = time.monotonic() + 120
    while str(smollm2_path.resolve()) not in maps.read_text() and time.monotonic() < deadline:  # it is loading
        assert p.poll() is None, "it ended before it could be killed"
        time.sleep(0.05)
    p.send_signal(getattr(signal, sig))
    assert p.wait(timeout=60) == -getattr(signal, sig), "killed outright, before its first result"
    listed = c("bench", "history", "-o", "json")
    assert [(d["id"], d["results"]) for d in json.loads(listed.stdout)] == [(1, 2)], listed.stdout
    assert [rec["test"] for rec in json.loads(c("bench", "history", "1", "-o", "json").stdout)] == ["pp8", "pp16"]


def test_an_empty_run_an_earlier_localgen_left_is_not_shown_as_a_result(cli: CLI, tmp_path: Path) -> None:
    """A run row with no result (an earlier localgen killed before its first) is not listed, and asking for it
    says it kept none, exit status 1."""
    c, db = _home(cli, tmp_path)
    assert c("bench", *TINY).returncode == 0
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO runs (created, command, system) VALUES (0, 'localgen bench', '{}')")
    listed = c("bench", "history", "-o", "json")
    assert [(d["id"], d["results"]) for d in json.loads(listed.stdout)] == [(1, 2)], listed.stdout
    r = c("bench", "history", "2")
    assert r.returncode == 1 and r.stdout == "", r.stdout
    assert r.stderr == ("localgen: error: benchmark run 2 kept no result: it was stopped before its first (localgen "
                        "bench history lists the runs with results)\n"), r.stderr


def test_a_quality_runs_files_typed_relative_are_kept_by_their_absolute_path(cli: CLI, tmp_path: Path,
                                                                             smollm2_path: Path) -> None:
    """bench.md: each file of a comparison is kept by its absolute path, however it was given; a --reference
    typed relative (`--reference F16.gguf`) was kept as typed, a path that means another file from elsewhere."""
    import shutil

    c, _ = _home(cli, tmp_path)
    folder = tmp_path / "w"
    folder.mkdir()
    shutil.copyfile(smollm2_path, folder / "ref.gguf")
    shutil.copyfile(smollm2_path, folder / "copy.gguf")
    r = c("bench", "-m", "copy.gguf", "--quality", "default", "--reference", "ref.gguf", "-c", "64", "--chunks", "2",
          "-t", "1", "-p", "0", "-n", "0", "-o", "jsonl", cwd=folder)
    assert r.returncode == 0, r.stderr
    kept = c("bench", "history", "1", "-o", "json", cwd=tmp_path)
    assert kept.returncode == 0, kept.stderr
    assert [row["path"] for row in json.loads(kept.stdout)["rows"]] == [str(folder / "ref.gguf"),
                                                                        str(folder / "copy.gguf")], kept.stdout


def test_the_list_of_runs_counts_partial_rows_and_passes_over_damaged_ones(cli: CLI, tmp_path: Path) -> None:
    """`bench history` lists how many of a run's results are rows of a test stopped part-way (`repetitions` below
    `repetitions_planned`), as its rows say it: `2 (1 partial)`, `"partial": 1`. A result that is not JSON, is JSON
    but no object, or holds the counts as text counts as no partial row, and the list still reads."""
    c, db = _home(cli, tmp_path)
    for _ in range(2):
        assert c("bench", *TINY).returncode == 0
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE results SET record = json_set(record, '$.repetitions', 1, '$.repetitions_planned', 5) "
                     "WHERE run_id = 2 AND seq = 1")
        conn.execute("INSERT INTO results (run_id, seq, record) VALUES (1, 2, '{\"repetitions\": 1, '), "
                     "(1, 3, '[1, 2]'), (1, 4, '{\"repetitions\": \"1\", \"repetitions_planned\": \"5\"}'), "
                     "(1, 5, x'00ff')")
    listed = c("bench", "history", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert [(d["id"], d["results"], d["partial"]) for d in json.loads(listed.stdout)] == [(2, 2, 1), (1, 6, 0)]
    table = c("bench", "history").stdout.splitlines()  # the column as wide as its widest cell, right-aligned
    assert [line[24:39] for line in table] == ["      RESULTS  ", "2 (1 partial)  ", "            6  "], table
    assert "| 2 (1 partial) |" in c("bench", "history", "-o", "md").stdout
    rows = csv.DictReader(io.StringIO(c("bench", "history", "-o", "csv").stdout))
    assert [(x["id"], x["results"], x["partial"]) for x in rows] == [("2", "2", "1"), ("1", "6", "0")]
