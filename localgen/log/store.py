"""The log: every `run` and `chat` exchange in one SQLite database in the data dir (WAL, mode 0600 in a
0700 folder), with full-text search over prompts and answers (FTS5), grouped into conversations that
`run -c` and `chat --resume ID` continue.

The schema and its FTS index with their triggers are made once by sqlite-utils (under a file lock, so
concurrent first runs cannot race). Writing a row, which every one-shot `run` does, is one INSERT through
the standard library's sqlite3: importing sqlite-utils costs far more than writing the row, and a shell
pipeline would pay it on every call (docs/benchmarks.md, The log). Readers (`localgen logs`) query the FTS5
table with each word of -q as a quoted phrase (fts_query); a full-text table that has gone missing is made
again from the rows by the first reader or writer to meet it. Concurrent writers wait for each other (busy
timeout), so no row is lost and nobody is locked out; any failure of the log is a LogError, which callers
turn into a one-line warning: the log never stops an answer. A schema whose making stopped half-way (a full
disk) reads as an empty log and is finished by the next writer; a log that cannot be written (a read-only or
full disk) is still read, opened immutable. A write that finds the log damaged leaves a note in the state
dir (log-damaged, cleared by the next write that succeeds), as readers may still read a damaged log's pages."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from localgen import paths
from localgen.errors import LocalgenError, UsageError

SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 30.0  # how long a writer waits for another one (a pipeline of many runs)
COLUMNS = {
    "id": str, "conversation_id": str, "datetime_utc": str, "source": str, "model": str, "model_spec": str,
    "endpoint": str, "system": str, "prompt": str, "response": str, "settings": str, "finish_reason": str,
    "prompt_tokens": int, "completion_tokens": int, "cached_tokens": int, "ttft_s": float, "total_s": float,
    "decode_tps": float,
}


MOVE_AWAY = "move it away, and the next run starts a new log"


class LogError(LocalgenError):
    """The log cannot be read or written (damaged, read-only, no space)."""


class Damaged(LogError):
    """The log's file is damaged: SQLite's words for it in `said`."""

    def __init__(self, message: str, said: str, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.said = said


class NoConversation(LogError):
    """The log holds no conversation with that id (the log itself is fine)."""


class _Empty(LogError):
    """The log's file is there with nothing in it yet: its first write never finished (a full disk, a run
    stopped at that moment). Readers take it as a log that holds no exchange; the next write makes it."""


@dataclass(frozen=True)
class Entry:
    """One exchange: what was asked, what came back, with which model and settings, how fast."""

    conversation_id: str
    source: str  # "run" or "chat"
    model: str  # the model's name as shown (or the server's model id)
    prompt: str
    response: str
    model_spec: str | None = None  # -m's model, else the default's name (None: remote), to load it again with -c
    endpoint: str | None = None  # the remote endpoint, if any
    system: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    ttft_s: float | None = None
    total_s: float | None = None
    decode_tps: float | None = None
    id: str = ""
    datetime_utc: str = ""


def path() -> Path:
    """Where the log is."""
    return paths.data_dir() / "logs" / "logs.db"


def _off_marker() -> Path:
    return paths.config_dir() / "logs-off"


def enabled() -> bool:
    """Whether exchanges are logged (`localgen logs off` turns it off until `on`). A config folder that cannot be
    entered says nothing either way: logged, as far as the log itself can be written (a warning if not)."""
    try:
        return not _off_marker().exists()
    except OSError:
        return True


def set_enabled(on: bool) -> None:
    """Turn logging on or off for every later run and chat (an OSError naming the marker when it cannot be made or
    removed: logging is then as it was)."""
    marker = _off_marker()
    if on:
        with suppress(NotADirectoryError):  # a file where the config folder goes: no marker, so logging is on
            marker.unlink(missing_ok=True)
    else:
        paths.make_dirs(marker.parent)
        if marker.is_symlink():  # never written through: a link planted there would aim the note at another file
            marker.unlink()
        # its being there turns logging off: an empty file needs no room on a full disk
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            with suppress(OSError):  # a note for whoever finds it; a full disk leaves it empty
                os.write(fd, b"localgen does not log exchanges while this file exists (`localgen logs on`)\n")
        finally:
            os.close(fd)


def new_id() -> str:
    """A unique id that sorts by time: milliseconds, then randomness (20 hex digits)."""
    return f"{int(time.time() * 1000):012x}{os.urandom(4).hex()}"


def _ours(db: Path) -> None:
    """A log is written only where this user owns it and its folder: in one another user made first (a shared
    LOCALGEN_HOME, a folder renamed away and planted), what people type would go where that user reads it. One of
    ours made readable by others (made before this rule, or by hand) is made private again, and so is its folder."""
    if not hasattr(os, "geteuid"):  # Windows: no owners to compare
        return
    me = os.geteuid()
    for where in (db.parent, db):
        st = where.lstat()
        if st.st_uid != me:
            raise LogError(f"the log at {db} is not written: {where} belongs to another user (uid {st.st_uid}); "
                           "set LOCALGEN_HOME to a folder of your own")
    for where, mode in ((db.parent, 0o700), (db, 0o600)):
        if where.stat().st_mode & 0o077:  # (a link's own mode is 0777: what it leads to is what is read)
            with suppress(OSError):  # a disk that keeps no modes (vfat): not ours to change
                os.chmod(where, mode)


@contextmanager
def _connect(create: bool) -> Iterator[sqlite3.Connection]:
    """A connection with the schema in place (made if `create`); LogError for anything that goes wrong."""
    db = path()
    if db.is_dir():  # (SQLite says "unable to open database file")
        raise LogError(f"the log at {db} is a folder, not a file", hint=MOVE_AWAY)
    try:
        if not db.exists():
            if not create:
                raise LogError(f"there is no log yet at {db}")
            paths.private_file(db)  # SQLite gives its -wal and -shm files the same mode
        if create:
            _ours(db)
        conn = sqlite3.connect(db, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    except OSError as e:  # its folder cannot be made, or the file in it (a read-only or full disk)
        raise LogError(f"the log at {db} cannot be opened: {_os_why(e, db.parent)}") from None
    except sqlite3.Error as e:
        raise LogError(f"the log at {db} cannot be opened: {_why(e, db.parent)}") from None
    try:
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.OperationalError:
            from localgen.sqlitedb import cannot_write

            if create or not cannot_write(db.parent):
                raise
            # a log on a read-only disk, or a full one: WAL wants a file beside it to read, which cannot be
            # made there; read as it is (no one can write it either)
            conn.close()
            conn = sqlite3.connect(f"{db.absolute().as_uri()}?mode=ro&immutable=1", uri=True, isolation_level=None)
            version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version < SCHEMA_VERSION:
            if create:
                _make_schema(db)
            elif conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'responses'").fetchone() \
                    is None:
                raise _Empty(f"the log at {db} is empty")
            # else a schema whose making stopped half-way (a full disk): its rows are read as they are
        elif version > SCHEMA_VERSION:
            raise LogError(f"the log at {db} was written by a newer localgen (schema {version})",
                           hint="read it with that version, or " + MOVE_AWAY + "; it was left as it is")
        yield conn
    except (sqlite3.Error, OSError) as e:  # OSError: the lock the schema is made under (a read-only folder)
        from localgen.sqlitedb import damaged as said_damaged

        damaged = said_damaged(str(e))  # (a damaged full-text index too: every insert's trigger fails)
        if damaged and create:
            _mark_damaged(db, str(e))
        said = f"the log at {db} is unusable: {_why(e, db.parent)}"
        if damaged:
            raise Damaged(said, str(e), hint=MOVE_AWAY) from None
        raise LogError(said) from None
    finally:
        conn.close()


def _os_why(e: OSError, folder: Path) -> str:
    """An OSError in words, as _why says SQLite's: the folder (or file) it met and the cause, not Python's
    "[Errno 30] Read-only file system: '...'"."""
    import errno

    # met anywhere (a module's import opens a file too): the limit is the cause, not that file (no import here:
    # one would need a descriptor)
    if e.errno in (errno.EMFILE, errno.ENFILE):
        return "too many open files (raise `ulimit -n`)"
    if e.errno == errno.EFBIG:
        return "the file size limit (`ulimit -f`) is reached"
    met = Path(e.filename) if e.filename else folder  # a file in the log's folder, or a folder on the way to it
    where = met if met.is_relative_to(folder) or folder.is_relative_to(met) else folder
    from localgen.paths import os_cause

    cause = os_cause(e) if e.strerror else "unknown error"
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"its folder cannot be written ({where}: {cause})"
    if e.errno in paths.NO_ROOM:
        return f"no space is left on its disk ({where}: {cause})"
    return f"{where}: {cause}"


def _why(e: sqlite3.Error | OSError, folder: Path) -> str:
    """SQLite's words, with the cause said where its words hide it ("disk I/O error" for a full disk)."""
    import shutil

    if isinstance(e, OSError):  # the lock beside it (a disk with no inode left, a read-only folder)
        return _os_why(e, folder)
    said = str(e)
    if said == "database is locked":
        return f"another process held it for the {BUSY_TIMEOUT_S:g} s a writer waits ({said})"
    if said in ("disk I/O error", "database or disk is full", "unable to open database file",
                "attempt to write a readonly database"):
        try:
            if shutil.disk_usage(folder).free < 1 << 20:
                return f"no space is left on its disk ({said})"
            if not os.access(folder, os.W_OK):
                return f"its folder cannot be written ({said})"
        except OSError:
            pass
    return said


