"""`localgen perplexity`: llama-perplexity's measure (windows of --ctx, the second half of each scored, PPL ± its
error), with --save-logits to keep a reference and --reference for KL divergence against one."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from localgen.cli import options as o
from localgen.cli.inputfile import check_input, check_model
from localgen.cli.signals import RestoreOnTerm, one_ctrl_c, term_as_interrupt
from localgen.errors import UsageError
from localgen.types import MAX_CTX, MIN_CTX_FLAG

CtxOpt = Annotated[int, typer.Option("--ctx", "--ctx-size", "-c", min=MIN_CTX_FLAG, max=MAX_CTX,
                                     help="Tokens per window; the second half of each is scored.")]
# perplexity's: against a logits file, the window is the file's
MeasureCtxOpt = Annotated[int | None, typer.Option("--ctx", "--ctx-size", "-c", min=MIN_CTX_FLAG, max=MAX_CTX,
                                                   show_default=False,
                                                   help="Tokens per window; the second half of each is scored "
                                                        "(default 512; against a logits file, the context it was "
                                                        "saved at).")]
BatchOpt = Annotated[int, typer.Option("--batch-size", "-b", min=1, max=MAX_CTX,
                                       help="Tokens per llama_decode: batch // ctx windows go together.")]
UBatchOpt = Annotated[int, typer.Option("--ubatch-size", "-ub", min=1, max=MAX_CTX, help="Physical batch size.")]
ChunksOpt = Annotated[int | None, typer.Option("--chunks", min=1, show_default=False,
                                               help="Measure only the first N windows (default: all).")]
ThreadsOpt = Annotated[int | None, typer.Option("--threads", "-t", min=1, max=1024, show_default=False,
                                                help="CPU threads (default: the cores this process may use).")]
GpuOpt = Annotated[int | None, typer.Option("--gpu-layers", "--n-gpu-layers", "-ngl", min=-1, max=MAX_CTX,
                                            show_default=False,
                                            help="Layers on the GPU, -1 all (default: as many as fit).")]
TextOpt = Annotated[str | None, typer.Option("--file", "-f", show_default=False, metavar="TEXT",
                                             help="The text, UTF-8 ('-': stdin); default: the text localgen ships "
                                                  "(ten State of the Union addresses, public domain).")]


def perplexity(
    model: o.Model = None,
    file: TextOpt = None,
    ctx: MeasureCtxOpt = None,
    batch: BatchOpt = 2048,
    ubatch: UBatchOpt = 512,
    chunks: ChunksOpt = None,
    threads: ThreadsOpt = None,
    gpu_layers: GpuOpt = None,
    save_logits: Annotated[Path | None, typer.Option(
        "--save-logits", show_default=False, metavar="FILE",
        help="Keep this model's logits in FILE, as a reference for --reference (llama-perplexity's "
             "--kl-divergence-base format).")] = None,
    reference: Annotated[str | None, typer.Option(
        "--reference", show_default=False, metavar="FILE|MODEL",
        help="Measure KL divergence against a logits file (--save-logits, or llama-perplexity's "
             "--kl-divergence-base), or a model measured first on the same text.")] = None,
    kl_base: Annotated[str | None, typer.Option(
        "--kl-divergence-base", hidden=True, show_default=False,
        help="llama-perplexity's spelling: --save-logits FILE, or with --kl-divergence, --reference FILE.")] = None,
    kl_divergence: Annotated[bool, typer.Option(
        "--kl-divergence", hidden=True, help="llama-perplexity's spelling: with --kl-divergence-base FILE, "
                                             "--reference FILE.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Every figure as one JSON document on stdout.")] = False,
    offline: o.Offline = False,
    verbose: o.Verbose = False,
) -> None:
    """Perplexity of a model on a text, as llama-perplexity measures it; with --reference, KL divergence, top-token
    agreement and Δp against a reference (the original weights of a quantized model)."""
    from localgen.models.resolve import resolve
    from localgen.quant import measure as ms
    from localgen.quant.text import MeasureText, default_text, read_text

    check_model("-m/--model", model)  # a path to nothing: a usage error, as run's -m
    if file and file != "-":  # ('-': stdin)
        check_input("-f/--file", file)
    save_logits, reference, ref_file = _logits_options(kl_divergence, kl_base, save_logits, reference, file)
    ref_model = None
    saved_ctx = ms.logits_context(ref_file) if ref_file is not None else None
    if saved_ctx is not None and saved_ctx < MIN_CTX_FLAG:  # a llama-perplexity file of a tiny window
        raise UsageError(f"the reference {ref_file} was saved at a context of {saved_ctx}, which cannot be measured "
                         f"here (windows take {MIN_CTX_FLAG} tokens or more)")
    if ctx is None:  # against a logits file: the context it was saved at, which the measure must use
        ctx = saved_ctx if saved_ctx is not None else 512
    ms.check_batch(ctx, batch)
    s = ms.Settings(ctx=ctx, batch=batch, ubatch=ubatch, chunks=chunks, threads=threads, gpu_layers=gpu_layers,
                    verbose=verbose)
    ref = resolve(model, offline=offline)
    if reference is not None and ref_file is None:
        ref_model = resolve(reference, offline=offline)
        ms.same_vocabulary(ref, ref_model)
    # a logits file holds its tokens: a text given with it is checked against them
    text: MeasureText | str | None = None
    if ref_file is None or file is not None:
        if not file:
            _stdin_unread()
        text = read_text(file, chunks) if file else default_text()
    view = ChunkView(json_out)
    out: dict[str, Any] = {"text": file or "default", "ctx": ctx}
    temp = None
    measuring = ref  # which model the windows under way belong to: an interrupt says so
    # a second press while the model is freed would lose the figures measured; a SIGTERM or SIGHUP (`timeout`) stops
    # it as Ctrl-C does, the figures measured shown, then ends the process by that signal
    with term_as_interrupt(), one_ctrl_c():
        try:
            if ref_model is not None:
                measuring = ref_model
                assert text is not None
                temp = ms.temp_logits("model")
                engine = ms.open_model(ref_model, s)
                try:
                    with _writing(temp):
                        base = ms.perplexity(engine, text, s, save=temp, on_chunk=view.chunk,
                                             saving=f"the reference {ref_model.name}'s logits (measured first)")
                finally:
                    engine.close()
                out["reference"] = {"model": ref_model.name, "ppl": base.ppl, "ppl_err": base.ppl_err}
                ref_file = temp
                measuring = ref
            engine = ms.open_model(ref, s)
            try:
                if ref_file is not None:
                    result = ms.against(engine, ref_file, s, text, view.chunk, users_text=ref_model is None)
                    out.setdefault("reference", {"file": str(ref_file)})
                else:
                    assert text is not None
                    with _writing(save_logits):
                        result = ms.perplexity(engine, text, s, save=save_logits, on_chunk=view.chunk)
            finally:
                engine.close()
        except ms.Interrupted as stop:
            view.end()
            _interrupted(stop.measured, measuring, ref, out, json_out, save_logits is not None)
            raise typer.Exit(130) from None
        finally:
            view.end()
            if temp is not None:
                temp.unlink(missing_ok=True)
    _check_numbers(result, out.get("reference"))
    _show(result, out, json_out)
    if save_logits is not None and not json_out:
        print(f"logits saved to {save_logits}", file=sys.stderr)


def _stdin_unread() -> None:
    """A text piped in (or redirected from a file) with no -f is not read: said, since the figures are then the
    default text's (a PPL of another text, exit 0, with no word)."""
    import os
    import stat

    try:
        fd = sys.stdin.fileno()
        mode = os.fstat(fd)
        if stat.S_ISFIFO(mode.st_mode):  # a pipe with text in it now (one empty, or not written yet, says nothing),
            import array  # counted, not read: it is left whole for what reads it next (`while read m; do ...`)
            import fcntl
            import termios

            waiting = array.array("i", [0])
            fcntl.ioctl(fd, termios.FIONREAD, waiting)
            piped = waiting[0] > 0
        else:
            piped = stat.S_ISREG(mode.st_mode) and mode.st_size > 0
    except (AttributeError, ImportError, OSError, ValueError):  # none, closed, not a file (a test's), Windows
        return
    if piped:
        from localgen.cli.output import ErrWriter

        ErrWriter().warn("stdin is not read: give -f - to measure it (the default text is measured)")


