"""Open a model for generation: default GPU layers from the memory estimate, and a retry with fewer
layers when the GPU runs out of memory anyway."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from localgen.errors import ModelLoadError
from localgen.models import fit
from localgen.types import LoadParams, ModelRef

OOM_MARKERS = ("out of memory", "failed to allocate", "cudamalloc", "unable to allocate", "insufficient memory")


def open_engine(ref: ModelRef, params: LoadParams, verbose: bool = False,
                warn: Callable[[str], None] = lambda s: None) -> object:
    """Load `ref`; with --gpu-layers unset, offload as many layers as the estimate says fit."""
    from localgen.engine.llama import Engine, backend_info

    if params.n_gpu_layers is None:
        offload = bool(backend_info()["gpu_offload"])
        machine = fit.this_machine(offload)
        est = fit.estimate(ref.summary, ref.summary.file_size, params.n_ctx, params.cache_type_k,
                           params.cache_type_v, params.n_ubatch)
        params = dataclasses.replace(params, n_gpu_layers=fit.gpu_layers(ref.summary, est, machine))
    while True:
        try:
            return Engine(ref, params, verbose=verbose)
        except ModelLoadError as e:
            text = " ".join([e.message, *e.log]).lower()
            layers = params.n_gpu_layers or 0
            if layers == 0 or not any(m in text for m in OOM_MARKERS):
                raise
            total = ref.summary.n_layers or 1
            fewer = (total if layers < 0 else layers) // 2
            warn(f"not enough GPU memory for {'all' if layers < 0 else layers} layers; retrying with {fewer}")
            params = dataclasses.replace(params, n_gpu_layers=fewer)
