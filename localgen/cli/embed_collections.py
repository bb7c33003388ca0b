"""`localgen collections`: the collections `embed --store` keeps (name, model, pooling, size, entries, when last
written), `collections show NAME` for one collection's entries (ids and the start of each text), and
`collections rm` to remove whole collections or some of their entries (--id)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from localgen.embeddings.store import Listed

HELP = ("List the embedding collections (`embed --store`); `collections show NAME` lists one's entries, "
        "`collections rm NAME` removes one.")
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

    from localgen.cli.output import ErrWriter, TextWriter, aligned
    from localgen.embeddings import store

    listed = store.listing()
    out = TextWriter(sys.stdout)
    if not listed:
        ErrWriter().line("no collections yet (make one with `localgen embed --store NAME`)")
    if json_out:
        out.write(json.dumps([_as_json(c) for c in listed], ensure_ascii=False) + "\n")
        return
    if not listed:
        return
    rows = [["NAME", "MODEL", "POOLING", "DIMENSIONS", "ENTRIES", "LAST WRITTEN (UTC)"]]
    rows += [[c.name, c.model, c.pooling, str(c.dimensions), f"{c.entries:,}", _utc(c.last_written).replace("T", " ")]
             for c in listed]
    for line in aligned(rows):
        if not out.write(line + "\n"):
            return


START_CHARS = 80  # of each text, in `show`


@collections_app.command("show")
def show(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The collection.")],
    json_out: Annotated[
        bool, typer.Option("--json", help="One JSON object: the collection as `collections --json` lists it, and "
                                          "`items`, each {id, start, chars} (the text's first 80 characters "
                                          "and its length).")
    ] = False,
) -> None:
    """A collection's model, pooling, dimensions and when last written, then its entries in the order stored:
    each id and the start of its text."""
    import json
    import sys

    from localgen.cli.output import TextWriter, aligned
    from localgen.embeddings import store
    from localgen.text import checked

    c = store.described(checked(name, "the collection"))
    out = TextWriter(sys.stdout)
    if json_out:  # written as it is read: a large collection is never held whole
        head = json.dumps(_as_json(c), ensure_ascii=False)[:-1]
        if not out.write(f'{head}, "items": ['):
            return
        for k, (ident, start, chars) in enumerate(store.entries(name, START_CHARS)):
            item = json.dumps({"id": ident, "start": start, "chars": chars}, ensure_ascii=False)
            if not out.write(("" if k == 0 else ", ") + item):
                return
        out.write("]}\n")
        return
    about = [("name", c.name), ("model", c.model), ("pooling", c.pooling), ("dimensions", str(c.dimensions)),
             ("normalized", "yes" if c.normalized else "no"), ("entries", f"{c.entries:,}"),
             ("created", _utc(c.created).replace("T", " ") + " UTC"),
             ("last written", _utc(c.last_written).replace("T", " ") + " UTC")]
    for key, value in about:
        if not out.write(f"{key:<14}{value}\n"):
            return
    if not c.entries:
        return
    rows = [[ident, _start(start, chars)] for ident, start, chars in store.entries(name, START_CHARS)]
    if not out.write("\n"):
        return
    for line in aligned([["ID", "TEXT"], *rows]):
        if not out.write(line + "\n"):
            return


def _start(text: str, chars: int) -> str:
    """The start of a text on one line: white space as single spaces, '…' where it goes on."""
    one_line = " ".join(text.split())
    return one_line + ("…" if chars > len(text) else "")


def _as_json(c: Listed) -> dict[str, object]:
    return {"name": c.name, "model": c.model, "pooling": c.pooling, "dimensions": c.dimensions,
            "normalized": c.normalized, "entries": c.entries, "created_utc": _utc(c.created),
            "last_written_utc": _utc(c.last_written)}


@collections_app.command("rm")
def rm(
    names: Annotated[list[str], typer.Argument(metavar="NAME", show_default=False, help="Collections to remove.")],
    ids: Annotated[
        list[str] | None,
        typer.Option("--id", show_default=False,
                     help="Remove only this entry of the one collection named (repeat for more); the collection "
                          "stays, even empty."),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Remove whole collections without asking (needed when "
                                                           "not on a terminal).")] = False,
) -> None:
    """Remove collections with their entries (or some entries, --id); an unknown name or id removes nothing. A
    whole collection is asked about first, as `rm` asks about a model: its vectors took the model's time."""
    from localgen.cli.output import ErrWriter
    from localgen.embeddings import store
    from localgen.errors import UsageError
    from localgen.text import checked

    for name in names:
        checked(name, "the collection")
    for ident in ids or ():
        checked(ident, "--id")
    err = ErrWriter()
    if ids:
        if len(names) != 1:
            raise UsageError("--id removes entries of one collection: give one NAME")
        removed, left = store.remove_ids(names[0], ids, waiting=err.line_once)
        err.line(f"{names[0]}: removed {_entries(removed)}, {left:,} left")
        return
    if not yes:
        _confirm(names)
    for name, count in store.remove(names, waiting=err.line_once).items():
        err.line(f"removed the collection {name} ({_entries(count)})")


def _confirm(names: list[str]) -> None:
    """Ask before removing whole collections (or want --yes when not on a terminal); a no is exit 1. Unknown
    names are the usual error first, nothing asked or removed."""
    from localgen.cli.output import confirm_removal
    from localgen.embeddings import store

    known = {c.name: c.entries for c in store.listing()}
    if any(n not in known for n in names):
        return  # store.remove names the unknown one, removing nothing
    wanted = list(dict.fromkeys(names))
    what = ", ".join(f"{n} ({_entries(known[n])})" for n in wanted)
    confirm_removal(f"the collection{'s' if len(wanted) > 1 else ''} {what}")


def _entries(n: int) -> str:
    return f"{n:,} entr{'y' if n == 1 else 'ies'}"
