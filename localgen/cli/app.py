"""The Typer app: global options and the command table. Command bodies live one module per group and
are imported only for the command that runs (a one-shot `run` pays for nothing else)."""

from __future__ import annotations

import importlib
import inspect
from typing import Annotated

import typer

# command name → (module, attribute): a function becomes a command, a Typer app a command group
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("localgen.cli.run.command", "run"),
    "chat": ("localgen.cli.chat.command", "chat"),
    "serve": ("localgen.cli.serve.command", "serve"),
    "ps": ("localgen.cli.serve.ps", "ps"),
    "stop": ("localgen.cli.serve.stop", "stop"),
    "launch": ("localgen.cli.launch", "launch"),
    "pull": ("localgen.cli.models.manage", "pull"),
    "list": ("localgen.cli.models.manage", "list_models"),
    "show": ("localgen.cli.models.show", "show"),
    "rm": ("localgen.cli.models.manage", "rm"),
    "create": ("localgen.cli.models.presets", "create"),
    "cp": ("localgen.cli.models.presets", "cp"),
    "quantize": ("localgen.cli.quantize", "quantize"),
    "perplexity": ("localgen.cli.perplexity", "perplexity"),
    "bench": ("localgen.cli.bench.command", "bench_app"),
    "fit": ("localgen.cli.fit", "fit"),
    "doctor": ("localgen.cli.doctor", "doctor"),
    "tune": ("localgen.cli.tune", "tune"),
    "logs": ("localgen.cli.log.command", "logs_app"),
    "embed": ("localgen.cli.embed", "embed"),
    "similar": ("localgen.cli.embed", "similar"),
    "rerank": ("localgen.cli.embed", "rerank"),
    "collections": ("localgen.cli.embed_collections", "collections_app"),
    "rpc-server": ("localgen.cli.rpc", "rpc_server"),
}
HELP = "Chat with and generate from local GGUF models (llama.cpp): fast, quiet, scriptable."


def _version(value: bool) -> None:
    if value:  # `localgen --version` alone never gets here (main.py answers it before Typer is imported)
        from localgen.cli import version_line

        typer.echo(version_line())
        raise typer.Exit()


def main_options(
    version: Annotated[
        bool,
        typer.Option("--version", "-V", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Chat with and generate from local GGUF models (llama.cpp): fast, quiet, scriptable."""


def build(only: str | None = None) -> typer.Typer:
    """The app with every command, or with just `only` (the one about to run)."""
    app = typer.Typer(
        name="localgen", help=HELP, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    from localgen.cli.optionorder import OrderedCommand

    app.callback()(main_options)
    for name, (module, attr) in COMMANDS.items():
        if only is not None and name != only:
            continue
        obj = getattr(importlib.import_module(module), attr)
        if isinstance(obj, typer.Typer):
            app.add_typer(obj, name=name)
        else:
            app.command(name=name, cls=OrderedCommand)(obj)  # run's attachments go in the order given
    _one_line_summaries(app)
    return app


def _one_line_summaries(app: typer.Typer) -> None:
    """A command's row in its group's list is its help's first sentence, on one line (its own --help has the
    rest): Typer's rich help kept the docstring's line breaks there, so rows broke mid-sentence, and the
    list ran to three screens' worth of detail."""
    for info in app.registered_commands:
        doc = info.help or (info.callback.__doc__ if info.callback else None)
        if info.short_help is None and doc:
            info.short_help = first_sentence(doc)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            _one_line_summaries(group.typer_instance)


def first_sentence(doc: str) -> str:
    """A help text's first sentence, on one line: up to a full stop followed by a capital or a backquote (so
    "e.g. 24GB" does not end it)."""
    import re

    paragraph = " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())
    return re.split(r"(?<=[.!?])\s+(?=[A-Z`])", paragraph, maxsplit=1)[0]
