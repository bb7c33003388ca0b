"""`localgen bench`: llama-bench's tests and sweeps plus load, TTFT, latency and memory; its history and compare
subcommands are bench/past.py's."""

from __future__ import annotations

import os
import re
import shlex
import sys
from typing import Annotated, Any

import typer

from localgen.cli import options as o
from localgen.cli.bench import past
from localgen.cli.bench import remote as remote_sweep
from localgen.cli.bench.options import (
    KLD_BOUND,
    QUALITY_CTX,
    BenchRemote,
    Measuring,
    Quality,
    ServingSweep,
    Values,
    sweep,
)
from localgen.cli.bench.view import ProgressView, emit
from localgen.cli.inputfile import env_source
from localgen.cli.options.knobs import Knobs
from localgen.cli.signals import term_as_interrupt
from localgen.cli.stopping import Stopped, stop_on_sigint
from localgen.errors import LocalgenError, UsageError
from localgen.loadsettings import LOAD_KNOBS, rpc_servers

OT_ENV = str(LOAD_KNOBS["override_tensor"].envvar)  # LLAMA_ARG_OVERRIDE_TENSOR, the default -ot, as run reads it

bench_app = typer.Typer(
    help="Benchmark models and settings (llama-bench compatible), keep the results, compare runs.",
    invoke_without_command=True, no_args_is_help=False, add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)



