"""`localgen fit`: the plan a model would load by (models/fit.py), without loading it: layers per device,
experts kept in RAM, the context, and the memory each device needs; for this machine, or for GPUs described
by their memory (--gpu-memory 24GB), so the question "does it fit a 24 GB card?" needs no such card."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from localgen.cli import options as o
from localgen.cli.inputfile import check_model, env_source
from localgen.cli.options import preset
from localgen.cli.options.knobs import Knobs, named_by_env
from localgen.cli.output import aligned, header_text
from localgen.errors import UsageError
from localgen.types import MAX_CTX, LoadParams
from localgen.units import format_bytes, parse_bytes

GpuMemory = Annotated[
    str | None, typer.Option("--gpu-memory", rich_help_panel=o.GPU_PANEL, show_default=False, metavar="SIZE,...",
                             help="Plan for GPUs of this much memory each (e.g. 24GB, or 24G,12G for two) "
                                  "instead of this machine's; 0 for none.")
]
Ram = Annotated[
    str | None, typer.Option("--ram", rich_help_panel=o.GPU_PANEL, show_default=False, metavar="SIZE",
                             help="Plan for this much available RAM (default: what is available here).")
]
PLAN_LOAD = ("gpu_layers", "batch_size", "ubatch_size", "flash_attn", "no_flash_attn", "cache_type_k", "cache_type_v",
             "repack", "n_cpu_moe", "cpu_moe", "override_tensor", "tensor_split", "rope_scaling", "rope_freq_scale")


@o.with_knobs(sampling=False, load=PLAN_LOAD)
def fit(
    ctx: typer.Context,
    model: o.Model = None,
    context: Annotated[
        int | None, typer.Option("--ctx", "--ctx-size", "-c", min=0, max=MAX_CTX, envvar="LOCALGEN_CTX",
                                 rich_help_panel=o.MODEL_PANEL, show_default=False,
                                 help="Context per sequence to plan for (default: a preset's num_ctx, else the largest "
                                      "that fits, up to the model's training context); 0: the training context.")
    ] = None,
    parallel: Annotated[
        int, typer.Option("--parallel", "-np", min=1, max=256, rich_help_panel=o.MODEL_PANEL,
                          help="Sequences held at once, each with its own context (serve's --parallel).")
    ] = 1,
    gpu_memory: GpuMemory = None,
    ram: Ram = None,
    json_out: Annotated[bool, typer.Option("--json", help="The plan as one JSON document on stdout.")] = False,
    offline: o.Offline = False,
    *,
    knobs: Knobs,
) -> None:
    """Plan a model's load without loading it: layers per device, experts kept in RAM, the largest context
    that fits (or the one asked), and each device's memory (weights, KV cache, compute). run, chat and serve
    load by the same plan."""
    from localgen.models import fit as planner
    from localgen.models import footprint
    from localgen.models.load import experts_flag_moves_nothing
    from localgen.models.presets import window_source
    from localgen.models.resolve import resolve

    machine = machine_for(gpu_memory, ram)
    load = knobs.load(check_buffers=False)
    ctx_said = env_source(ctx, "context") or "--ctx"  # LOCALGEN_CTX=10 is no --ctx 10
    if context is not None:  # 1 to 15 refused as run refuses them, before the model is looked up
        try:
            LoadParams(n_ctx=context)
        except UsageError as e:
            raise named_by_env(e, {"ctx": ctx_said}) from None
    check_model("-m/--model", model)  # a path to nothing: a usage error, as run's -m
    ref = resolve(model, offline=offline, pull_missing=False)
    weights = footprint.layout(ref.path)
    _check_loadable(ref, weights)
    load = preset.load_params(ref, load, knobs.given, check_buffers=False)  # a preset's n_cpu_moe, -ot, ...
    said = experts_flag_moves_nothing(ref.name, load, weights)  # as run says it
    if said:
        from localgen.cli.output import ErrWriter

        ErrWriter().warn(said)
    if "override_tensor" in ref.load and not knobs.given("override_tensor"):  # the preset's, as run says it
        _check_buffers(load, len(machine.gpus), preset.said(ref, "override_tensor"),
                       preset.replace_hint("override_tensor"))
    else:
        _check_buffers(load, len(machine.gpus), knobs.named("override_tensor"))
    # the context asked: --ctx (or LOCALGEN_CTX), else a preset's num_ctx or a models.toml context (as run loads
    # it), else none (the largest that fits)
    said_by = asked_by = window_source(model, ref) if ref.context is not None else None
    if asked_by == "ollama":  # an Ollama model's num_ctx is its params layer's: a preset's to JSON
        asked_by = "preset"
    if context is not None:
        said_by = asked_by = ctx_said
    asked = context if context is not None else ref.context
    if asked is not None:  # 0 (as run's --ctx 0): the training context
        asked = LoadParams(n_ctx=asked).for_model(ref.summary.context_length).n_ctx
    plan = planner.plan(ref.summary, weights, machine, load, ctx=asked, parallel=parallel)
    doc = _doc(ref, plan, load, asked, asked_by, ram_given=ram is not None)
    if json_out:
        print(json.dumps(doc))
        return
    if context == 0 and ref.summary.context_length:  # --ctx 0 (or LOCALGEN_CTX=0): the training context, asked
        said_by = "trained"
    _print(doc, load, _why(plan, asked, said_by, trained=bool(ref.summary.context_length)))


def _check_loadable(ref: Any, weights: Any) -> None:
    """A ModelFormatError for a model `run` would not load for its header alone: no plan is made for it."""
    from localgen.errors import ModelFormatError
    from localgen.models.gguf_meta import refusal
    from localgen.models.lora import refuse_as_model

    refuse_as_model(ref)
    # (an architecture this build does not know is run's to say: fit reads headers and loads nothing of llama.cpp)
    why = refusal(ref.summary, (t.name for t in weights.tensors))
    if why is not None:
        raise ModelFormatError(f"llama.cpp would not load {ref.name}: {why}", hint="the file is corrupt, or made "
                               "for another program; `localgen show` reads its header")


def _is_preset(name: str | None) -> bool:
    from localgen.models import presets

    return name is not None and presets.exists(name)


def machine_for(gpu_memory: str | None, ram: str | None) -> Any:
    """What to plan for: this machine, or GPUs and RAM described (--gpu-memory, --ram). `fit` and `pull --list`
    judge by it."""
    from localgen.models import fit as planner

    gpus = _gpu_sizes(gpu_memory) if gpu_memory is not None else None
    ram_bytes = _ram_size(ram) if ram is not None else None
    if gpus is not None:
        return planner.described(gpus, ram_bytes)
    if ram_bytes is not None:
        here = _this_machine()
        return planner.Machine(ram=ram_bytes, gpus=here.gpus, unified=here.unified, described=True)
    return _this_machine()


def _this_machine() -> Any:
    """This machine's RAM and GPUs; the build's offload is asked (which loads llama.cpp) only where a GPU is."""
    from localgen import hardware
    from localgen.models import fit as planner

    if not hardware.gpus():
        return planner.this_machine(False)
    from localgen.native.devices import backend_info

    return planner.this_machine(bool(backend_info()["gpu_offload"]))


def _gpu_sizes(text: str) -> tuple[int, ...]:
    """--gpu-memory: one size per GPU (at most MAX_DEVICES), each above 0 (an empty item or a 0 among cards would
    shift which card CUDA0 names), or a lone 0 for no GPU."""
    from localgen.types import MAX_DEVICES

    items = [x.strip() for x in text.split(",")]
    if len(items) > MAX_DEVICES:  # before any is parsed: a plan's time grows with the cards
        raise UsageError(f"--gpu-memory describes at most {MAX_DEVICES} GPUs (llama.cpp's most devices), not "
                         f"{len(items):,}")
    if not all(items):
        raise UsageError(f"--gpu-memory has an empty item in {text!r}")
    try:
        sizes = tuple(parse_bytes(x) for x in items)
    except ValueError:
        raise UsageError(f"--gpu-memory takes sizes such as 24GB or 24G,12G, not {text!r}") from None
    if sizes == (0,):
        return ()
    if 0 in sizes:
        raise UsageError(f"--gpu-memory: each GPU's size must be above 0 (a lone 0 means no GPU), not {text!r}")
    for item, size in zip(items, sizes, strict=True):
        _sane_size("--gpu-memory", item, size)
    return sizes


def _ram_size(text: str) -> int:
    """--ram: one size, above 0."""
    try:
        size = parse_bytes(text)
    except ValueError:
        raise UsageError(f"--ram takes one size, such as 64G, not {text!r}") from None
    if size <= 0:
        raise UsageError(f"--ram must be above 0, not {text!r}")
    _sane_size("--ram", text, size)
    return size


def _sane_size(flag: str, item: str, size: int) -> None:
    """A memory size a machine can have: from 1 MiB (a bare 24 is 24 bytes: a unit left out) to 1 PiB."""
    if size < 1 << 20 and any(c.isalpha() for c in item):  # a unit given, and a size no machine has
        raise UsageError(f"{flag}: {item.strip()!r} is {size:,} byte{'s' if size != 1 else ''}, under 1 MiB: less "
                         "memory than a machine has")
    if size < 1 << 20:
        raise UsageError(f"{flag}: {item.strip()!r} is {size:,} byte{'s' if size != 1 else ''}; give a unit, such as "
                         "24G")
    if size > 1 << 50:
        raise UsageError(f"{flag}: {item.strip()!r} is over 1 PiB, more memory than a machine has")


def _check_buffers(load: Any, n_gpus: int, name: str, hint: str | None = None) -> None:
    """-ot's buffer types against the devices planned for: CPU, or a GPU's number below their count. `name`: where
    they came from, which the error names (the flag, LLAMA_ARG_OVERRIDE_TENSOR, a preset's PARAMETER line, as
    run's does: cli/options/preset.py), with `hint`."""
    from localgen import placement

    try:
        for _, buffer in load.override_tensor:
            placement.described_buffer(buffer, n_gpus, name)
    except UsageError as e:
        raise UsageError(e.message, hint=hint) from None


def _doc(ref: Any, plan: Any, load: Any, asked: int | None, asked_by: str | None,
         ram_given: bool) -> dict[str, Any]:
    s = ref.summary
    m = plan.machine
    devices = []
    # every GPU the plan is for, one it gives no layer included (with nothing, as llama.cpp would leave it)
    from localgen.models.fit import gpu_name

    gpus = [gpu_name(i, len(m.gpus)) for i in range(len(m.gpus))]
    present = [d.device for d in plan.footprint.devices]
    names = [*(["CPU"] if "CPU" in present else []), *gpus, *(n for n in present if n != "CPU" and n not in gpus)]
    for d in map(plan.footprint.on, names):
        if d.device == "CPU":
            budget = m.ram_budget
        else:
            i = int(d.device[3:] or 0)
            budget = m.ram_budget if m.unified else m.gpu_budget(i)
        devices.append({"device": d.device, "weights": d.weights, "experts": d.experts, "kv": d.kv,
                        "compute": d.compute, "output": d.output, "total": d.total, "budget": budget,
                        **({"mapped": d.mapped} if d.device == "CPU" else {})})
    # n_cpu_moe: the plan's, or the one given (a flag, a preset's), as `flags` says
    return {
        "model": {"name": ref.name, "file": ref.file, "architecture": s.architecture, "layers": plan.n_layer,
                  "weights": s.tensor_bytes, "context_length": s.context_length, "moe": plan.moe,
                  "encoder": s.encoder_only},
        "machine": {"ram": m.ram, "gpus": list(m.gpus), "unified": m.unified, "gpus_described": m.described,
                    "ram_described": ram_given},
        "ctx": plan.ctx, "asked": asked, "asked_by": asked_by, "largest": asked is None, "capped": plan.capped,
        "shrunk": plan.shrunk, "parallel": plan.parallel,
        "gpu_layers": plan.gpu_layers, "layers_per_gpu": list(plan.layers) if m.gpus else [],
        "n_cpu_moe": plan.load(load).n_cpu_moe or 0,
        "experts_in_ram": plan.experts_in_ram, "fits": plan.fits, "verdict": plan.verdict, "devices": devices,
        "flags": _flags(plan, load),
    }


def _flags(plan: Any, given: Any) -> str:
    """The settings run, chat and serve would load with, as run spells them: the plan's context, GPU layers and
    experts in RAM, and the load settings given (on the command line or by a preset) that the plan was made with:
    placement, batch sizes, flash attention, cache types, repacking, the split, RoPE scaling."""
    import shlex

    load, default = plan.load(given), LoadParams()
    flags = [f"--ctx {plan.ctx}"]
    if plan.parallel > 1:  # the plan holds that many sequences' KV cache (serve's slots)
        flags.append(f"--parallel {plan.parallel}")
    if "gpu_layers" in plan.fixed:  # as given (-ngl 99 is not said back as -1: the plan keeps it as it is)
        flags.append(f"--gpu-layers {given.n_gpu_layers}")
    elif plan.machine.gpus:
        flags.append(f"--gpu-layers {-1 if plan.gpu_layers >= plan.n_layer + 1 else plan.gpu_layers}")
    if load.n_cpu_moe:
        flags.append(f"--n-cpu-moe {load.n_cpu_moe}")
    if load.cpu_moe:
        flags.append("--cpu-moe")
    if load.override_tensor:
        flags.append("-ot " + shlex.quote(",".join(f"{pattern}={buffer}" for pattern, buffer in load.override_tensor)))
    if load.n_batch != default.n_batch:
        flags.append(f"-b {load.n_batch}")
    if load.n_ubatch is not None:
        flags.append(f"-ub {load.n_ubatch}")
    if load.flash_attn is not None:
        flags.append("-fa " + (load.flash_attn if isinstance(load.flash_attn, str) else
                               "on" if load.flash_attn else "off"))
    if load.cache_type_k != default.cache_type_k:
        flags.append(f"-ctk {load.cache_type_k}")
    if load.cache_type_v != default.cache_type_v:
        flags.append(f"-ctv {load.cache_type_v}")
    if load.repack is not None:
        flags.append("--repack" if load.repack else "--no-repack")
    if load.tensor_split:
        flags.append("-ts " + ",".join(f"{x:g}" for x in load.tensor_split))
    if load.rope_scaling:
        flags.append(f"--rope-scaling {load.rope_scaling}")
    if load.rope_freq_scale:
        flags.append(f"--rope-freq-scale {load.rope_freq_scale:g}")
    return " ".join(flags)


def _why(plan: Any, asked: int | None, asked_by: str | None, trained: bool = True) -> str:
    """How the plan's context came to be, as the plan line says it: the training context or the largest that
    fits (none asked); as asked, capped at the training context, rounded up to llama.cpp's multiple of 256 (down,
    past the largest a C int holds); and
    shrunk to fit, or to the floor with memory still short there (the verdict is "won't fit"), or to what the
    layers left on the GPU hold (they left it at the floor; the context then grew back)."""
    done = []
    if asked is not None and plan.capped:
        done.append("capped at the training context")
    elif asked is not None and plan.asked > asked:
        done.append("rounded up to a multiple of 256")
    elif asked is not None and plan.asked < asked:  # past MAX_CELLS: rounded up, it would pass llama.cpp's C int
        done.append("rounded down to a multiple of 256, the largest a C int holds")
    if plan.shrunk:
        from localgen.models.fit import MIN_CTX

        if plan.whole:
            done.append("shrunk to fit")
        elif not plan.fits:
            done.append(f"shrunk to the floor, still short of {plan.short_of}")
        elif plan.ctx <= MIN_CTX:  # (it fits: "still short" is a plan that does not)
            done.append("shrunk to the floor, with layers off the GPU")
        else:  # layers left the GPU at the floor; the context grew back to what that placement holds
            done.append("shrunk to fit, with layers off the GPU")
    if not plan.fits and not plan.shrunk:  # a context at or under the floor, and the model short all the same
        done.append(f"short of {plan.short_of}")
    if asked is None:
        if not plan.shrunk:
            start = "the training context" if trained else "the floor: the model names no training context"
            return ", ".join([start, *done])
        return "the largest that fits" if plan.whole else done[-1]
    if not done:
        from localgen.models.presets import WINDOW_WORDS

        return {**WINDOW_WORDS, "LOCALGEN_CTX": "as LOCALGEN_CTX asks",
                "trained": "the training context"}.get(asked_by or "", "as asked")
    by = {"preset": " by the preset", "ollama": " by its Ollama params", "models.toml": " by its models.toml entry",
          "LOCALGEN_CTX": " by LOCALGEN_CTX"}.get(asked_by or "", "")
    return ", ".join([f"{asked:,} asked{by}", *done])


def _experts_line(doc: dict[str, Any], load: Any) -> str:
    """Which layers' experts are in RAM, and their bytes: those of the first --n-cpu-moe layers (every layer's with
    --cpu-moe), and those of the layers kept on the CPU (llama.cpp offloads the last layers, so the first stay),
    whichever are more. With -ot, which may put any expert anywhere, the bytes alone. `load`: the settings the
    plan was made with (a preset's included)."""
    n_layer, ram = doc["model"]["layers"], format_bytes(doc["experts_in_ram"])
    if not doc["experts_in_ram"]:
        return "none in RAM"
    if not doc["gpu_layers"]:  # (a --n-cpu-moe then changes nothing: every layer is in RAM)
        return f"all in RAM ({ram}): no layer is on a GPU"
    if load.override_tensor:
        return f"in RAM: {ram}"
    by_flag = n_layer if load.cpu_moe else min(doc["n_cpu_moe"], n_layer)
    on_cpu = min(n_layer, max(n_layer + 1 - doc["gpu_layers"], 0))  # (the output layer is the first offloaded)
    n = max(by_flag, on_cpu)
    if not n:
        return f"in RAM: {ram}"
    first = "the first layer's" if n == 1 else "every layer's" if n == n_layer else f"the first {n} layers'"
    return f"{first} in RAM ({ram})" + (", as those layers are on the CPU" if on_cpu >= by_flag else "")


def _print(doc: dict[str, Any], load: Any, why: str) -> None:
    md, m = doc["model"], doc["machine"]
    trained = f"trained to {md['context_length']:,} tokens" if md["context_length"] else "no training context"
    print(f"model     {header_text(md['name'])} · {header_text(md['architecture'])}{' (MoE)' if md['moe'] else ''} · "
          f"{md['layers']} layers · {format_bytes(md['weights'])} of weights · {trained}")
    how = "described" if m["ram_described"] else "available here"
    gpus = " + ".join(format_bytes(g) for g in m["gpus"]) if m["gpus"] else "no GPU"
    kind = "unified memory" if m["unified"] else "GPU memory"
    gpus = f"{kind} {gpus}{' described' if m['gpus_described'] else ''}" if m["gpus"] else gpus
    print(f"machine   RAM {format_bytes(m['ram'])} {how} · {gpus}")
    seqs = f" × {doc['parallel']} sequences" if doc["parallel"] > 1 else ""
    print(f"plan      {doc['verdict']} · context {doc['ctx']:,} tokens ({why}){seqs}")
    if m["gpus"]:
        per = " + ".join(str(n) for n in doc["layers_per_gpu"])
        print(f"layers    {doc['gpu_layers']} of {md['layers'] + 1} on the GPU{'s' if len(m['gpus']) > 1 else ''} "
              f"({per} repeating{', and the output layer' if doc['gpu_layers'] else ''})")
    if md["moe"]:
        print(f"experts   {_experts_line(doc, load)}")
    rows = [["DEVICE", "WEIGHTS", "KV CACHE", "COMPUTE", "OUTPUT", "TOTAL", "BUDGET"]]
    for d in doc["devices"]:
        rows.append([d["device"], *(format_bytes(d[k]) for k in ("weights", "kv", "compute", "output", "total",
                                                                 "budget"))])
    print("\n".join(aligned(rows)))
    # an encoder (BERT) embeds and scores: run and chat refuse it
    print(f"flags     {doc['flags']}{'  (for embed and serve: an encoder does not generate)' if md['encoder'] else ''}")