def _logits_options(kl_divergence: bool, kl_base: str | None, save_logits: Path | None,
                    reference: str | None, text: str | None) -> tuple[Path | None, str | None, Path | None]:
    """llama-perplexity's --kl-divergence-base spellings as --save-logits / --reference, checked (a logits file to
    write is not the `text` measured, nor any other file but logits): (the logits file to write, the reference
    asked, the reference's logits file where it is one)."""
    from localgen.quant import measure as ms

    if kl_divergence and kl_base is None:
        raise UsageError("--kl-divergence needs --kl-divergence-base FILE (the reference's logits)")
    if kl_base is not None:  # llama-perplexity's spellings
        if save_logits is not None or reference is not None:
            raise UsageError("give --kl-divergence-base or --save-logits/--reference, not both")
        if kl_divergence:
            reference = kl_base
        else:
            save_logits = Path(kl_base)
    if save_logits is not None and reference is not None:
        raise UsageError("--save-logits keeps a reference; --reference measures against one: give one of them")
    if save_logits is not None:
        ms.check_logits_target(save_logits, text)
    ref_file = None
    if kl_divergence and kl_base is not None:  # llama-perplexity's: always a logits file, never a model
        if not Path(kl_base).exists():
            raise UsageError(f"--kl-divergence-base {kl_base}: no such file")
        if not ms.is_logits_file(kl_base):
            raise UsageError(f"--kl-divergence-base {kl_base} is not a logits file (one that --save-logits or "
                             "llama-perplexity's --kl-divergence-base wrote)")
    if reference is not None:
        if ms.is_logits_file(reference):
            ref_file = Path(reference)
        elif Path(reference).is_file() and not reference.lower().endswith(".gguf"):
            raise UsageError(f"--reference: {reference} is neither a logits file nor a model")
        elif not Path(reference).exists() and _names_a_file(reference):
            raise UsageError(f"--reference {reference}: no such file")
    return save_logits, reference, ref_file


