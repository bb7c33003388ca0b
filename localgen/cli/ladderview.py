"""The ladder on screen (`quantize --ladder`, `bench --quality`): rows measured one by one into bench's history, a
table with a closing verdict, or --json; Ctrl-C keeps and prints the rows measured."""

from __future__ import annotations

import json
import shlex
import sys
from typing import TYPE_CHECKING, Any

import typer

from localgen.cli.output import aligned
from localgen.cli.signals import term_as_interrupt
from localgen.errors import LocalgenError
from localgen.quant import ladder
from localgen.quant import measure as ms
from localgen.types import ModelRef
from localgen.units import format_bytes

if TYPE_CHECKING:
    from localgen.engine.perplexity import Text


@term_as_interrupt()
def run_ladder(reference: ModelRef, files: list[ModelRef], text: Text | str, text_label: str, settings: ms.Settings,
               speed: ladder.Speed, kld_bound: float, output: str | None) -> None:
    """Measure every file against the reference; each row goes to bench's history as it is measured. `output`:
    None (a table and the verdict), or one of bench's -o formats (show). A SIGTERM or SIGHUP (`timeout`) stops it
    as Ctrl-C does, the rows measured printed; the process then ends by that signal."""
    from localgen.bench import history, records
    from localgen.cli.output import ErrWriter
    from localgen.cli.perplexity import ChunkView

    err = ErrWriter()
    system = records.system_info()
    recording = history.start(shlex.join(["localgen", *sys.argv[1:]]), system)
    found: list[ladder.Row] = []
    view = ChunkView(output is not None)

    def step(what: str) -> None:
        view.end()
        err.line(what)

    from localgen.cli.cpuload import CpuLoad

    # what other work takes of the CPUs is said only where a speed is measured (`-p 0 -n 0`: none is)
    load = CpuLoad.before(err, "the speeds will favour whichever type was measured when it was quieter") \
        if speed.timed else None
    kept = 0  # rows in the history
    try:
        for row in ladder.rows(reference, files, text, settings, speed, view.chunk, step):
            view.end()
            if load is not None:
                load.sample(_Notes(err))
            found.append(row)
            history.add(recording, kept, {**row.record(settings, speed, text_label), "kld_bound": kld_bound})
            kept += 1
    except KeyboardInterrupt:
        view.end()
        if not found:  # stopped while the reference was measured: no row, no run kept
            err.interrupted("interrupted before the first row was whole: nothing saved")
            raise typer.Exit(130) from None
        show(found, kld_bound, output, recording.id)
        rows = "row above was" if len(found) == 1 else f"{len(found)} rows above were"
        err.interrupted(f"interrupted; the {rows} measured and kept (run {recording.id})" if recording.id else
                        f"interrupted; the {rows} measured; none is kept in the history")
        raise typer.Exit(130) from None
    except LocalgenError:
        view.end()
        if found:  # a history that cannot be written, say: the rows measured are shown before the error
            show(found, kld_bound, output, recording.id)
            from localgen.cli.output import plural

            err.line(f"{plural(len(found), 'row')} measured; {kept_where(kept, len(found), recording.id)}")
        raise
    finally:
        view.end()
    show(found, kld_bound, output, recording.id)
    if recording.id is not None:
        err.line(f"saved as run {recording.id}: localgen bench history {recording.id}")
    busy = load.busy() if load is not None else None
    if busy is not None:
        err.warn(f"measured on a busy machine: other work took {busy}, so the speeds reflect it; measure again "
                 "on a quiet machine before choosing a type by its speed")


class _Notes:
    """Where CpuLoad.sample says that other work took the CPUs while a row was measured: a warning line."""

    def __init__(self, err: Any) -> None:
        self.err = err

    def note(self, text: str) -> None:
        self.err.warn(text.replace("that configuration", "that type"))


def kept_where(kept: int, measured: int, run_id: int | None) -> str:
    """Where the rows of a run that stopped on an error are kept (bench's sweep says it too)."""
    if not kept:
        return "none is kept in the history"
    which = "kept" if kept == measured else f"{kept} of them kept"
    return f"{which} as run {run_id}: localgen bench history {run_id}"


def show(found: list[ladder.Row], kld_bound: float, output: str | None, run_id: int | None = None) -> None:
    """The table and the verdict on stdout; or the rows as `output` says: md (a Markdown table, the verdict after
    it), csv (a row's fields), json (one document: the run, the bound, the rows and the pick), jsonl (a row a
    line)."""
    pick = ladder.best(found, kld_bound)
    if output == "json":
        print(json.dumps({"run": run_id, "kld_bound": kld_bound, "rows": [r.__dict__ for r in found],
                          "best": pick.model if pick else None}))
        return
    if output == "jsonl":
        sys.stdout.write("".join(json.dumps(r.__dict__) + "\n" for r in found))
        return
    if output == "csv":
        import csv
        import io

        out = io.StringIO()
        w = csv.DictWriter(out, fieldnames=list(ladder.Row.__dataclass_fields__), lineterminator="\n")
        w.writeheader()
        for r in found:
            w.writerow(r.__dict__)
        sys.stdout.write(out.getvalue())
        return
    if not found:
        return
    if output == "md":
        print(markdown(found))
        print()
        print(verdict(found, pick, kld_bound))
        return
    print(table(found))
    print(verdict(found, pick, kld_bound))