def _make_schema(db: Path) -> None:
    """The table, its FTS5 index and the triggers that keep it current (once, whoever gets there first). Each
    step is skipped when it is done already, so a making that stopped half-way (a disk that filled up) is
    finished by the next writer instead of failing it for good."""
    from filelock import FileLock

    from localgen._compat import sqlite_utils_module

    sqlite_utils = sqlite_utils_module()

    with FileLock(str(db) + ".lock", mode=0o600):  # private as the log (filelock made it 0644, 0666 under umask 0)
        conn = sqlite3.connect(db, timeout=BUSY_TIMEOUT_S)
        try:
            if conn.execute("PRAGMA user_version").fetchone()[0] >= SCHEMA_VERSION:
                return
            conn.execute("PRAGMA journal_mode=WAL")
            s = sqlite_utils.Database(conn)
            table = s.table("responses")
            table.create(COLUMNS, pk="id", not_null={"id", "conversation_id", "datetime_utc", "prompt", "response"},
                         if_not_exists=True)
            table.create_index(["conversation_id", "datetime_utc"], if_not_exists=True)
            table.create_index(["datetime_utc"], if_not_exists=True)
            made = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
            if not {"responses_fts", "responses_ai", "responses_ad", "responses_au"} <= made:  # none, or half
                for suffix in ("ai", "ad", "au"):
                    conn.execute(f"DROP TRIGGER IF EXISTS responses_{suffix}")
                conn.execute("DROP TABLE IF EXISTS responses_fts")
                table.enable_fts(["prompt", "response"], fts_version="FTS5", create_triggers=True)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            conn.commit()
        finally:
            conn.close()


