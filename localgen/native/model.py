"""A llama.cpp model: loaded from a GGUF file with llama.cpp's own API, what it says about itself, freed."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Any

from localgen.native import logs
from localgen.native.lib import lib

LOAD_NONE, LOAD_MMAP, LOAD_MLOCK, LOAD_MMAP_MLOCK = 0, 1, 2, 3  # llama_model_params.load_mode


@dataclass(frozen=True)
class ModelOptions:
    """The llama_model_params localgen sets; the rest keep llama.cpp's defaults."""

    n_gpu_layers: int = 0
    use_extra_bufts: bool = False  # repacked CPU weight layouts
    split_mode: int = 1  # none 0, layer 1, row 2
    main_gpu: int = 0
    tensor_split: tuple[float, ...] = ()
    load_mode: int | None = None  # None: llama.cpp's default (mmap)
    no_devices: bool = False  # the CPU alone: no device of any backend, not even for compute buffers
    overrides: tuple[tuple[str, str], ...] = ()  # (pattern, buffer type name): tensor_buft_overrides, in order
    vocab_only: bool = False  # the vocabulary alone, no weights (to tokenize, in a moment and no memory)


class _BuftOverride(ctypes.Structure):
    """llama.h's llama_model_tensor_buft_override (the bindings declare the field as a bare pointer)."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def load(path: str, options: ModelOptions) -> Any:
    """The model pointer, or None where llama.cpp could not load it (its log says why)."""
    lc = lib()
    mp = lc.llama_model_default_params()
    mp.n_gpu_layers = options.n_gpu_layers
    mp.use_extra_bufts = options.use_extra_bufts
    mp.split_mode = options.split_mode
    mp.main_gpu = options.main_gpu
    mp.vocab_only = options.vocab_only
    keep: list[Any] = []  # arrays the params point at, alive until the load is done
    if options.tensor_split:
        n = max(int(lc.llama_max_devices()), len(options.tensor_split))
        split = (ctypes.c_float * n)(*options.tensor_split)
        keep.append(split)
        mp.tensor_split = ctypes.cast(split, ctypes.POINTER(ctypes.c_float))
    if options.overrides:
        from localgen.native.devices import buffer_types, check_buffers

        check_buffers([b for _, b in options.overrides])
        have = buffer_types()
        # NULL-terminated; the pattern strings live in `keep` until llama_model_load_from_file returns (only
        # llama-model-loader reads them, while it creates the tensors)
        patterns = [ctypes.create_string_buffer(p.encode()) for p, _ in options.overrides]
        rows = [_BuftOverride(ctypes.cast(p, ctypes.c_char_p), have[b])
                for p, (_, b) in zip(patterns, options.overrides, strict=True)]
        table = (_BuftOverride * (len(rows) + 1))(*rows, _BuftOverride(None, None))
        keep += [patterns, table]
        mp.tensor_buft_overrides = ctypes.cast(table, ctypes.c_void_p)
    if options.load_mode is not None:
        mp.load_mode = options.load_mode
    if options.no_devices:
        none = (ctypes.c_void_p * 1)(None)
        keep.append(none)
        mp.devices = ctypes.cast(none, ctypes.c_void_p)
    # A Ctrl-C handled as llama.cpp returns the model would be raised before anyone holds it (its weights lost to
    # the process, which a chat outlives): it waits to the block's end, the model freed first.
    with logs.unbroken():
        ptr = lc.llama_model_load_from_file(os.fsencode(path), mp)
        if ptr and logs.pending():
            free(ptr)
            ptr = None
    return ptr or None


def free(model: Any) -> None:
    """Free a loaded model (and the LoRA adapters loaded onto it)."""
    from localgen.native import lora

    lora.detach(model)
    lib().llama_model_free(model)


def has_encoder(model: Any) -> bool:
    """Whether the model has an encoder (T5 and kin)."""
    return bool(lib().llama_model_has_encoder(model))


def whole_states_only(model: Any) -> bool:
    """Whether the model's memory cannot drop a tail of a sequence (recurrent and hybrid models: Mamba, RWKV,
    Jamba, LFM2): a recurrent state is one state, not a cell per position."""
    lc = lib()
    return bool(lc.llama_model_is_recurrent(model)) or bool(lc.llama_model_is_hybrid(model))


def has_decoder(model: Any) -> bool:
    """Whether the model has a decoder."""
    return bool(lib().llama_model_has_decoder(model))


def meta_str(model: Any, key: str, cap: int = 16) -> str | None:
    """A metadata value as text (up to `cap` bytes), or None where the model has no such key."""
    buf = ctypes.create_string_buffer(cap)
    n = lib().llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode() if n > 0 else None


def desc(model: Any) -> str:
    """llama.cpp's one-line description of the model ("qwen2 0.5B Q4_K - Medium")."""
    buf = ctypes.create_string_buffer(256)
    lib().llama_model_desc(model, buf, len(buf))
    return buf.value.decode("utf-8", errors="replace")


def n_params(model: Any) -> int:
    """The model's parameter count."""
    return int(lib().llama_model_n_params(model))


def size(model: Any) -> int:
    """The bytes of the model's weights."""
    return int(lib().llama_model_size(model))


def n_embd_out(model: Any) -> int:
    """The width of the model's output embeddings (llama_model_n_embd_out where this build has it, else
    llama_model_n_embd)."""
    lc = lib()
    n = int(lc.llama_model_n_embd_out(model)) if hasattr(lc, "llama_model_n_embd_out") else 0
    return n or int(lc.llama_model_n_embd(model))


def n_cls_out(model: Any) -> int:
    """A classifier's (a reranker's) output count."""
    return int(lib().llama_model_n_cls_out(model))


def chat_template(model: Any, name: str) -> str | None:
    """The model's named chat template ("rerank"), or None."""
    ptr = lib().llama_model_chat_template(model, name.encode())
    return ctypes.string_at(ptr).decode("utf-8", "replace") if ptr else None
