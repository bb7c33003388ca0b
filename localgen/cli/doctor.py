"""`localgen doctor`: the hardware, what this llama-cpp-python was built with, whether GPU offload
works, and the exact rebuild command when a GPU is present but the build cannot use it."""

from __future__ import annotations

import platform
import re
import sys
from typing import Annotated, Any

import typer

from localgen.cli import options as o
from localgen.cli.inputfile import check_model, env_source
from localgen.cli.options.knobs import Knobs, typed_by_user
from localgen.loadsettings import LOAD_KNOBS, rpc_servers

PLACEMENT = ("gpu_layers", "n_cpu_moe", "cpu_moe", "override_tensor")  # where the checked load puts the weights

REBUILD = {
    "cuda": 'scripts/install.sh --cuda   (or: CMAKE_ARGS="-DGGML_CUDA=on" pip install --no-cache-dir '
            "--force-reinstall --no-deps llama-cpp-python)",
    "metal": 'scripts/install.sh --metal   (or: CMAKE_ARGS="-DGGML_METAL=on" pip install --no-cache-dir '
             "--force-reinstall --no-deps llama-cpp-python)",
}


@o.with_knobs(sampling=False, load=PLACEMENT)
def doctor(
    ctx: typer.Context,
    check: Annotated[
        bool, typer.Option("--check/--no-check", help="Load the model (-m, else the default one) and generate a few "
                                                      "tokens.")
    ] = True,
    model: o.Model = None,
    rpc: o.Rpc = None,
    *,
    knobs: Knobs,
) -> None:
    """Check this machine and this build; exit 1 if something needs fixing. With -m (and the placement flags),
    check that model's load: what went where, experts in RAM included."""
    if not check:
        _refuse_typed_load_flags(ctx, knobs)
    servers = rpc_servers(rpc, env_source(ctx, "rpc") or "--rpc")  # LLAMA_ARG_RPC's value is named by the variable
    if check:  # a path to nothing: a usage error, as run's -m (--no-check loads nothing: LOCALGEN_MODEL's is unused)
        check_model("-m/--model", model)
    from localgen.models import catalogue
    from localgen.models.embedded import DEFAULT_MODEL

    found: list[str] = []  # what of the user's models.toml cannot be used: findings of doctor's, not warnings
    catalogue.warn_with(found.append)
    broken = catalogue.read().broken  # read whatever is checked: its findings are doctor's on every path
    checked = model if model is not None else DEFAULT_MODEL
    # the model to check broken by the user's catalogue, not named by a typed -m: a finding, and no check
    unusable = check and not typed_by_user(ctx, "model") and checked.partition("@")[0] in broken
    planned = _planned(model, knobs, servers) if check and not unusable else None  # a bad flag or name: one
    # error, before anything
    gpus, offload = _machine()
    from localgen import tuning

    problems = 0
    for problem in [*found, *filter(None, [tuning.problem(), _files_problem()])]:  # what needs fixing of the user's
        print(f"PROBLEM   {problem}")
        problems += 1
    if unusable:
        print(f"check     not run: {checked} cannot be used until the catalogue is fixed")
    if gpus and not offload:
        kind = "metal" if gpus[0].unified else "cuda"
        print("PROBLEM   a GPU is present but this llama-cpp-python cannot use it. Rebuild with:")
        print(f"          {REBUILD[kind]}")
        problems += 1
    problems += _check_rpc(servers)
    if planned is not None and not (servers and problems):
        problems += _smoke_test(offload and bool(gpus), servers, *planned)
    if problems:
        raise typer.Exit(1)


def _files_problem() -> str | None:
    """Where localgen keeps its files (chats, the log, presets, the Gemma it assembles on first use), when it cannot
    make or write them: each of those fails then, and nothing else says so before it does. A file is made and
    removed there to know."""
    import os
    import tempfile

    from localgen import paths
    from localgen.errors import LocalgenError

    try:  # (the data folder only: the config and state folders hold files only read, or kept where they can be)
        folder = paths.data_dir()
    except LocalgenError as e:  # no home folder to find
        return e.message
    try:
        paths.make_dirs(folder)
        fd, name = tempfile.mkstemp(dir=folder, prefix=".doctor-")
        os.close(fd)
        os.unlink(name)
    except OSError as e:
        return (f"localgen cannot write its files in {folder} ({e.strerror or e}): chats, the log, presets and "
                f"models assembled on first use fail there ({paths.home_hint()})")
    return None


