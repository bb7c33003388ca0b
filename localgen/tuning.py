"""Tuning records and the rule: which load settings are fastest for a model on this machine.

`localgen tune` measures; a record keeps its winner, keyed by the model file's SHA-256, the llama.cpp build
and the device, and a load uses it only when all three match. Where no record matches, `rule()` picks, from
what scripts/bench_defaults.py measured (docs/tune.md; the figures: docs/benchmarks.md, "Defaults and
`localgen tune`"). Stdlib and filelock only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localgen import paths, regular
from localgen.errors import LocalgenError

# the load settings a record holds, in the order they are shown
TUNABLE = ("flash_attn", "repack", "n_threads", "n_threads_batch", "n_ubatch")
FORMAT = 1
_MAX_HASHES = 64  # remembered file hashes (path, size, mtime → SHA-256), newest kept
MAX_FILE = 16 << 20  # the most of the records' file read: a record is some 500 bytes


@dataclass(frozen=True)
class Key:
    """What a measurement depends on: the model file, the llama.cpp build, the device, and the load (streams
    decoding together: 1 for run and chat, serve's --parallel N; the tensor placement, as the flags that make it:
    experts in RAM compute on the CPU, and a CPU buffer is never repacked)."""

    sha256: str
    build: str
    device: str
    streams: int = 1
    placement: str = ""  # placement.flags_text: "" none, "--n-cpu-moe 4", "-ot exps=CPU", ...


@dataclass(frozen=True)
class Record:
    """One tune's outcome: the winning settings and what each measured configuration cost."""

    key: Key
    model: str  # the name it was tuned under, for people
    size: int  # the model file's bytes (a cheap first check before hashing)
    date: str  # ISO 8601, UTC
    settings: dict[str, Any]
    depth: int  # the deep measurement's prompt tokens already in the cache
    exchange_s: float  # the winner's objective: one exchange at depth 0 plus one at `depth`
    table: list[dict[str, Any]] = field(default_factory=list)  # every configuration measured, best first
    partial: bool = False  # interrupted: the best of what was measured (the defaults are measured first)
    prompt: int = 512  # the exchange measured: its prompt's tokens and its answer's (tune --prompt, --answer)
    answer: int = 256
    busy: str | None = None  # kept with --even-if-busy: how much other work there was ("62 % of the CPU time")

    @property
    def day(self) -> str:
        return self.date[:10]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> Record:
        """A record as stored; a ValueError (or KeyError, TypeError) for one whose fields have the wrong types or
        values out of range (a hand edit): a setting no load could use is never applied."""
        k = d["key"]
        if not isinstance(k, dict) or set(k) - {f.name for f in dataclasses.fields(Key)}:
            raise ValueError("key")
        key = Key(sha256=_str(k, "sha256"), build=_str(k, "build"), device=_str(k, "device"),
                  streams=_int(k, "streams", 1, 1 << 16, 1), placement=_str(k, "placement", ""))
        settings = d["settings"]
        if not isinstance(settings, dict) or set(settings) != set(TUNABLE):
            raise ValueError("settings")
        for name in ("flash_attn", "repack"):
            if not isinstance(settings[name], bool):
                raise ValueError(name)
        for name in ("n_threads", "n_threads_batch"):
            _int(settings, name, 1, MAX_THREADS)
        _int(settings, "n_ubatch", 1, 1 << 20)
        exchange_s = d["exchange_s"]
        if isinstance(exchange_s, bool) or not isinstance(exchange_s, int | float) or not 0 <= exchange_s < 1e12:
            raise ValueError("exchange_s")
        table, busy = d.get("table", []), d.get("busy")
        if not isinstance(table, list) or not isinstance(d.get("partial", False), bool) or not isinstance(
                busy, str | None):
            raise ValueError("table, partial or busy")
        return Record(key=key, model=_str(d, "model"), size=_int(d, "size", 0, 1 << 62), date=_date(d),
                      settings=dict(settings), depth=_int(d, "depth", 0, 1 << 30), exchange_s=float(exchange_s),
                      table=list(table), partial=bool(d.get("partial", False)),
                      prompt=_int(d, "prompt", 1, 1 << 30, 512), answer=_int(d, "answer", 1, 1 << 30, 256),
                      busy=busy or None)


