"""`localgen tune`: measure which load settings make a typical exchange fastest for a model on this machine,
and keep the winner as that model's defaults here (localgen/tuning.py)."""

from __future__ import annotations

import dataclasses
import itertools
import sys
import time
from collections.abc import Callable
from typing import Annotated, Any

import typer

from localgen.cli import options as o
from localgen.cli.cpuload import CpuLoad
from localgen.cli.inputfile import check_model
from localgen.cli.options import preset
from localgen.cli.options.knobs import Knobs
from localgen.cli.output import plural
from localgen.cli.signals import term_as_interrupt
from localgen.cli.stopping import Stopped, stop_on_sigint

PLACEMENT = ("n_cpu_moe", "cpu_moe", "override_tensor")  # where the experts run: measured there, kept for it


@o.with_knobs(sampling=False, load=PLACEMENT)
def tune(
    ctx: typer.Context,
    model: o.Model = None,
    depth: Annotated[
        int | None,
        typer.Option("--depth", "-d", min=0, max=131072, show_default=False,
                     help="Tokens already in the context for the deep measurement (default 1,500, or what the "
                          "model's window leaves room for)."),
    ] = None,
    parallel: Annotated[
        int, typer.Option("--parallel", "-np", min=1, max=64,
                          help="Streams decoded together, as `serve --parallel N` runs them: the objective is their "
                               "aggregate time, kept in a record of its own."),
    ] = 1,
    prompt: Annotated[
        int, typer.Option("--prompt", "-p", min=16, max=65536,
                          help="Tokens of the exchange's prompt: the objective is one prompt and one answer at each "
                               "depth (llama-bench's -p)."),
    ] = 512,
    answer: Annotated[
        int, typer.Option("--answer", "-n", min=1, max=65536,
                          help="Tokens of the exchange's answer (llama-bench's -n)."),
    ] = 256,
    show: Annotated[bool, typer.Option("--show", help="List the tuning records and exit.")] = False,
    reset: Annotated[
        bool, typer.Option("--reset", help="Forget the tuning records (with -m: that model's only) and exit.")
    ] = False,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the record as one JSON object (--show: one per record, a line each).")] = False,
    even_if_busy: Annotated[
        bool, typer.Option("--even-if-busy", help="Keep the record even when other work kept the CPUs busy before "
                                                  "or while measuring (it says so wherever it is used).")
    ] = False,
    offline: o.Offline = False,
    *,
    knobs: Knobs,
) -> None:
    """Find the fastest load settings for a model on this machine and make them its defaults here. With the
    placement flags (--n-cpu-moe, --cpu-moe, -ot; or a preset's), it measures with the tensors placed so, and the
    record is for loads placed so."""
    from localgen import tuning

    if show and reset:
        from localgen.errors import UsageError

        raise UsageError("--show lists the records and --reset forgets them: give one of the two")
    if show or reset:
        _measures_nothing(ctx, knobs, "--show" if show else "--reset", allowed=("model",) if reset else ("as_json",))
    bad = tuning.unreadable() if show or reset else 0
    if show:
        damage = tuning.problem() if tuning.damage() else None
        if damage is not None:  # a file unreadable as a whole: said, never taken for "no records"
            print(f"warning: {damage}", file=sys.stderr)
        _unreadable(bad, "left out")
        _show(tuning.records(), as_json, quiet=damage is not None)
        return
    if reset:
        n = _forget(model) if model is not None else tuning.reset()
        print(f"forgot {n} tuning record{'s' if n != 1 else ''}"
              f"{f' of {model}' if model is not None else ''}", file=sys.stderr)
        _unreadable(bad, "removed")
        return
    load = knobs.load()  # a bad flag is one error before anything loads
    check_model("-m/--model", model)  # a path to nothing: a usage error, as run's -m (--reset forgets a gone file's)
    ref = _resolve(model, offline)
    params = preset.load_params(ref, load, knobs.given)
    plan = _plan(ref, depth, prompt, answer, params)
    from localgen.cli.output import ErrWriter
    from localgen.models.load import unmatched_overrides

    for text in unmatched_overrides(ref, params.override_tensor):  # measured as placed: say one places nothing
        ErrWriter().warn(text)
    _check_memory(ref, plan, parallel)
    tuning.check_writable()  # a record that cannot be kept is refused before the minutes of measuring
    _run(ref, plan, parallel, as_json, even_if_busy)