def _machine() -> tuple[list[Any], bool]:
    """Print the machine and the build (CPU, RAM, GPUs, llama-cpp-python's features, libmtmd); the GPUs found,
    and whether this build offloads to a GPU."""
    import localgen
    from localgen import hardware
    from localgen.native.devices import backend_info
    from localgen.units import format_bytes

    ram = hardware.total_ram_bytes() or 0
    avail = hardware.available_ram_bytes() or 0
    print(f"localgen {localgen.__version__} · Python {platform.python_version()} · {platform.system()} "
          f"{platform.machine()}")
    print(f"CPU       {hardware.cpu_name()} · threads: {hardware.physical_cores()} for generation (physical "
          f"performance cores), {hardware.usable_cores()} for prompts and batches (logical CPUs usable)")
    limited = hardware.memory_limit()
    print(f"RAM       {format_bytes(ram)} ("
          f"{f'{format_bytes(avail)} available' if avail else 'available: not reported'})"
          + (" · the container's memory limit (cgroup): plans and serve's loads keep within it"
             if limited and limited[0] <= ram else ""))
    gpus, left_out = hardware.gpu_listing()
    if gpus:
        for g in gpus:
            if g.unified:
                print(f"GPU       {g.name} · Metal may use {format_bytes(g.total)} of the RAM (free: not reported; "
                      "the RAM line's available is what is free)")
            elif g.total is None or g.free is None:
                print(f"GPU       {g.name} · memory not reported by nvidia-smi ([N/A]: MIG or unified memory); "
                      "plans ask llama.cpp's CUDA backend, else keep the model off it")
            else:
                print(f"GPU       {g.name} · {format_bytes(g.total)} ({format_bytes(g.free)} free)")
        if left_out:
            print(f"GPU       {left_out}")
    else:
        print(f"GPU       none found ({hardware.why_no_gpu()})")
    info = backend_info()
    offload = bool(info["gpu_offload"])
    print(f"build     llama-cpp-python {info['llama_cpp_python']} · GPU offload: "
          f"{'yes' if offload else 'no (CPU-only build)'} · mmap: {'yes' if info['mmap'] else 'no'} · RPC: "
          f"{'yes' if info['rpc'] else 'no'}")
    print(f"features  {info['system_info']}")
    from localgen.native.mtmd import available

    missing = available()
    if missing:
        print(f"media     images and audio: no · {missing}; scripts/install.sh builds it")
    else:
        print("media     images and audio: yes (libmtmd; a model reads them with its projector: --mmproj, or a "
              "vision or audio model from the catalogue)")
    return list(gpus), offload


def _refuse_typed_load_flags(ctx: typer.Context, knobs: Knobs) -> None:
    """--no-check loads nothing: -m or a placement flag typed with it is a usage error. Typed flags only:
    LOCALGEN_MODEL and LLAMA_ARG_* are defaults, exported for every command."""
    from localgen.errors import UsageError

    given = [k.flags[0] for n, k in LOAD_KNOBS.items() if n in PLACEMENT and knobs.typed(n)]
    if typed_by_user(ctx, "model") or given:
        named = ["-m", *given] if typed_by_user(ctx, "model") else given
        one = len(named) == 1
        raise UsageError(f"{', '.join(named)} {'says' if one else 'say'} what --check loads; "
                         f"{'it means' if one else 'they mean'} nothing with --no-check")


def _check_rpc(servers: tuple[str, ...]) -> int:
    """Each RPC server: reachable, same protocol, and the devices it brings."""
    from localgen.errors import LocalgenError
    from localgen.native import devices

    problems = 0
    for endpoint in servers:
        try:
            major, minor, patch = devices.rpc_hello(endpoint)
        except LocalgenError as e:
            print(f"PROBLEM   {e.message}" + (f" ({e.hint})" if e.hint else ""))
            problems += 1
            continue
        print(f"RPC       {endpoint} · protocol {major}.{minor}.{patch}: ok")
    return problems


def settings_line(params: Any, origins: dict[str, str]) -> str:
    """Each tunable load setting, its value and where it came from (flag, tuning record, rule)."""
    from localgen.tuning import TUNABLE

    def shown(name: str) -> str:
        v = getattr(params, name)
        return ("on" if v else "off") if isinstance(v, bool) else str(v)

    # a record made on a busy machine says so in each setting's origin: said once, at the end (it was five times)
    busy = {m.group(0) for o in origins.values() if (m := re.search(r" on a busy machine \(.*\)$", o))}
    note = busy.pop() if len(busy) == 1 else ""

    def origin_of(name: str) -> str:  # a reason's own aside joins it with a comma: `(rule: off, 0% of ...)`
        origin = origins.get(name, "default")
        return re.sub(r" \(([^()]*)\)", r", \1", origin.removesuffix(note) if note else origin)

    line = " · ".join(f"{name} {shown(name)} ({origin_of(name)})" for name in TUNABLE)
    return line + (f" · the record was made{note}" if note else "")