def _interrupted(measured: Any, measuring: Any, ref: Any, out: dict[str, Any], json_out: bool, saving: bool) -> None:
    """The one line of a Ctrl-C (the exit adds no "interrupted" of its own), and the figures of the windows measured
    where they are the model's: a reference's are never shown as the model's."""
    from localgen.cli.output import ErrWriter

    err = ErrWriter()
    if measuring is not ref:
        done = f" ({measured.chunks} of {_windows(measured.chunks_total)})" if measured else ""
        err.interrupted(f"interrupted while measuring the reference {measuring.name}{done}: {ref.name} was not "
                        "measured")
    elif measured is not None:
        _show(measured, out, json_out)
        err.interrupted(f"interrupted after {measured.chunks} of {_windows(measured.chunks_total)}: the figures "
                        "above cover those" + ("; the logits file was not written" if saving else ""))
    else:
        err.interrupted("interrupted before the first window was measured")


def _names_a_file(text: str) -> bool:
    """Whether --reference's value is meant as a file (a path, or a name ending .logits or .gguf), not a model's
    name: one that is missing is then "no such file"."""
    from localgen.models import names

    return text.lower().endswith((".logits", ".gguf")) or isinstance(names.parse(text), names.PathSpec)


@contextlib.contextmanager
def _writing(path: Path | None) -> Iterator[None]:
    """A failed write of the logits file (a full disk, a file size limit) as `cannot write PATH: why` (nothing
    of it is left: the measure discards its partial file)."""
    try:
        yield
    except OSError as e:
        if path is None:
            raise
        from localgen.errors import LocalgenError

        raise LocalgenError(f"cannot write {path}: {e.strerror or e}") from None


def _check_numbers(m: Any, reference: dict[str, Any] | None) -> None:
    """A measure against a reference whose figures are not numbers (measure.not_numbers): the model's own PPL
    (its weights), or the reference's figures (its weights, or its logits file, damaged)."""
    import math

    from localgen.quant import measure as ms

    d = m.divergence
    if not math.isfinite(m.ppl):
        raise ms.not_numbers(m.model, f"PPL = {m.ppl}")
    if d is None or (math.isfinite(d.ppl_base) and math.isfinite(d.kld)):
        return
    figure = f"its PPL = {d.ppl_base}" if not math.isfinite(d.ppl_base) else f"KL divergence = {d.kld}"
    if reference and "model" in reference:
        raise ms.not_numbers(f"the reference {reference['model']}", figure)
    which = f"the reference {(reference or {}).get('file', '')}".rstrip()
    raise ms.not_numbers(which, figure, "the logits file is likely damaged")


def _show(m: Any, out: dict[str, Any], json_out: bool) -> None:
    if json_out:
        print(json.dumps({**out, **m.as_dict()}))
        return
    print(render(m, out.get("reference")))


def _windows(n: int) -> str:
    return f"{n} window" if n == 1 else f"{n} windows"