def _unreadable(n: int, done: str) -> None:
    """One warning line for the records in the file this localgen cannot read (wrong types: a hand edit)."""
    if n:
        from localgen.tuning import store_path

        print(f"warning: {plural(n, 'tuning record')} in {store_path()} cannot be read "
              f"(wrong fields or types): {'it is' if n == 1 else 'they are'} {done}", file=sys.stderr)


MEASURING = ("depth", "parallel", "prompt", "answer", "even_if_busy")  # what only a measurement reads


def _measures_nothing(ctx: typer.Context, knobs: Knobs, mode: str, allowed: tuple[str, ...]) -> None:
    """--show and --reset measure nothing: a flag only a measurement reads, given with them, is a usage error
    (else `tune --reset --prompt 64` would seem to have done something with it)."""
    from localgen.cli.options.knobs import typed_by_user
    from localgen.errors import UsageError

    names = [n for n in (*MEASURING, "model", "as_json") if n not in allowed and typed_by_user(ctx, n)]
    names += sorted(n for n in knobs.given_names if knobs.typed(n))
    if names:
        spelled = {"model": "-m", "as_json": "--json"}
        flags = ", ".join(spelled.get(n, "--" + n.replace("_", "-")) for n in names)
        raise UsageError(f"{mode} measures nothing: {flags} {'is' if len(names) == 1 else 'are'} not for it",
                         hint="localgen tune --show [--json] lists the records; localgen tune --reset [-m MODEL] "
                              "forgets them")


def _forget(model: str) -> int:
    """Forget a model's records: its file's, by hash, when it is here (--reset never downloads); else those made
    under its name (a path's file name: the name a record of a file keeps). A name that is no model here and no
    record's is an error, as every command's unknown model is, not "forgot 0"."""
    from pathlib import Path

    from localgen import tuning
    from localgen.errors import ModelNotFoundError, NotDownloadedError
    from localgen.models.resolve import resolve

    try:
        ref = resolve(model, offline=True)
    except ModelNotFoundError as e:
        n = tuning.reset(model=Path(model).name if model.lower().endswith(".gguf") else model)
        if n == 0 and isinstance(e, NotDownloadedError):  # a model of the catalogue or the Hub, never tuned here
            raise ModelNotFoundError(f"{model} is not here and no tuning record was made under that name",
                                     hint="localgen tune --show lists the records") from None
        if n == 0:  # a typo: the resolver's own error, as run and show give it
            raise
        return n
    return tuning.reset_file(ref.path)


def _resolve(model: str | None, offline: bool) -> Any:
    from localgen.cli.progress import make_progress
    from localgen.models.resolve import resolve

    return resolve(model, offline=offline, progress=make_progress())


@dataclasses.dataclass(frozen=True)
class _Plan:
    configs: list[tuple[bool, bool]]  # (repack, flash attention), the rule's first
    depths: tuple[int, ...]
    threads: tuple[int, ...]  # () with GPU offload: the load's own
    ubatches: tuple[int, ...]  # tried on the winning configuration only
    steps: int  # decoding steps a measurement (their median)
    offloaded: bool
    rule: dict[str, Any]
    prompt: int  # the exchange: its prompt's tokens and its answer's
    answer: int
    placement: tuple[tuple[str, str], ...] = ()  # the (pattern, buffer) pairs every load here gets
    placed: str = ""  # the same as flags (placement.flags_text), what the record is kept for

    def jobs(self, threads: tuple[int, ...]) -> list[Any]:
        """A configuration's measurements: a prompt and decoding steps at each depth with each thread count."""
        from localgen.engine.tune import Job

        return [Job(w, d, t) for d in self.depths for t in threads for w in ("pp", "tg")]

    def batch_jobs(self, threads_batch: int) -> list[Any]:
        from localgen.engine.tune import UBATCH, Job

        return [Job("pp", d, threads_batch, u) for d in self.depths for u in self.ubatches if u != UBATCH]

    @property
    def count(self) -> int:
        n_threads = max(1, len(self.threads))
        return len(self.configs) * 2 * len(self.depths) * n_threads + len(self.batch_jobs(1))


