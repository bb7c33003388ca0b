"""Saved prompt caches: a long shared prefix (system prompt, documents, piped text) is evaluated once
and its KV state kept on disk, keyed by the engine's identity (model file, KV and batch settings,
offload, llama.cpp build) and the exact tokens. Files are written atomically, evicted least-recently-used
past a size cap at each use of the cache (so a lowered cap takes effect at the next run, before anything is
loaded; a state larger than the whole cap is not written at all), and each file's name ends with
the SHA-256 of its bytes: a file is hashed before llama.cpp reads it, and one that does not match its name
(or a prompt's state that does not load) is removed, never loaded (llama.cpp itself checks only the header
and the sizes, so flipped KV bytes would load without a word). Chats keep their conversation's state here
too, under the same identity, so --resume does not re-read the history and never continues from another
model's KV (a whole state that does not serve this resume stays for a later one: restore_chat). The
cache is an optimisation only: when it cannot be written, the answer comes all the same."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from localgen import paths
from localgen.errors import UsageError
from localgen.native.prompt import Prompt

if TYPE_CHECKING:
    from localgen.engine.llama import Engine

MIN_PREFIX = 256  # shorter prefixes are quicker to evaluate than to load
DEFAULT_CAP_MB = 4096
CAP_ENV = "LOCALGEN_PROMPT_CACHE_MB"
_SHA = re.compile(r"\.([0-9a-f]{64})\.state$")  # a state's name: its key, then the SHA-256 of its bytes


def cache_root() -> Path:
    """Where prompt states live."""
    return paths.cache_dir() / "prompt-states"


def cap_bytes() -> int:
    """The size cap (LOCALGEN_PROMPT_CACHE_MB, default 4096; 0 turns the cache off); a UsageError for a value that is
    not a whole number of megabytes, 0 or more (run and chat check it before anything loads)."""
    value = os.environ.get(CAP_ENV, "").strip()
    if not value:
        return DEFAULT_CAP_MB << 20
    if not (value.isascii() and value.isdecimal()):
        raise UsageError(f"{CAP_ENV} must be a whole number of megabytes, 0 or more (it is {value!r})",
                         hint=f"unset it for the default, {DEFAULT_CAP_MB}")
    return int(value) << 20


@dataclass(frozen=True)
class Attached:
    """What attach_prefix did: `status` as run --json's prompt_cache says it ("hit", "saved", "skipped",
    "too big", "unwritable"), and `held_before`, how many of the tokens the KV cache now holds were not
    evaluated for it (a saved state's, or those it held already); None where it left the KV cache alone."""

    status: str
    held_before: int | None


def _digest(engine: Engine, tokens: list[int] | None = None) -> str:
    h = hashlib.sha256(engine.identity.encode("utf-8", "surrogateescape"))  # a model path not UTF-8 too
    if tokens is not None:
        h.update(b"|".join(str(t).encode() for t in tokens))
    return h.hexdigest()


def attach_prefix(engine: Engine, prefix: list[int], warn: Callable[[str], None] = lambda s: None,
                  cancelled: Callable[[], bool] = bool) -> Attached:
    """Make the engine hold `prefix`: from a saved state when there is one, else by evaluating it and
    saving the state (when it fits the cap). Stopped by `cancelled` while it is evaluated, it holds what was
    evaluated before and saves nothing ("skipped")."""
    if len(prefix) < MIN_PREFIX:
        return Attached("skipped", None)
    with contextlib.suppress(OSError):  # a cap lowered since the last run: what it no longer holds is not loaded
        evict()
    folder, stem = cache_root(), _digest(engine, prefix)
    for path in _stored(folder, stem):
        if engine.kv.load_state(path) == prefix:
            with contextlib.suppress(OSError):
                os.utime(path)  # recently used
            return Attached("hit", len(prefix))
        with contextlib.suppress(OSError):  # did not load, or a key collision: never ours
            path.unlink(missing_ok=True)
        engine.kv.clear()
    reused = engine.kv.evaluate(Prompt.text(prefix), logits=False, cancelled=cancelled)
    if engine.kv.held != prefix:  # stopped part-way: a part of the prefix is no state to keep
        return Attached("skipped", reused)
    try:
        paths.private_dir(folder)  # a state holds the text of its prompt
        size, cap = engine.kv.state_size(), cap_bytes()
        if size > cap:
            warn(f"this prefix's KV state ({size / (1 << 20):,.1f} MB) is larger than the prompt cache's cap "
                 f"({CAP_ENV}={cap >> 20}): it is not kept")
            return Attached("too big", reused)
        _save(engine, folder, stem)
        evict()
    except OSError as e:
        warn(f"the prompt cache cannot be written ({_reason(e, folder)}); answering without it")
        return Attached("unwritable", reused)
    return Attached("saved", reused)


def _stored(folder: Path, stem: str) -> list[Path]:
    """The states saved under `stem` whose bytes match the SHA-256 their names end with, newest first; the
    others (damaged, or from before names held it: `stem.state`) are removed."""
    found: list[tuple[float, Path]] = []
    for path in folder.glob(f"{stem}.*state") if folder.is_dir() else []:
        rest = path.name[len(stem):]
        if rest != ".state" and not _SHA.fullmatch(rest):
            continue  # another name that begins with this one (a chat named "a.b" beside "a")
        try:
            if rest != ".state" and intact(path):
                found.append((path.stat().st_mtime, path))
                continue
            path.unlink(missing_ok=True)
        except OSError:
            continue  # gone meanwhile
    return [path for _, path in sorted(found, reverse=True)]


def intact(path: Path) -> bool:
    """Whether a state's bytes have the SHA-256 its name ends with (the file is read in full, a small part of a
    hit's time: docs/benchmarks.md, Costs noted in the code)."""
    found = _SHA.search(path.name)
    try:
        with open(path, "rb") as f:
            return found is not None and hashlib.file_digest(f, "sha256").hexdigest() == found.group(1)
    except OSError:
        return False


def _save(engine: Engine, folder: Path, stem: str) -> Path:
    """Write the engine's state as `stem.<its SHA-256>.state`, atomically, and remove other states of `stem`."""
    tmp = folder / f".{stem}.{os.getpid()}.tmp"  # not a *.state: never looked up nor counted
    try:
        engine.kv.save_state(tmp)  # a disk it filled: ENOSPC, looked at before the part written is removed
        with open(tmp, "rb") as f:
            path = folder / f"{stem}.{hashlib.file_digest(f, 'sha256').hexdigest()}.state"
        os.replace(tmp, path)
        paths.fsync_dir(folder)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    for old in folder.glob(f"{stem}.*state"):
        if old != path and (old.name == f"{stem}.state" or _SHA.fullmatch(old.name[len(stem):])):
            with contextlib.suppress(OSError):
                old.unlink()
    return path


def chat_stem(engine: Engine, name: str) -> str:
    """The beginning of a conversation's saved KV state's file name, for this engine's identity."""
    return f"{name}.{_digest(engine)[:16]}"


def chat_states() -> Path:
    """Where conversations' states live."""
    return cache_root() / "chats"


def save_chat(engine: Engine, name: str) -> None:
    """Keep a conversation's KV state for --resume (nothing when the cache is not writable or the state is
    larger than the cap): what was evaluated as its prompt, since the answer generated after it is evaluated
    again as the next prompt's part anyway (engine/tokens.py, reusable_prefix)."""
    engine.kv.truncate(engine.kv.evaluated)
    if len(engine.kv.held) >= 16:
        with contextlib.suppress(OSError):
            if engine.kv.state_size() <= cap_bytes():
                _save(engine, paths.private_dir(chat_states()), chat_stem(engine, name))
                evict()


def restore_chat(engine: Engine, name: str, conversation_tokens: list[int]) -> int:
    """Load a conversation's state if it was saved by this identity, is whole, and is a prefix of the
    conversation as rendered now; returns the tokens reused. A whole state that does not serve now stays (only a
    damaged one goes, in _stored): one longer than this window, or one the conversation as this window renders
    it does not begin with (its oldest turns left out), is what a resume with the window that made it loads,
    and the conversation's next save replaces it anyway."""
    with contextlib.suppress(OSError):  # a cap lowered since the last save: a state past it is not loaded
        evict()
    for path in _stored(chat_states(), chat_stem(engine, name))[:1]:
        tokens = engine.kv.load_state(path)
        if tokens is None or tokens != conversation_tokens[: len(tokens)]:
            engine.kv.clear()  # did not load here, or the conversation is sent otherwise now: not this time
            return 0
        with contextlib.suppress(OSError):
            os.utime(path)
        return len(tokens)
    return 0


def evict() -> None:
    """Remove least-recently-used states until the cache is under its cap (a cap of 0 turns the cache off and
    leaves its states as they are). Another run may evict at the same moment: a file gone meanwhile is simply no
    longer counted (it was an OSError that called the state just saved unwritable)."""
    cap = cap_bytes()
    if cap == 0:
        return
    found: list[tuple[float, int, Path]] = []
    for p in cache_root().rglob("*.state"):
        with contextlib.suppress(OSError):
            st = p.stat()
            if stat.S_ISREG(st.st_mode):
                found.append((st.st_mtime, st.st_size, p))
    total = sum(size for _, size, _ in found)
    for _, size, p in sorted(found):
        if total <= cap:
            break
        total -= size
        with contextlib.suppress(OSError):
            p.unlink(missing_ok=True)


def _reason(e: OSError, path: Path) -> str:
    """Why the cache could not be written, in words: llama.cpp's failed write says no cause, so a disk with no
    room left is said."""
    where = path if e.errno == errno.ENOSPC else e.filename or path  # a full disk: the cache's folder, not a temp
    why = f"{where}: {e.strerror or e}"
    if e.errno in (errno.EEXIST, errno.ENOTDIR):  # mkdir's "File exists" does not say what is in the way
        blocking = paths.in_the_way_of(Path(where))
        if blocking is not None:  # a link to nothing is no file: paths says which it is
            why = paths.in_the_way(blocking) if blocking.is_symlink() else f"{blocking} is a file, where a folder goes"
    if e.errno is None and paths.no_room(path):
        why += "; no space is left on its disk"
    return why
