"""Loading a model file through the native layer: llama_model_params from the load settings, and what a failed
load or context says (llama.cpp's first error line, with a hint where one helps)."""

from __future__ import annotations

from typing import Any

from localgen import placement
from localgen.errors import ModelLoadError
from localgen.native import logs
from localgen.native import model as native_model
from localgen.native.lib import init_numa
from localgen.types import LoadParams, ModelRef

_SPLIT = {"none": 0, "layer": 1, "row": 2}
_NUMA = {"distribute": 1, "isolate": 2, "numactl": 3}


def load_model(ref: ModelRef, p: LoadParams, cpu_only: bool) -> Any:
    """The model pointer; a ModelLoadError naming llama.cpp's reason where it could not load."""
    if p.numa:
        init_numa(_NUMA[p.numa])
    load_mode = None
    if p.use_mlock:
        load_mode = native_model.LOAD_MMAP_MLOCK if p.use_mmap else native_model.LOAD_MLOCK
    elif not p.use_mmap:
        load_mode = native_model.LOAD_NONE
    if not cpu_only and p.rpc:
        from localgen.native import devices

        devices.register_rpc(p.rpc)  # registered devices join the load, as with llama.cpp's --rpc
    options = native_model.ModelOptions(
        n_gpu_layers=p.n_gpu_layers if p.n_gpu_layers is not None else 0, use_extra_bufts=bool(p.repack),
        split_mode=_SPLIT[p.split_mode], main_gpu=p.main_gpu, tensor_split=tuple(p.tensor_split or ()),
        load_mode=load_mode, overrides=placement.overrides(p.override_tensor, p.cpu_moe, p.n_cpu_moe or 0),
        no_devices=cpu_only)  # no devices at all: nothing of the GPU backend is touched, not even for compute
    ptr = native_model.load(str(ref.path), options)
    if not ptr:
        raise error(ref, "failed to load model")
    return ptr


def error(ref: ModelRef, what: str) -> ModelLoadError:
    """The error of a failed model load or context (`what` names which), from llama.cpp's log."""
    reason = logs.first_error()
    path = ref.path
    if "context" in what:
        return ModelLoadError(
            f"llama.cpp could not create a context for {ref.name}: {reason or what}",
            hint="try a smaller --ctx, or the default KV-cache types",
            log=logs.lines(),
        )
    detail = reason or what
    if ref.source == "ollama":  # often a GGUF of Ollama's own conversion: the model by its name, and what loads
        # (models/ollamastore.py's refused_hint says the same; the engine does not import models)
        pull = f"`ollama pull {ref.name[len('ollama:'):]}` fetches it again if it is damaged; " if (
            ref.name.startswith("ollama:")) else ""  # a preset of the model: its own name
        return ModelLoadError(f"llama.cpp could not load {ref.name} ({path}): {detail}",
                              hint=f"{pull}some of Ollama's library models are Ollama's own conversion, which "
                                   "llama.cpp cannot load: run the same model's GGUF from Hugging Face "
                                   "(localgen run -m OWNER/REPO)", log=logs.lines())
    if "unknown model architecture" in detail:
        arch = ref.summary.architecture
        return ModelLoadError(
            f"this llama.cpp build does not know the architecture {arch!r} of {path}",
            hint="upgrade llama-cpp-python (scripts/install.sh) or pick a supported model",
            log=logs.lines(),
        )
    damaged = "not a multiple of block size" in detail or "tensor info" in detail
    return ModelLoadError(f"llama.cpp could not load {path}: {detail}", log=logs.lines(),
                          hint="the file is likely damaged: download it again (localgen pull verifies files); "
                               "--verbose shows llama.cpp's log" if damaged else None)