def record(entry: Entry) -> str:
    """Add one exchange; returns its id. LogError if the log cannot take it."""
    row = asdict(entry)
    row["id"] = entry.id or new_id()
    row["datetime_utc"] = entry.datetime_utc or time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    row["settings"] = json.dumps(entry.settings, ensure_ascii=False, default=str)
    names = list(COLUMNS)
    insert = f"INSERT INTO responses ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})"
    for again in (False, True):
        with _connect(create=True) as conn:
            try:
                conn.execute(insert, [row[n] for n in names])
                break
            except sqlite3.OperationalError as e:
                if again or not _fts_missing(conn, e):
                    raise
        _rebuild_fts(path())  # then again on a new connection: this one still holds the old schema
    _marker(path()).unlink(missing_ok=True)  # written again: no longer damaged (moved away, or mended)
    return str(row["id"])


def _marker(db: Path) -> Path:
    """The file in the state dir that says a write found the log damaged (which file, as it was then: _version;
    then SQLite's words): readers can read a damaged log's other pages, so only a writer learns that nothing is
    being logged."""
    return paths.state_dir() / "log-damaged"


def _version(db: Path) -> str:
    """The log file as it is now: its device, inode and change time. A good copy restored over it (`cp` onto the
    same inode, or `rm` and `cp` into a reused one) is another version, not the file the damage was found in."""
    st = os.stat(db)  # (mtime too: Windows' ctime is the creation time, which a copy onto the file keeps)
    return f"{st.st_dev} {st.st_ino} {st.st_ctime_ns} {st.st_mtime_ns}"


