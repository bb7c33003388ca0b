"""`localgen bench`: llama-bench's tests and sweeps plus load, TTFT, latency and memory; history; compare."""

from __future__ import annotations

import contextlib
import shlex
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import Annotated, Any

import typer

from localgen.cli import options as o
from localgen.errors import UsageError
from localgen.units import format_bytes

bench_app = typer.Typer(
    help="Benchmark models and settings (llama-bench compatible), keep the results, compare runs.",
    invoke_without_command=True, no_args_is_help=False, add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

SWEEP = "Sweep (lists 1,2,4 and ranges 1-8, 1-16*2, 0-40+10; flags may repeat)"


Values = list[str] | None


def _opt(*names: str, help: str, panel: str = SWEEP) -> Any:
    return typer.Option(*names, help=help, rich_help_panel=panel, show_default=False)


@bench_app.callback()
def bench(
    ctx: typer.Context,
    model: Annotated[Values, _opt("--model", "-m", help="Models: names, repos, paths (default smollm2:135m).")] = None,
    n_prompt: Annotated[Values, _opt("--n-prompt", "-p", help="Prompt lengths for pp tests (default 512).")] = None,
    n_gen: Annotated[Values, _opt("--n-gen", "-n", help="Generation lengths for tg tests (default 128).")] = None,
    pg: Annotated[Values, _opt("--prompt-gen", "-pg", help="PROMPT,GEN pairs for combined tests.")] = None,
    n_depth: Annotated[Values, _opt("--n-depth", "-d", help="Context depths to test at (default 0).")] = None,
    threads: Annotated[Values, _opt("--threads", "-t", help="CPU threads (default: the model's tuning "
                                                             "record, else the physical cores this process may "
                                                             "use).")] = None,
    ngl: Annotated[Values, _opt("--n-gpu-layers", "-ngl", help="GPU layers, -1 all (default all if offload).")] = None,
    batch: Annotated[Values, _opt("--batch-size", "-b", help="Logical batch (default 2048).")] = None,
    ubatch: Annotated[Values, _opt("--ubatch-size", "-ub",
                                   help="Physical batch (default: the model's tuning record, else 512).")] = None,
    fa: Annotated[Values, _opt("--flash-attn", "-fa", help="Flash attention 0/1 (default: the model's "
                                                                     "tuning record, else the rule; see `localgen "
                                                                     "tune`).")] = None,
    ctk: Annotated[Values, _opt("--cache-type-k", "-ctk", help="KV key types (default f16).")] = None,
    ctv: Annotated[Values, _opt("--cache-type-v", "-ctv", help="KV value types (default f16).")] = None,
    parallel: Annotated[Values, _opt("--parallel", "-npl", "--concurrency",
                                     help="Sequences decoded together: aggregate rates (with --endpoint: requests in "
                                          "flight).")] = None,
    exact: Annotated[
        bool | None, typer.Option("--exact/--no-exact", show_default=False,
                                  help="With -npl: the batching mode of the sequences decoded together. Default: "
                                       "the one `serve` and `run --file` use here (throughput wherever exactness "
                                       "costs more than 10 %). --exact: every answer as if alone, at that price.")
    ] = None,
    reps: Annotated[int, typer.Option("--repetitions", "-r", min=1, help="Repetitions of each test.")] = 5,
    output: Annotated[
        str | None,
        typer.Option("--output", "-o", help="md, csv, json or jsonl (default: a table on a terminal, else md)."),
    ] = None,
    e2e: Annotated[
        bool, typer.Option("--e2e/--no-e2e", help="Also time the real `run` path (template, sampling, detokenizing).")
    ] = True,
    offline: o.Offline = False,
    rpc: o.Rpc = None,
    endpoint: o.Endpoint = None,
    api_key_env: o.ApiKeyEnv = None,
    request_rate: Annotated[Values, _opt("--request-rate", help="With --endpoint: requests per second arriving as a "
                                                                "Poisson process; inf sends them at once (default).",
                                         panel=o.REMOTE_PANEL)] = None,
    num_prompts: Annotated[
        int | None, typer.Option("--num-prompts", min=1, rich_help_panel=o.REMOTE_PANEL, show_default=False,
                                 help="With --endpoint: requests per sweep point (default: twice the concurrency, "
                                      "at least 8).")
    ] = None,
    same_prompt: Annotated[
        bool, typer.Option("--same-prompt", rich_help_panel=o.REMOTE_PANEL,
                           help="With --endpoint: send one fixed prompt every time, to measure the server with its "
                                "prefix cache warm. Default: each request begins with a random nonce of its own, so "
                                "no cached prefix shortens its time to first token.")
    ] = False,
) -> None:
    """Run benchmarks. With no subcommand this measures; `history` and `compare` read past runs.

    With --endpoint URL it measures a running OpenAI-compatible server from the client instead, as `vllm bench
    serve` does: -npl/--concurrency and --request-rate sweeps, -p prompt and -n answer lengths; output
    tokens/s, requests/s, and time to first token, inter-token and end-to-end latency at p50/p90/p99.
    """
    if ctx.invoked_subcommand is not None:
        return
    from localgen.bench import records

    if output is not None and output not in records.FORMATS:
        raise UsageError(f"--output must be one of {', '.join(records.FORMATS)}, not {output!r}")
    if endpoint or (model and any(_is_named_endpoint(m) for m in model)):
        local = {"--threads": threads, "--n-gpu-layers": ngl, "--batch-size": batch, "--ubatch-size": ubatch,
                 "--flash-attn": fa, "--cache-type-k": ctk, "--cache-type-v": ctv, "--n-depth": n_depth,
                 "--prompt-gen": pg, "--rpc": rpc, "--exact/--no-exact": exact is not None}
        bad = [flag for flag, v in local.items() if v]
        if bad:
            raise UsageError(f"{', '.join(bad)} cannot be used with --endpoint (the server loads the model)")
        _measure_remote(endpoint, api_key_env, model, parallel, request_rate, num_prompts, n_prompt, n_gen, output,
                        same_prompt)
        return
    if request_rate or num_prompts or api_key_env or same_prompt:
        raise UsageError("--request-rate, --num-prompts, --same-prompt and --api-key-env go with --endpoint URL")
    plan = _plan(model=model, threads=threads, ngl=ngl, batch=batch, ubatch=ubatch, fa=fa, ctk=ctk, ctv=ctv,
                 n_prompt=n_prompt, n_gen=n_gen, pg=pg, n_depth=n_depth, reps=reps, e2e=e2e, parallel=parallel, rpc=rpc,
                 exact=exact)
    _measure(plan, output, offline, tuple(x.strip() for x in (rpc or "").split(",") if x.strip()))


def _is_named_endpoint(model: str) -> bool:
    from localgen.remote.endpoints import named

    head = model.partition("/")[0]
    return "/" in model and not model.endswith(".gguf") and head in named()


def _measure_remote(urls: list[str] | None, key_env: str | None, models: Values, parallel: Values, rates: Values,
                    num_prompts: int | None, n_prompt: Values, n_gen: Values, output: str | None,
                    same_prompt: bool = False) -> None:
    """bench --endpoint: the sweep against a server, kept in the history labelled as client-side figures."""
    from localgen.bench import history, serving, sweep
    from localgen.cli.output import ErrWriter
    from localgen.remote.backend import pick_model
    from localgen.remote.client import RemoteClient
    from localgen.remote.endpoints import choose

    concurrencies = sweep.int_values("--parallel/--concurrency", parallel, [1, 4])
    rate_values = _rates(rates)
    prompts = sweep.int_values("--n-prompt", n_prompt, [128])
    gens = sweep.int_values("--n-gen", n_gen, [64])
    targets = []
    wanted: list[str | None] = list(models) if models else [None]
    for m in wanted:
        eps, model_id = choose(urls, key_env, m)
        if not eps:
            raise UsageError("--endpoint URL (or -m NAME/MODEL from endpoints.toml) names the server to measure")
        targets.append((eps[0], model_id or pick_model(eps)))
    import localgen

    system = {"build_commit": "client-side", "build_number": 0, "cpu_info": "", "cores": 0, "ram": 0, "gpu_info": "",
              "backends": "remote", "features": "", "localgen_version": localgen.__version__}
    run_id = history.start(shlex.join(["localgen", "bench", *sys.argv[2:]]), system)
    err = ErrWriter()
    results: list[dict[str, Any]] = []
    points = [(c, r, num_prompts or max(8, 2 * c), g) for _ in targets for _ in prompts for g in gens
              for c in concurrencies for r in rate_values]
    view = _ProgressView(f"{len(points)} sweep point{'s' if len(points) > 1 else ''}", len(points), lambda: None,
                         "Ctrl-C keeps the rows measured")
    view.begin(len(points))
    try:
        for ep, model_id in targets:
            client = RemoteClient(ep, model_id)
            try:
                for p in prompts:
                    for g in gens:
                        view.loading(f"{ep.label} {model_id}: prompt {p}, answer {g}")
                        for rec in serving.run(client, ep.url, model_id, concurrencies, rate_values, num_prompts,
                                               p, g, 1234, system, same_prompt):
                            history.add(run_id, len(results), rec)
                            results.append(rec)
                            if output == "jsonl":
                                sys.stdout.write(records_jsonl([rec]))
                                sys.stdout.flush()
                            if rec["requests"] == 0:
                                raise UsageError(f"every request failed: {rec['first_error']}")
                            view.step(f"{ep.label} {model_id}: prompt {p}, answer {g}")
                            if len(results) == 1:  # the first point's latency foresees the rest
                                e2e = (rec["e2e_p50_ms"] or 0.0) / 1000
                                view.estimate(view.elapsed() + serving.seconds(points[1:], e2e, g))
                            view.row(rec, len(results))
            finally:
                client.close()
    except KeyboardInterrupt:
        view.end()
        err.line("interrupted; the results above were measured and kept")
        raise typer.Exit(130) from None
    finally:
        view.end()
        if results and output != "jsonl":
            from localgen.bench import records

            if output:
                sys.stdout.write(records.FORMATS[output](results))
            else:
                _emit_serving(results)
            sys.stdout.flush()
    err.line(f"saved as run {run_id}: localgen bench history {run_id} (client-side figures)")


def _rates(rates: Values) -> list[float]:
    """--request-rate values: positive numbers, or inf."""
    out: list[float] = []
    for text in (v for item in (rates or ["inf"]) for v in item.split(",")):
        try:
            rate = float(text)
        except ValueError:
            raise UsageError(f"--request-rate takes numbers or inf, not {text!r}") from None
        if not rate > 0:
            raise UsageError(f"--request-rate must be above 0, not {text!r}")
        out.append(rate)
    return out


def records_jsonl(recs: list[dict[str, Any]]) -> str:
    from localgen.bench import records

    return records.FORMATS["jsonl"](recs)


def _plan(**flags: Any) -> Any:
    """The sweep: every combination of the flags' values, with llama-bench's defaults."""
    from localgen.bench import sweep
    from localgen.engine.devices import backend_info
    from localgen.types import KV_CACHE_TYPES

    offload = bool(backend_info()["gpu_offload"])
    kv = list(KV_CACHE_TYPES)
    return sweep.build(
        models=sweep.str_values("--model", flags["model"], ["smollm2:135m"]),
        # threads, physical batch and flash attention not given: the load's defaults (tuning record, else rule)
        threads=sweep.int_values("--threads", flags["threads"], []) or [None],
        ngl=sweep.int_values("--n-gpu-layers", flags["ngl"], [-1 if offload or flags.get("rpc") else 0]),
        batch=sweep.int_values("--batch-size", flags["batch"], [2048]),
        ubatch=sweep.int_values("--ubatch-size", flags["ubatch"], []) or [None],
        fa=sweep.bool_values("--flash-attn", flags["fa"], []) or [None],
        ctk=sweep.str_values("--cache-type-k", flags["ctk"], ["f16"], kv),
        ctv=sweep.str_values("--cache-type-v", flags["ctv"], ["f16"], kv),
        prompts=sweep.int_values("--n-prompt", flags["n_prompt"], [512]),
        gens=sweep.int_values("--n-gen", flags["n_gen"], [128]),
        pg=sweep.pairs("--prompt-gen", flags["pg"]), depths=sweep.int_values("--n-depth", flags["n_depth"], [0]),
        reps=flags["reps"], e2e=flags["e2e"], parallel=sweep.int_values("--parallel", flags["parallel"], []),
        exact=flags.get("exact"),
    )


def _measure(plan: Any, output: str | None, offline: bool, rpc: tuple[str, ...] = ()) -> None:
    """Run the plan, keeping each result in the history as it comes; print them."""
    from localgen.bench import history, records
    from localgen.bench.bandwidth import measure_isolated
    from localgen.bench.runner import run
    from localgen.cli.output import ErrWriter
    from localgen.cli.progress import make_progress
    from localgen.models.resolve import resolve

    refs = {m: resolve(m, offline=offline, progress=make_progress()) for m in {c.model for c in plan.configs}}
    system = records.system_info()
    if rpc:
        system["backends"] += "+RPC"
        system["rpc"] = list(rpc)
    system["bandwidth"] = measure_isolated()
    run_id = history.start(shlex.join(["localgen", "bench", *sys.argv[2:]]), system)
    results: list[dict[str, Any]] = []
    interrupted = False
    with _stop_on_sigint() as stop:
        view = _ProgressView.of(plan, stop)
        try:
            for result in run(plan, view, system["bandwidth"], open_model=refs.__getitem__,  # type: ignore[arg-type]
                              rpc=rpc):
                rec = records.record(result, system)
                history.add(run_id, len(results), rec)
                results.append(rec)
                if output == "jsonl":  # one line per result as it is measured, for pipelines
                    sys.stdout.write(records.FORMATS["jsonl"]([rec]))
                    sys.stdout.flush()
                view.row(rec, len(results))
        except (_Stopped, KeyboardInterrupt):
            interrupted = True
        finally:
            view.end()
    _emit(results, system, output)
    err = ErrWriter()
    err.line(f"saved as run {run_id}: localgen bench history {run_id}")
    if interrupted:
        err.line("interrupted; the results above were measured and kept")
        raise typer.Exit(130)


class _Stopped(Exception):
    """Ctrl-C was pressed: raised at the next point between two measurements."""


@contextlib.contextmanager
def _stop_on_sigint() -> Iterator[Callable[[], None]]:
    """Ctrl-C only notes the request; the progress view calls the yielded check between two repetitions and
    before each load, so no exception lands inside a model load or a context's freeing (one that did crashed
    the process with SIGSEGV now and then, as in `tune`). A second Ctrl-C interrupts at once."""
    presses = 0
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(signum: int, frame: Any) -> None:
        nonlocal presses
        presses += 1
        if presses > 1:
            logs = sys.modules.get("localgen.engine.logs")
            if logs is not None and logs.defer_interrupt(frame):
                return  # raised once llama.cpp returns (engine/logs.py)
            raise KeyboardInterrupt

    def check() -> None:
        if presses:
            raise _Stopped

    try:
        signal.signal(signal.SIGINT, on_sigint)
    except ValueError:  # not the main thread: Ctrl-C keeps its default behaviour
        yield check
        return
    try:
        yield check
    finally:
        signal.signal(signal.SIGINT, previous)


LONG_S = 120.0  # in a pipe, a sweep foreseen to take this long says so first and reports each row


def _duration(seconds: float) -> str:
    """`45 s`, `3 min`, `1 h 20 min`."""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


class _ProgressView:
    """On a terminal: the foreseen length, then a Rich bar on stderr (configuration, repetition, ETA). When stderr
    is not a terminal, for a long sweep only (LONG_S): the foreseen length and one line per finished row; else
    nothing, so a short run stays quiet. Never a word on stdout. `stop` raises between two measurements once
    Ctrl-C was pressed."""

    def __init__(self, what: str, rows: int, stop: Callable[[], None], ctrl_c: str) -> None:
        self._what = what  # the sweep's size in words
        self._rows = rows
        self._stop = stop
        self._ctrl_c = ctrl_c  # what Ctrl-C does
        self._tty = sys.stderr.isatty()
        self._lines = False
        self._started = time.monotonic()
        self._p: Any = None
        self._task: Any = None

    @classmethod
    def of(cls, plan: Any, stop: Callable[[], None]) -> _ProgressView:
        """The view of a local plan."""
        parts = [f"{n:,} {word}{'s' if n > 1 else ''}" for n, word in (
            (len(plan.configs), "configuration"), (len(plan.tests), "test"), (plan.repetitions, "repetition"))]
        return cls(" × ".join(parts), plan.size, stop,
                   "Ctrl-C stops after the current repetition and keeps the rows measured")

    def begin(self, total: int) -> None:
        self._started = time.monotonic()
        if not self._tty:
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        # Rich would send what is written to stdout through the bar's console, to stderr: only where both are
        # the same terminal (rows then print above the bar); a redirected stdout gets its rows untouched
        self._p = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                           TimeRemainingColumn(), console=Console(stderr=True), transient=True,
                           redirect_stdout=sys.stdout.isatty())
        self._p.start()
        self._task = self._p.add_task("warming up", total=total)

    def elapsed(self) -> float:
        """Seconds since begin()."""
        return time.monotonic() - self._started

    def loading(self, description: str) -> None:
        self._stop()
        if self._p is not None:
            self._p.update(self._task, description=description)

    def estimate(self, seconds: float) -> None:
        if not self._tty and seconds < LONG_S:
            return
        self._lines = not self._tty
        self._say(f"bench: {self._what}: about {_duration(seconds)} ({self._ctrl_c})")

    def step(self, description: str) -> None:
        if self._p is not None:
            self._p.update(self._task, advance=1, description=description)
        self._stop()

    def row(self, rec: dict[str, Any], done: int) -> None:
        """One row finished: a line for it when stderr is not a terminal, for a long sweep."""
        if not self._lines:
            return
        total = self._rows
        left = f", about {_duration(self.elapsed() / done * (total - done))} left" if done < total else ""
        self._say(f"bench: {done:,}/{total:,} {rec['model_name']} {rec['test']}: {rec['avg_ts']:,.2f} t/s{left}")

    def _say(self, text: str) -> None:
        if self._p is not None:
            self._p.console.print(text, style="dim", markup=False, highlight=False)
        else:
            print(text, file=sys.stderr, flush=True)

    def end(self) -> None:
        if self._p is not None:
            self._p.stop()
            self._p = None


