"""Prefixes kept on disk (serve's --cache-disk): the slot states a model's prompt cache holds
(engine/hostcache.py's entries, 64 tokens or more), written when the model unloads, when serve stops cleanly,
and from time to time while it is idle, and read back into its prompt cache when it loads again, in this
process or the next one. A request whose prompt starts with a stored prefix then copies it into its slot
instead of evaluating it.

One file per prefix, named by its tokens' hash, in a folder per model identity (the model file, the settings
that change its KV cache, the slots and window: the caller's `key`). Each file says what it is before its
bytes are used: a magic number and format version, then a JSON header (the identity's hash, the llama.cpp
build, the tokens, the state's size, and a SHA-256 of the tokens, their prompt length and the state), then the
state. A file of another identity or build, a torn
or damaged one, is skipped with one log line and removed, never loaded: a wrong state would give a wrong
answer. The whole store is bounded in bytes (`limit`), least recently used first out (a file's time is set
when it is written or read). Files are written to a temporary name and renamed, mode 0600 in 0700 folders
(a state holds its prompt's text). A link is never followed: a `.prefix` that is a symbolic link (or a
model's folder that is one) is neither read, counted nor removed.

The store is shared by every server of this user, each with its own --cache-disk, so a limit bounds what
this server writes and keeps, never more: it removes files only when it has just written one, least
recently used first until the files it could keep (each within its limit) are within it together, and says
in one line what it dropped. A file larger than its limit neither counts nor goes: a server with a larger
limit wrote it, and this one could not even have kept it. Starting, loading, reading and stopping remove
nothing but damaged files."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAGIC = b"LGPX"
VERSION = 2  # 2: the checksum covers the tokens and prompt length too, not only the state
SUFFIX = ".prefix"
_HEAD = struct.Struct("<4sII")  # magic, format version, header length
MAX_HEADER = 64 << 20  # a header longer than this is damage, not tokens
TOKEN_LIMIT = 1 << 31  # a token id is an int32 of llama.cpp's


@dataclass(frozen=True)
class Stored:
    """A prefix read back: its tokens, the prompt length of the request that left them, the state bytes."""

    tokens: list[int]
    prompt_len: int
    data: Any  # a numpy uint8 array
    size: int


def tokens_name(tokens: list[int]) -> str:
    """A prefix's file name, from its tokens."""
    return hashlib.sha256(struct.pack(f"<{len(tokens)}i", *tokens)).hexdigest()[:32] + SUFFIX


