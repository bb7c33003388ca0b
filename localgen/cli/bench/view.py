"""What `localgen bench` shows: the progress of a sweep (an estimate first; a Rich bar on a terminal, a line
a row in a pipe for long sweeps), its results as tables that fit the terminal's width, and bar charts."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from localgen.cli.output import aligned, plural
from localgen.units import format_bytes

LONG_S = 120.0  # in a pipe, a sweep foreseen to take this long says so first and reports each row


def duration(seconds: float) -> str:
    """`45 s`, `3 min`, `1 h 20 min`."""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


class ProgressView:
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
        self._warned: set[str] = set()  # each warning once, whatever number of configurations says it

    @classmethod
    def of(cls, plan: Any, stop: Callable[[], None]) -> ProgressView:
        """The view of a local plan."""
        parts = [f"{n:,} {word}{'s' if n > 1 else ''}" for n, word in (
            (len(plan.configs), "configuration"), (len(plan.tests), "test"), (plan.repetitions, "repetition"))]
        return cls(" × ".join(parts), plan.size, stop,
                   "Ctrl-C stops after the current repetition and keeps the rows measured")

    def begin(self, total: int) -> None:
        self._started = time.monotonic()
        if not self._tty:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        from localgen.cli.output import rich_console

        # Rich would send what is written to stdout through the bar's console, to stderr: only where both are
        # the same terminal (rows then print above the bar); a redirected stdout gets its rows untouched
        self._p = Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                           TimeRemainingColumn(), console=rich_console(stderr=True), transient=True,
                           redirect_stdout=sys.stdout.isatty())
        from localgen.cli.progress import cursor_guard

        self._term = cursor_guard(self._p.console)  # a SIGTERM or SIGHUP: the cursor shown again
        self._p.start()
        self._task = self._p.add_task("warming up", total=total)

    def elapsed(self) -> float:
        """Seconds since begin()."""
        return time.monotonic() - self._started

    def loading(self, description: str) -> None:
        self._stop()
        if self._p is not None:
            self._p.update(self._task, description=description)

    def loaded(self, name: str, path: str, values: dict[str, Any], origins: dict[str, str]) -> None:
        from localgen.cli.hints import record_note

        record_note(self._say, name, path, values, origins)  # a record is never a silent default
        self._stop()  # Ctrl-C during the load: nothing measured yet

    def warning(self, text: str) -> None:
        if text not in self._warned:
            self._warned.add(text)
            self._say(f"warning: {text}")

    def estimate(self, seconds: float) -> None:
        self._stop()  # Ctrl-C during the warm-up: before the first repetition
        if not self._tty and seconds < LONG_S:
            return
        self._lines = not self._tty
        self._say(f"bench: {self._what}: about {duration(seconds)} ({self._ctrl_c})")

    def step(self, description: str) -> None:
        if self._p is not None:
            self._p.update(self._task, advance=1, description=description)
        self._stop()

    def row(self, rec: dict[str, Any], done: int) -> None:
        """One row finished: a line for it when stderr is not a terminal, for a long sweep."""
        if not self._lines:
            return
        from localgen.bench import records

        total = self._rows
        stopped = records.stopped_note(rec)  # the run's last row: nothing is left
        left = f", about {duration(self.elapsed() / done * (total - done))} left" if done < total and not stopped \
            else ""
        self._say(f"bench: {done:,}/{total:,} {rec['model_name']} {rec['test']}{stopped}: {rec['avg_ts']:,.2f} t/s"
                  f"{left}")

    def _say(self, text: str) -> None:
        if self._p is not None:
            self._p.console.print(text, style="dim", markup=False, highlight=False)
        else:
            print(text, file=sys.stderr, flush=True)

    def end(self) -> None:
        if self._p is not None:
            self._p.stop()
            self._term.uninstall()
            self._p = None


def header(system: dict[str, Any]) -> str:
    if not system:  # a run whose machine and build no longer read as such (history.Run.system_damaged)
        return "machine and build unknown (damaged in the history)"
    ram = format_bytes(system.get("ram")) if system.get("ram") else "?"
    bw = f" · memory bandwidth {system['bandwidth'] / 1e9:.1f} GB/s" if system.get("bandwidth") else ""
    known = {k: system.get(k, "?") for k in ("localgen_version", "build_commit", "backends", "cpu_info")}
    cores = plural(system["cores"], "core") if isinstance(system.get("cores"), int) else "? cores"
    return (f"localgen {known['localgen_version']} · {known['build_commit']} · backend {known['backends']}\n"
            f"CPU {known['cpu_info']} · {cores} · RAM {ram} · GPU {system.get('gpu_info') or 'none'}{bw}")


def emit(results: list[dict[str, Any]], system: dict[str, Any], output: str | None) -> None:
    from localgen.bench import records

    if not results or output == "jsonl":
        return
    if not output and any(r.get("client_side") for r in results):
        emit_serving(results)
        sys.stdout.flush()
        return
    if output:
        sys.stdout.write(records.FORMATS[output](results))
    elif sys.stdout.isatty():
        rich_table(results, system)
    else:
        sys.stdout.write("".join(f"<!-- {line} -->\n" for line in header(system).splitlines()))
        sys.stdout.write(records.markdown(results))
    sys.stdout.flush()


def emit_serving(results: list[dict[str, Any]], console: Any = None) -> None:
    """Client-side figures: tables within the width on a terminal, else Markdown."""
    from localgen.bench import serving

    if console is None and not sys.stdout.isatty():
        sys.stdout.write(serving.markdown(results))
        return
    from localgen.cli.output import rich_console

    console = console or rich_console()
    console.print(serving.LABEL, style="dim", markup=False, highlight=False)
    headers, cells = serving.table(results)
    several = {h for h in ("endpoint", "model") if len({c[headers.index(h)] for c in cells}) > 1}
    key = [i for i, h in enumerate(headers) if h in ("conc", "rate", *several)]
    for group in column_groups(console, headers, cells, key):
        console.print(table(headers, cells, group))


def rich_table(results: list[dict[str, Any]], system: dict[str, Any], console: Any = None) -> None:
    """The header, the table and the bar chart, each within the console's width."""
    from localgen.bench import records
    from localgen.cli.output import rich_console

    console = console or rich_console()
    console.print(header(system), style="dim", markup=False, highlight=False)
    headers, cells = records.rows(results)
    settings = {records.SHORT[c] for c in records.swept(results)}
    many = len({r["model_filename"] for r in results}) > 1
    key = [i for i, h in enumerate(headers) if h in settings or h == "test" or (many and h == "model")]
    for group in column_groups(console, headers, cells, key):
        console.print(table(headers, cells, group))
    console.print(bar_chart([(label(r, results), r["avg_ts"]) for r in results], columns=console.width),
                  markup=False, highlight=False)


