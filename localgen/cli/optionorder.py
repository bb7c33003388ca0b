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
    args = list(ctx.meta.get(_ARGS, ()))
    mine = args[:args.index("--")] if "--" in args else args  # (what follows `--` is another program's: launch's)
    typed = (arg.split("=", 1)[0] for arg in reversed(mine))
    return next((flag for flag in typed if flag in spellings),
                next((flag for flag in spellings if flag.startswith("--")), spellings[0]))
