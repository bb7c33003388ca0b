"""Saving and restoring a context's KV state with the tokens it holds (llama_state_save_file/load_file).
A file that does not load (corrupt, truncated, from another model or settings) is removed, never used."""

from __future__ import annotations

import contextlib
import ctypes
import os
from pathlib import Path
from typing import Any


def held_tokens(engine: Any) -> list[int]:
    """Tokens whose KV entries the context holds now."""
    return [int(t) for t in engine.llm._input_ids]


def fill(engine: Any, tokens: list[int]) -> None:
    """Make the context hold exactly `tokens` (evaluating only what it does not hold yet)."""
    llm = engine.llm
    from localgen.engine.llama import common_prefix

    keep = common_prefix(llm._input_ids, tokens)
    llm.n_tokens = keep
    llm.eval(tokens[keep:])  # eval first drops KV entries past n_tokens


def save(engine: Any, path: Path) -> int:
    """Write the context's state and its tokens atomically; returns the file size."""
    lc = engine._lc
    tokens = held_tokens(engine)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    arr = (lc.llama_token * len(tokens))(*tokens)
    try:
        if not lc.llama_state_save_file(engine.llm.ctx, str(tmp).encode(), arr, len(tokens)):
            raise OSError(f"llama.cpp could not write {tmp}")
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return path.stat().st_size


def load(engine: Any, path: Path) -> list[int] | None:
    """Restore a saved state; returns its tokens, or None (and removes the file) if it cannot be used."""
    lc = engine._lc
    llm = engine.llm
    cap = engine.n_ctx
    out = (lc.llama_token * cap)()
    count = ctypes.c_size_t(0)
    ok = False
    try:
        ok = bool(lc.llama_state_load_file(llm.ctx, str(path).encode(), out, cap, ctypes.byref(count)))
    except OSError:
        ok = False
    n = int(count.value)
    if not ok or n == 0 or n > cap:
        with contextlib.suppress(OSError):
            path.unlink()
        lc.llama_memory_clear(lc.llama_get_memory(llm.ctx), True)
        llm.n_tokens = 0
        return None
    tokens = list(out[:n])
    llm.input_ids[:n] = tokens
    llm.n_tokens = n
    llm._requires_eval = True  # the logits are not live: generate() re-evaluates the last token
    return tokens
