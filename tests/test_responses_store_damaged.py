"""A damaged Responses store (docs/configuration.md's `responses.db`): a request that would store gets a 500
saying the store is damaged, naming the file but not where the server keeps it (docs/serve.md's rule), the
server's log one line saying what to do, no traceback; `store: false` still answers; GET of a stored response
is the same 500; and once the file is moved aside the next request starts a new store, without a restart."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from tests.test_serve import Server


def test_a_damaged_responses_store_is_one_clear_error_and_store_false_still_works(cli_env: dict[str, str],
                                                                                  tmp_path: Path) -> None:
    home = tmp_path / "home"
    store = home / "data" / "responses" / "responses.db"
    store.parent.mkdir(parents=True)
    store.write_bytes(b"this is not a database at all " * 200)
    s = Server({**cli_env, "LOCALGEN_HOME": str(home)}, "--ctx", "512")
    try:
        ask = {"model": "smollm2:135m", "input": "Hi", "max_output_tokens": 2, "temperature": 0}
        for body in (ask, {**ask, "stream": True}):
            r = httpx.post(f"{s.url}/v1/responses", json=body, timeout=120)
            assert r.status_code == 500, r.text
            message = r.json()["error"]["message"]
            assert "the Responses store responses.db is damaged" in message and "store" in message, message
            assert str(home) not in r.text and "internal error" not in r.text
        got = httpx.get(f"{s.url}/v1/responses/resp_x", timeout=60)
        assert got.status_code == 500 and "is damaged" in got.json()["error"]["message"]
        r = httpx.post(f"{s.url}/v1/responses", json={**ask, "store": False}, timeout=120)
        assert r.status_code == 200 and r.json()["status"] in ("completed", "incomplete"), r.text
        store.rename(store.with_suffix(".damaged"))  # moved aside: the next request makes a new store
        r = httpx.post(f"{s.url}/v1/responses", json=ask, timeout=120)
        assert r.status_code == 200, r.text
        assert httpx.get(f"{s.url}/v1/responses/{r.json()['id']}", timeout=60).status_code == 200
    finally:
        assert s.stop() == 0
    assert s.proc.stderr is not None
    log = s.proc.stderr.read().decode()
    said = [line for line in log.splitlines() if "Responses store" in line]
    assert said and all(line.startswith(f"localgen serve: the Responses store {store} is damaged")
                        for line in said), log
    assert "Traceback" not in log, log


def _events(r: httpx.Response) -> list[dict[str, Any]]:
    """A stream's server-sent events, each as its JSON, checked against its `event:` line."""
    out = []
    for block in r.text.split("\n\n"):
        if block.strip():
            kind, data = block.split("\n", 1)
            out.append(json.loads(data.removeprefix("data: ")))
            assert kind == f"event: {out[-1]['type']}", block
    return out


