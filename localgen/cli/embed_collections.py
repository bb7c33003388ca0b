"""`localgen collections`: the collections `embed --store` keeps (name, model, pooling, size, entries, when last
written), and `collections rm` to remove whole collections or some of their entries (--id)."""

from __future__ import annotations

from typing import Annotated

import typer

HELP = "List the embedding collections (`embed --store`); `collections rm NAME` removes one."
collections_app = typer.Typer(name="collections", invoke_without_command=True, no_args_is_help=False, help=HELP)

Json = Annotated[
    bool, typer.Option("--json", help="A JSON list of objects (name, model, pooling, dimensions, normalized, entries, "
                                      "created_utc, last_written_utc).")
]


@collections_app.callback()
def collections(ctx: typer.Context, json_out: Json = False) -> None:
    """One line per collection: name, model, pooling, dimensions, entries, when an entry was last stored (UTC)."""
    if ctx.invoked_subcommand is None:
        _list(json_out)


@collections_app.command("list")
def list_collections(json_out: Json = False) -> None:
    """The same as `localgen collections` (as llm's `collections list`)."""
    _list(json_out)


def _utc(t: float) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))


def _list(json_out: bool) -> None:
    import json
    import sys

    from localgen.cli.output import ErrWriter, TextWriter
    from localgen.embeddings import store

    listed = store.listing()
    out = TextWriter(sys.stdout)
    if not listed:
        ErrWriter().line("no collections yet (make one with `localgen embed --store NAME`)")
    if json_out:
        out.write(json.dumps([{"name": c.name, "model": c.model, "pooling": c.pooling, "dimensions": c.dimensions,
                               "normalized": c.normalized, "entries": c.entries, "created_utc": _utc(c.created),
                               "last_written_utc": _utc(c.last_written)} for c in listed], ensure_ascii=False) + "\n")
        return
    if not listed:
        return
    rows = [["NAME", "MODEL", "POOLING", "DIMENSIONS", "ENTRIES", "LAST WRITTEN (UTC)"]]
    rows += [[c.name, c.model, c.pooling, str(c.dimensions), f"{c.entries:,}", _utc(c.last_written).replace("T", " ")]
             for c in listed]
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    for r in rows:
        if not out.write("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() + "\n"):
            return


@collections_app.command("rm")
def rm(
    names: Annotated[list[str], typer.Argument(show_default=False, help="Collections to remove.")],
    ids: Annotated[
        list[str] | None,
        typer.Option("--id", show_default=False,
                     help="Remove only this entry of the one collection named (repeat for more); the collection "
                          "stays, even empty."),
    ] = None,
) -> None:
    """Remove collections with their entries (or some entries, --id); an unknown name or id removes nothing."""
    from localgen.cli.output import ErrWriter
    from localgen.embeddings import store
    from localgen.errors import UsageError

    err = ErrWriter()
    if ids:
        if len(names) != 1:
            raise UsageError("--id removes entries of one collection: give one NAME")
        removed, left = store.remove_ids(names[0], ids)
        err.line(f"{names[0]}: removed {_entries(removed)}, {left:,} left")
        return
    for name, count in store.remove(names).items():
        err.line(f"removed the collection {name} ({_entries(count)})")


def _entries(n: int) -> str:
    return f"{n:,} entr{'y' if n == 1 else 'ies'}"