def _plan(ref: Any, depth: int | None, prompt: int, answer: int, load: Any) -> _Plan:
    from localgen import hardware, placement
    from localgen.engine.defaults import placed, resolve
    from localgen.engine.tune import UBATCH, check_generates
    from localgen.errors import UsageError
    from localgen.native import devices
    from localgen.types import LoadParams

    check_generates(ref)
    rule, _ = resolve(ref, LoadParams(), cpu_only=False, use_records=False)
    offloaded = bool(rule.n_gpu_layers) and devices.has_gpu()
    window = ref.summary.context_length or 4096
    room = window - prompt - answer  # the exchange after the depth: its prompt, then its answer
    if room < 0:
        if window - answer < 16:  # --prompt's least
            raise UsageError(f"--answer {answer} leaves no room for a prompt in the model's {window}-token window",
                             hint=f"use --answer {window - 16} or less")
        raise UsageError(f"--prompt {prompt} leaves no room for a {answer}-token answer in the model's "
                         f"{window}-token window", hint=f"use --prompt {window - answer} or less")
    if depth is None:
        depth = max(0, min(1500, room))
    elif depth > room:
        raise UsageError(f"--depth {depth} leaves no room for a {prompt}-token prompt in the model's {window}-token "
                         "window", hint=f"use --depth {max(0, room)} or less")
    repacks = [bool(rule.repack)]
    if not offloaded and (ref.summary.repackable_share or 0) > 0:
        repacks.append(not rule.repack)
    fas = [bool(rule.flash_attn), not rule.flash_attn]
    configs = [(r, f) for r in repacks for f in fas]
    threads: tuple[int, ...] = () if offloaded else tuple(sorted(
        {hardware.physical_cores(), hardware.usable_cores(), max(1, hardware.usable_cores() - 1)}, reverse=True))
    ubatches = (UBATCH,) if offloaded else (UBATCH, 256, 128)  # UBATCH first: batch_jobs leaves it out
    settings = {k: getattr(rule, k) for k in ("flash_attn", "repack", "n_threads", "n_threads_batch", "n_ubatch")}
    pairs = placement.overrides(load.override_tensor, load.cpu_moe, load.n_cpu_moe or 0)
    return _Plan(configs, tuple(sorted({0, depth})), threads, ubatches, 16, offloaded, settings, prompt, answer,
                 pairs, placed(load))


def _seq_ctx(plan: _Plan) -> int:
    """Each stream's context in the tune's probe: the depth, the prompt, the measured steps and a margin."""
    return max(plan.depths) + plan.prompt + plan.steps + 8


def _check_memory(ref: Any, plan: _Plan, parallel: int) -> None:
    """Refuse, before anything loads, a tune whose weights and KV cache (every stream's cells: --parallel N times
    one context) do not fit this machine's memory, by the plan `run` loads by (models/fit.py)."""
    from localgen.errors import LocalgenError
    from localgen.models import fit, footprint
    from localgen.types import LoadParams
    from localgen.units import format_bytes

    n_ctx = _seq_ctx(plan)
    load = LoadParams(n_ctx=n_ctx, override_tensor=plan.placement, n_gpu_layers=None if plan.offloaded else 0)
    p = fit.plan(ref.summary, footprint.layout(ref.path), fit.this_machine(plan.offloaded), load, ctx=n_ctx,
                 parallel=parallel, shrink=False)
    if p.fits:
        return
    kv = fit.kv_bytes(ref.summary, n_ctx) * parallel
    streams = f"{parallel} streams of {n_ctx:,} tokens" if parallel > 1 else f"a context of {n_ctx:,} tokens"
    raise LocalgenError(f"tuning {ref.name} with {streams} needs {format_bytes(kv)} of KV cache beside the weights: "
                        f"more than this machine's {p.short_of} holds",
                        hint="tune with fewer --parallel streams, or a shorter --prompt or --depth")


