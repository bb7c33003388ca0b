"""LoRA adapters: loaded onto a model with llama.cpp's own API and set on every context made on that model
(context.new asks `applied`), so the main context, the batch scheduler's, the embedding context and a context
made again after a release all compute with them. llama.cpp frees the adapters with their model."""

from __future__ import annotations

import ctypes
import os
from typing import Any

from localgen.native.lib import lib

# model pointer's address → (the adapters array, the scales array, how many): kept referenced while set
_ATTACHED: dict[int, tuple[Any, Any, int]] = {}


def load(model: Any, path: str) -> Any:
    """The adapter pointer, or None where llama.cpp refused it (its log says why: not an adapter, another
    architecture, shapes that do not fit the model)."""
    return lib().llama_adapter_lora_init(model, os.fsencode(path)) or None


def attach(model: Any, adapters: list[tuple[Any, float]]) -> None:
    """Have every context made on `model` from now on compute with these (adapter, scale) pairs."""
    lc = lib()
    if not adapters:
        _ATTACHED.pop(_key(model), None)
        return
    ptrs = (lc.llama_adapter_lora_p_ctypes * len(adapters))(*(a for a, _ in adapters))
    scales = (ctypes.c_float * len(adapters))(*(s for _, s in adapters))
    _ATTACHED[_key(model)] = (ptrs, scales, len(adapters))


def detach(model: Any) -> None:
    """Forget the model's adapters (before the model is freed, which frees them)."""
    _ATTACHED.pop(_key(model), None)


def applied(model: Any, ctx: Any) -> bool:
    """Set the model's adapters on a new context; False where llama.cpp refused (True with none to set)."""
    got = _ATTACHED.get(_key(model))
    if got is None:
        return True
    ptrs, scales, n = got
    return int(lib().llama_set_adapters_lora(ctx, ptrs, n, scales)) == 0


def _key(model: Any) -> int:
    value = ctypes.cast(model, ctypes.c_void_p).value
    return int(value or 0)