@bench_app.callback()
@o.with_knobs(sampling=False, load=("cpu_moe", "kv_unified"))  # run's --cpu-moe, in every configuration; -npl's cells
def bench(
    ctx: typer.Context,
    model: Annotated[Values, sweep("--model", "-m", help="Models: names, repos, paths (default: LOCALGEN_MODEL, one "
                                                         "model, else smollm2:135m).")] = None,
    n_prompt: Annotated[Values, sweep("--n-prompt", "-p", help="Prompt lengths for pp tests (default 512).")] = None,
    n_gen: Annotated[Values, sweep("--n-gen", "-n", help="Generation lengths for tg tests (default 128).")] = None,
    pg: Annotated[Values, sweep("--prompt-gen", "-pg", help="PROMPT,GEN pairs for combined tests.")] = None,
    n_depth: Annotated[Values, sweep("--n-depth", "-d", help="Context depths to test at (default 0).")] = None,
    threads: Annotated[Values, sweep("--threads", "-t", help="CPU threads (default: the model's tuning "
                                                              "record, else the physical cores this process may "
                                                              "use).")] = None,
    ngl: Annotated[Values, sweep("--n-gpu-layers", "-ngl", help="GPU layers, -1 all (default all if offload).")] = None,
    mg: Annotated[Values, sweep("--main-gpu", "-mg", help="Main GPU, as llama-bench's -mg (default 0): "
                                                         "passed to each load and recorded; llama.cpp's layer "
                                                         "split, bench's, does not use it.")] = None,
    ncmoe: Annotated[Values, sweep("--n-cpu-moe", "-ncmoe", help="Layers whose mixture-of-experts weights stay in "
                                                                "RAM, the first ones (default: LLAMA_ARG_N_CPU_MOE, "
                                                                "else 0).")] = None,
    ot: Annotated[Values, sweep("--override-tensor", "-ot", help="Tensor placements, as llama-bench's -ot: "
                                                                "PATTERN=BUFFER pairs joined by ';', placements by "
                                                                "',' (an empty one: none; default: "
                                                                "LLAMA_ARG_OVERRIDE_TENSOR, one placement as run "
                                                                "takes it, else none).")] = None,
    batch: Annotated[Values, sweep("--batch-size", "-b", help="Logical batch (default 2048).")] = None,
    ubatch: Annotated[Values, sweep("--ubatch-size", "-ub",
                                    help="Physical batch (default: the model's tuning record, else 512).")] = None,
    fa: Annotated[Values, sweep("--flash-attn", "-fa", help="Flash attention 0/1 (default: the model's "
                                                                      "tuning record, else the rule; see `localgen "
                                                                      "tune`).")] = None,
    ctk: Annotated[Values, sweep("--cache-type-k", "-ctk", help="KV key types (default f16).")] = None,
    ctv: Annotated[Values, sweep("--cache-type-v", "-ctv", help="KV value types (default f16).")] = None,
    parallel: Annotated[Values, sweep("--parallel", "-npl", "--concurrency",
                                      help="Sequences decoded together: aggregate rates (with --endpoint: requests in "
                                           "flight).")] = None,
    offline: o.Offline = False,
    rpc: o.Rpc = None,
    *,
    measuring: Measuring,
    remote: BenchRemote,
    serving: ServingSweep,
    quality: Quality,
    knobs: Knobs,
) -> None:
    """Run benchmarks. With no subcommand this measures; `history` and `compare` read past runs.

    With --endpoint URL it measures a running OpenAI-compatible server from the client instead, as `vllm bench
    serve` does: -npl/--concurrency and --request-rate sweeps, -p prompt and -n answer lengths; output
    tokens/s, requests/s, and time to first token, inter-token and end-to-end latency at p50/p90/p99.
    """
    if ctx.invoked_subcommand is not None:
        return
    from localgen.bench import records

    if measuring.output is not None and measuring.output not in records.FORMATS:
        raise UsageError(f"--output must be one of {', '.join(records.FORMATS)}, not {measuring.output!r}")
    if quality.quality is not None or quality.reference is not None:
        unused = {"--prompt-gen": pg, "--n-depth": n_depth, "--main-gpu": mg, "--n-cpu-moe": ncmoe,
                  "--override-tensor": ot, "--batch-size": batch, "--ubatch-size": ubatch, "--flash-attn": fa,
                  "--cache-type-k": ctk,
                  "--cache-type-v": ctv, "--parallel": parallel, "--rpc": rpc, "--endpoint": remote.endpoint,
                  "--api-key-env": remote.api_key_env, "--request-rate": serving.request_rate,
                  "--num-prompts": serving.num_prompts, "--same-prompt": serving.same_prompt,
                  "--exact/--no-exact": measuring.exact is not None, "--no-e2e": not measuring.e2e,
                  "--cpu-moe": knobs.get("cpu_moe") and knobs.typed("cpu_moe"),
                  "--kv-unified/--no-kv-unified": knobs.typed("kv_unified")}
        bad = [flag for flag, v in unused.items() if v]
        if bad:
            raise UsageError(f"--quality does not take {', '.join(bad)}", hint="it takes -m, --reference, --ctx, "
                             "--chunks, --kld-bound, one -p, -n, -t and -ngl, -r, -o and --offline")
        _measure_quality(model, quality, n_prompt, n_gen, threads, ngl, measuring.reps, offline, measuring.output)
        return
    given = [flag for flag, on in (("--ctx", quality.quality_ctx is not None),
                                   ("--chunks", quality.chunks is not None),
                                   ("--kld-bound", quality.kld_bound is not None)) if on]
    if given:  # a speed sweep would ignore them
        raise UsageError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for --quality",
                         hint="add --quality TEXT --reference SOURCE, or leave them out")
    if remote.endpoint or any(remote_sweep.is_named_endpoint(m) for m in model or _env_model()):
        local = {"--threads": threads, "--n-gpu-layers": ngl, "--main-gpu": mg, "--n-cpu-moe": ncmoe,
                 "--override-tensor": ot,
                 "--cpu-moe": knobs.get("cpu_moe") and knobs.typed("cpu_moe"), "--batch-size": batch,
                 "--ubatch-size": ubatch, "--flash-attn": fa, "--cache-type-k": ctk, "--cache-type-v": ctv,
                 "--n-depth": n_depth, "--prompt-gen": pg, "--rpc": rpc,
                 "--exact/--no-exact": measuring.exact is not None,
                 "--kv-unified/--no-kv-unified": knobs.typed("kv_unified")}
        bad = [flag for flag, v in local.items() if v]
        if bad:
            raise UsageError(f"{', '.join(bad)} cannot be used with --endpoint (the server loads the model)")
        remote_sweep.measure(remote.endpoint, remote.api_key_env, model or _env_model(), parallel, serving.request_rate,
                        serving.num_prompts, n_prompt, n_gen, measuring.output, serving.same_prompt)
        return
    if serving.request_rate or serving.num_prompts or remote.api_key_env or serving.same_prompt:
        raise UsageError("--request-rate, --num-prompts, --same-prompt and --api-key-env go with --endpoint URL")
    servers = rpc_servers(rpc, env_source(ctx, "rpc") or "--rpc")  # a malformed --rpc: a usage error before any plan
    plan = _plan(model=model, threads=threads, ngl=ngl, mg=mg, ncmoe=ncmoe, ot=ot, cmoe=knobs.get("cpu_moe"),
                 batch=batch, ubatch=ubatch, fa=fa, ctk=ctk, ctv=ctv, n_prompt=n_prompt, n_gen=n_gen, pg=pg,
                 n_depth=n_depth,
                 reps=measuring.reps, e2e=measuring.e2e, parallel=parallel, rpc=rpc, exact=measuring.exact,
                 kv_unified=knobs.get("kv_unified"), kv_typed=knobs.typed("kv_unified"))
    _measure(plan, measuring.output, offline, servers)