def _cells(found: list[ladder.Row]) -> tuple[list[str], list[list[str]]]:
    head = ["model", "type", "size", "bpw", "pp t/s", "tg t/s", "PPL", "mean KLD", "KLD p99", "same top",
            "fits here"]
    cells = [[r.model, r.type_name + (" (ref)" if r.reference else ""), format_bytes(r.size),
              f"{r.bits_per_weight:.2f}", _f(r.pp_ts, ".1f"), _f(r.tg_ts, ".1f"), f"{r.ppl:.4f}",
              _f(r.kld, ".6f"), _f(r.kld_p99, ".6f"),
              f"{100 * r.same_top:.2f}%" if r.same_top is not None else "-", r.fits] for r in found]
    return head, cells


def markdown(found: list[ladder.Row]) -> str:
    """The table in Markdown."""
    head, cells = _cells(found)
    right = {2, 3, 4, 5, 6, 7, 8, 9}
    sep = ["-" * (len(h) - 1) + ":" if i in right else "-" * len(h) for i, h in enumerate(head)]
    return "\n".join("| " + " | ".join(line) + " |" for line in [head, sep, *cells])


def _f(v: float | None, fmt: str) -> str:
    return format(v, fmt) if v is not None else "-"


def table(found: list[ladder.Row]) -> str:
    """One row per file: type, size, bits per weight, pp and tg t/s, PPL, mean KLD, KLD p99, top-1, fit."""
    head, cells = _cells(found)
    return "\n".join(aligned([head, *cells], right={2, 3, 4, 5, 6, 7, 8, 9}))


def verdict(found: list[ladder.Row], pick: ladder.Row | None, kld_bound: float) -> str:
    """The closing line: the fastest type within the KLD bound (and that fits here); where only the reference was
    measured (a Ctrl-C before the next row), or nothing was timed (-p 0 -n 0), it says so instead of naming the
    fastest."""
    if found and all(r.reference for r in found):
        return f"only the reference {found[0].model} was measured: no quantization to choose from"
    if not any(r.tg_ts is not None or r.pp_ts is not None for r in found):
        within = [r.model for r in found if not r.reference and r.kld is not None and r.kld <= kld_bound
                  and r.fits != "won't fit"]
        return f"none was timed (-p 0 -n 0); within a mean KLD of {kld_bound}: {', '.join(within) or 'none'}"
    if pick is None:
        return f"none is within a mean KLD of {kld_bound} and fits here"
    if pick.reference:
        return (f"fastest within a mean KLD of {kld_bound}: {pick.model} itself (no quantization measured is "
                "faster within the bound)")
    return (f"fastest within a mean KLD of {kld_bound}: {pick.model} ({pick.type_name}, {_f(pick.tg_ts, '.1f')} t/s "
            f"generating, mean KLD {_f(pick.kld, '.4f')})")


def quality_rows(records: list[dict[str, Any]]) -> list[ladder.Row]:
    """A run's ladder rows back from bench's history."""
    fields = set(ladder.Row.__dataclass_fields__)
    return [ladder.Row(**{k: v for k, v in r.items() if k in fields}) for r in records
            if r.get("test") == ladder.QUALITY_TEST]


def compare(a: int, b: int, pairs: list[tuple[dict[str, Any], Any, Any]], json_out: bool) -> None:
    """Two ladder runs side by side (bench compare): each file's mean KLD, PPL and generation speed in both."""
    rows = []
    for key, x, y in pairs:
        name = (x or y or {}).get("model_name", key["model_filename"])
        rows.append({"model_name": name, "model_filename": key["model_filename"],
                     "a_kld": (x or {}).get("kld"), "b_kld": (y or {}).get("kld"),
                     "a_ppl": (x or {}).get("ppl"), "b_ppl": (y or {}).get("ppl"),
                     "a_tg_ts": (x or {}).get("tg_ts"), "b_tg_ts": (y or {}).get("tg_ts")})
    if json_out:
        print(json.dumps({"a": a, "b": b, "results": rows}))
        return
    head = ["model", f"run {a} KLD", f"run {b} KLD", f"run {a} PPL", f"run {b} PPL", f"run {a} tg t/s",
            f"run {b} tg t/s"]
    cells = [[r["model_name"], _f(r["a_kld"], ".6f"), _f(r["b_kld"], ".6f"), _f(r["a_ppl"], ".4f"),
              _f(r["b_ppl"], ".4f"), _f(r["a_tg_ts"], ".1f"), _f(r["b_tg_ts"], ".1f")] for r in rows]
    print("\n".join(aligned([head, *cells], right=range(1, len(head)))))