def test_a_store_that_fails_at_the_save_keeps_the_streamed_answer_and_the_stored_ones(cli_env: dict[str, str],
                                                                                     tmp_path: Path) -> None:
    """The store checked when the request came, failing when the answer is kept: a stream's answer, already
    sent, stays whole, an `error` event says it was not stored and the response ends marked `store: false`; a
    whole answer is the store's 500; the server's log has one line naming the file; the responses stored before
    are still there, and the server still answers."""
    home = tmp_path / "home"
    store = home / "data" / "responses" / "responses.db"
    s = Server({**cli_env, "LOCALGEN_HOME": str(home)}, "--ctx", "512")
    try:
        ask = {"model": "smollm2:135m", "input": "Name a colour.", "max_output_tokens": 4, "temperature": 0}
        kept = httpx.post(f"{s.url}/v1/responses", json=ask, timeout=120).json()
        # from now on the store refuses every write, as a file damaged after a request's check does; reads work
        with sqlite3.connect(store) as db:
            db.execute("CREATE TRIGGER refuse BEFORE INSERT ON responses BEGIN SELECT RAISE(ABORT, 'disk I/O "
                       "failed'); END")
        db.close()
        r = httpx.post(f"{s.url}/v1/responses", json={**ask, "stream": True}, timeout=120)
        assert r.status_code == 200, r.text
        events = _events(r)
        kinds = [e["type"] for e in events]
        assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-2:] == [
            "error", "response.incomplete"], kinds
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        last = events[-1]["response"]
        assert text and last["output"][0]["content"][0]["text"] == text == kept["output"][0]["content"][0]["text"]
        assert last["store"] is False and last["usage"]["output_tokens"] == 4, last
        error = events[-2]
        assert error["code"] == "server_error" and error["message"].startswith(
            "the answer was sent but not stored: the Responses store responses.db is damaged (disk I/O failed)"), error
        assert str(home) not in r.text
        assert httpx.get(f"{s.url}/v1/responses/{last['id']}", timeout=60).status_code == 404
        whole = httpx.post(f"{s.url}/v1/responses", json=ask, timeout=120)
        assert whole.status_code == 500 and "responses.db is damaged" in whole.json()["error"]["message"], whole.text
        got = httpx.get(f"{s.url}/v1/responses/{kept['id']}", timeout=60)  # stored before: still there
        assert got.status_code == 200 and got.json()["output"] == kept["output"], got.text
        r = httpx.post(f"{s.url}/v1/responses", json={**ask, "store": False}, timeout=120)
        assert r.status_code == 200 and r.json()["store"] is False, r.text
    finally:
        assert s.stop() == 0
    assert s.proc.stderr is not None
    log = s.proc.stderr.read().decode()
    said = [line for line in log.splitlines() if "Responses store" in line]
    assert len(said) == 2 and all(line.startswith(f"localgen serve: the Responses store {store} is damaged (disk "
                                                  "I/O failed)") for line in said), log
    assert f"{last['id']} was answered but not stored" in said[0], said
    assert "Traceback" not in log and "Exception" not in log, log


def test_a_store_damaged_between_the_check_and_the_save_ends_the_stream_cleanly_and_is_left_as_it_is(
        tmp_path: Path) -> None:
    """The store's file damaged after the request's check (another process wrote over it): the stream's end is
    its closed items, the `error` event naming the file (not where it is) and the response marked not stored;
    the log one line with the path; the damaged file is left as it was (what it held stays for the user to
    recover), and the next request's check says so."""
    from localgen.backend import Completion
    from localgen.serve.apierror import HTTPError
    from localgen.serve.jobs import Text
    from localgen.serve.responseitems import Encoder
    from localgen.serve.responsestore import ResponseStore
    from localgen.serve.servelog import LOG, ServeLog
    from localgen.tools.stream import Piece
    from localgen.types import GenerationRequest

    path = tmp_path / "responses.db"
    store = ResponseStore(path)
    store.save("resp_before", {"id": "resp_before"}, [{"role": "user", "content": "Hi"}])
    store.check()  # the request's check passes
    damaged = b"written over by something else " * 300
    path.write_bytes(damaged)
    lines: list[str] = []
    asked = [{"role": "user", "content": "Name a colour."}]
    encoder = Encoder({"model": "m", "input": "Name a colour."}, "m", GenerationRequest(messages=tuple(asked)),
                      store, asked)
    token = LOG.set(ServeLog(access=False, write=lines.append))
    try:
        sent = [*encoder.opening(Text("Blue", 5)), *encoder.said([Piece("content", "Blue")]),
                *asyncio.run(encoder.done(Completion(0, "Blue", "stop", 5, 1, 0.1, 0.2, 0), cast(Any, None)))]
    finally:
        LOG.reset(token)
    events = [json.loads(chunk.decode().split("data: ", 1)[1]) for chunk in sent]
    assert [e["type"] for e in events][-5:] == ["response.output_text.done", "response.content_part.done",
                                                "response.output_item.done", "error", "response.completed"]
    assert events[-2]["message"].startswith("the answer was sent but not stored: the Responses store "
                                            "responses.db is damaged (file is not a database)"), events[-2]
    assert str(tmp_path) not in events[-2]["message"]
    last = events[-1]["response"]
    assert last["store"] is False and last["output"][0]["content"][0]["text"] == "Blue" and last["error"] is None
    assert len(lines) == 1 and lines[0].startswith(f"localgen serve: the Responses store {path} is damaged"), lines
    assert path.read_bytes() == damaged
    with pytest.raises(HTTPError, match="is damaged"):
        store.check()
    assert path.read_bytes() == damaged