def _mark_damaged(db: Path, said: str) -> None:
    import contextlib

    with contextlib.suppress(OSError):  # a read-only or full disk: nothing more to say than the warning
        paths.private_dir(_marker(db).parent)
        _marker(db).write_text(f"{_version(db)}\n{said}\n")


def damage() -> str | None:
    """SQLite's words for the damage the last write met in the log (`database disk image is malformed`), while
    the log is that file as it was then and no write has succeeded since; else None. `logs` and `logs status`
    say it."""
    db = path()
    try:
        version, _, said = _marker(db).read_text()[:1000].partition("\n")
        if version == _version(db):
            return said.strip() or "damaged"
    except (OSError, ValueError):  # (a note that is not text: damaged itself, so no word of the log's damage)
        pass
    return None


def _fts_missing(conn: sqlite3.Connection, e: sqlite3.Error) -> bool:
    """Whether `e` came from the full-text table being gone (dropped by hand, or by a tool that does not know
    FTS5): the rows are intact and the index can be made again from them."""
    if "no such table" not in str(e) or "responses_fts" not in str(e):
        return False
    return conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'responses_fts'").fetchone() is None


def _rebuild_fts(db: Path) -> None:
    """Make the full-text table and its triggers again from the rows (once, whoever gets there first)."""
    from filelock import FileLock

    from localgen._compat import sqlite_utils_module

    sqlite_utils = sqlite_utils_module()
    try:
        with FileLock(str(db) + ".lock", mode=0o600):
            conn = sqlite3.connect(db, timeout=BUSY_TIMEOUT_S)
            try:
                if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'responses_fts'").fetchone() is not None:
                    return
                for suffix in ("ai", "ad", "au"):  # they name the missing table: every insert would fail
                    conn.execute(f"DROP TRIGGER IF EXISTS responses_{suffix}")
                sqlite_utils.Database(conn).table("responses").enable_fts(["prompt", "response"],
                                                                          fts_version="FTS5", create_triggers=True)
                conn.commit()
            finally:
                conn.close()
    except (OSError, sqlite3.Error) as e:
        raise LogError(f"the log at {db} has lost its full-text index, which cannot be made again: {e}") from None


def fts_query(text: str) -> str:
    """Plain words as an FTS5 query that matches them all, whatever they hold: each word a quoted phrase
    (so `AND`, `*`, `"` or `-` are searched for, not parsed); words with no letter or digit are dropped, and a word
    said again once (an ASCII one in any case: the index folds its case), as it matches nothing more: a pasted
    text's 40,000 words took seconds to minutes, a phrase each."""
    words: dict[str, str] = {}
    for w in text.split():
        if any(c.isalnum() for c in w):
            # ASCII only: unicode61 keeps some cases Python folds apart (Georgian, Cherokee capitals)
            words.setdefault(w.lower() if w.isascii() else w, w)
    return " ".join('"' + w.replace('"', '""') + '"' for w in words.values())


def search_words(query: str) -> str:
    """`query` as fts_query makes it, or a usage error when it holds no word (no letter or digit) to search for."""
    match = fts_query(query)
    if not match:
        raise UsageError(f"-q {query!r} has no word to search for", hint="give letters or digits")
    return match


def _entry(row: dict[str, Any]) -> Entry:
    values = {k: row[k] for k in COLUMNS if k in row}
    try:
        values["settings"] = json.loads(values.get("settings") or "{}")
    except ValueError:
        values["settings"] = {}
    for k in ("prompt_tokens", "completion_tokens", "cached_tokens"):
        values[k] = values.get(k) or 0
    for k in ("source", "model", "prompt", "response", "finish_reason"):
        values[k] = values.get(k) or ""
    return Entry(**values)


def conversation(cid: str) -> list[Entry]:
    """A conversation's exchanges, oldest first; LogError when there is none with that id."""
    rows = []
    try:
        with _connect(create=False) as conn:
            conn.row_factory = sqlite3.Row
            rows = conn.execute("SELECT * FROM responses WHERE conversation_id = ? ORDER BY datetime_utc, id",
                                (cid,)).fetchall()
    except _Empty:
        pass
    except LogError:
        if path().exists():
            raise
    if not rows:
        raise NoConversation(f"the log has no conversation {cid!r}", hint="`localgen logs` lists recent ones")
    return [_entry(dict(r)) for r in rows]