def _header(system: dict[str, Any]) -> str:
    ram = format_bytes(system.get("ram")) if system.get("ram") else "?"
    bw = f" · memory bandwidth {system['bandwidth'] / 1e9:.1f} GB/s" if system.get("bandwidth") else ""
    return (f"localgen {system['localgen_version']} · {system['build_commit']} · backend {system['backends']}\n"
            f"CPU {system['cpu_info']} · {system['cores']} cores · RAM {ram} · GPU {system['gpu_info'] or 'none'}{bw}")


def _emit(results: list[dict[str, Any]], system: dict[str, Any], output: str | None) -> None:
    from localgen.bench import records

    if not results or output == "jsonl":
        return
    if not output and any(r.get("client_side") for r in results):
        _emit_serving(results)
        sys.stdout.flush()
        return
    if output:
        sys.stdout.write(records.FORMATS[output](results))
    elif sys.stdout.isatty():
        _rich_table(results, system)
    else:
        sys.stdout.write("".join(f"<!-- {line} -->\n" for line in _header(system).splitlines()))
        sys.stdout.write(records.markdown(results))
    sys.stdout.flush()


def _emit_serving(results: list[dict[str, Any]], console: Any = None) -> None:
    """Client-side figures: tables within the width on a terminal, else Markdown."""
    from localgen.bench import serving

    if console is None and not sys.stdout.isatty():
        sys.stdout.write(serving.markdown(results))
        return
    from rich.console import Console

    console = console or Console()
    console.print(serving.LABEL, style="dim", markup=False, highlight=False)
    headers, cells = serving.table(results)
    several = {h for h in ("endpoint", "model") if len({c[headers.index(h)] for c in cells}) > 1}
    key = [i for i, h in enumerate(headers) if h in ("conc", "rate", *several)]
    for group in _column_groups(console, headers, cells, key):
        console.print(_table(headers, cells, group))