RIGHT = {"size", "params", "t/s", "ttft ms", "load s", "peak RSS", "of BW limit", "itl p50/p99 ms", "conc", "reqs",
         "prompt", "gen", "out tok/s", "req/s", "ttft p50/p90/p99 ms", "itl p50/p90/p99 ms", "e2e p50/p90/p99 ms"}


def table(headers: list[str], cells: list[list[str]], columns: list[int]) -> Any:
    from rich.table import Table

    table = Table(show_edge=False, header_style="bold")
    for i in columns:  # a cell too wide wraps between words, never inside a number
        table.add_column(headers[i], justify="right" if headers[i] in RIGHT else "left", overflow="fold")
    for c in cells:
        table.add_row(*(c[i] for i in columns))
    return table


def column_groups(console: Any, headers: list[str], cells: list[list[str]], key: list[int]) -> list[list[int]]:
    """The columns of each table to print: all of them in one where they fit the width; else as few tables
    as it takes, each repeating the columns that tell the rows apart (`key`: the swept settings and the test),
    t/s in the first, every other column in the first table with room for it, in the table's own order."""
    from rich.measure import Measurement

    def width(columns: set[int]) -> int:
        wide = console.options.update_width(1 << 16)  # the table's own width, not the console's cap on it
        return Measurement.get(console, wide, table(headers, cells, sorted(columns))).maximum

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


def label(r: dict[str, Any], all_records: list[dict[str, Any]]) -> str:
    from localgen.bench import records

    settings = " ".join(f"{records.SHORT[c]}={int(r[c]) if isinstance(r.get(c), bool) else r.get(c, 0)}"
                        for c in records.swept(all_records))
    many = len({x["model_filename"] for x in all_records}) > 1
    return " ".join(x for x in ((r["model_name"] if many else ""), r["test"] + records.stopped_note(r), settings) if x)


def bar_chart(items: list[tuple[str, float | None]], width: int = 40, columns: int | None = None) -> str:
    """Horizontal bars of t/s, one per configuration and test; a missing figure (None) gets no bar and no
    value. Within `columns` characters: the bars shrink, and below 10 characters each label goes on a line of
    its own above its bar."""
    if not items:
        return ""
    from rich.cells import cell_len  # a label's width as a terminal draws it (a CJK file name is two cells a character)

    top = max((v for _, v in items if v), default=0.0) or 1.0
    pad = max(cell_len(label) for label, _ in items)
    figures = [f"{v:,.1f} t/s" if v is not None else "" for _, v in items]
    room = (columns - 1 - max(len(f) for f in figures)) if columns else pad + 2 + width
    bar = min(width, room - pad - 2)
    apart = bar < min(10, width)
    if apart:
        bar = max(1, min(width, room))
    rows = [[label, f"{'█' * max(1, round(v / top * bar))} {figure}" if v is not None else ""]
            for (label, v), figure in zip(items, figures, strict=True)]
    if not apart:
        return "\n".join(aligned(rows))  # each label padded by the cells a terminal draws
    return "\n".join(line for row in rows for line in row if line)

