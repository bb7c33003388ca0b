"""Every benchmark run kept in a local SQLite file (data dir): list, fetch, compare."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localgen import paths
from localgen.errors import LocalgenError
from localgen.oslimits import limit_cause, sqlite_files

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created REAL NOT NULL,
    command TEXT NOT NULL,
    system TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS results (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
"""


def db_path() -> Path:
    """The history file."""
    return paths.data_dir() / "bench.sqlite"


@contextmanager
def _db() -> Iterator[sqlite3.Connection]:
    """The history, open; any failure of SQLite's (a full disk, a folder that cannot be written, a damaged file)
    is one LocalgenError naming the file and the cause."""
    path = db_path()
    try:
        paths.make_dirs(path.parent)
        with closing(sqlite3.connect(path, timeout=30)) as conn:
            conn.executescript(SCHEMA)
            yield conn
    except (sqlite3.OperationalError, sqlite3.IntegrityError, OSError) as e:  # it cannot be opened or written here
        limit = limit_cause(e, sqlite_files(path))
        if limit:  # the limit says what raises it: no other folder would do better
            raise LocalgenError(f"the benchmark history {path} cannot be used: {limit}") from None
        why = _why(e, path.parent)
        hint = ("free some space" if why.startswith("no space") or "disk is full" in why else
                "another localgen holds it: try again" if "locked" in why else
                "set LOCALGEN_HOME to a data dir that can be written")
        raise LocalgenError(f"the benchmark history {path} cannot be used: {why}", hint=hint) from None
    except sqlite3.DatabaseError as e:  # not SQLite, or damaged
        raise LocalgenError(f"the benchmark history {path} is unreadable: {e}",
                            hint="move it aside to start a new one; it is never overwritten") from None


def _why(e: sqlite3.Error | OSError, folder: Path) -> str:
    """SQLite's words, with the cause said where they hide it (a full disk can read "disk I/O error")."""
    import shutil

    try:
        if shutil.disk_usage(folder).free < 1 << 20:
            return f"no space is left on its disk ({_words(e)})"
    except OSError:
        pass
    return _words(e)


def _words(e: sqlite3.Error | OSError) -> str:
    return e.strerror or str(e) if isinstance(e, OSError) else str(e)


class Recording:
    """A run being measured. It enters the history with its first result, in one transaction, so a run
    stopped before that (Ctrl-C, or killed outright: SIGKILL, SIGTERM) leaves no empty run behind; each later
    result is added as it is measured, so a run stopped after it keeps what it measured. `id` is None until
    the first result is kept."""

    def __init__(self, command: str, system: dict[str, Any]) -> None:
        self.command = command
        self.system = system
        self.id: int | None = None


def start(command: str, system: dict[str, Any]) -> Recording:
    """A run about to be measured (written with its first result). Its row is written now and rolled back, so a
    history that cannot keep it is refused before anything is measured."""
    run = Recording(command, system)
    with _db() as conn:
        try:
            conn.execute("INSERT INTO runs (created, command, system) VALUES (?, ?, ?)",
                         (time.time(), command, json.dumps(system)))
        finally:
            conn.rollback()
    return run


def add(run: Recording, seq: int, record: dict[str, Any]) -> None:
    """Store one result (the first one with its run)."""
    with _db() as conn, conn:
        if run.id is None:
            cur = conn.execute("INSERT INTO runs (created, command, system) VALUES (?, ?, ?)",
                               (time.time(), run.command, json.dumps(run.system)))
            run_id = int(cur.lastrowid or 0)
        else:
            run_id = run.id
        conn.execute("INSERT INTO results (run_id, seq, record) VALUES (?, ?, ?)", (run_id, seq, json.dumps(record)))
    run.id = run_id  # once the transaction is committed: a result that failed to be written numbers nothing


def drop(run: Recording) -> None:
    """Forget a run (one whose results cannot all be kept: nothing to keep), if it entered the history."""
    if run.id is None:
        return
    with _db() as conn, conn:
        conn.execute("DELETE FROM results WHERE run_id = ?", (run.id,))
        conn.execute("DELETE FROM runs WHERE id = ?", (run.id,))


@dataclass(frozen=True)
class Run:
    """A stored run."""

    id: int
    created: float | None  # None: its date no longer reads as one (damaged, edited by hand)
    command: str
    system: dict[str, Any]
    records: list[dict[str, Any]]
    damaged: int = 0  # results kept in the file that no longer read as a record (left out of `records`)
    system_damaged: bool = False  # its machine and build no longer read as such: `system` is empty