def placement_line(record: dict[str, Any]) -> str:
    """What went where, from llama.cpp's load log: weights by buffer, layers offloaded, what -ot, --cpu-moe and
    --n-cpu-moe moved."""
    parts = [" · ".join(f"{buf} {mib:,.1f} MiB" for buf, mib in record["weights_mib"].items()) or "no weights"]
    parts.append(record["offloaded"] or "no layers on a GPU")
    for buf, moved in record["moved"].items():
        parts.append(f"{moved['tensors']} tensors ({moved['experts']} of experts, {moved['mib']:,.1f} MiB) moved "
                     f"to {buf}")
    return " · ".join(parts)


def _planned(model: str | None, knobs: Knobs, rpc: tuple[str, ...]) -> tuple[Any, Any]:
    """The model to check and its load settings as `run` takes them: the placement flags over a preset's."""
    from localgen.cli.options import preset
    from localgen.models.resolve import resolve

    load = knobs.load(n_ctx=512, rpc=rpc)
    from localgen.errors import NotDownloadedError

    try:
        ref = resolve(model, offline=True, pull_missing=False)
    except NotDownloadedError as e:  # not "offline", which the user never asked for
        raise NotDownloadedError(f"{e.name} is not downloaded", name=e.name,
                                 hint=f"doctor downloads nothing: `localgen pull {e.name}` first") from None
    return ref, preset.load_params(ref, load, knobs.given)


def _encode(engine: Any) -> str:
    """An encoder's check: a sentence embedded (or, a reranker's, a pair scored), said as the check line says it;
    a LocalgenError where its output is not numbers."""
    import math

    from localgen.engine.embed import Embedder
    from localgen.errors import LocalgenError

    try:
        emb = Embedder(engine, scores=True)
        tokens, what = emb.pair_tokens("What colour is the sky?", "The sky is blue."), "scored a pair"
    except LocalgenError:  # not a reranker: embeddings
        emb = Embedder(engine)
        tokens, what = emb.tokens("The sky is blue.", False), "embedded a sentence"
    try:
        vector = next(iter(emb.embed([tokens], normalize=False))).vector
    finally:
        emb.close()
    if not len(vector) or not all(math.isfinite(float(x)) for x in vector):
        raise LocalgenError(f"its {'score' if what == 'scored a pair' else 'embedding'} is not a number")
    return f"{what} ({len(tokens)} tokens{f', {len(vector):,} dimensions' if what != 'scored a pair' else ''})"


def _smoke_test(gpu: bool, rpc: tuple[str, ...], ref: Any, load: Any) -> int:
    """Load the model as `run` would (by its plan) and generate a few tokens; 1 when it does not run."""
    from localgen.errors import LocalgenError
    from localgen.models.load import open_engine
    from localgen.native.prompt import Prompt
    from localgen.types import SamplingParams

    try:
        engine = open_engine(ref, load)
        if engine.encoder_only:  # an embedding model or a reranker: no text to generate, its own output instead
            made = _encode(engine)
        else:
            prompt = Prompt.text(engine.raw_tokens("The sky is"))
            gen = engine.generate(prompt, SamplingParams(temperature=0, max_tokens=16))
            for _ in gen:
                pass
            s = gen.stats
            rate = f"{s.decode_tps:.1f} tok/s" if s and s.decode_tps else "?"
            made = f"generated {s.completion_tokens if s else 0} tokens at {rate}"
        engine.close()
    except LocalgenError as e:
        print(f"PROBLEM   {ref.name} does not run: {e.message}")
        return 1
    where = "CPU"
    if gpu and engine.params.n_gpu_layers != 0:  # (-ngl 0, or a plan with no room: the CPU, as asked)
        offloaded = engine.load_report.offloaded  # "offloaded 31/31 layers to GPU" (native/report.py)
        where = offloaded or "GPU (layer count not reported)"
        if not offloaded:
            print("PROBLEM   the load did not report layers offloaded to the GPU; run with --verbose to see why")
            return 1
    if rpc:
        where = " · ".join(f"{dev} {mib:,.1f} MiB" for dev, mib in engine.placement.items())
    print(f"check     {ref.name} loaded in {engine.load_s:.2f} s and {made} on {where}: ok")
    print("placement " + placement_line(engine.load_report.record()))
    print("settings  " + settings_line(engine.params, engine.origins))
    sys.stdout.flush()
    return 0