def test_a_store_whose_folder_cannot_be_made_is_the_stores_error(tmp_path: Path) -> None:
    """An OSError making the store's folder (a file where the folder should be) is the store's 500, not an
    unexpected error."""
    from localgen.serve.apierror import HTTPError
    from localgen.serve.responsestore import ResponseStore

    (tmp_path / "responses").write_text("a file, not a folder")
    store = ResponseStore(tmp_path / "responses" / "responses.db")
    with pytest.raises(HTTPError, match=r"the Responses store .*responses\.db cannot be used") as e:
        store.save("resp_x", {"id": "resp_x"}, [])
    assert e.value.status == 500 and e.value.logged is not None


def test_a_store_sqlite_cannot_open_is_not_called_damaged(tmp_path: Path) -> None:
    """A store SQLite cannot open (a folder it cannot write, the server out of open files: the file itself may be
    fine) says what to check, never to move the file aside, which would hide the stored responses; a damaged one
    still says to move it aside."""
    from localgen.serve.apierror import HTTPError
    from localgen.serve.responsestore import ResponseStore

    folder = tmp_path / "not-a-folder"
    folder.write_text("a file where the store's folder should be\n")  # as root, a read-only folder is no bar
    with pytest.raises(HTTPError) as caught:
        ResponseStore(folder / "responses.db").check()
    assert "cannot be used" in caught.value.message and "ulimit -n" in caught.value.message, caught.value.message
    assert "move it aside" not in caught.value.message
    damaged = ResponseStore(tmp_path / "responses.db")
    (tmp_path / "responses.db").write_bytes(b"this is not a database at all " * 200)
    with pytest.raises(HTTPError) as caught:
        damaged.check()
    assert "is damaged" in caught.value.message and "move it aside" in caught.value.message