def _rich_table(results: list[dict[str, Any]], system: dict[str, Any], console: Any = None) -> None:
    """The header, the table and the bar chart, each within the console's width."""
    from rich.console import Console

    from localgen.bench import records

    console = console or Console()
    console.print(_header(system), style="dim", markup=False, highlight=False)
    headers, cells = records.rows(results)
    settings = {records.SHORT[c] for c in records.swept(results)}
    many = len({r["model_filename"] for r in results}) > 1
    key = [i for i, h in enumerate(headers) if h in settings or h == "test" or (many and h == "model")]
    for group in _column_groups(console, headers, cells, key):
        console.print(_table(headers, cells, group))
    console.print(bar_chart([(_label(r, results), r["avg_ts"]) for r in results], columns=console.width),
                  markup=False, highlight=False)


RIGHT = {"size", "params", "t/s", "ttft ms", "load s", "peak RSS", "of limit", "itl p50/p99 ms", "conc", "reqs",
         "prompt", "gen", "out tok/s", "req/s", "ttft p50/p90/p99 ms", "itl p50/p90/p99 ms", "e2e p50/p90/p99 ms"}


def _table(headers: list[str], cells: list[list[str]], columns: list[int]) -> Any:
    from rich.table import Table

    table = Table(show_edge=False, header_style="bold")
    for i in columns:  # a cell too wide wraps between words, never inside a number
        table.add_column(headers[i], justify="right" if headers[i] in RIGHT else "left", overflow="fold")
    for c in cells:
        table.add_row(*(c[i] for i in columns))
    return table


