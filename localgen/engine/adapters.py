"""LoRA adapters over a model: a preset's (ADAPTER lines) and --lora's, loaded through the native layer and
set on every context made on the model; and what a saved KV state made with them depends on."""

from __future__ import annotations

import os
from typing import Any

from localgen import fileid
from localgen.errors import ModelLoadError
from localgen.native import logs, lora
from localgen.types import ModelRef

Adapters = tuple[tuple[str, float], ...]  # (GGUF path, scale)


def load(model_ptr: Any, model: ModelRef, flags: Adapters) -> Adapters:
    """Load the preset's adapters, then the flags', onto the model; the (path, scale) pairs now applied."""
    wanted = (*model.adapters, *flags)
    loaded = []
    for path, scale in wanted:
        if not os.path.isfile(path):
            raise ModelLoadError(f"the LoRA adapter {path} is not there",
                                 hint="give the path of an adapter GGUF (convert_lora_to_gguf.py makes one)")
        ptr = lora.load(model_ptr, path)
        if not ptr:
            reason = logs.first_error() or "not a LoRA adapter GGUF"
            raise ModelLoadError(f"llama.cpp could not apply the LoRA adapter {path} to {model.name}: {reason}",
                                 hint="an adapter is made for one base model: use it with that one", log=logs.lines())
        loaded.append((ptr, scale))
    lora.attach(model_ptr, loaded)
    return tuple(wanted)


def identity(adapters: Adapters) -> list[str]:
    """What a saved KV state depends on of the adapters: each file as it stands, and its scale."""
    out = []
    for path, scale in adapters:
        out.append(f"lora:{fileid.identity(path, fresh=True)}:{scale!r}")
    return out
