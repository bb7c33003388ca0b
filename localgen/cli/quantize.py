"""`localgen quantize`: llama.cpp's own quantizer (llama-quantize's types and options), the result kept as NAME:TYPE
in `localgen list`; with --ladder, several types made and measured against the source in one table."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from localgen.cli import options as o
from localgen.cli.inputfile import check_input, check_model, input_path
from localgen.cli.perplexity import ChunksOpt, CtxOpt, GpuOpt
from localgen.errors import UsageError

LADDER_DEFAULT = "Q8_0,Q6_K,Q5_K_M,Q4_K_M,Q3_K_M"
LADDER = "Ladder (--ladder TYPES: each type made and measured against the source)"


def quantize(
    cmd: typer.Context,
    source: Annotated[str, typer.Argument(help="The model to quantize: an F16/BF16/F32 GGUF path, or any model "
                                               "name run takes.", show_default=False, metavar="SOURCE")],
    type_name: Annotated[str | None, typer.Argument(
        metavar="TYPE", show_default=False,
        help="llama-quantize's type name, any case (Q4_K_M, q8_0, IQ4_XS, ...) or its number.")] = None,
    output: Annotated[str | None, typer.Option(
        "--output", "-o", show_default=False, metavar="PATH",
        help="Write the result here instead of localgen's models (where `list` shows it as NAME:TYPE); a folder, "
             "or a name ending in /, gets NAME-TYPE.gguf inside it (made where it is not there).")] = None,
    name: Annotated[str | None, typer.Option(
        "--name", show_default=False,
        help="NAME of the result, NAME:TYPE in `localgen list` (default: from the source's name).")] = None,
    threads: Annotated[int | None, typer.Option("--threads", "-t", min=1, max=1024, show_default=False,
                                                help="Threads (default: every CPU this process may use).")] = None,
    allow_requantize: Annotated[bool, typer.Option(
        "--allow-requantize", help="Quantize a source that is already quantized (loses more quality).")] = False,
    leave_output_tensor: Annotated[bool, typer.Option(
        "--leave-output-tensor", help="Leave output.weight un(re)quantized.")] = False,
    pure: Annotated[bool, typer.Option(
        "--pure", help="No k-quant mixtures: every tensor to the one type.")] = False,
    output_tensor_type: Annotated[str | None, typer.Option(
        "--output-tensor-type", metavar="GGML_TYPE", show_default=False,
        help="ggml type for output.weight (q8_0, f16, ...).")] = None,
    token_embedding_type: Annotated[str | None, typer.Option(
        "--token-embedding-type", metavar="GGML_TYPE", show_default=False,
        help="ggml type for the token embeddings.")] = None,
    imatrix: Annotated[Path | None, typer.Option(
        "--imatrix", path_type=str, callback=input_path, show_default=False, metavar="FILE",
        help="An importance matrix (llama-imatrix's, GGUF or the older format).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace a result that exists.")] = False,
    ladder_types: Annotated[str | None, typer.Option(
        "--ladder", rich_help_panel=LADDER, show_default=False, metavar="TYPES",
        help=f"Make each of these types (comma-separated, e.g. {LADDER_DEFAULT}) and measure each against the "
             "source: size, speed, PPL, KL divergence, top-1 agreement, fit.")] = None,
    measure: Annotated[str | None, typer.Option(
        "--measure", rich_help_panel=LADDER, show_default=False, metavar="TEXT",
        help="--ladder: the text to measure on (default: the text localgen ships).")] = None,
    ctx: CtxOpt = 512,
    chunks: ChunksOpt = None,
    kld_bound: Annotated[float, typer.Option("--kld-bound", rich_help_panel=LADDER, min=0.0,
                                             help="--ladder: the mean KLD the verdict accepts.")] = 0.05,
    n_prompt: Annotated[int, typer.Option("--n-prompt", "-p", rich_help_panel=LADDER, min=0,
                                          help="--ladder: pp test length.")] = 512,
    n_gen: Annotated[int, typer.Option("--n-gen", "-n", rich_help_panel=LADDER, min=0,
                                       help="--ladder: tg test length.")] = 128,
    reps: Annotated[int, typer.Option("--repetitions", "-r", rich_help_panel=LADDER, min=1,
                                      help="--ladder: repetitions of each.")] = 3,
    gpu_layers: GpuOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
    offline: o.Offline = False,
    verbose: o.Verbose = False,
) -> None:
    """Quantize a model with llama.cpp's own quantizer: the same types and results as llama-quantize. Ctrl-C stops
    at once and leaves nothing behind."""
    from localgen.models import quantized
    from localgen.models.resolve import resolve
    from localgen.native import logs

    logs.set_echo(verbose)
    if (type_name is None) == (ladder_types is None):
        raise UsageError("give a TYPE, or --ladder TYPES" if type_name is None else
                         "give a TYPE or --ladder TYPES, not both")
    if ladder_types is not None and output is not None:
        raise UsageError("--ladder keeps each type in localgen's models; -o names one file")
    if ladder_types is None:
        _refuse_ladder_options(cmd)
    if name is not None:
        quantized.check_base(name)
    from localgen.quant import quantize as q

    asked = [type_name] if type_name is not None else [t for t in (ladder_types or "").split(",") if t.strip()]
    for t in asked:  # the types before the source is found (or pulled)
        q.parse_type(t)
    check_model("SOURCE", source)  # a path to nothing: a usage error, as run's -m
    ref = resolve(source, offline=offline)
    src = Path(ref.path)
    base = name or quantized.base_for(ref.name if ref.source != "path" else source)

    opts = q.Options(threads=threads or _cores(), allow_requantize=allow_requantize,
                     leave_output_tensor=leave_output_tensor, pure=pure, output_tensor_type=output_tensor_type,
                     token_embedding_type=token_embedding_type, imatrix=imatrix, force=force)
    if ladder_types is None:
        assert type_name is not None
        made = make(src, type_name, base, output, opts)
        _report(made, json_out)
        return
    _ladder(ref, src, base, ladder_types, opts, measure, ctx, chunks, kld_bound, n_prompt, n_gen, reps, threads,
            gpu_layers, json_out, verbose)


def _refuse_ladder_options(cmd: typer.Context) -> None:
    """The ladder's own options given to a single quantization: refused, as bench refuses --ctx without --quality,
    rather than ignored in silence (a --measure file that is not there included)."""
    from localgen.cli.options.knobs import given_by_user

    given = [flag for param, flag in (("measure", "--measure"), ("ctx", "--ctx"), ("chunks", "--chunks"),
                                      ("kld_bound", "--kld-bound"), ("n_prompt", "-p"), ("n_gen", "-n"),
                                      ("reps", "-r"), ("gpu_layers", "-ngl")) if given_by_user(cmd, param)]
    if given:
        raise UsageError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for --ladder",
                         hint="add --ladder TYPES, or leave them out")


def _cores() -> int:
    from localgen import hardware

    return hardware.usable_cores()


def target(base: str, type_name: str, output: str | None) -> tuple[Path, str | None, Path | None]:
    """Where a result goes, its model name (None for a file of the user's, -o) and the outermost folder made for
    it (None where none was). A name ending in a slash is a folder, made where it is not there."""
    from localgen import paths
    from localgen.models import presets, quantized

    if output is not None:
        out = Path(output).expanduser()
        made = None
        if output.endswith(("/", os.sep)) and not out.is_dir():
            if out.exists():
                raise UsageError(f"{out} is not a folder")
            made = out
            while not made.parent.exists():
                made = made.parent
            try:
                out.mkdir(parents=True)
            except OSError as e:
                raise UsageError(f"cannot make the folder {out}: {e.strerror}") from None
        if out.is_dir():
            out = out / f"{base}-{type_name}.gguf"
        return out, None, made
    name = quantized.name_of(base, type_name)
    presets.check_quantized_name(name)
    folder = quantized.folder()
    paths.make_dirs(folder)
    return quantized.path_for(name), name, None


def _unmake(folder: Path, made: Path) -> None:
    """Remove the empty folders target() made, from `folder` up to `made`, so a refused plan leaves nothing."""
    with contextlib.suppress(OSError):
        while True:
            folder.rmdir()
            if folder == made:
                return
            folder = folder.parent


def make(src: Path, type_text: str, base: str, output: str | None, opts: Any) -> Any:
    """Plan and run one quantization with a progress bar; a failure or Ctrl-C removes what it wrote (the folders
    it made too) and Ctrl-C exits at once."""
    job, model_name, made = prepare(src, type_text, base, output, opts)
    try:
        return run_job(job, model_name, made)
    except BaseException:
        if made is not None:
            _unmake(job.out.parent, made)
        raise


def prepare(src: Path, type_text: str, base: str, output: str | None, opts: Any) -> tuple[Any, str | None,
                                                                                          Path | None]:
    """One quantization checked (quant/quantize.py's plan), its model name and the outermost folder made for it
    (target's), nothing written yet."""
    from localgen.quant import quantize as q

    type_name, _ = q.parse_type(type_text)
    out, model_name, made = target(base, type_name.lower(), output)
    try:
        return q.plan(src, type_name, out, opts, out_name=model_name), model_name, made
    except BaseException:
        if made is not None:
            _unmake(out.parent, made)
        raise


def run_job(job: Any, model_name: str | None, made: Path | None = None) -> Any:
    """Run a planned quantization with a progress bar; Ctrl-C removes what it wrote (and the folders made for it,
    `made`) and exits at once. A model of localgen's gets its record of what it was made from."""
    from localgen.cli.progress import make_progress
    from localgen.cli.signals import term_as_interrupt
    from localgen.quant import quantize as q

    replacing = job.out.exists()
    with term_as_interrupt():  # a SIGTERM or SIGHUP (timeout, a kill, the terminal closed) as Ctrl-C
        try:
            done = q.run(job, make_progress(), label=model_name)
        except KeyboardInterrupt:  # (handled inside: the block's end would end the process by the signal at once)
            q.abandon(job)
            if made is not None:
                _unmake(job.out.parent, made)
            exit_stopped(f"the earlier {model_name or job.out.name} is kept as it was" if replacing else
                         f"{job.out.name} is not there")
    if model_name is not None:
        q.remember(done.path, job.made_from)
    return done, model_name


def exit_stopped(kept: str | None = None) -> None:
    """Ctrl-C, or a SIGTERM or SIGHUP inside term_as_interrupt, during a quantization: what was written (nothing)
    and kept, said in one line, and the exit at once, by the signal (exit_now)."""
    import signal

    from localgen.cli.signals import ended_by_term

    signum = ended_by_term()
    exit_now(f"{f'stopped by {signal.Signals(signum).name}' if signum else 'interrupted'}: nothing was written "
             f"({kept + '; ' if kept else ''}llama.cpp's call cannot be stopped, so localgen exits at once)",
             128 + signum if signum else 130)


def exit_now(message: str, code: int = 130) -> None:
    """Exit at once (130: Ctrl-C; 143, 129: SIGTERM, SIGHUP): llama_model_quantize is still running in its thread
    and cannot be stopped or waited for."""
    sys.stdout.flush()
    sys.stderr.write(f"localgen: {message}\n")
    sys.stderr.flush()
    import signal

    if code - 128 in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):  # ended by that signal, as its default
        signal.signal(code - 128, signal.SIG_DFL)  # action ends a process (run's and embed's too); Ctrl-C: 130
        os.kill(os.getpid(), code - 128)
    os._exit(code)


def _report(made: Any, json_out: bool) -> None:
    done, model_name = made
    doc = {"name": model_name, "path": str(done.path), "type": done.type_name, "size": done.size,
           "bits_per_weight": done.bits_per_weight, "seconds": round(done.seconds, 2)}
    if json_out:
        print(json.dumps(doc))
        return
    from localgen.units import format_bytes

    where = model_name or str(done.path)
    print(f"{where}  {done.type_name}, {format_bytes(done.size)}, {done.bits_per_weight:.2f} bits per weight "
          f"({done.seconds:.1f} s)")


def _ladder(ref: Any, src: Path, base: str, types_text: str, opts: Any, measure_text: str | None, ctx: int,
            chunks: int | None, kld_bound: float, n_prompt: int, n_gen: int, reps: int, threads: int | None,
            gpu_layers: int | None, json_out: bool, verbose: bool) -> None:
    """Make each type (one made earlier from this source, with these options, is kept unless --force; another is
    refused), then measure them all against the source."""
    import shlex

    from localgen.bench import history
    from localgen.cli.ladderview import run_ladder
    from localgen.cli.output import ErrWriter
    from localgen.models.resolve import resolve
    from localgen.quant import ladder
    from localgen.quant import measure as ms
    from localgen.quant import quantize as q
    from localgen.quant.text import MeasureText, default_text, read_text

    types = list(dict.fromkeys(q.parse_type(t)[0] for t in types_text.split(",") if t.strip()))
    if not types:
        raise UsageError("--ladder: no types given")
    speed = ladder.Speed(n_prompt=n_prompt, n_gen=n_gen, reps=reps, threads=threads)
    ladder.check_speed(speed, {str(src): ref.summary.context_length})  # the types keep the source's context
    if measure_text and measure_text != "-":
        check_input("--measure", measure_text)
    text: MeasureText | str = read_text(measure_text, chunks) if measure_text else default_text()
    # every refusal before the first type is made: the text, each type, a model of that name made otherwise, the
    # disk for the types and the source's logits, the benchmark history the rows go to
    logits = ms.check_text(ref, text, ctx, chunks)
    err = ErrWriter()
    jobs: list[tuple[str, Any]] = []  # (model name, its planned job; None: made earlier, kept)
    for t in types:
        out, model_name, _ = target(base, t.lower(), None)
        assert model_name is not None
        if out.exists() and not opts.force:
            _check_kept(out, model_name, q.origin(src, t, opts))
            jobs.append((model_name, None))
        else:
            jobs.append((model_name, prepare(src, t, base, None, opts)[0]))
    q.check_space_together([job for _, job in jobs if job is not None], (ms.logits_folder(), logits))
    history.start(shlex.join(["localgen", *sys.argv[1:]]), {})  # written and rolled back: it can keep the rows
    files = []
    for model_name, job in jobs:
        if job is None:
            err.line(f"{model_name}: kept (made earlier from this source; --force makes it again)")
        else:
            done, _ = run_job(job, model_name)
            err.line(f"{model_name}: {done.type_name}, {done.bits_per_weight:.2f} bits per weight")
        files.append(resolve(model_name, offline=True))
    settings = ms.Settings(ctx=ctx, batch=ms.fitting_batch(ctx), chunks=chunks, threads=threads,
                           gpu_layers=gpu_layers, verbose=verbose)
    run_ladder(ref, files, text, measure_text or "default", settings, speed, kld_bound,
               "json" if json_out else None)


def _check_kept(out: Path, model_name: str, made_from: dict[str, Any]) -> None:
    """A model the ladder would keep (made earlier) must be this source's type, made with these options: another
    is refused, never measured as this source's nor replaced without --force."""
    from localgen.quant import quantize as q

    why = q.differs(out, made_from)
    if why is not None:
        raise UsageError(f"the quantized model {model_name} exists, {why}: the ladder measures the types made "
                         "from this source", hint="--force makes it again from this source, replacing it; "
                                               "--name NAME makes the ladder's types under another name")