def _measure_quality(models: Values, q: Quality, n_prompt: Values, n_gen: Values, threads: Values, ngl: Values,
                     reps: int, offline: bool, output: str | None) -> None:
    """bench --quality TEXT --reference SOURCE: the ladder's table (quant/ladder.py) for the -m files."""
    from localgen.bench import sweep
    from localgen.cli.ladderview import run_ladder
    from localgen.models.resolve import resolve
    from localgen.quant import ladder
    from localgen.quant import measure as ms
    from localgen.quant.text import MeasureText, default_text, read_text

    if q.quality is None or q.reference is None:
        raise UsageError("--quality TEXT and --reference SOURCE go together")
    names = _models(sweep.str_values("--model", models, _env_model()), typed=bool(models))
    if not names:
        raise UsageError("--quality measures the -m models: give -m a.gguf,b.gguf,...")
    one = {flag: sweep.int_values(flag, v, []) for flag, v in
           (("--n-prompt", n_prompt), ("--n-gen", n_gen), ("--threads", threads), ("--n-gpu-layers", ngl))}
    many = [flag for flag, v in one.items() if len(v) > 1]
    if many:
        raise UsageError(f"--quality takes one value of {', '.join(many)}")
    t = one["--threads"][0] if one["--threads"] else None
    ngl_one = one["--n-gpu-layers"][0] if one["--n-gpu-layers"] else None
    speed = ladder.Speed(n_prompt=(one["--n-prompt"] or [512])[0], n_gen=(one["--n-gen"] or [128])[0], reps=reps,
                         threads=t)
    text: MeasureText | str = default_text() if q.quality == "default" else read_text(q.quality, q.chunks)
    reference = resolve(q.reference, offline=offline)
    files = [resolve(m, offline=offline) for m in names]
    # the speed columns' plan (-p 0 -n 0: none), checked as a sweep's is, before the minutes of perplexity first
    ladder.check_speed(speed, {m: f.summary.context_length
                               for m, f in zip([q.reference, *names], [reference, *files], strict=True)})
    n_ctx = q.quality_ctx if q.quality_ctx is not None else QUALITY_CTX
    settings = ms.Settings(ctx=n_ctx, batch=ms.fitting_batch(n_ctx), chunks=q.chunks, threads=t,
                           gpu_layers=ngl_one)
    # a text too short for two windows, refused before the reference is measured (its vocabulary alone is read), as
    # quantize --ladder --measure refuses it
    ms.check_text(reference, text, n_ctx, q.chunks)
    run_ladder(reference, files, text, q.quality, settings, speed, q.kld_bound if q.kld_bound is not None
               else KLD_BOUND, output)