@term_as_interrupt()  # a SIGTERM or SIGHUP (`timeout`) stops it as Ctrl-C does: what was measured is kept
def _run(ref: Any, plan: _Plan, parallel: int, as_json: bool, even_if_busy: bool) -> None:
    from localgen import tuning
    from localgen.cli.output import ErrWriter
    from localgen.engine.defaults import build_id, device_id

    err = ErrWriter()
    load = CpuLoad.before(err, "the record is kept all the same (--even-if-busy), marked with what was seen"
                          if even_if_busy else "the record is not kept unless --even-if-busy")
    points: dict[tuple[bool, bool], list[Any]] = {}
    view = _View(plan.count)
    interrupted = False
    started = time.perf_counter()
    try:
        with stop_on_sigint() as stop:
            for i, (repack, fa) in enumerate(plan.configs):
                _measure(ref, plan, parallel, (repack, fa), None, points, view, err if i == 0 else None, stop)
                load.sample(view)
            table = _rank(points, plan, parallel)
            if plan.batch_jobs(1):  # the physical batch, on the winner only (it changes prompts, not decoding)
                best = table[0]
                _measure(ref, plan, parallel, (best["repack"], best["flash_attn"]), best["n_threads_batch"],
                         points, view, None, stop)
                load.sample(view)
    except (Stopped, KeyboardInterrupt):
        interrupted = True
    finally:
        view.end()
    table = _rank(points, plan, parallel)
    if not table:
        err.line("interrupted before a configuration was measured whole; nothing kept")
        raise typer.Exit(130)
    best = table[0]
    busy = load.busy()
    record = tuning.Record(
        key=tuning.Key(tuning.file_sha256(ref.path), build_id(), device_id(plan.offloaded), parallel, plan.placed),
        model=ref.name, size=_size(ref.path), date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        settings={k: best[k] for k in tuning.TUNABLE}, depth=max(plan.depths), exchange_s=best["total_s"],
        table=table, partial=interrupted, prompt=plan.prompt, answer=plan.answer, busy=busy,
    )
    from localgen.cli.output import ReaderGone, StdoutError, silence_stdout

    failed: StdoutError | None = None
    try:
        if as_json:  # the figures first: a record that then cannot be written (a full disk) loses none of them
            import json

            sys.stdout.write(json.dumps(record.to_json()) + "\n")
        else:
            _print_table(table, plan, parallel)
        sys.stdout.flush()
    except (ReaderGone, BrokenPipeError):  # the reader went away (`| head -1`): the record is kept all the same,
        silence_stdout()  # and said on stderr (it was lost, exit 0, without a word)
    except StdoutError as e:  # `> /dev/full`: said after the record is kept (it was lost with the figures)
        failed = e
    keep = busy is None or even_if_busy
    whole = tuning.save(record) if keep else None  # an earlier whole tune, kept instead
    if failed is not None:
        if keep and whole is None:
            err.line(f"tuned {ref.name}: the record is kept (localgen tune --show lists it), but its table could "
                     "not be written to stdout")
        raise failed
    took = time.perf_counter() - started
    if not keep:
        err.error(f"not kept: other work took {busy}, so these figures reflect it (and favour fewer threads)",
                  "tune again on a quiet machine, or add --even-if-busy to keep them anyway")
        raise typer.Exit(130 if interrupted else 1)
    if whole is not None:
        err.line(f"interrupted; nothing of this tune is kept: the whole tune of {whole.day} stays {ref.name}'s "
                 "default here (localgen tune --show lists it)")
        raise typer.Exit(130)
    what = "the best of what was measured before the interrupt" if interrupted else "the winner"
    placed = f" with {plan.placed}" if plan.placed else ""
    err.line(f"tuned {ref.name} in {took:.0f} s; {what} is now its default here for "
             f"{'run, chat and bench' if parallel == 1 else f'serve --parallel {parallel}'}{placed} (a flag still "
             "wins; localgen tune --show lists records, --reset forgets them)"
             + (f"; measured on a busy machine: other work took {busy}, as each use of it will say" if busy else ""))
    if interrupted:
        raise typer.Exit(130)