@dataclass(frozen=True)
class Listed:
    """A run as `bench history` lists it: its results counted, not read."""

    id: int
    created: float | None  # None: its date no longer reads as one (damaged, edited by hand)
    command: str
    results: int
    partial: int = 0  # of them, rows of a test stopped part-way (fewer repetitions than planned)


# a result that is a row of a test stopped part-way (records.stopped_note), read by SQLite (one not JSON, or damaged:
# not one; CASE tries its branches in order, so json_type never reads a text that is not JSON)
_PARTIAL = ("CASE WHEN typeof(results.record) != 'text' OR NOT json_valid(results.record) THEN 0 "
            "WHEN json_type(results.record, '$.repetitions') = 'integer' "
            "AND json_type(results.record, '$.repetitions_planned') = 'integer' "
            "AND json_extract(results.record, '$.repetitions') < json_extract(results.record, "
            "'$.repetitions_planned') THEN 1 ELSE 0 END")


def runs() -> list[Listed]:
    """Every run that kept a result, most recent first (an empty one, which an earlier localgen left when it was
    killed before its first result, is no result: not listed), with how many of its results are rows of a test
    stopped part-way."""
    with _db() as conn:
        rows = conn.execute(f"SELECT runs.id, runs.created, runs.command, COUNT(results.seq), SUM({_PARTIAL}) "
                            "FROM runs JOIN results ON results.run_id = runs.id GROUP BY runs.id "
                            "ORDER BY runs.id DESC").fetchall()
    return [Listed(int(i), _created(c), str(cmd), int(n), int(p or 0)) for i, c, cmd, n, p in rows]


