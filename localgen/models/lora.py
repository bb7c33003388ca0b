"""LoRA adapter files, checked from their GGUF header (bounded, no weights read) before anything loads: an
adapter of llama.cpp's kind (general.type "adapter", adapter.type "lora") made for the base model's
architecture. llama.cpp checks the tensor shapes when it loads one (engine/adapters.py)."""

from __future__ import annotations

from collections.abc import Iterable

from localgen.errors import ModelFormatError, UsageError
from localgen.types import ModelRef


def refuse_as_model(ref: ModelRef) -> None:
    """A UsageError where the model given is an adapter (a LoRA, a control vector): no model to load alone
    (llama.cpp said its header had no context_length)."""
    kind = ref.summary.metadata.get("general.type")
    if kind == "adapter":
        what = ref.summary.metadata.get("adapter.type")
        raise UsageError(f"{ref.name} is {'a LoRA' if what == 'lora' else 'an'} adapter, not a model",
                         hint=f"give it with its base model: -m BASE --lora {ref.path}" if what == "lora" else
                         "give its base model with -m")


def check(path: str, architecture: str, base: str) -> None:
    """A UsageError unless `path` is a LoRA adapter GGUF for `architecture` (the base model `base`'s)."""
    from localgen.models.gguf_meta import read_gguf

    try:
        meta, _, _ = read_gguf(path)
    except ModelFormatError as e:
        raise UsageError(f"the LoRA adapter {e.message}") from None
    kind = meta.get("general.type")
    if kind != "adapter" or meta.get("adapter.type") != "lora":
        what = f"general.type is {kind!r}" if kind != "adapter" else f"adapter.type is {meta.get('adapter.type')!r}"
        raise UsageError(f"{path} is not a LoRA adapter GGUF ({what})",
                         hint="llama.cpp's convert_lora_to_gguf.py turns a PEFT adapter into one")
    arch = meta.get("general.architecture")
    if arch != architecture:
        raise UsageError(f"the LoRA adapter {path} is for the {arch!r} architecture, and {base} is {architecture!r}",
                         hint="an adapter is made for one base model: use it with that one")


def check_all(ref: ModelRef, flags: Iterable[tuple[str, float]]) -> None:
    """The model's own adapters (a preset's) and the --lora ones."""
    for path, _ in (*ref.adapters, *flags):
        check(path, ref.summary.architecture, ref.name)