def _measure(ref: Any, plan: _Plan, parallel: int, config: tuple[bool, bool], threads_batch: int | None,
             points: dict[tuple[bool, bool], list[Any]], view: Any, err: Any, stop: Callable[[], None]) -> None:
    """One configuration's measurements (with `threads_batch`: its other physical batch sizes) into `points`;
    `stop` raises between two measurements once Ctrl-C was pressed."""
    from localgen.engine.tune import Probe, measure

    stop()
    repack, fa = config
    probe = Probe(ref, repack, fa, _seq_ctx(plan), parallel,
                  cpu_only=not plan.offloaded, prompt=plan.prompt, placement=plan.placement, check=stop)
    try:
        from localgen import hardware

        threads = plan.threads or (hardware.physical_cores(),)  # offloaded: the CPU's share is small
        if err is not None:
            _estimate(probe, plan, threads, view)
        view.start(f"repack {_onoff(repack)} · flash attention {_onoff(fa)}")
        jobs = plan.batch_jobs(threads_batch) if threads_batch is not None else plan.jobs(threads)
        got = points.setdefault(config, [])

        def keep(point: Any) -> None:
            if point is not None:
                got.append(point)
            view.advance()
            stop()

        measure(probe, jobs, plan.steps, keep)
        what = "its other batch sizes" if threads_batch is not None else plural(len(jobs), "figure")
        view.note(f"measured repack {_onoff(repack)} · flash attention {_onoff(fa)}: {what}")
    finally:
        probe.close()


def _size(path: str) -> int:
    import os

    return os.stat(path).st_size


def _onoff(v: bool) -> str:
    return "on" if v else "off"


def _estimate(probe: Any, plan: _Plan, threads: tuple[int, ...], view: Any) -> None:
    """Time one prompt and a few steps at depth 0, and say how long the whole sweep will take."""
    from localgen.engine.tune import UBATCH

    t = max(threads)
    probe.fill(32, t)
    probe.prompt(t, UBATCH)
    pp = probe.prompt(t, UBATCH)
    tg = probe.step(t, 4)
    deep = 1.0 + max(plan.depths) / 2048  # attention over the depth: a rough allowance
    fills = sum(plan.depths) / plan.prompt * pp  # filling the context to each depth
    per_config = len(plan.depths) * len(threads) * (pp + plan.steps * tg) * deep + fills
    batches = len(plan.batch_jobs(1)) * pp * deep + fills
    seconds = len(plan.configs) * per_config + batches
    view.note(f"tuning {probe.engine.model.name}: {plural(len(plan.configs), 'configuration')} × "
             f"{plural(len(threads), 'thread count')} at depths {' and '.join(f'{d:,}' for d in plan.depths)}, "
             f"then {plural(len(plan.ubatches), 'batch size')}; "
             f"about {seconds:.0f} s (Ctrl-C keeps what was measured)")


TIE = 0.02  # within this share of the fastest, the settings closest to the rule's win (the figures' noise)


def _rank(points: dict[tuple[bool, bool], list[Any]], plan: _Plan, parallel: int) -> list[dict[str, Any]]:
    """Every combination measured whole, fastest first; among those within TIE of the fastest, the one that
    differs least from the rule's settings goes first."""
    from localgen.engine.tune import exchange

    rows = []
    for (repack, fa), pts in points.items():
        threads = sorted({p.threads for p in pts})
        ubatches = sorted({p.ubatch for p in pts if p.what == "pp"})
        for t, tb, u in itertools.product(threads, threads, ubatches):
            if parallel > 1 and t != tb:
                continue  # a step of several streams is a batch: only the batch threads count
            per = [exchange(pts, (d,), t, tb, u, parallel, plan.answer) for d in plan.depths]
            if any(x is None for x in per):
                continue
            rows.append({"flash_attn": fa, "repack": repack, "n_threads": t, "n_threads_batch": tb, "n_ubatch": u,
                         "by_depth_s": {str(d): round(float(x or 0), 4) for d, x in zip(plan.depths, per, strict=True)},
                         "total_s": round(sum(float(x or 0) for x in per), 4)})
    rows.sort(key=lambda r: r["total_s"])
    if rows:
        near = [r for r in rows if r["total_s"] <= rows[0]["total_s"] * (1 + TIE)]
        pick = min(near, key=lambda r: (sum(r[k] != v for k, v in plan.rule.items()), r["total_s"]))
        rows.remove(pick)
        rows.insert(0, pick)
    return rows