def _plan(**flags: Any) -> Any:
    """The sweep: every combination of the flags' values, with llama-bench's defaults."""
    from localgen.bench import sweep
    from localgen.native.devices import backend_info
    from localgen.types import KV_CACHE_TYPES

    offload = bool(backend_info()["gpu_offload"])
    kv = list(KV_CACHE_TYPES)
    parallel = sweep.int_values("--parallel", flags["parallel"], [])
    # --kv-unified typed without -npl is a usage error; LLAMA_ARG_KV_UNIFIED, exported for every load, applies
    # only where there are -npl sequences to lay out
    kvu = flags.get("kv_unified") if flags.get("kv_typed") or any(n > 1 for n in parallel) else None
    return sweep.build(
        models=_models(sweep.str_values("--model", flags["model"], _env_model() or ["smollm2:135m"]),
                       typed=bool(flags["model"])),
        # threads, physical batch and flash attention not given: the load's defaults (tuning record, else rule)
        threads=sweep.int_values("--threads", flags["threads"], []) or [None],
        ngl=sweep.int_values("--n-gpu-layers", flags["ngl"], [-1 if offload or flags.get("rpc") else 0]),
        mg=sweep.int_values("--main-gpu", flags["mg"], [0]),
        batch=sweep.int_values("--batch-size", flags["batch"], [2048]),
        ubatch=sweep.int_values("--ubatch-size", flags["ubatch"], []) or [None],
        fa=sweep.bool_values("--flash-attn", flags["fa"], []) or [None],
        ctk=sweep.str_values("--cache-type-k", flags["ctk"], ["f16"], kv),
        ctv=sweep.str_values("--cache-type-v", flags["ctv"], ["f16"], kv),
        prompts=sweep.int_values("--n-prompt", flags["n_prompt"], [512]),
        gens=sweep.int_values("--n-gen", flags["n_gen"], [128]),
        pg=sweep.pairs("--prompt-gen", flags["pg"]), depths=sweep.int_values("--n-depth", flags["n_depth"], [0]),
        reps=flags["reps"], e2e=flags["e2e"], parallel=parallel,
        exact=flags.get("exact"), ncmoe=sweep.int_values("--n-cpu-moe", flags["ncmoe"], _env_ncmoe()),
        ot=_placements(flags["ot"], bool(flags.get("rpc"))), cmoe=flags["cmoe"], kv_unified=kvu,
    )


def _models(names: list[str], typed: bool) -> list[str]:
    """The -m models (LOCALGEN_MODEL's, not `typed`), each that is a path there to read (a usage error before
    anything loads, as run's -m)."""
    from localgen.cli.inputfile import check_model

    for name in names:
        check_model("-m/--model", name, env=None if typed else "LOCALGEN_MODEL")
    return names


def _env_model() -> list[str]:
    """LOCALGEN_MODEL, the default -m: one model, as run reads it (a comma in it makes no list)."""
    name = os.environ.get("LOCALGEN_MODEL")
    if name and "," in name and not os.path.lexists(name):  # no model's name has a comma; a file's may
        raise UsageError(f"LOCALGEN_MODEL names one model, not a list ({name[:200]!r})",
                         hint=f"give bench several with -m: -m {name[:200]}")
    return [name] if name else []


def _env_ncmoe() -> list[int]:
    """LLAMA_ARG_N_CPU_MOE, the default -ncmoe: one number of layers, as run and llama.cpp read it; else 0."""
    text = os.environ.get("LLAMA_ARG_N_CPU_MOE", "").strip()
    if not text:
        return [0]
    if not re.fullmatch(r"[0-9]+", text):
        raise UsageError(f"LLAMA_ARG_N_CPU_MOE takes a number of layers (0 or more), not {text!r}")
    from localgen.bench.sweep import C_INT, in_range

    in_range("LLAMA_ARG_N_CPU_MOE", [int(text)], 0, C_INT)  # named as run names it: no --n-cpu-moe was typed
    return [int(text)]


def _env_placements() -> list[Any]:
    """LLAMA_ARG_OVERRIDE_TENSOR, the default -ot: one placement, its PATTERN=BUFFER pairs comma-separated as
    run and llama.cpp read them (not a sweep of placements as bench's -ot is); else none."""
    from localgen import placement

    text = os.environ.get(OT_ENV)
    return [placement.parse(text, OT_ENV)] if text else [()]