def render(m: Any, reference: dict[str, Any] | None = None) -> str:
    """The figures as llama-perplexity prints its final statistics."""
    lines = [f"model: {m.model}; {_windows(m.chunks)} of {m.n_ctx} tokens, {m.tokens:,} positions scored, "
             f"{m.tokens_per_s:,.1f} tokens/s"]
    d = m.divergence
    if d is None:
        lines.append(f"Final estimate: PPL = {m.ppl:.4f} +/- {m.ppl_err:.5f}")
        return "\n".join(lines)
    if reference and "model" in reference:
        lines.append(f"reference: {reference['model']}")
    lines += [
        "",
        "====== Perplexity statistics ======",
        f"Mean PPL(Q)                   : {m.ppl:10.6f} ± {m.ppl_err:10.6f}",
        f"Mean PPL(base)                : {d.ppl_base:10.6f} ± {d.ppl_base_err:10.6f}",
    ]
    if d.correlation is not None:
        lines.append(f"Cor(ln(PPL(Q)), ln(PPL(base))): {100 * d.correlation:6.2f}%")
    lines += [
        f"Mean ln(PPL(Q)/PPL(base))     : {d.ln_ratio:10.6f} ± {d.ln_ratio_err:10.6f}",
        f"Mean PPL(Q)/PPL(base)         : {d.ppl_ratio:10.6f} ± {d.ppl_ratio_err:10.6f}",
        f"Mean PPL(Q)-PPL(base)         : {d.ppl_diff:10.6f} ± {d.ppl_diff_err:10.6f}",
        "",
        "====== KL divergence statistics ======",
        f"Mean    KLD: {d.kld:10.6f} ± {d.kld_err:10.6f}",
    ]
    for name, value in (d.kld_percentiles or {}).items():
        lines.append(f"{_label(name)} KLD: {value:10.6f}")
    lines += ["", "====== Token probability statistics ======",
              f"Mean    Δp: {100 * d.dp_mean:6.3f} ± {100 * d.dp_mean_err:5.3f} %"]
    for name, value in (d.dp_percentiles or {}).items():
        lines.append(f"{_label(name)} Δp: {100 * value:6.3f}%")
    lines += [f"RMS Δp    : {100 * d.rms_dp:6.3f} ± {100 * d.rms_dp_err:5.3f} %",
              f"Same top p: {100 * d.same_top:6.3f} ± {100 * d.same_top_err:5.3f} %"]
    if d.kld_percentiles is None:
        lines.append("(percentiles need at least 100 positions scored)")
    return "\n".join(lines)


def _label(name: str) -> str:
    """llama-perplexity's label of a percentile ("99.0%  ", "Maximum")."""
    words = {"max": "Maximum", "min": "Minimum", "median": "Median "}
    if name in words:
        return words[name]
    return f"{float(name[1:]):4.1f}%  "


class ChunkView:
    """Windows measured, on stderr: a Rich bar with its estimate on a terminal, a line every tenth otherwise."""

    def __init__(self, quiet: bool) -> None:
        self.tty = sys.stderr.isatty()
        self.bar: Any = None
        self.term: Any = None
        self.task: Any = None
        self.label = ""
        self.next_mark = 0

    def chunk(self, label: str, done: int, total: int) -> None:
        """`done` of `total` windows of `label` measured."""
        if self.tty:
            if label != self.label or self.bar is None:
                self._bar(label, total)
            self.bar.update(self.task, completed=done)
            return
        if label != self.label:
            self.label, self.next_mark = label, 0
        pct = done * 100 // total if total else 100
        if done == 0:
            print(f"{label}: {_windows(total)}", file=sys.stderr, flush=True)
            self.next_mark = 10
        while pct >= self.next_mark > 0:
            print(f"{label}: {done}/{_windows(total)}", file=sys.stderr, flush=True)
            self.next_mark = (pct // 10 + 1) * 10 if pct < 100 else 1 << 30

    def _bar(self, label: str, total: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        from localgen.cli.output import rich_console

        self.end()
        self.label = label
        from localgen.cli.progress import cursor_back

        self.bar = Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                            TextColumn("windows"), TimeRemainingColumn(), console=rich_console(stderr=True))
        self.term = RestoreOnTerm(lambda: cursor_back(self.bar.console))  # SIGTERM, SIGHUP: the cursor shown again
        self.term.install()
        self.bar.start()
        self.task = self.bar.add_task(label, total=total)

    def end(self) -> None:
        """Stop the bar (idempotent)."""
        if self.bar is not None:
            self.bar.stop()
            self.term.uninstall()
            self.bar = None