def test_stored_responses_are_still_read_where_the_store_cannot_be_written(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """On a read-only or full disk SQLite cannot open the store to write (WAL's file beside it): GET
    /v1/responses/{id} and previous_response_id read it as it is (they were 500s, the responses intact); storing
    is still the 500 that says what to check."""
    import errno

    from localgen import sqlitedb
    from localgen.serve import responsestore
    from localgen.serve.apierror import HTTPError
    from localgen.serve.responsestore import ResponseStore

    path = tmp_path / "responses" / "responses.db"
    ResponseStore(path).save("resp_1", {"id": "resp_1", "output": []}, [{"role": "user", "content": "hi"}], 1)

    def read_only_disk(p: Path) -> Path:
        raise OSError(errno.EROFS, "Read-only file system", str(p))

    monkeypatch.setattr(responsestore.paths, "private_file", read_only_disk)
    store = ResponseStore(path)  # a server started on the read-only disk
    monkeypatch.setattr(sqlitedb, "cannot_write", lambda folder: False)  # not that: the error, as before
    with pytest.raises(HTTPError) as caught:
        store.load("resp_1")
    assert caught.value.status == 500 and "cannot be used" in caught.value.message
    monkeypatch.setattr(sqlitedb, "cannot_write", lambda folder: True)
    got = store.load("resp_1")
    assert got is not None and got.response == {"id": "resp_1", "output": []} and got.inputs == 1
    assert got.conversation == [{"role": "user", "content": "hi"}]
    assert store.load("resp_2") is None
    with pytest.raises(HTTPError) as caught:
        store.save("resp_2", {"id": "resp_2"}, [])
    assert caught.value.status == 500 and "Read-only file system" in caught.value.message


LOCKER = ("import sqlite3, sys, time\n"
          "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
          "db.execute('BEGIN EXCLUSIVE')\n"
          "print('locked', flush=True)\n"
          "sys.stdin.read()\n")


def _locked_by_another_process(path: Path) -> Any:
    """A process that holds the store's write lock until its stdin is closed."""
    import subprocess
    import sys

    locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert locker.stdout is not None and locker.stdout.readline() == "locked\n"
    return locker


def test_a_store_another_process_has_locked_is_waited_for_without_holding_up_this_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While another process holds the store's lock, a save waits for it (and stores, once it is let go) without
    holding this process's lock all along: a read meanwhile is answered while the save still waits (it waited
    behind the save's whole wait, 30 s); past the wait, the save is a 503 naming the other process (it was a 500
    blaming permissions, free space or open files)."""
    import threading

    from localgen.serve import responsestore
    from localgen.serve.apierror import HTTPError
    from localgen.serve.responsestore import ResponseStore

    path = tmp_path / "responses.db"
    store = ResponseStore(path)
    store.save("resp_before", {"id": "resp_before"}, [{"role": "user", "content": "Hi"}])
    monkeypatch.setattr(responsestore, "BUSY_TIMEOUT_S", 120.0)  # a safety net: the lock is let go well before
    locker = _locked_by_another_process(path)
    try:
        saved: list[BaseException | None] = []

        def save() -> None:
            try:
                store.save("resp_after", {"id": "resp_after"}, [{"role": "user", "content": "Hello"}])
                saved.append(None)
            except BaseException as e:
                saved.append(e)

        waited = threading.Event()  # the save has met the other process's lock at least once
        real_locked = responsestore._locked

        def locked(e: Any) -> bool:
            met = real_locked(e)
            if met and threading.current_thread() is saver:
                waited.set()
            return met

        monkeypatch.setattr(responsestore, "_locked", locked)
        saver = threading.Thread(target=save)
        saver.start()
        assert waited.wait(60), "the save is waiting for the other process's lock"
        found: list[Any] = []
        loader = threading.Thread(target=lambda: found.append(store.load("resp_before")), daemon=True)
        loader.start()
        loader.join(30)  # a safety net: the read would otherwise wait behind the save's whole wait (120 s here)
        assert not loader.is_alive(), "the read waited behind the save"
        assert found[0] is not None and found[0].response == {"id": "resp_before"}
        assert saver.is_alive() and not saved, "the read was answered while the save still waited for the lock"
    finally:
        assert locker.stdin is not None
        locker.stdin.close()
        locker.wait(30)
    saver.join(60)
    assert saved == [None] and store.load("resp_after") is not None, saved
    monkeypatch.setattr(responsestore, "BUSY_TIMEOUT_S", 0.3)
    locker = _locked_by_another_process(path)
    try:
        with pytest.raises(HTTPError) as caught:
            store.save("resp_late", {"id": "resp_late"}, [])
    finally:
        assert locker.stdin is not None
        locker.stdin.close()
        locker.wait(30)
    e = caught.value
    assert e.status == 503 and e.kind == "server_error" and e.logged is not None, e.message
    assert "is locked by another process" in e.message and "\"store\": false" in e.message, e.message
    assert "ulimit" not in e.message and "permissions" not in e.message


def test_a_first_read_of_a_store_another_process_is_writing_is_not_held_up(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A server's first GET /v1/responses/{id} or previous_response_id while another process writes the store: WAL
    readers are not blocked, so it is answered (the table's setup took the write lock every time, even for a store
    already up to date: a 503 after the 10 s wait)."""
    from localgen.serve import responsestore
    from localgen.serve.responsestore import ResponseStore

    path = tmp_path / "responses.db"
    ResponseStore(path).save("resp_1", {"id": "resp_1"}, [{"role": "user", "content": "Hi"}])
    monkeypatch.setattr(responsestore, "BUSY_TIMEOUT_S", 1.0)  # the old setup's wait, short
    locker = _locked_by_another_process(path)
    try:
        got = ResponseStore(path).load("resp_1")  # a server started meanwhile
    finally:
        assert locker.stdin is not None
        locker.stdin.close()
        locker.wait()
    assert got is not None and got.response == {"id": "resp_1"}


