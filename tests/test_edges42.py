"""Issue #42, embeddings, rerank and the log: a rerank query too long for the window is refused (never scores
all alike), collections written by several processes at once lose nothing, a damaged collections database is
one line, and the log's full-text index rebuilds itself and takes any words."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CLI, SAFETY_NET_S


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.tiny_bert import build

    d = tmp_path_factory.mktemp("tiny")
    return {"bert": build(d / "tiny-bert.gguf"), "reranker": build(d / "tiny-bert-reranker.gguf", rank=True)}


@pytest.fixture
def hcli(cli_env: dict[str, str], tmp_path: Path) -> CLI:
    """A CLI with a home of its own (an empty log, no collections)."""
    return CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")})


LONG_QUERY = "the cat sat on the mat " * 120  # 720 words: past the 512-token window
DOCS = ["the cat sat on the mat", "stocks fell in paris", "llamas are native to south america"]


# ---- rerank: the query is never cut away ----

def test_rerank_refuses_a_query_longer_than_the_window(cli: CLI, tiny: dict[str, Path]) -> None:
    for extra in ([], ["--truncate"]):
        r = cli("rerank", "-m", str(tiny["reranker"]), "--ctx", "512", *extra, LONG_QUERY, *DOCS)
        assert r.returncode == 2 and r.stdout == "", (extra, r.stderr)
        assert "the query is" in r.stderr and "window of 512" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    # long documents beside a short query are cut, and still told apart
    long_docs = [d + " " + "word " * 600 for d in DOCS]
    r = cli("rerank", "-m", str(tiny["reranker"]), "--ctx", "512", "--truncate", "cat on a mat", *long_docs)
    assert r.returncode == 0, r.stderr
    scores = [json.loads(line)["score"] for line in r.stdout.splitlines()]
    assert len(scores) == 3 and len(set(scores)) == 3, scores


def test_serve_rerank_answers_400_for_a_query_longer_than_the_window(cli_env: dict[str, str],
                                                                     tiny: dict[str, Path]) -> None:
    import httpx

    from tests.test_serve import Server

    s = Server(cli_env, "-m", str(tiny["reranker"]), "--ctx", "512")
    try:
        url = f"{s.url}/v1/rerank"
        for query in (LONG_QUERY, "x" * 100_000):  # too many tokens; too many characters to be worth tokenizing
            r = httpx.post(url, timeout=60, json={"query": query, "documents": DOCS})
            assert r.status_code == 400, r.text[:300]
            err = r.json()["error"]
            assert err["param"] == "query" and "512" in err["message"], err
        ok = httpx.post(url, timeout=60, json={"query": "cat on a mat", "documents": DOCS})
        assert ok.status_code == 200 and len({x["relevance_score"] for x in ok.json()["results"]}) == 3
    finally:
        assert s.stop() == 0


# ---- collections: many writers at once, a damaged database ----

def _wait_reading_stdin(procs: list[Any], cap: float = 5.0) -> None:
    """Until each process sleeps in a pipe read (its stdin: it reads no other pipe before), as Linux's
    /proc/PID/wchan tells; one second without /proc (the old fixed wait), at most `cap` where wchan is hidden."""
    start = time.monotonic()
    while time.monotonic() < start + cap:
        try:
            if all("pipe_read" in Path(f"/proc/{p.pid}/wchan").read_text() for p in procs):
                return
        except OSError:
            time.sleep(max(0.0, start + 1 - time.monotonic()))
            return
        time.sleep(0.01)


def test_embed_store_from_four_processes_at_once_keeps_every_text(cli_env: dict[str, str], tiny: dict[str, Path],
                                                                   tmp_path: Path) -> None:
    for n in range(6):  # rounds, each on a new database: the race is on its first writes, and one may miss it
        hcli = CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path / f"home{n}")})
        procs = [hcli.popen("embed", "-m", str(tiny["bert"]), "--store", "shared", stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(4)]
        for p, proc in enumerate(procs):  # each reads its texts to the end before anything else: they wait here
            assert proc.stdin is not None
            proc.stdin.write("".join(json.dumps({"id": f"p{p}-{i}", "text": f"the cat {p} sat on mat {i}"}) + "\n"
                                     for i in range(5)))
            proc.stdin.flush()
        _wait_reading_stdin(procs)  # every one started and waiting (a slower start only makes the race less likely)
        for proc in procs:  # then all go at once
            assert proc.stdin is not None
            proc.stdin.close()
        results = []
        for proc in procs:
            assert proc.stderr is not None
            results.append((proc.stderr.read(), proc.wait(timeout=SAFETY_NET_S)))
            proc.stderr.close()
        assert all(rc == 0 and "5 embedded and stored" in err for err, rc in results), results
        db = Path(hcli.env["LOCALGEN_HOME"]) / "data" / "embeddings" / "embeddings.db"
        with closing(sqlite3.connect(db)) as conn:
            assert conn.execute("SELECT count(*) FROM embeddings WHERE collection = 'shared'").fetchone()[0] == 20
            assert conn.execute("SELECT count(*) FROM collections").fetchone()[0] == 1
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    r = hcli("similar", "shared", "the cat 2 sat on mat 3", "-n", "1")
    assert r.returncode == 0 and json.loads(r.stdout)["id"] == "p2-3", r.stderr


def test_four_writers_of_texts_as_arguments_keep_all_twenty(cli_env: dict[str, str], tiny: dict[str, Path],
                                                             tmp_path: Path) -> None:
    """Texts given as arguments carry no id: each gets its content's (docs/embed.md), so four processes storing
    five texts each into one collection at once keep twenty, and a text given again is not stored twice."""
    from localgen.embeddings.store import text_id

    hcli = CLI({**cli_env, "LOCALGEN_HOME": str(tmp_path / "home")})
    texts = [[f"writer {p} wrote note {i}" for i in range(5)] for p in range(4)]
    procs = [hcli.popen("embed", "-m", str(tiny["bert"]), "--store", "notes", *mine, stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for mine in texts]
    results = []
    for proc in procs:
        assert proc.stderr is not None
        results.append((proc.stderr.read(), proc.wait(timeout=SAFETY_NET_S)))
        proc.stderr.close()
    assert all(rc == 0 and "5 embedded and stored, 0 unchanged" in err for err, rc in results), results
    db = Path(hcli.env["LOCALGEN_HOME"]) / "data" / "embeddings" / "embeddings.db"
    with closing(sqlite3.connect(db)) as conn:
        kept = dict(conn.execute("SELECT id, content FROM embeddings WHERE collection = 'notes'").fetchall())
    assert sorted(kept.values()) == sorted(t for mine in texts for t in mine)
    assert kept == {text_id(t): t for mine in texts for t in mine}, "each text under its content's id"
    assert all(i == hashlib.sha256(t.encode()).hexdigest()[:16] for i, t in kept.items()), "as docs/embed.md says"
    again = hcli("embed", "-m", str(tiny["bert"]), "--store", "notes", texts[2][3], "a new note")
    assert again.returncode == 0 and "1 embedded and stored, 1 unchanged" in again.stderr, again.stderr
    r = hcli("similar", "notes", "writer 2 wrote note 3", "-n", "1")
    assert r.returncode == 0 and json.loads(r.stdout)["id"] == text_id(texts[2][3]), r.stderr


def test_a_collection_stored_with_numbered_argument_texts_stays_usable(hcli: CLI, tiny: dict[str, Path]) -> None:
    """A collection made before argument texts got content ids holds them under 1, 2, ...: it is read as it
    is, and giving one of its texts again does not store it a second time."""
    assert hcli("embed", "-m", str(tiny["bert"]), "--store", "old", "the cat sat", "stocks fell").returncode == 0
    db = Path(hcli.env["LOCALGEN_HOME"]) / "data" / "embeddings" / "embeddings.db"
    with closing(sqlite3.connect(db)) as conn, conn:  # as the earlier numbering stored them
        for n, text in enumerate(("the cat sat", "stocks fell"), 1):
            conn.execute("UPDATE embeddings SET id = ? WHERE content = ?", (str(n), text))
    r = hcli("similar", "old", "the cat sat", "-n", "1")
    assert r.returncode == 0 and json.loads(r.stdout)["id"] == "1", r.stderr
    r = hcli("embed", "-m", str(tiny["bert"]), "--store", "old", "the cat sat")
    assert r.returncode == 0 and "0 embedded and stored, 1 unchanged" in r.stderr, r.stderr
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("SELECT count(*) FROM embeddings").fetchone()[0] == 2


def test_similar_on_a_damaged_database_or_a_missing_table_is_one_line(hcli: CLI, tiny: dict[str, Path]) -> None:
    assert hcli("embed", "-m", str(tiny["bert"]), "the cat", "--store", "notes").returncode == 0
    db = Path(hcli.env["LOCALGEN_HOME"]) / "data" / "embeddings" / "embeddings.db"
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("DROP TABLE embeddings")
    r = hcli("similar", "notes", "a cat")
    assert r.returncode == 1 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert str(db) in r.stderr and "no embeddings table" in r.stderr and "move it aside" in r.stderr
    for suffix in ("-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    db.write_bytes(b"not a database at all " * 200)
    for args in (["similar", "notes", "a cat"], ["embed", "-m", str(tiny["bert"]), "x", "--store", "notes"]):
        r = hcli(*args)
        assert r.returncode == 1 and r.stdout == "" and r.stderr.count("\n") == 1, (args, r.stderr)
        assert str(db) in r.stderr and "is unusable" in r.stderr and "Traceback" not in r.stderr


# ---- the log: its full-text index, any words, no match ----

@pytest.fixture
def logged(hcli: CLI) -> Iterator[Path]:
    """A home whose log holds one run."""
    r = hcli("run", "Name a yellow fruit.", "-n", "4", "--temperature", "0")
    assert r.returncode == 0 and "not logged" not in r.stderr, r.stderr
    yield Path(hcli.env["LOCALGEN_HOME"]) / "data" / "logs" / "logs.db"


def _drop_fts(db: Path) -> None:
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("DROP TABLE responses_fts")


def test_a_missing_full_text_table_is_rebuilt_by_logs_and_by_the_next_run(hcli: CLI, logged: Path) -> None:
    _drop_fts(logged)
    r = hcli("logs", "-q", "yellow", "--json")
    assert r.returncode == 0, r.stderr
    assert [x["prompt"] for x in json.loads(r.stdout)] == ["Name a yellow fruit."]
    _drop_fts(logged)
    for prompt in ("Name a green vegetable.", "Name a red berry."):  # the first rebuilds; the next is logged too
        r = hcli("run", prompt, "-n", "4", "--temperature", "0")
        assert r.returncode == 0 and "not logged" not in r.stderr and "unusable" not in r.stderr, r.stderr
    found = json.loads(hcli("logs", "-q", "name", "-n", "0", "--json").stdout)
    assert sorted(x["prompt"] for x in found) == ["Name a green vegetable.", "Name a red berry.",
                                                  "Name a yellow fruit."], "every row is searchable again"


def test_logs_query_takes_any_text_as_plain_words(hcli: CLI, logged: Path) -> None:
    for query in ('"yellow', "yellow*", "(yellow", "yellow:fruit", "yellow-fruit", "fruit. yellow", '"yellow fruit"'):
        r = hcli("logs", "-q", query, "--json")
        assert r.returncode == 0, (query, r.stderr)
        assert [x["prompt"] for x in json.loads(r.stdout)] == ["Name a yellow fruit."], query
    upper, lower = hcli("logs", "-q", "AND", "--json"), hcli("logs", "-q", "and", "--json")
    assert upper.returncode == 0 and upper.stdout == lower.stdout, "AND is the word, not an operator"
    for query in ('"', "*", "- :"):
        r = hcli("logs", "-q", query)
        assert r.returncode == 2 and "no word to search for" in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_logs_query_with_no_match_says_so(hcli: CLI, logged: Path) -> None:
    r = hcli("logs", "-q", "zyzzyva")
    assert r.returncode == 0 and r.stdout == "" and "no logged exchange matches -q 'zyzzyva'" in r.stderr
    r = hcli("logs", "-q", "zyzzyva", "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == [] and "no logged exchange matches" in r.stderr
    r = hcli("logs", "-m", "m" * 20_000)  # a long value is cut, as in every error line (it was echoed whole)
    assert r.returncode == 0 and r.stderr == (f"no logged exchange matches -m '{'m' * 80}…' (the log has no model by "
                                              "that name)\n"), r.stderr[:200]
    # logs.md: an -m the log has no model by says so, with the names it may have meant (as run's unknown model)
    for typed in ("smollm2", "smolm2:135m"):
        r = hcli("logs", "-m", typed)
        assert r.returncode == 0 and r.stderr == (f"no logged exchange matches -m '{typed}' (the log has no model by "
                                                  "that name; did you mean smollm2:135m?)\n"), r.stderr
    r = hcli("logs", "-m", "smollm2:135m", "-q", "zyzzyva")  # a model the log has: only the match is missing
    assert r.stderr == "no logged exchange matches -q 'zyzzyva' and -m 'smollm2:135m'\n", r.stderr


def test_serve_errors_name_the_api_field_not_a_cli_flag() -> None:
    """A request's bad logit_bias item is named as the request spells it (settings are shared with the CLI,
    whose users know the flag by the same words); no `--flag` in what a client reads."""
    from localgen import settings
    from localgen.errors import UsageError

    with pytest.raises(UsageError) as e:
        settings.validate({"logit_bias": ["abc"]})
    assert "logit bias 'abc'" in e.value.message and "--" not in e.value.message
