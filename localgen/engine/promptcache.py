"""Saved prompt caches: a long shared prefix (system prompt, documents, piped text) is evaluated once
and its KV state kept on disk, keyed by the engine's identity (model file, KV and batch settings,
offload, llama.cpp build) and the exact tokens. Files are written atomically, evicted least-recently-used
past a size cap, and a file that does not load is removed. Chats keep their conversation's state here
too, under the same identity, so --resume does not re-read the history and never continues from another
model's KV. The cache is an optimisation only: when it cannot be written, the answer comes all the same."""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from localgen import paths
from localgen.native.prompt import Prompt

if TYPE_CHECKING:
    from localgen.engine.llama import Engine

MIN_PREFIX = 256  # shorter prefixes are quicker to evaluate than to load
DEFAULT_CAP_MB = 4096


def cache_root() -> Path:
    """Where prompt states live."""
    return paths.cache_dir() / "prompt-states"


def cap_bytes() -> int:
    """The size cap (LOCALGEN_PROMPT_CACHE_MB, default 4096)."""
    try:
        return int(os.environ.get("LOCALGEN_PROMPT_CACHE_MB", DEFAULT_CAP_MB)) << 20
    except ValueError:
        return DEFAULT_CAP_MB << 20


def _digest(engine: Engine, tokens: list[int] | None = None) -> str:
    h = hashlib.sha256(engine.identity.encode())
    if tokens is not None:
        h.update(b"|".join(str(t).encode() for t in tokens))
    return h.hexdigest()


def attach_prefix(engine: Engine, prefix: list[int], warn: Callable[[str], None] = lambda s: None) -> str:
    """Make the engine hold `prefix`: from a saved state when there is one, else by evaluating it and
    saving the state. Returns "hit", "saved", "skipped" (prefix too short) or "unwritable"."""
    if len(prefix) < MIN_PREFIX:
        return "skipped"
    path = cache_root() / f"{_digest(engine, prefix)}.state"
    if path.exists():
        tokens = engine.kv.load_state(path)
        if tokens == prefix:
            with contextlib.suppress(OSError):
                os.utime(path)  # recently used
            return "hit"
        with contextlib.suppress(OSError):  # did not load, a key collision, or a tampered file: never ours
            path.unlink(missing_ok=True)
        engine.kv.clear()
    engine.kv.evaluate(Prompt.text(prefix), logits=False)
    try:
        engine.kv.save_state(path)
        evict()
    except OSError as e:
        warn(f"the prompt cache cannot be written ({_reason(e, path)}); answering without it")
        return "unwritable"
    return "saved"


def chat_state_path(engine: Engine, name: str) -> Path:
    """The saved KV state of a conversation, for this engine's identity."""
    return cache_root() / "chats" / f"{name}.{_digest(engine)[:16]}.state"


def save_chat(engine: Engine, name: str) -> None:
    """Keep a conversation's KV state for --resume (nothing when the cache is not writable): what was evaluated
    as its prompt, since the answer generated after it is evaluated again as the next prompt's part anyway
    (engine/tokens.py, reusable_prefix)."""
    engine.kv.truncate(engine.kv.evaluated)
    if len(engine.kv.held) >= 16:
        with contextlib.suppress(OSError):
            engine.kv.save_state(chat_state_path(engine, name))
            evict()


def restore_chat(engine: Engine, name: str, conversation_tokens: list[int]) -> int:
    """Load a conversation's state if it was saved by this identity and is a prefix of the conversation
    as rendered now; returns the tokens reused."""
    path = chat_state_path(engine, name)
    if not path.exists():
        return 0
    tokens = engine.kv.load_state(path)
    if tokens is None:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        return 0
    if tokens != conversation_tokens[: len(tokens)]:
        engine.kv.clear()  # history changed since: the state is stale
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        return 0
    with contextlib.suppress(OSError):
        os.utime(path)
    return len(tokens)


def evict() -> None:
    """Remove least-recently-used states until the cache is under its cap."""
    root = cache_root()
    files = [p for p in root.rglob("*.state") if p.is_file()]
    total = sum(p.stat().st_size for p in files)
    cap = cap_bytes()
    for p in sorted(files, key=lambda p: p.stat().st_mtime):
        if total <= cap:
            break
        total -= p.stat().st_size
        p.unlink(missing_ok=True)


def _reason(e: OSError, path: Path) -> str:
    where = e.filename or path
    return f"{where}: {e.strerror or e}"
