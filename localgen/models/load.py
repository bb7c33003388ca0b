"""Open a model for generation: the GPU layers, experts kept in RAM and context from the plan (models/fit.py),
and a retry with fewer layers when the GPU runs out of memory anyway, down to the CPU alone (with no GPU
context at all: a GPU without memory for its own context makes llama.cpp abort the process)."""

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


def unmatched_overrides(ref: ModelRef, overrides: tuple[tuple[str, str], ...], layout: Any = None) -> list[str]:
    """A warning for each -ot PATTERN=BUFFER that matches no tensor of the model, naming one of its tensors: llama.cpp
    says nothing of a pattern that moves nothing. `layout`: the model's footprint.layout, where read already."""
    from localgen import placement
    from localgen.models import footprint

    if not overrides:
        return []
    tensors = (layout or footprint.layout(ref.path)).tensors
    missed = [(p, b) for p, b in overrides
              if tensors and not any(placement.buffer_of(t.name, ((p, b),)) for t in tensors)]
    if not missed:
        return []
    like = next((t.name for t in tensors if t.expert), None) or next(
        (t.name for t in tensors if t.layer is not None), tensors[0].name)
    said = [f"-ot {pattern}={buffer} matches no tensor of {ref.name}, so it moves nothing (its tensors are named "
            f"like {like})" for pattern, buffer in missed[:MISSES_SAID]]
    if len(missed) > MISSES_SAID:  # (a thousand patterns that miss were a thousand lines)
        said.append(f"and {len(missed) - MISSES_SAID:,} more -ot patterns match no tensor of {ref.name}")
    return said


MISSES_SAID = 5  # the -ot patterns that miss said one by one; the rest in one line


def for_draft(params: LoadParams) -> LoadParams:
    """The load settings a draft model (--draft) loads with: the model's, less the placement flags (-ot, --cpu-moe,
    --n-cpu-moe), whose patterns and layers name the model's own tensors."""
    return dataclasses.replace(params, override_tensor=(), cpu_moe=False, n_cpu_moe=None)


def moved_bytes(engine: Any, path: str, layout: Any = None) -> None:
    """Give a loaded engine's load report the bytes of each tensor a placement pattern moved, so that its `moved`
    sums them rather than llama.cpp's MiB rounded down per tensor (native/report.py). `layout`: the model's
    footprint.layout where read already."""
    from localgen.models import footprint

    report = getattr(engine, "load_report", None)
    if report is None or not report.overridden:
        return
    tensors = (layout or footprint.layout(path)).tensors
    engine.load_report = dataclasses.replace(report, sizes={t.name: t.nbytes for t in tensors})


def experts_flag_moves_nothing(name: str, params: LoadParams, layout: Any) -> str | None:
    """The warning for --cpu-moe or --n-cpu-moe given for a model with no experts (`layout`: its tensors), which
    run, chat, serve and fit give; None where they move something, or were not given."""
    if not (params.cpu_moe or params.n_cpu_moe) or layout is None or layout.moe:
        return None
    flag = "--cpu-moe" if params.cpu_moe else f"--n-cpu-moe {params.n_cpu_moe}"
    return f"{flag}: {name} is not a mixture of experts (it has no experts to keep in RAM), so it moves nothing"


def open_engine(ref: ModelRef, params: LoadParams, verbose: bool = False,
                warn: Callable[[str], None] = lambda s: None, factory: Callable[..., Any] | None = None,
                kv_tokens: int | None = None, machine: fit.Machine | None = None) -> Any:
    """Load `ref` by the plan (models/fit.py): the GPU layers, the experts kept in RAM and the context, each
    where not given; a context shrunk to fit is said through `warn`. `kv_tokens`: the KV cells the work will
    hold at once when not one window (--parallel: N windows; beams: N continuations). `factory` builds the
    engine (tests pass one that fails the way a full GPU does); `machine`: what to plan for (default: this
    one)."""
    from localgen.engine.llama import Engine
    from localgen.models import footprint, lora
    from localgen.native.devices import backend_info

    params = params.for_model(ref.summary.context_length)  # --ctx 0: the trained context
    lora.refuse_as_model(ref)
    lora.check_all(ref, params.lora)  # before the weights load
    make = factory or Engine
    cpu_only = False
    layout = footprint.layout(ref.path) if params.override_tensor or not params.rpc else None  # RPC: no plan
    for text in unmatched_overrides(ref, params.override_tensor, layout):
        warn(text)
    said = experts_flag_moves_nothing(ref.name, params, layout)
    if said:
        warn(said)
    # a GPU to move layers off (a shortage then is the GPU's, and fewer layers can help); without one, RAM's
    # (RPC servers' devices count: their memory is short too, and fewer layers help, as engine/llama.py has it)
    offload = (bool(backend_info()["gpu_offload"]) if machine is None else bool(machine.gpus)) or bool(params.rpc)
    if layout is not None and not params.rpc:  # with RPC servers every layer goes to the devices
        parallel = max(1, -(-kv_tokens // params.n_ctx)) if kv_tokens else 1
        plan = fit.plan(ref.summary, layout, machine or fit.this_machine(offload), params, ctx=params.n_ctx,
                        parallel=parallel)
        see = f"(`localgen fit -m {ref.name}` shows the plan)"
        asked = f"{plan.asked if plan.capped else params.n_ctx:,}"  # the --ctx given (not rounded), where not capped
        if not plan.fits:  # its verdict is "won't fit"; the load is tried all the same (mapped weights may page)
            short = plan.short_of.replace("GPU memory", "the GPU's memory")
            warn(f"context {plan.ctx:,} tokens, not {asked}, and the model does not fit {short} even there: "
                 f"loading it anyway {see}" if plan.shrunk else
                 f"the model does not fit {short} at {plan.ctx:,} tokens: loading it anyway {see}")
        elif plan.shrunk:
            where = "the GPU" if plan.machine.gpus else "RAM"
            warn(f"context {plan.ctx:,} tokens, not {asked}: at {asked} the model does not fit {where} {see}")
        params = plan.load(params)
        cpu_only = offload and plan.gpu_layers == 0 and "gpu_layers" not in plan.fixed
    while True:
        try:
            engine = make(ref, params, verbose=verbose, cpu_only=cpu_only)
            moved_bytes(engine, ref.path, layout)
            return engine
        except ModelLoadError as e:
            if not offload and is_oom(e):  # no GPU: nothing to move off it, and the memory short is RAM
                raise ModelLoadError(f"not enough RAM: {e.message}", e.hint, e.log) from None
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