def _column_groups(console: Any, headers: list[str], cells: list[list[str]], key: list[int]) -> list[list[int]]:
    """The columns of each table to print: all of them in one where they fit the width; else as few tables
    as it takes, each repeating the columns that tell the rows apart (`key`: the swept settings and the test),
    t/s in the first, every other column in the first table with room for it, in the table's own order."""
    from rich.measure import Measurement

    def width(columns: set[int]) -> int:
        wide = console.options.update_width(1 << 16)  # the table's own width, not the console's cap on it
        return Measurement.get(console, wide, _table(headers, cells, sorted(columns))).maximum

    everything = set(range(len(headers)))
    if width(everything) <= console.width:
        return [sorted(everything)]
    groups: list[set[int]] = []
    rest = sorted(everything - set(key), key=lambda i: (headers[i] != "t/s", i))
    for i in rest:
        group = next((g for g in groups if width(g | {i}) <= console.width), None)
        if group is None:
            groups.append({*key, i})
        else:
            group.add(i)
    return [sorted(g) for g in groups]


def _label(r: dict[str, Any], all_records: list[dict[str, Any]]) -> str:
    from localgen.bench import records

    settings = " ".join(f"{records.SHORT[c]}={int(r[c]) if isinstance(r[c], bool) else r[c]}"
                        for c in records.swept(all_records))
    many = len({x["model_filename"] for x in all_records}) > 1
    return " ".join(x for x in ((r["model_name"] if many else ""), r["test"], settings) if x)


