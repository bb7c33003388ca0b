"""`localgen bench history` and `bench compare`: the runs bench keeps (bench/history.py), listed, shown in full in
any -o format, or two set side by side (speed, or a ladder's quality beside speed)."""

from __future__ import annotations

import sys
import time
from typing import Annotated, Any

import typer

from localgen.cli.bench.view import bar_chart, emit
from localgen.cli.output import aligned
from localgen.errors import UsageError


def history_cmd(
    run_id: Annotated[int | None, typer.Argument(metavar="ID",
                                                 help="Show this run; without it, list the runs.")] = None,
    output: Annotated[str | None, typer.Option("--output", "-o", help="md, csv, json or jsonl.")] = None,
) -> None:
    """Past benchmark runs (kept in the data dir), newest first; or one run in full."""
    from localgen.bench import history, records

    if output is not None and output not in records.FORMATS:
        raise UsageError(f"--output must be one of {', '.join(records.FORMATS)}, not {output!r}")
    if run_id is None:
        _list_runs(history.runs(), output)
        return
    run = history.get(run_id)
    _say_damaged(run)
    from localgen.cli import ladderview

    rungs = ladderview.quality_rows(run.records)
    if rungs:  # a ladder's run (quantize --ladder, bench --quality)
        ladderview.show(rungs, run.records[0].get("kld_bound", 0.05), output, run.id)
        return
    if output:
        sys.stdout.write(records.FORMATS[output](run.records))
        sys.stdout.flush()
        return
    emit(run.records, run.system, None)


def _list_runs(rows: list[Any], output: str | None) -> None:
    """Every run, newest first: a table (ID, date, results, command; `5 (1 partial)` where a test was stopped
    part-way), or each run's id, created (seconds since the epoch), results, partial (those of its results that
    are a stopped test's) and command in the -o format."""
    import csv
    import io
    import json

    docs = [{"id": r.id, "created": r.created, "results": r.results, "partial": r.partial, "command": r.command}
            for r in rows]
    cells = {r.id: f"{r.results}" + (f" ({r.partial} partial)" if r.partial else "") for r in rows}
    for r in rows:
        if r.created is None:
            from localgen.cli.output import ErrWriter

            ErrWriter().warn(f"run {r.id}: its date in the history no longer reads as one (damaged): shown as ?")
    if output == "json":
        print(json.dumps(docs, indent=2))
    elif output == "jsonl":
        sys.stdout.write("".join(json.dumps(d) + "\n" for d in docs))
    elif output == "csv":
        out = io.StringIO()
        w = csv.DictWriter(out, fieldnames=["id", "created", "results", "partial", "command"], lineterminator="\n")
        w.writeheader()
        w.writerows(docs)
        sys.stdout.write(out.getvalue())
    elif not rows:
        print("no benchmark runs yet: localgen bench", file=sys.stderr)
    elif output == "md":
        print("| ID | date | results | command |\n|---:|---|---:|---|")
        for d in docs:
            command = str(d["command"]).replace("|", "\\|")
            print(f"| {d['id']} | {_when(d['created'])} | {cells[d['id']]} | `{command}` |")
    else:
        width = max(7, *(len(c) for c in cells.values()))
        print(f"{'ID':>4}  {'DATE':16}  {'RESULTS':>{width}}  COMMAND")
        for d in docs:
            print(f"{d['id']:>4}  {_when(d['created']):16}  {cells[d['id']]:>{width}}  {d['command']}")


def _say_damaged(run: Any) -> None:
    """One line on stderr for results of a run that no longer read as records (left out of what is shown), and
    one for a run whose machine and build no longer read as such (its header left out)."""
    if run.system_damaged:
        from localgen.cli.output import ErrWriter

        ErrWriter().warn(f"run {run.id}: its machine and build in the history no longer read as such (damaged): "
                         "left out of its header")
    if run.damaged:
        from localgen.cli.output import ErrWriter, plural

        ErrWriter().warn(f"run {run.id}: {plural(run.damaged, 'result')} in the history no longer "
                         f"{'reads' if run.damaged == 1 else 'read'} as a record (damaged): left out")