def _print_table(table: list[dict[str, Any]], plan: _Plan, parallel: int) -> None:
    depths = plan.depths
    what = f"{parallel} streams' exchanges" if parallel > 1 else "one exchange"
    print(f"time of {what} ({plan.prompt}-token prompt, {plan.answer}-token answer) at each depth, fastest first")
    head = f"{'':3} {'flash-attn':>10} {'repack':>6} {'threads':>7} {'-tb':>4} {'ubatch':>6}"
    head += "".join(f" {'depth ' + format(d, ','):>12}" for d in depths) + f" {'total':>8} {'vs best':>8}"
    print(head)
    best = table[0]["total_s"]
    for i, r in enumerate(table[:8]):
        mark = "1st" if i == 0 else "2nd" if i == 1 else ""
        line = (f"{mark:3} {_onoff(r['flash_attn']):>10} {_onoff(r['repack']):>6} {r['n_threads']:>7} "
                f"{r['n_threads_batch']:>4} {r['n_ubatch']:>6}")
        line += "".join(f" {r['by_depth_s'][str(d)]:>11.2f}s" for d in depths)
        line += f" {r['total_s']:>7.2f}s {r['total_s'] / best:>7.2f}×"
        print(line)
    if len(table) > 8:
        print(f"    ... {len(table) - 8} slower combinations (--json lists all)")


def _show(records: list[Any], as_json: bool, quiet: bool = False) -> None:
    if as_json:
        import json

        for r in records:
            sys.stdout.write(json.dumps(r.to_json()) + "\n")
        return
    if not records:
        if not quiet:
            print("no tuning records (localgen tune -m MODEL makes one)", file=sys.stderr)
        return
    for r in records:
        s = r.settings
        streams = f" · {r.key.streams} streams" if r.key.streams > 1 else ""
        streams += f" · {r.key.placement}" if r.key.placement else ""
        partial = " (partial)" if r.partial else ""
        partial += f" on a busy machine ({r.busy})" if r.busy else ""  # as each use of it says (--even-if-busy)
        print(f"{r.model}{streams} · tuned {r.day}{partial} · {r.prompt}+{r.answer} tokens · flash-attn "
              f"{_onoff(s['flash_attn'])} · repack {_onoff(s['repack'])} · threads {s['n_threads']}/"
              f"{s['n_threads_batch']} · ubatch {s['n_ubatch']} · {r.exchange_s:.2f} s · {r.key.device} · "
              f"{r.key.build} · sha256 {r.key.sha256[:12]}")


class _View:
    """A Rich bar on a terminal's stderr; nothing in a pipe."""

    def __init__(self, total: int) -> None:
        self._p: Any = None
        if sys.stderr.isatty():
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            from localgen.cli.output import rich_console

            self._p = Progress(TextColumn("{task.description}", markup=False), BarColumn(), TimeRemainingColumn(),
                               console=rich_console(stderr=True), transient=True)
            from localgen.cli.progress import cursor_guard

            self._term = cursor_guard(self._p.console)  # a SIGTERM or SIGHUP: the cursor shown again
            self._p.start()
            self._task = self._p.add_task("tuning", total=total)

    def start(self, what: str) -> None:
        if self._p is not None:
            self._p.update(self._task, description=what)

    def note(self, text: str) -> None:
        """A line above the bar (or alone, in a pipe)."""
        if self._p is not None:
            self._p.console.print(text, style="dim", markup=False, highlight=False)
        else:
            print(text, file=sys.stderr, flush=True)

    def advance(self) -> None:
        if self._p is not None:
            self._p.advance(self._task)

    def end(self) -> None:
        if self._p is not None:
            self._p.stop()
            self._term.uninstall()
            self._p = None