MAX_THREADS = 1 << 12  # past any machine's cores: a record asking more was edited by hand


def _str(d: dict[str, Any], name: str, default: str | None = None) -> str:
    v = d.get(name, default) if default is not None else d[name]
    if not isinstance(v, str):
        raise ValueError(name)
    return v


def _date(d: dict[str, Any]) -> str:
    """The record's date, an ISO 8601 time (its day is shown: `tuned 2026-11-25`); a hand edit such as "yesterday"
    is a record that cannot be read, as other wrong fields are."""
    import datetime

    v = _str(d, "date")
    try:  # its first ten characters are the day shown: the extended form (2026-11-25T10:00:00Z), in UTC
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}(?:T\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?Z?)?", v):
            raise ValueError(v)
        datetime.datetime.fromisoformat(v.removesuffix("Z"))
    except ValueError:
        raise ValueError("date") from None
    return v


def _int(d: dict[str, Any], name: str, low: int, high: int, default: int | None = None) -> int:
    v = d.get(name, default) if default is not None else d[name]
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise ValueError(name)
    return v


def store_path() -> Path:
    """The records' file, in the state directory (records can be lost without harm: `tune` makes them again)."""
    return paths.state_dir() / "tuning.json"


def _empty() -> dict[str, Any]:
    return {"format": FORMAT, "records": [], "hashes": []}


def _load() -> tuple[dict[str, Any], str | None]:
    """The records' file as stored, and why it cannot be read (None: it can, or there is none): unreadable as a
    whole, it holds no record for a load, and is never overwritten (_writable)."""
    try:
        raw = regular.read_regular(store_path(), MAX_FILE, whole=True, what="the tuning records' file")
    except (FileNotFoundError, NotADirectoryError):  # none, or a file where the state dir goes: none there either
        return _empty(), None
    except OSError as e:
        return _empty(), f"it cannot be opened ({paths.os_cause(e)})"
    except regular.Unreadable as e:  # a FIFO there is never opened
        return _empty(), str(e)
    if not raw.strip():  # made empty by a write that failed (a full disk): nothing was kept in it
        return _empty(), None
    try:
        doc = json.loads(raw)
    except ValueError as e:  # not UTF-8 is a ValueError too
        return _empty(), f"it is not JSON ({getattr(e, 'msg', e)})"
    if not isinstance(doc, dict):
        return _empty(), "it holds no JSON object"
    if doc.get("format") != FORMAT:
        shown = json.dumps(doc.get("format"))[:40]
        return _empty(), f"its format is {shown}, not {FORMAT} (written by another version of localgen?)"
    return doc, None


def _read(unreadable: list[int] | None = None) -> dict[str, Any]:
    """The records' file, every record as it is kept (one this version cannot read, a hand edit, stays there
    until `tune --reset`: records() leaves it out); how many cannot be read is appended to `unreadable`. A file
    unreadable as a whole reads as holding nothing (damage() says why)."""
    doc, _ = _load()
    given = doc.get("records")
    # a lone record for the list (a hand edit) is one; an empty {} or "" (or null) holds none, and counts as none
    doc["records"] = given if isinstance(given, list) else [given] if given else []
    if unreadable is not None:
        unreadable.append(sum(not _readable(d) for d in doc["records"]))
    if not isinstance(doc.get("hashes"), list):
        doc["hashes"] = []
    return doc


def _readable(d: Any) -> bool:
    try:
        Record.from_json(d)
    except (KeyError, TypeError, ValueError, AttributeError):
        return False
    return True


def unreadable() -> int:
    """How many records in the file this version cannot read (wrong types, a hand edit): `tune --show` and
    `--reset` say so; everything else leaves them out."""
    count: list[int] = []
    _read(count)
    return count[0] if count else 0