def _when(created: float | None) -> str:
    return "?" if created is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(created))


def _stopped(row: dict[str, Any], side: str) -> str:
    """` (3 of 5 reps)` beside a side's figure where its row was stopped part-way (records.stopped_note)."""
    from localgen.bench import records

    return records.stopped_note({k: row[f"{side}_{k}"] for k in ("repetitions", "repetitions_planned")})


def compare_cmd(
    a: Annotated[int, typer.Argument(metavar="RUN_A", show_default=False,
                                     help="The baseline run's number (localgen bench history lists them).")],
    b: Annotated[int, typer.Argument(metavar="RUN_B", show_default=False, help="The run to compare with it.")],
    json_out: Annotated[bool, typer.Option("--json", help="JSON on stdout.")] = False,
) -> None:
    """Two runs side by side: t/s of each matching test and configuration, and B/A."""
    import json

    from localgen.bench import history

    ra, rb = history.get(a), history.get(b)
    for run in (ra, rb) if a != b else (ra,):
        _say_damaged(run)
    ka, kb = history.measured(ra), history.measured(rb)
    if ka and kb and ka != kb:  # their figures have nothing in common to set side by side
        raise UsageError(f"run {a} measured {ka} and run {b} measured {kb}: compare two runs that measured the same "
                         "thing")
    pairs = history.compare(ra, rb)
    from localgen.cli import ladderview

    if any((x or y or {}).get("test") == "quality" for _, x, y in pairs):  # ladders: quality beside speed
        ladderview.compare(a, b, pairs, json_out)
        return
    rows = []
    for key, x, y in pairs:
        ta = x["avg_ts"] if x else None
        tb = y["avg_ts"] if y else None
        name = (x or y or {}).get("model_name", key["model_filename"])
        rows.append({**key, "model_name": name, "a_ts": ta, "b_ts": tb,
                     "ratio": round(tb / ta, 4) if ta and tb else None,
                     # a row stopped part-way (Ctrl-C inside its test): the repetitions it holds, of those asked
                     **{f"{side}_{k}": (r or {}).get(k) for side, r in (("a", x), ("b", y))
                        for k in ("repetitions", "repetitions_planned")}})
    if json_out:
        print(json.dumps({"a": a, "b": b, "results": rows}))
        return
    settings = [k for k in ("n_threads", "n_gpu_layers", "main_gpu", "n_cpu_moe", "n_batch", "n_ubatch", "flash_attn",
                            "type_k", "type_v", "tensor_buft_overrides") if len({r[k] for r in rows}) > 1]
    head = ["model", "test", *settings, f"run {a} t/s", f"run {b} t/s", "B/A"]
    cells = [[r["model_name"], r["test"], *["-" if r[k] is None else str(r[k]) for k in settings],  # none: a server's
              *[f"{r[f'{s}_ts']:.2f}{_stopped(r, s)}" if r[f"{s}_ts"] else "" for s in "ab"],
              f"{r['ratio']:.2f}x" if r["ratio"] else ""] for r in rows]  # a missing figure stays empty
    print("\n".join(aligned([head, *cells], right=range(len(head) - 3, len(head)))))
    def bar(r: dict[str, Any], run: int) -> str:  # the settings that differ between rows tell the bars apart
        from localgen.bench import records

        told = [f"{records.SHORT[k]}={int(r[k]) if isinstance(r[k], bool) else r[k]}" for k in settings
                if r[k] is not None]  # a setting the row has not (an --endpoint run's): not named
        return " ".join([r["model_name"], r["test"], *told, f"run {run}"])

    chart = [(bar(r, a), r["a_ts"]) for r in rows]
    chart += [(bar(r, b), r["b_ts"]) for r in rows]
    print()
    import shutil

    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    print(bar_chart(sorted(chart, key=lambda x: x[0]), columns=width))