def bar_chart(items: list[tuple[str, float | None]], width: int = 40, columns: int | None = None) -> str:
    """Horizontal bars of t/s, one per configuration and test; a missing figure (None) gets no bar and no
    value. Within `columns` characters: the bars shrink, and below 10 characters each label goes on a line of
    its own above its bar."""
    if not items:
        return ""
    top = max((v for _, v in items if v), default=0.0) or 1.0
    pad = max(len(label) for label, _ in items)
    figures = [f"{v:,.1f} t/s" if v is not None else "" for _, v in items]
    room = (columns - 1 - max(len(f) for f in figures)) if columns else pad + 2 + width
    bar = min(width, room - pad - 2)
    apart = bar < min(10, width)
    if apart:
        bar = max(1, min(width, room))
    lines = []
    for (label, v), figure in zip(items, figures, strict=True):
        drawn = f"{'█' * max(1, round(v / top * bar))} {figure}" if v is not None else ""
        lines += [label, drawn] if apart else [f"{label.ljust(pad)}  {drawn}".rstrip()]
    return "\n".join(line for line in lines if line or not apart)


@bench_app.command("history")
def history_cmd(
    run_id: Annotated[int | None, typer.Argument(help="Show this run; without it, list the runs.")] = None,
    output: Annotated[str | None, typer.Option("--output", "-o", help="md, csv, json or jsonl.")] = None,
) -> None:
    """Past benchmark runs (kept in the data dir), newest first; or one run in full."""
    from localgen.bench import history, records

    if run_id is None:
        rows = history.runs()
        if not rows:
            print("no benchmark runs yet: localgen bench", file=sys.stderr)
            return
        print(f"{'ID':>4}  {'DATE':16}  {'RESULTS':>7}  COMMAND")
        for r in rows:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.created))
            print(f"{r.id:>4}  {when:16}  {len(r.records):>7}  {r.command}")
        return
    run = history.get(run_id)
    if output is not None and output not in records.FORMATS:
        raise UsageError(f"--output must be one of {', '.join(records.FORMATS)}")
    _emit(run.records, run.system, output)


