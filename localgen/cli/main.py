"""Process entry point: runs the app and turns every expected failure into one line and an exit code."""

from __future__ import annotations

import contextlib
import os
import sys


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; errors become `localgen: error: ...` (plus a hint) on stderr, never a traceback."""
    import typer

    from localgen.cli.app import app
    from localgen.errors import LocalgenError

    command = typer.main.get_command(app)
    debug = bool(os.environ.get("LOCALGEN_DEBUG"))
    try:
        rc = command.main(args=argv, prog_name="localgen", standalone_mode=False)
    except typer.Exit as e:
        rc = e.exit_code
    except typer.Abort:
        rc = 130
    except typer.TyperException as e:  # usage errors: bad flag, value out of range, missing file
        ctx = getattr(e, "ctx", None)
        where = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        message = e.format_message() if hasattr(e, "format_message") else str(e)
        if message.strip():  # empty for "no arguments": the help was already printed
            _err(f"{message}{where}")
        rc = getattr(e, "exit_code", 2)
    except LocalgenError as e:
        if debug:
            raise
        _err(e.message, e.hint)
        rc = e.exit_code
    except KeyboardInterrupt:
        _err("interrupted")
        rc = 130
    except BrokenPipeError:
        rc = 0
    sys.exit(rc if isinstance(rc, int) else 0)


def _err(message: str, hint: str | None = None) -> None:
    text = f"localgen: error: {message}"
    if hint:
        text += f" ({hint})"
    with contextlib.suppress(BrokenPipeError, ValueError):
        print(text, file=sys.stderr, flush=True)