class PrefixStore:
    """The store under `root`, at most `limit` bytes; `build` is the llama.cpp build (native/lib.py's
    build_id) that its states must come from; `say` logs one line (a skipped file)."""

    def __init__(self, root: Path, limit: int, build: str, say: Callable[[str], None] = lambda s: None,
                 dropped: Callable[[str], None] | None = None) -> None:
        self.root = root
        self.limit = limit
        self.build = build
        self.say = say
        self.dropped = dropped or say  # the one line a trim logs: what it removed to keep within the limit
        self._lock = threading.Lock()
        self._lengths: dict[str, dict[str, int]] = {}  # folder → file → its tokens' count (what is on disk)
        self._unusable: set[str] = set()  # folders that could not be made, said once each
        self.written = self.written_bytes = 0  # prefixes and bytes written by this process
        self.read = self.read_bytes = 0  # prefixes and bytes read back
        self.skipped = 0  # files refused (other identity or build, torn, damaged)
        self.evicted = 0  # files removed to keep within the limit
        self._clean_temporaries()

    # ---- writing ----------------------------------------------------------------------------------------

    def has(self, key: str, tokens: list[int]) -> bool:
        """Whether this prefix is stored already (so its state need not be copied out to be written)."""
        return tokens_name(tokens) in self._files(key)

    def write(self, key: str, identity: str, entries: Iterable[tuple[list[int], int, Any, int]]) -> int:
        """Store (tokens, prompt_len, data, size) prefixes not stored yet, dropping stored ones each new one
        extends, then keep within the limit; the bytes written and kept (not those the limit took back at once).
        An OSError (a full disk) ends the writing: the prefixes are only a cache."""
        folder = self._folder(key)
        total = 0
        mine: dict[Path, int] = {}  # what this call wrote, and each file's size
        if folder is None:
            return 0
        for tokens, prompt_len, data, size in entries:
            name = tokens_name(tokens)
            files = self._files(key)
            if name in files:
                try:
                    os.utime(folder / name)  # used again: the last to go
                    continue
                except OSError:  # removed meanwhile (another server's trim): written again
                    with self._lock:
                        files.pop(name, None)
            if 0 < self.limit < size:
                continue
            head = json.dumps({"identity": _digest(identity), "build": self.build, "tokens": tokens,
                               "prompt_len": prompt_len, "size": size,
                               "sha256": _checksum(tokens, prompt_len, memoryview(data)[:size])}).encode()
            try:
                _write_atomic(folder / name, [_HEAD.pack(MAGIC, VERSION, len(head)), head, memoryview(data)[:size]])
            except OSError as e:
                self.say(f"cannot write a prefix to {folder}: {e.strerror or e}; the rest are not kept")
                break
            with self._lock:
                files[name] = len(tokens)
                self.written += 1
                self.written_bytes += size
            total += size
            mine[folder / name] = size
            for other, n in list(files.items()):  # a stored prefix this one extends is of no more use
                if n < len(tokens) and other != name and tokens_name(tokens[:n]) == other:
                    self._remove(folder / other, key)
                    total -= mine.pop(folder / other, 0)  # (one this call wrote is not kept either)
        if total:  # only a server that has just written makes room (the module's docstring says why)
            total -= sum(mine.get(path, 0) for path in self.trim())
        return total

    def trim(self) -> list[Path]:
        """Remove the least recently used files until those this server could keep (each within its limit) are
        within it together; a larger file (another server's, with a larger limit) neither counts nor goes. One
        line says what went; the files removed."""
        if self.limit <= 0:
            return []
        found = [(st.st_mtime_ns, st.st_size, path) for path, st in self._all() if st.st_size <= self.limit]
        total = sum(size for _, size, _ in found)
        gone = freed = 0
        removed: list[Path] = []
        for _, size, path in sorted(found):
            if total <= self.limit:
                break
            self._remove(path, path.parent.name)
            removed.append(path)
            self.evicted += 1
            gone, freed, total = gone + 1, freed + size, total - size
        if gone:
            from localgen.units import format_bytes

            self.dropped(f"dropped {gone} least recently used stored prefix{'es' if gone != 1 else ''} "
                         f"({format_bytes(freed)}) to keep the store within {format_bytes(self.limit)}")
        return removed

    # ---- reading ----------------------------------------------------------------------------------------

    def load(self, key: str, identity: str, room: int | None) -> list[Stored]:
        """The prefixes stored for `key`, most recently used first, while they fit `room` bytes (None: no
        limit); each checked before it is returned, a bad one skipped with one log line and removed. A file whose
        header states more state than the room left is passed over unread, and nothing more is read once the room
        is used up."""
        import numpy

        folder = self._folder(key)
        if folder is None:
            return []
        paths = [(st.st_mtime_ns, path) for path, st in _regular(folder)]
        out: list[Stored] = []
        for _, path in sorted(paths, reverse=True):
            if room is not None and room <= 0:
                break
            try:
                stored = self._check(path, identity, numpy, room)
            except _Bad as e:
                self.say(f"skipped a stored prefix ({path.name}): {e}")
                with self._lock:
                    self.skipped += 1
                self._remove(path, key)
                continue
            except OSError:
                continue  # gone meanwhile (another server's trim)
            if stored is None:  # more than the room left: the next may fit
                continue
            out.append(stored)
            room = None if room is None else room - stored.size
            with contextlib.suppress(OSError):
                os.utime(path)
            files = self._files(key)
            with self._lock:
                self.read += 1
                self.read_bytes += stored.size
                files[path.name] = len(stored.tokens)
        return out

    def _check(self, path: Path, identity: str, numpy: Any, room: int | None = None) -> Stored | None:
        """The prefix in `path`, once everything about it holds; _Bad says what does not. None, its state not
        read, when its header states more than `room` bytes (None: no limit)."""
        with _open(path) as f:
            fixed = f.read(_HEAD.size)
            if len(fixed) < _HEAD.size:
                raise _Bad("the file is torn (shorter than its header)")
            magic, version, n = _HEAD.unpack(fixed)
            if magic != MAGIC or version != VERSION:
                raise _Bad("not a prefix file of this localgen version")
            if n > MAX_HEADER:
                raise _Bad("its header is damaged")
            raw = f.read(n)
            if len(raw) < n:
                raise _Bad("the file is torn (its header is cut short)")
            try:
                head = json.loads(raw)
                tokens, prompt_len, size, digest = head["tokens"], head["prompt_len"], head["size"], head["sha256"]
                if not (isinstance(tokens, list) and all(type(t) is int and -TOKEN_LIMIT <= t < TOKEN_LIMIT
                                                         for t in tokens) and type(size) is int
                        and type(prompt_len) is int and 0 <= prompt_len <= len(tokens)):
                    raise ValueError  # (a token past int32 would not even pack into the checksum)
            except (ValueError, KeyError, TypeError, RecursionError):  # (RecursionError: nested past JSON's reader)
                raise _Bad("its header is damaged") from None
            if head.get("identity") != _digest(identity):
                raise _Bad("it was made by another model or other settings")
            if head.get("build") != self.build:
                raise _Bad("it was made by another llama.cpp build")
            if room is not None and size > room:  # torn or not is told by the file's length, reading no state
                held = os.fstat(f.fileno()).st_size - _HEAD.size - n
                if held != size:
                    raise _Bad(f"the file is torn ({held:,} of its {size:,} state bytes)")
                return None
            data = numpy.fromfile(f, dtype=numpy.uint8)
        if data.size != size:
            raise _Bad(f"the file is torn ({data.size:,} of its {size:,} state bytes)")
        if _checksum(tokens, prompt_len, memoryview(data)) != digest:
            raise _Bad("its tokens or state do not match its checksum")
        return Stored(tokens, prompt_len, data, size)

    # ---- what is there ----------------------------------------------------------------------------------

    def status(self) -> dict[str, int]:
        """Counters for /health and /metrics: files and bytes on disk now, the limit, and what this process
        wrote, read back, skipped and removed to keep within the limit."""
        found = [st.st_size for _, st in self._all()]
        files, size = len(found), sum(found)
        return {"files": files, "bytes": size, "limit_bytes": self.limit, "written": self.written,
                "written_bytes": self.written_bytes, "read": self.read, "read_bytes": self.read_bytes,
                "skipped": self.skipped, "evicted": self.evicted}

    def _folder(self, key: str) -> Path | None:
        """A model's folder, made if missing; None (and one line) when it is a link: never followed, or when it
        cannot be made (a file in its place, no permission, a full or read-only disk): the prefixes are only a
        cache, so that is said once and the model is served without them (it was an internal error with a
        traceback at each load, stop and idle write)."""
        from localgen import paths

        folder = self.root / key
        if folder.is_symlink():
            self.say(f"skipped the stored prefixes of {key}: its folder is a link, which is never followed")
            return None
        try:
            return paths.private_dir(folder)
        except OSError as e:
            with self._lock:
                told, self._unusable = key in self._unusable, self._unusable | {key}
            if not told:
                self.say(f"cannot use {folder} for stored prefixes ({e.strerror or e}); this model's are not kept")
            return None

    def _files(self, key: str) -> dict[str, int]:
        """The files of a folder and their tokens' counts (their headers read once per process)."""
        with self._lock:
            known = self._lengths.get(key)
        if known is not None:
            return known
        found: dict[str, int] = {}
        for path, _ in [] if (self.root / key).is_symlink() else _regular(self.root / key):
            n = _token_count(path)
            if n is not None:
                found[path.name] = n
        with self._lock:
            return self._lengths.setdefault(key, found)

    def _all(self) -> list[tuple[Path, os.stat_result]]:
        """Every prefix file of every model's folder, with its stat (links, and folders that are links, left
        out)."""
        try:
            folders = [d for d in self.root.iterdir() if stat.S_ISDIR(d.lstat().st_mode)]
        except OSError:
            return []
        return [found for d in folders for found in _regular(d)]

    def _remove(self, path: Path, key: str) -> None:
        with contextlib.suppress(OSError):
            path.unlink()
        with self._lock:
            self._lengths.get(key, {}).pop(path.name, None)

    def _clean_temporaries(self) -> None:
        """Temporary files an earlier process left when it was killed mid-write."""
        now = time.time()
        for path in self.root.glob("*/.*.tmp"):
            with contextlib.suppress(OSError):
                if now - path.stat().st_mtime > 3600:
                    path.unlink()