def last_conversation() -> str | None:
    """The id of the conversation with the latest exchange, or None when the log is empty."""
    try:
        with _connect(create=False) as conn:
            row = conn.execute("SELECT conversation_id FROM responses ORDER BY datetime_utc DESC, id DESC "
                               "LIMIT 1").fetchone()
    except _Empty:
        return None
    except LogError:
        if not path().exists():
            return None
        raise
    return str(row[0]) if row else None


def models() -> list[str]:
    """Every model name the log's exchanges were made with (as listed, and each -m as given), sorted: for `logs -m`
    that matches none, what it might have meant."""
    try:
        with _connect(create=False) as conn:
            rows = conn.execute("SELECT model FROM responses UNION SELECT model_spec FROM responses").fetchall()
    except _Empty:
        return []
    return sorted(str(r[0]) for r in rows if r[0])


def count() -> int:
    """How many exchanges the log holds."""
    try:
        with _connect(create=False) as conn:
            return int(conn.execute("SELECT count(*) FROM responses").fetchone()[0])
    except _Empty:
        return 0


def recent(n: int = 3, query: str | None = None, model: str | None = None, cid: str | None = None,
           file_name: str | None = None) -> Iterator[Entry]:
    """The latest `n` exchanges (0: all), oldest first; with `query`, the best full-text matches of prompts
    and answers (its words, as plain words: fts_query); filtered by model (or its `file_name`: a run given the
    file's path is logged by it) and conversation. Yielded as they are read, the log held open meanwhile: tens of
    thousands of rows are never in memory at once."""
    where, args = [], []
    if model:  # the model's name as listed, or the -m its run was given (a path, as typed)
        where.append("(r.model = ? OR r.model_spec = ?" + (" OR r.model = ?)" if file_name else ")"))
        args += [model, model, *([file_name] if file_name else [])]
    if cid:
        where.append("r.conversation_id = ?")
        args.append(cid)
    match = search_words(query) if query else ""
    filters = " WHERE " + " AND ".join(where) if where else ""
    try:
        if query:
            yield from _matches(match, f" LIMIT {min(int(n), 2**63 - 1)}" if n else "", filters, args)
        else:
            yield from _latest(n, filters, args)
    except _Empty:
        return


def _latest(n: int, filters: str, args: list[str]) -> Iterator[Entry]:
    """The latest `n` (0: all) in the order they were logged, read as they are written out (all of them are never
    in memory at once): the latest n through the index, newest first, turned round by SQLite (which spills a
    large sort to disk); all of them, oldest first."""
    with _connect(create=False) as conn:
        conn.row_factory = sqlite3.Row
        sql = (f"SELECT * FROM (SELECT r.* FROM responses r{filters} ORDER BY r.datetime_utc DESC, r.id DESC "
               f"LIMIT {min(int(n), 2**63 - 1)}) ORDER BY datetime_utc, id" if n else
               f"SELECT r.* FROM responses r{filters} ORDER BY r.datetime_utc, r.id")
        for row in conn.execute(sql, args):
            yield _entry(dict(row))


def _matches(match: str, limit: str, filters: str, args: list[str]) -> Iterator[Entry]:
    """The best full-text matches, best first (the index made again once where it is missing)."""
    sql = ("SELECT r.* FROM responses r JOIN (SELECT rowid, rank FROM responses_fts WHERE responses_fts MATCH ?) f "
           f"ON f.rowid = r.rowid{filters} ORDER BY f.rank{limit}")
    for again in (False, True):
        with _connect(create=False) as conn:
            conn.row_factory = sqlite3.Row
            try:
                rows = conn.execute(sql, [match, *args])
                first = rows.fetchone()  # a missing index is found here, before anything is yielded
            except sqlite3.OperationalError as e:
                if again or not _fts_missing(conn, e):
                    raise
                rows = None
            if rows is not None:
                if first is not None:
                    yield _entry(dict(first))
                    for row in rows:
                        yield _entry(dict(row))
                return
        _rebuild_fts(path())
