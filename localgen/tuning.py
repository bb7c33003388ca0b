"""Tuning records and the rule: which load settings are fastest for a model on this machine.

`localgen tune` measures; a record keeps its winner, keyed by the model file's SHA-256, the llama.cpp build
and the device, and a load uses it only when all three match. Where no record matches, `rule()` picks, from
what scripts/bench_defaults.py measured (docs/tune.md; the figures: docs/benchmarks.md, "Defaults and
`localgen tune`"). Stdlib only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localgen import paths

# the load settings a record holds, in the order they are shown
TUNABLE = ("flash_attn", "repack", "n_threads", "n_threads_batch", "n_ubatch")
FORMAT = 1
_MAX_HASHES = 64  # remembered file hashes (path, size, mtime → SHA-256), newest kept


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
        return Record(key=Key(**d["key"]), model=str(d["model"]), size=int(d["size"]), date=str(d["date"]),
                      settings=dict(d["settings"]), depth=int(d["depth"]), exchange_s=float(d["exchange_s"]),
                      table=list(d.get("table", [])), partial=bool(d.get("partial", False)),
                      prompt=int(d.get("prompt", 512)), answer=int(d.get("answer", 256)),
                      busy=str(d["busy"]) if d.get("busy") else None)


def store_path() -> Path:
    """The records' file, in the state directory (records can be lost without harm: `tune` makes them again)."""
    return paths.state_dir() / "tuning.json"


def _read(unreadable: list[int] | None = None) -> dict[str, Any]:
    """The records' file, with only the records this version can read (a hand-edited or damaged one is left out,
    and dropped at the next write); how many were left out is appended to `unreadable`."""
    try:
        doc = json.loads(store_path().read_text())
    except (OSError, ValueError):
        return {"format": FORMAT, "records": [], "hashes": []}
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return {"format": FORMAT, "records": [], "hashes": []}
    given = doc.get("records")
    given = given if isinstance(given, list) else [given] if given is not None else []
    doc["records"] = [d for d in given if _readable(d)]
    if unreadable is not None:
        unreadable.append(len(given) - len(doc["records"]))
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


def _write(doc: dict[str, Any]) -> None:
    path = paths.private_file(store_path())
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)


@contextlib.contextmanager
def _locked() -> Any:
    """The records' file locked for a read-change-write (two tunes at once both keep theirs)."""
    from filelock import FileLock

    path = store_path()
    paths.private_dir(path.parent)
    with FileLock(str(path) + ".lock", timeout=30):
        yield


def records() -> list[Record]:
    """Every record, as stored (ones this version cannot read are skipped: unreadable() counts them)."""
    return [Record.from_json(d) for d in _read()["records"]]


def save(record: Record) -> Record | None:
    """Keep `record`, replacing any of the same key, except that a partial one (an interrupted tune) never
    replaces a whole one: that one stays as it was, and is returned (None: `record` was kept)."""
    key = dataclasses.asdict(record.key)
    with _locked():
        doc = _read()
        if record.partial:
            for d in doc["records"]:
                if d.get("key") == key and not (earlier := Record.from_json(d)).partial:
                    return earlier
        doc["records"] = [d for d in doc["records"] if d.get("key") != key]
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

    with _locked():
        doc = _read()
        before = len(doc["records"])
        doc["records"] = [d for d in doc["records"] if not mine(d)]
        _write(doc)
        return before - len(doc["records"])


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
    with contextlib.suppress(OSError, TimeoutError), _locked():
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
    if key in _read().get("seen", []):
        return False
    with contextlib.suppress(OSError, TimeoutError), _locked():
        doc = _read()
        doc["seen"] = [*doc.get("seen", []), key][-1000:]
        _write(doc)
    return True