def _created(value: Any) -> float | None:
    """A run's date in seconds since the epoch, or None where it no longer reads as a date this machine can show
    (damaged or edited by hand: text, a blob, a number past what a calendar holds): that run still lists."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        time.localtime(value)
    except (OverflowError, OSError, ValueError):
        return None
    return float(value)


def get(run_id: int) -> Run:
    """One run, or a clear error."""
    if not 0 < run_id < 2**63:  # past what SQLite stores (an OverflowError), or a number no run gets
        raise LocalgenError(f"no benchmark run {run_id}", hint="localgen bench history lists them")
    with _db() as conn:
        row = conn.execute("SELECT id, created, command, system FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise LocalgenError(f"no benchmark run {run_id}", hint="localgen bench history lists them")
        records, damaged = _records(conn, run_id)
        if not records and not damaged:  # an earlier localgen's run killed before its first result
            raise LocalgenError(f"benchmark run {run_id} kept no result: it was stopped before its first",
                                hint="localgen bench history lists the runs with results")
        system = _system(row[3])
        return Run(row[0], _created(row[1]), row[2], system or {}, records, damaged, system is None)


def _records(conn: sqlite3.Connection, run_id: int) -> tuple[list[dict[str, Any]], int]:
    """A run's records, and how many of its results no longer read as one (a file damaged or edited by hand):
    those are left out, so the rest of the run, and every other run, still reads."""
    rows = conn.execute("SELECT record FROM results WHERE run_id = ? ORDER BY seq", (run_id,)).fetchall()
    found = [_json(r[0]) for r in rows]
    records = [r for r in found if readable(r)]
    return records, len(found) - len(records)


_NUM = "number"  # an int or a float, never a bool
_SCALAR = "scalar"  # what a setting may be: a key compare pairs rows by, and a table cell
_TYPES: dict[Any, tuple[type, ...]] = {str: (str,), int: (int,), bool: (bool,), _NUM: (int, float),
                                       _SCALAR: (str, int, float, bool, type(None))}
# the fields the views read (bench/records.py rows, bench/serving.py table, cli/bench/past.py compare), by kind;
# (T, None): the field may be null
_COMMON = {"model_filename": str, "model_name": str, "test": str}
_SPEED = {"model_type": str, "backends": str, "model_size": int, "model_n_params": int, "avg_ts": _NUM,
          "stddev_ts": _NUM, "load_s": _NUM, "ttft_ms": (_NUM, None), "itl_p50_ms": (_NUM, None),
          "itl_p99_ms": (_NUM, None), "peak_rss_bytes": (int, None), "limit_share": (_NUM, None)}
_SERVING = {"endpoint": str, "n_parallel": int, "request_rate": str, "requests": int, "failed": int, "avg_ts": _NUM,
            "req_per_s": _NUM, **{f"{w}_{p}_ms": (_NUM, None) for w in ("ttft", "itl", "e2e")
                                  for p in ("p50", "p90", "p99") if f"{w}_{p}" != "ttft_p50"},
            "ttft_ms": (_NUM, None)}
_OPTIONAL = {"prompt_counted": (int, None), "gen_counted": (int, None), "n_prompt": int, "n_gen": int,
             "batching": (str, None), "kv_unified": (bool, None), "kld_bound": _NUM, "repetitions": int,
             "repetitions_planned": int,
             **{k: _SCALAR for k in ("n_threads", "n_gpu_layers", "n_batch", "n_ubatch", "flash_attn", "type_k",
                                     "type_v", "n_cpu_moe", "main_gpu", "tensor_buft_overrides")}}


# a ladder row's fields (quant/ladder.py's Row, which cli/ladderview.py builds back from them; bench does not import
# quant): its figures, null where not measured
_QUALITY = {"model": str, "path": str, "type_name": str, "size": int, "bits_per_weight": _NUM, "ppl": _NUM,
           "ppl_err": _NUM, "fits": str, **{k: (_NUM, None) for k in ("pp_ts", "tg_ts", "kld", "kld_err", "kld_p99",
                                                                   "kld_max", "same_top", "rms_dp")}}


def readable(r: Any) -> bool:
    """Whether a stored result still reads as a record the views can show: the fields they read are there, of
    their types (a hand edit, or a damaged file, can leave `{}` or "avg_ts": "fast")."""
    if not isinstance(r, dict):
        return False
    if r.get("test") == "quality":
        want = {**_COMMON, **_QUALITY, "reference": (bool, None)}
    else:
        want = {**_COMMON, **(_SERVING if r.get("client_side") else _SPEED)}
    if any(k not in r for k in _COMMON):  # the others, where there, of their types (an older record may lack some)
        return False
    return all(_typed(r[k], t) for k, t in {**_OPTIONAL, **want}.items() if k in r)


def _typed(v: Any, t: Any) -> bool:
    kinds = t if isinstance(t, tuple) else (t,)
    if v is None:
        return None in kinds or _SCALAR in kinds
    return any(k is not None and isinstance(v, _TYPES[k]) and not (isinstance(v, bool) and k in (int, _NUM))
               for k in kinds)


SYSTEM = {"localgen_version": str, "build_commit": str, "backends": str, "cpu_info": str, "cores": int,
          "gpu_info": str}  # the header's fields (cli/bench/view.py)


def _system(text: Any) -> dict[str, Any] | None:
    """A run's machine and build; None where it no longer reads as one (not an object, or a field of another
    type: its header then shows none). A field missing reads as not known."""
    found = _json(text)
    if not isinstance(found, dict) or not all(_typed(found[k], t) for k, t in SYSTEM.items() if k in found):
        return None
    if not all(_typed(found[k], t) for k, t in (("ram", (int, None)), ("bandwidth", (_NUM, None))) if k in found):
        return None
    return found


def _json(text: Any) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return None


QUALITY = "quality (PPL and KL divergence: bench --quality)"


def measured(run: Run) -> str | None:
    """What a run measured, in words: a quality ladder's figures (bench --quality, quantize --ladder) or speed (t/s:
    llama-bench's tests, or a server's from the client); None for a run without results."""
    if not run.records:
        return None
    if any(r.get("test") == "quality" for r in run.records):
        return QUALITY
    return "speed (t/s)"


KEY_FIELDS = ("model_filename", "test", "n_threads", "n_gpu_layers", "n_batch", "n_ubatch", "flash_attn",
              "type_k", "type_v", "n_cpu_moe", "tensor_buft_overrides", "main_gpu")


def compare(a: Run, b: Run) -> list[tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any] | None]]:
    """Pair results of two runs by model file, test and settings: (key, A's record, B's record). A quality run
    (bench --quality, quantize --ladder) has one row per file, paired by the file alone: its KL divergence and
    PPL do not depend on the threads or batch it was timed with."""
    from localgen.bench.records import DEFAULTS

    quality = measured(a) == measured(b) == QUALITY
    fields = KEY_FIELDS if not quality else KEY_FIELDS[:2]

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(r.get(k, DEFAULTS.get(k)) for k in fields)  # (a run from before a field was kept)

    bmap = {key(r): r for r in b.records}
    out: list[tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any] | None]] = []
    seen = set()
    for r in a.records:
        k = key(r)
        seen.add(k)
        out.append((dict(zip(fields, k, strict=True)), r, bmap.get(k)))
    for r in b.records:
        if key(r) not in seen:
            out.append((dict(zip(fields, key(r), strict=True)), None, r))
    return out
