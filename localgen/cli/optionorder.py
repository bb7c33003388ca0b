"""The order a command's options were given in. Click hands each repeatable option its own list, so
`run -a x.png --image y.png` would not say which came first; a command built as OrderedCommand (app.py builds every
command so) keeps it, for what must follow it (run's attachments, in the order of the command line)."""

from __future__ import annotations

from collections.abc import Collection

import typer
from typer.core import TyperCommand

_ORDER = "localgen.option_order"  # in the context's meta: the options as given, one name per occurrence
_ARGS = "localgen.args"  # in the context's meta: the command's arguments as typed


class OrderedCommand(TyperCommand):
    """A Typer command that records its options' order as it parses them (given_in_order reads it)."""

    # (Typer gives its commands typer.Context, a subclass of the Context Click's signature names)
    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:  # type: ignore[override]
        if args:  # Click's parser alone, on a copy (it consumes its list): no value converted, no callback run
            _, _, order = self.make_parser(ctx).parse_args(args=list(args))
            ctx.meta[_ORDER] = [param.name for param in order]
            ctx.meta[_ARGS] = list(args)
        return super().parse_args(ctx, args)


def given_in_order(ctx: typer.Context, names: Collection[str]) -> list[str]:
    """Of the parameters `names`, those given on the command line, once per time each was given, in that order."""
    return [n for n in ctx.meta.get(_ORDER, ()) if n in names]


def typed_as(ctx: typer.Context, name: str) -> str:
    """How the user last spelled parameter `name`'s flag (`-ngl` or `--gpu-layers`), for a message about it; its
    first long name where it was not typed."""
    param = next(p for p in ctx.command.params if p.name == name)
    spellings = [*param.opts, *param.secondary_opts]
    return last_typed(list(ctx.meta.get(_ARGS, ())), spellings) or next(
        (flag for flag in spellings if flag.startswith("--")), spellings[0])


def last_typed(args: list[str], spellings: list[str], joined: bool = False) -> str | None:
    """Which of a flag's `spellings` the user gave last (`-ngl`, `--gpu-layers=3`: `--gpu-layers`), in the command's
    own arguments (those after `--` are another program's: launch's agent's); with `joined`, a short flag joined to
    its value too (`-c-1`: `-c`), where a message is about that flag's value. None where none was given."""
    mine = args[:args.index("--")] if "--" in args else args
    for a in reversed(mine):
        if a.split("=", 1)[0] in spellings:
            return a.split("=", 1)[0]
        if joined and len(a) > 2 and a[:2] in spellings and not a.startswith("--"):
            return a[:2]
    return None