class _Bad(Exception):
    """A stored prefix that must not be used, and why."""


def _checksum(tokens: list[int], prompt_len: int, state: Any) -> str:
    """What a file's header says of its contents: a SHA-256 of its tokens, their prompt length and its state (a
    damaged token would otherwise hand a request another prompt's state)."""
    h = hashlib.sha256(struct.pack(f"<{len(tokens) + 1}q", len(tokens), *tokens))
    h.update(struct.pack("<q", prompt_len))
    h.update(state)
    return h.hexdigest()


def _digest(identity: str) -> str:
    return hashlib.sha256(identity.encode("utf-8", "surrogateescape")).hexdigest()  # a path not UTF-8 too


def _regular(folder: Path) -> list[tuple[Path, os.stat_result]]:
    """The prefix files in a folder that are plain files (never a link), with their stat."""
    out = []
    for path in folder.glob(f"*{SUFFIX}"):
        with contextlib.suppress(OSError):
            st = path.lstat()
            if stat.S_ISREG(st.st_mode):
                out.append((path, st))
    return out


def _open(path: Path) -> Any:
    """A prefix file opened to read, never through a link (a link put there meanwhile is an OSError)."""
    return os.fdopen(os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)), "rb")


def _token_count(path: Path) -> int | None:
    """How many tokens a file's header says it holds (None: not readable as one)."""
    try:
        with _open(path) as f:
            magic, version, n = _HEAD.unpack(f.read(_HEAD.size))
            if magic != MAGIC or version != VERSION or n > MAX_HEADER:
                return None
            tokens = json.loads(f.read(n))["tokens"]
        return len(tokens) if isinstance(tokens, list) else None
    except (OSError, ValueError, KeyError, TypeError, struct.error, RecursionError):
        return None


def _write_atomic(path: Path, parts: list[Any]) -> None:
    """Write `parts` to a temporary file beside `path` (0600), then rename it into place."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_BINARY", 0), 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            for part in parts:
                f.write(part)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
