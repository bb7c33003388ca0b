"""The Typer app: global options and the command table. Command bodies live one module per group."""

from __future__ import annotations

from typing import Annotated

import typer

from localgen.cli.bench import bench_app
from localgen.cli.chat import chat
from localgen.cli.doctor import doctor
from localgen.cli.models import list_models, pull, rm, show
from localgen.cli.run import run

app = typer.Typer(
    name="localgen",
    help="Chat with and generate from local GGUF models (llama.cpp): fast, quiet, scriptable.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        import localgen

        typer.echo(f"localgen {localgen.__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[
        bool,
        typer.Option("--version", "-V", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Chat with and generate from local GGUF models (llama.cpp): fast, quiet, scriptable."""


app.command(name="run")(run)
app.command(name="chat")(chat)
app.command(name="pull")(pull)
app.command(name="list")(list_models)
app.command(name="show")(show)
app.command(name="rm")(rm)
app.add_typer(bench_app, name="bench")
app.command(name="doctor")(doctor)
