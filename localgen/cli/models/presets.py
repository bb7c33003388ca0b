"""`localgen create | cp`: presets, a name for a model with settings layered on it (models/presets.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from localgen.errors import UsageError

Force = Annotated[bool, typer.Option("--force", help="Replace a preset of that name.")]
CreateForce = Annotated[bool, typer.Option("--force", help="Replace a preset of that name (and with -q, the "
                                                            "quantized model NAME:TYPE).")]
Json = Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")]


def create(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The preset's name, e.g. mybot or mybot:short.")],
    file: Annotated[
        str, typer.Option("--file", "-f", show_default=False,
                          help="The Modelfile (FROM, PARAMETER, SYSTEM, TEMPLATE, MESSAGE, ADAPTER; 1 MiB at most); - "
                               "reads stdin.")
    ],
    force: CreateForce = False,
    json_out: Json = False,
    quantize: Annotated[str | None, typer.Option(
        "--quantize", "-q", show_default=False, metavar="TYPE",
        help="Quantize the Modelfile's FROM (an F16/BF16 model) to TYPE first (Q4_K_M, Q8_0, ...): kept as "
             "NAME:TYPE, and the preset made over it.")] = None,
) -> None:
    """Make a preset from a Modelfile: a name usable wherever a model name is. Its base must be on this
    machine; every value is checked now."""
    from localgen.models.modelfile import MAX_MODELFILE
    from localgen.models.presets import create_preset
    from localgen.models.resolve import known_name

    folder = None  # stdin: ADAPTER paths must be absolute
    if file == "-":
        from localgen.text import too_long

        data, where = sys.stdin.buffer.read(MAX_MODELFILE + 1), "stdin"  # bytes, as a file's: one past the bound
        if len(data) > MAX_MODELFILE:
            raise too_long("the Modelfile on stdin", MAX_MODELFILE)
        text = data.decode("utf-8", "surrogateescape")  # a byte that is not UTF-8: the parser names it
    else:
        from localgen.cli.inputfile import check_input
        from localgen.text import read_file

        check_input("-f/--file", file)
        try:
            text = read_file(Path(file).expanduser(), f"the Modelfile {file}", limit=MAX_MODELFILE)
        except OSError as e:
            raise UsageError(f"cannot read the Modelfile {file}: {e.strerror or e}") from None
        where = file
        folder = Path(file).expanduser().resolve().parent
    if quantize is not None:
        from localgen import hardware
        from localgen.cli.progress import make_progress
        from localgen.cli.signals import term_as_interrupt
        from localgen.quant import quantize as q

        with term_as_interrupt():  # a SIGTERM or SIGHUP (timeout, a kill, the terminal closed) as Ctrl-C
            try:
                made, text = q.for_preset(name, text, quantize, _on_disk, where,
                                          q.Options(threads=hardware.usable_cores()), make_progress(), force, folder,
                                          known_name)
            except KeyboardInterrupt:  # (handled inside: the block's end would end the process by the signal)
                from localgen.cli.quantize import exit_stopped

                exit_stopped()
        print(f"{made}  quantized to {made.partition(':')[2].upper()}", file=sys.stderr)
    preset = create_preset(name, text, _on_disk, where=where, force=force, folder=folder, known=known_name)
    _done(preset, json_out)


def cp(
    src: Annotated[str, typer.Argument(metavar="SOURCE", help="A preset, or any model name run takes.")],
    dst: Annotated[str, typer.Argument(metavar="NAME", help="The new preset's name.")],
    force: Force = False,
    json_out: Json = False,
) -> None:
    """Copy a preset, or give a model a preset name of its own."""
    from localgen.cli.inputfile import check_model_file
    from localgen.models.presets import copy

    check_model_file(src, "cp: ")
    _done(copy(src, dst, _on_disk, force=force), json_out)


def _done(preset: object, json_out: bool) -> None:
    from localgen.models.presets import Preset

    assert isinstance(preset, Preset)
    if json_out:
        print(json.dumps({"name": preset.name, "base": preset.base}))
    else:
        print(f"{preset.name}  preset of {preset.base}")


def _on_disk(name: str) -> Any:
    """The model a preset's base names, from what is on this machine (no download). Its header is all a preset
    needs: an embedded model in chunks is not assembled for it. One not downloaded is said so, with the pull that
    brings it (resolving offline, its error said "localgen is offline" of a machine that was not)."""
    from localgen.errors import NotDownloadedError
    from localgen.models.resolve import resolve

    try:
        return resolve(name, offline=True, pull_missing=False, assemble=False)
    except NotDownloadedError as e:
        raise NotDownloadedError(f"{e.name} is not downloaded", hint=f"pull it first: localgen pull {e.name}",
                                 name=e.name) from None
