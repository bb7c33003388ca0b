"""Open a model for generation: default GPU layers from the memory estimate, and a retry with fewer
layers when the GPU runs out of memory anyway, down to the CPU alone (with no GPU context at all: a
GPU without memory for its own context makes llama.cpp abort the process)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from localgen.errors import ModelLoadError
from localgen.models import fit
from localgen.types import LoadParams, ModelRef

OOM_MARKERS = ("out of memory", "failed to allocate", "cudamalloc", "unable to allocate", "insufficient memory")


def is_oom(e: ModelLoadError) -> bool:
    """Whether a load failed for want of memory (by its message or llama.cpp's log lines)."""
    text = " ".join([e.message, *e.log]).lower()
    return any(m in text for m in OOM_MARKERS)


def open_engine(ref: ModelRef, params: LoadParams, verbose: bool = False,
                warn: Callable[[str], None] = lambda s: None, factory: Callable[..., Any] | None = None,
                kv_tokens: int | None = None) -> Any:
    """Load `ref`; with --gpu-layers unset, offload as many layers as the estimate says fit. `kv_tokens`:
    the KV cells the work will hold at once when not one window (--parallel: N windows; beams: N
    continuations). `factory` builds the engine (tests pass one that fails the way a full GPU does)."""
    from localgen.engine.llama import Engine
    from localgen.models import lora
    from localgen.native.devices import backend_info

    lora.check_all(ref, params.lora)  # before the weights load
    make = factory or Engine
    cpu_only = False
    if params.n_gpu_layers is None and not params.rpc:  # with RPC servers every layer goes to the devices
        offload = bool(backend_info()["gpu_offload"])
        layers = 0
        if offload:
            machine = fit.this_machine(offload)
            est = fit.estimate(ref.summary, ref.summary.file_size, params.n_ctx, params.cache_type_k,
                               params.cache_type_v, params.n_ubatch or 512)
            if kv_tokens:  # several windows (or beams) at once: their cells, not one window's
                est = dataclasses.replace(est, kv=fit.kv_bytes(ref.summary, kv_tokens, params.cache_type_k,
                                                               params.cache_type_v))
            layers = fit.gpu_layers(ref.summary, est, machine)
            cpu_only = layers == 0
        params = dataclasses.replace(params, n_gpu_layers=layers)
    while True:
        try:
            return make(ref, params, verbose=verbose, cpu_only=cpu_only)
        except ModelLoadError as e:
            if cpu_only or not is_oom(e):
                raise
            layers = params.n_gpu_layers or 0
            total = ref.summary.n_layers or 1
            fewer = (total if layers < 0 else layers) // 2
            what = "all" if layers < 0 else str(layers)
            if fewer == 0:
                cpu_only = True
                warn(f"not enough GPU memory for {what} layers; running on the CPU alone")
            else:
                warn(f"not enough GPU memory for {what} layers; retrying with {fewer}")
            params = dataclasses.replace(params, n_gpu_layers=fewer)