def damage() -> str | None:
    """Why the records' file cannot be read at all (cut short, not JSON, another version's format), or None."""
    return _load()[1]


def problem() -> str | None:
    """One line on what of the records' file cannot be used (the whole file, or some records), or None."""
    why = damage()
    if why is not None:
        return (f"the tuning records {store_path()} cannot be read: {why}; none is used, and the file is never "
                "overwritten (move it aside to start anew)")
    n = unreadable()
    if n:
        return (f"{n} tuning record{'s' if n != 1 else ''} in {store_path()} cannot be read (wrong fields or "
                f"types): {'it is' if n == 1 else 'they are'} left out")
    return None


class Unreadable(LocalgenError):
    """The records' file cannot be read as a whole: it is kept as it is, never overwritten."""


def _writable() -> None:
    """Raise Unreadable where the records' file cannot be read: writing would lose every record in it."""
    why = damage()
    if why is not None:
        raise Unreadable(f"the tuning records {store_path()} cannot be read: {why}; it is never overwritten",
                         hint="move it aside (the next tune starts a new file), or mend it")


def check_writable() -> None:
    """Before measuring: the records' file can be read, and its folder written with room to spare, so that a
    tune's minutes are not lost at the end (a LocalgenError naming the file)."""
    from localgen.sqlitedb import cannot_write

    _writable()
    path = store_path()
    try:
        paths.private_dir(path.parent)
    except OSError as e:
        raise _cannot_write(e) from None
    if cannot_write(path.parent):
        full = os.access(path.parent, os.W_OK)
        raise LocalgenError(f"the tuning records {path} cannot be written: "
                            + ("no space is left on its disk" if full else "its folder is read-only"),
                            hint=_WHERE_TO if not full else "free some space, or " + _WHERE_TO)


_WHERE_TO = "set LOCALGEN_HOME to a state dir that can be written"


def _cannot_write(e: OSError) -> LocalgenError:
    """Free space is the hint only where space is what is short (not a read-only place, a file in the way)."""
    full = e.errno in paths.NO_ROOM
    return LocalgenError(f"the tuning records {store_path()} cannot be written: {paths.os_cause(e)}",
                         hint="free some space, or " + _WHERE_TO if full else _WHERE_TO)


def _write(doc: dict[str, Any]) -> None:
    """Replace the file with `doc` in one step; a failure (a full disk) leaves the file as it was, no temporary
    behind, and is one LocalgenError naming the file."""
    tmp = store_path().with_name(f".{store_path().name}.{os.getpid()}.tmp")
    try:
        path = paths.private_file(store_path())
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it replaces a private file
        with open(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(doc, indent=1))
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise _cannot_write(e) from None


@contextlib.contextmanager
def _locked() -> Any:
    """The records' file locked for a read-change-write (two tunes at once both keep theirs)."""
    from filelock import FileLock

    path = store_path()
    try:
        paths.private_dir(path.parent)
        lock = FileLock(str(path) + ".lock", timeout=30, mode=0o600)
        lock.acquire()
    except OSError as e:
        raise _cannot_write(e) from None
    try:
        yield
    finally:
        lock.release()


def records() -> list[Record]:
    """Every record, as stored (ones this version cannot read are skipped: unreadable() counts them)."""
    return [Record.from_json(d) for d in _read()["records"] if _readable(d)]


def save(record: Record) -> Record | None:
    """Keep `record`, replacing any of the same key, except that a partial one (an interrupted tune) never
    replaces a whole one: that one stays as it was, and is returned (None: `record` was kept)."""
    key = dataclasses.asdict(record.key)
    with _locked():
        _writable()
        doc = _read()
        if record.partial:
            for d in doc["records"]:
                if _readable(d) and d.get("key") == key and not (earlier := Record.from_json(d)).partial:
                    return earlier
        doc["records"] = [d for d in doc["records"] if not (isinstance(d, dict) and d.get("key") == key)]
        doc["records"].append(record.to_json())
        _write(doc)
    return None