@bench_app.command("compare")
def compare_cmd(
    a: Annotated[int, typer.Argument(help="The baseline run.")],
    b: Annotated[int, typer.Argument(help="The run to compare with it.")],
    json_out: Annotated[bool, typer.Option("--json", help="JSON on stdout.")] = False,
) -> None:
    """Two runs side by side: t/s of each matching test and configuration, and B/A."""
    import json

    from localgen.bench import history

    ra, rb = history.get(a), history.get(b)
    pairs = history.compare(ra, rb)
    rows = []
    for key, x, y in pairs:
        ta = x["avg_ts"] if x else None
        tb = y["avg_ts"] if y else None
        name = (x or y or {}).get("model_name", key["model_filename"])
        rows.append({**key, "model_name": name, "a_ts": ta, "b_ts": tb,
                     "ratio": round(tb / ta, 4) if ta and tb else None})
    if json_out:
        print(json.dumps({"a": a, "b": b, "results": rows}))
        return
    settings = [k for k in ("n_threads", "n_gpu_layers", "n_batch", "n_ubatch", "flash_attn", "type_k", "type_v")
                if len({r[k] for r in rows}) > 1]
    head = ["model", "test", *settings, f"run {a} t/s", f"run {b} t/s", "B/A"]
    cells = [[r["model_name"], r["test"], *[str(r[k]) for k in settings],
              f"{r['a_ts']:.2f}" if r["a_ts"] else "", f"{r['b_ts']:.2f}" if r["b_ts"] else "",
              f"{r['ratio']:.2f}x" if r["ratio"] else ""] for r in rows]  # a missing figure stays empty
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    for line in [head, *cells]:
        print("  ".join(v.rjust(w) if i >= len(head) - 3 else v.ljust(w)
                        for i, (v, w) in enumerate(zip(line, widths, strict=True))).rstrip())
    chart = [(f"{r['model_name']} {r['test']} run {a}", r["a_ts"]) for r in rows]
    chart += [(f"{r['model_name']} {r['test']} run {b}", r["b_ts"]) for r in rows]
    print()
    import shutil

    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    print(bar_chart(sorted(chart, key=lambda x: x[0]), columns=width))
