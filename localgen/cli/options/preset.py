"""What a preset adds to `run`, `chat` and `serve` beyond sampling defaults and a template (which resolve() already
layers on the model): its context size where --ctx is not given, its SYSTEM where --system is not given,
and its MESSAGE turns before the conversation."""

from __future__ import annotations

import dataclasses
from typing import Any

from localgen.types import LoadParams, Message, ModelRef


def load_params(ref: ModelRef, load: LoadParams, ctx_given: bool) -> LoadParams:
    """`load` with the preset's num_ctx unless --ctx was given."""
    if ref.context is None or ctx_given:
        return load
    return dataclasses.replace(load, n_ctx=ref.context)


def _ref(backend: Any) -> ModelRef | None:
    model = getattr(getattr(backend, "engine", None), "model", None)  # a remote backend has none
    return model if isinstance(model, ModelRef) else None


def system(backend: Any, given: str | None) -> str | None:
    """--system, else the preset's SYSTEM."""
    ref = _ref(backend)
    return given if given or ref is None else ref.system


def head(backend: Any, given: str | None, continued: bool = False) -> list[Message]:
    """The turns before the conversation: the system prompt, then the preset's MESSAGE turns (which a
    continued conversation already holds)."""
    ref = _ref(backend)
    text = system(backend, given)
    turns = [] if continued or ref is None else [dict(m) for m in ref.messages]
    return ([{"role": "system", "content": text}] if text else []) + turns


def adopt(session: Any, backend: Any) -> None:
    """A new chat on a preset starts with its SYSTEM (where --system gave none) and its MESSAGE turns."""
    ref = _ref(backend)
    if ref is None or not session.fresh or session.messages:
        return
    if session.system is None:
        session.system = ref.system
    session.messages = [dict(m) for m in ref.messages]
