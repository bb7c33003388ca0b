"""The ladder on screen (`quantize --ladder`, `bench --quality`): rows measured one by one into bench's history, a
table with a closing verdict, or --json; Ctrl-C keeps and prints the rows measured."""

from __future__ import annotations

import json
import shlex
import sys
from typing import Any

import typer

from localgen.quant import ladder
from localgen.quant import measure as ms
from localgen.types import ModelRef
from localgen.units import format_bytes


def run_ladder(reference: ModelRef, files: list[ModelRef], text: str, text_label: str, settings: ms.Settings,
               speed: ladder.Speed, kld_bound: float, json_out: bool) -> None:
    """Measure every file against the reference; each row goes to bench's history as it is measured."""
    from localgen.bench import history, records
    from localgen.cli.output import ErrWriter
    from localgen.cli.perplexity import ChunkView

    err = ErrWriter()
    system = records.system_info()
    run_id = history.start(shlex.join(["localgen", *sys.argv[1:]]), system)
    found: list[ladder.Row] = []
    view = ChunkView(json_out)

    def step(what: str) -> None:
        view.end()
        err.line(what)

    try:
        for row in ladder.rows(reference, files, text, settings, speed, view.chunk, step):
            view.end()
            history.add(run_id, len(found), {**row.record(settings, speed, text_label), "kld_bound": kld_bound})
            found.append(row)
    except KeyboardInterrupt:
        view.end()
        if not found:  # stopped while the reference was measured: no row, no run to keep
            history.drop(run_id)
            err.interrupted("interrupted before the first row: nothing was measured, nothing saved")
            raise typer.Exit(130) from None
        show(found, kld_bound, json_out, run_id)
        rows = f"{len(found)} row{'s' if len(found) > 1 else ''}"
        err.interrupted(f"interrupted; the {rows} above were measured and kept (run {run_id})")
        raise typer.Exit(130) from None
    finally:
        view.end()
    show(found, kld_bound, json_out, run_id)
    err.line(f"saved as run {run_id}: localgen bench history {run_id}")


def show(found: list[ladder.Row], kld_bound: float, json_out: bool, run_id: int | None = None) -> None:
    """The table and the verdict on stdout, or one JSON document."""
    pick = ladder.best(found, kld_bound)
    if json_out:
        print(json.dumps({"run": run_id, "kld_bound": kld_bound, "rows": [r.__dict__ for r in found],
                          "best": pick.model if pick else None}))
        return
    if not found:
        return
    print(table(found))
    print(verdict(found, pick, kld_bound))


def _f(v: float | None, fmt: str) -> str:
    return format(v, fmt) if v is not None else "-"


def table(found: list[ladder.Row]) -> str:
    """One row per file: type, size, bits per weight, pp and tg t/s, PPL, mean KLD, KLD p99, top-1, fit."""
    head = ["model", "type", "size", "bpw", "pp t/s", "tg t/s", "PPL", "mean KLD", "KLD p99", "same top",
            "fits here"]
    cells = [[r.model, r.type_name + (" (ref)" if r.reference else ""), format_bytes(r.size),
              f"{r.bits_per_weight:.2f}", _f(r.pp_ts, ".1f"), _f(r.tg_ts, ".1f"), f"{r.ppl:.4f}",
              _f(r.kld, ".6f"), _f(r.kld_p99, ".6f"),
              f"{100 * r.same_top:.2f}%" if r.same_top is not None else "-", r.fits] for r in found]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    right = {2, 3, 4, 5, 6, 7, 8, 9}
    lines = []
    for line in [head, *cells]:
        lines.append("  ".join(v.rjust(w) if i in right else v.ljust(w)
                               for i, (v, w) in enumerate(zip(line, widths, strict=True))).rstrip())
    return "\n".join(lines)


def verdict(found: list[ladder.Row], pick: ladder.Row | None, kld_bound: float) -> str:
    """The closing line: the fastest type within the KLD bound (and that fits here)."""
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
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    for line in [head, *cells]:
        print("  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                        for i, (v, w) in enumerate(zip(line, widths, strict=True))).rstrip())