def _placements(ot: Values, rpc: bool) -> list[Any]:
    """-ot's placements, their buffer types checked against this build's devices (RPC servers' once they are
    registered: the load checks those)."""
    from localgen.bench import sweep

    placements = sweep.placements("--override-tensor", ot) if ot else _env_placements()
    buffers = [b for pairs in placements for _, b in pairs]
    if buffers and not rpc:
        from localgen.native import devices

        # a placement LLAMA_ARG_OVERRIDE_TENSOR gave: its error names the variable
        devices.check_buffers(buffers, "--override-tensor" if ot else OT_ENV)
    return placements


@term_as_interrupt()
def _measure(plan: Any, output: str | None, offline: bool, rpc: tuple[str, ...] = ()) -> None:
    """Run the plan, keeping each result in the history as it comes; print them. A SIGTERM or SIGHUP (`timeout`)
    stops it as Ctrl-C does, what was measured shown; the process then ends by that signal."""
    from localgen.bench import history, records, sweep
    from localgen.bench.bandwidth import remembered
    from localgen.bench.runner import run
    from localgen.cli.ladderview import kept_where
    from localgen.cli.output import ErrWriter, plural
    from localgen.cli.progress import make_progress
    from localgen.models.resolve import resolve
    from localgen.native.lib import last_words as last_words_on_abort

    refs = {m: resolve(m, offline=offline, progress=make_progress()) for m in {c.model for c in plan.configs}}
    sweep.check_context(plan, {m: ref.summary.context_length for m, ref in refs.items()})
    system = records.system_info()
    if rpc:
        system["backends"] += "+RPC"
        system["rpc"] = list(rpc)
    system["bandwidth"] = remembered()
    recording = history.start(shlex.join(["localgen", "bench", *sys.argv[2:]]), system)
    results: list[dict[str, Any]] = []
    kept = 0  # of them, in the history
    interrupted = False
    failed: LocalgenError | None = None
    err = ErrWriter()

    def last_words() -> None:  # llama.cpp aborting (an RPC server gone) ends the process: the rows measured first
        view.end()
        if results and output != "jsonl":
            emit(results, system, output)
        if results:
            err.line(f"{plural(len(results), 'result')} measured; {kept_where(kept, len(results), recording.id)}")

    with stop_on_sigint() as stop, last_words_on_abort(last_words):
        view = ProgressView.of(plan, stop)
        try:
            for result in run(plan, view, system["bandwidth"], open_model=refs.__getitem__,  # type: ignore[arg-type]
                              rpc=rpc):
                rec = records.record(result, system)
                results.append(rec)
                if output == "jsonl":  # one line per result as it is measured, for pipelines
                    sys.stdout.write(records.FORMATS["jsonl"]([rec]))
                    sys.stdout.flush()
                history.add(recording, kept, rec)
                kept += 1
                view.row(rec, len(results))
        except (Stopped, KeyboardInterrupt):
            interrupted = True
        except LocalgenError as e:  # a later model that does not load, a history that cannot be written
            failed = e
        finally:
            view.end()
    if interrupted and not results:  # a test stopped part-way is a row of the repetitions it measured
        err.line("interrupted before the first repetition was measured: nothing saved")
        raise typer.Exit(130)
    if failed is not None:  # the rows measured before it are shown, and said which are kept, then the error
        if results and output != "jsonl":
            emit(results, system, output)
        if results:
            err.line(f"{plural(len(results), 'result')} measured; {kept_where(kept, len(results), recording.id)}")
        raise failed
    emit(results, system, output)
    if recording.id is not None:
        err.line(f"saved as run {recording.id}: localgen bench history {recording.id}")
    if interrupted:
        last = results[-1]
        cut = (f" ({last['test']} holds {last['repetitions']:,} of its {last['repetitions_planned']:,} repetitions)"
               if records.stopped_note(last) else "")
        err.line(f"interrupted; the results above were measured and kept{cut}")
        raise typer.Exit(130)


bench_app.command("history")(past.history_cmd)
bench_app.command("compare")(past.compare_cmd)
