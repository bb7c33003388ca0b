"""Saved prompt caches: a long shared prefix (system prompt, documents, piped text) is evaluated once
and its KV state kept on disk, keyed by the model file, the KV settings and the exact tokens. Files are
written atomically, evicted least-recently-used past a size cap, and a file that does not load is
removed. Chats keep their conversation's state here too, so --resume does not re-read the history."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from localgen import paths

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


def model_identity(engine: Any) -> str:
    """What a state depends on: the model file (path, size, mtime) and the KV-cache settings."""
    p = Path(engine.model.path).resolve()
    st = p.stat()
    prm = engine.params
    return f"{p}|{st.st_size}|{st.st_mtime_ns}|{prm.cache_type_k}|{prm.cache_type_v}|{prm.flash_attn}"


def key(engine: Any, tokens: list[int]) -> str:
    """SHA-256 of the model identity and the exact tokens."""
    h = hashlib.sha256(model_identity(engine).encode())
    h.update(b"|".join(str(t).encode() for t in tokens))
    return h.hexdigest()


def attach_prefix(engine: Any, prefix: list[int]) -> str:
    """Make the engine hold `prefix`: from a saved state when there is one, else by evaluating it and
    saving the state. Returns "hit", "saved" or "skipped" (prefix too short)."""
    from localgen.engine import state

    if len(prefix) < MIN_PREFIX:
        return "skipped"
    path = cache_root() / f"{key(engine, prefix)}.state"
    if path.exists():
        tokens = state.load(engine, path)
        if tokens == prefix:
            os.utime(path)  # recently used
            return "hit"
        if tokens is not None:  # a key collision or a tampered file: not ours to use
            path.unlink(missing_ok=True)
            engine.llm.n_tokens = 0
    state.fill(engine, prefix)
    state.save(engine, path)
    evict()
    return "saved"


def chat_state_path(name: str) -> Path:
    """The saved KV state of a conversation."""
    return cache_root() / "chats" / f"{name}.state"


def save_chat(engine: Any, name: str) -> None:
    """Keep a conversation's KV state for --resume."""
    from localgen.engine import state

    if engine.llm.n_tokens >= 16:
        state.save(engine, chat_state_path(name))
        evict()


def restore_chat(engine: Any, name: str, conversation_tokens: list[int]) -> int:
    """Load a conversation's state if it is a prefix of the conversation as rendered now; tokens reused."""
    from localgen.engine import state

    path = chat_state_path(name)
    if not path.exists():
        return 0
    tokens = state.load(engine, path)
    if tokens is None:
        return 0
    if tokens != conversation_tokens[: len(tokens)]:
        engine.llm.n_tokens = 0  # history changed since: the state is stale
        path.unlink(missing_ok=True)
        return 0
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