def reset(sha256: str | None = None, model: str | None = None) -> int:
    """Forget every record, or those of one model: of its file (`sha256`) or its name (`model`, the name the
    record was made under: a file that is gone has no hash to match); how many were forgotten, of the records
    `records()` lists (ones this version cannot read are removed too, and not counted: unreadable())."""
    def mine(d: dict[str, Any]) -> bool:
        if sha256 is None and model is None:
            return True
        return (sha256 is not None and d.get("key", {}).get("sha256") == sha256) or (
            model is not None and d.get("model") == model)

    if not os.path.lexists(store_path()):  # nothing to forget: nothing is written (a read-only place failed here)
        return 0
    with _locked():
        _writable()
        doc = _read()
        readable = [d for d in doc["records"] if _readable(d)]  # the others go too, uncounted
        doc["records"] = [d for d in readable if not mine(d)]
        _write(doc)
        return len(readable) - len(doc["records"])


def reset_file(path: str | Path) -> int:
    """Forget the records of one file, by its hash: a file no record's size matches is never hashed (a 20 GB
    model with no record was read whole to forget nothing), as find() has it."""
    size = Path(path).stat().st_size
    # ("" is no record's hash: none is forgotten, and the unreadable records go as reset() has them go)
    return reset(sha256=file_sha256(path) if any(r.size == size for r in records()) else "")


def file_sha256(path: str | Path) -> str:
    """The file's SHA-256, remembered by (path, size, mtime) so that a load pays for it once per file."""
    p = Path(path).resolve()
    st = p.stat()
    stamp = [str(p), st.st_size, st.st_mtime_ns]
    for entry in _read()["hashes"]:
        if isinstance(entry, list) and len(entry) == 4 and entry[:3] == stamp:
            return str(entry[3])
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    digest = h.hexdigest()
    with contextlib.suppress(LocalgenError, TimeoutError), _locked():
        _writable()  # a file that cannot be read is kept as it is: the hash is computed again next time
        doc = _read()
        doc["hashes"] = [e for e in doc["hashes"] if isinstance(e, list) and e[:1] != stamp[:1]]
        doc["hashes"] = [*doc["hashes"], [*stamp, digest]][-_MAX_HASHES:]
        _write(doc)
    return digest


def find(model_path: str | Path, build: str, device: str, streams: int = 1, placement: str = "") -> Record | None:
    """The record for this file, build, device, placement and load, if one was made. A file no record's size
    matches is never hashed. A record for `streams` > 1 falls back to the single-stream one."""
    try:
        size = Path(model_path).stat().st_size
    except OSError:
        return None
    candidates = [r for r in records() if r.size == size and r.key.build == build and r.key.device == device
                  and r.key.placement == placement]
    if not candidates:
        return None
    sha = file_sha256(model_path)
    for want in (streams, 1):
        for r in candidates:
            if r.key.sha256 == sha and r.key.streams == want:
                return r
    return None


# ---- the rule, where nothing was measured ----------------------------------------------------------------


def rule_flash_attn(offload_to: str = "") -> tuple[bool, str]:
    """Flash attention where nothing was measured: on, as llama.cpp's `auto` has it on every device here.

    scripts/bench_defaults.py on 2 cores (this build; medians of fresh runs, one exchange at depth 0 and at
    1,500 tokens): with it on, SmolLM2 and Gemma 3 were as fast as the fastest alternative or faster, and off
    was slower (docs/benchmarks.md, "Defaults and `localgen tune`" has the table)."""
    return True, "rule: on" + (f" (layers offloaded to {offload_to})" if offload_to else "")


def first_sight(model_path: str | Path) -> bool:
    """Whether no load or pull here has seen this model file before; marks it seen (for the one-time tip)."""
    key = str(Path(model_path).resolve())
    seen = _read().get("seen", [])
    if isinstance(seen, list) and key in seen:
        return False
    with contextlib.suppress(LocalgenError, TimeoutError), _locked():
        _writable()
        doc = _read()
        seen = doc.get("seen", [])
        doc["seen"] = [*(seen if isinstance(seen, list) else []), key][-1000:]
        _write(doc)
    return True
