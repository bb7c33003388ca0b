"""The load settings as they will be used, and where each came from: a flag (or the caller), this machine's
tuning record for the model (localgen/tuning.py), or the rule where nothing was measured."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Any

from localgen import hardware, tuning
from localgen.backend import overflow_case
from localgen.types import MAX_CELLS, LoadParams, ModelRef

UBATCH = 512  # llama.cpp's default physical batch


@functools.cache
def build_id() -> str:
    """This llama.cpp build: the bindings' version and a digest of what llama.cpp says it was built with."""
    from localgen.native.lib import system_info, version

    info = system_info()
    return f"llama-cpp-python {version()} · {hashlib.sha256(info.encode()).hexdigest()[:12]}"


def device_id(offloaded: bool) -> str:
    """The device a load computes on: the CPU (model, cores the process may use), or the GPUs it offloads to."""
    if offloaded:
        from localgen.native import devices

        names = sorted(d.description or d.name for d in devices.devices()
                       if d.kind in (devices.GPU, devices.IGPU) and not d.name.startswith("RPC"))
        return "GPU " + " + ".join(names or ["(RPC)"])
    return f"CPU {hardware.cpu_name()} · {hardware.physical_cores()} physical / {hardware.usable_cores()} usable"


def placed(params: LoadParams) -> str:
    """The load's tensor placement as its flags (placement.flags_text): which tuning records fit it."""
    from localgen import placement

    return placement.flags_text(params.override_tensor, params.cpu_moe, params.n_cpu_moe)