def test_a_server_whose_store_another_process_has_locked_answers_503(cli_env: dict[str, str], tmp_path: Path) -> None:
    """Over HTTP: a response that would be stored while another process holds the store's lock is a 503 in
    OpenAI's shape saying so; "store": false still answers."""
    home = tmp_path / "home"
    store = home / "data" / "responses" / "responses.db"
    s = Server({**cli_env, "LOCALGEN_HOME": str(home)}, "--ctx", "512")
    ask = {"model": "smollm2:135m", "input": "Hi", "max_output_tokens": 2, "temperature": 0}
    try:
        assert httpx.post(f"{s.url}/v1/responses", json=ask, timeout=120).status_code == 200  # the store is made
        locker = _locked_by_another_process(store)
        try:
            r = httpx.post(f"{s.url}/v1/responses", json=ask, timeout=120)
            unstored = httpx.post(f"{s.url}/v1/responses", json={**ask, "store": False}, timeout=120)
        finally:
            assert locker.stdin is not None
            locker.stdin.close()
            locker.wait(30)
        assert r.status_code == 503 and r.json()["error"]["type"] == "server_error", r.text
        message = r.json()["error"]["message"]
        assert "the Responses store responses.db is locked by another process" in message, message
        assert str(home) not in message
        assert unstored.status_code == 200, unstored.text
    finally:
        assert s.stop() == 0
    assert "Traceback" not in s.log(), s.log()


def test_a_store_removed_while_serving_is_made_again_private(tmp_path: Path) -> None:
    """responses.db (with its -wal and -shm) removed while the server runs: the next save makes it again as at
    first, private (0600) with its table, and answers; it was a 500 "no such table" and a file of mode 0644."""
    from localgen.serve.responsestore import ResponseStore

    path = tmp_path / "responses" / "responses.db"
    store = ResponseStore(path)
    store.save("resp_a", {"id": "resp_a"}, [])
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    store.check()
    store.save("resp_b", {"id": "resp_b"}, [])
    assert path.stat().st_mode & 0o777 == 0o600
    got = store.load("resp_b")
    assert got is not None and got.response == {"id": "resp_b"} and store.load("resp_a") is None


def _save_at_once(barrier: Any, paths: list[str], tag: str, said: Any) -> None:
    """One of several processes (as several `serve` on one data folder): for each store in `paths`, a save at the
    moment the others make theirs; what each save came to goes to `said`."""
    from localgen.serve.apierror import HTTPError
    from localgen.serve.responsestore import ResponseStore

    for path in paths:
        store = ResponseStore(Path(path))
        barrier.wait()
        try:
            store.save(f"resp_{tag}", {"id": f"resp_{tag}"}, [{"role": "user", "content": "Hi"}])
            said.put((path, "ok"))
        except HTTPError as e:
            said.put((path, f"{e.status} {e.message}"))


def test_servers_sharing_a_store_that_save_their_first_response_at_once_both_store_it(tmp_path: Path) -> None:
    """Several processes on one data folder (several `serve`) making the store, or bringing an older one up to date,
    with their first save at the same moment: each stores its response (one got a 500 "duplicate column name:
    inputs" blaming permissions and ulimit), and an older store's row is kept and measured."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    workers, trials = 4, 30
    paths = []
    for i in range(trials):
        path = tmp_path / str(i) / "responses.db"
        path.parent.mkdir()
        if i % 2:  # a store made before input_items, folded inputs and the bound in bytes: its table upgraded
            with sqlite3.connect(path) as db:
                db.execute("CREATE TABLE responses (id TEXT PRIMARY KEY, created REAL NOT NULL, response TEXT NOT "
                           "NULL, conversation TEXT NOT NULL)")
                db.execute("INSERT INTO responses VALUES ('resp_old', 1e12, '{\"id\": \"resp_old\"}', '[]')")
        paths.append(str(path))
    barrier, said = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=_save_at_once, args=(barrier, paths, str(w), said)) for w in range(workers)]
    for p in procs:
        p.start()
    results = [said.get(timeout=600) for _ in range(workers * trials)]  # a safety net, not a timing
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * workers
    failed = [r for r in results if r[1] != "ok"]
    assert not failed, f"{len(failed)} of {len(results)} saves failed, e.g. {failed[0]}"
    from localgen.serve.responsestore import ResponseStore

    for i, path in enumerate(paths):
        store = ResponseStore(Path(path))
        assert all(store.load(f"resp_{w}") is not None for w in range(workers))
        if i % 2:
            old = store.load("resp_old")
            assert old is not None and old.inputs == -1
            with sqlite3.connect(path) as db:
                assert db.execute("SELECT bytes FROM responses WHERE id = 'resp_old'").fetchone()[0] > 0
