"""What a preset adds to `run`, `chat` and `serve` beyond sampling defaults and a template (which resolve() already
layers on the model): its context size where --ctx is not given, its load settings where their flags are not
given, its SYSTEM where --system is not given, and its MESSAGE turns before the conversation."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from localgen.types import LoadParams, Message, ModelRef

# a preset's settings whose value may have become an error since it was saved (placement.parse, rpc_servers refuse
# what they once took): the flag that replaces each for one command
REPLACED_BY = {"override_tensor": "-ot", "rpc": "--rpc"}


def load_params(ref: ModelRef, load: LoadParams, given: Callable[[str], bool],
                check_buffers: bool = True) -> LoadParams:
    """`load` with the preset's num_ctx and load settings (n_cpu_moe, override_tensor, num_gpu, ...), each
    unless the user gave its flag (`given`, by the table's names: a flag or its environment variable); -ot's
    buffer types checked against this build's devices (`check_buffers`: `fit` plans for devices described). A
    window of 0 (--ctx 0, num_ctx 0) is the model's trained context from here on. An error names the preset's
    PARAMETER line and the flag that replaces it."""
    from localgen import loadsettings
    from localgen.errors import UsageError

    if ref.context is not None and not given("ctx"):
        load = dataclasses.replace(load, n_ctx=ref.context)
    load = load.for_model(ref.summary.context_length)
    mine = {k: v for k, v in ref.load.items() if not given(k) and not (k == "flash_attn" and given("no_flash_attn"))}
    if not mine:
        return load
    fields = loadsettings.load_fields({k: v for k, v in mine.items() if k not in REPLACED_BY})
    for knob in (k for k in REPLACED_BY if k in mine):
        try:
            fields.update(loadsettings.load_fields({knob: mine[knob]}, {knob: said(ref, knob)}))
        except UsageError as e:
            raise UsageError(e.message, hint=replace_hint(knob)) from None
    params = dataclasses.replace(load, **fields)
    if check_buffers and "override_tensor" in mine and not params.rpc:  # its buffer types name this machine's devices
        from localgen.native import devices

        try:
            devices.check_buffers([b for _, b in params.override_tensor], said(ref, "override_tensor"))
        except UsageError as e:
            raise UsageError(e.message, hint=replace_hint("override_tensor")) from None
    return params


def said(ref: ModelRef, knob: str) -> str:
    """A preset's load setting as its errors name it: `the preset NAME's PARAMETER override_tensor`."""
    from localgen.loadsettings import modelfile_name

    return f"the preset {ref.name}'s PARAMETER {modelfile_name(knob)}"


def replace_hint(knob: str) -> str:
    """What an error about a preset's load setting advises: its flag, which replaces it for this command."""
    return f"give {REPLACED_BY[knob]} to replace it here"


def _ref(backend: Any) -> ModelRef | None:
    model = getattr(getattr(backend, "engine", None), "model", None)  # a remote backend has none
    return model if isinstance(model, ModelRef) else None


def system(backend: Any, given: str | None) -> str | None:
    """--system, else the preset's SYSTEM (`--system ""`: none, the preset's too, as chat takes it)."""
    ref = _ref(backend)
    return given if given is not None or ref is None else ref.system


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