def resolve(model: ModelRef, params: LoadParams, cpu_only: bool,
            use_records: bool = True) -> tuple[LoadParams, dict[str, str]]:
    """The settings a load uses (the window rounded to llama.cpp's multiple of 256 and capped at the training
    context unless RoPE scaling stretches it; threads, GPU layers, batch sizes, repacking, flash attention),
    and for each tunable one where it came from: "flag", "tuned on DATE" (a record for this file, build, device,
    streams and placement), or "rule: why"."""
    from localgen.native import devices

    train_ctx = model.summary.context_length
    params = params.for_model(train_ctx)  # --ctx 0: the trained context
    n_ctx = min(-(-params.n_ctx // 256) * 256, MAX_CELLS)  # --ctx 2147483647 padded up would pass a C int
    if train_ctx and not stretched(params):
        n_ctx = min(n_ctx, train_ctx)
    n_gpu = 0 if cpu_only else params.n_gpu_layers
    if n_gpu is None:
        n_gpu = -1 if devices.has_gpu() or params.rpc else 0  # RPC servers' devices take layers as GPUs do
    offloaded = n_gpu != 0 and (devices.has_gpu() or bool(params.rpc))
    # where the layers go, for the rules' reasons: an RPC server's device may be another machine's CPU
    offload_to = " and ".join(w for w, on in (("GPU", devices.has_gpu()), ("RPC servers", bool(params.rpc))) if on)
    given = {name: getattr(params, name) for name in tuning.TUNABLE if getattr(params, name) is not None}
    origins = dict.fromkeys(given, "flag")
    record = None
    if use_records and len(given) < len(tuning.TUNABLE) and not params.rpc:
        record = tuning.find(model.path, build_id(), device_id(offloaded), params.streams, placed(params))
    chosen: dict[str, Any] = {}
    if record is not None:
        how = "partly tuned" if record.partial else "tuned"
        busy = f" on a busy machine ({record.busy})" if record.busy else ""
        for name in tuning.TUNABLE:
            if name not in given and name in record.settings:
                chosen[name] = record.settings[name]
                origins[name] = f"{how} on {record.day}{busy}"
    for name, (value, why) in _rules(model, params, n_gpu, offload_to if offloaded else "").items():
        if name not in given and name not in chosen:
            chosen[name] = value
            origins[name] = why
    # a quantized V cache cannot be read without flash attention, whatever was measured
    if "flash_attn" not in given and params.cache_type_v not in ("f16", "f32", "bf16") and not chosen["flash_attn"]:
        chosen["flash_attn"], origins["flash_attn"] = True, f"needed by the {params.cache_type_v} V cache"
    values = {**chosen, **given}
    n_batch = min(params.n_batch, n_ctx)
    resolved = dataclasses.replace(
        params, n_ctx=n_ctx, n_threads=values["n_threads"], n_threads_batch=values["n_threads_batch"],
        n_gpu_layers=n_gpu, n_batch=n_batch, n_ubatch=min(int(values["n_ubatch"]), n_batch, n_ctx),
        repack=bool(values["repack"]), flash_attn=values["flash_attn"],
    )
    return resolved, origins


def stretched(params: LoadParams) -> bool:
    """Whether RoPE scaling (--rope-scaling linear or yarn, --rope-freq-scale) stretches the window past the trained
    context, where resolve() would cap it (`--rope-scaling none` turns scaling off: the cap stays)."""
    return bool(params.rope_scaling not in (None, "none") or params.rope_freq_scale)


def past_training(params: LoadParams, trained: int | None) -> bool:
    """Whether the window asked is past the `trained` context, where resolve() caps it: what run, serve and embed
    warn of when the --ctx was given."""
    return trained is not None and 0 < trained < params.n_ctx and not stretched(params)


def window_can_hold(tokens: int, trained: int | None, stretched: bool = False) -> bool:
    """Whether some --ctx gives a window that holds a prompt of `tokens` tokens: resolve() caps the window at the
    `trained` context unless RoPE scaling (`stretched`) is set, and a window of N holds at most N - 1 of them."""
    return not trained or stretched or tokens < trained


def overflow_hint(n_ctx: int, cap: int | None, needed: int | None = None) -> str:
    """What helps a prompt of `needed` tokens (None: not counted) that an `n_ctx` window cannot hold, as run's
    error says it (backend.overflow_case): a larger --ctx only where the window can grow to hold it, else a shorter
    prompt, or RoPE scaling."""
    case = overflow_case(n_ctx, cap, needed)
    if case == "full":
        return (f"shorten the prompt: the window is already the {cap:,} tokens this model was trained on; "
                "--rope-scaling linear with a larger --ctx stretches it, at some cost in quality")
    if case == "past":
        return (f"shorten the prompt: it is longer than the {cap:,} tokens this model was trained on, past "
                "which --ctx does not go; --rope-scaling linear with a larger --ctx stretches the window, at some cost "
                "in quality")
    if case == "grow":
        return f"shorten the prompt or raise --ctx; this model was trained on up to {cap:,}"
    return "shorten the prompt or raise --ctx"


def _rules(model: ModelRef, params: LoadParams, n_gpu: int | None,
           offload_to: str) -> dict[str, tuple[Any, str]]:
    """Each tunable's value and reason where neither a flag nor a record sets it; `offload_to` names where
    layers are offloaded ("GPU", "RPC servers"), empty where they are not."""
    fa, fa_why = tuning.rule_flash_attn(offload_to)
    share = model.summary.repackable_share
    repack = default_repack(model, dataclasses.replace(params, n_gpu_layers=n_gpu))
    if offload_to:
        repack_why = f"rule: off with layers offloaded to {offload_to}"
    elif share is None:
        repack_why = "rule: on (share of repackable weights unknown)"
    else:
        repack_why = f"rule: {'on' if repack else 'off'} ({share:.0%} of the weights repackable here)"
    return {
        "flash_attn": (fa, fa_why),
        "repack": (repack, repack_why),
        "n_threads": (hardware.physical_cores(), "rule: physical cores"),
        "n_threads_batch": (hardware.usable_cores(), "rule: usable cores"),
        "n_ubatch": (UBATCH, "rule: llama.cpp's default"),
    }


def default_repack(model: ModelRef, params: LoadParams) -> bool:
    """Whether to use llama.cpp's repacked CPU weight layouts when the user did not say.

    Repacking speeds up prompt processing for the types it covers, but a model whose repackable share is
    small gains nothing, and repacked weights compute 4+ rows of a batch differently from fewer, which
    costs exact batching most of its speed. So: on where at least half the weights are of a repackable
    type (Q4_0, IQ4_NL, Q4_K on x86 with AVX2; more on ARM), off otherwise and when layers go to a GPU."""
    if params.n_gpu_layers not in (None, 0):
        return False
    share = model.summary.repackable_share
    return share is None or share >= 0.5
